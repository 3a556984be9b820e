//! Compressed collectives on device buffers over NCCL (feature `nccl`).
//!
//! An [`NcclComm`] owns one NCCL communicator per process (rank `r` drives GPU
//! `local_rank % device_count`), bootstrapped over MPI: rank 0 creates the 128-byte NCCL unique id
//! and broadcasts it over the bootstrap [`Transport`], every rank calls `ncclCommInitRank`. The
//! same bootstrap transport carries the small host-side control messages (descriptors, compressed
//! sizes), so NCCL only moves payload bytes.
//!
//! Operations take device buffers ([`CudaSlice`] of `f32`/`f64`), follow the [`Communicator`]
//! conventions (same [`Policy`], [`ErrorBound`], [`OpStats`], same end-to-end bound split for
//! reductions) and are blocking: they return when the result is in place.
//!
//! * [`send`](NcclComm::send) / [`recv`](NcclComm::recv): compressed point to point
//!   (ncclSend/ncclRecv; the receiver learns each piece's size over the bootstrap transport);
//! * [`allgather`](NcclComm::allgather): the device allgather every transport runs
//!   (`comm::device_gather`): each rank's buffer (or each of its pieces) is compressed once, the
//!   streams go to every other rank with grouped ncclSend/ncclRecv of exactly their sizes
//!   (sizes allgathered first), and every rank decodes every stream, its own included;
//! * [`allreduce`](NcclComm::allreduce), [`allreduce_mean`](NcclComm::allreduce_mean),
//!   [`reduce_scatter`](NcclComm::reduce_scatter): the device ring every transport runs
//!   (`comm::device_ring`, also behind the loopback and the staged MPI links), with NCCL moving its
//!   compressed segments GPU to GPU (`device_link`): ring reduce-scatter, then (allreduce) the
//!   allgather of the reduced segments' streams. The input is read in place; a received partial
//!   sum is decompressed **and added in one fused kernel** into the output, and the final
//!   segment is compressed by a kernel that leaves its reconstruction in place, so no rank
//!   decodes its own stream.
//!
//! # Pipelining
//!
//! Point-to-point messages are cut into pieces (default 64 MiB uncompressed, aligned to codec
//! chunks), each compressed as its own stream. Codec kernels run on a work stream, NCCL on its
//! own stream: piece `k+1` is compressed (and piece `k-1` decompressed) while piece `k` is on
//! the wire. Cross-stream order comes from the CUDA events cudarc records on every buffer (each
//! piece has its own buffer, so waits are exact). The collectives cut their ring segments and
//! allgather buffers into the pieces the model chooses ([`Profile::ring_pieces`],
//! [`Profile::gather_pieces`]; [`NcclConfig::pieces`] fixes the count): every piece costs its
//! codec calls' fixed time and a host round (the host learns each compressed length, which the
//! size message carries), so on a fast link where the codec kernels set the time the model
//! keeps one or two pieces, and more where the wire weighs. The NCCL transfers are queued
//! after the codec stream with events, and the codec stream waits for a received piece only
//! where it reads it ([`DeviceBytes::wait_ready`](crate::comm::transport::DeviceBytes::wait_ready)).
//!
//! # Policy
//!
//! [`Policy::Auto`] predicts both paths with the calibrated [`Profile`] (raw NCCL times by
//! message size, [`Curve`], evaluated for each compressed piece at its own size; device codec
//! throughput; per-piece host overhead). If compression cannot win even
//! at an infinite ratio (NVLink: the codec kernels alone take longer than raw NCCL) raw NCCL runs
//! at once, with no sampling. Otherwise the decision uses ratios all ranks agree on, so all
//! ranks take the same path. `Auto` also chooses the codec per message: every codec the profile
//! calibrated (the policy's first) that could win at an infinite ratio is a candidate, each
//! predicted at its own agreed ratio with its own speeds, and the one rule
//! ([`choice::choose`](crate::model::choice::choose): the fastest candidate if it is predicted
//! `< 0.95 ×` raw) picks the path; [`OpStats::codec`] reports it (a receiver learns a send's
//! codec from its descriptor). Per candidate:
//!
//! * a cache of *agreed* ratios per (operation, dtype, element count, codec) answers most calls with no
//!   sampling and no extra message (every rank holds the identical value, so no exchange is
//!   needed); every 16th `Auto` call of a shape misses on all ranks alike and re-estimates, so a
//!   raw decision does not stick when the data change;
//! * on a miss every rank compresses a small device sample (up to 8 codec chunks spread over the
//!   buffer) under a bound taken from the *sample* (`noa`: the sample's own range, never wider
//!   than the buffer's, so the estimate is conservative; reductions: the per-step bound of
//!   [`reduction_step_bound`] from the sample's range and magnitude, a heuristic), and the
//!   estimates travel in the descriptor round ([`NcclConfig::check`] with one candidate; else
//!   one allgather of 8 bytes per candidate). All ranks cache their harmonic mean;
//! * only a call that then compresses computes the real bound (the full-buffer value range, for
//!   reductions allreduced over the ranks), and afterwards all ranks agree on the measured ratio
//!   (one 16-byte allgather) for the next calls. Collectives measure it per direction
//!   ([`WireRatio`]): per exchange round the larger (*major*) and the smaller (*minor*) of the
//!   messages sent and received, because a rank whose data compress worse sets everyone's time
//!   while the smaller message only shares the link for part of the round
//!   ([`Profile::exchange`]); the reported [`OpStats::ratio`] stays this rank's own.
//!
//! A raw `Auto` call therefore costs raw NCCL plus the descriptor round (none with checks off)
//! on cache hits. The caches are cleared when the bound or the policy changes.
//!
//! # Ranks without a device codec
//!
//! Whether each rank loaded its device codec is exchanged once at construction. If any rank
//! lacks it, `Auto` runs raw NCCL on every rank and `Always` fails with [`Error::Unavailable`] on
//! every rank (collectives: after the descriptor round; point to point: the sender announces the
//! failure in the descriptor, so both ends fail) — never a hang.
//!
//! # Error bound of reductions
//!
//! Exactly the rule of the MPI path ([`crate::comm`] module docs): with `p` ranks each element
//! passes `p` quantizations in allreduce (`p-1` in reduce-scatter); given the result bound `E`
//! (`abs:E`, or `noa:E` times the global value range of all inputs), `M` the largest finite
//! `|x|`, `u` the unit roundoff and `d` the divisor (1 sum, `p` mean), the rounding of the
//! additions is bounded by `R = p·u·(p·M + E·d)/d` and every quantization gets
//! `eb = (E - R)/n_q` ([`reduction_step_bound`]). Final values are identical on all ranks.
//!
//! [`Communicator`]: super::Communicator

mod auto;
mod host;
mod kernels;

use std::ops::Range;
use std::rc::Rc;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, CudaView, DevicePtr, DevicePtrMut};
use cudarc::nccl::{result as nres, sys as nsys, NcclType};

pub use host::NcclTransport;

use super::element::Real;
pub use super::reduction_step_bound;
use super::transport::{ReduceOp, Transport};
use super::{partition, Decision, OpStats};
use crate::codec::CodecKind;
use crate::error::{Error, Result};
use crate::model::{Curve, Policy, Profile, WireRatio};
use crate::quant::ErrorBound;
use auto::{f64s, Agreed, AgreedRatios, RatioKey};

mod agreement;
mod calibrate;
mod collectives;
mod comm;
mod config;
mod device_link;
mod p2p;
mod plan;
mod shared;
#[cfg(test)]
mod tests;

use agreement::*;
pub use calibrate::{CALIBRATION_SIZES, CODEC_FIELD_VALUES};
pub use comm::NcclComm;
pub use config::NcclConfig;
use p2p::*;
pub use shared::pieces;
use shared::*;

/// A scalar NCCL and the device codecs move: `f32` or `f64`.
pub trait NcclReal: Real + NcclType + crate::gpu::GpuElement + Unpin {}
impl NcclReal for f32 {}
impl NcclReal for f64 {}

pub(crate) fn gpu_err(e: impl std::fmt::Debug) -> Error {
    Error::Gpu(format!("{e:?}"))
}

fn nccl_err(what: &str, e: nres::NcclError) -> Error {
    Error::Comm(format!("NCCL {what} failed: {:?}", e.0))
}

/// Whether the CUDA driver and the NCCL library can be loaded (cudarc would panic otherwise).
pub fn nccl_available() -> bool {
    // SAFETY: these only try to dlopen the libraries.
    unsafe { cudarc::driver::sys::is_culib_present() && nsys::is_culib_present() }
}

/// The NCCL library version as `(major, minor, patch)`.
pub fn nccl_version() -> Result<(i32, i32, i32)> {
    if !nccl_available() {
        return Err(Error::Unavailable("libnccl not found".into()));
    }
    let v = nres::get_nccl_version().map_err(|e| nccl_err("ncclGetVersion", e))?;
    Ok((v / 10000, (v / 100) % 100, v % 100))
}
