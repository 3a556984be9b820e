//! The compressed allgather on device-resident buffers over a [`DeviceTransport`]: each rank
//! compresses its buffer once in device memory, the transport gathers the streams device to
//! device, and every rank decodes every stream, its own included, so that all ranks end with
//! the same values. The algorithm of every device transport (NCCL, the in-process loopback);
//! the host sees only the stream lengths.
//!
//! The whole buffer is one stream (no pieces): on a fast link the codec kernels set the time,
//! and one call each keeps their fixed costs and the transport's rounds to one per operation.
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

use super::transport::DeviceTransport;
use crate::codec::CodecKind;
use crate::error::{Error, Result};
use crate::gpu::{GpuCodec, GpuElement};
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
}

/// Gather every rank's `send` (the same length on every rank) into `out` (`size × send.len()`
/// values, rank order), each compressed once under `bound` (abs, rel, or noa of that rank's own
/// values) with `codec`, in a device buffer the codec keeps for the next call. Every rank's
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
    let mut scratch = gpu.ring_scratch.take();
    let r = gather(t, gpu, send, out, (bound, codec), &mut scratch);
    gpu.ring_scratch = scratch;
    r
}

/// [`allgather`] with this rank's stream in `scratch` (grown when missing or too short, and
/// left there).
fn gather<T: GpuElement>(
    t: &dyn DeviceTransport,
    gpu: &mut GpuCodec,
    send: &CudaView<'_, T>,
    out: &mut CudaViewMut<'_, T>,
    (bound, codec): (ErrorBound, CodecKind),
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
    let need = crate::format::compress_bound(n, T::DTYPE).max(16);
    let mut buf = match scratch.take() {
        Some(b) if b.len() >= need => Ok(b),
        // SAFETY: the codec writes the stream before anything reads it.
        _ => unsafe { stream.alloc::<u8>(need) }
            .map_err(|e| Error::OutOfMemory(format!("allgather stream: {e:?}"))),
    };
    // a rank that cannot compress still takes part, with an empty stream
    let started = std::time::Instant::now();
    let mine = match buf.as_mut() {
        Ok(b) => gpu.compress_device(send, bound, codec, &mut b.as_view_mut()),
        Err(_) => Err(Error::OutOfMemory(format!(
            "allgather: {need} device bytes"
        ))),
    };
    // the empty stream of a failed compression is a view of the scratch when there is one, so
    // that only a rank without any device memory left can fail before taking part
    let empty;
    let view = match (&mine, &buf) {
        (Ok(len), Ok(b)) => b.slice(..*len),
        (Err(_), Ok(b)) => b.slice(..0),
        (_, Err(_)) => {
            empty = stream.alloc_zeros::<u8>(1).map_err(gpu_err("empty"))?;
            empty.slice(..0)
        }
    };
    times.compress_s = started.elapsed().as_secs_f64();
    let all = t.allgather_device(&view, &stream);
    let len = view.len();
    let all = all?;
    let failed = (n > 0)
        .then(|| {
            all.iter()
                .position(|m| m.as_ref().map_or(len, |b| b.len()) == 0)
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
        let started = std::time::Instant::now();
        for (k, m) in all.iter().enumerate() {
            let mut seg = out.slice_mut(k * n..(k + 1) * n);
            let r = match m {
                Some(b) => gpu.decompress_device(&b.view(), &mut seg),
                None => gpu.decompress_device(&view, &mut seg),
            };
            if r.is_err() {
                break 'decode r;
            }
        }
        let synced = stream.synchronize().map_err(gpu_err("sync"));
        times.decompress_s = started.elapsed().as_secs_f64();
        synced
    };
    for b in all.into_iter().flatten() {
        t.recycle(b);
    }
    if let Ok(b) = buf {
        *scratch = Some(b);
    }
    times.stream_len = len;
    decoded.map(|()| times)
}
