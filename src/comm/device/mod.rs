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
//!   same path), with the codec chosen as below; bcast: the root decides `Auto` (codec
//!   included) with the model and its own data, and tells the others in its descriptor. `Never`
//!   moves the raw bytes.
//! * [`Communicator::allreduce_device`] / [`Communicator::allreduce_mean_device`] /
//!   [`Communicator::reduce_scatter_device`], compressed (`Always`, or `Auto` when the model
//!   predicts it faster): the device-resident ring of [`crate::comm::device_ring`] (one
//!   algorithm for every device transport) over a staged link (`StagedLink`): each ring message is copied
//!   D2H into the stager's reused pinned send buffer, its length and bytes cross the transport
//!   (`sendrecv_sized` into the pinned receive buffer, pairwise exchanges for the final
//!   streams), and it is copied H2D into a pooled device buffer. The global value range comes
//!   from a GPU range pass and the descriptor agreement; the per-quantization bound is the host
//!   path's [`reduction_step_bound`](super::reduction_step_bound) (`p` quantizations for the
//!   allreduces, `p-1` for reduce-scatter; partial sums at `eb·divisor`, the final value at
//!   `eb`). The input is read in place: the first addition to a segment writes
//!   `input + decoded` into the accumulator (`out` for the allreduces) with one fused kernel.
//!   The allreduces then divide this rank's segment by `p` (mean, IEEE division on the
//!   device), compress it once and gather the compressed segments; every rank decompresses
//!   every segment (its own too: identical results on all ranks). The order of operations is
//!   the host ring's, so the results equal the host path's with the same codec. A failure on
//!   one rank travels through the ring as empty messages and fails every rank
//!   together (the ring module `comm::ring`). `Never`, `Auto` deciding raw, `rel` bounds, one rank, fewer values than ranks
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
//! # `Auto`: the codec per message
//!
//! Under `Policy::Auto(preferred)` every staged device operation chooses the codec per message
//! among the codecs the device profile calibrated (`preferred` first; [`Profile::gpu_codecs`]),
//! by the one rule [`Profile::choose_staged`] ([`model::choice::choose`]): each candidate that
//! could beat raw at an infinite ratio is predicted with its own GPU call lines
//! ([`Profile::staged`]) at its ratio estimate, the ratio remembered for the message
//! stream and codec (refreshed after a few uses), else a GPU sample of a few codec chunks
//! (`DeviceStager::sample_ratio`). `sendrecv_device` decides per outgoing message and the
//! broadcast's root for everyone; the allgather and the device ring agree on the harmonic mean
//! of the ranks' estimates (one small reduction), and the ring on the choice itself. The chosen
//! codec is reported in [`OpStats::codec`].
//!
//! # Model and calibration
//!
//! Every operation fills [`OpStats`]'s predictions from a [`Profile`] measured by
//! [`DeviceStager::calibrate`]: GPU codec throughput (warm-up, then the median of
//! [`CALIBRATION_REPS`] repetitions on a field of at least 64 MiB, every rank at once) and pinned
//! staging times at several sizes ([`StagingCurve`], interpolated; compressed streams are
//! predicted at their own, smaller size). Composed operations add the two staging copies to the
//! host operation's prediction; the device ring is predicted by
//! [`StagedModel::predict_reduce`].
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
//!   ([`StagedModel::decompress_after_upload_s`]). With `s = 1` this is `max(solo, shared)`.
//!   After a joint exchange (`sendrecv_device`, `allgather_device`, the ring steps) every rank
//!   leaves the MPI call at once and the calls measured at the shared rate (below): shared.
//!
//! The staging example (`examples/staging`) runs every operation on a GPU and prints the
//! measured stages next to these predictions, which is how the rules above were checked.
//!
//! Complex device buffers are passed as their interleaved real scalars (`2n` f32/f64 values).

use std::sync::Mutex;

use cudarc::driver::{
    result as cu, CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut,
    PinnedHostSlice,
};

use super::{
    element::Real,
    nonblocking::{run_into, IntoOp},
    transport::{OwnedBytes, PendingBuf},
    Communicator, Compressor, Decision, Desc, OpRequest, OpStats, ReduceOp, Swapped, OP_SENDRECV,
};
use crate::codec::CodecKind;
use crate::error::{Error, Result};
use crate::format::Dtype;
use crate::gpu::{GpuCodec, GpuElement};
use crate::model::{
    self, Curve, Link, Policy, Profile, StagedModel, StagingCurve, StagingPoint, Terms,
};
use crate::quant::ErrorBound;

mod auto;
mod calibrate;
mod gather;
mod nonblocking;
mod p2p;
mod reduce;
mod staged_link;
mod stager;
#[cfg(test)]
mod tests;

pub use super::link_calibrate::{CALIBRATION_REPS, CALIBRATION_WARMUP};
pub use calibrate::{CALIBRATION_LINK_MIB, CALIBRATION_MIN_VALUES, CALIBRATION_TINY_VALUES};
pub use gather::{DeviceAllgatherRequest, DeviceBcastRequest};
pub use nonblocking::DeviceRequest;
use reduce::*;
#[cfg(feature = "nccl")]
pub(crate) use stager::device_sample;
use stager::*;
pub use stager::{DeviceStager, StageTimes};

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

fn elem_tag<T: Real>() -> u8 {
    match T::DTYPE {
        Dtype::F32 => 1,
        Dtype::F64 => 2,
    }
}
