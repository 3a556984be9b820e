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
//! * [`allgather`](NcclComm::allgather): every rank's compressed pieces go to every other rank
//!   with grouped ncclSend/ncclRecv of exactly their sizes (sizes allgathered first);
//! * [`allreduce`](NcclComm::allreduce), [`allreduce_mean`](NcclComm::allreduce_mean),
//!   [`reduce_scatter`](NcclComm::reduce_scatter): ring reduce-scatter over compressed pieces
//!   followed (allreduce) by the compressed allgather of the reduced segments. The receiving side
//!   decompresses **and adds in one fused kernel** straight into the accumulator
//!   (`kernels/blocked.cu`, `ACCUMULATE` instantiation), never materialising a decompressed copy.
//!
//! # Pipelining
//!
//! Each message is cut into pieces (default 64 MiB uncompressed, aligned to codec chunks), each
//! compressed as its own stream. Codec kernels run on a work stream, NCCL on its own stream:
//! piece `k+1` is compressed (and piece `k-1` decompressed) while piece `k` is on the wire.
//! Cross-stream order comes from the CUDA events cudarc records on every buffer (each piece has
//! its own buffer, so waits are exact).
//!
//! # Policy
//!
//! [`Policy::Auto`] predicts both paths with the calibrated [`NcclProfile`] (raw NCCL algorithm
//! bandwidths, device codec throughput, per-piece host overhead). If compression cannot win even
//! at an infinite ratio (NVLink: the codec kernels alone take longer than raw NCCL) raw NCCL runs
//! at once, with no sampling. Otherwise every rank estimates its ratio (previous same-shaped
//! message, else a device sample), the estimates are allgathered and all ranks take the same
//! decision (compress iff predicted `< 0.95 ×` raw).
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

mod host;
mod kernels;

use std::ops::Range;
use std::rc::Rc;
use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceRepr, ValidAsZeroBits,
};
use cudarc::nccl::{result as nres, sys as nsys, NcclType};

pub use host::NcclTransport;

use super::element::Real;
use super::transport::{ReduceOp, Transport};
use super::{partition, Decision, OpStats};
use crate::codec::CodecKind;
use crate::error::{Error, Result};
use crate::model::{CodecSpeed, Link, Policy, RatioCache};
use crate::quant::ErrorBound;

/// A scalar NCCL and the device codecs move: `f32` or `f64`.
pub trait NcclReal: Real + NcclType + DeviceRepr + ValidAsZeroBits + Unpin {}
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

/// Settings of an [`NcclComm`] (all ranks must use the same policy and bound).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct NcclConfig {
    /// When to compress.
    pub policy: Policy,
    /// Error bound (for reductions: of the result).
    pub bound: ErrorBound,
    /// Uncompressed bytes per pipeline piece (rounded to whole codec chunks).
    pub piece_bytes: usize,
    /// Exchange and check a descriptor before every operation (mismatched counts, dtypes,
    /// bounds or operations become an error on every rank instead of a hang).
    pub check: bool,
    /// Calibrate link and codec speeds at start-up (else: [`NcclProfile::guess`]).
    pub calibrate: bool,
    /// Label of the link NCCL uses (`nvlink`, `socket`, ...); `None`: from the environment
    /// (`socket` when `NCCL_P2P_DISABLE=1` and `NCCL_SHM_DISABLE=1`, else `nvlink`).
    pub transport_label: Option<String>,
}

impl NcclConfig {
    /// Default policy (`Auto(aatrox)`), 64 MiB pieces, checks and calibration on.
    pub fn new(bound: ErrorBound) -> Self {
        NcclConfig {
            policy: Policy::default(),
            bound,
            piece_bytes: 64 << 20,
            check: true,
            calibrate: true,
            transport_label: None,
        }
    }
    /// With a policy.
    pub fn with_policy(mut self, p: Policy) -> Self {
        self.policy = p;
        self
    }
    /// With a piece size (bytes).
    pub fn with_piece_bytes(mut self, b: usize) -> Self {
        self.piece_bytes = b;
        self
    }
    /// With or without start-up calibration.
    pub fn with_calibration(mut self, on: bool) -> Self {
        self.calibrate = on;
        self
    }
    /// With or without per-operation descriptor checks.
    pub fn with_check(mut self, on: bool) -> Self {
        self.check = on;
        self
    }
}

/// Calibrated speeds of the NCCL links and the device codec (identical on all ranks).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct NcclProfile {
    /// Link label (`nvlink`, `socket`).
    pub transport: String,
    /// Raw NCCL allreduce: `t = latency + bytes/bandwidth` (bytes = buffer size, algbw).
    pub allreduce: Link,
    /// Raw NCCL allgather: bytes = gathered output size.
    pub allgather: Link,
    /// Pairwise exchange (grouped ncclSend + ncclRecv of `bytes` each way).
    pub p2p: Link,
    /// Device codec speeds (f32 then f64 when calibrated).
    pub codecs: Vec<CodecSpeed>,
    /// Host cost per pipeline piece (size readback + control message), seconds.
    pub piece_overhead: f64,
}

impl NcclProfile {
    /// Guessed speeds for a link label (before calibration): NVLink ≈ 300 GB/s algbw, socket
    /// ≈ 3.5 GB/s; codec ≈ 300 GB/s.
    pub fn guess(transport: &str) -> Self {
        let bw = if transport == "socket" { 3.5e9 } else { 300e9 };
        let l = Link { bandwidth: bw, latency: 20e-6 };
        NcclProfile {
            transport: transport.to_string(),
            allreduce: l,
            allgather: l,
            p2p: l,
            codecs: Vec::new(),
            piece_overhead: 30e-6,
        }
    }

    /// Device codec throughput `(compress, decompress)` in bytes/s for `codec` on `dtype_tag`
    /// (1 f32, 2 f64); a conservative default when not calibrated.
    pub fn codec_speed(&self, codec: CodecKind, dtype_tag: u8) -> (f64, f64) {
        self.codecs
            .iter()
            .find(|c| c.codec == codec && c.dtype == dtype_tag)
            .or_else(|| self.codecs.iter().find(|c| c.dtype == dtype_tag))
            .map(|c| (c.compress, c.decompress))
            .unwrap_or((200e9, 300e9))
    }

    fn pipelined(gpu: f64, net: f64, pieces: usize, overhead: f64) -> f64 {
        let k = pieces.max(1) as f64;
        gpu.max(net) + gpu.min(net) / k + k * overhead
    }

    /// Predicted `(raw, compressed)` seconds of an allreduce of `bytes` per rank over `p` ranks
    /// at compression ratio `ratio`, with `pieces` pipeline pieces per segment
    /// (`reduce_scatter_only`: stop after the reduce-scatter).
    pub fn predict_allreduce(
        &self,
        bytes: f64,
        p: usize,
        ratio: f64,
        pieces: usize,
        codec: CodecKind,
        dtype_tag: u8,
        reduce_scatter_only: bool,
    ) -> (f64, f64) {
        let pf = p.max(1) as f64;
        let (tc, td) = self.codec_speed(codec, dtype_tag);
        let cr = ratio.max(1e-9);
        let seg = bytes / pf;
        let lk = self.p2p;
        let step = Self::pipelined(
            seg / tc + seg / td,
            pieces as f64 * lk.latency + seg / (cr * lk.bandwidth),
            pieces,
            self.piece_overhead,
        );
        let rs = (pf - 1.0) * step;
        if reduce_scatter_only {
            // NCCL's reduce-scatter moves (p-1)/p of the data of an allreduce's first half
            let raw = self.allreduce.latency + bytes / (2.0 * self.allreduce.bandwidth);
            return (raw, rs);
        }
        let ag = Self::pipelined(
            seg / tc + pf * seg / td,
            pieces as f64 * lk.latency + (pf - 1.0) * seg / (cr * lk.bandwidth),
            pieces,
            self.piece_overhead,
        );
        (self.allreduce.latency + bytes / self.allreduce.bandwidth, rs + ag)
    }

    /// Predicted `(raw, compressed)` seconds of an allgather of `bytes` per rank.
    pub fn predict_allgather(
        &self,
        bytes: f64,
        p: usize,
        ratio: f64,
        pieces: usize,
        codec: CodecKind,
        dtype_tag: u8,
    ) -> (f64, f64) {
        let pf = p.max(1) as f64;
        let (tc, td) = self.codec_speed(codec, dtype_tag);
        let cr = ratio.max(1e-9);
        let lk = self.p2p;
        let cmp = Self::pipelined(
            bytes / tc + pf * bytes / td,
            pieces as f64 * lk.latency + (pf - 1.0) * bytes / (cr * lk.bandwidth),
            pieces,
            self.piece_overhead,
        );
        (self.allgather.latency + pf * bytes / self.allgather.bandwidth, cmp)
    }

    /// Predicted `(raw, compressed)` seconds of one point-to-point message of `bytes`.
    pub fn predict_p2p(
        &self,
        bytes: f64,
        ratio: f64,
        pieces: usize,
        codec: CodecKind,
        dtype_tag: u8,
    ) -> (f64, f64) {
        let (tc, td) = self.codec_speed(codec, dtype_tag);
        let cr = ratio.max(1e-9);
        let lk = self.p2p;
        let cmp = Self::pipelined(
            bytes / tc + bytes / td,
            pieces as f64 * lk.latency + bytes / (cr * lk.bandwidth),
            pieces,
            self.piece_overhead,
        );
        (lk.latency + bytes / lk.bandwidth, cmp)
    }
}

/// The per-quantization absolute bound of a compressed reduction (the rule of the MPI path, see
/// the [module docs](self)): `e` is the absolute bound on the result, `max_abs` the largest
/// finite `|x|` over all inputs, `p` the ranks, `unit_roundoff` of the dtype, `divisor` 1 (sum)
/// or `p` (mean), `quantizations` `p` (allreduce) or `p-1` (reduce-scatter). Partial sums are
/// quantized with `eb·divisor`, the final value with `eb`. `None` when no positive bound is left.
pub fn reduction_step_bound(
    e: f64,
    max_abs: f64,
    p: usize,
    unit_roundoff: f64,
    divisor: f64,
    quantizations: usize,
) -> Option<f64> {
    let pf = p as f64;
    let m = if max_abs.is_finite() { max_abs } else { return None };
    let b = pf * m + e * divisor;
    let r = pf * unit_roundoff * b / divisor;
    let eb = (e - r) / quantizations.max(1) as f64;
    (eb.is_finite() && eb > 0.0).then_some(eb)
}

/// Split `n` elements into pipeline pieces of about `piece_elems`, on codec-chunk boundaries.
pub fn pieces(n: usize, piece_elems: usize) -> Vec<Range<usize>> {
    const CHUNK: usize = 1 << crate::codec::blocked::CHUNK_LOG2;
    let pe = piece_elems.max(CHUNK).div_ceil(CHUNK) * CHUNK;
    let k = n.div_ceil(pe).max(1);
    (0..k).map(|i| (i * pe).min(n)..((i + 1) * pe).min(n)).collect()
}

pub(crate) struct Shared {
    pub(crate) boot: Box<dyn Transport>,
    pub(crate) ctx: Arc<CudaContext>,
    /// NCCL's stream.
    pub(crate) net: Arc<CudaStream>,
    /// Codec kernels' stream.
    pub(crate) work: Arc<CudaStream>,
    /// The NCCL communicator (owned; destroyed on drop).
    pub(crate) comm: nsys::ncclComm_t,
    pub(crate) rank: usize,
    pub(crate) size: usize,
}

impl Drop for Shared {
    fn drop(&mut self) {
        let _ = self.net.synchronize();
        let _ = self.work.synchronize();
        // SAFETY: `comm` was created by ncclCommInitRank and is destroyed exactly once, after
        // both streams have drained.
        unsafe {
            let _ = nres::comm_finalize(self.comm);
            let _ = nres::comm_destroy(self.comm);
        }
    }
}

impl Shared {
    fn net_stream(&self) -> nsys::cudaStream_t {
        self.net.cu_stream() as nsys::cudaStream_t
    }

    /// ncclGroupStart / ncclGroupEnd around `f` (the group is always closed).
    fn group<R>(&self, f: impl FnOnce() -> Result<R>) -> Result<R> {
        nres::group_start().map_err(|e| nccl_err("ncclGroupStart", e))?;
        let r = f();
        let end = nres::group_end().map_err(|e| nccl_err("ncclGroupEnd", e));
        let r = r?;
        end?;
        Ok(r)
    }

    /// Enqueue ncclSend of `count` elements at device address `ptr` (inside a group or not).
    ///
    /// # Safety
    /// `ptr` must address `count` valid elements of `dt` that stay alive until the net stream
    /// has passed this operation.
    unsafe fn send_raw(&self, ptr: u64, count: usize, dt: nsys::ncclDataType_t, peer: usize) -> Result<()> {
        nres::send(ptr as *const _, count, dt, peer as i32, self.comm, self.net_stream())
            .map_err(|e| nccl_err("ncclSend", e))?;
        Ok(())
    }

    /// Enqueue ncclRecv.
    ///
    /// # Safety
    /// As [`send_raw`](Self::send_raw), for writable memory.
    unsafe fn recv_raw(&self, ptr: u64, count: usize, dt: nsys::ncclDataType_t, peer: usize) -> Result<()> {
        nres::recv(ptr as *mut _, count, dt, peer as i32, self.comm, self.net_stream())
            .map_err(|e| nccl_err("ncclRecv", e))?;
        Ok(())
    }

    fn sync(&self) -> Result<()> {
        self.net.synchronize().map_err(gpu_err)?;
        self.work.synchronize().map_err(gpu_err)
    }

    /// Raw ncclAllReduce (sum) of device buffers on the net stream.
    fn allreduce_sum<T: NcclReal, S: DevicePtr<T>, D: DevicePtrMut<T>>(&self, input: &S, out: &mut D) -> Result<()> {
        if input.len() != out.len() {
            return Err(Error::invalid("allreduce: input and output lengths differ"));
        }
        let n = input.len();
        let (src, _g1) = input.device_ptr(&self.net);
        let (dst, _g2) = out.device_ptr_mut(&self.net);
        // SAFETY: both buffers hold n elements and stay borrowed until the guards record their
        // events on the net stream (after the enqueue).
        unsafe {
            nres::all_reduce(
                src as *const _,
                dst as *mut _,
                n,
                T::as_nccl_type(),
                nsys::ncclRedOp_t::ncclSum,
                self.comm,
                self.net_stream(),
            )
        }
        .map_err(|e| nccl_err("ncclAllReduce", e))?;
        Ok(())
    }

    /// Raw ncclAllGather: `out.len() == size * input.len()`.
    fn allgather<T: NcclType, S: DevicePtr<T>, D: DevicePtrMut<T>>(&self, input: &S, out: &mut D) -> Result<()> {
        if out.len() != input.len() * self.size {
            return Err(Error::invalid("allgather: output must hold size x input elements"));
        }
        let n = input.len();
        let (src, _g1) = input.device_ptr(&self.net);
        let (dst, _g2) = out.device_ptr_mut(&self.net);
        // SAFETY: sizes checked above; guards outlive the enqueue.
        unsafe { nres::all_gather(src as *const _, dst as *mut _, n, T::as_nccl_type(), self.comm, self.net_stream()) }
            .map_err(|e| nccl_err("ncclAllGather", e))?;
        Ok(())
    }
}

const OP_SEND: u8 = 1;
const OP_RECV: u8 = 2;
const OP_ALLGATHER: u8 = 4;
const OP_ALLREDUCE: u8 = 5;
const OP_REDUCE_SCATTER: u8 = 6;
const OP_ALLREDUCE_MEAN: u8 = 8;

fn op_name(op: u8) -> &'static str {
    match op {
        OP_SEND => "send",
        OP_RECV => "recv",
        OP_ALLGATHER => "allgather",
        OP_ALLREDUCE => "allreduce",
        OP_REDUCE_SCATTER => "reduce_scatter",
        OP_ALLREDUCE_MEAN => "allreduce_mean",
        _ => "unknown",
    }
}
