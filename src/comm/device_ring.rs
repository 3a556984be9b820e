//! The compressed ring reduction on device-resident buffers over a [`DeviceTransport`]: the
//! schedule of the `ring` module, with the GPU codec compressing segments in device memory,
//! the transport moving the compressed bytes device to device, and the fused decompress-and-add
//! kernel accumulating them. The last reduce step ([`GpuCodec::reduce_step_device`]) compresses
//! this rank's final segment with a kernel that leaves what the stream decodes to in place of
//! the sum, so no rank decodes its own segment. Nothing is staged through the host; the host sees
//! only the descriptor agreement (count and value range, one small allgather) and, for an
//! allreduce, the agreement on the exact range before the final compression: the range agreed
//! first is a sample, and the compression and decompress-and-add kernels that read the input
//! measure the exact one on the way ([`DeviceRange`], `ring::FinalBound::Deferred`), so no
//! pass over the input runs before the first compression.
//!
//! Over a link that queues its transfers (NCCL), the plan's pieces pipeline the ring: a
//! piece's message travels on the link's stream while the codec's stream compresses or
//! accumulates the next one (each outgoing piece keeps its own region of the scratch buffer
//! until its transfer is waited for); the NCCL collectives take the count from the model.
//!
//! Because the GPU codec writes the CPU twin's bytes and the fused accumulation rounds once per
//! value as the host's `a + b`, the results equal the host ring's with the same codec, bit for
//! bit.
//!
//! ```no_run
//! # fn main() -> zcomm::Result<()> {
//! use zcomm::comm::{device_ring, transport::{DeviceLoopback, LinkEmulation}};
//! use zcomm::gpu::GpuCodec;
//! use zcomm::{CodecKind, ErrorBound};
//! // two ranks of one process sharing GPU 0
//! let group = DeviceLoopback::group(2, LinkEmulation::default());
//! std::thread::scope(|s| {
//!     for t in group {
//!         s.spawn(move || -> zcomm::Result<()> {
//!             let mut gpu = GpuCodec::new(0)?.with_own_stream()?;
//!             let x = gpu.stream().clone_htod(&vec![1.0f32; 1 << 20]).unwrap();
//!             let mut out = gpu.stream().alloc_zeros::<f32>(1 << 20).unwrap();
//!             let st = device_ring::allreduce(
//!                 &t, &mut gpu, &x, &mut out, ErrorBound::Noa(1e-3), CodecKind::Aatrox, false,
//!             )?;
//!             println!("{st}");
//!             Ok(())
//!         });
//!     }
//! });
//! # Ok(()) }
//! ```

use std::ops::Range;

use cudarc::driver::{CudaSlice, CudaView, CudaViewMut};

use super::element::Real;
use super::ring::{self, FinalBound, NextMsg, RingBounds, RingPlace, RingPlan, SplitRule};
use super::transport::{DeviceBytes, DeviceTransport};
use super::{partition, Decision, OpStats, OP_ALLREDUCE, OP_ALLREDUCE_MEAN, OP_REDUCE_SCATTER};
use crate::codec::CodecKind;
use crate::error::{Error, Result};
use crate::format::BoundMode;
use crate::gpu::{Decode, DeviceRange, GpuCodec, GpuElement, QueuedDecode};
use crate::quant::ErrorBound;

fn gpu_err(what: &'static str) -> impl Fn(cudarc::driver::DriverError) -> Error {
    move |e| Error::Gpu(format!("{what}: {e:?}"))
}

/// Sum over all ranks of the device buffer `x` into `out` (same length; `mean`: divided by the
/// number of ranks), compressed on the wire with `codec`; every value of `out` is within the
/// end-to-end `bound` of the exact result (abs or noa; noa of the inputs' global value range)
/// and `out` is bit-identical on every rank. Collective over `t`'s ranks; a count mismatch is
/// an [`Error::Mismatch`] on every rank before any payload moves.
pub fn allreduce<T: GpuElement + Real>(
    t: &dyn DeviceTransport,
    gpu: &mut GpuCodec,
    x: &CudaSlice<T>,
    out: &mut CudaSlice<T>,
    bound: ErrorBound,
    codec: CodecKind,
    mean: bool,
) -> Result<OpStats> {
    let op = if mean {
        OP_ALLREDUCE_MEAN
    } else {
        OP_ALLREDUCE
    };
    reduce(t, gpu, x, out, bound, codec, op)
}

/// Reduce-scatter (sum) of the device buffer `x`: rank `r` receives segment `r` of
/// [`partition`]`(x.len(), size)` in `out` (that segment's length), within the end-to-end
/// `bound`. Collective, as [`allreduce`].
pub fn reduce_scatter<T: GpuElement + Real>(
    t: &dyn DeviceTransport,
    gpu: &mut GpuCodec,
    x: &CudaSlice<T>,
    out: &mut CudaSlice<T>,
    bound: ErrorBound,
    codec: CodecKind,
) -> Result<OpStats> {
    reduce(t, gpu, x, out, bound, codec, OP_REDUCE_SCATTER)
}

fn reduce<T: GpuElement + Real>(
    t: &dyn DeviceTransport,
    gpu: &mut GpuCodec,
    x: &CudaSlice<T>,
    out: &mut CudaSlice<T>,
    bound: ErrorBound,
    codec: CodecKind,
    op: u8,
) -> Result<OpStats> {
    let t0 = t.host().wtime();
    let (p, r) = (t.host().size(), t.host().rank());
    let full = op != OP_REDUCE_SCATTER;
    let segs = partition(x.len(), p);
    let want = if full { x.len() } else { segs[r].len() };
    let local = if matches!(bound, ErrorBound::Rel(_)) {
        Err(Error::invalid(
            "rel bounds are not supported for reductions (use abs or noa)",
        ))
    } else if out.len() != want {
        Err(Error::invalid(format!(
            "output has {} values, {want} expected",
            out.len()
        )))
    } else {
        bound.validate()
    };
    // 1. agreement: every rank's count, value range and argument check, in one allgather; an
    //    allreduce's range is a sample (the ring measures the exact one in the kernels that
    //    read the input anyway: `ring::FinalBound::Deferred`)
    let range = match local {
        Ok(()) if full => gpu.sampled_range_device(&x.as_view())?,
        Ok(()) => gpu.value_range_device(&x.as_view())?,
        Err(_) => None,
    };
    let (lo, hi) = range.unwrap_or((f64::INFINITY, f64::NEG_INFINITY));
    let mut rec = Vec::with_capacity(25);
    rec.extend_from_slice(&(x.len() as u64).to_le_bytes());
    rec.extend_from_slice(&lo.to_le_bytes());
    rec.extend_from_slice(&hi.to_le_bytes());
    rec.push(u8::from(local.is_err()));
    let all = t.host().allgather_fixed(&rec)?;
    local?;
    let f = |c: &[u8], i: usize| f64::from_le_bytes(c[i..i + 8].try_into().expect("8 bytes"));
    let (mut glo, mut ghi) = (f64::INFINITY, f64::NEG_INFINITY);
    for (k, c) in all.chunks_exact(25).enumerate() {
        let n = u64::from_le_bytes(c[..8].try_into().expect("8 bytes"));
        if c[24] != 0 {
            return Err(Error::invalid(format!("rank {k} rejected its arguments")));
        }
        if n != x.len() as u64 {
            return Err(Error::Mismatch {
                what: "value count",
                expected: x.len().to_string(),
                found: format!("{n} on rank {k}"),
            });
        }
        glo = glo.min(f(c, 8));
        ghi = ghi.max(f(c, 16));
    }
    // One rank: the exact result is the input (divided by 1), as on the host path, which
    // sends nothing either; no quantisation, so no bound to split.
    let stream = gpu.stream().clone();
    if p == 1 {
        let seg = segs[0].clone();
        stream
            .memcpy_dtod(&x.slice(seg), out)
            .map_err(gpu_err("copy input"))?;
        stream.synchronize().map_err(gpu_err("sync"))?;
        let mut st = OpStats::raw(op);
        st.bytes = (x.len() * T::SIZE) as u64;
        st.measured_s = t.host().wtime() - t0;
        return Ok(st);
    }
    // 2. the per-quantisation bound (as the host ring: p quantisations for the allreduces,
    //    p - 1 for reduce-scatter; partial sums at eb * divisor, the final segment at eb)
    let rule = SplitRule {
        bound,
        p,
        unit_roundoff: T::UNIT_ROUNDOFF,
        mean: op == OP_ALLREDUCE_MEAN,
        full,
    };
    let agreed = (glo <= ghi).then_some((glo, ghi));
    let bounds = RingBounds::agree(rule, agreed, full, t.host(), || {
        gpu.value_range_device(&x.as_view())
    })?;
    // 3. the ring
    // pieces of at most the link's piece size (whole segments unless the link asks)
    let seg_bytes = segs.iter().map(Range::len).max().unwrap_or(0) * T::SIZE;
    let pieces = seg_bytes.div_ceil(t.piece_bytes().max(1)).max(1);
    let plan = RingPlan::with_bounds((r, p), &bounds, codec)?.with_pieces(pieces);
    let mut scratch = gpu.ring_scratch.take();
    let run = ring(
        t,
        gpu,
        &x.as_view(),
        &mut out.as_view_mut(),
        &mut scratch,
        plan,
    );
    gpu.ring_scratch = scratch;
    let sent = run?.bytes;
    let e = sent.result_bound.unwrap_or(bounds.split.result);
    stream.synchronize().map_err(gpu_err("sync"))?;
    let bytes = (x.len() * T::SIZE) as f64;
    let mut st = OpStats::raw(op);
    st.decision = Decision::Compressed;
    st.codec = Some(codec);
    st.bytes = bytes as u64;
    st.bound = e;
    st.wire_bytes = sent.total(p) as u64;
    let moved = if full { 2.0 } else { 1.0 } * bytes * (p as f64 - 1.0) / p as f64;
    st.ratio = moved / st.wire_bytes.max(1) as f64;
    st.measured_s = t.host().wtime() - t0;
    Ok(st)
}

/// What one run of [`ring`] did.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RingRun {
    /// Bytes this rank sent.
    pub bytes: ring::RingBytes,
    /// Seconds in GPU compression calls.
    pub compress_s: f64,
    /// Seconds in GPU decompression calls (the fused decompress-and-add included).
    pub decompress_s: f64,
    /// Pieces per segment the ring ran with (reported by the NCCL collectives).
    #[cfg_attr(not(feature = "nccl"), allow(dead_code))]
    pub pieces: usize,
}

/// The compressed ring of `plan` on device buffers over `t`, after the caller's agreement:
/// every rank calls it with the same plan and length. `out` holds `x.len()` values (the
/// allreduces) or this rank's segment of [`partition`]`(x.len(), size)` (reduce-scatter).
/// `scratch` is where this rank's messages are compressed: grown here when it is missing or
/// too short, and left in place for the next call (callers that run the ring often keep it).
/// Failures of the GPU work travel as empty messages, so every rank fails together (see
/// [`ring::reduce`]). Returns when the result is in `out` (the stream synchronized).
pub(crate) fn ring<T: GpuElement + Real>(
    t: &dyn DeviceTransport,
    gpu: &mut GpuCodec,
    x: &CudaView<'_, T>,
    out: &mut CudaViewMut<'_, T>,
    scratch: &mut Option<CudaSlice<u8>>,
    plan: RingPlan,
) -> Result<RingRun> {
    let stream = gpu.stream().clone();
    let segs = partition(x.len(), plan.size);
    // the caller's pieces (the same on every rank), only for codecs that decode value by
    // value: a piece's values are then those of the whole segment (unless a piece's stream is
    // stored raw where the segment's would not be)
    let wanted = if plan.codec.decodes_per_value() {
        plan.pieces
    } else {
        1
    };
    let plan = plan.with_pieces(ring::usable_pieces(&segs, wanted));
    let parts = ring::parts(&segs, plan.pieces);
    let longest = segs.iter().map(Range::len).max().unwrap_or(0);
    // one region of the scratch per piece: a piece's message stays there while it is on the
    // wire and the next piece is compressed into the next region
    let longest_part = parts.iter().map(Range::len).max().unwrap_or(0);
    let region = crate::format::compress_bound(longest_part, T::DTYPE)
        .max(16)
        .next_multiple_of(256);
    let need = region * plan.pieces;
    // A buffer that cannot be had fails this rank's share of the ring, not the ring: the
    // rank still takes part (with empty messages), so the others are not left waiting.
    let mut broken = None;
    let mut buf = match scratch.take() {
        Some(b) if b.len() >= need => b,
        _ => {
            // SAFETY: the codec writes a stream into the scratch before anything reads it.
            match unsafe { stream.alloc::<u8>(need) } {
                Ok(b) => b,
                Err(e) => {
                    broken = Some(Error::OutOfMemory(format!("ring scratch: {e:?}")));
                    stream
                        .alloc_zeros::<u8>(16)
                        .map_err(gpu_err("alloc scratch"))?
                }
            }
        }
    };
    // reduce-scatter with more than two ranks: the partial sums of other ranks' segments pass
    // through one segment-sized buffer (each is compressed and sent on right after its
    // accumulation); this rank's own segment accumulates in `out`
    let tmp = if !plan.full && plan.size > 2 {
        // SAFETY: written by an accumulation before it is read (`touched`).
        match unsafe { stream.alloc::<T>(longest) } {
            Ok(b) => Some(b),
            Err(e) => {
                broken.get_or_insert(Error::OutOfMemory(format!("ring partial sums: {e:?}")));
                None
            }
        }
    } else {
        None
    };
    let run = {
        let mut place = DevicePlace::new(
            t,
            gpu,
            (x.slice(..), out.slice_mut(..)),
            tmp,
            (&segs, &parts, plan.pieces),
            (&mut buf, region),
        );
        place.own = (!plan.full).then_some(plan.rank);
        place.codec = plan.codec;
        place.queue = t.queue_decodes();
        if matches!(plan.final_bound, FinalBound::Deferred(_)) {
            let words = match place.gpu.ring_range.take() {
                Some(mut r) => r.clear(&stream).map(|()| r),
                None => DeviceRange::new(&stream),
            };
            match words {
                Ok(r) => place.range = Some(r),
                Err(e) => broken = broken.or(Some(e)),
            }
        }
        place.broken = broken;
        let run = place.run(plan);
        // kept for the next call (cleared then)
        if let Some(r) = place.range.take() {
            place.gpu.ring_range = Some(r);
        }
        run
    };
    *scratch = Some(buf);
    let run = run?;
    stream.synchronize().map_err(gpu_err("sync"))?;
    Ok(run)
}

/// A compressed part: this rank's own (`len` bytes at `at` in the scratch buffer) or one
/// received.
enum DeviceMsg {
    Scratch { at: usize, len: usize },
    Received(DeviceBytes),
}

/// The ring's buffers on the device.
///
/// The input is never copied: a segment is read from the input until the ring first adds a
/// received partial sum to it, and that addition (`acc = input + decoded`, one fused kernel)
/// writes the partial sum into `acc`; from then on the segment is read from `acc`. In a ring
/// every rank adds to each segment at most once, so every accumulation is such a first one.
struct DevicePlace<'a, T: GpuElement> {
    t: &'a dyn DeviceTransport,
    gpu: &'a mut GpuCodec,
    /// This rank's input (read-only).
    input: CudaView<'a, T>,
    /// The output: every segment (the allreduces, where the partial sums accumulate in place)
    /// or this rank's segment (reduce-scatter, `own`).
    out: CudaViewMut<'a, T>,
    /// Reduce-scatter: this rank, whose segment accumulates in `out`.
    own: Option<usize>,
    /// Reduce-scatter with more than two ranks: the partial sum of another rank's segment.
    tmp: Option<CudaSlice<T>>,
    /// Which parts hold a partial sum.
    touched: Vec<bool>,
    /// The ring's segments, and the parts the ring's calls name (`pieces` per segment:
    /// [`ring::parts`]).
    segs: &'a [Range<usize>],
    parts: &'a [Range<usize>],
    pieces: usize,
    /// Where this rank's outgoing parts are compressed: piece `c` of any segment in region `c`
    /// (`region` bytes each), reused every step.
    scratch: &'a mut CudaSlice<u8>,
    region: usize,
    /// Seconds spent in the codec calls so far.
    compress_s: f64,
    decompress_s: f64,
    /// Why this rank cannot do its share (a buffer it could not allocate): its first
    /// compression fails with it, and the ring carries the failure to every rank.
    broken: Option<Error>,
    /// The parts whose output already holds what their compressed final message decodes to
    /// (left there by [`GpuCodec::compress_reconstruct_device`]), so that their decode is
    /// skipped.
    reconstructed: Vec<bool>,
    /// A ring with a deferred final bound: the finite range of the input parts read so far,
    /// folded in by the compression and accumulation kernels that read them.
    range: Option<DeviceRange>,
    /// Which input parts `range` covers.
    covered: Vec<bool>,
    /// The ring's codec: every part it sends is a stream of it under an absolute bound
    /// (unless stored).
    codec: CodecKind,
    /// The divisor each part's partial sum was last scaled by since its accumulation (1: none),
    /// for a queued accumulation that is done again when it is settled.
    divisors: Vec<f64>,
    /// Whether accumulations and decodes are queued without waiting for their result
    /// ([`DeviceTransport::queue_decodes`]); queued ones wait in `pending` until settled.
    queue: bool,
    pending: Vec<Pending>,
}

/// A queued accumulation or decode of a part, not yet settled ([`RingPlace::settle`]).
struct Pending {
    part: usize,
    decode: QueuedDecode,
    /// An accumulation (else a decode into the output).
    accumulation: bool,
}

/// [`partial`], to write.
fn partial_mut<'b, T>(
    out: &'b mut CudaViewMut<'_, T>,
    tmp: &'b mut Option<CudaSlice<T>>,
    slot: Slot,
) -> Result<CudaViewMut<'b, T>> {
    match slot {
        Slot::Out(r) => Ok(out.slice_mut(r)),
        Slot::Tmp(r) => match tmp {
            Some(b) => Ok(b.slice_mut(r)),
            None => Err(Error::Comm("ring: no partial-sum buffer".into())),
        },
    }
}

impl<T: GpuElement> Drop for DevicePlace<'_, T> {
    /// A ring that stopped early (an error) may leave queued kernels reading buffers its
    /// caller is about to free or reuse: wait for them.
    fn drop(&mut self) {
        if !self.pending.is_empty() {
            self.pending.clear();
            let _ = self.gpu.settle_all();
        }
    }
}

/// Where a part's partial sum lives: a range of the output, or a range of `tmp`.
enum Slot {
    Out(Range<usize>),
    Tmp(Range<usize>),
}

/// The partial sum in `slot` (of a [`DevicePlace`]'s `out` and `tmp`).
fn partial<'b, T>(
    out: &'b CudaViewMut<'_, T>,
    tmp: &'b Option<CudaSlice<T>>,
    slot: Slot,
) -> Result<CudaView<'b, T>> {
    match slot {
        Slot::Out(r) => Ok(out.slice(r)),
        Slot::Tmp(r) => match tmp {
            Some(b) => Ok(b.slice(r)),
            None => Err(Error::Comm("ring: no partial-sum buffer".into())),
        },
    }
}

impl<'a, T: GpuElement + Real> DevicePlace<'a, T> {
    fn new(
        t: &'a dyn DeviceTransport,
        gpu: &'a mut GpuCodec,
        (input, out): (CudaView<'a, T>, CudaViewMut<'a, T>),
        tmp: Option<CudaSlice<T>>,
        (segs, parts, pieces): (&'a [Range<usize>], &'a [Range<usize>], usize),
        (scratch, region): (&'a mut CudaSlice<u8>, usize),
    ) -> Self {
        DevicePlace {
            t,
            gpu,
            input,
            out,
            own: None,
            tmp,
            touched: vec![false; parts.len()],
            segs,
            parts,
            pieces,
            scratch,
            region,
            compress_s: 0.0,
            decompress_s: 0.0,
            broken: None,
            reconstructed: vec![false; parts.len()],
            range: None,
            covered: vec![false; parts.len()],
            codec: CodecKind::Aatrox,
            divisors: vec![1.0; parts.len()],
            queue: false,
            pending: Vec::new(),
        }
    }

    /// Where part `j`'s partial sum lives: its place in the output (the allreduces; a
    /// reduce-scatter's own segment, whose output is that segment), else in `tmp` at its
    /// offset within its segment.
    fn slot(&self, j: usize) -> Slot {
        let part = self.parts[j].clone();
        let seg = &self.segs[j / self.pieces];
        let within = part.start - seg.start..part.end - seg.start;
        match self.own {
            None => Slot::Out(part),
            Some(r) if r == j / self.pieces => Slot::Out(within),
            Some(_) => Slot::Tmp(within),
        }
    }

    /// The scratch region of part `j`'s outgoing message.
    fn region_of(&self, j: usize) -> Range<usize> {
        let at = (j % self.pieces) * self.region;
        at..at + self.region
    }

    fn run(&mut self, plan: RingPlan) -> Result<RingRun> {
        let bytes = ring::reduce(self, plan)?;
        Ok(RingRun {
            bytes,
            compress_s: self.compress_s,
            decompress_s: self.decompress_s,
            pieces: self.pieces,
        })
    }

    /// This rank's exact finite input range: what the kernels folded into `range`, the
    /// segments they did not cover by a range pass each (the whole input by one pass when
    /// nothing was tracked).
    fn local_range(&mut self) -> Result<Option<(f64, f64)>> {
        let Some(acc) = self.range.as_mut() else {
            return self.gpu.value_range_device(&self.input);
        };
        for (k, part) in self.parts.iter().enumerate() {
            if !self.covered[k] {
                self.gpu
                    .add_range_device(&self.input.slice(part.clone()), acc)?;
                self.covered[k] = true;
            }
        }
        acc.read(self.gpu.stream())
    }

    /// [`RingPlace::accumulate`] waited for (and, on a part that holds a partial sum, added
    /// in place).
    fn accumulate_now(&mut self, seg: usize, m: &DeviceMsg) -> Result<()> {
        self.divisors[seg] = 1.0;
        let range = self.parts[seg].clone();
        let stream = received(m)?;
        stream.wait_ready(self.gpu.stream())?;
        let slot = self.slot(seg);
        let mut acc = partial_mut(&mut self.out, &mut self.tmp, slot)?;
        let t = std::time::Instant::now();
        let r = if self.touched[seg] {
            self.gpu.decompress_add_device(&stream.view(), &mut acc)
        } else {
            let base = self.input.slice(range);
            let r = match &mut self.range {
                Some(rng) if !self.covered[seg] => self
                    .gpu
                    .decompress_add_to_device_tracking(&stream.view(), &base, &mut acc, rng)
                    .map(|tracked| self.covered[seg] = tracked),
                _ => self
                    .gpu
                    .decompress_add_to_device(&stream.view(), &base, &mut acc),
            };
            self.touched[seg] = r.is_ok();
            r
        };
        self.decompress_s += t.elapsed().as_secs_f64();
        r
    }

    /// [`RingPlace::decode_into_output`] waited for.
    fn decode_now(&mut self, seg: usize, m: &DeviceMsg) -> Result<()> {
        let range = self.parts[seg].clone();
        let codec_stream = self.gpu.stream().clone();
        let stream = ready_view(self.scratch, &codec_stream, m)?;
        let t = std::time::Instant::now();
        let r = self
            .gpu
            .decompress_device(&stream, &mut self.out.slice_mut(range));
        self.decompress_s += t.elapsed().as_secs_f64();
        r
    }

    /// Settle the queued work of part `seg` from `m` ([`RingPlace::settle`]): `Ok(true)` when
    /// a queued launch found another stream than the one it guessed (a stored part) and the
    /// part was accumulated or decoded only now, the waiting way (what read it since must be
    /// done again).
    fn settle_part(&mut self, seg: usize, m: &DeviceMsg) -> Result<bool> {
        let mut late = false;
        while let Some(i) = self.pending.iter().position(|p| p.part == seg) {
            let p = self.pending.swap_remove(i);
            match self.gpu.settle::<T>(p.decode)? {
                Some(tracked) => self.covered[seg] |= tracked && p.accumulation,
                None if p.accumulation => {
                    // the sum again, divided again if it was
                    let d = self.divisors[seg];
                    self.touched[seg] = false;
                    self.accumulate_now(seg, m)?;
                    if d != 1.0 {
                        self.scale(seg, d)?;
                    }
                    late = true;
                }
                None => {
                    self.decode_now(seg, m)?;
                    late = true;
                }
            }
        }
        Ok(late)
    }

    /// A message's bytes; a received one's only after `wait_ready` on the codec's stream.
    fn view<'b>(&'b self, m: &'b DeviceMsg) -> CudaView<'b, u8> {
        match m {
            DeviceMsg::Scratch { at, len } => self.scratch.slice(*at..*at + *len),
            DeviceMsg::Received(s) => s.view(),
        }
    }
}

/// The bytes of `m` (this rank's own in `scratch`), for `codec_stream` to read: a received
/// message's once its transfer has completed on that stream.
fn ready_view<'b>(
    scratch: &'b CudaSlice<u8>,
    codec_stream: &std::sync::Arc<cudarc::driver::CudaStream>,
    m: &'b DeviceMsg,
) -> Result<CudaView<'b, u8>> {
    Ok(match m {
        DeviceMsg::Scratch { at, len } => scratch.slice(*at..*at + *len),
        DeviceMsg::Received(b) => {
            b.wait_ready(codec_stream)?;
            b.view()
        }
    })
}

/// The bytes of a message this rank received (only received partial sums are accumulated).
fn received(m: &DeviceMsg) -> Result<&DeviceBytes> {
    match m {
        DeviceMsg::Received(b) => Ok(b),
        DeviceMsg::Scratch { .. } => Err(Error::Comm(
            "ring: decoding a segment that was never exchanged".into(),
        )),
    }
}

impl<T: GpuElement + Real> RingPlace for DevicePlace<'_, T> {
    type Msg = DeviceMsg;

    fn wire_len(&self, m: &DeviceMsg) -> usize {
        match m {
            DeviceMsg::Scratch { len, .. } => *len,
            DeviceMsg::Received(s) => s.len(),
        }
    }

    fn encode(&mut self, seg: usize, bound: ErrorBound, codec: CodecKind) -> Result<DeviceMsg> {
        if let Some(e) = self.broken.take() {
            return Err(e);
        }
        let from_input = !self.touched[seg];
        let values = if from_input {
            self.input.slice(self.parts[seg].clone())
        } else {
            partial(&self.out, &self.tmp, self.slot(seg))?
        };
        let region = self.region_of(seg);
        let t = std::time::Instant::now();
        let out = &mut self.scratch.slice_mut(region.clone());
        let len = match (&mut self.range, bound) {
            (Some(acc), ErrorBound::Abs(eb)) if from_input && !self.covered[seg] => self
                .gpu
                .compress_device_tracking(&values, eb, codec, out, acc)
                .map(|(len, tracked)| {
                    self.covered[seg] = tracked;
                    len
                }),
            _ => self.gpu.compress_device(&values, bound, codec, out),
        };
        self.compress_s += t.elapsed().as_secs_f64();
        Ok(DeviceMsg::Scratch {
            at: region.start,
            len: len?,
        })
    }

    fn exchange(&mut self, m: DeviceMsg, to: usize, from: usize) -> Result<DeviceMsg> {
        let stream = self.gpu.stream().clone();
        // queued: the next piece is compressed while this one is on the wire; its readers
        // wait for it (`wait_ready`), and its scratch region is not written again before
        // then (the next step's compression of this piece follows its accumulation)
        let got = self.t.sendrecv_device(to, &self.view(&m), from, &stream)?;
        Ok(DeviceMsg::Received(got))
    }

    fn accumulate(&mut self, seg: usize, m: &DeviceMsg) -> Result<()> {
        self.divisors[seg] = 1.0;
        if !self.queue || self.touched[seg] {
            return self.accumulate_now(seg, m);
        }
        let range = self.parts[seg].clone();
        let stream = received(m)?;
        stream.wait_ready(self.gpu.stream())?;
        let slot = self.slot(seg);
        let mut acc = partial_mut(&mut self.out, &mut self.tmp, slot)?;
        let base = self.input.slice(range);
        let track = match &mut self.range {
            Some(rng) if !self.covered[seg] => Some(rng),
            _ => None,
        };
        let t = std::time::Instant::now();
        let r = self.gpu.decompress_add_to_device_queued(
            &stream.view(),
            &base,
            &mut acc,
            track,
            (self.codec, BoundMode::Abs),
        );
        self.decompress_s += t.elapsed().as_secs_f64();
        self.touched[seg] = r.is_ok();
        match r? {
            Decode::Done { tracked } => self.covered[seg] |= tracked,
            Decode::Queued(decode) => self.pending.push(Pending {
                part: seg,
                decode,
                accumulation: true,
            }),
        }
        Ok(())
    }

    fn settle(&mut self, seg: usize, m: &DeviceMsg) -> Result<()> {
        self.settle_part(seg, m).map(|_| ())
    }

    fn reduce_step(
        &mut self,
        seg: usize,
        m: &DeviceMsg,
        divisor: f64,
        next: Option<NextMsg>,
    ) -> Result<Option<DeviceMsg>> {
        self.accumulate(seg, m)?;
        if divisor != 1.0 {
            if let Err(e) = self.scale(seg, divisor) {
                // nothing returns while a queued kernel may still read `m`
                let _ = self.settle_part(seg, m);
                return Err(e);
            }
        }
        let encode = |place: &mut Self| match next {
            Some(n) if n.is_final => place
                .encode_final(seg, m, divisor, n.bound, n.codec)
                .map(Some),
            Some(n) => place.encode(seg, n.bound, n.codec).map(Some),
            None => Ok(None),
        };
        // the compression waited for the stream (for its length): the accumulation queued
        // before it has run, and is judged now, its error first
        let sent = encode(self);
        match self.settle_part(seg, m) {
            // the accumulation ran only now (its stream was not the one guessed): compress again
            Ok(true) => {
                if let Ok(Some(msg)) = sent {
                    self.release(msg);
                }
                encode(self)
            }
            Ok(false) => sent,
            Err(e) => {
                if let Ok(Some(msg)) = sent {
                    self.release(msg);
                }
                Err(e)
            }
        }
    }

    /// The final segment's compression by [`GpuCodec::compress_reconstruct_device`], which
    /// leaves the segment's reconstruction in the output, where it applies (the segment holds
    /// its sum in the output, an absolute bound, a codec with the reconstructing kernel);
    /// otherwise [`encode`](RingPlace::encode), after forming the sum again from `m` where the
    /// kernel may have overwritten part of it. Its time counts as compression time.
    fn encode_final(
        &mut self,
        seg: usize,
        m: &DeviceMsg,
        divisor: f64,
        bound: ErrorBound,
        codec: CodecKind,
    ) -> Result<DeviceMsg> {
        // (set again below when this compression leaves the reconstruction in place)
        self.reconstructed[seg] = false;
        let ErrorBound::Abs(abs_bound) = bound else {
            return self.encode(seg, bound, codec);
        };
        let has_kernel = matches!(
            codec,
            CodecKind::Aatrox | CodecKind::CuszpPlain | CodecKind::CuszpOutlier
        );
        let slot = self.slot(seg);
        let r = match slot {
            Slot::Out(r) if has_kernel && self.touched[seg] && self.broken.is_none() => r,
            _ => return self.encode(seg, bound, codec),
        };
        let region = self.region_of(seg);
        let t = std::time::Instant::now();
        let len = self.gpu.compress_reconstruct_device(
            &mut self.out.slice_mut(r),
            codec,
            abs_bound,
            &mut self.scratch.slice_mut(region.clone()),
        );
        self.compress_s += t.elapsed().as_secs_f64();
        if let Some(len) = len? {
            self.reconstructed[seg] = true;
            return Ok(DeviceMsg::Scratch {
                at: region.start,
                len,
            });
        }
        // no reconstructing compression (a degenerate step, or an incompressible sum the
        // kernel may have partly replaced): the sum again, as the host ring stores it
        self.touched[seg] = false;
        self.accumulate_now(seg, m)?;
        if divisor != 1.0 {
            self.scale(seg, divisor)?;
        }
        self.encode(seg, bound, codec)
    }

    fn scale(&mut self, seg: usize, d: f64) -> Result<()> {
        if !self.touched[seg] {
            return Err(Error::Comm(
                "ring: scaling a segment that holds no partial sum".into(),
            ));
        }
        let range = match self.slot(seg) {
            Slot::Out(r) => r,
            Slot::Tmp(_) => {
                return Err(Error::Comm(
                    "ring: scaling a partial sum that is not a result".into(),
                ))
            }
        };
        let stream = self.gpu.stream().clone();
        let util = crate::gpu::util::RangeScale::for_stream(&stream)?;
        util.scale(&stream, &mut self.out.slice_mut(range), T::from_f64(d))?;
        self.divisors[seg] = d;
        Ok(())
    }

    fn allgather(&mut self, m: DeviceMsg) -> Result<Vec<DeviceMsg>> {
        let stream = self.gpu.stream().clone();
        // queued: the next piece's final compression overlaps this one's transfer
        let all = self.t.allgather_device(&self.view(&m), &stream)?;
        // this rank's own part is decoded from the scratch it was compressed into
        let mut own = Some(m);
        Ok(all
            .into_iter()
            .map(|b| match b {
                Some(b) => DeviceMsg::Received(b),
                None => own.take().unwrap_or(DeviceMsg::Scratch { at: 0, len: 0 }),
            })
            .collect())
    }

    fn release(&mut self, m: DeviceMsg) {
        if let DeviceMsg::Received(b) = m {
            // a message nothing read may still be on the wire, and with it the send from this
            // rank's scratch region: later work on the stream waits for both
            let _ = b.wait_ready(self.gpu.stream());
            self.t.recycle(b);
        }
    }

    fn failed_msg(&mut self) -> DeviceMsg {
        DeviceMsg::Scratch { at: 0, len: 0 }
    }

    fn all_succeeded(&mut self, ok: bool) -> Result<bool> {
        super::reduce::all_ranks(self.t.host(), ok)
    }

    fn global_range(&mut self, ok: bool) -> Result<(Option<(f64, f64)>, bool)> {
        let local = self.local_range();
        let mine = local.as_ref().ok().copied().flatten();
        ring::agree_range(self.t.host(), mine, ok && local.is_ok())
    }

    fn reset(&mut self) {
        self.touched.iter_mut().for_each(|t| *t = false);
        self.reconstructed.iter_mut().for_each(|t| *t = false);
    }

    fn decode_into_output(&mut self, seg: usize, m: &DeviceMsg) -> Result<()> {
        if matches!(m, DeviceMsg::Scratch { .. }) && self.reconstructed[seg] {
            return Ok(()); // the final step left the decoded values in place
        }
        if !self.queue {
            return self.decode_now(seg, m);
        }
        let range = self.parts[seg].clone();
        let codec_stream = self.gpu.stream().clone();
        let stream = ready_view(self.scratch, &codec_stream, m)?;
        let t = std::time::Instant::now();
        let expected = (self.codec, BoundMode::Abs);
        let out = &mut self.out.slice_mut(range);
        let r = self.gpu.decompress_device_queued(&stream, out, expected);
        self.decompress_s += t.elapsed().as_secs_f64();
        if let Decode::Queued(decode) = r? {
            self.pending.push(Pending {
                part: seg,
                decode,
                accumulation: false,
            });
        }
        Ok(())
    }
}
