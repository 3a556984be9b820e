//! Device buffers with a non-CUDA-aware MPI: compress on the GPU, copy the compressed bytes
//! device→host into pinned memory, send, copy host→device, decompress on the GPU.
//!
//! * [`DeviceStager`] owns a [`GpuCodec`], device scratch and pinned host buffers (grown, then
//!   reused, so steady-state calls allocate nothing but the received message).
//! * [`Communicator::sendrecv_device`] is the staged pairwise exchange (raw or compressed by the
//!   policy). A compressed buffer larger than `Config::pipeline_min_bytes` goes through the same
//!   chunk pipeline as host messages (`comm::pipeline`, see the [`comm`](super) docs), with a
//!   device chunk codec: encode chunk `k` = GPU compression of that slice + D2H of its stream
//!   into pinned memory; decode = H2D + GPU decompression into the slice. Overlap it gets: the
//!   GPU compression (+ D2H) of chunk `k+1` runs while chunk `k`'s MPI transfer is in flight,
//!   and the H2D + decompression of chunk `k-1` while chunk `k` arrives. Not overlapped: the D2H
//!   of a chunk with its own compression (one stream, synchronous copies), and copies with GPU
//!   work of other chunks. The device pipeline is a composition of the tested stager pieces and
//!   the host-tested schedule; it has not been run on a GPU yet.
//! * [`DeviceStager::stage_to_host`] / [`DeviceStager::restore_to_device`] expose the GPU→CPU
//!   staging on its own (checkpoint/offload: compressed on the device, kept compressed on the
//!   host).
//! * [`GpuCompressor`] plugs the GPU codec into a [`Communicator`] for host buffers.
//! * [`Communicator::allgather_device`] / [`Communicator::bcast_device`]: GPU compression, D2H
//!   of the stream, the byte allgather / broadcast of the streams (after the usual descriptor
//!   agreement), then H2D + GPU decompression of every received stream on every rank (the root
//!   and the own slice too, so all ranks hold identical values). The blocking forms stage
//!   through the stager's pinned send / receive buffers (grown once, then reused: no per-call
//!   host allocation, no copy of the streams, pinned-speed copies; the allgather is `p-1`
//!   pairwise sized exchanges straight into the pinned buffer, not `MPI_Allgatherv`, which
//!   would also memcpy this rank's own record into the receive buffer); the non-blocking forms
//!   lend the same pinned buffers to the transfer (`MPI_Ibcast` / `MPI_Iallgatherv` straight
//!   on them, through the transport's `ibcast_into` / `iallgatherv_into`) and take them back
//!   in the wait: no per-call allocation or copy of the streams either, pinned H2D (the
//!   non-blocking allgather's `MPI_Iallgatherv` also copies this rank's record into the
//!   receive buffer; another stager operation between the start and the wait grows fresh
//!   pinned buffers). Allgather: `Auto` compresses like `Always` (every rank must take the
//!   same path); bcast: the root decides `Auto` with the model and the previous ratio. `Never`
//!   moves the raw bytes.
//! * [`Communicator::allreduce_device`] / [`Communicator::allreduce_mean_device`] /
//!   [`Communicator::reduce_scatter_device`], compressed (`Always`, or `Auto` when the model
//!   predicts it faster): a device-resident ring. The global value range comes from a GPU range
//!   pass and the descriptor agreement; the per-quantization bound is the host path's
//!   [`reduction_step_bound`](super::reduction_step_bound) (`p` quantizations for the
//!   allreduces, `p-1` for reduce-scatter; partial sums at `eb·divisor`, the final value at
//!   `eb`). Ring reduce-scatter over the device segments of [`partition`](super::partition)
//!   `(n, p)`: each of the `p-1` steps compresses the outgoing partial sum on the GPU into the
//!   stager's device scratch, copies the stream D2H into the reused pinned send buffer,
//!   exchanges a length header and the sized stream with the ring neighbours (the transport's
//!   `sendrecv_sized`, into the pinned receive buffer), copies the received stream H2D and adds
//!   it into the device accumulator with the fused [`GpuCodec::decompress_add_device`] (the
//!   allreduces accumulate in `out`, a device copy of the input; reduce-scatter in a segment
//!   scratch and, at the last step, in `out`). The allreduces then divide this rank's segment
//!   by `p` (mean, IEEE division on the device, as the host path's `v / p`), compress it once,
//!   and allgather the compressed segments through the pinned buffers (as `allgather_device`);
//!   every rank decompresses every segment on the device (its own too: identical results on
//!   all ranks). The order of operations is the host ring's, so the results equal the host
//!   path's with the same codec. A failure on one rank travels through the ring as a flagged
//!   step header (every rank still runs every step) and a second agreement fails every rank
//!   together. `Never`, `Auto` deciding raw, `rel` bounds, one rank, fewer values than ranks
//!   or no usable step bound take the staged host path: D2H of the values into the stager's
//!   pinned send buffer, the host [`Communicator::allreduce`] / `allreduce_mean` /
//!   `reduce_scatter` (compressed on the wire by the communicator's [`Compressor`], e.g. a
//!   [`GpuCompressor`], when it decides so), H2D of the result from the pinned receive
//!   buffer. `config.verify` is not applied by the device ring (no `max_error`).

//! # Non-blocking forms (as in the host API)
//!
//! | blocking | non-blocking | completes with |
//! |---|---|---|
//! | `allgather_device` | [`iallgather_device`](Communicator::iallgather_device) (`MPI_Iallgatherv`) | [`wait_allgather_device`](Communicator::wait_allgather_device) |
//! | `bcast_device` | [`ibcast_device`](Communicator::ibcast_device) (`MPI_Ibcast`) | [`wait_bcast_device`](Communicator::wait_bcast_device) |
//! | `allreduce_device` | [`iallreduce_device`](Communicator::iallreduce_device) (progress thread) | [`wait_device`](Communicator::wait_device) |
//! | `allreduce_mean_device` | [`iallreduce_mean_device`](Communicator::iallreduce_mean_device) (progress thread) | `wait_device` |
//! | `reduce_scatter_device` | [`ireduce_scatter_device`](Communicator::ireduce_scatter_device) (progress thread) | `wait_device` |
//! | `sendrecv_device` | [`isendrecv_device`](Communicator::isendrecv_device) (progress thread, host wire codec, not the device pipeline) | `wait_device` |
//! | `stage_to_host` / `restore_to_device` | none (local, synchronous on the stager's stream) | |
//!
//! The progress-thread forms stage the input to the host before returning (so the device input
//! may be reused at once) and need `MPI_THREAD_MULTIPLE` ([`Error::Unavailable`] otherwise), as
//! the host `iallreduce` family.
//! The non-blocking reductions keep the staged host path (D2H of the raw values, the host ring
//! with the communicator's [`Compressor`], H2D of the result), not the device ring; with a
//! [`GpuCompressor`] their results equal the blocking device ring's.
//!
//! # Model and calibration
//!
//! Every operation fills [`OpStats`]'s predictions from a [`DeviceProfile`] measured by
//! [`DeviceStager::calibrate`]: GPU codec throughput (warm-up, then the median of
//! [`CALIBRATION_REPS`] repetitions on a field of at least 64 MiB, every rank at once) and pinned
//! staging times at several sizes ([`StagingCurve`], interpolated; compressed streams are
//! predicted at their own, smaller size). Composed operations add the two staging copies to the
//! host operation's prediction; the device ring is predicted by
//! [`DeviceProfile::predict_reduce`].
//!
//! ## Who works at the same time: shared and solo rates
//!
//! The calibration measures every codec call and pinned copy twice: *shared* (every rank at
//! once, as in a collective) and *solo* (rank 0 alone, the others waiting in a barrier), plus
//! the link twice: the communicator's two-way ping-pong (both ranks send at once) and a
//! *one-way* curve (rank 0 → 1 and 1 → 0, the others idle). It also records how many ranks share
//! one GPU (`ranks_per_gpu`, `s`: same host and same GPU PCI address). Each stage of each
//! operation takes the measurement made under its own concurrency; no term is scaled by a
//! fitted factor:
//!
//! * A stage that every rank runs at the same time uses the shared rates: the compression and
//!   the copies of `stage_to_host`, every stage of `sendrecv_device`, `allgather_device` and
//!   the device ring, every rank's upload in `bcast_device` and `restore_to_device`. With
//!   `s > 1` the shared copies already contain their serialization on the one copy engine /
//!   PCIe link (the slowest rank's copy ends after all of them); with one rank per GPU shared
//!   and solo are the same calls (the shared ones also contain any sharing of the host link).
//! * A stage that one rank runs while the others wait uses the solo rates: the `bcast_device`
//!   root's compression and D2H (the other ranks wait in the broadcast).
//! * A broadcast's tree step is one-way (`ceil(log2 p)` steps of the one-way curve; concurrent
//!   pairs of a later step are assumed not to slow each other).
//! * The decompression after the uploads of `restore_to_device` and `bcast_device` (the
//!   broadcast's root leaves the transfer before the receivers; the local restore measured so
//!   too): the `s` uploads of one GPU end one after another (the first after `h2d / s`, `h2d`
//!   the shared upload time), so the slowest rank's call ends at the later of its own upload
//!   plus a solo call and the GPU's `s` calls at the shared rate started after the first upload:
//!   `staggered = max(solo, h2d / s + shared - h2d)`. When the driver lets the uploads end
//!   together instead, the `s` calls run at once at the shared rate (`concurrent = shared`);
//!   with `s > 1` the model predicts the mean of the two
//!   ([`DeviceProfile::decompress_after_upload_s`]). With `s = 1` this is `max(solo, shared)`.
//!   After a joint exchange (`sendrecv_device`, `allgather_device`, the ring steps) every rank
//!   leaves the MPI call at once and the calls measured at the shared rate (below): shared.
//!
//! Evidence (bench/results/2026-11-22-h100-mpi-staging-v5.jsonl, 1 GiB f32 at ratio 19, two
//! ranks sharing one H100, shared-only profile): `restore_to_device` measured H2D 2.07 ms =
//! the shared curve's 2.06 ms, but decompression 0.75 ms = the solo rate, not the shared
//! 1.47 ms (2.07 + 0.75 = 2.82 ≈ 2.81 ms measured; each upload alone ≈ 1.03 ms, the first
//! rank decompresses while the second copies); `bcast_device` measured the root's compression
//! 1.91 ms and D2H 1.03 ms (solo; shared 4.27 / 2.06 ms), the link 9.54 ms for the 56 MB
//! stream (≈ 5.9 GB/s one way, the ping-pong's 3.48 GB/s per direction predicted 16.2 ms; raw
//! bcast 223 ms vs 387 ms predicted), H2D 2.12 ms (shared 2.06) and decompression 0.75 ms
//! (solo). The next run of the same binary family (…-v6.jsonl, 11:10 UTC, solo rates calibrated)
//! measured the other case: `restore_to_device` H2D 2.18 ms then decompression 1.42 ms (the
//! shared rate: the two ranks' uploads ended together), 3.59 ms against 2.92 ms predicted with
//! the staggered case alone; hence the mean. `stage_to_host` (6.15 vs 6.33 ms), `sendrecv_device` (25.8 vs 26.0 ms: its
//! decompression 1.47 ms is the shared rate), `allgather_device` and the reductions matched
//! the shared rates within 10 %, and keep them.
//!
//! The device collectives are compositions of tested pieces (stager copies, GPU codec, host
//! algorithms) compiled under feature `cuda` (`examples/staging` runs and checks all of them);
//! the device ring of the reductions has not been run on a GPU yet.
//!
//! Complex device buffers are passed as their interleaved real scalars (`2n` f32/f64 values).

use std::sync::Mutex;

use cudarc::driver::{
    result as cu, CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut,
    PinnedHostSlice,
};

use super::{
    element::Real,
    transport::{OwnedBytes, PendingBuf},
    Communicator, Compressor, Decision, Desc, OpRequest, OpStats, ReduceOp, OP_SENDRECV,
};
use crate::codec::CodecKind;
use crate::error::{Error, Result};
use crate::format::Dtype;
use crate::gpu::{GpuCodec, GpuElement};
use crate::model::{
    self, Link, LinkCurve, LinkPoint, Policy, Scenario, StagingCurve, StagingPoint,
};
use crate::quant::ErrorBound;

fn gpu_err(what: &'static str) -> impl Fn(cu::DriverError) -> Error {
    move |e| Error::Gpu(format!("{what}: {e:?}"))
}

/// The GPU codec behind the [`Compressor`] trait (host buffers, compressed on the device).
pub struct GpuCompressor {
    gpu: Mutex<GpuCodec>,
    name: String,
}

impl GpuCompressor {
    /// Wrap a GPU codec.
    pub fn new(gpu: GpuCodec) -> Self {
        let name = format!("gpu:{}", gpu.device_name());
        GpuCompressor {
            gpu: Mutex::new(gpu),
            name,
        }
    }
    /// The codec, with its context made current on the calling thread: the compressor is
    /// called from whatever thread runs the host algorithm (the progress thread of the
    /// non-blocking reductions among them), and the codec's raw driver copies
    /// (`cuMemcpy*Async`) need a current context.
    fn lock(&self) -> Result<std::sync::MutexGuard<'_, GpuCodec>> {
        let g = self
            .gpu
            .lock()
            .map_err(|_| Error::Gpu("GPU codec mutex poisoned".into()))?;
        g.context().bind_to_thread().map_err(gpu_err("bind"))?;
        Ok(g)
    }
}

impl Compressor for GpuCompressor {
    fn name(&self) -> String {
        self.name.clone()
    }
    fn compress_f32(&self, d: &[f32], b: ErrorBound, c: CodecKind) -> Result<Vec<u8>> {
        self.lock()?.compress(d, b, c)
    }
    fn compress_f64(&self, d: &[f64], b: ErrorBound, c: CodecKind) -> Result<Vec<u8>> {
        self.lock()?.compress(d, b, c)
    }
    fn decompress_f32(&self, s: &[u8], out: &mut [f32]) -> Result<()> {
        self.lock()?.decompress_into(s, out)
    }
    fn decompress_f64(&self, s: &[u8], out: &mut [f64]) -> Result<()> {
        self.lock()?.decompress_into(s, out)
    }
}

/// A device buffer compressed and kept in pinned host memory ([`DeviceStager::stage_to_host`]).
pub struct Staged {
    buf: PinnedHostSlice<u8>,
    len: usize,
    count: usize,
    dtype: Dtype,
}

impl std::fmt::Debug for Staged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Staged({} x {}, {} bytes)",
            self.count, self.dtype, self.len
        )
    }
}

impl Staged {
    /// The zcomm stream (readable with [`crate::decompress`] on the CPU too).
    pub fn stream(&self) -> Result<&[u8]> {
        Ok(&self.buf.as_slice().map_err(gpu_err("pinned"))?[..self.len])
    }
    /// Stream length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the stream is empty (never: a stream has a header).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Number of values.
    pub fn count(&self) -> usize {
        self.count
    }
    /// Value type.
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }
    /// Uncompressed bytes / stream bytes.
    pub fn ratio(&self) -> f64 {
        (self.count * self.dtype.size()) as f64 / self.len.max(1) as f64
    }
}

/// Measured device-side speeds (all ranks agree on them, see [`DeviceStager::calibrate`]).
///
/// Serialized with serde; fields added later default to 0 / empty, so older profiles still load
/// (they then predict staging with the single `staging` link, codec calls without a separate
/// fixed cost, and no device passes).
///
/// Codec calls follow the line `t(b) = overhead + b / rate` through a tiny and the full
/// calibration call ([`model::call_line`]): `compress` / `decompress` / `decompress_add` are the
/// slopes and the `*_overhead` fields the intercepts, so a call is charged its fixed cost once.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DeviceProfile {
    /// Device→host / host→device pinned copies (slower direction) at the largest calibrated size;
    /// the fallback when `staging_curve` is empty.
    pub staging: Link,
    /// GPU compression throughput (input bytes/s), beyond `compress_overhead`.
    pub compress: f64,
    /// GPU decompression throughput (output bytes/s), beyond `decompress_overhead`.
    pub decompress: f64,
    /// Pinned copy times at several sizes (every rank copying at once), used for the size
    /// dependence of staging (see [`StagingCurve`]).
    #[serde(default)]
    pub staging_curve: StagingCurve,
    /// Fixed seconds of one GPU compress + decompress call pair beyond the throughput terms
    /// (`compress_overhead + decompress_overhead`; kernel launches, synchronizations, the NOA
    /// range pass and header read-backs; every rank at once). Charged once per pipeline chunk by
    /// the model ([`Scenario::chunk_overhead`]). Profiles written before it load as 0.
    #[serde(default)]
    pub call_overhead: f64,
    /// Fixed seconds of one GPU compression call (intercept of its calibration line).
    #[serde(default)]
    pub compress_overhead: f64,
    /// Fixed seconds of one GPU decompression call (intercept of its calibration line).
    #[serde(default)]
    pub decompress_overhead: f64,
    /// Fused decompress-and-add throughput ([`GpuCodec::decompress_add_device`], output bytes/s)
    /// beyond `decompress_add_overhead`, used by the device ring's steps; 0 = not calibrated
    /// (the plain decompression's line is used).
    #[serde(default)]
    pub decompress_add: f64,
    /// Fixed seconds of one fused decompress-and-add call.
    #[serde(default)]
    pub decompress_add_overhead: f64,
    /// Device-to-device copy (bytes copied per second, every rank at once): the device ring's
    /// copy of the input into the accumulator; 0 = not calibrated (not charged).
    #[serde(default)]
    pub device_copy: f64,
    /// The device reductions' value-range pass (input bytes per second, including its read-back);
    /// 0 = not calibrated (not charged).
    #[serde(default)]
    pub range_pass: f64,
    /// The mean's in-place division kernel (bytes of values per second); 0 = not calibrated.
    #[serde(default)]
    pub scale_pass: f64,
    /// Ranks sharing one GPU (the most of any GPU; ranks on the same host with the same PCI
    /// address, see [`DeviceStager::calibrate`]); 0 = unknown (profiles written before it:
    /// treated as 1).
    #[serde(default)]
    pub ranks_per_gpu: usize,
    /// GPU compression throughput of one rank calling alone (the others idle), beyond
    /// `compress_solo_overhead`; 0 = not calibrated (the shared `compress` line is used).
    #[serde(default)]
    pub compress_solo: f64,
    /// Fixed seconds of one GPU compression call of one rank alone.
    #[serde(default)]
    pub compress_solo_overhead: f64,
    /// GPU decompression throughput of one rank alone, beyond `decompress_solo_overhead`; 0 =
    /// not calibrated (the shared `decompress` line is used).
    #[serde(default)]
    pub decompress_solo: f64,
    /// Fixed seconds of one GPU decompression call of one rank alone.
    #[serde(default)]
    pub decompress_solo_overhead: f64,
    /// Pinned copy times of one rank copying alone (the others idle); empty = not calibrated
    /// (the shared `staging_curve` is used).
    #[serde(default)]
    pub staging_curve_solo: StagingCurve,
    /// One-way transfer times between ranks 0 and 1 (one sends, the other receives, the rest
    /// idle; pinned buffers; the slower direction), for the broadcast's tree steps; empty = not
    /// calibrated (the two-way ping-pong link is used).
    #[serde(default)]
    pub link_one_way: LinkCurve,
}

/// The model's time of one device operation split by stage (seconds; the same stages as the
/// measured [`StageTimes`], `link` ↔ `network`), so a measurement shows which term misses.
/// `device` holds device-memory passes that [`StageTimes`] does not time (the reductions' input
/// copy, range pass and the mean's division). Codec terms include the per-call fixed costs.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Terms {
    /// GPU compression.
    pub compress: f64,
    /// Device→host copies.
    pub d2h: f64,
    /// MPI transfers (latency + bytes / link bandwidth).
    pub link: f64,
    /// Host→device copies.
    pub h2d: f64,
    /// GPU decompression (the ring's fused decompress-and-add included).
    pub decompress: f64,
    /// Device-memory passes (copies, range, scaling).
    pub device: f64,
}

impl Terms {
    /// The predicted time: the sum of the stages (the operations run them one after another).
    pub fn total(&self) -> f64 {
        self.compress + self.d2h + self.link + self.h2d + self.decompress + self.device
    }
    /// Every stage times `k` (e.g. `k` equal chunks).
    pub fn times(&self, k: f64) -> Terms {
        Terms {
            compress: self.compress * k,
            d2h: self.d2h * k,
            link: self.link * k,
            h2d: self.h2d * k,
            decompress: self.decompress * k,
            device: self.device * k,
        }
    }
}

/// `bytes / rate`, or 0 when the rate was not calibrated.
fn pass_s(rate: f64, bytes: f64) -> f64 {
    if rate > 0.0 && bytes > 0.0 {
        bytes / rate
    } else {
        0.0
    }
}

/// Record a `(raw, compressed)` model prediction in `st` (both totals, and the one of the path
/// taken as `predicted_s`); returns the terms of the path taken.
fn record_prediction(st: &mut OpStats, (raw, cmp): (Terms, Terms), compressed: bool) -> Terms {
    st.predicted_raw_s = raw.total();
    st.predicted_compressed_s = cmp.total();
    let taken = if compressed { cmp } else { raw };
    st.predicted_s = taken.total();
    taken
}

/// Seconds of a calibrated call line (fixed cost + `bytes / rate`), or `fallback` when the
/// rate was not calibrated (0 in profiles written before it existed).
fn line_or(overhead: f64, rate: f64, bytes: f64, fallback: impl FnOnce() -> f64) -> f64 {
    if rate > 0.0 {
        overhead + bytes / rate
    } else {
        fallback()
    }
}

impl DeviceProfile {
    /// The guess used before any calibration (H100-class PCIe, one rank per GPU).
    pub fn guess() -> Self {
        DeviceProfile {
            staging: Link {
                bandwidth: 20e9,
                latency: 10e-6,
            },
            compress: 200e9,
            decompress: 300e9,
            staging_curve: StagingCurve::default(),
            call_overhead: 300e-6,
            compress_overhead: 150e-6,
            decompress_overhead: 150e-6,
            decompress_add: 0.0,
            decompress_add_overhead: 0.0,
            device_copy: 0.0,
            range_pass: 0.0,
            scale_pass: 0.0,
            ranks_per_gpu: 0,
            compress_solo: 0.0,
            compress_solo_overhead: 0.0,
            decompress_solo: 0.0,
            decompress_solo_overhead: 0.0,
            staging_curve_solo: StagingCurve::default(),
            link_one_way: LinkCurve::default(),
        }
    }
    /// Seconds of a pinned device→host copy of `bytes`.
    pub fn d2h_s(&self, bytes: f64) -> f64 {
        self.staging_curve
            .d2h(bytes)
            .unwrap_or(self.staging.latency + bytes / self.staging.bandwidth)
    }
    /// Seconds of a pinned host→device copy of `bytes`.
    pub fn h2d_s(&self, bytes: f64) -> f64 {
        self.staging_curve
            .h2d(bytes)
            .unwrap_or(self.staging.latency + bytes / self.staging.bandwidth)
    }
    /// Seconds of one GPU compression call on `bytes` (fixed cost + throughput term).
    pub fn compress_s(&self, bytes: f64) -> f64 {
        self.compress_overhead + bytes / self.compress
    }
    /// Seconds of one GPU decompression call producing `bytes`.
    pub fn decompress_s(&self, bytes: f64) -> f64 {
        self.decompress_overhead + bytes / self.decompress
    }
    /// Seconds of one fused decompress-and-add call on `bytes` of values (the plain
    /// decompression's when not calibrated).
    pub fn decompress_add_s(&self, bytes: f64) -> f64 {
        line_or(
            self.decompress_add_overhead,
            self.decompress_add,
            bytes,
            || self.decompress_s(bytes),
        )
    }
    /// Seconds of a pinned device→host copy of `bytes` by one rank alone (the solo curve; the
    /// shared one when not calibrated).
    pub fn d2h_solo_s(&self, bytes: f64) -> f64 {
        self.staging_curve_solo
            .d2h(bytes)
            .unwrap_or_else(|| self.d2h_s(bytes))
    }
    /// Seconds of a pinned host→device copy of `bytes` by one rank alone.
    pub fn h2d_solo_s(&self, bytes: f64) -> f64 {
        self.staging_curve_solo
            .h2d(bytes)
            .unwrap_or_else(|| self.h2d_s(bytes))
    }
    /// Seconds of one GPU compression call on `bytes` by one rank alone (the shared line when
    /// not calibrated).
    pub fn compress_solo_s(&self, bytes: f64) -> f64 {
        line_or(
            self.compress_solo_overhead,
            self.compress_solo,
            bytes,
            || self.compress_s(bytes),
        )
    }
    /// Seconds of one GPU decompression call producing `bytes` by one rank alone.
    pub fn decompress_solo_s(&self, bytes: f64) -> f64 {
        line_or(
            self.decompress_solo_overhead,
            self.decompress_solo,
            bytes,
            || self.decompress_s(bytes),
        )
    }
    /// Ranks per GPU (at least 1).
    pub fn sharing(&self) -> usize {
        self.ranks_per_gpu.max(1)
    }
    /// Seconds of one one-way transfer of `bytes` (one rank sends, one receives): the one-way
    /// curve, else `link` (the two-way ping-pong).
    pub fn one_way_s(&self, link: Link, bytes: f64) -> f64 {
        self.link_one_way
            .seconds(bytes)
            .unwrap_or(link.latency + bytes / link.bandwidth)
    }
    /// Seconds of the decompression producing `bytes` that follows an upload taking `h2d`
    /// seconds with every rank uploading at once (the shared curve), for the slowest rank. The
    /// `s` ranks of one GPU ([`sharing`](Self::sharing)) get their uploads one after another
    /// (the first done after `h2d / s`), so the last rank's call cannot end before
    /// `h2d + decompress_solo` (its own upload, then its call alone), nor before the GPU has
    /// done all `s` calls at the shared rate, started when the first upload is done
    /// (`h2d / s + decompress_shared`): the later of the two, minus the upload (*staggered*).
    /// But the driver does not always serialize the uploads of ranks sharing a GPU: when they
    /// end together, the `s` calls run at once at the shared rate (*concurrent*). Both happened
    /// in back-to-back runs of the same binary (see the module docs), so with `s > 1` the model
    /// takes the mean of the two cases (the prediction that is off least in either). One rank
    /// per GPU: `max(solo, shared)` (the same physical call).
    pub fn decompress_after_upload_s(&self, bytes: f64, h2d: f64) -> f64 {
        let s = self.sharing() as f64;
        let solo = self.decompress_solo_s(bytes);
        let shared = self.decompress_s(bytes);
        let staggered = solo.max(h2d / s + shared - h2d);
        if self.sharing() <= 1 {
            return staggered;
        }
        let concurrent = staggered.max(shared);
        0.5 * (staggered + concurrent)
    }
    /// The staging link of one hop of `bytes` (the curve at that size, else `staging`).
    pub fn staging_link(&self, bytes: f64) -> Link {
        self.staging_curve.link(bytes).unwrap_or(self.staging)
    }
    /// The model scenario of a staged point-to-point transfer of `bytes` at `ratio` over `link`
    /// in `chunks` pieces: the raw hops use the staging link at the chunk size, the compressed
    /// hops at the compressed chunk size; every chunk pays one compress + decompress call's
    /// fixed cost ([`call_overhead`](Self::call_overhead)) on top of the throughput slopes.
    pub fn scenario(&self, link: Link, bytes: f64, ratio: f64, chunks: usize) -> Scenario {
        let k = chunks.max(1);
        let c = bytes / k as f64;
        Scenario::new(bytes, ratio, link, self.compress, self.decompress)
            .with_staging(Some(self.staging_link(c)))
            .with_compressed_staging(Some(self.staging_link(c / ratio.max(1e-9))))
            .with_chunks(k)
            .with_chunk_overhead(self.call_overhead)
    }

    /// Whether a compressed device exchange of `bytes` at `ratio` is predicted faster in
    /// `chunks` pipelined chunks than as one message (by at least 10 %, per-chunk overhead
    /// included).
    pub fn pipeline_pays(&self, link: Link, bytes: f64, ratio: f64, chunks: usize) -> bool {
        if chunks <= 1 {
            return false;
        }
        let whole = model::predict(&self.scenario(link, bytes, ratio, 1)).compressed_serial;
        let piped = model::predict(&self.scenario(link, bytes, ratio, chunks)).compressed_pipelined;
        piped < 0.9 * whole
    }
    /// Model stages (raw, compressed) of [`DeviceStager::stage_to_host`] of `bytes`: a D2H of
    /// the values vs a GPU compression + D2H of the stream.
    pub fn stage_terms(&self, bytes: f64, ratio: f64) -> (Terms, Terms) {
        let raw = Terms {
            d2h: self.d2h_s(bytes),
            ..Terms::default()
        };
        let cmp = Terms {
            compress: self.compress_s(bytes),
            d2h: self.d2h_s(bytes / ratio.max(1e-9)),
            ..Terms::default()
        };
        (raw, cmp)
    }
    /// Model (raw, compressed) seconds of [`DeviceStager::stage_to_host`] of `bytes`.
    pub fn predict_stage_to_host(&self, bytes: f64, ratio: f64) -> (f64, f64) {
        let (r, c) = self.stage_terms(bytes, ratio);
        (r.total(), c.total())
    }
    /// Model stages (raw, compressed) of [`DeviceStager::restore_to_device`] of `bytes`: an H2D
    /// of the values vs an H2D of the stream + GPU decompression.
    pub fn restore_terms(&self, bytes: f64, ratio: f64) -> (Terms, Terms) {
        let raw = Terms {
            h2d: self.h2d_s(bytes),
            ..Terms::default()
        };
        let h2d = self.h2d_s(bytes / ratio.max(1e-9));
        let cmp = Terms {
            h2d,
            decompress: self.decompress_after_upload_s(bytes, h2d),
            ..Terms::default()
        };
        (raw, cmp)
    }
    /// Model (raw, compressed) seconds of [`DeviceStager::restore_to_device`] of `bytes`.
    pub fn predict_restore_to_device(&self, bytes: f64, ratio: f64) -> (f64, f64) {
        let (r, c) = self.restore_terms(bytes, ratio);
        (r.total(), c.total())
    }
    /// Model stages (raw, compressed) of one whole-message [`Communicator::sendrecv_device`] of
    /// `bytes` at `ratio` (the serial form of [`scenario`](Self::scenario) with one chunk, which
    /// has the same total).
    pub fn sendrecv_terms(&self, link: Link, bytes: f64, ratio: f64) -> (Terms, Terms) {
        let z = bytes / ratio.max(1e-9);
        let raw = Terms {
            d2h: self.d2h_s(bytes),
            link: link.latency + bytes / link.bandwidth,
            h2d: self.h2d_s(bytes),
            ..Terms::default()
        };
        let cmp = Terms {
            compress: self.compress_s(bytes),
            d2h: self.d2h_s(z),
            link: link.latency + z / link.bandwidth,
            h2d: self.h2d_s(z),
            decompress: self.decompress_s(bytes),
            device: 0.0,
        };
        (raw, cmp)
    }
    /// Model stages (raw, compressed) of [`Communicator::allgather_device`] of `bytes` per rank
    /// over `p` ranks: staging out, `p-1` pairwise link transfers, and `p` uploads (+
    /// decompression calls).
    pub fn allgather_terms(&self, link: Link, p: usize, bytes: f64, ratio: f64) -> (Terms, Terms) {
        let (pf, z) = (p.max(1) as f64, bytes / ratio.max(1e-9));
        let raw = Terms {
            d2h: self.d2h_s(bytes),
            link: (pf - 1.0) * (link.latency + bytes / link.bandwidth),
            h2d: pf * self.h2d_s(bytes),
            ..Terms::default()
        };
        let cmp = Terms {
            compress: self.compress_s(bytes),
            d2h: self.d2h_s(z),
            link: (pf - 1.0) * (link.latency + z / link.bandwidth),
            h2d: pf * self.h2d_s(z),
            decompress: pf * self.decompress_s(bytes),
            device: 0.0,
        };
        (raw, cmp)
    }
    /// Model (raw, compressed) seconds of [`Communicator::allgather_device`].
    pub fn predict_allgather(&self, link: Link, p: usize, bytes: f64, ratio: f64) -> (f64, f64) {
        let (r, c) = self.allgather_terms(link, p, bytes, ratio);
        (r.total(), c.total())
    }
    /// Model stages (raw, compressed) of the blocking [`Communicator::bcast_device`] of `bytes`
    /// over `p` ranks: the root alone compresses and stages out (solo codec call and copy),
    /// `ceil(log2 p)` one-way link transfers (binomial tree; [`one_way_s`](Self::one_way_s) per
    /// step), then every rank uploads at once (shared curve) and decompresses after its upload
    /// ([`decompress_after_upload_s`](Self::decompress_after_upload_s)).
    pub fn bcast_terms(&self, link: Link, p: usize, bytes: f64, ratio: f64) -> (Terms, Terms) {
        let hops = (p.max(1) as f64).log2().ceil();
        let z = bytes / ratio.max(1e-9);
        let raw = Terms {
            d2h: self.d2h_solo_s(bytes),
            link: hops * self.one_way_s(link, bytes),
            h2d: self.h2d_s(bytes),
            ..Terms::default()
        };
        let h2d = self.h2d_s(z);
        let cmp = Terms {
            compress: self.compress_solo_s(bytes),
            d2h: self.d2h_solo_s(z),
            link: hops * self.one_way_s(link, z),
            h2d,
            decompress: self.decompress_after_upload_s(bytes, h2d),
            device: 0.0,
        };
        (raw, cmp)
    }
    /// Model (raw, compressed) seconds of the blocking [`Communicator::bcast_device`].
    pub fn predict_bcast(&self, link: Link, p: usize, bytes: f64, ratio: f64) -> (f64, f64) {
        let (r, c) = self.bcast_terms(link, p, bytes, ratio);
        (r.total(), c.total())
    }
}

impl DeviceProfile {
    /// Model stages of the compressed device ring of [`Communicator::allreduce_device`] /
    /// `allreduce_mean_device` (`fin = Some(final_ratio)`) or
    /// [`Communicator::reduce_scatter_device`] (`fin = None`) of `bytes` per rank over `p` ranks:
    ///
    /// * the value-range pass over the input (every kind), and for the allreduces the device
    ///   copy of the input into the accumulator (reduce-scatter copies one input segment per
    ///   step instead);
    /// * `p-1` steps on a segment of `bytes/p` at the ring's `ratio`, each a GPU compression, a
    ///   D2H of the stream, the link transfer (plus the length header's latency), an H2D of the
    ///   received stream and the fused GPU decompress-and-add;
    /// * (allreduces) the mean's division of this rank's segment (`mean`), its compression once
    ///   more at the final bound, whose stream has its own ratio `final_ratio` (the reduced
    ///   segment is a sum of `p` fields at a bound of its own, so it compresses differently from
    ///   the ring's partial sums), and the allgather of these streams
    ///   ([`allgather_terms`](Self::allgather_terms) of one segment).
    pub fn reduce_terms(
        &self,
        link: Link,
        p: usize,
        bytes: f64,
        ratio: f64,
        fin: Option<f64>,
        mean: bool,
    ) -> Terms {
        if p < 2 {
            return Terms::default();
        }
        let pf = p as f64;
        let seg = bytes / pf;
        let z = seg / ratio.max(1e-9);
        let steps = pf - 1.0;
        let mut t = Terms {
            compress: steps * self.compress_s(seg),
            d2h: steps * self.d2h_s(z),
            link: steps * (2.0 * link.latency + z / link.bandwidth),
            h2d: steps * self.h2d_s(z),
            decompress: steps * self.decompress_add_s(seg),
            device: pass_s(self.range_pass, bytes),
        };
        match fin {
            Some(rf) => {
                t.device += pass_s(self.device_copy, bytes);
                if mean {
                    t.device += pass_s(self.scale_pass, seg);
                }
                let g = self.allgather_terms(link, p, seg, rf).1;
                t.compress += g.compress;
                t.d2h += g.d2h;
                t.link += g.link;
                t.h2d += g.h2d;
                t.decompress += g.decompress;
            }
            None => t.device += steps * pass_s(self.device_copy, seg),
        }
        t
    }
    /// Model seconds of the compressed device ring (see [`reduce_terms`](Self::reduce_terms)),
    /// with the final streams (`full`) at the ring's ratio and no division.
    pub fn predict_reduce(&self, link: Link, p: usize, bytes: f64, ratio: f64, full: bool) -> f64 {
        self.reduce_terms(link, p, bytes, ratio, full.then_some(ratio), false)
            .total()
    }
}

/// The utility kernels of the device reductions (value range, the mean's division).
type DevUtils = crate::gpu::util::RangeScale;

/// Compile (or take from the cache) and load them on `stream`'s context.
fn load_dev_utils(stream: &std::sync::Arc<CudaStream>) -> Result<DevUtils> {
    let (m, blocks) =
        crate::gpu::util::compile_and_load(stream, crate::gpu::compile::Module::Util)?;
    DevUtils::from_module(&m, blocks)
}

/// Wall-clock seconds of each stage of the last staged operation on this rank.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct StageTimes {
    /// GPU compression.
    pub compress: f64,
    /// Device→host copy.
    pub d2h: f64,
    /// MPI exchange (descriptors, payload, verdict).
    pub network: f64,
    /// Host→device copy.
    pub h2d: f64,
    /// GPU decompression.
    pub decompress: f64,
}

/// A stager's pinned buffer lent to a non-blocking transfer ([`OwnedBytes`]; handed back to
/// the stager by the wait).
struct PinnedBytes(PinnedHostSlice<u8>);

impl OwnedBytes for PinnedBytes {
    fn bytes(&mut self) -> Result<&mut [u8]> {
        self.0.as_mut_slice().map_err(gpu_err("pinned"))
    }
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any> {
        self
    }
}

/// GPU codec + device scratch + pinned host buffers for staged communication.
pub struct DeviceStager {
    gpu: GpuCodec,
    scratch_out: Option<CudaSlice<u8>>,
    scratch_in: Option<CudaSlice<u8>>,
    pinned_send: Option<PinnedHostSlice<u8>>,
    pinned_recv: Option<PinnedHostSlice<u8>>,
    profile: Option<DeviceProfile>,
    /// Value range / scaling kernels of the device reductions (compiled on first use).
    utils: Option<DevUtils>,
    /// Stage times of the last operation.
    pub last: StageTimes,
    /// The model's stages of the last operation's path (compressed or raw) at the ratios it
    /// achieved (see [`Terms`]; for a pipelined exchange the serial sums of its chunks).
    pub last_predicted: Terms,
}

impl std::fmt::Debug for DeviceStager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceStager({:?})", self.gpu)
    }
}

fn now() -> std::time::Instant {
    std::time::Instant::now()
}

impl DeviceStager {
    /// Wrap a GPU codec (no calibration yet: see [`calibrate`](Self::calibrate)).
    pub fn new(gpu: GpuCodec) -> Self {
        DeviceStager {
            gpu,
            scratch_out: None,
            scratch_in: None,
            pinned_send: None,
            pinned_recv: None,
            profile: None,
            utils: None,
            last: StageTimes::default(),
            last_predicted: Terms::default(),
        }
    }
    /// The GPU codec (its stream is the one all copies run on).
    pub fn gpu(&mut self) -> &mut GpuCodec {
        &mut self.gpu
    }
    /// The device profile, if calibrated.
    pub fn profile(&self) -> Option<DeviceProfile> {
        self.profile.clone()
    }
    /// Use a known profile.
    pub fn set_profile(&mut self, p: DeviceProfile) {
        self.profile = Some(p);
    }

    fn stream(&self) -> std::sync::Arc<CudaStream> {
        self.gpu.stream().clone()
    }

    fn grow_dev(
        slot: &mut Option<CudaSlice<u8>>,
        s: &std::sync::Arc<CudaStream>,
        n: usize,
    ) -> Result<()> {
        let need = n.max(4).next_multiple_of(4);
        if slot.as_ref().map_or(true, |b| b.len() < need) {
            *slot = None;
            // SAFETY: scratch is written (by a kernel or a copy) before it is read.
            let b = unsafe { s.alloc::<u8>(need) }
                .map_err(|e| Error::OutOfMemory(format!("{need} device bytes: {e:?}")))?;
            *slot = Some(b);
        }
        Ok(())
    }

    fn grow_pinned(
        slot: &mut Option<PinnedHostSlice<u8>>,
        s: &std::sync::Arc<CudaStream>,
        n: usize,
    ) -> Result<()> {
        let need = n.max(1);
        if slot.as_ref().map_or(true, |b| b.len() < need) {
            *slot = None;
            // SAFETY: pinned memory is written by a copy before it is read; flags 0 (cached,
            // not write-combined) because the CPU (MPI) reads it.
            let b = unsafe { s.context().alloc_pinned_with_flags::<u8>(need, 0) }
                .map_err(|e| Error::OutOfMemory(format!("{need} pinned bytes: {e:?}")))?;
            *slot = Some(b);
        }
        Ok(())
    }

    /// Compress `data` on the device into the device scratch; returns the stream length.
    fn compress_to_scratch<T: GpuElement>(
        &mut self,
        data: &CudaView<'_, T>,
        bound: ErrorBound,
        codec: CodecKind,
    ) -> Result<usize> {
        let s = self.stream();
        Self::grow_dev(
            &mut self.scratch_out,
            &s,
            crate::compress_bound(data.len(), T::DTYPE),
        )?;
        let mut out = self.scratch_out.take().expect("grown");
        let r = {
            let mut v = out.slice_mut(..);
            self.gpu.compress_device(data, bound, codec, &mut v)
        };
        self.scratch_out = Some(out);
        r
    }

    /// Copy `n` bytes of device memory at `src` into `dst` (host) and wait.
    fn d2h(s: &CudaStream, src: u64, dst: &mut [u8]) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        // raw driver call: make the stream's context current on this thread first
        s.context().bind_to_thread().map_err(gpu_err("bind"))?;
        // SAFETY: the caller guarantees `src` holds at least dst.len() bytes on this stream's
        // context; we synchronize before returning so `dst` is not used while the copy runs.
        unsafe { cu::memcpy_dtoh_async(dst, src, s.cu_stream()) }.map_err(gpu_err("d2h"))?;
        s.synchronize().map_err(gpu_err("sync"))
    }

    /// Copy `src` (host) to device memory at `dst` and wait.
    fn h2d(s: &CudaStream, src: &[u8], dst: u64) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        s.context().bind_to_thread().map_err(gpu_err("bind"))?;
        // SAFETY: the caller guarantees `dst` holds at least src.len() bytes; synchronized
        // before returning so `src` outlives the copy.
        unsafe { cu::memcpy_htod_async(dst, src, s.cu_stream()) }.map_err(gpu_err("h2d"))?;
        s.synchronize().map_err(gpu_err("sync"))
    }

    /// Compress a device buffer on the GPU and keep the stream in host memory.
    pub fn stage_to_host<T: GpuElement>(
        &mut self,
        data: &CudaView<'_, T>,
        bound: ErrorBound,
        codec: CodecKind,
    ) -> Result<Staged> {
        let len = self.compress_timed(data, bound, codec)?;
        let mut st = Staged {
            buf: self.alloc_pinned(len)?,
            len,
            count: data.len(),
            dtype: T::DTYPE,
        };
        self.stream_to_pinned(len, &mut st.buf)?;
        Ok(st)
    }

    /// [`stage_to_host`](Self::stage_to_host) reusing `staged`'s pinned memory when it is large
    /// enough (steady-state checkpointing allocates nothing).
    pub fn restage<T: GpuElement>(
        &mut self,
        data: &CudaView<'_, T>,
        bound: ErrorBound,
        codec: CodecKind,
        staged: &mut Staged,
    ) -> Result<()> {
        let len = self.compress_timed(data, bound, codec)?;
        if staged.buf.len() < len {
            staged.buf = self.alloc_pinned(len)?;
        }
        self.stream_to_pinned(len, &mut staged.buf)?;
        staged.len = len;
        staged.count = data.len();
        staged.dtype = T::DTYPE;
        Ok(())
    }

    fn compress_timed<T: GpuElement>(
        &mut self,
        data: &CudaView<'_, T>,
        bound: ErrorBound,
        codec: CodecKind,
    ) -> Result<usize> {
        let t = now();
        let len = self.compress_to_scratch(data, bound, codec)?;
        self.last = StageTimes {
            compress: t.elapsed().as_secs_f64(),
            ..Default::default()
        };
        let bytes = (data.len() * T::SIZE) as f64;
        self.last_predicted = self
            .profile
            .clone()
            .unwrap_or_else(DeviceProfile::guess)
            .stage_terms(bytes, bytes / len.max(1) as f64)
            .1;
        Ok(len)
    }

    /// D2H of the first `len` bytes of the compression scratch.
    fn stream_to_pinned(&mut self, len: usize, dst: &mut PinnedHostSlice<u8>) -> Result<()> {
        let t = now();
        let s = self.stream();
        let src = self.scratch_out.as_ref().expect("grown");
        let (p, _g) = src.device_ptr(&s);
        Self::d2h(
            &s,
            p,
            &mut dst.as_mut_slice().map_err(gpu_err("pinned"))?[..len],
        )?;
        self.last.d2h = t.elapsed().as_secs_f64();
        Ok(())
    }

    /// D2H of the first `len` bytes of the compression scratch into the stager's pinned send
    /// buffer (grown once, then reused).
    fn scratch_to_pinned_send(&mut self, len: usize) -> Result<()> {
        let t = now();
        let s = self.stream();
        Self::grow_pinned(&mut self.pinned_send, &s, len)?;
        let src = self.scratch_out.as_ref().expect("grown");
        let (p, _g) = src.device_ptr(&s);
        let dst = self.pinned_send.as_mut().expect("grown");
        Self::d2h(
            &s,
            p,
            &mut dst.as_mut_slice().map_err(gpu_err("pinned"))?[..len],
        )?;
        self.last.d2h = t.elapsed().as_secs_f64();
        Ok(())
    }

    /// Raw D2H of `data` into the stager's pinned send buffer (grown once, then reused);
    /// returns the byte count.
    fn values_to_pinned_send<T: GpuElement>(&mut self, data: &CudaView<'_, T>) -> Result<usize> {
        let t = now();
        let s = self.stream();
        let n = std::mem::size_of::<T>() * data.len();
        Self::grow_pinned(&mut self.pinned_send, &s, n)?;
        let (p, _g) = data.device_ptr(&s);
        let dst = self.pinned_send.as_mut().expect("grown");
        Self::d2h(
            &s,
            p,
            &mut dst.as_mut_slice().map_err(gpu_err("pinned"))?[..n],
        )?;
        self.last.d2h = t.elapsed().as_secs_f64();
        Ok(n)
    }

    /// Upload `range` of the pinned send (`from_send`) or receive buffer into `out`: H2D +
    /// GPU decompression of a stream (`compressed`), else an H2D of the raw values. Adds the
    /// copy and decompression times to `last`.
    fn upload_pinned<T: GpuElement>(
        &mut self,
        from_send: bool,
        range: std::ops::Range<usize>,
        out: &mut CudaViewMut<'_, T>,
        compressed: bool,
    ) -> Result<()> {
        let slot = if from_send {
            self.pinned_send.take()
        } else {
            self.pinned_recv.take()
        };
        let (h2d, dec) = (self.last.h2d, self.last.decompress);
        let r = match &slot {
            None if range.is_empty() => self.upload_bytes(&[], out, compressed),
            None => Err(Error::Comm("device staging: no pinned buffer".into())),
            Some(b) => b
                .as_slice()
                .map_err(gpu_err("pinned"))
                .and_then(|b| self.upload_bytes(&b[range], out, compressed)),
        };
        if from_send {
            self.pinned_send = slot;
        } else {
            self.pinned_recv = slot;
        }
        self.last.h2d += h2d;
        self.last.decompress += dec;
        r
    }

    /// H2D (+ decompression when `compressed`) of host `bytes` into `out`; sets `last.h2d`
    /// (and `last.decompress`).
    fn upload_bytes<T: GpuElement>(
        &mut self,
        bytes: &[u8],
        out: &mut CudaViewMut<'_, T>,
        compressed: bool,
    ) -> Result<()> {
        if compressed {
            self.upload_and_decompress(bytes, out)
        } else {
            let t = now();
            let r = self.copy_to_device(bytes, out);
            self.last.h2d = t.elapsed().as_secs_f64();
            self.last.decompress = 0.0;
            r
        }
    }

    /// The first `len` bytes of the pinned send (`send`) or receive buffer.
    fn pinned_bytes(&self, send: bool, len: usize) -> Result<&[u8]> {
        let slot = if send {
            &self.pinned_send
        } else {
            &self.pinned_recv
        };
        match slot {
            Some(b) => Ok(&b.as_slice().map_err(gpu_err("pinned"))?[..len]),
            None if len == 0 => Ok(&[]),
            None => Err(Error::Comm("device staging: no pinned buffer".into())),
        }
    }

    /// Lend the pinned send (`send`) or receive buffer, grown to at least `n` bytes, to a
    /// non-blocking transfer (it owns it until the wait hands it back through
    /// [`reclaim_pinned`](Self::reclaim_pinned); meanwhile the stager grows a new one if another
    /// operation needs it). When no pinned memory can be had, a pageable vector of `n` bytes
    /// stands in (slower, but the collective still runs on every rank: an error here, after the
    /// agreement, would leave the other ranks waiting in the transfer).
    fn lend_pinned(&mut self, send: bool, n: usize) -> Box<dyn OwnedBytes> {
        let s = self.stream();
        let slot = if send {
            &mut self.pinned_send
        } else {
            &mut self.pinned_recv
        };
        if n == 0 {
            return match slot.take() {
                Some(b) => Box::new(PinnedBytes(b)),
                None => Box::new(Vec::new()),
            };
        }
        match Self::grow_pinned(slot, &s, n) {
            Ok(()) => Box::new(PinnedBytes(slot.take().expect("grown"))),
            Err(_) => Box::new(vec![0u8; n]),
        }
    }

    /// Take back a buffer lent by [`lend_pinned`](Self::lend_pinned): pinned memory returns to
    /// its slot (unless the slot already holds a buffer at least as large), a stand-in vector
    /// is dropped.
    fn reclaim_pinned(&mut self, send: bool, b: Box<dyn OwnedBytes>) {
        if let Ok(b) = b.into_any().downcast::<PinnedBytes>() {
            let slot = if send {
                &mut self.pinned_send
            } else {
                &mut self.pinned_recv
            };
            if slot.as_ref().map_or(true, |cur| cur.len() < b.0.len()) {
                *slot = Some(b.0);
            }
        }
    }

    /// Page-locked host memory (cached, CPU-readable) on this stager's context.
    pub fn alloc_pinned(&self, n: usize) -> Result<PinnedHostSlice<u8>> {
        let mut slot = None;
        Self::grow_pinned(&mut slot, &self.stream(), n)?;
        Ok(slot.expect("grown"))
    }

    /// Copy a staged stream back to the device and decompress it into `out`.
    pub fn restore_to_device<T: GpuElement>(
        &mut self,
        staged: &Staged,
        out: &mut CudaViewMut<'_, T>,
    ) -> Result<()> {
        if staged.dtype != T::DTYPE || staged.count != out.len() {
            return Err(Error::Mismatch {
                what: "staged buffer",
                expected: format!("{} x {}", out.len(), T::DTYPE),
                found: format!("{} x {}", staged.count, staged.dtype),
            });
        }
        self.last = StageTimes::default();
        let bytes = (staged.count * staged.dtype.size()) as f64;
        self.last_predicted = self
            .profile
            .clone()
            .unwrap_or_else(DeviceProfile::guess)
            .restore_terms(bytes, staged.ratio())
            .1;
        self.upload_and_decompress(staged.stream()?, out)
    }

    fn upload_and_decompress<T: GpuElement>(
        &mut self,
        bytes: &[u8],
        out: &mut CudaViewMut<'_, T>,
    ) -> Result<()> {
        let s = self.stream();
        Self::grow_dev(&mut self.scratch_in, &s, bytes.len())?;
        let t = now();
        {
            let dst = self.scratch_in.as_mut().expect("grown");
            let (p, _g) = dst.device_ptr_mut(&s);
            Self::h2d(&s, bytes, p)?;
        }
        self.last.h2d = t.elapsed().as_secs_f64();
        let t = now();
        let src = self.scratch_in.take().expect("grown");
        let r = {
            let v = src.slice(0..bytes.len());
            self.gpu.decompress_device(&v, out)
        };
        self.scratch_in = Some(src);
        self.last.decompress = t.elapsed().as_secs_f64();
        r
    }

    /// Uncompressed device→host copy (the raw staging baseline).
    pub fn copy_to_host<T: GpuElement>(
        &mut self,
        data: &CudaView<'_, T>,
        out: &mut [u8],
    ) -> Result<()> {
        let n = std::mem::size_of::<T>() * data.len();
        if out.len() != n {
            return Err(Error::invalid("copy_to_host: output length differs"));
        }
        let s = self.stream();
        let (p, _g) = data.device_ptr(&s);
        Self::d2h(&s, p, out)
    }

    /// Uncompressed host→device copy (the raw staging baseline).
    pub fn copy_to_device<T: GpuElement>(
        &mut self,
        data: &[u8],
        out: &mut CudaViewMut<'_, T>,
    ) -> Result<()> {
        let n = std::mem::size_of::<T>() * out.len();
        if data.len() != n {
            return Err(Error::invalid("copy_to_device: input length differs"));
        }
        let s = self.stream();
        let (p, _g) = out.device_ptr_mut(&s);
        Self::h2d(&s, data, p)
    }

    /// The utility kernels (compiled with NVRTC on first use).
    fn utils(&mut self) -> Result<&DevUtils> {
        if self.utils.is_none() {
            self.utils = Some(load_dev_utils(&self.stream())?);
        }
        Ok(self.utils.as_ref().expect("loaded"))
    }

    /// H2D of the first `m` bytes of the pinned receive buffer into the device scratch, then
    /// `out += decompress(stream)` on the GPU (one fused kernel). Adds to `last.h2d` and
    /// `last.decompress`.
    fn upload_add<T: GpuElement>(&mut self, m: usize, out: &mut CudaViewMut<'_, T>) -> Result<()> {
        let s = self.stream();
        Self::grow_dev(&mut self.scratch_in, &s, m)?;
        let t = now();
        {
            let pin = match &self.pinned_recv {
                Some(b) => b.as_slice().map_err(gpu_err("pinned"))?,
                None => return Err(Error::Comm("device staging: no pinned buffer".into())),
            };
            let dst = self.scratch_in.as_mut().expect("grown");
            let (p, _g) = dst.device_ptr_mut(&s);
            Self::h2d(&s, &pin[..m], p)?;
        }
        self.last.h2d += t.elapsed().as_secs_f64();
        let t = now();
        let src = self.scratch_in.take().expect("grown");
        let r = {
            let v = src.slice(0..m);
            self.gpu.decompress_add_device(&v, out)
        };
        self.scratch_in = Some(src);
        self.last.decompress += t.elapsed().as_secs_f64();
        r
    }

    /// GPU compression of `data` into the device scratch and D2H of the stream into the pinned
    /// send buffer; returns the stream length. Adds to `last.compress` and `last.d2h`.
    fn compress_to_pinned_send<T: GpuElement>(
        &mut self,
        data: &CudaView<'_, T>,
        bound: ErrorBound,
        codec: CodecKind,
    ) -> Result<usize> {
        let (c0, d0) = (self.last.compress, self.last.d2h);
        let t = now();
        let len = self.compress_to_scratch(data, bound, codec);
        self.last.compress = c0 + t.elapsed().as_secs_f64();
        let len = len?;
        self.scratch_to_pinned_send(len)?;
        self.last.d2h += d0;
        Ok(len)
    }

    /// Measure GPU codec throughput and pinned copy times, every rank at once (ranks sharing a
    /// GPU see their share, as in the real collective operations); all ranks adopt the slowest
    /// rank's numbers. Collective over `comm`.
    ///
    /// * Codec: a smooth f32 field of `values` values (at least [`CALIBRATION_MIN_VALUES`],
    ///   64 MiB; pass the size of the operations to predict, large enough that one call is not
    ///   lost in another process's time slice), `noa:1e-3`; a barrier before every repetition,
    ///   [`CALIBRATION_WARMUP`] warm-up calls, then the median of [`CALIBRATION_REPS`].
    /// * Staging: pinned D2H and H2D copies at 1, 4, 16, 64, 256 MiB and the field's size (the
    ///   sizes up to it), same schedule, stored as the profile's [`StagingCurve`]; the
    ///   compressed streams (ratio times smaller) are predicted at their own size. Add exact
    ///   sizes with [`calibrate_staging`](Self::calibrate_staging).
    /// * Codec calls (compression, decompression, the fused decompress-and-add of the device
    ///   ring) on the field and on a tiny prefix of [`CALIBRATION_TINY_VALUES`]: the line
    ///   through both ([`model::call_line`]) gives each call's throughput and fixed cost.
    /// * Device-memory passes of the device reductions, same schedule: a device-to-device copy
    ///   of the field, the value-range pass over it and the in-place division kernel (the last
    ///   two need the NVRTC-compiled utility kernels; without them on every rank they stay 0,
    ///   i.e. not charged).
    /// * Solo rates (the profile's `*_solo` fields): the compression and decompression lines
    ///   (field + tiny prefix) and the pinned D2H/H2D copies at the same sizes, run by rank 0
    ///   alone while the other ranks wait in a barrier (warm-up + median, no barrier between
    ///   the calls). One rank suffices when every rank drives the same kind of GPU; all ranks
    ///   adopt rank 0's numbers (the maximum of the gathered times, 0 elsewhere).
    /// * One-way link (`link_one_way`): rank 0 sends from its pinned send buffer to rank 1's
    ///   pinned receive buffer while the other ranks idle, then 1 → 0, at
    ///   [`CALIBRATION_LINK_MIB`] (up to the field's size), [`CALIBRATION_LINK_WARMUP`] +
    ///   median of [`CALIBRATION_LINK_REPS`], a barrier before each; the slower direction and
    ///   the slower of the two ranks' clocks (the receiver's) per size.
    /// * Placement (`ranks_per_gpu`): the largest number of ranks on one host with the same
    ///   GPU PCI address (gathered from every rank; the device ordinal where the driver reports
    ///   no PCI address).
    ///
    /// Added time of the solo and one-way parts (1 GiB field, two ranks sharing an H100, v5
    /// rates): solo codec calls ≈ 0.1 s, solo copies ≈ 0.6 s (22 copies per size, ≈ 20 ms
    /// each at 1 GiB), one-way link ≈ 0.7 s (2 directions × 6 transfers per size, ≈ 45 ms
    /// each at 256 MiB): about 1.4 s on top of the shared calibration's ≈ 2 s.
    pub fn calibrate(
        &mut self,
        comm: &Communicator,
        values: usize,
        codec: CodecKind,
    ) -> Result<DeviceProfile> {
        // every rank measures the same sizes
        let mut v = [values.max(CALIBRATION_MIN_VALUES) as f64];
        comm.transport().allreduce_f64(&mut v, ReduceOp::Max)?;
        let values = v[0] as usize;
        let ranks_per_gpu = self.ranks_per_gpu(comm)?;
        let s = self.stream();
        let (codec_times, tiny) = {
            use rayon::prelude::*;
            let host: Vec<f32> = (0..values)
                .into_par_iter()
                .map(|i| {
                    let x = i as f64 * 1e-4;
                    ((x.sin() * 3.0 + (x * 7.3).cos()) * 100.0) as f32
                })
                .collect();
            let dev = s.clone_htod(&host).map_err(gpu_err("htod"))?;
            drop(host);
            let mut out = s.alloc_zeros::<f32>(values).map_err(gpu_err("alloc"))?;
            let bound = ErrorBound::Noa(1e-3);
            // one codec call on the calibration stream (the first `len` bytes of the compression
            // scratch) into the first `m` values of `out`: plain or fused decompress-and-add
            let mut decode = |me: &mut Self, len: usize, m: usize, add: bool| -> Result<()> {
                let src = me.scratch_out.take().expect("grown");
                let r = {
                    let v = src.slice(0..len);
                    let mut o = out.slice_mut(..m);
                    if add {
                        me.gpu.decompress_add_device(&v, &mut o)
                    } else {
                        me.gpu.decompress_device(&v, &mut o)
                    }
                };
                me.scratch_out = Some(src);
                r
            };
            let mut len = 0;
            let tc = Self::repeat(comm, || {
                len = self.compress_to_scratch(&dev.slice(..), bound, codec)?;
                Ok(())
            })?;
            let td = Self::repeat(comm, || decode(self, len, values, false))?;
            let tda = Self::repeat(comm, || decode(self, len, values, true))?;
            // fixed per-call cost: the same calls on a tiny buffer (the intercept of each call's
            // line, see `model::call_line`)
            let tiny = CALIBRATION_TINY_VALUES.min(values);
            let mut tlen = 0;
            let tc_tiny = Self::repeat(comm, || {
                tlen = self.compress_to_scratch(&dev.slice(..tiny), bound, codec)?;
                Ok(())
            })?;
            let td_tiny = Self::repeat(comm, || decode(self, tlen, tiny, false))?;
            let tda_tiny = Self::repeat(comm, || decode(self, tlen, tiny, true))?;
            // the same lines with rank 0 calling alone (the others wait in a barrier): what a
            // call costs when no other rank uses the GPU (the broadcast's root, a rank whose
            // upload finished after the others'; see the module docs' model section)
            let solo = comm.rank() == 0;
            let tc_solo = Self::repeat_solo(comm, solo, || {
                len = self.compress_to_scratch(&dev.slice(..), bound, codec)?;
                Ok(())
            })?;
            let td_solo = Self::repeat_solo(comm, solo, || decode(self, len, values, false))?;
            let tc_solo_tiny = Self::repeat_solo(comm, solo, || {
                tlen = self.compress_to_scratch(&dev.slice(..tiny), bound, codec)?;
                Ok(())
            })?;
            let td_solo_tiny = Self::repeat_solo(comm, solo, || decode(self, tlen, tiny, false))?;
            // device-memory passes of the device reductions: the input copy into the
            // accumulator, the value-range pass, the mean's division (by 1 here)
            let t_copy = Self::repeat(comm, || {
                s.memcpy_dtod(&dev, &mut out).map_err(gpu_err("dtod"))?;
                s.synchronize().map_err(gpu_err("sync"))
            })?;
            // the utility kernels need NVRTC: without it the device ring is not used either,
            // and their terms stay uncalibrated (0)
            // (every rank runs the timed calls or none: the repetitions hold barriers)
            let loaded = self.utils().map(|_| ());
            let mut all_ok = [f64::from(u8::from(loaded.is_ok()))];
            comm.transport().allreduce_f64(&mut all_ok, ReduceOp::Min)?;
            let loaded = match loaded {
                Ok(()) if all_ok[0] < 0.5 => Err(Error::Unavailable(
                    "another rank has no utility kernels".into(),
                )),
                r => r,
            };
            let (t_range, t_scale) = match loaded {
                Ok(()) => {
                    let u = self.utils.take().expect("loaded");
                    let r = (|| -> Result<(f64, f64)> {
                        let tr = Self::repeat(comm, || u.range(&s, &dev.slice(..)).map(|_| ()))?;
                        let ts = Self::repeat(comm, || {
                            u.scale(&s, &mut out.slice_mut(..), 1.0f32)?;
                            s.synchronize().map_err(gpu_err("sync"))
                        })?;
                        Ok((tr, ts))
                    })();
                    self.utils = Some(u);
                    r?
                }
                Err(e) => {
                    tracing::warn!(target: "zcomm::comm", "device profile: no utility kernels ({e}): range and scale passes not calibrated");
                    (0.0, 0.0)
                }
            };
            (
                vec![
                    tc,
                    td,
                    tda,
                    tc_tiny,
                    td_tiny,
                    tda_tiny,
                    t_copy,
                    t_range,
                    t_scale,
                    tc_solo,
                    td_solo,
                    tc_solo_tiny,
                    td_solo_tiny,
                ],
                tiny,
            )
        };
        let total = values * 4;
        let mut sizes: Vec<usize> = [1usize, 4, 16, 64, 256]
            .iter()
            .map(|m| m << 20)
            .filter(|&b| b < total)
            .collect();
        sizes.push(total);
        let nc = codec_times.len();
        let mut times = codec_times;
        let mut buf = s.alloc_zeros::<u8>(total).map_err(gpu_err("alloc"))?;
        for &b in &sizes {
            let (d, h) = self.time_staging(comm, &mut buf, b, false)?;
            times.extend([d, h]);
        }
        // the same copies by rank 0 alone (0 on the others: the maximum below keeps rank 0's)
        for &b in &sizes {
            let (d, h) = self.time_staging(comm, &mut buf, b, true)?;
            times.extend([d, h]);
        }
        drop(buf);
        // one-way transfers between ranks 0 and 1 from and into pinned memory, both directions
        let link_sizes: Vec<usize> = if comm.size() > 1 {
            let mut v: Vec<usize> = CALIBRATION_LINK_MIB
                .iter()
                .map(|m| m << 20)
                .filter(|&b| b <= total)
                .collect();
            if v.is_empty() {
                v.push(total);
            }
            v
        } else {
            Vec::new()
        };
        for &b in &link_sizes {
            let f = self.time_one_way(comm, 0, 1, b)?;
            let r = self.time_one_way(comm, 1, 0, b)?;
            times.extend([f, r]);
        }
        // every rank must have run the same calls (a rank without the utility kernels sent 0:
        // the maximum keeps the others' measurement)
        comm.transport().allreduce_f64(&mut times, ReduceOp::Max)?;
        let bytes = total as f64;
        let mut curve = StagingCurve::default();
        for (i, &b) in sizes.iter().enumerate() {
            curve.insert(StagingPoint {
                bytes: b as f64,
                d2h: times[nc + 2 * i],
                h2d: times[nc + 1 + 2 * i],
            });
        }
        let last = curve.points.last().copied().expect("one size at least");
        let ns = sizes.len();
        let mut curve_solo = StagingCurve::default();
        for (i, &b) in sizes.iter().enumerate() {
            curve_solo.insert(StagingPoint {
                bytes: b as f64,
                d2h: times[nc + 2 * ns + 2 * i],
                h2d: times[nc + 2 * ns + 1 + 2 * i],
            });
        }
        let mut link_one_way = LinkCurve::default();
        for (i, &b) in link_sizes.iter().enumerate() {
            let k = nc + 4 * ns + 2 * i;
            link_one_way.insert(LinkPoint {
                bytes: b as f64,
                seconds: times[k].max(times[k + 1]),
            });
        }
        let tb = (tiny * 4) as f64;
        let (compress, compress_overhead) = model::call_line(tb, times[3], bytes, times[0]);
        let (decompress, decompress_overhead) = model::call_line(tb, times[4], bytes, times[1]);
        let (decompress_add, decompress_add_overhead) =
            model::call_line(tb, times[5], bytes, times[2]);
        let (compress_solo, compress_solo_overhead) =
            model::call_line(tb, times[11], bytes, times[9]);
        let (decompress_solo, decompress_solo_overhead) =
            model::call_line(tb, times[12], bytes, times[10]);
        let rate = |t: f64| if t > 0.0 { bytes / t } else { 0.0 };
        let p = DeviceProfile {
            staging: Link {
                bandwidth: last.bytes / last.d2h.max(last.h2d).max(1e-12),
                latency: 10e-6,
            },
            compress,
            decompress,
            staging_curve: curve,
            call_overhead: compress_overhead + decompress_overhead,
            compress_overhead,
            decompress_overhead,
            decompress_add,
            decompress_add_overhead,
            // a copy moves `bytes` once (read + write)
            device_copy: rate(times[6]),
            range_pass: rate(times[7]),
            scale_pass: rate(times[8]),
            ranks_per_gpu,
            compress_solo,
            compress_solo_overhead,
            decompress_solo,
            decompress_solo_overhead,
            staging_curve_solo: curve_solo,
            link_one_way,
        };
        tracing::info!(target: "zcomm::comm", "device profile: compress {} + {:.1} us, decompress {} + {:.1} us, decompress-add {} + {:.1} us, staging {} ({} sizes), device copy {}, range {}, scale {}",
            model::fmt_rate(p.compress), p.compress_overhead * 1e6,
            model::fmt_rate(p.decompress), p.decompress_overhead * 1e6,
            model::fmt_rate(p.decompress_add), p.decompress_add_overhead * 1e6,
            model::fmt_rate(p.staging.bandwidth), p.staging_curve.points.len(),
            model::fmt_rate(p.device_copy), model::fmt_rate(p.range_pass), model::fmt_rate(p.scale_pass));
        tracing::info!(target: "zcomm::comm", "device profile, one rank alone: compress {} + {:.1} us, decompress {} + {:.1} us, staging {} sizes; one-way link {} ({} sizes); {} rank(s) per GPU",
            model::fmt_rate(p.compress_solo), p.compress_solo_overhead * 1e6,
            model::fmt_rate(p.decompress_solo), p.decompress_solo_overhead * 1e6,
            p.staging_curve_solo.points.len(),
            p.link_one_way.points.last().map_or_else(|| "-".into(), |q| model::fmt_rate(q.bytes / q.seconds)),
            p.link_one_way.points.len(), p.ranks_per_gpu);
        self.profile = Some(p.clone());
        Ok(p)
    }

    /// Measure pinned D2H/H2D copies of exactly `bytes` (every rank at once, warm-up + median,
    /// slowest rank) and add the point to the profile's staging curve (calibrating the profile
    /// first with the default size if there is none). Collective over `comm`.
    pub fn calibrate_staging(&mut self, comm: &Communicator, bytes: usize) -> Result<StagingPoint> {
        if self.profile.is_none() {
            self.calibrate(comm, CALIBRATION_MIN_VALUES, CodecKind::default())?;
        }
        let mut v = [bytes.max(1) as f64];
        comm.transport().allreduce_f64(&mut v, ReduceOp::Max)?;
        let bytes = v[0] as usize;
        let s = self.stream();
        let mut buf = s.alloc_zeros::<u8>(bytes).map_err(gpu_err("alloc"))?;
        let (d, h) = self.time_staging(comm, &mut buf, bytes, false)?;
        drop(buf);
        let mut t = [d, h];
        comm.transport().allreduce_f64(&mut t, ReduceOp::Max)?;
        let pt = StagingPoint {
            bytes: bytes as f64,
            d2h: t[0],
            h2d: t[1],
        };
        if let Some(p) = self.profile.as_mut() {
            p.staging_curve.insert(pt);
        }
        Ok(pt)
    }

    /// Warm-up calls, then the median of timed calls, a barrier before each.
    fn repeat(comm: &Communicator, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
        let mut times = Vec::with_capacity(CALIBRATION_REPS);
        for k in 0..CALIBRATION_WARMUP + CALIBRATION_REPS {
            comm.barrier()?;
            let t = now();
            f()?;
            if k >= CALIBRATION_WARMUP {
                times.push(t.elapsed().as_secs_f64());
            }
        }
        Ok(model::median(&times))
    }

    /// Like [`repeat`](Self::repeat), but only where `me` (one rank) runs the calls, without
    /// barriers between them, while the other ranks wait (a barrier before, one reduction of the
    /// error status after; they return 0). The solo rates of the profile.
    fn repeat_solo(
        comm: &Communicator,
        me: bool,
        mut f: impl FnMut() -> Result<()>,
    ) -> Result<f64> {
        comm.barrier()?;
        let r = if me {
            let mut times = Vec::with_capacity(CALIBRATION_REPS);
            let mut res = Ok(());
            for k in 0..CALIBRATION_WARMUP + CALIBRATION_REPS {
                let t = now();
                if let Err(e) = f() {
                    res = Err(e);
                    break;
                }
                if k >= CALIBRATION_WARMUP {
                    times.push(t.elapsed().as_secs_f64());
                }
            }
            res.map(|()| model::median(&times))
        } else {
            Ok(0.0)
        };
        // every rank leaves together, and fails together when the calling rank failed
        let mut failed = [f64::from(u8::from(r.is_err()))];
        comm.transport().allreduce_f64(&mut failed, ReduceOp::Max)?;
        match r {
            Ok(_) if failed[0] > 0.5 => Err(Error::Comm(
                "device calibration: the solo calls failed on another rank".into(),
            )),
            r => r,
        }
    }

    /// Median seconds of a one-way transfer of `bytes` from rank `from`'s pinned send buffer
    /// into rank `to`'s pinned receive buffer (a barrier before each, the other ranks idle in
    /// it; [`CALIBRATION_LINK_WARMUP`] + [`CALIBRATION_LINK_REPS`] transfers): each of the two
    /// returns its own median (the receiver's is the complete transfer), the others 0.
    fn time_one_way(
        &mut self,
        comm: &Communicator,
        from: usize,
        to: usize,
        bytes: usize,
    ) -> Result<f64> {
        let s = self.stream();
        let r = comm.rank();
        Self::grow_pinned(&mut self.pinned_send, &s, bytes)?;
        Self::grow_pinned(&mut self.pinned_recv, &s, bytes)?;
        let snd = self.pinned_send.as_ref().expect("grown");
        let snd = &snd.as_slice().map_err(gpu_err("pinned"))?[..bytes];
        let rcv = self.pinned_recv.as_mut().expect("grown");
        let rcv = &mut rcv.as_mut_slice().map_err(gpu_err("pinned"))?[..bytes];
        let t = comm.transport();
        let mut times = Vec::with_capacity(CALIBRATION_LINK_REPS);
        for k in 0..CALIBRATION_LINK_WARMUP + CALIBRATION_LINK_REPS {
            comm.barrier()?;
            let t0 = now();
            if r == from {
                t.send(to, super::TAG_PING, snd)?;
            } else if r == to {
                if let Some(v) = t.recv_into(from, super::TAG_PING, rcv)? {
                    return Err(Error::Comm(format!(
                        "link calibration: expected {bytes} bytes from rank {from}, got {}",
                        v.len()
                    )));
                }
            }
            if k >= CALIBRATION_LINK_WARMUP {
                times.push(t0.elapsed().as_secs_f64());
            }
        }
        Ok(if r == from || r == to {
            model::median(&times)
        } else {
            0.0
        })
    }

    /// The most ranks sharing one GPU: every rank's (host name, PCI domain / bus / device id of
    /// its GPU) gathered, the largest group of equal records (the device ordinal stands in for
    /// the PCI address where the driver does not report it). Collective.
    fn ranks_per_gpu(&self, comm: &Communicator) -> Result<usize> {
        use cudarc::driver::sys::CUdevice_attribute as A;
        let ctx = self.gpu.context();
        let attr = |a: A| ctx.attribute(a).ok();
        let pci = match (
            attr(A::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID),
            attr(A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID),
            attr(A::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID),
        ) {
            (Some(d), Some(b), Some(v)) => [d, b, v],
            _ => [-1, -1, ctx.ordinal() as i32],
        };
        // FNV-1a of the host name
        let host = super::hostname()
            .bytes()
            .fold(0xcbf29ce484222325u64, |h, c| {
                (h ^ u64::from(c)).wrapping_mul(0x100000001b3)
            });
        let mut mine = host.to_le_bytes().to_vec();
        for x in pci {
            mine.extend(x.to_le_bytes());
        }
        let all = comm.transport().allgather_fixed(&mine)?;
        Ok(all
            .chunks(mine.len())
            .map(|a| all.chunks(mine.len()).filter(|b| a == *b).count())
            .max()
            .unwrap_or(1)
            .max(1))
    }

    /// Median D2H and H2D seconds of `bytes` between `buf` and the pinned send buffer, copied
    /// by every rank at once, or with `solo` by rank 0 alone (0 on the other ranks).
    fn time_staging(
        &mut self,
        comm: &Communicator,
        buf: &mut CudaSlice<u8>,
        bytes: usize,
        solo: bool,
    ) -> Result<(f64, f64)> {
        let s = self.stream();
        Self::grow_pinned(&mut self.pinned_send, &s, bytes)?;
        let pinned = self.pinned_send.as_mut().expect("grown");
        let pinned = pinned.as_mut_slice().map_err(gpu_err("pinned"))?;
        let me = comm.rank() == 0;
        let timed = |f: &mut dyn FnMut() -> Result<()>| {
            if solo {
                Self::repeat_solo(comm, me, f)
            } else {
                Self::repeat(comm, f)
            }
        };
        let td = timed(&mut || {
            let (p, _g) = buf.device_ptr(&s);
            Self::d2h(&s, p, &mut pinned[..bytes])
        })?;
        let th = timed(&mut || {
            let (p, _g) = buf.device_ptr_mut(&s);
            Self::h2d(&s, &pinned[..bytes], p)
        })?;
        Ok((td, th))
    }
}

/// Smallest calibration field of [`DeviceStager::calibrate`] (16 Mi f32 = 64 MiB).
pub const CALIBRATION_MIN_VALUES: usize = 1 << 24;
/// Values of the tiny buffer whose codec calls measure [`DeviceProfile::call_overhead`]
/// (64 Ki f32 = 256 KiB).
pub const CALIBRATION_TINY_VALUES: usize = 1 << 16;
/// Warm-up calls before each calibrated quantity.
pub const CALIBRATION_WARMUP: usize = 2;
/// Timed repetitions (median) of each calibrated quantity.
pub const CALIBRATION_REPS: usize = 9;
/// Sizes (MiB) of the one-way link calibration (those up to the calibration field's size; the
/// field's size alone when it is smaller than all of them).
pub const CALIBRATION_LINK_MIB: [usize; 4] = [1, 16, 64, 256];
/// Warm-up transfers of each one-way link size and direction.
pub const CALIBRATION_LINK_WARMUP: usize = 1;
/// Timed one-way transfers (median) of each size and direction.
pub const CALIBRATION_LINK_REPS: usize = 5;

impl Communicator {
    /// Staged pairwise exchange of device buffers (see the [module docs](self)): send `send` to
    /// `dest`, receive `recv.len()` values from `src` into `recv`. Raw path: D2H, MPI, H2D.
    /// Compressed path: GPU compress, D2H of the stream, MPI, H2D, GPU decompress. Mismatches
    /// fail on both ends, as for [`Communicator::sendrecv`].
    #[allow(clippy::too_many_arguments)]
    pub fn sendrecv_device<T: GpuElement + Real>(
        &mut self,
        dev: &mut DeviceStager,
        send: &CudaView<'_, T>,
        dest: usize,
        recv: &mut CudaViewMut<'_, T>,
        src: usize,
        tag: i32,
    ) -> Result<OpStats> {
        Self::check_tag(tag)?;
        let t0 = self.wtime();
        let n = send.len();
        let bytes = n * T::SIZE;
        let bound = self.config.bound;
        let codec = self.config.policy.codec().unwrap_or_default();
        let dp = dev.profile.clone().unwrap_or_else(DeviceProfile::guess);
        let est = self.ratios.get(OP_SENDRECV | 0x80, tag as i64);
        let link = self.profile.link;
        let sc = |ratio: f64, k: usize| dp.scenario(link, bytes as f64, ratio, k);
        let sc1 = sc(est.unwrap_or(1.0), 1);
        let pr = model::predict(&sc1);
        let compress = match self.config.policy {
            Policy::Never => false,
            Policy::Always(_) => true,
            // never when even an infinite ratio cannot pay; without an estimate yet, compress
            // once to learn the ratio
            Policy::Auto(_) => {
                let best = model::predict(&sc(f64::INFINITY, 1));
                best.compressed_serial < crate::model::choice::HYSTERESIS * best.raw_serial
                    && (est.is_none()
                        || pr.compressed_serial < crate::model::choice::HYSTERESIS * pr.raw_serial)
            }
        } && n > 0;
        let mut st = OpStats::raw(OP_SENDRECV);
        st.bytes = bytes as u64;
        st.ratio_estimate = est.unwrap_or(1.0);
        st.predicted_raw_s = pr.raw_serial;
        st.predicted_compressed_s = pr.compressed_serial;
        dev.last = StageTimes::default();
        let s = dev.stream();
        let expect = Desc {
            count: recv.len() as u64,
            dtype: elem_tag::<T>(),
            ..self.local_desc::<f32>(OP_SENDRECV, 0)
        };
        let mut d = Desc {
            dtype: elem_tag::<T>(),
            ..self.local_desc::<f32>(OP_SENDRECV, n)
        };
        let len;
        let chunk_dev = super::pipeline::chunk_scalars(self.config.chunk_bytes, T::SIZE, 1);
        // Pipeline only where the model (per-chunk codec overhead included) predicts it faster
        // than the whole message, with a known ratio (the first call goes whole and learns it).
        // Each side decides for its own outgoing message; the descriptor tells the peer.
        // `ZCOMM_DEVICE_PIPELINE=always|never` overrides the model (measurements).
        let chunk_dev = if compress && bytes > self.config.pipeline_min_bytes && n > chunk_dev {
            let k = super::pipeline::chunk_count(n, chunk_dev);
            let pays = match std::env::var("ZCOMM_DEVICE_PIPELINE").as_deref() {
                Ok("always") => true,
                Ok("never") => false,
                _ => est.is_some_and(|r| dp.pipeline_pays(link, bytes as f64, r, k)),
            };
            if pays {
                chunk_dev
            } else {
                0
            }
        } else {
            0
        };
        if chunk_dev > 0 {
            // compressed chunk by chunk inside the pipeline
            st.decision = Decision::Compressed;
            st.codec = Some(codec);
            st.bound = match bound {
                ErrorBound::Abs(e) | ErrorBound::Rel(e) => e,
                // per chunk E·(chunk range), from the chunk headers (filled in below)
                ErrorBound::Noa(_) => 0.0,
            };
            d.decision = 1;
            len = 0;
            // every chunk's stream fits: no pinned (re)allocation inside the pipeline (a failure
            // here is not fatal: the chunk's encode grows it again and reports through the
            // schedule, so both ranks still match their messages)
            let _ = DeviceStager::grow_pinned(
                &mut dev.pinned_send,
                &s,
                crate::compress_bound(chunk_dev, T::DTYPE),
            );
        } else if compress {
            let t = now();
            len = dev.compress_to_scratch(send, bound, codec)?;
            dev.last.compress = t.elapsed().as_secs_f64();
            DeviceStager::grow_pinned(&mut dev.pinned_send, &s, len)?;
            let t = now();
            {
                let src_buf = dev.scratch_out.as_ref().expect("grown");
                let (p, _g) = src_buf.device_ptr(&s);
                let pin = dev
                    .pinned_send
                    .as_mut()
                    .expect("grown")
                    .as_mut_slice()
                    .map_err(gpu_err("pinned"))?;
                DeviceStager::d2h(&s, p, &mut pin[..len])?;
            }
            dev.last.d2h = t.elapsed().as_secs_f64();
            st.decision = Decision::Compressed;
            st.codec = Some(codec);
            st.wire_bytes = len as u64;
            st.ratio = bytes as f64 / len.max(1) as f64;
            st.bound = match bound {
                ErrorBound::Abs(e) | ErrorBound::Rel(e) => e,
                ErrorBound::Noa(e) => {
                    let h = crate::inspect(
                        &dev.pinned_send
                            .as_ref()
                            .expect("grown")
                            .as_slice()
                            .map_err(gpu_err("pinned"))?[..len],
                    )?;
                    e * (h.range_max - h.range_min)
                }
            };
            self.ratios.put(OP_SENDRECV | 0x80, tag as i64, st.ratio);
            d.decision = 1;
        } else {
            DeviceStager::grow_pinned(&mut dev.pinned_send, &s, bytes)?;
            let t = now();
            {
                let (p, _g) = send.device_ptr(&s);
                let pin = dev
                    .pinned_send
                    .as_mut()
                    .expect("grown")
                    .as_mut_slice()
                    .map_err(gpu_err("pinned"))?;
                DeviceStager::d2h(&s, p, &mut pin[..bytes])?;
            }
            dev.last.d2h = t.elapsed().as_secs_f64();
            len = bytes;
            st.wire_bytes = bytes as u64;
        }
        d.payload = len as u64;
        d.ratio = st.ratio;
        // network: the incoming payload (raw or compressed) lands in pinned memory
        let rbytes = recv.len() * T::SIZE;
        let cap = crate::compress_bound(recv.len(), T::DTYPE);
        DeviceStager::grow_pinned(&mut dev.pinned_recv, &s, cap)?;
        let theirs = self.transport().sendrecv(
            dest,
            &{
                let mut dd = d;
                if chunk_dev > 0 {
                    dd.chunk = chunk_dev as u64;
                    dd.payload = 0;
                }
                dd
            }
            .to_bytes(),
            src,
            super::TAG_DESC + tag,
        )?;
        let sd0 = Desc::parse(&theirs)?;
        if chunk_dev > 0 || sd0.chunk > 0 {
            let t = now();
            let r = self.sendrecv_device_chunked(
                dev,
                DevOut {
                    send,
                    chunk: chunk_dev,
                    bound,
                    codec,
                    len,
                },
                d,
                sd0,
                recv,
                dest,
                &expect,
                src,
                tag,
            );
            dev.last.network = t.elapsed().as_secs_f64();
            let (sent, chunks, noa_bound) = r?;
            if matches!(bound, ErrorBound::Noa(_)) && chunk_dev > 0 {
                st.bound = noa_bound;
            }
            if chunk_dev > 0 {
                st.wire_bytes = sent as u64;
                st.ratio = bytes as f64 / sent.max(1) as f64;
                self.ratios.put(OP_SENDRECV | 0x80, tag as i64, st.ratio);
            }
            self.chunks += chunks;
            st.predicted_s = if chunk_dev > 0 {
                // the model's pipelined form with this chunk count
                let k = super::pipeline::chunk_count(n, chunk_dev);
                let ratio = st.ratio.max(1e-9);
                let pk = model::predict(&sc(ratio, k));
                st.predicted_compressed_s = pk.compressed_pipelined;
                // the stages' serial sums over the k chunks (the pipeline overlaps them)
                let c = dp.sendrecv_terms(link, bytes as f64 / k as f64, ratio).1;
                dev.last_predicted = c.times(k as f64);
                pk.compressed_pipelined
            } else if compress {
                pr.compressed_serial
            } else {
                pr.raw_serial
            };
            return Ok(self.finish(st, t0));
        }
        let t = now();
        let (sd, n) = {
            let pin_s = dev
                .pinned_send
                .as_ref()
                .expect("grown")
                .as_slice()
                .map_err(gpu_err("pinned"))?;
            let pin_r = dev
                .pinned_recv
                .as_mut()
                .expect("grown")
                .as_mut_slice()
                .map_err(gpu_err("pinned"))?;
            self.exchange_into_after(
                &d,
                &sd0,
                &pin_s[..len],
                dest,
                &expect,
                src,
                tag,
                &mut pin_r[..cap],
            )?
        };
        dev.last.network = t.elapsed().as_secs_f64();
        let pin = dev
            .pinned_recv
            .as_ref()
            .expect("grown")
            .as_slice()
            .map_err(gpu_err("pinned"))?;
        if sd.decision == 1 {
            dev_upload(dev, n, recv)?;
        } else {
            if n != rbytes {
                return Err(Error::Comm("raw device payload of unexpected size".into()));
            }
            let t = now();
            let (p, _g) = recv.device_ptr_mut(&s);
            DeviceStager::h2d(&s, &pin[..rbytes], p)?;
            dev.last.h2d = t.elapsed().as_secs_f64();
        }
        let ratio_for_model = if compress {
            st.ratio
        } else {
            est.unwrap_or(1.0)
        };
        let pr = model::predict(&sc(ratio_for_model, 1));
        st.predicted_raw_s = pr.raw_serial;
        st.predicted_compressed_s = pr.compressed_serial;
        st.predicted_s = if compress {
            pr.compressed_serial
        } else {
            pr.raw_serial
        };
        let (tr, tc) = dp.sendrecv_terms(link, bytes as f64, ratio_for_model);
        dev.last_predicted = if compress { tc } else { tr };
        tracing::debug!(target: "zcomm::comm", stages = ?dev.last, predicted = ?dev.last_predicted, "sendrecv_device");
        Ok(self.finish(st, t0))
    }
}

/// Upload the first `n` bytes of the pinned receive buffer and decompress them into `out`.
fn dev_upload<T: GpuElement>(
    dev: &mut DeviceStager,
    n: usize,
    out: &mut CudaViewMut<'_, T>,
) -> Result<()> {
    let pinned = dev.pinned_recv.take().expect("grown");
    let r = pinned
        .as_slice()
        .map_err(gpu_err("pinned"))
        .and_then(|b| dev.upload_and_decompress(&b[..n], out));
    dev.pinned_recv = Some(pinned);
    r
}

impl Communicator {
    /// The sendrecv protocol (after the descriptor swap, `sd` is the peer's descriptor)
    /// receiving any payload into `buf[..n]` (returns the sender's descriptor and `n`). A payload
    /// larger than `buf` is drained and reported as an error.
    #[allow(clippy::too_many_arguments)]
    fn exchange_into_after(
        &self,
        d: &Desc,
        sd: &Desc,
        payload: &[u8],
        dest: usize,
        expect: &Desc,
        src: usize,
        tag: i32,
        buf: &mut [u8],
    ) -> Result<(Desc, usize)> {
        let t = self.transport();
        let sd = *sd;
        let n = usize::try_from(sd.payload)
            .map_err(|_| Error::Comm(format!("peer announced a {}-byte payload", sd.payload)))?;
        let fits = n <= buf.len();
        if fits {
            t.sendrecv_sized(dest, payload, src, &mut buf[..n], tag)?;
        } else {
            let mut v = vec![0u8; n];
            t.sendrecv_sized(dest, payload, src, &mut v, tag)?;
        }
        let verdict = t.sendrecv(src, &expect.to_bytes(), dest, super::TAG_VERDICT + tag)?;
        super::check_pair(&sd, expect)?;
        super::check_pair(d, &Desc::parse(&verdict)?)?;
        if !fits {
            return Err(Error::Comm(format!(
                "{n}-byte payload exceeds the receive buffer"
            )));
        }
        Ok((sd, n))
    }

    /// The pipelined device exchange (either side chunked): chunk schedule of
    /// `comm::pipeline` with a [`DeviceChunks`] codec, then the verdicts. Returns the bytes sent,
    /// the chunks moved and (noa) the largest per-chunk absolute bound sent.
    #[allow(clippy::too_many_arguments)]
    fn sendrecv_device_chunked<T: GpuElement + Real>(
        &mut self,
        dev: &mut DeviceStager,
        out: DevOut<'_, '_, T>,
        d: Desc,
        sd: Desc,
        recv: &mut CudaViewMut<'_, T>,
        dest: usize,
        expect: &Desc,
        src: usize,
        tag: i32,
    ) -> Result<(usize, u64, f64)> {
        use super::pipeline::{chunk_count, exchange_chunks};
        let pair = super::check_pair(&sd, expect);
        let nrecv = if sd.chunk > 0 {
            let chunk =
                usize::try_from(sd.chunk).map_err(|_| Error::Comm("bad chunk length".into()))?;
            let total = usize::try_from(sd.count)
                .map_err(|_| Error::Comm(format!("peer announced {} values", sd.count)))?;
            if pair.is_ok() {
                // the upload scratch fits every incoming chunk: no device (re)allocation (whose
                // free synchronizes the device) inside the pipeline; a failure is reported by the
                // chunk's decode instead (never return before the schedule: the peer is in it)
                let s = dev.stream();
                let _ = DeviceStager::grow_dev(
                    &mut dev.scratch_in,
                    &s,
                    crate::compress_bound(chunk.min(total), T::DTYPE),
                );
            }
            chunk_count(total, chunk)
        } else {
            1
        };
        let nsend = if out.chunk > 0 {
            chunk_count(out.send.len(), out.chunk)
        } else {
            1
        };
        let mut dc = DeviceChunks {
            dev,
            out,
            recv: pair.is_ok().then_some(recv),
            peer: sd,
            noa_bound: 0.0,
        };
        let (sent, r) = exchange_chunks(&*self.transport, &mut dc, dest, nsend, src, nrecv, tag)?;
        let noa_bound = dc.noa_bound;
        let verdict =
            self.transport
                .sendrecv(src, &expect.to_bytes(), dest, super::TAG_VERDICT + tag)?;
        pair?;
        super::check_pair(&d, &Desc::parse(&verdict)?)?;
        r?;
        let moved = if d.chunk > 0 { nsend as u64 } else { 0 }
            + if sd.chunk > 0 { nrecv as u64 } else { 0 };
        Ok((sent, moved, noa_bound))
    }
}

/// What the device side sends: chunked (`chunk > 0`, compressed on the GPU per chunk), or the
/// already staged whole payload (`len` bytes in the stager's pinned send buffer).
struct DevOut<'a, 'b, T> {
    send: &'a CudaView<'b, T>,
    chunk: usize,
    bound: ErrorBound,
    codec: CodecKind,
    len: usize,
}

/// The device [`ChunkCodec`](super::pipeline::ChunkCodec): a thin composition of the stager's
/// tested pieces (GPU compression into scratch, D2H into pinned memory; H2D + GPU
/// decompression).
struct DeviceChunks<'a, 'b, 'c, T> {
    dev: &'a mut DeviceStager,
    out: DevOut<'a, 'b, T>,
    /// `None`: a mismatch is known, drain and discard.
    recv: Option<&'a mut CudaViewMut<'c, T>>,
    peer: Desc,
    noa_bound: f64,
}

impl<T: GpuElement + Real> super::pipeline::ChunkCodec for DeviceChunks<'_, '_, '_, T> {
    fn encode(&mut self, k: usize) -> Result<Vec<u8>> {
        let dev = &mut *self.dev;
        let s = dev.stream();
        if self.out.chunk == 0 {
            // the whole payload, staged before the exchange
            let pin = dev
                .pinned_send
                .as_ref()
                .ok_or_else(|| Error::Comm("nothing staged".into()))?
                .as_slice()
                .map_err(gpu_err("pinned"))?;
            return Ok(pin[..self.out.len].to_vec());
        }
        let r = super::pipeline::chunk_range(self.out.send.len(), self.out.chunk, k);
        let view = self.out.send.slice(r);
        let t = now();
        let len = dev.compress_to_scratch(&view, self.out.bound, self.out.codec)?;
        dev.last.compress += t.elapsed().as_secs_f64();
        DeviceStager::grow_pinned(&mut dev.pinned_send, &s, len)?;
        let t = now();
        let src_buf = dev.scratch_out.as_ref().expect("grown");
        let (p, _g) = src_buf.device_ptr(&s);
        let pin = dev
            .pinned_send
            .as_mut()
            .expect("grown")
            .as_mut_slice()
            .map_err(gpu_err("pinned"))?;
        DeviceStager::d2h(&s, p, &mut pin[..len])?;
        dev.last.d2h += t.elapsed().as_secs_f64();
        if let ErrorBound::Noa(e) = self.out.bound {
            let h = crate::inspect(&pin[..len])?;
            self.noa_bound = self.noa_bound.max(e * (h.range_max - h.range_min));
        }
        Ok(pin[..len].to_vec())
    }

    fn decode(&mut self, k: usize, bytes: Vec<u8>) -> Result<()> {
        let Some(recv) = self.recv.as_mut() else {
            return Ok(());
        };
        let dev = &mut *self.dev;
        if self.peer.chunk == 0 {
            if self.peer.decision == 1 {
                return dev.upload_and_decompress(&bytes, recv);
            }
            if bytes.len() != recv.len() * T::SIZE {
                return Err(Error::Comm("raw device payload of unexpected size".into()));
            }
            let s = dev.stream();
            let t = now();
            let (p, _g) = recv.device_ptr_mut(&s);
            DeviceStager::h2d(&s, &bytes, p)?;
            dev.last.h2d += t.elapsed().as_secs_f64();
            return Ok(());
        }
        let chunk = self.peer.chunk as usize;
        let r = super::pipeline::chunk_range(recv.len(), chunk, k);
        let mut view = recv.slice_mut(r);
        let h2d = dev.last.h2d;
        let dec = dev.last.decompress;
        let res = dev.upload_and_decompress(&bytes, &mut view);
        // upload_and_decompress overwrites the stage times: accumulate over the chunks
        dev.last.h2d += h2d;
        dev.last.decompress += dec;
        res
    }
}

fn elem_tag<T: Real>() -> u8 {
    match T::DTYPE {
        Dtype::F32 => 1,
        Dtype::F64 => 2,
    }
}

/// A device allgather after its local staging and agreement (this rank's record is the first
/// `mine_len` bytes of the stager's pinned send buffer).
struct GatherPrep {
    compressed: bool,
    n: usize,
    mine_len: usize,
    lens: Vec<usize>,
    st: OpStats,
    t0: f64,
}

/// Tag of the pairwise exchanges of [`gather_pinned`].
const TAG_GATHER: i32 = 32002;

/// The blocking allgather of the records between the stager's pinned buffers (`ps`: this
/// rank's record, `pr`: every record, `total` bytes; this rank's range of `pr` is not written:
/// callers read their own record from `ps`). `p-1` pairwise exchanges of known sizes (step `s`:
/// send to `r+s`, receive from `r-s`) straight into the pinned buffer, not `MPI_Allgatherv`,
/// which also copies this rank's record into its place in the receive buffer (a host memcpy of
/// the whole stream per call, outside the link's time).
fn gather_pinned(
    t: &dyn super::transport::Transport,
    ps: &Option<PinnedHostSlice<u8>>,
    pr: &mut Option<PinnedHostSlice<u8>>,
    mine_len: usize,
    lens: &[usize],
    total: usize,
) -> Result<()> {
    let mine: &[u8] = match ps {
        Some(b) => &b.as_slice().map_err(gpu_err("pinned"))?[..mine_len],
        None => &[],
    };
    let out: &mut [u8] = match pr {
        Some(b) => &mut b.as_mut_slice().map_err(gpu_err("pinned"))?[..total],
        None => &mut [],
    };
    let (p, r) = (t.size(), t.rank());
    if lens.len() != p || lens[r] != mine.len() || lens.iter().sum::<usize>() != out.len() {
        return Err(Error::invalid(
            "device allgather: lengths disagree with the records or the output",
        ));
    }
    let mut offs = Vec::with_capacity(p);
    let mut off = 0;
    for &l in lens {
        offs.push(off);
        off += l;
    }
    for s in 1..p {
        let (dest, src) = ((r + s) % p, (r + p - s) % p);
        let dst = &mut out[offs[src]..offs[src] + lens[src]];
        t.sendrecv_sized(dest, mine, src, dst, TAG_GATHER)?;
    }
    Ok(())
}

/// A pending [`Communicator::iallgather_device`]: the compressed (or raw) streams are in flight
/// (`MPI_Iallgatherv` from the stager's pinned send buffer into its pinned receive buffer, both
/// lent to the request); [`Communicator::wait_allgather_device`] uploads and decompresses them
/// and hands the buffers back to the stager.
pub struct DeviceAllgatherRequest {
    pending: Box<dyn PendingBuf>,
    compressed: bool,
    n: usize,
    mine_len: usize,
    lens: Vec<usize>,
    st: OpStats,
    t0: f64,
}

impl DeviceAllgatherRequest {
    /// Whether the transfer has completed (never blocks).
    pub fn test(&mut self) -> Result<bool> {
        self.pending.test()
    }
}

impl std::fmt::Debug for DeviceAllgatherRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceAllgatherRequest({} values per rank)", self.n)
    }
}

/// A device broadcast after the root's staging and the agreement (the root's stream is the
/// first `len` bytes of its stager's pinned send buffer).
struct BcastPrep {
    compressed: bool,
    n: usize,
    len: usize,
    st: OpStats,
    t0: f64,
}

/// A pending [`Communicator::ibcast_device`]: the root's stream is in flight (`MPI_Ibcast`
/// straight from the root's pinned send buffer into the other ranks' pinned receive buffers,
/// lent to the request); [`Communicator::wait_bcast_device`] uploads and decompresses it on
/// every rank and hands the buffer back to the stager.
pub struct DeviceBcastRequest {
    pending: Box<dyn PendingBuf>,
    compressed: bool,
    n: usize,
    len: usize,
    /// The lent buffer is the stager's send buffer (the root) or its receive buffer.
    from_send: bool,
    st: OpStats,
    t0: f64,
}

impl DeviceBcastRequest {
    /// Whether the transfer has completed (never blocks).
    pub fn test(&mut self) -> Result<bool> {
        self.pending.test()
    }
}

impl std::fmt::Debug for DeviceBcastRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceBcastRequest({} values)", self.n)
    }
}

/// A pending non-blocking device reduction or exchange run on the progress thread
/// ([`Communicator::iallreduce_device`], [`Communicator::iallreduce_mean_device`],
/// [`Communicator::ireduce_scatter_device`], [`Communicator::isendrecv_device`]): the input was
/// staged to the host when the call returned; finish with [`Communicator::wait_device`], which
/// copies the result to the device.
pub struct DeviceRequest<T> {
    inner: OpRequest<Vec<T>>,
    in_bytes: usize,
    t0: f64,
    d2h: f64,
}

impl<T> DeviceRequest<T> {
    /// Whether the operation has completed (never blocks).
    pub fn test(&mut self) -> Result<bool> {
        self.inner.test()
    }
}

impl<T> std::fmt::Debug for DeviceRequest<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceRequest({:?})", self.inner)
    }
}

/// Which host reduction a device reduction runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reduction {
    Sum,
    Mean,
    Scatter,
}

impl Reduction {
    fn op(self) -> u8 {
        match self {
            Reduction::Sum => super::OP_ALLREDUCE,
            Reduction::Mean => super::OP_ALLREDUCE_MEAN,
            Reduction::Scatter => super::OP_REDUCE_SCATTER,
        }
    }
}

/// The noa bound of a staged stream (its header's range), else the bound's value.
fn stream_bound(bound: ErrorBound, stream: &[u8]) -> Result<f64> {
    Ok(match bound {
        ErrorBound::Abs(e) | ErrorBound::Rel(e) => e,
        ErrorBound::Noa(e) => {
            let h = crate::inspect(stream)?;
            e * (h.range_max - h.range_min)
        }
    })
}

/// Pinned host bytes as values (little-endian host checked by the caller). Pinned allocations
/// are page-aligned and the callers slice them from offset 0 in whole values.
fn pinned_values<T: Real>(b: &[u8]) -> &[T] {
    // SAFETY: T is f32 or f64 (`Real`): plain data, every bit pattern valid.
    let (pre, v, post) = unsafe { b.align_to::<T>() };
    assert!(pre.is_empty() && post.is_empty(), "pinned buffer alignment");
    v
}

/// Mutable [`pinned_values`].
fn pinned_values_mut<T: Real>(b: &mut [u8]) -> &mut [T] {
    // SAFETY: as in `pinned_values`.
    let (pre, v, post) = unsafe { b.align_to_mut::<T>() };
    assert!(pre.is_empty() && post.is_empty(), "pinned buffer alignment");
    v
}

/// D2H of a device buffer into a host vector (the raw staging of the composed operations).
fn stage_values<T: GpuElement + Real>(
    dev: &mut DeviceStager,
    input: &CudaView<'_, T>,
) -> Result<Vec<T>> {
    let mut host = vec![T::default(); input.len()];
    match super::element::scalar_bytes_mut(&mut host) {
        Some(b) => dev.copy_to_host(input, b)?,
        None => {
            return Err(Error::Unavailable(
                "device staging needs a little-endian host".into(),
            ))
        }
    }
    Ok(host)
}

impl Communicator {
    /// Allgather of device buffers (see the [module docs](self)): `out.len() == size *
    /// send.len()`, rank order; every rank ends with identical values. Collective.
    pub fn allgather_device<T: GpuElement + Real + super::CommElement>(
        &mut self,
        dev: &mut DeviceStager,
        send: &CudaView<'_, T>,
        out: &mut CudaViewMut<'_, T>,
    ) -> Result<OpStats> {
        let (p, n) = (self.size(), send.len());
        let local = if out.len() != n * p {
            Err(Error::invalid(format!(
                "allgather_device: output has {} values, expected {p} x {n}",
                out.len()
            )))
        } else {
            Ok(())
        };
        let prep = self.allgather_device_prepare(dev, send, local)?;
        let GatherPrep {
            compressed,
            n,
            mine_len,
            lens,
            st,
            t0,
        } = prep;
        // the records land in the stager's pinned receive buffer (grown once, then reused; this
        // rank's own record stays in the pinned send buffer)
        let total: usize = lens.iter().sum();
        let t = now();
        let s = dev.stream();
        DeviceStager::grow_pinned(&mut dev.pinned_recv, &s, total)?;
        let (ps, mut pr) = (dev.pinned_send.take(), dev.pinned_recv.take());
        let r = gather_pinned(self.transport(), &ps, &mut pr, mine_len, &lens, total);
        dev.pinned_send = ps;
        dev.pinned_recv = pr;
        r?;
        dev.last.network = t.elapsed().as_secs_f64();
        dev.last.h2d = 0.0;
        dev.last.decompress = 0.0;
        let (me, mut off) = (self.rank(), 0);
        for (k, &l) in lens.iter().enumerate() {
            let mut view = out.slice_mut(k * n..(k + 1) * n);
            if k == me {
                dev.upload_pinned(true, 0..mine_len, &mut view, compressed)?;
            } else {
                dev.upload_pinned(false, off..off + l, &mut view, compressed)?;
            }
            off += l;
        }
        Ok(self.finish(st, t0))
    }

    /// Non-blocking [`allgather_device`](Self::allgather_device): GPU compression and the D2H
    /// of the stream happen now, the agreement too; the transfer (`MPI_Iallgatherv`) is started
    /// and the call returns. Finish with [`wait_allgather_device`](Self::wait_allgather_device).
    /// Collective.
    pub fn iallgather_device<T: GpuElement + Real + super::CommElement>(
        &mut self,
        dev: &mut DeviceStager,
        send: &CudaView<'_, T>,
    ) -> Result<DeviceAllgatherRequest> {
        let GatherPrep {
            compressed,
            n,
            mine_len,
            lens,
            st,
            t0,
        } = self.allgather_device_prepare(dev, send, Ok(()))?;
        // the transfer borrows the stager's pinned buffers (this rank's record in the send
        // buffer, the receive buffer grown once, then reused) until the wait hands them back:
        // no per-call allocation, no copy of the streams
        let total: usize = lens.iter().sum();
        let mine = dev.lend_pinned(true, mine_len);
        let out = dev.lend_pinned(false, total);
        let pending = self.transport().iallgatherv_into(mine, &lens, out)?;
        Ok(DeviceAllgatherRequest {
            pending,
            compressed,
            n,
            mine_len,
            lens,
            st,
            t0,
        })
    }

    /// The part of the device allgather before the transfer: GPU compression (or not) and the
    /// D2H of this rank's record into the stager's pinned send buffer, the agreement, the
    /// record lengths and the model's predictions.
    fn allgather_device_prepare<T: GpuElement + Real + super::CommElement>(
        &mut self,
        dev: &mut DeviceStager,
        send: &CudaView<'_, T>,
        local: Result<()>,
    ) -> Result<GatherPrep> {
        let t0 = self.wtime();
        let (p, n) = (self.size(), send.len());
        let bound = self.config.bound;
        let codec = self.config.policy.codec().unwrap_or_default();
        // Auto compresses like Always: every rank must take the same path and the ratio is only
        // known after compressing (the descriptor table checks the shared policy)
        let compress = !matches!(self.config.policy, Policy::Never) && n > 0;
        let mut st = OpStats::raw(super::OP_ALLGATHER);
        st.bytes = (n * T::SIZE) as u64;
        dev.last = StageTimes::default();
        // stage before the agreement, so a device failure on one rank fails every rank
        // (into the stager's pinned send buffer: no per-call host allocation, no copy)
        let staged: Result<usize> = local.and_then(|()| {
            if compress {
                let len = dev.compress_timed(send, bound, codec)?;
                dev.scratch_to_pinned_send(len)?;
                st.decision = Decision::Compressed;
                st.codec = Some(codec);
                st.bound = stream_bound(bound, dev.pinned_bytes(true, len)?)?;
                Ok(len)
            } else {
                dev.values_to_pinned_send(send)
            }
        });
        let d = Desc {
            dtype: elem_tag::<T>(),
            decision: u8::from(compress),
            ..self.local_desc::<f32>(super::OP_ALLGATHER, n)
        };
        let (mine_len, local) = match staged {
            Ok(l) => (l, Ok(())),
            Err(e) => (0, Err(e)),
        };
        self.agree(d, local)?;
        st.wire_bytes = mine_len as u64;
        st.ratio = st.bytes as f64 / mine_len.max(1) as f64;
        let lens = if compress {
            self.transport().allgather_lens(mine_len)?
        } else {
            vec![n * T::SIZE; p]
        };
        let dp = dev.profile.clone().unwrap_or_else(DeviceProfile::guess);
        let ratio = if compress { st.ratio } else { 1.0 };
        let terms = dp.allgather_terms(self.profile.link, p, st.bytes as f64, ratio);
        dev.last_predicted = record_prediction(&mut st, terms, compress);
        Ok(GatherPrep {
            compressed: compress,
            n,
            mine_len,
            lens,
            st,
            t0,
        })
    }

    /// Complete a non-blocking device allgather into `out` (`size * count` values): H2D of
    /// every rank's stream and GPU decompression into its slice.
    pub fn wait_allgather_device<T: GpuElement + Real>(
        &mut self,
        dev: &mut DeviceStager,
        req: DeviceAllgatherRequest,
        out: &mut CudaViewMut<'_, T>,
    ) -> Result<OpStats> {
        let DeviceAllgatherRequest {
            pending,
            compressed,
            n,
            mine_len,
            lens,
            st,
            t0,
        } = req;
        let t = now();
        let mut bufs = pending.wait()?.into_iter();
        dev.last.network = t.elapsed().as_secs_f64();
        let (Some(mut mine), Some(mut recv)) = (bufs.next(), bufs.next()) else {
            return Err(Error::Comm(
                "allgather_device: the transfer lost its buffers".into(),
            ));
        };
        let me = self.rank();
        let mut upload = || -> Result<()> {
            if out.len() != n * self.size() {
                return Err(Error::invalid(format!(
                    "allgather_device: output has {} values, expected {} x {n}",
                    out.len(),
                    self.size()
                )));
            }
            let total: usize = lens.iter().sum();
            let mine: &[u8] = &mine.bytes()?[..mine_len];
            let recv: &[u8] = &recv.bytes()?[..total];
            let (mut h2d, mut dec, mut off) = (0.0, 0.0, 0);
            for (k, &l) in lens.iter().enumerate() {
                let mut view = out.slice_mut(k * n..(k + 1) * n);
                // this rank's record from its send buffer (MPI may not have written its range)
                let part = if k == me { mine } else { &recv[off..off + l] };
                dev.upload_bytes(part, &mut view, compressed)?;
                h2d += dev.last.h2d;
                dec += dev.last.decompress;
                off += l;
            }
            dev.last.h2d = h2d;
            dev.last.decompress = dec;
            Ok(())
        };
        let r = upload();
        dev.reclaim_pinned(true, mine);
        dev.reclaim_pinned(false, recv);
        r?;
        Ok(self.finish(st, t0))
    }

    /// Broadcast a device buffer from `root`: the root compresses on the GPU (or, by the
    /// policy, stages the raw values), the stream is broadcast through pinned host memory, and
    /// every rank (the root included, so all end with identical values) uploads and decompresses
    /// it into `buf`. `Policy::Auto` is decided on the root by the model with the ratio of the
    /// previous broadcast of this size and bound (the first one compresses to learn it).
    /// Collective.
    pub fn bcast_device<T: GpuElement + Real + super::CommElement>(
        &mut self,
        dev: &mut DeviceStager,
        buf: &mut CudaViewMut<'_, T>,
        root: usize,
    ) -> Result<OpStats> {
        let BcastPrep {
            compressed,
            n,
            len,
            mut st,
            t0,
        } = self.bcast_device_prepare(dev, &buf.as_view(), root)?;
        // the root broadcasts from its pinned send buffer, the others receive into their pinned
        // receive buffer (grown once, then reused), then everyone uploads from there
        let t = now();
        let from_send = self.rank() == root;
        if !from_send {
            let s = dev.stream();
            DeviceStager::grow_pinned(&mut dev.pinned_recv, &s, len)?;
        }
        let mut slot = if from_send {
            dev.pinned_send.take()
        } else {
            dev.pinned_recv.take()
        };
        let r = match &mut slot {
            Some(b) => b
                .as_mut_slice()
                .map_err(gpu_err("pinned"))
                .and_then(|b| self.transport().bcast_into(root, &mut b[..len])),
            None if len == 0 => Ok(()),
            None => Err(Error::Comm("device staging: no pinned buffer".into())),
        };
        if from_send {
            dev.pinned_send = slot;
        } else {
            dev.pinned_recv = slot;
        }
        r?;
        dev.last.network = t.elapsed().as_secs_f64();
        if buf.len() != n {
            return Err(Error::invalid("bcast_device: buffer length changed"));
        }
        dev.last.h2d = 0.0;
        dev.last.decompress = 0.0;
        dev.upload_pinned(from_send, 0..len, buf, compressed)?;
        if compressed && st.bound == 0.0 {
            st.bound = stream_bound(self.config.bound, dev.pinned_bytes(from_send, len)?)?;
        }
        Ok(self.finish(st, t0))
    }

    /// Non-blocking [`bcast_device`](Self::bcast_device): the root compresses and stages now,
    /// every rank agrees and the transfer (`MPI_Ibcast`) starts. `buf` holds the data on the
    /// root; elsewhere only its length matters. Finish with
    /// [`wait_bcast_device`](Self::wait_bcast_device). Collective.
    pub fn ibcast_device<T: GpuElement + Real + super::CommElement>(
        &mut self,
        dev: &mut DeviceStager,
        buf: &CudaView<'_, T>,
        root: usize,
    ) -> Result<DeviceBcastRequest> {
        let BcastPrep {
            compressed,
            n,
            len,
            st,
            t0,
        } = self.bcast_device_prepare(dev, buf, root)?;
        // the transfer borrows the root's pinned send buffer (the staged stream) or the others'
        // pinned receive buffer (grown once, then reused) until the wait hands it back: no
        // per-call allocation, no copy of the stream
        let from_send = self.rank() == root;
        let b = dev.lend_pinned(from_send, len);
        let pending = self.transport().ibcast_into(root, b, len)?;
        Ok(DeviceBcastRequest {
            pending,
            compressed,
            n,
            len,
            from_send,
            st,
            t0,
        })
    }

    /// The part of the device broadcast before the transfer: the root's decision, GPU
    /// compression (or not) and D2H into its pinned send buffer, the agreement, the
    /// predictions.
    fn bcast_device_prepare<T: GpuElement + Real + super::CommElement>(
        &mut self,
        dev: &mut DeviceStager,
        buf: &CudaView<'_, T>,
        root: usize,
    ) -> Result<BcastPrep> {
        let t0 = self.wtime();
        let (p, r, n) = (self.size(), self.rank(), buf.len());
        let bytes = (n * T::SIZE) as f64;
        let mut local = Ok(());
        if root >= p {
            local = Err(Error::invalid(format!("bcast root {root} out of range")));
        }
        let bound = self.config.bound;
        let codec = self.config.policy.codec().unwrap_or_default();
        let key = super::coll_key(n, bound);
        let dp = dev.profile.clone().unwrap_or_else(DeviceProfile::guess);
        let link = self.profile.link;
        let est = self.ratios.get(super::OP_BCAST | 0x80, key);
        let mut st = OpStats::raw(super::OP_BCAST);
        st.bytes = bytes as u64;
        st.ratio_estimate = est.unwrap_or(1.0);
        dev.last = StageTimes::default();
        let mut d = Desc {
            dtype: elem_tag::<T>(),
            root: root as u32,
            ..self.local_desc::<f32>(super::OP_BCAST, n)
        };
        if r == root && local.is_ok() {
            let compress = match self.config.policy {
                Policy::Never => false,
                Policy::Always(_) => true,
                Policy::Auto(_) => {
                    let (raw_best, cmp_best) = dp.predict_bcast(link, p, bytes, f64::INFINITY);
                    let (raw_t, cmp_t) = dp.predict_bcast(link, p, bytes, est.unwrap_or(1.0));
                    cmp_best < crate::model::choice::HYSTERESIS * raw_best
                        && (est.is_none() || cmp_t < crate::model::choice::HYSTERESIS * raw_t)
                }
            } && n > 0;
            // into the stager's pinned send buffer: no per-call host allocation, no copy
            let staged: Result<usize> = if compress {
                dev.compress_timed(buf, bound, codec).and_then(|len| {
                    dev.scratch_to_pinned_send(len)?;
                    st.decision = Decision::Compressed;
                    st.codec = Some(codec);
                    st.bound = stream_bound(bound, dev.pinned_bytes(true, len)?)?;
                    Ok(len)
                })
            } else {
                dev.values_to_pinned_send(buf)
            };
            match staged {
                Ok(len) => {
                    d.decision = u8::from(compress);
                    d.payload = len as u64;
                }
                Err(e) => local = Err(e),
            }
        }
        let all = self.agree(d, local)?;
        let rd = all[root];
        let len = usize::try_from(rd.payload)
            .map_err(|_| Error::Comm(format!("root announced a {}-byte payload", rd.payload)))?;
        let compressed = rd.decision == 1;
        if compressed {
            st.decision = Decision::Compressed;
            st.codec = Some(codec);
            st.ratio = bytes / len.max(1) as f64;
            if r == root {
                self.ratios.put(super::OP_BCAST | 0x80, key, st.ratio);
            }
        }
        st.wire_bytes = len as u64;
        let terms = dp.bcast_terms(link, p, bytes, if compressed { st.ratio } else { 1.0 });
        dev.last_predicted = record_prediction(&mut st, terms, compressed);
        Ok(BcastPrep {
            compressed,
            n,
            len,
            st,
            t0,
        })
    }

    /// Complete a non-blocking device broadcast into `buf` (same length as given to
    /// [`ibcast_device`](Self::ibcast_device); written on the root too).
    pub fn wait_bcast_device<T: GpuElement + Real>(
        &mut self,
        dev: &mut DeviceStager,
        req: DeviceBcastRequest,
        buf: &mut CudaViewMut<'_, T>,
    ) -> Result<OpStats> {
        let DeviceBcastRequest {
            pending,
            compressed,
            n,
            len,
            from_send,
            mut st,
            t0,
        } = req;
        let t = now();
        let Some(mut b) = pending.wait()?.pop() else {
            return Err(Error::Comm(
                "bcast_device: the transfer lost its buffer".into(),
            ));
        };
        dev.last.network = t.elapsed().as_secs_f64();
        let bound = self.config.bound;
        let mut upload = || -> Result<()> {
            if buf.len() != n {
                return Err(Error::invalid(format!(
                    "bcast_device: buffer has {} values, ibcast_device was given {n}",
                    buf.len()
                )));
            }
            let payload: &[u8] = &b.bytes()?[..len];
            dev.upload_bytes(payload, buf, compressed)?;
            if compressed && st.bound == 0.0 {
                st.bound = stream_bound(bound, payload)?;
            }
            Ok(())
        };
        let r = upload();
        dev.reclaim_pinned(from_send, b);
        r?;
        Ok(self.finish(st, t0))
    }

    /// Sum of device buffers over all ranks with the end-to-end bound of the host
    /// [`allreduce`](Communicator::allreduce); compressed, a device-resident ring (see the
    /// [module docs](self)). Collective.
    pub fn allreduce_device<T: GpuElement + Real + super::CommElement>(
        &mut self,
        dev: &mut DeviceStager,
        input: &CudaView<'_, T>,
        out: &mut CudaViewMut<'_, T>,
    ) -> Result<OpStats> {
        self.reduce_device(dev, input, out, Reduction::Sum)
    }

    /// Mean of device buffers over all ranks (gradient averaging; the bound applies to the
    /// mean). Collective.
    pub fn allreduce_mean_device<T: GpuElement + Real + super::CommElement>(
        &mut self,
        dev: &mut DeviceStager,
        input: &CudaView<'_, T>,
        out: &mut CudaViewMut<'_, T>,
    ) -> Result<OpStats> {
        self.reduce_device(dev, input, out, Reduction::Mean)
    }

    /// Reduce-scatter (sum) of device buffers: rank `r` receives segment `r` of
    /// [`partition`](super::partition)`(input.len(), size)` (of the scalars: complex data is
    /// passed interleaved) in `out`, with the end-to-end bound of the host
    /// [`reduce_scatter`](Communicator::reduce_scatter) (`p-1` quantizations). Collective.
    pub fn reduce_scatter_device<T: GpuElement + Real + super::CommElement>(
        &mut self,
        dev: &mut DeviceStager,
        input: &CudaView<'_, T>,
        out: &mut CudaViewMut<'_, T>,
    ) -> Result<OpStats> {
        self.reduce_device(dev, input, out, Reduction::Scatter)
    }

    /// Fail every rank of a collective reduction together: this rank's descriptor is marked bad
    /// (the other ranks are in the host algorithm's agreement).
    fn fail_reduction<T: Real>(&mut self, op: u8, n: usize, e: Error) -> Error {
        let d = Desc {
            dtype: elem_tag::<T>(),
            ..self.local_desc::<f32>(op, n)
        };
        match self.agree(d, Err(e)) {
            Err(e) => e,
            Ok(_) => Error::Comm("device reduction: staging failed".into()),
        }
    }

    fn reduce_device<T: GpuElement + Real + super::CommElement>(
        &mut self,
        dev: &mut DeviceStager,
        input: &CudaView<'_, T>,
        out: &mut CudaViewMut<'_, T>,
        kind: Reduction,
    ) -> Result<OpStats> {
        // the device-resident compressed ring where it applies and the decision is to
        // compress; otherwise the staged host algorithm below
        if let Some(st) = self.reduce_device_ring(dev, input, out, kind)? {
            return Ok(st);
        }
        let t0 = self.wtime();
        let n = input.len();
        let want = match kind {
            Reduction::Scatter => super::partition(n, self.size())[self.rank()].len(),
            _ => n,
        };
        dev.last = StageTimes::default();
        let (in_bytes, out_bytes) = (n * T::SIZE, want * T::SIZE);
        // the values move through the stager's pinned buffers (grown once, then reused): D2H
        // into the send buffer, the host algorithm from it into the receive buffer, H2D from
        // there (no per-call host allocation, no zero-filling, no pageable copies)
        let staged = if out.len() != want {
            Err(Error::invalid(format!(
                "{}: output has {} values, expected {want}",
                super::op_name(kind.op()),
                out.len()
            )))
        } else if cfg!(target_endian = "big") {
            Err(Error::Unavailable(
                "device staging needs a little-endian host".into(),
            ))
        } else {
            let s = dev.stream();
            dev.values_to_pinned_send(input)
                .and_then(|_| DeviceStager::grow_pinned(&mut dev.pinned_recv, &s, out_bytes))
        };
        if let Err(e) = staged {
            return Err(self.fail_reduction::<T>(kind.op(), n, e));
        }
        let t = now();
        let (ps, mut pr) = (dev.pinned_send.take(), dev.pinned_recv.take());
        let r = match (&ps, &mut pr) {
            (Some(a), Some(b)) => (|| {
                let x = pinned_values::<T>(&a.as_slice().map_err(gpu_err("pinned"))?[..in_bytes]);
                let y = pinned_values_mut::<T>(
                    &mut b.as_mut_slice().map_err(gpu_err("pinned"))?[..out_bytes],
                );
                match kind {
                    Reduction::Sum => self.allreduce(x, y),
                    Reduction::Mean => self.allreduce_mean(x, y),
                    Reduction::Scatter => self.reduce_scatter(x, y),
                }
            })(),
            _ => Err(Error::Comm("device staging: no pinned buffer".into())),
        };
        dev.pinned_send = ps;
        dev.pinned_recv = pr;
        let st = r?;
        dev.last.network = t.elapsed().as_secs_f64();
        dev.upload_pinned(false, 0..out_bytes, out, false)?;
        {
            let dp = dev.profile.clone().unwrap_or_else(DeviceProfile::guess);
            dev.last_predicted = Terms {
                d2h: dp.d2h_s(in_bytes as f64),
                link: st.predicted_s,
                h2d: dp.h2d_s(out_bytes as f64),
                ..Terms::default()
            };
        }
        let st = self.add_staging(dev, st, in_bytes, out_bytes);
        Ok(self.finish(st, t0))
    }

    /// The compressed device ring of the blocking device reductions (see the
    /// [module docs](self)). Returns `Ok(None)` (nothing done, every rank alike) where it does
    /// not apply or the decision is raw: the caller then runs the staged host path.
    ///
    /// Applies with a policy other than `Never`, more than one rank, an abs or noa bound and at
    /// least one value per rank. Collective order: the agreement (with the device value range),
    /// under `Auto` a sum of the ratio estimates, the `p-1` ring steps (every rank runs all of
    /// them, failed or not: a failure travels as a header flag instead of a stream), a second
    /// agreement (every rank fails together), then (allreduce) the lengths and the allgather
    /// of the final streams.
    fn reduce_device_ring<T: GpuElement + Real + super::CommElement>(
        &mut self,
        dev: &mut DeviceStager,
        input: &CudaView<'_, T>,
        out: &mut CudaViewMut<'_, T>,
        kind: Reduction,
    ) -> Result<Option<OpStats>> {
        let (p, r, n) = (self.size(), self.rank(), input.len());
        if matches!(self.config.policy, Policy::Never)
            || matches!(self.config.bound, ErrorBound::Rel(_))
            || p < 2
        {
            return Ok(None);
        }
        let t0 = self.wtime();
        let op = kind.op();
        let full = kind != Reduction::Scatter;
        let want = if full {
            n
        } else {
            super::partition(n, p)[r].len()
        };
        dev.last = StageTimes::default();
        // 1. agreement with the global value range (device range pass on every rank)
        let local = if out.len() != want {
            Err(Error::invalid(format!(
                "{}: output has {} values, expected {want}",
                super::op_name(op),
                out.len()
            )))
        } else if cfg!(target_endian = "big") {
            Err(Error::Unavailable(
                "device staging needs a little-endian host".into(),
            ))
        } else {
            let s = dev.stream();
            dev.utils().and_then(|u| u.range(&s, input))
        };
        let (lo, hi) = match &local {
            Ok(Some(v)) => *v,
            _ => (f64::INFINITY, f64::NEG_INFINITY),
        };
        let desc = Desc {
            count: n as u64,
            dtype: elem_tag::<T>(),
            lo,
            hi,
            ..self.local_desc::<f32>(op, n)
        };
        let all = self.agree(desc, local.map(|_| ()))?;
        if n < p {
            return Ok(None);
        }
        // 2. the per-quantization bound (exactly the host path's)
        let glo = all.iter().map(|d| d.lo).fold(f64::INFINITY, f64::min);
        let ghi = all.iter().map(|d| d.hi).fold(f64::NEG_INFINITY, f64::max);
        let pf = p as f64;
        let split = super::ring::BoundSplit::new(
            self.config.bound,
            (glo, ghi),
            p,
            T::UNIT_ROUNDOFF,
            kind == Reduction::Mean,
            full,
        );
        let (e, d) = (split.result, split.divisor);
        let Some(eb) = split.step else {
            return Ok(None);
        };
        // 3. decision (identical on every rank: agreed profile and summed estimates)
        let codec = self.config.policy.codec().unwrap_or_default();
        let dp = dev.profile.clone().unwrap_or_else(DeviceProfile::guess);
        let link = self.profile.link;
        let (bytes, out_bytes) = (n * T::SIZE, want * T::SIZE);
        let (host_raw, _) =
            self.reduce_times::<T>(n, full, 1.0, self.config.policy.codec().unwrap_or_default());
        let raw_t = host_raw + dp.d2h_s(bytes as f64) + dp.h2d_s(out_bytes as f64);
        let key = super::coll_key(n, self.config.bound);
        // the ring's per-step ratio and (allreduces) the final streams' ratio, remembered
        // separately: the final segment is a sum of `p` fields compressed at a bound of its own
        let (opk, opf) = (op | 0x80, op | 0xC0);
        let est = self.ratios.get(opk, key);
        let est_f = self.ratios.get(opf, key).or(est);
        let mean = kind == Reduction::Mean;
        let fin = |r: f64| full.then_some(r);
        let (compress, ratio, ratio_f) = match self.config.policy {
            Policy::Never => (false, 1.0, 1.0),
            Policy::Always(_) => (true, est.unwrap_or(1.0), est_f.unwrap_or(1.0)),
            Policy::Auto(_) => {
                // never when even an infinite ratio cannot pay; without an estimate on every
                // rank yet, compress once to learn the ratio. The inputs are summed and the
                // verdict is the minimum over the ranks, so every rank takes the same path
                // even with differing profiles.
                let inf = f64::INFINITY;
                let best = dp
                    .reduce_terms(link, p, bytes as f64, inf, fin(inf), mean)
                    .total();
                let mut v = [
                    1.0 / est.unwrap_or(1.0).max(1e-9),
                    f64::from(u8::from(est.is_some())),
                    f64::from(u8::from(best < crate::model::choice::HYSTERESIS * raw_t)),
                    1.0 / est_f.unwrap_or(1.0).max(1e-9),
                ];
                self.transport().allreduce_f64(&mut v, ReduceOp::Sum)?;
                let (ratio, ratio_f) = (pf / v[0], pf / v[3]);
                let (known, can) = (v[1] >= pf - 0.5, v[2] >= pf - 0.5);
                let cmp = dp
                    .reduce_terms(link, p, bytes as f64, ratio, fin(ratio_f), mean)
                    .total();
                let mut w = [f64::from(u8::from(
                    can && (!known || cmp < crate::model::choice::HYSTERESIS * raw_t),
                ))];
                self.transport().allreduce_f64(&mut w, ReduceOp::Min)?;
                (w[0] > 0.5, ratio, ratio_f)
            }
        };
        if !compress {
            return Ok(None);
        }
        let mut st = OpStats::raw(op);
        st.bytes = bytes as u64;
        st.ratio_estimate = ratio;
        st.predicted_raw_s = raw_t;
        st.predicted_compressed_s = dp
            .reduce_terms(link, p, bytes as f64, ratio, fin(ratio_f), mean)
            .total();
        st.predicted_s = st.predicted_compressed_s;
        st.decision = Decision::Compressed;
        st.codec = Some(codec);
        st.bound = e;
        // 4. the ring reduce-scatter on device segments
        let segs = super::partition(n, p);
        let cap = crate::compress_bound(segs[0].len(), T::DTYPE);
        let s = dev.stream();
        let step_bound = ErrorBound::Abs(eb * d);
        let (to, from) = ((r + 1) % p, (r + p - 1) % p);
        let mut failed: Option<Error> = None;
        // buffers: pinned send (one stream), pinned receive (every final stream of the
        // allgather, else one stream), the device accumulator: `out` itself for the
        // allreduces (a device copy of the input), a segment scratch for reduce-scatter with
        // more than two ranks (the last step adds straight into `out`)
        let setup = (|| -> Result<Option<CudaSlice<T>>> {
            DeviceStager::grow_pinned(&mut dev.pinned_send, &s, cap)?;
            DeviceStager::grow_pinned(&mut dev.pinned_recv, &s, if full { p * cap } else { cap })?;
            DeviceStager::grow_dev(&mut dev.scratch_in, &s, cap)?;
            if full {
                s.memcpy_dtod(input, out).map_err(gpu_err("dtod"))?;
                Ok(None)
            } else if p > 2 {
                // SAFETY: each use is written (a device copy of the input segment) before read.
                let b = unsafe { s.alloc::<T>(segs[0].len()) }.map_err(|e| {
                    Error::OutOfMemory(format!("{} device values: {e:?}", segs[0].len()))
                })?;
                Ok(Some(b))
            } else {
                Ok(None)
            }
        })();
        let mut tmp = match setup {
            Ok(t) => t,
            Err(e) => {
                failed = Some(e);
                None
            }
        };
        let mut wire = 0usize;
        for step in 0..p - 1 {
            let send_seg = segs[(r + 2 * p - step - 1) % p].clone();
            let recv_seg = segs[(r + 2 * p - step - 2) % p].clone();
            // compress the outgoing partial sum, D2H of its stream
            let mine = if failed.is_some() {
                None
            } else {
                let l = if full {
                    let v = out.slice(send_seg.clone());
                    dev.compress_to_pinned_send(&v, step_bound, codec)
                } else if step == 0 {
                    let v = input.slice(send_seg.clone());
                    dev.compress_to_pinned_send(&v, step_bound, codec)
                } else {
                    match &tmp {
                        Some(b) => {
                            let v = b.slice(0..send_seg.len());
                            dev.compress_to_pinned_send(&v, step_bound, codec)
                        }
                        None => Err(Error::Comm("device ring: no accumulator".into())),
                    }
                };
                match l {
                    Ok(l) => Some(l),
                    Err(e) => {
                        failed = Some(e);
                        None
                    }
                }
            };
            wire += mine.unwrap_or(0);
            let t = now();
            let got = self.ring_exchange(dev, mine, to, from)?;
            dev.last.network += t.elapsed().as_secs_f64();
            // H2D of the received stream, decompress-and-add into the accumulator
            match got {
                Ok(m) if failed.is_none() => {
                    let res = if full {
                        let mut v = out.slice_mut(recv_seg.clone());
                        dev.upload_add(m, &mut v)
                    } else if step == p - 2 {
                        // recv_seg is this rank's segment: accumulate in `out`
                        let x = input.slice(recv_seg.clone());
                        s.memcpy_dtod(&x, out)
                            .map_err(gpu_err("dtod"))
                            .and_then(|()| dev.upload_add(m, out))
                    } else {
                        match tmp.as_mut() {
                            Some(b) => {
                                let x = input.slice(recv_seg.clone());
                                let mut v = b.slice_mut(0..recv_seg.len());
                                s.memcpy_dtod(&x, &mut v)
                                    .map_err(gpu_err("dtod"))
                                    .and_then(|()| dev.upload_add(m, &mut v))
                            }
                            None => Err(Error::Comm("device ring: no accumulator".into())),
                        }
                    };
                    if let Err(e) = res {
                        failed = Some(e);
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        drop(tmp.take());
        // 5. (allreduce) the mean's division, then the final segment compressed once with eb
        let mut mine_len = 0;
        if full && failed.is_none() {
            let res = (|| -> Result<usize> {
                if d != 1.0 {
                    let mut v = out.slice_mut(segs[r].clone());
                    let u = dev.utils()?;
                    u.scale(&s, &mut v, T::from_f64(d))?;
                    s.synchronize().map_err(gpu_err("sync"))?;
                }
                let v = out.slice(segs[r].clone());
                dev.compress_to_pinned_send(&v, ErrorBound::Abs(eb), codec)
            })();
            match res {
                Ok(l) => mine_len = l,
                Err(e) => failed = Some(e),
            }
        }
        // every rank fails together (a failure only reached the ring neighbours so far)
        let desc = Desc {
            count: n as u64,
            dtype: elem_tag::<T>(),
            ..self.local_desc::<f32>(op, n)
        };
        self.agree(desc, failed.map_or(Ok(()), Err))?;
        let ring_wire = wire;
        let mut final_total = 0usize;
        if full {
            // 6. allgather of the final streams (pinned, as allgather_device), then H2D +
            // GPU decompression of every stream (this rank's own too: identical results)
            let lens = self.transport().allgather_lens(mine_len)?;
            let total: usize = lens.iter().sum();
            final_total = total;
            if total > p * cap {
                return Err(Error::Comm(format!(
                    "device allreduce: {total} bytes of final streams exceed {}",
                    p * cap
                )));
            }
            let t = now();
            let (ps, mut pr) = (dev.pinned_send.take(), dev.pinned_recv.take());
            let g = gather_pinned(self.transport(), &ps, &mut pr, mine_len, &lens, total);
            dev.pinned_send = ps;
            dev.pinned_recv = pr;
            g?;
            dev.last.network += t.elapsed().as_secs_f64();
            let mut off = 0;
            for (k, &l) in lens.iter().enumerate() {
                let mut view = out.slice_mut(segs[k].clone());
                if k == r {
                    dev.upload_pinned(true, 0..mine_len, &mut view, true)?;
                } else {
                    dev.upload_pinned(false, off..off + l, &mut view, true)?;
                }
                off += l;
            }
            wire += mine_len * (p - 1);
            st.ratio = (2.0 * bytes as f64 * (pf - 1.0) / pf) / wire.max(1) as f64;
        } else {
            st.ratio = (bytes as f64 * (pf - 1.0) / pf) / wire.max(1) as f64;
        }
        st.wire_bytes = wire as u64;
        // the ring's per-step ratio: the prediction at the ratio met, and the estimate of the
        // next Auto decision of this size and bound
        let rr = ((bytes as f64 / pf) * (pf - 1.0) / ring_wire.max(1) as f64).max(1.0);
        // the final streams: every segment once (`bytes` in all)
        let rf = (bytes as f64 / final_total.max(1) as f64).max(1.0);
        let terms = dp.reduce_terms(link, p, bytes as f64, rr, fin(rf), mean);
        st.predicted_compressed_s = terms.total();
        st.predicted_s = st.predicted_compressed_s;
        dev.last_predicted = terms;
        self.ratios.put(opk, key, rr);
        if full {
            self.ratios.put(opf, key, rf);
        }
        tracing::debug!(target: "zcomm::comm", stages = ?dev.last, "{} device ring", super::op_name(op));
        Ok(Some(self.finish(st, t0)))
    }

    /// One ring step's exchange: this rank's stream (`mine`: the first bytes of the pinned
    /// send buffer; `None` after a failure, sent as a flagged empty message) to `to`, the
    /// neighbour's into the pinned receive buffer from `from` (a length header first, then the
    /// sized payload). Returns the received length, or (inner error) the neighbour's failure or
    /// an oversized stream (received and dropped, so both sides stay matched). MPI errors are
    /// returned as the outer error.
    fn ring_exchange(
        &self,
        dev: &mut DeviceStager,
        mine: Option<usize>,
        to: usize,
        from: usize,
    ) -> Result<Result<usize>> {
        let t = self.transport();
        let mut hdr = [0u8; 16];
        hdr[..8].copy_from_slice(&(mine.unwrap_or(0) as u64).to_le_bytes());
        hdr[8] = u8::from(mine.is_none());
        let theirs = t.sendrecv(to, &hdr, from, super::TAG_RING)?;
        if theirs.len() != 16 {
            return Err(Error::Comm(format!(
                "device ring: {}-byte step header",
                theirs.len()
            )));
        }
        let bad = theirs[8] != 0;
        let m = u64::from_le_bytes(theirs[..8].try_into().expect("8 bytes"));
        let m = usize::try_from(m)
            .map_err(|_| Error::Comm(format!("device ring: {m}-byte stream announced")))?;
        let payload: &[u8] = match (mine, &dev.pinned_send) {
            (Some(l), Some(b)) => &b.as_slice().map_err(gpu_err("pinned"))?[..l],
            _ => &[],
        };
        let buf: &mut [u8] = match &mut dev.pinned_recv {
            Some(b) => b.as_mut_slice().map_err(gpu_err("pinned"))?,
            None => &mut [],
        };
        if m > buf.len() {
            // drain the oversized message (fallibly: `m` came over the wire)
            let mut v = Vec::new();
            v.try_reserve_exact(m).map_err(|_| {
                Error::OutOfMemory(format!("device ring: {m}-byte stream announced"))
            })?;
            v.resize(m, 0u8);
            t.sendrecv_sized(to, payload, from, &mut v, super::TAG_RING)?;
            return Ok(Err(Error::Comm(format!(
                "device ring: {m}-byte stream exceeds the receive buffer"
            ))));
        }
        t.sendrecv_sized(to, payload, from, &mut buf[..m], super::TAG_RING)?;
        if bad {
            return Ok(Err(Error::Comm(
                "device ring: a neighbouring rank failed".into(),
            )));
        }
        Ok(Ok(m))
    }

    /// The model's staging hops of a composed operation added to the host operation's
    /// prediction: a D2H of `in_bytes` before and an H2D of `out_bytes` after.
    fn add_staging(
        &self,
        dev: &DeviceStager,
        mut st: OpStats,
        in_bytes: usize,
        out_bytes: usize,
    ) -> OpStats {
        let dp = dev.profile.clone().unwrap_or_else(DeviceProfile::guess);
        let extra = dp.d2h_s(in_bytes as f64) + dp.h2d_s(out_bytes as f64);
        st.predicted_raw_s += extra;
        st.predicted_compressed_s += extra;
        st.predicted_s += extra;
        st
    }

    /// Stage `input` to the host and queue `f` on the progress thread (see the
    /// [`DeviceRequest`] docs). A staging failure fails the queued collective on every rank.
    fn submit_device<T: GpuElement + Real + super::CommElement>(
        &mut self,
        dev: &mut DeviceStager,
        input: &CudaView<'_, T>,
        what: &'static str,
        op: u8,
        f: impl FnOnce(&mut Communicator, Vec<T>) -> Result<(Vec<T>, OpStats)> + Send + 'static,
    ) -> Result<DeviceRequest<T>> {
        if !self.has_progress_thread() {
            return Err(Error::Unavailable(format!(
                "{what}: needs the progress thread (MPI_THREAD_MULTIPLE and Communicator::init)"
            )));
        }
        let t0 = self.wtime();
        let n = input.len();
        let t = now();
        let staged = stage_values(dev, input);
        let d2h = t.elapsed().as_secs_f64();
        let inner = match staged {
            Ok(host) => self.submit(what, move |c| f(c, host))?,
            Err(e) => {
                let msg = e.to_string();
                self.submit(what, move |c| {
                    let e = Error::Gpu(format!("{what}: staging failed: {msg}"));
                    Err(c.fail_reduction::<T>(op, n, e))
                })?
            }
        };
        Ok(DeviceRequest {
            inner,
            in_bytes: n * T::SIZE,
            t0,
            d2h,
        })
    }

    /// Non-blocking [`allreduce_device`](Self::allreduce_device): D2H of `input` now, the host
    /// [`iallreduce`](Self::iallreduce) algorithm on the progress thread (same bound), H2D in
    /// [`wait_device`](Self::wait_device). Collective, in issue order; [`Error::Unavailable`]
    /// without the progress thread. This (and the other non-blocking reductions) keeps the
    /// staged host path, not the blocking form's device ring.
    pub fn iallreduce_device<T: GpuElement + Real + super::CommElement>(
        &mut self,
        dev: &mut DeviceStager,
        input: &CudaView<'_, T>,
    ) -> Result<DeviceRequest<T>> {
        self.submit_allreduce_device(dev, input, false)
    }

    /// Non-blocking [`allreduce_mean_device`](Self::allreduce_mean_device) (see
    /// [`iallreduce_device`](Self::iallreduce_device)).
    pub fn iallreduce_mean_device<T: GpuElement + Real + super::CommElement>(
        &mut self,
        dev: &mut DeviceStager,
        input: &CudaView<'_, T>,
    ) -> Result<DeviceRequest<T>> {
        self.submit_allreduce_device(dev, input, true)
    }

    /// The host allreduce (sum, or `mean`) of [`iallreduce_device`](Self::iallreduce_device) /
    /// [`iallreduce_mean_device`](Self::iallreduce_mean_device) on the progress thread.
    fn submit_allreduce_device<T: GpuElement + Real + super::CommElement>(
        &mut self,
        dev: &mut DeviceStager,
        input: &CudaView<'_, T>,
        mean: bool,
    ) -> Result<DeviceRequest<T>> {
        let (name, op) = if mean {
            ("iallreduce_mean_device", super::OP_ALLREDUCE_MEAN)
        } else {
            ("iallreduce_device", super::OP_ALLREDUCE)
        };
        self.submit_device(dev, input, name, op, move |c, x| {
            let mut out = vec![T::default(); x.len()];
            let st = if mean {
                c.allreduce_mean(&x, &mut out)?
            } else {
                c.allreduce(&x, &mut out)?
            };
            Ok((out, st))
        })
    }

    /// Non-blocking [`reduce_scatter_device`](Self::reduce_scatter_device) (see
    /// [`iallreduce_device`](Self::iallreduce_device)); `wait_device` writes this rank's
    /// segment.
    pub fn ireduce_scatter_device<T: GpuElement + Real + super::CommElement>(
        &mut self,
        dev: &mut DeviceStager,
        input: &CudaView<'_, T>,
    ) -> Result<DeviceRequest<T>> {
        let seg = super::partition(input.len(), self.size())[self.rank()].len();
        self.submit_device(
            dev,
            input,
            "ireduce_scatter_device",
            super::OP_REDUCE_SCATTER,
            move |c, x| {
                let mut out = vec![T::default(); seg];
                let st = c.reduce_scatter(&x, &mut out)?;
                Ok((out, st))
            },
        )
    }

    /// Non-blocking exchange of device buffers: D2H of `send` now, the host
    /// [`isendrecv`](Self::isendrecv) on the progress thread (compressed on the wire with the
    /// communicator's [`Compressor`], e.g. a [`GpuCompressor`]; not the device chunk pipeline of
    /// [`sendrecv_device`](Self::sendrecv_device)), H2D of the `recv_len` received values in
    /// [`wait_device`](Self::wait_device). The peer must use `isendrecv_device` or
    /// `isendrecv`, in the same order relative to its other non-blocking operations.
    #[allow(clippy::too_many_arguments)]
    pub fn isendrecv_device<T: GpuElement + Real + super::CommElement>(
        &mut self,
        dev: &mut DeviceStager,
        send: &CudaView<'_, T>,
        dest: usize,
        recv_len: usize,
        src: usize,
        tag: i32,
    ) -> Result<DeviceRequest<T>> {
        Self::check_tag(tag)?;
        for r in [dest, src] {
            if r >= self.size() {
                return Err(Error::invalid(format!("rank {r} out of range")));
            }
        }
        if !self.has_progress_thread() {
            return Err(Error::Unavailable(
                "isendrecv_device: needs the progress thread (MPI_THREAD_MULTIPLE and Communicator::init)"
                    .into(),
            ));
        }
        let t0 = self.wtime();
        let t = now();
        // a staging failure sends nothing: the peer sees a count mismatch, both requests fail
        let (host, err) = match stage_values(dev, send) {
            Ok(v) => (v, None),
            Err(e) => (Vec::new(), Some(e.to_string())),
        };
        let d2h = t.elapsed().as_secs_f64();
        let inner = self.submit("isendrecv_device", move |c| {
            let mut out = vec![T::default(); recv_len];
            let st = c.sendrecv(&host, dest, &mut out, src, tag)?;
            match err {
                Some(m) => Err(Error::Gpu(format!("isendrecv_device: staging failed: {m}"))),
                None => Ok((out, st)),
            }
        })?;
        Ok(DeviceRequest {
            inner,
            in_bytes: send.len() * T::SIZE,
            t0,
            d2h,
        })
    }

    /// Complete a [`DeviceRequest`]: wait for the host operation, then H2D of its result into
    /// `out` (which must have the result's length: the input's for the allreduces, this rank's
    /// segment for reduce-scatter, `recv_len` for `isendrecv_device`). The stats' predictions
    /// include the two staging copies; `measured_s` runs from the non-blocking call.
    pub fn wait_device<T: GpuElement + Real>(
        &mut self,
        dev: &mut DeviceStager,
        req: DeviceRequest<T>,
        out: &mut CudaViewMut<'_, T>,
    ) -> Result<OpStats> {
        let DeviceRequest {
            inner,
            in_bytes,
            t0,
            d2h,
        } = req;
        dev.last = StageTimes {
            d2h,
            ..Default::default()
        };
        let t = now();
        let (v, st) = inner.wait()?;
        dev.last.network = t.elapsed().as_secs_f64();
        if out.len() != v.len() {
            return Err(Error::invalid(format!(
                "wait_device: output has {} values, the result {}",
                out.len(),
                v.len()
            )));
        }
        let t = now();
        dev.copy_to_device(&super::element::scalar_bytes(&v), out)?;
        dev.last.h2d = t.elapsed().as_secs_f64();
        let st = self.add_staging(dev, st, in_bytes, v.len() * T::SIZE);
        Ok(self.finish(st, t0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A calibrated-looking profile: H100-like numbers, every term set, staging by the curve.
    fn profile() -> DeviceProfile {
        let mut curve = StagingCurve::default();
        for (b, d, h) in [
            (16e6, 0.8e-3, 0.6e-3),
            (64e6, 2.4e-3, 1.3e-3),
            (1e9, 39e-3, 39e-3),
        ] {
            curve.insert(StagingPoint {
                bytes: b,
                d2h: d,
                h2d: h,
            });
        }
        DeviceProfile {
            staging: Link {
                bandwidth: 27e9,
                latency: 10e-6,
            },
            compress: 260e9,
            decompress: 480e9,
            staging_curve: curve,
            call_overhead: 0.5e-3,
            compress_overhead: 0.3e-3,
            decompress_overhead: 0.2e-3,
            decompress_add: 400e9,
            decompress_add_overhead: 0.25e-3,
            device_copy: 1.2e12,
            range_pass: 2.0e12,
            scale_pass: 1.0e12,
            // no solo rates, one-way curve or ranks-per-GPU count: as before any calibration
            ..DeviceProfile::guess()
        }
    }

    /// [`profile`] with solo rates, a one-way link and `s` ranks per GPU: solo compression
    /// 0.1 ms + 600 GB/s, solo decompression 0.05 ms + 1500 GB/s, solo copies 2 ms (D2H) /
    /// 2.5 ms (H2D) per 100 MB, one-way link 16 ms per 100 MB (6.25 GB/s).
    fn solo_profile(s: usize) -> DeviceProfile {
        let mut dp = profile();
        dp.ranks_per_gpu = s;
        dp.compress_solo = 600e9;
        dp.compress_solo_overhead = 0.1e-3;
        dp.decompress_solo = 1500e9;
        dp.decompress_solo_overhead = 0.05e-3;
        dp.staging_curve_solo.insert(StagingPoint {
            bytes: 1e8,
            d2h: 2e-3,
            h2d: 2.5e-3,
        });
        dp.link_one_way.insert(LinkPoint {
            bytes: 1e8,
            seconds: 16e-3,
        });
        dp
    }

    /// The device profile of bench/results/2026-11-22-h100-mpi-staging-v5.jsonl (two ranks
    /// sharing one H100, written before the solo fields).
    const V5_PROFILE_JSON: &str = r#"{"call_overhead":0.0012299709262515262,"compress":318533820564.29175,"compress_overhead":0.0008994880293040292,"decompress":946016283949.4966,"decompress_add":539903675538.65643,"decompress_add_overhead":0.00034473846153846134,"decompress_overhead":0.00033048289694749696,"device_copy":624423519094.5659,"range_pass":814696766606.0935,"scale_pass":526916148661.41425,"staging":{"bandwidth":27505553384.69587,"latency":0.00001},"staging_curve":{"points":[{"bytes":1048576.0,"d2h":0.000048747,"h2d":0.000050172},{"bytes":4194304.0,"d2h":0.000162442,"h2d":0.000163906},{"bytes":16777216.0,"d2h":0.000618763,"h2d":0.000620922},{"bytes":67108864.0,"d2h":0.002451287,"h2d":0.002454058},{"bytes":268435456.0,"d2h":0.009757648,"h2d":0.009767423},{"bytes":1073741824.0,"d2h":0.039001573,"h2d":0.039037274}]}}"#;

    fn close_terms(a: Terms, b: Terms) -> bool {
        close(a.compress, b.compress)
            && close(a.d2h, b.d2h)
            && close(a.link, b.link)
            && close(a.h2d, b.h2d)
            && close(a.decompress, b.decompress)
            && close(a.device, b.device)
    }

    const LINK: Link = Link {
        bandwidth: 3.8e9,
        latency: 2e-6,
    };

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-12 * a.abs().max(b.abs()).max(1e-9)
    }

    #[test]
    fn predict_bcast_is_the_hand_formula() {
        let dp = profile();
        let (b, r) = (1073741824.0, 19.0);
        let z = b / r;
        for (p, hops) in [(2usize, 1.0), (4, 2.0), (5, 3.0)] {
            let (raw, cmp) = dp.predict_bcast(LINK, p, b, r);
            let want_raw = dp.d2h_s(b) + hops * (2e-6 + b / 3.8e9) + dp.h2d_s(b);
            let want_cmp = (0.3e-3 + b / 260e9)
                + dp.d2h_s(z)
                + hops * (2e-6 + z / 3.8e9)
                + dp.h2d_s(z)
                + (0.2e-3 + b / 480e9);
            assert!(close(raw, want_raw), "p={p}: {raw} vs {want_raw}");
            assert!(close(cmp, want_cmp), "p={p}: {cmp} vs {want_cmp}");
            let (tr, tc) = dp.bcast_terms(LINK, p, b, r);
            assert!(close(tr.total(), raw) && close(tc.total(), cmp));
            assert!(close(tc.link, hops * (2e-6 + z / 3.8e9)) && tc.device == 0.0);
        }
        // one rank: no link hop
        assert_eq!(dp.bcast_terms(LINK, 1, b, r).1.link, 0.0);
    }

    #[test]
    fn codec_calls_pay_their_fixed_cost_once() {
        let dp = profile();
        let b = 1073741824.0;
        // the whole-message exchange: its scenario (one chunk) equals the stage sum, with one
        // compress + decompress call's fixed cost
        let (tr, tc) = dp.sendrecv_terms(LINK, b, 19.0);
        let pr = model::predict(&dp.scenario(LINK, b, 19.0, 1));
        assert!(close(pr.compressed_serial, tc.total()));
        assert!(close(pr.raw_serial, tr.total()));
        assert!(close(tc.compress, 0.3e-3 + b / 260e9));
        assert!(close(tc.decompress, 0.2e-3 + b / 480e9));
        // stage / restore
        let (_, s) = dp.stage_terms(b, 19.0);
        assert!(close(s.total(), 0.3e-3 + b / 260e9 + dp.d2h_s(b / 19.0)));
        let (_, r) = dp.restore_terms(b, 19.0);
        assert!(close(r.total(), dp.h2d_s(b / 19.0) + 0.2e-3 + b / 480e9));
        // allgather: one compression, p decompression calls
        let (_, g) = dp.allgather_terms(LINK, 4, b, 19.0);
        assert!(close(g.compress, dp.compress_s(b)));
        assert!(close(g.decompress, 4.0 * dp.decompress_s(b)));
        assert!(close(g.link, 3.0 * (2e-6 + b / 19.0 / 3.8e9)));
        assert!(close(g.h2d, 4.0 * dp.h2d_s(b / 19.0)));
        // the fused kernel falls back to the plain decompression when not calibrated
        let mut q = dp.clone();
        q.decompress_add = 0.0;
        assert_eq!(q.decompress_add_s(b), q.decompress_s(b));
        assert!(close(dp.decompress_add_s(b), 0.25e-3 + b / 400e9));
    }

    #[test]
    fn bcast_uses_solo_root_one_way_link_and_late_decompression() {
        // 1.024 GB at ratio 16: the stream is 64 MB, a point of the shared curve (D2H 2.4 ms,
        // H2D 1.3 ms); the raw 1.024 GB extends the 1 GB point (39 ms per GB)
        let (b, r) = (1.024e9, 16.0);
        let compress = 0.1e-3 + 1.024e9 / 600e9; // solo line: 1.806667 ms
        let d2h_z = 2e-3 * 0.64; // solo curve at 64 MB: 1.28 ms
        let one_way_z = 16e-3 * 0.64; // 10.24 ms
        let dec_solo: f64 = 0.05e-3 + 1.024e9 / 1500e9; // 0.732667 ms
        let dec_shared = 0.2e-3 + 1.024e9 / 480e9; // 2.333333 ms
                                                   // ranks sharing a GPU: the mean of the staggered and the concurrent case
        let mean = |st: f64| 0.5 * (st + st.max(dec_shared));
        for (p, hops) in [(2usize, 1.0), (4, 2.0)] {
            // two ranks per GPU, staggered: the first upload ends after 1.3 / 2 ms; the last
            // rank's call ends at max(1.3 + 0.732667, 0.65 + 2.333333) = 2.983333 ms;
            // concurrent: 2.333333 ms after the upload
            let (raw, cmp) = solo_profile(2).bcast_terms(LINK, p, b, r);
            let want = Terms {
                compress,
                d2h: d2h_z,
                link: hops * one_way_z,
                h2d: 1.3e-3,
                decompress: mean(0.65e-3 + dec_shared - 1.3e-3),
                device: 0.0,
            };
            assert!(close_terms(cmp, want), "p={p}: {cmp:?} vs {want:?}");
            assert!(close(
                cmp.decompress,
                0.5 * (1.683333333333333e-3 + dec_shared)
            ));
            let want_raw = Terms {
                d2h: 2e-3 * 10.24,
                link: hops * 16e-3 * 10.24,
                h2d: 39e-3 * 1.024,
                ..Terms::default()
            };
            assert!(close_terms(raw, want_raw), "p={p}: {raw:?} vs {want_raw:?}");
            // one rank per GPU: the root's stages and the link as above, every rank's
            // decompression at the shared rate (max(solo, shared) after its own upload)
            let (_, own) = solo_profile(1).bcast_terms(LINK, p, b, r);
            let want_own = Terms {
                decompress: dec_shared,
                ..want
            };
            assert!(close_terms(own, want_own), "p={p}: {own:?} vs {want_own:?}");
            // four ranks per GPU: the first upload after 1.3 / 4 ms
            let (_, four) = solo_profile(4).bcast_terms(LINK, p, b, r);
            assert!(close(
                four.decompress,
                mean(dec_solo.max(0.325e-3 + dec_shared - 1.3e-3))
            ));
        }
        // a slow upload: the last rank's call runs alone after it (H2D 13 ms at the stream's
        // size with the shared curve scaled up ten times)
        let mut slow = solo_profile(2);
        for q in &mut slow.staging_curve.points {
            q.h2d *= 10.0;
        }
        let (_, c) = slow.bcast_terms(LINK, 2, b, r);
        assert!(close(c.h2d, 13e-3) && close(c.decompress, mean(dec_solo)));
        // one rank: no link step
        assert_eq!(solo_profile(2).bcast_terms(LINK, 1, b, r).1.link, 0.0);
    }

    #[test]
    fn restore_decompresses_after_the_shared_upload() {
        let (b, r) = (1.024e9, 16.0);
        let dec_solo: f64 = 0.05e-3 + 1.024e9 / 1500e9;
        let dec_shared = 0.2e-3 + 1.024e9 / 480e9;
        // s > 1: the mean of the staggered and the concurrent case (module docs)
        let mean = |st: f64| 0.5 * (st + st.max(dec_shared));
        for (s, dec) in [
            (2usize, mean(dec_solo.max(0.65e-3 + dec_shared - 1.3e-3))),
            (1, dec_shared),
            (4, mean(dec_solo.max(0.325e-3 + dec_shared - 1.3e-3))),
        ] {
            let dp = solo_profile(s);
            let (raw, cmp) = dp.restore_terms(b, r);
            assert!(close(raw.h2d, 39e-3 * 1.024) && raw.decompress == 0.0);
            assert!(close(cmp.h2d, 1.3e-3), "s={s}");
            assert!(
                close(cmp.decompress, dec),
                "s={s}: {} vs {dec}",
                cmp.decompress
            );
            assert!(cmp.decompress >= dec_solo);
            // stage_to_host: every rank compresses at once, then the copies (shared)
            let (_, st) = dp.stage_terms(b, r);
            assert!(close(st.compress, dp.compress_s(b)) && close(st.d2h, 2.4e-3));
        }
    }

    #[test]
    fn collective_stages_keep_the_shared_rates() {
        // every rank works in every stage of sendrecv / allgather / the ring: the solo rates,
        // the one-way link and the placement do not change them
        let (b, r) = (1e9, 19.0);
        let (a, z) = (profile(), solo_profile(2));
        assert_eq!(a.sendrecv_terms(LINK, b, r), z.sendrecv_terms(LINK, b, r));
        assert_eq!(
            a.allgather_terms(LINK, 4, b, r),
            z.allgather_terms(LINK, 4, b, r)
        );
        assert_eq!(
            a.reduce_terms(LINK, 4, b, r, Some(r), true),
            z.reduce_terms(LINK, 4, b, r, Some(r), true)
        );
        assert_eq!(a.stage_terms(b, r), z.stage_terms(b, r));
    }

    #[test]
    fn old_profiles_load_and_fall_back_to_the_shared_rates() {
        // the device profile of bench/results/2026-11-22-h100-mpi-staging-v5.jsonl (before the
        // solo fields)
        let json = V5_PROFILE_JSON;
        let dp: DeviceProfile = serde_json::from_str(json).unwrap();
        assert_eq!(dp.ranks_per_gpu, 0);
        assert_eq!(dp.sharing(), 1);
        assert!(dp.staging_curve_solo.is_empty() && dp.link_one_way.is_empty());
        let (b, r) = (1073741824.0, 19.1);
        let z = b / r;
        assert_eq!(dp.compress_solo_s(b), dp.compress_s(b));
        assert_eq!(dp.decompress_solo_s(b), dp.decompress_s(b));
        assert_eq!(dp.d2h_solo_s(z), dp.d2h_s(z));
        assert_eq!(dp.h2d_solo_s(z), dp.h2d_s(z));
        let v5 = Link {
            bandwidth: 3477443380.212728,
            latency: 1.37079e-6,
        };
        assert_eq!(dp.one_way_s(v5, z), v5.latency + z / v5.bandwidth);
        // the v5 predictions: bcast 26.0 ms, restore 3.53 ms
        let (_, bc) = dp.bcast_terms(v5, 2, b, r);
        assert!((bc.total() - 26.0e-3).abs() < 0.1e-3, "{}", bc.total());
        assert!(close(bc.decompress, dp.decompress_s(b)));
        let (_, rs) = dp.restore_terms(b, 19.09);
        assert!((rs.total() - 3.53e-3).abs() < 0.01e-3, "{}", rs.total());
        // and the new fields round-trip
        let mut q = dp.clone();
        q.ranks_per_gpu = 2;
        q.compress_solo = 5.6e11;
        q.link_one_way.insert(LinkPoint {
            bytes: 1e8,
            seconds: 0.017,
        });
        let back: DeviceProfile =
            serde_json::from_str(&serde_json::to_string(&q).unwrap()).unwrap();
        assert_eq!(back, q);
    }

    #[test]
    fn v5_with_solo_rates_predicts_the_measured_ops() {
        // the v5 profile plus solo values as its measured stages suggest (two ranks sharing one
        // H100): a 1 GiB compression alone ≈ 1.9 ms, decompression alone ≈ 0.75 ms, copies
        // alone at twice the shared rate, one-way link ≈ 5.9 GB/s
        let json = V5_PROFILE_JSON;
        let mut dp: DeviceProfile = serde_json::from_str(json).unwrap();
        let b = 1073741824.0;
        dp.ranks_per_gpu = 2;
        dp.compress_solo = b / 1.6e-3;
        dp.compress_solo_overhead = 0.3e-3;
        dp.decompress_solo = b / 0.6e-3;
        dp.decompress_solo_overhead = 0.15e-3;
        for q in dp.staging_curve.points.clone() {
            dp.staging_curve_solo.insert(StagingPoint {
                d2h: q.d2h / 2.0,
                h2d: q.h2d / 2.0,
                ..q
            });
        }
        for mib in [1.0, 16.0, 64.0, 256.0] {
            let x = mib * 1048576.0;
            dp.link_one_way.insert(LinkPoint {
                bytes: x,
                seconds: x / 5.9e9,
            });
        }
        let v5 = Link {
            bandwidth: 3477443380.212728,
            latency: 1.37079e-6,
        };
        let within = |pred: f64, meas: f64| ((meas - pred) / pred).abs() < 0.2;
        // measured: bcast_device 15.38 ms (raw 222.9 ms), restore_to_device 2.81 ms
        let (raw, bc) = dp.bcast_terms(v5, 2, b, 19.109);
        assert!(
            within(bc.total(), 15.38e-3),
            "bcast {:?} {}",
            bc,
            bc.total()
        );
        assert!(within(raw.total(), 222.9e-3), "raw bcast {}", raw.total());
        let (_, rs) = dp.restore_terms(b, 19.092);
        assert!(within(rs.total(), 2.81e-3), "restore {:?}", rs);
        // unchanged: stage_to_host 6.15 ms, sendrecv 25.8 ms
        assert!(within(dp.stage_terms(b, 19.092).1.total(), 6.15e-3));
        assert!(within(dp.sendrecv_terms(v5, b, 19.092).1.total(), 25.8e-3));
    }

    #[test]
    fn predict_reduce_structure() {
        let dp = profile();
        let b = 1e9;
        // one rank: nothing to do
        assert_eq!(dp.predict_reduce(LINK, 1, b, 10.0, false), 0.0);
        // p-1 steps of compress + D2H + link + H2D + fused decompress-add on a segment, the
        // range pass, one input segment copied per step
        let (p, r) = (4usize, 8.0);
        let (seg, z) = (b / 4.0, b / 4.0 / r);
        let step = dp.compress_s(seg)
            + dp.d2h_s(z)
            + 2.0 * LINK.latency
            + z / LINK.bandwidth
            + dp.h2d_s(z)
            + dp.decompress_add_s(seg)
            + seg / dp.device_copy;
        let range = b / dp.range_pass;
        let rs = dp.reduce_terms(LINK, p, b, r, None, false);
        assert!(close(rs.total(), 3.0 * step + range));
        assert!(close(rs.device, range + 3.0 * seg / dp.device_copy));
        assert!(close(dp.predict_reduce(LINK, p, b, r, false), rs.total()));
        // the allreduce: the input copied once (not per step), then the compressed allgather
        // of one segment at the final streams' own ratio
        let rf = 5.0;
        let ar = dp.reduce_terms(LINK, p, b, r, Some(rf), false);
        let ag = dp.allgather_terms(LINK, p, seg, rf).1.total();
        let ring = 3.0 * (step - seg / dp.device_copy) + range + b / dp.device_copy;
        assert!(
            close(ar.total(), ring + ag),
            "{} vs {}",
            ar.total(),
            ring + ag
        );
        // the mean adds the division of this rank's segment
        let am = dp.reduce_terms(LINK, p, b, r, Some(rf), true);
        assert!(close(am.total() - ar.total(), seg / dp.scale_pass));
        // predict_reduce: the final streams at the ring's ratio
        let same = dp.reduce_terms(LINK, p, b, r, Some(r), false).total();
        assert!(close(dp.predict_reduce(LINK, p, b, r, true), same));
        // a worse final ratio is slower; a better ratio is never slower
        assert!(ar.total() > same);
        assert!(dp.predict_reduce(LINK, p, b, 20.0, true) <= same);
        // uncalibrated device passes are not charged
        let g = DeviceProfile::guess();
        assert_eq!(g.reduce_terms(LINK, p, b, r, Some(r), true).device, 0.0);
    }
}
