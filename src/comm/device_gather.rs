//! The compressed allgather on device-resident buffers over a [`DeviceTransport`]: each rank
//! compresses its buffer once in device memory, the transport gathers the streams device to
//! device, and every rank decodes every stream, its own included, so that all ranks end with
//! the same values. The algorithm of every device transport (NCCL, the in-process loopback);
//! the host sees only the stream lengths.
//!
//! The buffer may be cut into pieces (at multiples of 2^16 values, codecs that decode
//! value by value, abs and rel bounds): each piece is compressed into its own region of the
//! scratch and gathered at once, so over a link that queues its transfers (NCCL) a piece is on
//! the wire while the next is compressed; every piece is decoded at the end. On a fast link
//! the codec kernels set the time and one stream keeps their fixed costs to one call each, so
//! the NCCL allgather takes the model's count ([`crate::model::Profile::gather_pieces`]).
//!
//! ```no_run
//! # fn main() -> zcomm::Result<()> {
//! use zcomm::comm::{device_gather, transport::{DeviceLoopback, LinkEmulation}};
//! use zcomm::gpu::GpuCodec;
//! use zcomm::{CodecKind, ErrorBound};
//! // two ranks of one process sharing GPU 0
//! let group = DeviceLoopback::group(2, LinkEmulation::default());
//! std::thread::scope(|s| {
//!     for t in group {
//!         s.spawn(move || -> zcomm::Result<()> {
//!             let mut gpu = GpuCodec::new(0)?.with_own_stream()?;
//!             let x = gpu.stream().clone_htod(&vec![1.0f32; 1 << 20]).unwrap();
//!             let mut out = gpu.stream().alloc_zeros::<f32>(2 << 20).unwrap();
//!             let (bound, codec) = (ErrorBound::Noa(1e-3), CodecKind::Aatrox);
//!             let g = device_gather::allgather(
//!                 &t, &mut gpu, &x.as_view(), &mut out.as_view_mut(), bound, codec,
//!             )?;
//!             println!("sent a {}-byte stream", g.stream_len);
//!             Ok(())
//!         });
//!     }
//! });
//! # Ok(()) }
//! ```

use cudarc::driver::{CudaSlice, CudaView, CudaViewMut};

use super::ring;
use super::transport::{DeviceBytes, DeviceTransport};
use crate::codec::CodecKind;
use crate::error::{Error, Result};
use crate::gpu::{Decode, GpuCodec, GpuElement};
use crate::quant::ErrorBound;

fn gpu_err(what: &'static str) -> impl Fn(cudarc::driver::DriverError) -> Error {
    move |e| Error::Gpu(format!("{what}: {e:?}"))
}

/// What one [`allgather`] did: this rank's stream length and the host-clock seconds of
/// its codec calls (the compression, which returns once the stream length is known; the
/// decodes of every stream until the last is complete).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Gathered {
    /// Bytes of this rank's stream.
    pub stream_len: usize,
    /// Seconds of the compression call.
    pub compress_s: f64,
    /// Seconds from the first decode's launch to the stream's synchronization after the last.
    pub decompress_s: f64,
    /// Pieces the buffer was cut into (1: one stream).
    pub pieces: usize,
}

/// Gather every rank's `send` (the same length on every rank) into `out` (`size × send.len()`
/// values, rank order), each compressed once under `bound` (abs, rel, or noa of that rank's own
/// values) with `codec`, in a device buffer the codec keeps for the next call; in pieces of the
/// link's [`DeviceTransport::piece_bytes`] where that applies (see the [module docs](self)). Every rank's
/// segment of `out`, this rank's own included, holds what its stream decodes to, so `out` is
/// identical on every rank. Collective over `t`'s ranks, after the caller's agreement on the
/// length; a rank that fails to compress sends an empty stream, and every rank then returns an
/// error. Returns when `out` is complete (the stream synchronized), with the length of this
/// rank's stream and the times of its codec calls (the transport times its own stages).
pub fn allgather<T: GpuElement>(
    t: &dyn DeviceTransport,
    gpu: &mut GpuCodec,
    send: &CudaView<'_, T>,
    out: &mut CudaViewMut<'_, T>,
    bound: ErrorBound,
    codec: CodecKind,
) -> Result<Gathered> {
    let pieces = (send.len() * T::SIZE)
        .div_ceil(t.piece_bytes().max(1))
        .max(1);
    allgather_in_pieces(t, gpu, send, out, (bound, codec), pieces)
}

/// [`allgather`] with `pieces` pieces (the same on every rank; fewer where the buffer, the
/// codec or the bound does not allow them).
pub(crate) fn allgather_in_pieces<T: GpuElement>(
    t: &dyn DeviceTransport,
    gpu: &mut GpuCodec,
    send: &CudaView<'_, T>,
    out: &mut CudaViewMut<'_, T>,
    (bound, codec): (ErrorBound, CodecKind),
    pieces: usize,
) -> Result<Gathered> {
    let n = send.len();
    // a noa bound is of the whole buffer's range: pieces would each take their own
    let cuttable = codec.decodes_per_value() && !matches!(bound, ErrorBound::Noa(_));
    let whole = std::iter::once(0..n).collect::<Vec<_>>();
    let parts = if cuttable && pieces > 1 {
        ring::cut(0..n, ring::usable_pieces(&whole, pieces))
    } else {
        whole
    };
    let mut scratch = gpu.ring_scratch.take();
    let r = gather(t, gpu, send, out, (bound, codec), &parts, &mut scratch);
    gpu.ring_scratch = scratch;
    r
}

/// [`allgather`] of the pieces `parts` of `send`, this rank's streams in `scratch` (one region
/// per piece; grown when missing or too short, and left there).
fn gather<T: GpuElement>(
    t: &dyn DeviceTransport,
    gpu: &mut GpuCodec,
    send: &CudaView<'_, T>,
    out: &mut CudaViewMut<'_, T>,
    (bound, codec): (ErrorBound, CodecKind),
    parts: &[std::ops::Range<usize>],
    scratch: &mut Option<CudaSlice<u8>>,
) -> Result<Gathered> {
    let mut times = Gathered::default();
    let p = t.host().size();
    let n = send.len();
    if out.len() != n * p {
        return Err(Error::invalid(format!(
            "allgather: output has {} values, expected {p} x {n}",
            out.len()
        )));
    }
    let stream = gpu.stream().clone();
    let longest = parts.iter().map(|r| r.len()).max().unwrap_or(0);
    let region = crate::format::compress_bound(longest, T::DTYPE)
        .max(16)
        .next_multiple_of(256);
    let need = region * parts.len();
    let mut buf = match scratch.take() {
        Some(b) if b.len() >= need => Ok(b),
        // SAFETY: the codec writes the stream before anything reads it.
        _ => unsafe { stream.alloc::<u8>(need) }
            .map_err(|e| Error::OutOfMemory(format!("allgather stream: {e:?}"))),
    };
    // the empty stream of a failed compression is a view of the scratch when there is one, so
    // that only a rank without any device memory left can fail before taking part
    let empty = match &buf {
        Ok(_) => None,
        Err(_) => Some(stream.alloc_zeros::<u8>(1).map_err(gpu_err("empty"))?),
    };
    // each piece compressed and gathered in turn: a rank that cannot compress still takes
    // part, with empty streams
    let mut mine: Result<()> = Ok(());
    let mut lens = Vec::with_capacity(parts.len());
    let mut gathered: Vec<Vec<Option<DeviceBytes>>> = Vec::with_capacity(parts.len());
    for (c, part) in parts.iter().enumerate() {
        let at = c * region;
        let started = std::time::Instant::now();
        let len = match (&mine, buf.as_mut()) {
            (Ok(()), Ok(b)) => gpu.compress_device(
                &send.slice(part.clone()),
                bound,
                codec,
                &mut b.slice_mut(at..at + region),
            ),
            (Err(_), _) => Ok(0),
            (Ok(()), Err(_)) => Err(Error::OutOfMemory(format!(
                "allgather: {need} device bytes"
            ))),
        };
        times.compress_s += started.elapsed().as_secs_f64();
        let len = len.unwrap_or_else(|e| {
            mine = Err(e);
            0
        });
        let view = match (&buf, &empty) {
            (Ok(b), _) => b.slice(at..at + len),
            (_, Some(e)) => e.slice(..0),
            (Err(_), None) => unreachable!("an empty stream exists without a scratch"),
        };
        lens.push(len);
        // queued: the next piece is compressed while this one moves
        match t.allgather_device(&view, &stream) {
            Ok(all) => gathered.push(all),
            Err(e) => {
                recycle_all(t, gathered);
                return Err(e);
            }
        }
    }
    let failed = (n > 0)
        .then(|| {
            gathered.iter().zip(&lens).find_map(|(all, &len)| {
                all.iter()
                    .position(|m| m.as_ref().map_or(len, |b| b.len()) == 0)
            })
        })
        .flatten();
    let decoded = 'decode: {
        if let Err(e) = mine {
            break 'decode Err(e);
        }
        if let Some(k) = failed {
            break 'decode Err(Error::Comm(format!(
                "allgather: rank {k} could not compress its buffer"
            )));
        }
        let Ok(b) = &buf else {
            unreachable!("a rank that compressed has its scratch")
        };
        let started = std::time::Instant::now();
        // the stream of piece `c` from rank `k` (this rank's own in the scratch)
        let source = |c: usize, k: usize| -> Result<CudaView<'_, u8>> {
            match &gathered[c][k] {
                Some(m) => m.wait_ready(&stream).map(|()| m.view()),
                None => Ok(b.slice(c * region..c * region + lens[c])),
            }
        };
        // queued where the link allows it (one wait for them all), each settled after the last
        let expected = (codec, bound.mode());
        let mut queued = Vec::new();
        for (c, part) in parts.iter().enumerate() {
            for k in 0..p {
                let mut seg = out.slice_mut(k * n + part.start..k * n + part.end);
                let r = source(c, k).and_then(|src| {
                    if t.queue_decodes() {
                        gpu.decompress_device_queued(&src, &mut seg, expected)
                    } else {
                        gpu.decompress_device(&src, &mut seg)
                            .map(|()| Decode::Done { tracked: false })
                    }
                });
                match r {
                    Ok(Decode::Queued(q)) => queued.push((c, k, q)),
                    Ok(Decode::Done { .. }) => {}
                    Err(e) => {
                        if !queued.is_empty() {
                            let _ = gpu.settle_all();
                        }
                        break 'decode Err(e);
                    }
                }
            }
        }
        let mut settled = Ok(());
        for (c, k, q) in queued {
            let r = gpu.settle::<T>(q).and_then(|ran| match ran {
                Some(_) => Ok(()),
                // not the stream expected (a stored one): decoded the waiting way
                None => {
                    let part = &parts[c];
                    let mut seg = out.slice_mut(k * n + part.start..k * n + part.end);
                    source(c, k).and_then(|src| gpu.decompress_device(&src, &mut seg))
                }
            });
            if settled.is_ok() {
                settled = r;
            }
        }
        let synced = settled.and_then(|()| stream.synchronize().map_err(gpu_err("sync")));
        times.decompress_s = started.elapsed().as_secs_f64();
        synced
    };
    recycle_all(t, gathered);
    if let Ok(b) = buf {
        *scratch = Some(b);
    }
    times.stream_len = lens.iter().sum();
    times.pieces = parts.len();
    decoded.map(|()| times)
}

/// Give every gathered message back to the link (each waits for its transfer first).
fn recycle_all(t: &dyn DeviceTransport, gathered: Vec<Vec<Option<DeviceBytes>>>) {
    for b in gathered.into_iter().flatten().flatten() {
        t.recycle(b);
    }
}
