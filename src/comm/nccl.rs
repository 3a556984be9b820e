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
//! [`Policy::Auto`] predicts both paths with the calibrated [`NcclProfile`] (raw NCCL times by
//! message size, [`NcclLink`], evaluated for each compressed piece at its own size; device codec
//! throughput; per-piece host overhead). If compression cannot win even
//! at an infinite ratio (NVLink: the codec kernels alone take longer than raw NCCL) raw NCCL runs
//! at once, with no sampling. Otherwise the decision (compress iff predicted `< 0.95 ×` raw) uses
//! a ratio all ranks agree on, so all ranks take the same path:
//!
//! * a cache of *agreed* ratios per (operation, dtype, element count) answers most calls with no
//!   sampling and no extra message (every rank holds the identical value, so no exchange is
//!   needed); every 16th `Auto` call of a shape misses on all ranks alike and re-estimates, so a
//!   raw decision does not stick when the data change;
//! * on a miss every rank compresses a small device sample (up to 8 codec chunks spread over the
//!   buffer) under a bound taken from the *sample* (`noa`: the sample's own range, never wider
//!   than the buffer's, so the estimate is conservative; reductions: the per-step bound of
//!   [`reduction_step_bound`] from the sample's range and magnitude, a heuristic), and the
//!   estimates travel in the descriptor round ([`NcclConfig::check`]; else one 8-byte allgather).
//!   All ranks cache their harmonic mean;
//! * only a call that then compresses computes the real bound (the full-buffer value range, for
//!   reductions allreduced over the ranks), and afterwards all ranks agree on the measured ratio
//!   (one 16-byte allgather) for the next calls. Collectives measure it per direction
//!   ([`WireRatio`]): per exchange round the larger (*major*) and the smaller (*minor*) of the
//!   messages sent and received, because a rank whose data compress worse sets everyone's time
//!   while the smaller message only shares the link for part of the round
//!   ([`NcclProfile::exchange`]); the reported [`OpStats::ratio`] stays this rank's own.
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
mod link;

use std::ops::Range;
use std::rc::Rc;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, CudaView, DevicePtr, DevicePtrMut};
use cudarc::nccl::{result as nres, sys as nsys, NcclType};

pub use host::NcclTransport;
pub use link::NcclLink;

use super::element::Real;
pub use super::reduction_step_bound;
use super::transport::{ReduceOp, Transport};
use super::{partition, Decision, OpStats};
use crate::codec::CodecKind;
use crate::error::{Error, Result};
use crate::model::{CodecSpeed, Policy};
use crate::quant::ErrorBound;
use auto::{f64s, Agreed, AgreedRatios, RatioKey};

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

/// Compression ratios (moved bytes / wire bytes) of the two directions of the exchanges of a
/// compressed operation: `major` for the larger message of each exchange (per step the
/// direction that finishes last), `minor` for the smaller one (`minor >= major`). A plain ratio
/// converts to the symmetric pair (both directions alike).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct WireRatio {
    /// Ratio of the larger message of every exchange.
    pub major: f64,
    /// Ratio of the smaller message of every exchange (`f64::MAX`: nothing comes back).
    pub minor: f64,
}

impl From<f64> for WireRatio {
    fn from(r: f64) -> Self {
        WireRatio { major: r, minor: r }
    }
}

impl WireRatio {
    /// `(major, minor)` made usable: positive, `minor >= major`.
    fn sane(self) -> (f64, f64) {
        let major = if self.major > 0.0 { self.major } else { 1e-9 };
        let minor = if self.minor.is_nan() {
            major
        } else {
            self.minor.max(major)
        };
        (major, minor)
    }
}

/// Calibrated speeds of the NCCL links and the device codec (identical on all ranks).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct NcclProfile {
    /// Link label (`nvlink`, `socket`).
    pub transport: String,
    /// Raw NCCL allreduce: time by buffer size (calibrated at several sizes and interpolated,
    /// [`NcclLink`]; `latency + bytes/bandwidth` in profiles without points).
    pub allreduce: NcclLink,
    /// Raw NCCL allgather: time by gathered output size.
    pub allgather: NcclLink,
    /// Pairwise exchange (grouped ncclSend + ncclRecv of `bytes` each way): time by message
    /// size, evaluated at each compressed piece's size by the predictions.
    pub p2p: NcclLink,
    /// One-way message (ncclSend on one rank, ncclRecv on its peer, nothing coming back): time
    /// by message size. `None` in profiles written before it was calibrated: then [`p2p`]
    /// (both directions loaded) stands in.
    ///
    /// [`p2p`]: Self::p2p
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p2p_one: Option<NcclLink>,
    /// Device codec speeds (f32 then f64 when calibrated).
    pub codecs: Vec<CodecSpeed>,
    /// Host cost per pipeline piece (the size message round on the bootstrap transport), seconds.
    pub piece_overhead: f64,
    /// Fixed cost of one device compression call (launches, size readback, header), seconds.
    #[serde(default)]
    pub compress_fixed: f64,
    /// Fixed cost of one device decompression call (header readback, launch, error flag).
    #[serde(default)]
    pub decompress_fixed: f64,
    /// Input bytes per second of the value-range pass a compressing call makes over its input
    /// (launch and readback included, calibrated at 64 MiB); `0`: not calibrated, no cost.
    #[serde(default)]
    pub range_rate: f64,
    /// Bytes per second of a device-to-device copy (a compressing reduction copies its input
    /// into the accumulator first); `0`: not calibrated, no cost.
    #[serde(default)]
    pub copy_rate: f64,
}

/// Seconds of `bytes` at `rate` bytes/s (`0` or less: not calibrated, no cost).
fn at_rate(bytes: f64, rate: f64) -> f64 {
    if rate > 0.0 {
        bytes / rate
    } else {
        0.0
    }
}

impl NcclProfile {
    /// Guessed speeds for a link label (before calibration): NVLink ≈ 300 GB/s algbw, socket
    /// ≈ 3.5 GB/s; codec ≈ 300 GB/s.
    pub fn guess(transport: &str) -> Self {
        let bw = if transport == "socket" { 3.5e9 } else { 300e9 };
        let l = NcclLink::linear(bw, 20e-6);
        NcclProfile {
            transport: transport.to_string(),
            allreduce: l.clone(),
            allgather: l.clone(),
            p2p: l,
            p2p_one: None,
            codecs: Vec::new(),
            piece_overhead: 5e-6,
            compress_fixed: 50e-6,
            decompress_fixed: 50e-6,
            range_rate: 0.0,
            copy_rate: 0.0,
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

    /// The one-way link ([`p2p_one`](Self::p2p_one), else the pairwise curve).
    pub fn one_way(&self) -> &NcclLink {
        self.p2p_one.as_ref().unwrap_or(&self.p2p)
    }

    /// Seconds of one exchange round in which this rank's `peers` exchanges carry `major` bytes
    /// in one direction and `minor <= major` bytes in the other, all at once: while both
    /// directions move, the pairwise curve at `minor` ([`p2p`](Self::p2p)); the rest of the
    /// larger message alone, on the one-way curve (`one(major) - one(minor)`). Symmetric
    /// messages: the pairwise curve; nothing coming back: the one-way curve.
    pub fn exchange(&self, major: f64, minor: f64, peers: f64) -> f64 {
        let minor = minor.clamp(0.0, major.max(0.0));
        let one = self.one_way();
        let solo = (one.time_many(major, peers) - one.time_many(minor, peers)).max(0.0);
        self.p2p.time_many(minor, peers) + solo
    }

    /// Seconds of a pipelined round of `k` pieces, each passing the codec stage `gpu` (the
    /// codec stream and the host, which blocks on every codec call: compress, size message,
    /// decompress) and the network stage `net`: the first piece passes both, then every further
    /// piece costs the slower stage (piece `j` is on the wire while `j+1` is compressed and
    /// `j-1` decompressed).
    fn pipeline(gpu: f64, net: f64, k: f64) -> f64 {
        gpu + net + (k - 1.0).max(0.0) * gpu.max(net)
    }

    /// Predicted `(raw, compressed)` seconds of an allreduce of `bytes` per rank over `p` ranks
    /// at compression ratios `ratio` ([`WireRatio`]; a plain `f64` for both directions alike),
    /// with `pieces` pipeline pieces per segment (`reduce_scatter_only`: stop after the
    /// reduce-scatter).
    ///
    /// Compressed: the preparation (value-range pass, input copy), then `p-1` ring steps and
    /// (allreduce) one allgather round, each pipelined over `pieces` (`g + n + (k-1) max(g, n)` per round): per
    /// piece the codec stage (compress + fixed + size message, decompress-and-add + fixed; the
    /// allgather round decompresses `p` pieces) and the network stage
    /// ([`exchange`](Self::exchange) of the pieces' compressed sizes, `bytes / p / pieces /
    /// ratio`). Raw: the allreduce curve at `bytes`.
    #[allow(clippy::too_many_arguments)]
    pub fn predict_allreduce(
        &self,
        bytes: f64,
        p: usize,
        ratio: impl Into<WireRatio>,
        pieces: usize,
        codec: CodecKind,
        dtype_tag: u8,
        reduce_scatter_only: bool,
    ) -> (f64, f64) {
        let pf = p.max(1) as f64;
        let (tc, td) = self.codec_speed(codec, dtype_tag);
        let (major, minor) = ratio.into().sane();
        let k = pieces.max(1) as f64;
        let piece = bytes / pf / k;
        let comp = piece / tc + self.compress_fixed + self.piece_overhead;
        let dec = piece / td + self.decompress_fixed;
        let net = self.exchange(piece / major, piece / minor, 1.0);
        let prep =
            at_rate(bytes, self.range_rate) + self.piece_overhead + at_rate(bytes, self.copy_rate);
        let rs = (pf - 1.0) * Self::pipeline(comp + dec, net, k);
        if reduce_scatter_only {
            // NCCL's reduce-scatter moves (p-1)/p of the data of an allreduce's first half
            let raw = self.allreduce.time_many(bytes, 0.5);
            return (raw, prep + rs);
        }
        // each piece goes to the p-1 other ranks in one grouped round
        let net = self.exchange(piece / major, piece / minor, pf - 1.0);
        let ag = Self::pipeline(comp + pf * dec, net, k);
        (self.allreduce.time(bytes), prep + rs + ag)
    }

    /// Predicted `(raw, compressed)` seconds of an allgather of `bytes` per rank (compressed:
    /// the value-range pass, then one pipelined round of `pieces` pieces of
    /// `bytes / pieces / ratio` to every other rank, `p` decompressions per piece; raw: the
    /// allgather curve at `p × bytes`).
    pub fn predict_allgather(
        &self,
        bytes: f64,
        p: usize,
        ratio: impl Into<WireRatio>,
        pieces: usize,
        codec: CodecKind,
        dtype_tag: u8,
    ) -> (f64, f64) {
        let pf = p.max(1) as f64;
        let (tc, td) = self.codec_speed(codec, dtype_tag);
        let (major, minor) = ratio.into().sane();
        let k = pieces.max(1) as f64;
        let piece = bytes / k;
        let gpu = piece / tc
            + self.compress_fixed
            + self.piece_overhead
            + pf * (piece / td + self.decompress_fixed);
        let net = self.exchange(piece / major, piece / minor, pf - 1.0);
        let cmp = at_rate(bytes, self.range_rate) + Self::pipeline(gpu, net, k);
        (self.allgather.time(pf * bytes), cmp)
    }

    /// Predicted `(raw, compressed)` seconds of one point-to-point message of `bytes`, one way
    /// ([`one_way`](Self::one_way) curve; compressed: the value-range pass, then `pieces`
    /// pipelined messages of `bytes / pieces / ratio`).
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
        let k = pieces.max(1) as f64;
        let piece = bytes / k;
        let lk = self.one_way();
        let gpu = piece / tc
            + self.compress_fixed
            + self.piece_overhead
            + piece / td
            + self.decompress_fixed;
        let cmp = at_rate(bytes, self.range_rate) + Self::pipeline(gpu, lk.time(piece / cr), k);
        (lk.time(bytes), cmp)
    }
}

/// Compressed bytes of one operation: what this rank sent, and per exchange round the larger
/// (`critical`) and the smaller (`minor`) of the messages in its two directions (what it sends
/// and what it receives; allgather rounds: the largest and the smallest piece of any rank),
/// summed, in the same units as `sent` (times the peers). Equal when every rank compresses
/// alike; apart when one rank's data compress worse (its pieces keep one direction busy after
/// the other has finished).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Wire {
    sent: usize,
    critical: usize,
    minor: usize,
}

impl std::ops::AddAssign for Wire {
    fn add_assign(&mut self, o: Wire) {
        self.sent += o.sent;
        self.critical += o.critical;
        self.minor += o.minor;
    }
}

impl Wire {
    /// The ratios of the two directions for `moved` uncompressed bytes.
    fn ratios(&self, moved: f64) -> WireRatio {
        WireRatio {
            major: moved / self.critical.max(1) as f64,
            minor: moved / self.minor.max(1) as f64,
        }
    }
}

/// Split `n` elements into pipeline pieces of about `piece_elems`, on codec-chunk boundaries.
pub fn pieces(n: usize, piece_elems: usize) -> Vec<Range<usize>> {
    const CHUNK: usize = 1 << crate::codec::blocked::CHUNK_LOG2;
    let pe = piece_elems.max(CHUNK).div_ceil(CHUNK) * CHUNK;
    let k = n.div_ceil(pe).max(1);
    (0..k)
        .map(|i| (i * pe).min(n)..((i + 1) * pe).min(n))
        .collect()
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
        // Every operation is blocking, so nothing is normally in flight here. Abort (rather
        // than synchronize + finalize) so that a rank leaving on an error, with a peer gone or
        // an operation half-posted, never hangs its own teardown or waits for other ranks.
        // SAFETY: `comm` was created by ncclCommInitRank and is released exactly once.
        unsafe {
            let _ = nres::comm_abort(self.comm);
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
    unsafe fn send_raw(
        &self,
        ptr: u64,
        count: usize,
        dt: nsys::ncclDataType_t,
        peer: usize,
    ) -> Result<()> {
        nres::send(
            ptr as *const _,
            count,
            dt,
            peer as i32,
            self.comm,
            self.net_stream(),
        )
        .map_err(|e| nccl_err("ncclSend", e))?;
        Ok(())
    }

    /// Enqueue ncclRecv.
    ///
    /// # Safety
    /// As [`send_raw`](Self::send_raw), for writable memory.
    unsafe fn recv_raw(
        &self,
        ptr: u64,
        count: usize,
        dt: nsys::ncclDataType_t,
        peer: usize,
    ) -> Result<()> {
        nres::recv(
            ptr as *mut _,
            count,
            dt,
            peer as i32,
            self.comm,
            self.net_stream(),
        )
        .map_err(|e| nccl_err("ncclRecv", e))?;
        Ok(())
    }

    fn sync(&self) -> Result<()> {
        self.net.synchronize().map_err(gpu_err)?;
        self.work.synchronize().map_err(gpu_err)
    }

    /// Raw ncclAllReduce (sum) of device buffers on the net stream.
    fn allreduce_sum<T: NcclReal, S: DevicePtr<T>, D: DevicePtrMut<T>>(
        &self,
        input: &S,
        out: &mut D,
    ) -> Result<()> {
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
    fn allgather<T: NcclType, S: DevicePtr<T>, D: DevicePtrMut<T>>(
        &self,
        input: &S,
        out: &mut D,
    ) -> Result<()> {
        if out.len() != input.len() * self.size {
            return Err(Error::invalid(
                "allgather: output must hold size x input elements",
            ));
        }
        let n = input.len();
        let (src, _g1) = input.device_ptr(&self.net);
        let (dst, _g2) = out.device_ptr_mut(&self.net);
        // SAFETY: sizes checked above; guards outlive the enqueue.
        unsafe {
            nres::all_gather(
                src as *const _,
                dst as *mut _,
                n,
                T::as_nccl_type(),
                self.comm,
                self.net_stream(),
            )
        }
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

/// Reusable per-piece device buffers (each piece has its own allocation, so the CUDA events
/// cudarc records per buffer order exactly the streams that touch that piece).
#[derive(Default)]
struct Pool {
    bufs: Vec<CudaSlice<u8>>,
}

impl Pool {
    /// Make sure buffers `0..count` exist with at least `bytes` bytes each.
    fn ensure(&mut self, stream: &Arc<CudaStream>, count: usize, bytes: usize) -> Result<()> {
        let bytes = bytes.max(256).div_ceil(256) * 256;
        let mut grew = false;
        for i in 0..count {
            if i < self.bufs.len() && self.bufs[i].len() >= bytes {
                continue;
            }
            // SAFETY: u8 device memory; every byte read is written first (compressed streams
            // are read only up to their length).
            let b = unsafe { stream.alloc::<u8>(bytes) }.map_err(|e| {
                Error::OutOfMemory(format!("{bytes} device bytes for NCCL pieces: {e:?}"))
            })?;
            grew = true;
            if i < self.bufs.len() {
                self.bufs[i] = b;
            } else {
                self.bufs.push(b);
            }
        }
        if grew {
            // stream-ordered allocations must be complete before other streams use them
            stream.synchronize().map_err(gpu_err)?;
        }
        Ok(())
    }
}

const DESC_MAGIC: u32 = 0x4e43_435a; // "ZCCN"
const DESC_LEN: usize = 48;

#[derive(Debug, Clone, Copy, PartialEq)]
struct Desc {
    op: u8,
    dtype: u8,
    policy: u8,
    mode: u8,
    decision: u8,
    bound: f64,
    count: u64,
    seq: u64,
    ratio: f64,
}

impl Desc {
    fn to_bytes(self) -> [u8; DESC_LEN] {
        let mut b = [0u8; DESC_LEN];
        b[0..4].copy_from_slice(&DESC_MAGIC.to_le_bytes());
        b[4] = self.op;
        b[5] = self.dtype;
        b[6] = self.policy;
        b[7] = self.mode;
        b[8] = self.decision;
        b[16..24].copy_from_slice(&self.bound.to_le_bytes());
        b[24..32].copy_from_slice(&self.count.to_le_bytes());
        b[32..40].copy_from_slice(&self.seq.to_le_bytes());
        b[40..48].copy_from_slice(&self.ratio.to_le_bytes());
        b
    }
    fn parse(b: &[u8]) -> Result<Self> {
        if b.len() != DESC_LEN || b[0..4] != DESC_MAGIC.to_le_bytes() {
            return Err(Error::Comm(
                "malformed NCCL descriptor from a peer: the ranks are not running the same operation".into(),
            ));
        }
        let f = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        Ok(Desc {
            op: b[4],
            dtype: b[5],
            policy: b[6],
            mode: b[7],
            decision: b[8],
            bound: f64::from_bits(f(16)),
            count: f(24),
            seq: f(32),
            ratio: f64::from_bits(f(40)),
        })
    }
    /// Same operation? (`Ok` on every rank iff all descriptors agree.)
    fn check(&self, other: &Desc, me: usize, who: usize) -> Result<()> {
        let mm = |what: &'static str, a: String, b: String| Error::Mismatch {
            what,
            expected: format!("{a} (rank {me})"),
            found: format!("{b} (rank {who})"),
        };
        if self.op != other.op || self.seq != other.seq {
            return Err(mm(
                "NCCL operation",
                format!("{} #{}", op_name(self.op), self.seq),
                format!("{} #{}", op_name(other.op), other.seq),
            ));
        }
        if self.dtype != other.dtype {
            return Err(mm("dtype", self.dtype.to_string(), other.dtype.to_string()));
        }
        if self.count != other.count {
            return Err(mm(
                "element count",
                self.count.to_string(),
                other.count.to_string(),
            ));
        }
        if self.policy != other.policy {
            return Err(mm(
                "policy/codec",
                self.policy.to_string(),
                other.policy.to_string(),
            ));
        }
        if self.mode != other.mode || self.bound.to_bits() != other.bound.to_bits() {
            return Err(mm(
                "error bound",
                format!("{}:{:e}", self.mode, self.bound),
                format!("{}:{:e}", other.mode, other.bound),
            ));
        }
        Ok(())
    }
}

fn local_rank(rank: usize) -> usize {
    for k in [
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "MPI_LOCALRANKID",
        "SLURM_LOCALID",
        "LOCAL_RANK",
    ] {
        if let Some(v) = std::env::var(k).ok().and_then(|v| v.parse().ok()) {
            return v;
        }
    }
    rank
}

fn transport_label_from_env() -> String {
    let on = |k: &str| std::env::var(k).map(|v| v.trim() == "1").unwrap_or(false);
    if on("NCCL_P2P_DISABLE") && on("NCCL_SHM_DISABLE") {
        "socket".into()
    } else {
        "nvlink".into()
    }
}

/// Compressed collectives on device buffers over NCCL. See the [module docs](self).
pub struct NcclComm {
    sh: Rc<Shared>,
    gpu: Option<crate::gpu::GpuCodec>,
    gpu_error: String,
    utils: kernels::Utils,
    config: NcclConfig,
    profile: NcclProfile,
    /// Agreed `Auto` ratios of collectives (identical on all ranks, see [`auto`]).
    ratios: AgreedRatios,
    /// The ratios of both directions of this rank's last compressed collective.
    last_ratios: Option<WireRatio>,
    /// `Auto` ratios of this rank's sends (the sender alone decides a point-to-point message).
    p2p_ratios: AgreedRatios,
    /// Whether each rank loaded its device codec (exchanged at construction).
    codec_ranks: Vec<bool>,
    seq: u64,
    send_pool: Pool,
    recv_pool: Pool,
    device_name: String,
    ordinal: usize,
    _universe: Option<mpi::environment::Universe>,
}

impl std::fmt::Debug for NcclComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "NcclComm(rank {} of {}, GPU {} {}, {}, {}, {})",
            self.sh.rank,
            self.sh.size,
            self.ordinal,
            self.device_name,
            self.profile.transport,
            self.config.policy,
            self.config.bound
        )
    }
}

impl NcclComm {
    /// Initialize MPI (if needed) and build over a duplicate of `MPI_COMM_WORLD`. Collective.
    pub fn init(config: NcclConfig) -> Result<Self> {
        let universe = mpi::initialize();
        let world = mpi::topology::SimpleCommunicator::world();
        let boot = super::MpiTransport::new(&world);
        let mut c = Self::new(Box::new(boot), config)?;
        c._universe = universe;
        Ok(c)
    }

    /// Build over a bootstrap transport (MPI): checks every rank has the CUDA driver, a device
    /// and NCCL (else [`Error::Unavailable`] on every rank), opens GPU `local_rank % devices`,
    /// creates the NCCL communicator from a unique id broadcast by rank 0, loads the kernels
    /// and (if configured) calibrates. Collective over the transport's ranks.
    pub fn new(boot: Box<dyn Transport>, config: NcclConfig) -> Result<Self> {
        config.bound.validate()?;
        let (rank, size) = (boot.rank(), boot.size());
        // 1. every rank must be able to run NCCL, or nobody starts (no hang on a broadcast)
        let mut why = String::new();
        let mut devices = 0usize;
        if !nccl_available() {
            why = "CUDA driver or libnccl not found".into();
        } else {
            match CudaContext::device_count() {
                Ok(n) if n > 0 => devices = n as usize,
                Ok(_) => why = "no CUDA device".into(),
                Err(e) => why = format!("no CUDA device: {e:?}"),
            }
        }
        let mut ok = [if why.is_empty() { 1.0 } else { 0.0 }];
        boot.allreduce_f64(&mut ok, ReduceOp::Min)?;
        if ok[0] < 1.0 {
            let msg = if why.is_empty() {
                "another rank has no CUDA device or NCCL".to_string()
            } else {
                why
            };
            return Err(Error::Unavailable(format!("NCCL transport: {msg}")));
        }
        let ordinal = local_rank(rank) % devices;
        let ctx = CudaContext::new(ordinal).map_err(gpu_err)?;
        ctx.bind_to_thread().map_err(gpu_err)?;
        let net = ctx.new_stream().map_err(gpu_err)?;
        let work = ctx.new_stream().map_err(gpu_err)?;
        // 2. unique id from rank 0 over the bootstrap transport
        let mut idb = if rank == 0 {
            let id = nres::get_uniqueid().map_err(|e| nccl_err("ncclGetUniqueId", e));
            match id {
                Ok(id) => id.internal.iter().map(|&c| c as u8).collect::<Vec<u8>>(),
                Err(_) => Vec::new(), // empty: tells the others to give up
            }
        } else {
            Vec::new()
        };
        boot.bcast(0, &mut idb)?;
        if idb.len() != 128 {
            return Err(Error::Comm(
                "NCCL unique id could not be created on rank 0".into(),
            ));
        }
        let mut internal = [0 as std::ffi::c_char; 128];
        for (d, &s) in internal.iter_mut().zip(&idb) {
            *d = s as std::ffi::c_char;
        }
        let id = nsys::ncclUniqueId { internal };
        let mut comm = std::mem::MaybeUninit::uninit();
        // SAFETY: out-parameter; all ranks call with the same id and size; the device is bound.
        unsafe { nres::comm_init_rank(comm.as_mut_ptr(), size as i32, id, rank as i32) }
            .map_err(|e| nccl_err("ncclCommInitRank", e))?;
        // SAFETY: initialized by the successful call above.
        let comm = unsafe { comm.assume_init() };
        let device_name = ctx.name().unwrap_or_default();
        let sh = Rc::new(Shared {
            boot,
            ctx,
            net,
            work,
            comm,
            rank,
            size,
        });
        let utils = kernels::Utils::load(&sh.work)?;
        let (gpu, gpu_error) = match crate::gpu::GpuCodec::new(ordinal) {
            Ok(g) => (Some(g), String::new()),
            Err(e) => {
                tracing::warn!(target: "zcomm::nccl", "GPU codec unavailable, NCCL runs raw only: {e}");
                (None, e.to_string())
            }
        };
        // every rank learns which ranks can run the codec (so Auto/Always decide alike)
        let codec_ranks: Vec<bool> = sh
            .boot
            .allgather_fixed(&[u8::from(gpu.is_some())])?
            .iter()
            .map(|&b| b != 0)
            .collect();
        if codec_ranks.len() != size {
            return Err(Error::Comm(format!(
                "codec availability from {} ranks, expected {size}",
                codec_ranks.len()
            )));
        }
        let label = config
            .transport_label
            .clone()
            .unwrap_or_else(transport_label_from_env);
        let mut c = NcclComm {
            sh,
            gpu,
            gpu_error,
            utils,
            profile: NcclProfile::guess(&label),
            config,
            ratios: AgreedRatios::default(),
            last_ratios: None,
            p2p_ratios: AgreedRatios::default(),
            codec_ranks,
            seq: 0,
            send_pool: Pool::default(),
            recv_pool: Pool::default(),
            device_name,
            ordinal,
            _universe: None,
        };
        if c.config.calibrate {
            c.calibrate()?;
        }
        Ok(c)
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.sh.rank
    }
    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.sh.size
    }
    /// The device ordinal this rank drives.
    pub fn device_ordinal(&self) -> usize {
        self.ordinal
    }
    /// The device's name.
    pub fn device_name(&self) -> &str {
        &self.device_name
    }
    /// The CUDA context (allocate buffers for the operations from it).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.sh.ctx
    }
    /// The stream for callers' own work (the codec stream; operations order against it).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.sh.work
    }
    /// The bootstrap (MPI) transport carrying control messages.
    pub fn bootstrap(&self) -> &dyn Transport {
        &*self.sh.boot
    }
    /// A [`Transport`] moving host byte messages over this NCCL communicator (staged through
    /// device memory), for a host-buffer [`Communicator`](super::Communicator).
    pub fn host_transport(&self) -> NcclTransport {
        NcclTransport::new(self.sh.clone())
    }
    /// The configuration.
    pub fn config(&self) -> &NcclConfig {
        &self.config
    }
    /// Change the policy (all ranks alike; a different policy forgets the `Auto` ratio caches).
    pub fn set_policy(&mut self, p: Policy) {
        if p != self.config.policy {
            self.ratios.clear();
            self.p2p_ratios.clear();
        }
        self.config.policy = p;
    }
    /// Change the bound (all ranks alike; a different bound forgets the `Auto` ratio caches).
    pub fn set_bound(&mut self, b: ErrorBound) -> Result<()> {
        b.validate()?;
        if b != self.config.bound {
            self.ratios.clear();
            self.p2p_ratios.clear();
        }
        self.config.bound = b;
        Ok(())
    }
    /// Change the pipeline piece size (bytes; all ranks alike).
    pub fn set_piece_bytes(&mut self, b: usize) {
        self.config.piece_bytes = b;
    }
    /// The compression ratios of both directions ([`WireRatio`]) this rank measured in its
    /// last compressed collective (what its prediction used); `None` before the first.
    pub fn last_ratios(&self) -> Option<WireRatio> {
        self.last_ratios
    }
    /// The calibration profile in use (identical on all ranks).
    pub fn profile(&self) -> &NcclProfile {
        &self.profile
    }
    /// Replace the profile (all ranks alike).
    pub fn set_profile(&mut self, p: NcclProfile) {
        self.profile = p;
    }
    /// Whether this rank's device codec is loaded.
    pub fn has_codec(&self) -> bool {
        self.gpu.is_some()
    }
    /// Whether every rank loaded its device codec (else collectives under `Auto` run raw NCCL
    /// and under `Always` fail on every rank; identical on all ranks).
    pub fn codec_on_all_ranks(&self) -> bool {
        self.codec_ranks.iter().all(|&b| b)
    }
    /// The ranks without a device codec, for error messages.
    fn codec_missing_msg(&self, ranks: &[usize]) -> String {
        let missing: Vec<String> = ranks
            .iter()
            .filter(|&&j| !self.codec_ranks.get(j).copied().unwrap_or(false))
            .map(|j| j.to_string())
            .collect();
        let mut m = format!("GPU codec unavailable on rank(s) {}", missing.join(", "));
        if self.gpu.is_none() {
            m.push_str(&format!(" (here: {})", self.gpu_error));
        }
        m
    }
    /// Synchronize this rank's NCCL and codec streams.
    pub fn synchronize(&self) -> Result<()> {
        self.sh.sync()?;
        if let Some(g) = &self.gpu {
            g.stream().synchronize().map_err(gpu_err)?;
        }
        Ok(())
    }
    /// Synchronize all ranks (MPI barrier after draining this rank's streams).
    pub fn barrier(&self) -> Result<()> {
        self.synchronize()?;
        self.sh.boot.barrier()
    }
    /// Wall-clock seconds (the bootstrap transport's clock).
    pub fn wtime(&self) -> f64 {
        self.sh.boot.wtime()
    }

    // ------------------------------------------------------------------ raw NCCL

    /// Raw ncclAllReduce (sum) of `input` into `out` (same length); blocking.
    pub fn raw_allreduce<T: NcclReal>(
        &self,
        input: &CudaSlice<T>,
        out: &mut CudaSlice<T>,
    ) -> Result<()> {
        self.sh.allreduce_sum(input, out)?;
        self.sh.net.synchronize().map_err(gpu_err)
    }

    /// Raw ncclAllGather (`out.len() == size * input.len()`, rank order); blocking.
    pub fn raw_allgather<T: NcclReal>(
        &self,
        input: &CudaSlice<T>,
        out: &mut CudaSlice<T>,
    ) -> Result<()> {
        self.sh.allgather(input, out)?;
        self.sh.net.synchronize().map_err(gpu_err)
    }

    /// Raw grouped ncclSend/ncclRecv: send `send` to `dest`, receive `recv.len()` elements from
    /// `src` (both ends must call with matching lengths); blocking.
    pub fn raw_sendrecv<T: NcclReal>(
        &self,
        send: &CudaSlice<T>,
        dest: usize,
        recv: &mut CudaSlice<T>,
        src: usize,
    ) -> Result<()> {
        self.check_peer(dest)?;
        self.check_peer(src)?;
        let sh = &self.sh;
        let (ns, nr) = (send.len(), recv.len());
        let (sp, _g1) = send.device_ptr(&sh.net);
        let (rp, _g2) = recv.device_ptr_mut(&sh.net);
        sh.group(|| {
            // SAFETY: both buffers are borrowed until the guards record on the net stream.
            unsafe {
                sh.send_raw(sp, ns, T::as_nccl_type(), dest)?;
                sh.recv_raw(rp, nr, T::as_nccl_type(), src)
            }
        })?;
        drop((_g1, _g2));
        sh.net.synchronize().map_err(gpu_err)
    }

    /// Raw ncclSend of the whole buffer (the peer calls [`raw_recv`](Self::raw_recv)); blocking.
    pub fn raw_send<T: NcclReal>(&self, data: &CudaSlice<T>, dest: usize) -> Result<()> {
        self.check_peer(dest)?;
        let (p, _g) = data.device_ptr(&self.sh.net);
        // SAFETY: borrowed until the guard records on the net stream.
        unsafe { self.sh.send_raw(p, data.len(), T::as_nccl_type(), dest)? };
        drop(_g);
        self.sh.net.synchronize().map_err(gpu_err)
    }

    /// Raw ncclRecv of exactly `out.len()` elements; blocking.
    pub fn raw_recv<T: NcclReal>(&self, out: &mut CudaSlice<T>, src: usize) -> Result<()> {
        self.check_peer(src)?;
        let n = out.len();
        let (p, _g) = out.device_ptr_mut(&self.sh.net);
        // SAFETY: borrowed until the guard records on the net stream.
        unsafe { self.sh.recv_raw(p, n, T::as_nccl_type(), src)? };
        drop(_g);
        self.sh.net.synchronize().map_err(gpu_err)
    }

    fn check_peer(&self, r: usize) -> Result<()> {
        if r >= self.size() {
            return Err(Error::invalid(format!(
                "rank {r} out of range (size {})",
                self.size()
            )));
        }
        Ok(())
    }

    // ------------------------------------------------------------------ device helpers

    /// Smallest and largest finite values of a device buffer (None: no finite value).
    pub fn value_range<T: NcclReal>(&self, x: &CudaSlice<T>) -> Result<Option<(f64, f64)>> {
        self.utils.range(&self.sh.work, &x.as_view())
    }

    /// `max |a_i - b_i|` of two device buffers (in f64; infinite where exactly one is not finite).
    pub fn max_abs_diff<T: NcclReal>(&self, a: &CudaSlice<T>, b: &CudaSlice<T>) -> Result<f64> {
        self.utils
            .max_abs_diff(&self.sh.work, &a.as_view(), &b.as_view())
    }

    /// A synthetic Gaussian random field of `n` values on the device (test and benchmark data):
    /// the grid is `512 × 512 × n/512²` (row-major), the field a sum of 24 random Fourier modes
    /// with Gaussian spectrum (correlation length `corr_len` cells, unit variance) plus
    /// `noise` × uniform(-1, 1) white noise; `seed` picks the realisation.
    pub fn gaussian_field<T: NcclReal>(
        &self,
        n: usize,
        corr_len: f64,
        noise: f32,
        seed: u64,
    ) -> Result<CudaSlice<T>> {
        // SAFETY: every element is written by the kernel below.
        let mut x = unsafe { self.sh.work.alloc::<T>(n) }
            .map_err(|e| Error::OutOfMemory(format!("{n} values: {e:?}")))?;
        self.utils
            .field(&self.sh.work, &mut x, 512, 512, corr_len, noise, seed)?;
        Ok(x)
    }

    // ------------------------------------------------------------------ internals

    fn gpu(&mut self) -> Result<&mut crate::gpu::GpuCodec> {
        let why = &self.gpu_error;
        self.gpu
            .as_mut()
            .ok_or_else(|| Error::Unavailable(format!("GPU codec: {why}")))
    }

    fn piece_elems<T: NcclReal>(&self) -> usize {
        (self.config.piece_bytes / T::SIZE).max(1)
    }

    /// Exchange and check descriptors (every rank gets the same verdict); returns every rank's
    /// descriptor in rank order.
    fn agree(&mut self, d: Desc) -> Result<Vec<Desc>> {
        let d = Desc { seq: self.seq, ..d };
        self.seq += 1;
        let raw = self.sh.boot.allgather_fixed(&d.to_bytes())?;
        let all = raw
            .chunks_exact(DESC_LEN)
            .map(Desc::parse)
            .collect::<Result<Vec<_>>>()?;
        if all.len() != self.size() {
            return Err(Error::Comm(format!(
                "{} NCCL descriptors from {} ranks",
                all.len(),
                self.size()
            )));
        }
        for (r, x) in all.iter().enumerate().skip(1) {
            all[0].check(x, 0, r)?;
        }
        Ok(all)
    }

    /// The one control round of a collective, done exactly once per call: the descriptor check
    /// (when [`NcclConfig::check`]) carrying this rank's `Auto` estimate `est` (when given), or,
    /// with checks off, an 8-byte allgather of `est` (nothing at all without an estimate).
    /// Returns every rank's estimate (rank order) when `est` was given. `est` must be `Some` on
    /// all ranks or on none (it is: it depends only on agreed state).
    fn exchange(&mut self, mut d: Desc, est: Option<f64>) -> Result<Option<Vec<f64>>> {
        if let Some(e) = est {
            d.ratio = e;
        }
        if self.config.check {
            let all = self.agree(d)?;
            return Ok(est.map(|_| all.iter().map(|x| x.ratio).collect()));
        }
        match est {
            None => Ok(None),
            Some(e) => Ok(Some(f64s(&self.sh.boot.allgather_fixed(&e.to_le_bytes())?))),
        }
    }

    /// Plan a collective (identical outcome on every rank): runs the control round
    /// ([`exchange`](Self::exchange)) and returns `None` for raw NCCL, or `Some(ratio)` when
    /// compression is wanted and possible: under `Auto` the agreed ratio estimate (cached, or
    /// `estimate`d locally now and agreed), under `Always` `1e12`. `want`: the policy allows
    /// compression at all (`Auto`: it could win at an infinite ratio), from agreed inputs only.
    /// `Always` with a rank lacking the codec is [`Error::Unavailable`] on every rank.
    fn plan<T: NcclReal>(
        &mut self,
        op: u8,
        n: usize,
        want: bool,
        estimate: impl FnOnce(&mut Self) -> Result<f64>,
    ) -> Result<Option<WireRatio>> {
        let auto = matches!(self.config.policy, Policy::Auto(_));
        let avail = self.codec_on_all_ranks();
        let key = RatioKey {
            op,
            dtype: T::DTYPE.tag(),
            count: n as u64,
        };
        let mut cached = None;
        let mut local = None;
        if want && avail && auto {
            cached = self.ratios.lookup(key);
            if cached.is_none() {
                local = Some(estimate(self).unwrap_or_else(|e| {
                    tracing::warn!(target: "zcomm::nccl", rank = self.rank(), "{} ratio estimate failed, running raw: {e}", op_name(op));
                    -1.0 // tells every rank to run raw
                }));
            }
        }
        let all = self.exchange(self.desc::<T>(op, n), local)?;
        if !want {
            return Ok(None);
        }
        if !avail {
            if auto {
                return Ok(None);
            }
            let ranks: Vec<usize> = (0..self.size()).collect();
            return Err(Error::Unavailable(self.codec_missing_msg(&ranks)));
        }
        if !auto {
            return Ok(Some(WireRatio::from(1e12)));
        }
        if cached.is_some() {
            return Ok(cached);
        }
        match all.as_deref().and_then(Agreed::from_all) {
            Some(a) => {
                self.ratios.put(key, a);
                Ok(Some(a.value()))
            }
            None => Ok(None), // some rank could not estimate: raw everywhere, nothing cached
        }
    }

    /// After a compressed `Auto` collective: all ranks agree on the measured ratios (16-byte
    /// allgather; the slowest rank's, [`Agreed::from_measured`]) and cache them for the next
    /// calls of this shape.
    fn agree_measured<T: NcclReal>(&mut self, op: u8, n: usize, wr: WireRatio) -> Result<()> {
        if !matches!(self.config.policy, Policy::Auto(_)) {
            return Ok(());
        }
        let mut mine = [0u8; 16];
        mine[..8].copy_from_slice(&wr.major.to_le_bytes());
        mine[8..].copy_from_slice(&wr.minor.to_le_bytes());
        let all = f64s(&self.sh.boot.allgather_fixed(&mine)?);
        let majors: Vec<f64> = all.iter().copied().step_by(2).collect();
        let minors: Vec<f64> = all.iter().copied().skip(1).step_by(2).collect();
        if let Some(a) = Agreed::from_measured(&majors, &minors) {
            let key = RatioKey {
                op,
                dtype: T::DTYPE.tag(),
                count: n as u64,
            };
            self.ratios.put(key, a);
        }
        Ok(())
    }

    fn desc<T: NcclReal>(&self, op: u8, count: usize) -> Desc {
        Desc {
            op,
            dtype: T::DTYPE.tag(),
            policy: self.config.policy.tag(),
            mode: self.config.bound.mode().tag(),
            decision: 0,
            bound: self.config.bound.value(),
            count: count as u64,
            seq: 0,
            ratio: 1.0,
        }
    }

    /// The bound one compression of `x` gets for the configured bound: `abs:E` as is, `noa:E`
    /// as the absolute bound `E·(max-min)` of the whole buffer (rounded down, so each piece
    /// keeps the whole buffer's guarantee), `rel` as is.
    fn piece_bound<T: NcclReal>(&self, x: &CudaView<'_, T>) -> Result<ErrorBound> {
        Ok(match self.config.bound {
            ErrorBound::Noa(e) => match self.utils.range(&self.sh.work, x)? {
                Some((lo, hi)) => {
                    let w = crate::quant::pred(crate::quant::pred(e * (hi - lo)));
                    if w.is_finite() && w > 0.0 {
                        ErrorBound::Abs(w)
                    } else {
                        ErrorBound::Noa(e)
                    }
                }
                None => ErrorBound::Noa(e),
            },
            b => b,
        })
    }

    /// Local ratio estimate from up to 8 codec chunks spread over `x`, compressed on the device
    /// under a bound derived from the sample alone (no pass over the whole buffer):
    /// `reduction = None`: the configured bound (`noa` then uses the sample's own range, at most
    /// the buffer's, so the estimate is conservative); `Some((p, divisor, quantizations))`: the
    /// per-step bound of [`reduction_step_bound`] from the sample's range and magnitude (a
    /// heuristic for the global values); `1.0` when no positive step bound is left.
    fn sample_ratio<T: NcclReal>(
        &mut self,
        x: &CudaView<'_, T>,
        codec: CodecKind,
        reduction: Option<(usize, f64, usize)>,
    ) -> Result<f64> {
        const CHUNK: usize = 1 << crate::codec::blocked::CHUNK_LOG2;
        let n = x.len();
        if n == 0 {
            return Ok(1.0);
        }
        let nch = n.div_ceil(CHUNK);
        let k = nch.min(8);
        let work = self.sh.work.clone();
        // SAFETY: the first m elements are written by the copies below, only they are read.
        let mut sample = unsafe { work.alloc::<T>(k * CHUNK) }.map_err(gpu_err)?;
        // SAFETY: u8 scratch; only the stream's bytes are read.
        let mut out =
            unsafe { work.alloc::<u8>(crate::format::HEADER_LEN + k * CHUNK * T::SIZE + 256) }
                .map_err(gpu_err)?;
        let mut m = 0usize;
        for i in 0..k {
            let c = i * nch / k;
            let lo = c * CHUNK;
            let hi = (lo + CHUNK).min(n);
            let src = x.slice(lo..hi);
            let mut dst = sample.slice_mut(m..m + (hi - lo));
            work.memcpy_dtod(&src, &mut dst).map_err(gpu_err)?;
            m += hi - lo;
        }
        let sv = sample.slice(0..m);
        let bound = match reduction {
            None => {
                // allocations and copies complete before the codec stream uses them
                work.synchronize().map_err(gpu_err)?;
                self.config.bound
            }
            Some((p, d, nq)) => {
                // synchronizes `work`
                let Some((lo, hi)) = self.utils.range(&work, &sv)? else {
                    return Ok(1.0);
                };
                let e = match self.config.bound {
                    ErrorBound::Abs(e) => e,
                    ErrorBound::Noa(e) => e * (hi - lo),
                    ErrorBound::Rel(_) => return Ok(1.0),
                };
                let mag = lo.abs().max(hi.abs());
                match reduction_step_bound(e, mag, p, T::UNIT_ROUNDOFF, d, nq) {
                    Some(eb) => ErrorBound::Abs(eb * d),
                    None => return Ok(1.0),
                }
            }
        };
        let mut ov = out.slice_mut(..);
        let len = self.gpu()?.compress_device(&sv, bound, codec, &mut ov)?;
        Ok((m * T::SIZE) as f64 / len.max(1) as f64)
    }

    /// The compress decision of a collective from its agreed `plan` (`None`: raw): `Auto`
    /// compresses when `predict(ratio)` beats the raw prediction in `st` by 5 %, `Always` does;
    /// records the estimate and the compressed prediction (`best_t` for `Always`) in `st`.
    fn decide(
        &self,
        plan: Option<WireRatio>,
        st: &mut OpStats,
        best_t: f64,
        predict: impl Fn(WireRatio) -> f64,
    ) -> bool {
        let Some(ratio) = plan else {
            return false;
        };
        st.ratio_estimate = ratio.major.min(1e6);
        if let Policy::Auto(_) = self.config.policy {
            st.predicted_compressed_s = predict(ratio);
            st.predicted_compressed_s < crate::model::choice::HYSTERESIS * st.predicted_raw_s
        } else {
            st.predicted_compressed_s = best_t;
            true
        }
    }

    fn finish(&self, mut st: OpStats, t0: f64) -> Result<OpStats> {
        if st.decision == Decision::Raw {
            // raw paths only used (and already drained, except allgather) the NCCL stream
            self.sh.net.synchronize().map_err(gpu_err)?;
        } else {
            self.synchronize()?;
        }
        st.measured_s = self.wtime() - t0;
        tracing::debug!(target: "zcomm::nccl", rank = self.rank(), "{st}");
        Ok(st)
    }

    fn base_stats(op: u8, bytes: usize) -> OpStats {
        OpStats {
            op: op_name(op),
            decision: Decision::Raw,
            codec: None,
            ratio_estimate: 1.0,
            ratio: 1.0,
            bytes: bytes as u64,
            wire_bytes: bytes as u64,
            predicted_raw_s: 0.0,
            predicted_compressed_s: 0.0,
            predicted_s: 0.0,
            measured_s: 0.0,
            bound: 0.0,
            max_error: None,
        }
    }

    /// Compress piece `src` into `send_pool` buffer `slot`; returns the stream length.
    fn compress_piece<T: NcclReal>(
        gpu: &mut crate::gpu::GpuCodec,
        pool: &mut Pool,
        slot: usize,
        src: &CudaView<'_, T>,
        bound: ErrorBound,
        codec: CodecKind,
    ) -> Result<usize> {
        let mut ov = pool.bufs[slot].slice_mut(..);
        gpu.compress_device(src, bound, codec, &mut ov)
    }

    /// One pipelined ring round: compress `buf[send]` piece by piece and send to `to`, receive
    /// the pieces of `buf[recv]` from `from` and decompress-and-add them into `buf[recv]`
    /// (`accumulate`) or decompress them there. Returns the bytes this rank sent and the
    /// critical bytes (per piece the larger of the sent and the received message).
    #[allow(clippy::too_many_arguments)]
    fn ring_round<T: NcclReal>(
        &mut self,
        buf: &mut CudaSlice<T>,
        send: Range<usize>,
        recv: Range<usize>,
        to: usize,
        from: usize,
        bound: ErrorBound,
        codec: CodecKind,
        accumulate: bool,
    ) -> Result<Wire> {
        let pe = self.piece_elems::<T>();
        let sp = pieces(send.len(), pe);
        let rp = pieces(recv.len(), pe);
        let cap = crate::format::HEADER_LEN + pe * T::SIZE;
        let sh = self.sh.clone();
        let mut spool = std::mem::take(&mut self.send_pool);
        let mut rpool = std::mem::take(&mut self.recv_pool);
        let r = (|| {
            spool.ensure(&sh.work, sp.len(), cap)?;
            rpool.ensure(&sh.work, rp.len(), cap)?;
            let gpu = self
                .gpu
                .as_mut()
                .ok_or_else(|| Error::Unavailable(format!("GPU codec: {}", self.gpu_error)))?;
            let mut wire = Wire::default();
            let mut pending: Option<(usize, usize, cudarc::driver::CudaEvent)> = None;
            for k in 0..sp.len().max(rp.len()) {
                let slen = if k < sp.len() {
                    let v = buf.slice(send.start + sp[k].start..send.start + sp[k].end);
                    Self::compress_piece(gpu, &mut spool, k, &v, bound, codec)?
                } else {
                    0
                };
                let got = sh
                    .boot
                    .sendrecv(to, &(slen as u64).to_le_bytes(), from, TAG_SIZES)?;
                let rlen = size_msg(&got)?;
                if (k < rp.len()) != (rlen > 0) || rlen > cap {
                    return Err(Error::Comm(format!(
                        "ring piece {k}: peer {from} announced {rlen} bytes (expected a piece: {})",
                        k < rp.len()
                    )));
                }
                {
                    let sb = spool.bufs.get(k).filter(|_| k < sp.len());
                    let (sptr, g1) = match sb {
                        Some(b) => {
                            let (p, g) = b.device_ptr(&sh.net);
                            (p, Some(g))
                        }
                        None => (0, None),
                    };
                    let rb = if k < rp.len() {
                        rpool.bufs.get_mut(k)
                    } else {
                        None
                    };
                    let (rptr, g2) = match rb {
                        Some(b) => {
                            let (p, g) = b.device_ptr_mut(&sh.net);
                            (p, Some(g))
                        }
                        None => (0, None),
                    };
                    sh.group(|| {
                        // SAFETY: the piece buffers hold at least slen / rlen bytes and stay
                        // borrowed until the guards record on the net stream after the group.
                        unsafe {
                            if slen > 0 {
                                sh.send_raw(sptr, slen, nsys::ncclDataType_t::ncclUint8, to)?;
                            }
                            if rlen > 0 {
                                sh.recv_raw(rptr, rlen, nsys::ncclDataType_t::ncclUint8, from)?;
                            }
                        }
                        Ok(())
                    })?;
                    drop((g1, g2));
                }
                wire.sent += slen;
                wire.critical += slen.max(rlen);
                wire.minor += slen.min(rlen);
                let ev = sh.net.record_event(None).map_err(gpu_err)?;
                if let Some((j, len, ev)) = pending.take() {
                    Self::consume(
                        gpu,
                        &rpool,
                        j,
                        len,
                        &ev,
                        buf,
                        recv.start + rp[j].start..recv.start + rp[j].end,
                        accumulate,
                    )?;
                }
                if rlen > 0 {
                    pending = Some((k, rlen, ev));
                }
            }
            if let Some((j, len, ev)) = pending.take() {
                Self::consume(
                    gpu,
                    &rpool,
                    j,
                    len,
                    &ev,
                    buf,
                    recv.start + rp[j].start..recv.start + rp[j].end,
                    accumulate,
                )?;
            }
            Ok(wire)
        })();
        self.send_pool = spool;
        self.recv_pool = rpool;
        r
    }

    /// Decompress (or decompress-and-add) received piece `slot` into `buf[dst]` once the net
    /// stream has passed `ev`.
    #[allow(clippy::too_many_arguments)]
    fn consume<T: NcclReal>(
        gpu: &mut crate::gpu::GpuCodec,
        pool: &Pool,
        slot: usize,
        len: usize,
        ev: &cudarc::driver::CudaEvent,
        buf: &mut CudaSlice<T>,
        dst: Range<usize>,
        accumulate: bool,
    ) -> Result<()> {
        gpu.stream().wait(ev).map_err(gpu_err)?;
        let sv = pool.bufs[slot].slice(0..len);
        let mut ov = buf.slice_mut(dst);
        if accumulate {
            gpu.decompress_add_device(&sv, &mut ov)
        } else {
            gpu.decompress_device(&sv, &mut ov)
        }
    }

    /// Pipelined compressed allgather round: rank `j`'s data is `buf[segs[j]]`; this rank's own
    /// segment comes from `src` when given (else from `buf[segs[rank]]`). Every rank ends with
    /// the decompressed values of every segment, its own included. Returns the bytes this rank
    /// sent and the critical bytes (per piece the largest rank's piece, times the peers).
    fn gather_round<T: NcclReal>(
        &mut self,
        buf: &mut CudaSlice<T>,
        segs: &[Range<usize>],
        src: Option<&CudaSlice<T>>,
        bound: ErrorBound,
        codec: CodecKind,
    ) -> Result<Wire> {
        let (p, r) = (self.size(), self.rank());
        let pe = self.piece_elems::<T>();
        let pcs: Vec<Vec<Range<usize>>> = segs.iter().map(|s| pieces(s.len(), pe)).collect();
        let kmax = pcs.iter().map(|v| v.len()).max().unwrap_or(0);
        let cap = crate::format::HEADER_LEN + pe * T::SIZE;
        let peers: Vec<usize> = (0..p).filter(|&j| j != r).collect();
        let sh = self.sh.clone();
        let mut spool = std::mem::take(&mut self.send_pool);
        let mut rpool = std::mem::take(&mut self.recv_pool);
        let res = (|| -> Result<Wire> {
            spool.ensure(&sh.work, pcs[r].len(), cap)?;
            rpool.ensure(&sh.work, kmax * peers.len(), cap)?;
            let gpu = self
                .gpu
                .as_mut()
                .ok_or_else(|| Error::Unavailable(format!("GPU codec: {}", self.gpu_error)))?;
            let mut wire = Wire::default();
            // (k, sizes of every rank, event)
            let mut pending: Option<(usize, Vec<usize>, cudarc::driver::CudaEvent)> = None;
            let consume_all = |gpu: &mut crate::gpu::GpuCodec,
                               spool: &Pool,
                               rpool: &Pool,
                               buf: &mut CudaSlice<T>,
                               k: usize,
                               sizes: &[usize],
                               ev: &cudarc::driver::CudaEvent|
             -> Result<()> {
                for (jj, &j) in peers.iter().enumerate() {
                    if k < pcs[j].len() {
                        let d = segs[j].start + pcs[j][k].start..segs[j].start + pcs[j][k].end;
                        Self::consume(
                            gpu,
                            rpool,
                            k * peers.len() + jj,
                            sizes[j],
                            ev,
                            buf,
                            d,
                            false,
                        )?;
                    }
                }
                if k < pcs[r].len() {
                    let d = segs[r].start + pcs[r][k].start..segs[r].start + pcs[r][k].end;
                    let sv = spool.bufs[k].slice(0..sizes[r]);
                    let mut ov = buf.slice_mut(d);
                    gpu.decompress_device(&sv, &mut ov)?;
                }
                Ok(())
            };
            for k in 0..kmax {
                let slen = if k < pcs[r].len() {
                    let rg = pcs[r][k].clone();
                    match src {
                        Some(s) => {
                            let v = s.slice(rg);
                            Self::compress_piece(gpu, &mut spool, k, &v, bound, codec)?
                        }
                        None => {
                            let v = buf.slice(segs[r].start + rg.start..segs[r].start + rg.end);
                            Self::compress_piece(gpu, &mut spool, k, &v, bound, codec)?
                        }
                    }
                } else {
                    0
                };
                let all = sh.boot.allgather_fixed(&(slen as u64).to_le_bytes())?;
                let sizes = all
                    .chunks_exact(8)
                    .map(size_msg)
                    .collect::<Result<Vec<_>>>()?;
                for j in 0..p {
                    if (k < pcs[j].len()) != (sizes[j] > 0) || sizes[j] > cap {
                        return Err(Error::Comm(format!(
                            "allgather piece {k}: rank {j} announced {} bytes",
                            sizes[j]
                        )));
                    }
                }
                {
                    let mut guards = Vec::new();
                    let sptr = if slen > 0 {
                        let (pp, g) = spool.bufs[k].device_ptr(&sh.net);
                        guards.push(g);
                        pp
                    } else {
                        0
                    };
                    let mut rptrs = Vec::with_capacity(peers.len());
                    let base = k * peers.len();
                    for (jj, b) in rpool.bufs[base..base + peers.len()].iter_mut().enumerate() {
                        let j = peers[jj];
                        if sizes[j] > 0 {
                            let (pp, g) = b.device_ptr_mut(&sh.net);
                            guards.push(g);
                            rptrs.push((j, pp));
                        }
                    }
                    sh.group(|| {
                        // SAFETY: piece buffers hold the announced sizes (checked against cap)
                        // and stay borrowed until the guards record after the group.
                        unsafe {
                            if slen > 0 {
                                for &j in &peers {
                                    sh.send_raw(sptr, slen, nsys::ncclDataType_t::ncclUint8, j)?;
                                }
                            }
                            for &(j, pp) in &rptrs {
                                sh.recv_raw(pp, sizes[j], nsys::ncclDataType_t::ncclUint8, j)?;
                            }
                        }
                        Ok(())
                    })?;
                    drop(guards);
                }
                wire.sent += slen * peers.len();
                wire.critical += sizes.iter().copied().max().unwrap_or(0) * peers.len();
                wire.minor += sizes.iter().copied().min().unwrap_or(0) * peers.len();
                let ev = sh.net.record_event(None).map_err(gpu_err)?;
                if let Some((j, sz, e)) = pending.take() {
                    consume_all(gpu, &spool, &rpool, buf, j, &sz, &e)?;
                }
                pending = Some((k, sizes, ev));
            }
            if let Some((j, sz, e)) = pending.take() {
                consume_all(gpu, &spool, &rpool, buf, j, &sz, &e)?;
            }
            Ok(wire)
        })();
        self.send_pool = spool;
        self.recv_pool = rpool;
        res
    }

    // ------------------------------------------------------------------ collectives

    /// Gather `send` from every rank into `out` (`out.len() == size * send.len()`, rank order),
    /// compressed per the policy (every rank ends with identical values, its own segment
    /// included). Bound: `abs:E`, `noa:E` of each rank's own range, or `rel:E`, per value.
    ///
    /// `Auto` decides from the agreed ratio cache or a sample (see the [module docs](self));
    /// only a compressing call reads the whole buffer for its value range. If any rank lacks the
    /// device codec, `Auto` runs raw NCCL and `Always` returns [`Error::Unavailable`], on every
    /// rank alike.
    pub fn allgather<T: NcclReal>(
        &mut self,
        send: &CudaSlice<T>,
        out: &mut CudaSlice<T>,
    ) -> Result<OpStats> {
        let t0 = self.wtime();
        let p = self.size();
        let n = send.len();
        if out.len() != n * p {
            return Err(Error::invalid(format!(
                "allgather: output has {} elements, expected {p} x {n}",
                out.len()
            )));
        }
        let codec = self.config.policy.codec().unwrap_or_default();
        let bytes = n * T::SIZE;
        let k = pieces(n, self.piece_elems::<T>()).len();
        let dt = T::DTYPE.tag();
        let (raw_t, best_t) = self
            .profile
            .predict_allgather(bytes as f64, p, 1e12, k, codec, dt);
        let want = match self.config.policy {
            Policy::Never => false,
            Policy::Always(_) => true,
            Policy::Auto(_) => best_t < crate::model::choice::HYSTERESIS * raw_t,
        } && n > 0
            && p > 1;
        let plan = self.plan::<T>(OP_ALLGATHER, n, want, |c| {
            c.sample_ratio(&send.as_view(), codec, None)
        })?;
        let mut st = Self::base_stats(OP_ALLGATHER, bytes);
        st.predicted_raw_s = raw_t;
        st.predicted_s = raw_t;
        let compress = self.decide(plan, &mut st, best_t, |ratio| {
            self.profile
                .predict_allgather(bytes as f64, p, ratio, k, codec, dt)
                .1
        });
        if !compress {
            self.sh.allgather(send, out)?;
            return self.finish(st, t0);
        }
        // compressing: now the real (whole-buffer) bound
        let bound = self.piece_bound(&send.as_view())?;
        let segs: Vec<Range<usize>> = (0..p).map(|j| j * n..(j + 1) * n).collect();
        let wire = self.gather_round(out, &segs, Some(send), bound, codec)?;
        st.decision = Decision::Compressed;
        st.codec = Some(codec);
        st.bound = match bound {
            ErrorBound::Abs(e) | ErrorBound::Rel(e) => e,
            ErrorBound::Noa(e) => e,
        };
        st.wire_bytes = wire.sent as u64;
        let moved = (bytes * (p - 1)) as f64;
        st.ratio = moved / wire.sent.max(1) as f64;
        // the time follows the larger and the smaller piece of every round: predict (and
        // remember for `Auto`) the ratios of both directions
        let wr = wire.ratios(moved);
        self.last_ratios = Some(wr);
        let (_, cmp_t) = self
            .profile
            .predict_allgather(bytes as f64, p, wr, k, codec, dt);
        st.predicted_compressed_s = cmp_t;
        st.predicted_s = cmp_t;
        self.agree_measured::<T>(OP_ALLGATHER, n, wr)?;
        self.finish(st, t0)
    }

    /// Sum over all ranks into `out` (same length) with the end-to-end bound of the
    /// [module docs](self); identical results on every rank.
    ///
    /// `Auto` decides from the agreed ratio cache or a sample (see the [module docs](self)); the
    /// global value range (a pass over the buffer and a small MPI allreduce) is only computed
    /// when the call compresses. If any rank lacks the device codec, `Auto` runs raw NCCL and
    /// `Always` returns [`Error::Unavailable`], on every rank alike (the same holds for
    /// [`allreduce_mean`](Self::allreduce_mean) and [`reduce_scatter`](Self::reduce_scatter)).
    pub fn allreduce<T: NcclReal>(
        &mut self,
        input: &CudaSlice<T>,
        out: &mut CudaSlice<T>,
    ) -> Result<OpStats> {
        self.reduce_impl(OP_ALLREDUCE, input, out)
    }

    /// Mean over all ranks (gradient averaging); the bound applies to the mean.
    pub fn allreduce_mean<T: NcclReal>(
        &mut self,
        input: &CudaSlice<T>,
        out: &mut CudaSlice<T>,
    ) -> Result<OpStats> {
        self.reduce_impl(OP_ALLREDUCE_MEAN, input, out)
    }

    /// Reduce-scatter (sum): rank `r` receives segment `r` of
    /// [`partition`]`(input.len(), size)` in `out`.
    pub fn reduce_scatter<T: NcclReal>(
        &mut self,
        input: &CudaSlice<T>,
        out: &mut CudaSlice<T>,
    ) -> Result<OpStats> {
        self.reduce_impl(OP_REDUCE_SCATTER, input, out)
    }

    fn reduce_impl<T: NcclReal>(
        &mut self,
        op: u8,
        x: &CudaSlice<T>,
        out: &mut CudaSlice<T>,
    ) -> Result<OpStats> {
        let t0 = self.wtime();
        let (p, r) = (self.size(), self.rank());
        let n = x.len();
        let full = op != OP_REDUCE_SCATTER;
        let segs = partition(n, p);
        let want_len = if full { n } else { segs[r].len() };
        if out.len() != want_len {
            return Err(Error::invalid(format!(
                "{}: output has {} elements, expected {want_len}",
                op_name(op),
                out.len()
            )));
        }
        if matches!(self.config.bound, ErrorBound::Rel(_)) {
            return Err(Error::invalid(format!(
                "{}: rel bounds are not supported for reductions (use abs or noa)",
                op_name(op)
            )));
        }
        let codec = self.config.policy.codec().unwrap_or_default();
        let bytes = n * T::SIZE;
        let k = pieces(segs[0].len(), self.piece_elems::<T>()).len();
        let dt = T::DTYPE.tag();
        let (raw_t, best_t) =
            self.profile
                .predict_allreduce(bytes as f64, p, 1e12, k, codec, dt, !full);
        let want = match self.config.policy {
            Policy::Never => false,
            Policy::Always(_) => true,
            Policy::Auto(_) => best_t < crate::model::choice::HYSTERESIS * raw_t,
        } && n > 0
            && p > 1;
        let d = if op == OP_ALLREDUCE_MEAN {
            p as f64
        } else {
            1.0
        };
        let nq = if full { p } else { (p - 1).max(1) };
        let plan = self.plan::<T>(op, n, want, |c| {
            c.sample_ratio(&x.as_view(), codec, Some((p, d, nq)))
        })?;
        let mut st = Self::base_stats(op, bytes);
        st.predicted_raw_s = raw_t;
        st.predicted_s = raw_t;
        let mut compress = self.decide(plan, &mut st, best_t, |ratio| {
            self.profile
                .predict_allreduce(bytes as f64, p, ratio, k, codec, dt, !full)
                .1
        });
        let mut eb = 0.0;
        let mut e_total = 0.0;
        if compress {
            // compressing (same decision on all ranks): the global range and magnitude, then
            // the per-quantization bound (identical on all ranks)
            let (lo, hi) = self
                .utils
                .range(&self.sh.work, &x.as_view())?
                .unwrap_or((f64::INFINITY, f64::NEG_INFINITY));
            let mut mm = [-lo, hi];
            self.sh.boot.allreduce_f64(&mut mm, ReduceOp::Max)?;
            let (glo, ghi) = (-mm[0], mm[1]);
            let m = glo.abs().max(ghi.abs());
            let m = if m.is_finite() { m } else { 0.0 };
            e_total = super::reduction_result_bound(self.config.bound, glo, ghi);
            match reduction_step_bound(e_total, m, p, T::UNIT_ROUNDOFF, d, nq) {
                Some(v) => eb = v,
                None => compress = false,
            }
        }
        if !compress {
            self.raw_reduce(op, x, out, &segs)?;
            return self.finish(st, t0);
        }
        // compressed: ring reduce-scatter over pieces, fused decompress-and-add
        let gstream = self.gpu()?.stream().clone();
        let wire = if full {
            gstream.memcpy_dtod(x, out).map_err(gpu_err)?;
            gstream.synchronize().map_err(gpu_err)?;
            self.ring_reduce(out, &segs, eb, d, codec, true)?
        } else {
            // SAFETY: fully written by the copy below.
            let mut tmp = unsafe { gstream.alloc::<T>(n) }
                .map_err(|e| Error::OutOfMemory(format!("{e:?}")))?;
            gstream.memcpy_dtod(x, &mut tmp).map_err(gpu_err)?;
            gstream.synchronize().map_err(gpu_err)?;
            let w = self.ring_reduce(&mut tmp, &segs, eb, d, codec, false)?;
            let v = tmp.slice(segs[r].clone());
            gstream.memcpy_dtod(&v, out).map_err(gpu_err)?;
            gstream.synchronize().map_err(gpu_err)?;
            w
        };
        st.decision = Decision::Compressed;
        st.codec = Some(codec);
        st.bound = e_total;
        st.wire_bytes = wire.sent as u64;
        let moved = if full {
            2 * (p - 1) * bytes / p
        } else {
            (p - 1) * bytes / p
        };
        st.ratio = moved as f64 / wire.sent.max(1) as f64;
        // every ring step ends when the larger of the pieces sent and received has arrived (a
        // rank whose segment compresses worse holds up its neighbours), the smaller one sharing
        // the link meanwhile: predict, and remember for `Auto`, the ratios of both directions
        let wr = wire.ratios(moved as f64);
        self.last_ratios = Some(wr);
        let (_, cmp_t) = self
            .profile
            .predict_allreduce(bytes as f64, p, wr, k, codec, dt, !full);
        st.predicted_compressed_s = cmp_t;
        st.predicted_s = cmp_t;
        self.agree_measured::<T>(op, n, wr)?;
        self.finish(st, t0)
    }

    /// Ring reduce-scatter of `acc` (holding this rank's input) over compressed pieces, then
    /// (`full`) the compressed allgather of the reduced segments. Returns the bytes sent (and
    /// the critical bytes, [`Wire`]).
    fn ring_reduce<T: NcclReal>(
        &mut self,
        acc: &mut CudaSlice<T>,
        segs: &[Range<usize>],
        eb: f64,
        d: f64,
        codec: CodecKind,
        full: bool,
    ) -> Result<Wire> {
        let (p, r) = (self.size(), self.rank());
        let step = ErrorBound::Abs(eb * d);
        let mut wire = Wire::default();
        let (to, from) = (to_of(r, p), from_of(r, p));
        for s in 0..p - 1 {
            let send_seg = (r + 2 * p - s - 1) % p;
            let recv_seg = (r + 2 * p - s - 2) % p;
            wire += self.ring_round(
                acc,
                segs[send_seg].clone(),
                segs[recv_seg].clone(),
                to,
                from,
                step,
                codec,
                true,
            )?;
        }
        if d != 1.0 {
            let mut v = acc.slice_mut(segs[r].clone());
            self.utils.scale(&self.sh.work, &mut v, T::from_f64(d))?;
            self.sh.work.synchronize().map_err(gpu_err)?;
        }
        if full {
            wire += self.gather_round(acc, segs, None, ErrorBound::Abs(eb), codec)?;
        }
        Ok(wire)
    }

    fn raw_reduce<T: NcclReal>(
        &mut self,
        op: u8,
        x: &CudaSlice<T>,
        out: &mut CudaSlice<T>,
        segs: &[Range<usize>],
    ) -> Result<()> {
        let (p, r) = (self.size(), self.rank());
        if op == OP_REDUCE_SCATTER {
            let n = x.len();
            if n % p == 0 {
                let (src, _g1) = x.device_ptr(&self.sh.net);
                let (dst, _g2) = out.device_ptr_mut(&self.sh.net);
                // SAFETY: x holds p * out.len() elements; guards outlive the enqueue.
                unsafe {
                    nres::reduce_scatter(
                        src as *const _,
                        dst as *mut _,
                        n / p,
                        T::as_nccl_type(),
                        nsys::ncclRedOp_t::ncclSum,
                        self.sh.comm,
                        self.sh.net_stream(),
                    )
                }
                .map_err(|e| nccl_err("ncclReduceScatter", e))?;
            } else {
                // SAFETY: fully written by the allreduce.
                let mut tmp = unsafe { self.sh.net.alloc::<T>(n) }
                    .map_err(|e| Error::OutOfMemory(format!("{e:?}")))?;
                self.sh.allreduce_sum(x, &mut tmp)?;
                let v = tmp.slice(segs[r].clone());
                self.sh.net.memcpy_dtod(&v, out).map_err(gpu_err)?;
            }
            return self.sh.net.synchronize().map_err(gpu_err);
        }
        self.sh.allreduce_sum(x, out)?;
        self.sh.net.synchronize().map_err(gpu_err)?;
        if op == OP_ALLREDUCE_MEAN {
            let mut v = out.slice_mut(..);
            self.utils
                .scale(&self.sh.work, &mut v, T::from_f64(p as f64))?;
            self.sh.work.synchronize().map_err(gpu_err)?;
        }
        Ok(())
    }

    // ------------------------------------------------------------------ point to point

    /// Send `data` to `dest` (matched by [`recv`](Self::recv) with the same length), compressed
    /// per the policy (the sender decides). A mismatch is an error on both ends.
    ///
    /// `Auto` decides from this rank's ratio cache for sends or a sample (only a compressing
    /// call reads the whole buffer for its value range). When the sender or the receiver has
    /// no device codec, `Auto` sends raw and `Always` fails with [`Error::Unavailable`] on both
    /// ends (the descriptor round tells the receiver; the receiver's reply also says whether it
    /// can decompress, so a compressed message is never sent to a rank that cannot read it).
    pub fn send<T: NcclReal>(
        &mut self,
        data: &CudaSlice<T>,
        dest: usize,
        tag: i32,
    ) -> Result<OpStats> {
        let t0 = self.wtime();
        self.check_peer(dest)?;
        check_tag(tag)?;
        let n = data.len();
        let bytes = n * T::SIZE;
        let codec = self.config.policy.codec().unwrap_or_default();
        let k = pieces(n, self.piece_elems::<T>()).len();
        let dt = T::DTYPE.tag();
        let (raw_t, best_t) = self.profile.predict_p2p(bytes as f64, 1e12, k, codec, dt);
        let want = match self.config.policy {
            Policy::Never => false,
            Policy::Always(_) => true,
            Policy::Auto(_) => best_t < crate::model::choice::HYSTERESIS * raw_t,
        } && n > 0;
        let avail = self.gpu.is_some() && self.codec_ranks.get(dest).copied().unwrap_or(false);
        let always = matches!(self.config.policy, Policy::Always(_));
        let mut compress = want && avail;
        let mut st = Self::base_stats(OP_SEND, bytes);
        st.predicted_raw_s = raw_t;
        st.predicted_s = raw_t;
        if compress {
            if let Policy::Auto(_) = self.config.policy {
                // the sender alone decides: its own cache, no agreement needed
                let key = RatioKey {
                    op: OP_SEND,
                    dtype: dt,
                    count: n as u64,
                };
                let est = match self.p2p_ratios.lookup(key).map(|r| r.major) {
                    Some(r) => Some(r),
                    None => match self.sample_ratio(&data.as_view(), codec, None) {
                        Ok(r) => Agreed::from_all(&[r]).map(|a| {
                            self.p2p_ratios.put(key, a);
                            a.value().major
                        }),
                        Err(e) => {
                            tracing::warn!(target: "zcomm::nccl", rank = self.rank(), "send ratio estimate failed, sending raw: {e}");
                            None
                        }
                    },
                };
                match est {
                    Some(est) => {
                        let (_, cmp_t) = self.profile.predict_p2p(bytes as f64, est, k, codec, dt);
                        st.ratio_estimate = est;
                        st.predicted_compressed_s = cmp_t;
                        compress = cmp_t < crate::model::choice::HYSTERESIS * raw_t;
                    }
                    None => compress = false,
                }
            } else {
                st.ratio_estimate = 1e6;
                st.predicted_compressed_s = best_t;
            }
        }
        // compressing: now the real (whole-buffer) bound
        let bound = if compress {
            self.piece_bound(&data.as_view())?
        } else {
            self.config.bound
        };
        let mut d = self.desc::<T>(OP_SEND, n);
        d.decision = if want && !avail && always {
            DEC_UNAVAILABLE
        } else {
            u8::from(compress)
        };
        d.ratio = st.ratio_estimate;
        self.sh.boot.send(dest, TAG_P2P + tag, &d.to_bytes())?;
        let verdict = Desc::parse(&self.sh.boot.recv(dest, TAG_P2P + tag)?)?;
        check_pair(&d, &verdict, self.rank(), dest)?;
        if d.decision == DEC_UNAVAILABLE {
            return Err(Error::Unavailable(format!(
                "send to rank {dest} under {}: {}",
                self.config.policy,
                self.codec_missing_msg(&[self.rank(), dest])
            )));
        }
        // the receiver's reply says whether it can decompress (it resolves the same way)
        match p2p_outcome(d.decision, verdict.decision, always) {
            P2p::Raw => compress = false,
            P2p::Compressed => {}
            P2p::Unavailable => {
                return Err(Error::Unavailable(format!(
                    "send to rank {dest} under {}: the receiver has no GPU codec",
                    self.config.policy
                )))
            }
        }
        if !compress {
            self.raw_send(data, dest)?;
            return self.finish(st, t0);
        }
        let sh = self.sh.clone();
        let pcs = pieces(n, self.piece_elems::<T>());
        let cap = crate::format::HEADER_LEN + self.piece_elems::<T>() * T::SIZE;
        let mut spool = std::mem::take(&mut self.send_pool);
        let res = (|| -> Result<usize> {
            spool.ensure(&sh.work, pcs.len(), cap)?;
            let gpu = self
                .gpu
                .as_mut()
                .ok_or_else(|| Error::Unavailable("GPU codec".into()))?;
            let mut wire = 0usize;
            for (kk, rg) in pcs.iter().enumerate() {
                let v = data.slice(rg.clone());
                let len = Self::compress_piece(gpu, &mut spool, kk, &v, bound, codec)?;
                sh.boot
                    .send(dest, TAG_P2P + tag, &(len as u64).to_le_bytes())?;
                let (pp, g) = spool.bufs[kk].device_ptr(&sh.net);
                // SAFETY: the piece buffer holds len bytes and is borrowed until the guard
                // records on the net stream.
                unsafe { sh.send_raw(pp, len, nsys::ncclDataType_t::ncclUint8, dest)? };
                drop(g);
                wire += len;
            }
            Ok(wire)
        })();
        self.send_pool = spool;
        let wire = res?;
        st.decision = Decision::Compressed;
        st.codec = Some(codec);
        st.wire_bytes = wire as u64;
        st.ratio = bytes as f64 / wire.max(1) as f64;
        st.bound = bound.value();
        let (_, cmp_t) = self
            .profile
            .predict_p2p(bytes as f64, st.ratio, k, codec, dt);
        st.predicted_compressed_s = cmp_t;
        st.predicted_s = cmp_t;
        if let (Policy::Auto(_), Some(a)) = (self.config.policy, Agreed::from_all(&[st.ratio])) {
            let key = RatioKey {
                op: OP_SEND,
                dtype: dt,
                count: n as u64,
            };
            self.p2p_ratios.put(key, a);
        }
        self.finish(st, t0)
    }

    /// Receive exactly `out.len()` elements from `src` (matched by [`send`](Self::send)).
    ///
    /// The reply to the sender's descriptor says whether this rank can decompress: without a
    /// device codec a message the sender wanted compressed arrives raw under `Auto`, and under
    /// `Always` both ends fail with [`Error::Unavailable`] (no hang).
    pub fn recv<T: NcclReal>(
        &mut self,
        out: &mut CudaSlice<T>,
        src: usize,
        tag: i32,
    ) -> Result<OpStats> {
        let t0 = self.wtime();
        self.check_peer(src)?;
        check_tag(tag)?;
        let n = out.len();
        let bytes = n * T::SIZE;
        let sd = Desc::parse(&self.sh.boot.recv(src, TAG_P2P + tag)?)?;
        let mut mine = self.desc::<T>(OP_RECV, n);
        mine.decision = u8::from(self.gpu.is_some());
        self.sh.boot.send(src, TAG_P2P + tag, &mine.to_bytes())?;
        check_pair(&sd, &mine, self.rank(), src)?;
        let mut st = Self::base_stats(OP_RECV, bytes);
        st.ratio_estimate = sd.ratio;
        let always = matches!(self.config.policy, Policy::Always(_));
        let outcome = if sd.decision == DEC_UNAVAILABLE {
            P2p::Unavailable
        } else {
            p2p_outcome(sd.decision, mine.decision, always)
        };
        match outcome {
            P2p::Raw => {
                self.raw_recv(out, src)?;
                return self.finish(st, t0);
            }
            P2p::Unavailable => {
                return Err(Error::Unavailable(format!(
                    "recv from rank {src} under {}: {}",
                    self.config.policy,
                    self.codec_missing_msg(&[src, self.rank()])
                )))
            }
            P2p::Compressed => {}
        }
        let codec = self.config.policy.codec().unwrap_or_default();
        let sh = self.sh.clone();
        let pcs = pieces(n, self.piece_elems::<T>());
        let cap = crate::format::HEADER_LEN + self.piece_elems::<T>() * T::SIZE;
        let mut rpool = std::mem::take(&mut self.recv_pool);
        let res = (|| -> Result<usize> {
            rpool.ensure(&sh.work, pcs.len(), cap)?;
            let gpu = self
                .gpu
                .as_mut()
                .ok_or_else(|| Error::Unavailable("GPU codec".into()))?;
            let mut wire = 0usize;
            let mut pending: Option<(usize, usize, cudarc::driver::CudaEvent)> = None;
            for kk in 0..pcs.len() {
                let len = size_msg(&sh.boot.recv(src, TAG_P2P + tag)?)?;
                if len == 0 || len > cap {
                    return Err(Error::Comm(format!(
                        "peer {src} announced a piece of {len} bytes"
                    )));
                }
                let (pp, g) = rpool.bufs[kk].device_ptr_mut(&sh.net);
                // SAFETY: the buffer holds cap >= len bytes, borrowed until the guard records.
                unsafe { sh.recv_raw(pp, len, nsys::ncclDataType_t::ncclUint8, src)? };
                drop(g);
                let ev = sh.net.record_event(None).map_err(gpu_err)?;
                if let Some((j, l, e)) = pending.take() {
                    Self::consume(gpu, &rpool, j, l, &e, out, pcs[j].clone(), false)?;
                }
                pending = Some((kk, len, ev));
                wire += len;
            }
            if let Some((j, l, e)) = pending.take() {
                Self::consume(gpu, &rpool, j, l, &e, out, pcs[j].clone(), false)?;
            }
            Ok(wire)
        })();
        self.recv_pool = rpool;
        let wire = res?;
        st.decision = Decision::Compressed;
        st.codec = Some(codec);
        st.wire_bytes = wire as u64;
        st.ratio = bytes as f64 / wire.max(1) as f64;
        self.finish(st, t0)
    }

    // ------------------------------------------------------------------ calibration

    /// Time `f` on every rank (barrier, run, drain streams), `reps` times after one warm-up;
    /// returns the median over repetitions of the slowest rank (identical on all ranks).
    fn time_collective(
        &mut self,
        reps: usize,
        mut f: impl FnMut(&mut Self) -> Result<()>,
    ) -> Result<f64> {
        let mut ts = Vec::with_capacity(reps);
        for i in 0..=reps.max(1) {
            self.barrier()?;
            let t0 = self.wtime();
            f(self)?;
            self.synchronize()?;
            let mut t = [self.wtime() - t0];
            self.sh.boot.allreduce_f64(&mut t, ReduceOp::Max)?;
            if i > 0 {
                ts.push(t[0]);
            }
        }
        Ok(median(&mut ts))
    }

    /// Measure raw NCCL allreduce, allgather and pairwise exchange at [`CALIBRATION_SIZES`]
    /// (median of 5 to 9 runs after a warm-up each; the curves of [`NcclLink`]), the device
    /// codec on a Gaussian random field (`noa:1e-3`, 64 MiB f32) and the per-piece host overhead;
    /// every rank adopts rank 0's numbers. Collective.
    ///
    /// Each of the three operations runs about 630 MiB (per rank) of buffers in total, the
    /// 16 and 64 MiB runs most of it: roughly 0.6 s over NCCL's socket transport at 3.5 GB/s
    /// (twice the former two-size calibration), a few ms over NVLink.
    pub fn calibrate(&mut self) -> Result<&NcclProfile> {
        let (p, r) = (self.size(), self.rank());
        let big = CALIBRATION_SIZES[CALIBRATION_SIZES.len() - 1] / 4; // f32 values: 64 MiB
        let mut prof = NcclProfile::guess(&self.profile.transport);
        if p > 1 {
            let w = self.sh.work.clone();
            let xs = w.alloc_zeros::<f32>(big).map_err(gpu_err)?;
            let mut ys = w.alloc_zeros::<f32>(big).map_err(gpu_err)?;
            let mut gs = w.alloc_zeros::<f32>(big * p).map_err(gpu_err)?;
            w.synchronize().map_err(gpu_err)?;
            let (mut ar, mut ag, mut pp, mut one) =
                (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            // Warm the transport up with the largest size first (untimed): on the socket
            // transport the first large transfers of a fresh communicator can run ~1.5x slower
            // than later ones (seen once in eight process starts of the 2xH200 v5 runs, where
            // the whole calibration came out slow and every prediction of that process 20-37 %
            // high), and one warm-up per size is not enough to get past that.
            {
                let xv = xs.slice(0..big);
                let mut yv = ys.slice_mut(0..big);
                for _ in 0..3 {
                    self.sh.allreduce_sum(&xv, &mut yv)?;
                }
                let mut gv = gs.slice_mut(0..big * p);
                self.sh.allgather(&xv, &mut gv)?;
                self.synchronize()?;
                self.barrier()?;
            }
            for &sz in CALIBRATION_SIZES {
                let n = sz / 4;
                // large messages are slow on sockets and steady: fewer repetitions
                let reps = if sz >= 16 << 20 { 5 } else { 9 };
                let xv = xs.slice(0..n);
                let mut yv = ys.slice_mut(0..n);
                let t = self.time_collective(reps, |c| c.sh.allreduce_sum(&xv, &mut yv))?;
                ar.push((sz as f64, t));
                let mut gv = gs.slice_mut(0..n * p);
                let t = self.time_collective(reps, |c| c.sh.allgather(&xv, &mut gv))?;
                ag.push(((sz * p) as f64, t));
                // a send to `to` and/or a receive from `from` of n f32, in one group
                let mut exchange = |c: &mut Self, to: Option<usize>, from: Option<usize>| {
                    let sh = c.sh.clone();
                    let (sp, _g1) = xs.device_ptr(&sh.net);
                    let (rp, _g2) = ys.device_ptr_mut(&sh.net);
                    sh.group(|| {
                        // SAFETY: both buffers hold at least n f32; guards outlive the enqueue.
                        unsafe {
                            if let Some(to) = to {
                                sh.send_raw(sp, n, nsys::ncclDataType_t::ncclFloat32, to)?;
                            }
                            if let Some(from) = from {
                                sh.recv_raw(rp, n, nsys::ncclDataType_t::ncclFloat32, from)?;
                            }
                            Ok(())
                        }
                    })
                };
                let (to, from) = ((r + 1) % p, (r + p - 1) % p);
                let t = self.time_collective(reps, |c| exchange(c, Some(to), Some(from)))?;
                pp.push((sz as f64, t));
                // one way: even ranks send to the next rank, which only receives
                let to = (r % 2 == 0 && r + 1 < p).then_some(r + 1);
                let from = (r % 2 == 1).then(|| r - 1);
                let t = self.time_collective(reps, |c| exchange(c, to, from))?;
                one.push((sz as f64, t));
            }
            prof.allreduce = NcclLink::from_points(ar, &prof.allreduce);
            prof.allgather = NcclLink::from_points(ag, &prof.allgather);
            prof.p2p = NcclLink::from_points(pp, &prof.p2p);
            // a message alone is never slower than with traffic coming back
            let one: Vec<(f64, f64)> = one
                .into_iter()
                .map(|(b, t)| (b, t.min(prof.p2p.time(b))))
                .collect();
            prof.p2p_one = Some(NcclLink::from_points(one, &prof.p2p));
            // per-piece host overhead: a size message round on the bootstrap transport plus a
            // codec launch-and-readback
            let t1 = self.wtime();
            let reps = 20;
            for _ in 0..reps {
                self.sh
                    .boot
                    .sendrecv(to_of(r, p), &[0u8; 8], from_of(r, p), TAG_SIZES)?;
            }
            prof.piece_overhead = (self.wtime() - t1) / reps as f64;
        }
        if self.codec_on_all_ranks() {
            let field = self.gaussian_field::<f32>(big, 32.0, 0.0, 7 + r as u64)?;
            let bound = self.piece_bound(&field.as_view())?;
            let codec = self.config.policy.codec().unwrap_or_default();
            let codec = if codec == CodecKind::Pfpl {
                CodecKind::Aatrox
            } else {
                codec
            };
            let mut out = unsafe {
                self.sh
                    .work
                    .alloc::<u8>(crate::format::HEADER_LEN + big * 4 + 256)
            }
            .map_err(gpu_err)?;
            let mut acc = self.sh.work.alloc_zeros::<f32>(big).map_err(gpu_err)?;
            self.sh.work.synchronize().map_err(gpu_err)?;
            let gpu = self.gpu()?;
            // t = fixed + bytes / throughput, fitted from one codec chunk and 64 MiB
            let mut fit = [[f64::INFINITY; 2]; 2]; // [small|big][compress|decompress]
            let mut len = 1usize;
            for (i, n) in [1usize << 15, big].into_iter().enumerate() {
                let fv = field.slice(0..n);
                for _ in 0..5 {
                    let t = std::time::Instant::now();
                    let mut ov = out.slice_mut(..);
                    let l = gpu.compress_device(&fv, bound, codec, &mut ov)?;
                    fit[i][0] = fit[i][0].min(t.elapsed().as_secs_f64());
                    let sv = out.slice(0..l);
                    let mut av = acc.slice_mut(0..n);
                    let t = std::time::Instant::now();
                    gpu.decompress_add_device(&sv, &mut av)?;
                    fit[i][1] = fit[i][1].min(t.elapsed().as_secs_f64());
                    if i == 1 {
                        len = l;
                    }
                }
            }
            // the preparation of a compressing call: value-range pass (with its readback) and
            // device copy of the whole buffer, best of 5
            let (mut t_range, mut t_copy) = (f64::INFINITY, f64::INFINITY);
            for _ in 0..5 {
                let t = std::time::Instant::now();
                self.utils.range(&self.sh.work, &field.as_view())?;
                t_range = t_range.min(t.elapsed().as_secs_f64());
                let t = std::time::Instant::now();
                self.sh
                    .work
                    .memcpy_dtod(&field, &mut acc)
                    .map_err(gpu_err)?;
                self.sh.work.synchronize().map_err(gpu_err)?;
                t_copy = t_copy.min(t.elapsed().as_secs_f64());
            }
            let (b1, b2) = (((1usize << 15) * 4) as f64, (big * 4) as f64);
            let tp = |k: usize| (b2 - b1) / (fit[1][k] - fit[0][k]).max(1e-9);
            let (tcr, tdr) = (tp(0), tp(1));
            let fixed = |k: usize, t: f64| (fit[0][k] - b1 / t).max(0.0);
            let mut v = [
                -tcr,
                -tdr,
                fixed(0, tcr),
                fixed(1, tdr),
                -b2 / t_range.max(1e-9),
                -b2 / t_copy.max(1e-9),
            ];
            self.sh.boot.allreduce_f64(&mut v, ReduceOp::Max)?; // slowest rank
            prof.compress_fixed = v[2];
            prof.decompress_fixed = v[3];
            prof.range_rate = -v[4];
            prof.copy_rate = -v[5];
            let b = b2;
            let v = [v[0], v[1]];
            prof.codecs = vec![CodecSpeed {
                codec,
                dtype: 1,
                compress: -v[0],
                decompress: -v[1],
                ratio: b / len as f64,
            }];
        }
        let mut bytes = if r == 0 {
            serde_json::to_vec(&prof).map_err(|e| Error::invalid(format!("profile: {e}")))?
        } else {
            Vec::new()
        };
        self.sh.boot.bcast(0, &mut bytes)?;
        self.profile = serde_json::from_slice(&bytes)
            .map_err(|e| Error::Comm(format!("profile from rank 0: {e}")))?;
        tracing::info!(target: "zcomm::nccl", "calibrated NCCL ({}): allreduce {} allgather {} p2p {} (at 4 MiB {}, one way {}); codec {:?}; fixed per call: compress {:.1} us, decompress {:.1} us, size message {:.1} us; range pass {}, copy {}",
            self.profile.transport,
            crate::model::fmt_rate(self.profile.allreduce.bandwidth),
            crate::model::fmt_rate(self.profile.allgather.bandwidth),
            crate::model::fmt_rate(self.profile.p2p.bandwidth),
            crate::model::fmt_rate(self.profile.p2p.rate((4u64 << 20) as f64)),
            crate::model::fmt_rate(self.profile.one_way().rate((4u64 << 20) as f64)),
            self.profile.codecs.first().map(|c| (crate::model::fmt_rate(c.compress), crate::model::fmt_rate(c.decompress))),
            self.profile.compress_fixed * 1e6, self.profile.decompress_fixed * 1e6, self.profile.piece_overhead * 1e6,
            crate::model::fmt_rate(self.profile.range_rate), crate::model::fmt_rate(self.profile.copy_rate));
        Ok(&self.profile)
    }
}

/// Message sizes (bytes per rank) at which [`NcclComm::calibrate`] times the raw NCCL links.
pub const CALIBRATION_SIZES: &[usize] = &[
    256 << 10,
    1 << 20,
    2 << 20,
    4 << 20,
    8 << 20,
    16 << 20,
    64 << 20,
];

/// Median of `ts` (sorted in place; the mean of the middle two for an even count, NaN if empty).
fn median(ts: &mut [f64]) -> f64 {
    ts.sort_by(f64::total_cmp);
    match ts.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => ts[n / 2],
        n => 0.5 * (ts[n / 2 - 1] + ts[n / 2]),
    }
}

fn to_of(r: usize, p: usize) -> usize {
    (r + 1) % p
}
fn from_of(r: usize, p: usize) -> usize {
    (r + p - 1) % p
}

/// `Desc::decision` of a send that cannot compress under `Always` (a codec is missing): both
/// ends return [`Error::Unavailable`].
const DEC_UNAVAILABLE: u8 = 2;

/// How a point-to-point message travels, decided alike on both ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum P2p {
    Raw,
    Compressed,
    Unavailable,
}

/// The outcome from the sender's decision (`1`: compress) and the receiver's reply (`1`: it has
/// a codec): a compressed message to a receiver without codec is raw under `Auto`, an error
/// under `Always` (policies are checked equal on both ends).
fn p2p_outcome(sender: u8, receiver_can: u8, always: bool) -> P2p {
    match (sender == 1, receiver_can == 1) {
        (false, _) => P2p::Raw,
        (true, true) => P2p::Compressed,
        (true, false) if always => P2p::Unavailable,
        (true, false) => P2p::Raw,
    }
}

/// Tags of the bootstrap transport's control messages (its own duplicated communicator).
const TAG_SIZES: i32 = 30000;
const TAG_P2P: i32 = 20000;

fn check_tag(tag: i32) -> Result<()> {
    if !(0..super::MAX_USER_TAG).contains(&tag) {
        return Err(Error::invalid(format!(
            "tag {tag} outside 0..{}",
            super::MAX_USER_TAG
        )));
    }
    Ok(())
}

fn size_msg(b: &[u8]) -> Result<usize> {
    let a: [u8; 8] = b
        .try_into()
        .map_err(|_| Error::Comm(format!("malformed size message ({} bytes)", b.len())))?;
    usize::try_from(u64::from_le_bytes(a)).map_err(|_| Error::Comm("size out of range".into()))
}

/// Check a sender's descriptor against the receiver's (same verdict on both ends).
fn check_pair(s: &Desc, r: &Desc, me: usize, peer: usize) -> Result<()> {
    let (s, r) = if s.op == OP_SEND { (s, r) } else { (r, s) };
    if s.op != OP_SEND || r.op != OP_RECV {
        return Err(Error::Mismatch {
            what: "NCCL operation",
            expected: "send matched by recv".into(),
            found: format!("{} against {} (peer {peer})", op_name(s.op), op_name(r.op)),
        });
    }
    let probe = Desc {
        op: s.op,
        seq: s.seq,
        ..*r
    };
    let probe = Desc {
        count: r.count,
        ..probe
    };
    s.check(
        &Desc {
            op: s.op,
            seq: s.seq,
            decision: s.decision,
            ratio: s.ratio,
            ..probe
        },
        me,
        peer,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cover_on_chunk_boundaries() {
        const C: usize = 1 << 15;
        for (n, pe) in [
            (0, 100),
            (1, 100),
            (C, C),
            (10 * C + 7, 3 * C),
            (5 * C, 1),
            (1 << 24, 1 << 22),
        ] {
            let v = pieces(n, pe);
            assert!(!v.is_empty());
            assert_eq!(v[0].start, 0);
            assert_eq!(v.last().unwrap().end, n);
            for w in v.windows(2) {
                assert_eq!(w[0].end, w[1].start);
                assert_eq!(w[0].end % C, 0, "piece boundary off a chunk boundary");
            }
        }
        assert_eq!(pieces(10 * C + 7, 3 * C).len(), 4);
    }

    #[test]
    fn step_bound_matches_the_mpi_rule() {
        // p = 4, E = 1e-2, M = 10, f32, sum: R = 4 u (40 + 0.01), eb = (E - R) / 4
        let u = f32::UNIT_ROUNDOFF;
        let eb = reduction_step_bound(1e-2, 10.0, 4, u, 1.0, 4).unwrap();
        let r = 4.0 * u * (4.0 * 10.0 + 1e-2);
        assert!((eb - (1e-2 - r) / 4.0).abs() < 1e-18);
        // p quantizations of eb plus the rounding stay within E
        assert!(4.0 * eb + r <= 1e-2);
        // mean: partial sums are quantized with eb * p
        let m = reduction_step_bound(1e-3, 1.0, 2, u, 2.0, 2).unwrap();
        assert!(m > 0.0 && 2.0 * m < 1e-3);
        // nothing left for quantization
        assert!(reduction_step_bound(1e-9, 1e6, 8, u, 1.0, 8).is_none());
        assert!(reduction_step_bound(1e-3, f64::INFINITY, 2, u, 1.0, 2).is_none());
    }

    #[test]
    fn descriptors_round_trip_and_pair() {
        let d = Desc {
            op: OP_SEND,
            dtype: 1,
            policy: Policy::default().tag(),
            mode: 2,
            decision: 1,
            bound: 1e-3,
            count: 77,
            seq: 0,
            ratio: 9.5,
        };
        assert_eq!(Desc::parse(&d.to_bytes()).unwrap(), d);
        assert!(Desc::parse(&[0u8; DESC_LEN]).is_err());
        let r = Desc {
            op: OP_RECV,
            decision: 0,
            ratio: 1.0,
            ..d
        };
        assert!(check_pair(&d, &r, 0, 1).is_ok());
        assert!(check_pair(&r, &d, 1, 0).is_ok());
        assert!(check_pair(&d, &Desc { count: 78, ..r }, 0, 1).is_err());
        assert!(check_pair(&d, &Desc { dtype: 2, ..r }, 0, 1).is_err());
        assert!(check_pair(&d, &Desc { bound: 1e-4, ..r }, 0, 1).is_err());
        assert!(check_pair(&d, &d, 0, 1).is_err());
        let a = Desc {
            op: OP_ALLREDUCE,
            ..d
        };
        assert!(a.check(&a, 0, 1).is_ok());
        assert!(a.check(&Desc { seq: 1, ..a }, 0, 1).is_err());
    }

    #[test]
    fn p2p_outcome_is_the_same_on_both_ends() {
        // the sender wanted raw: raw whatever the receiver can do
        for always in [false, true] {
            assert_eq!(p2p_outcome(0, 0, always), P2p::Raw);
            assert_eq!(p2p_outcome(0, 1, always), P2p::Raw);
            assert_eq!(p2p_outcome(1, 1, always), P2p::Compressed);
        }
        // a receiver without codec: Auto falls back to raw, Always fails (on both ends)
        assert_eq!(p2p_outcome(1, 0, false), P2p::Raw);
        assert_eq!(p2p_outcome(1, 0, true), P2p::Unavailable);
        // the "unavailable" verdict survives the descriptor round trip
        let d = Desc {
            op: OP_SEND,
            dtype: 1,
            policy: Policy::Always(CodecKind::Aatrox).tag(),
            mode: 2,
            decision: DEC_UNAVAILABLE,
            bound: 1e-3,
            count: 5,
            seq: 0,
            ratio: 1.0,
        };
        assert_eq!(
            Desc::parse(&d.to_bytes()).unwrap().decision,
            DEC_UNAVAILABLE
        );
        let r = Desc {
            op: OP_RECV,
            decision: 0,
            ..d
        };
        assert!(check_pair(&d, &r, 0, 1).is_ok());
    }

    #[test]
    fn auto_prefers_raw_on_nvlink_and_compression_on_sockets() {
        let mut nv = NcclProfile::guess("nvlink");
        nv.allreduce = NcclLink::linear(316e9, 20e-6);
        nv.codecs = vec![CodecSpeed {
            codec: CodecKind::Aatrox,
            dtype: 1,
            compress: 300e9,
            decompress: 400e9,
            ratio: 10.0,
        }];
        let b = (1u64 << 30) as f64;
        let (raw, best) = nv.predict_allreduce(b, 2, 1e12, 8, CodecKind::Aatrox, 1, false);
        assert!(
            best > raw,
            "NVLink: even infinite ratio must not beat raw ({best} vs {raw})"
        );
        let mut so = nv.clone();
        so.allreduce = NcclLink::linear(3.7e9, 50e-6);
        so.allgather = NcclLink::linear(7.4e9, 50e-6);
        so.p2p = NcclLink::linear(3.7e9, 50e-6);
        let (raw, cmp) = so.predict_allreduce(b, 2, 10.0, 8, CodecKind::Aatrox, 1, false);
        assert!(
            raw / cmp > 3.0,
            "socket: ratio 10 should give > 3x ({raw} / {cmp})"
        );
        let (raw, cmp) = so.predict_allgather(b, 2, 10.0, 16, CodecKind::Aatrox, 1);
        assert!(raw / cmp > 3.0);
    }

    /// A socket profile with a concave p2p/allreduce ramp (mid-size messages slow), as
    /// calibrated on 2xH200 with NCCL forced onto sockets (shape, not the exact numbers).
    fn socket_ramp() -> NcclProfile {
        const MIB: f64 = 1048576.0;
        let ramp = |scale: f64| {
            let pts = [
                (0.25, 0.30e-3),
                (1.0, 0.80e-3),
                (2.0, 1.25e-3),
                (4.0, 1.9e-3),
                (8.0, 3.0e-3),
                (16.0, 5.6e-3),
                (64.0, 19.6e-3),
            ]
            .iter()
            .map(|&(m, t)| (m * MIB * scale, t))
            .collect();
            NcclLink::from_points(pts, &NcclLink::linear(3.5e9, 20e-6))
        };
        let mut so = NcclProfile::guess("socket");
        so.p2p = ramp(1.0);
        so.allreduce = ramp(1.0);
        so.allgather = ramp(2.0);
        so.codecs = vec![CodecSpeed {
            codec: CodecKind::Aatrox,
            dtype: 1,
            compress: 300e9,
            decompress: 400e9,
            ratio: 10.0,
        }];
        so
    }

    #[test]
    fn predictions_use_the_piece_size_on_the_curve() {
        const MIB: f64 = 1048576.0;
        let so = socket_ramp();
        // the two-point linear fit through 1 and 64 MiB the former calibration made
        let mut lin = so.clone();
        for l in [&mut lin.p2p, &mut lin.allreduce] {
            *l = NcclLink::from_points(
                vec![(MIB, l.time(MIB)), (64.0 * MIB, l.time(64.0 * MIB))],
                l,
            );
        }
        // 64 MiB allreduce over 2 ranks at ratio 8.5: 32 MiB segments, ~3.9 MB pieces, which
        // the ramp moves slower than the line does
        let b = 64.0 * MIB;
        let (_, ramp) = so.predict_allreduce(b, 2, 8.5, 1, CodecKind::Aatrox, 1, false);
        let (_, line) = lin.predict_allreduce(b, 2, 8.5, 1, CodecKind::Aatrox, 1, false);
        assert!(ramp > 1.05 * line, "ramp {ramp} vs linear {line}");
        // exactly: two steps of one piece each, the codec and fixed costs around them
        let msg = b / 2.0 / 8.5;
        let (tc, td) = so.codec_speed(CodecKind::Aatrox, 1);
        let comp = (b / 2.0) / tc + so.compress_fixed + so.piece_overhead;
        let dec = (b / 2.0) / td + so.decompress_fixed;
        let rs = comp + dec + so.p2p.time(msg);
        let ag = comp + 2.0 * dec + so.p2p.time(msg);
        // uncalibrated range pass and copy: only the size message round of the range
        let prep = so.piece_overhead;
        assert!(
            (ramp - (prep + rs + ag)).abs() < 1e-12,
            "{ramp} vs {}",
            prep + rs + ag
        );
        // large messages (the pieces near 64 MiB) are where the two agree
        let (_, r1) = so.predict_p2p(4096.0 * MIB, 1.0, 64, CodecKind::Aatrox, 1);
        let (_, l1) = lin.predict_p2p(4096.0 * MIB, 1.0, 64, CodecKind::Aatrox, 1);
        assert!((r1 - l1).abs() / l1 < 0.01, "{r1} vs {l1}");
        // raw: the curves at the buffer size
        let (raw, _) = so.predict_allreduce(b, 2, 8.5, 1, CodecKind::Aatrox, 1, false);
        assert_eq!(raw, so.allreduce.time(b));
        let (raw, _) = so.predict_allgather(b, 2, 8.5, 1, CodecKind::Aatrox, 1);
        assert_eq!(raw, so.allgather.time(2.0 * b));
    }

    #[test]
    fn predictions_are_monotone() {
        const MIB: f64 = 1048576.0;
        let so = socket_ramp();
        let c = CodecKind::Aatrox;
        let sizes: Vec<f64> = (0..=48)
            .map(|i| 0.25 * MIB * 2f64.powf(i as f64 / 4.0))
            .collect();
        let ratios = [1.0, 1.5, 2.0, 4.7, 8.5, 20.0, 43.0, 100.0, 1e3, 1e12];
        for p in [2usize, 3, 4, 8] {
            for &k in &[1usize, 2, 4, 16] {
                for &cr in &ratios {
                    let mut prev = [0.0f64; 8];
                    for &b in &sizes {
                        let (a0, a1) = so.predict_allreduce(b, p, cr, k, c, 1, false);
                        let (r0, r1) = so.predict_allreduce(b, p, cr, k, c, 1, true);
                        let (g0, g1) = so.predict_allgather(b, p, cr, k, c, 1);
                        let (p0, p1) = so.predict_p2p(b, cr, k, c, 1);
                        let now = [a0, a1, r0, r1, g0, g1, p0, p1];
                        for (j, (&x, &y)) in now.iter().zip(&prev).enumerate() {
                            assert!(x.is_finite() && x > 0.0);
                            assert!(x >= y, "p {p} k {k} ratio {cr} bytes {b}: [{j}] {x} < {y}");
                        }
                        prev = now;
                    }
                }
                // in the ratio: higher ratios never predict slower
                for &b in &sizes {
                    let mut prev = [f64::INFINITY; 4];
                    for &cr in &ratios {
                        let now = [
                            so.predict_allreduce(b, p, cr, k, c, 1, false).1,
                            so.predict_allreduce(b, p, cr, k, c, 1, true).1,
                            so.predict_allgather(b, p, cr, k, c, 1).1,
                            so.predict_p2p(b, cr, k, c, 1).1,
                        ];
                        for (j, (&x, &y)) in now.iter().zip(&prev).enumerate() {
                            assert!(x <= y, "p {p} k {k} bytes {b} ratio {cr}: [{j}] {x} > {y}");
                        }
                        prev = now;
                    }
                }
            }
        }
        // the raw times in p as well (more data per rank to move)
        let b = 256.0 * MIB;
        let (g2, _) = so.predict_allgather(b, 2, 10.0, 4, c, 1);
        let (g4, _) = so.predict_allgather(b, 4, 10.0, 4, c, 1);
        assert!(g4 > g2);
    }

    /// A two-rank socket profile with round numbers: pairwise 1 ms per MB each way plus 0.1 ms,
    /// one way twice as fast; codec 1e11 B/s both ways, 10 us fixed per call, 1 us size
    /// message; range pass 1e12 B/s, copy 5e11 B/s.
    fn round_profile() -> NcclProfile {
        let mut so = NcclProfile::guess("socket");
        so.p2p = NcclLink::linear(1e9, 1e-4);
        so.p2p_one = Some(NcclLink::linear(2e9, 1e-4));
        so.codecs = vec![CodecSpeed {
            codec: CodecKind::Aatrox,
            dtype: 1,
            compress: 1e11,
            decompress: 1e11,
            ratio: 10.0,
        }];
        so.compress_fixed = 10e-6;
        so.decompress_fixed = 10e-6;
        so.piece_overhead = 1e-6;
        so.range_rate = 1e12;
        so.copy_rate = 5e11;
        so
    }

    #[test]
    fn exchange_shares_the_link_then_runs_one_way() {
        let so = round_profile();
        // symmetric: the pairwise curve; nothing back: the one-way curve
        assert!((so.exchange(4e6, 4e6, 1.0) - (1e-4 + 4e-3)).abs() < 1e-15);
        assert!((so.exchange(4e6, 0.0, 1.0) - (1e-4 + 2e-3)).abs() < 1e-15);
        // 4 MB one way, 1 MB back: 1 MB each way (1.1 ms), then 3 MB alone (1.5 ms)
        assert!((so.exchange(4e6, 1e6, 1.0) - 2.6e-3).abs() < 1e-15);
        // minor above major is clamped (the roles are the same)
        assert_eq!(so.exchange(1e6, 4e6, 1.0), so.exchange(1e6, 1e6, 1.0));
        // three peers: the latency once, the transfers three times
        assert!((so.exchange(4e6, 1e6, 3.0) - (1e-4 + 3.0 * 1e-3 + 3.0 * 1.5e-3)).abs() < 1e-15);
        // without a one-way curve the pairwise one stands in: the larger message decides
        let mut old = so.clone();
        old.p2p_one = None;
        assert!((old.exchange(4e6, 1e6, 1.0) - (1e-4 + 4e-3)).abs() < 1e-15);
        // an old profile file (no one-way curve, no preparation rates) still reads
        let mut js = serde_json::to_value(&old).unwrap();
        let o = js.as_object_mut().unwrap();
        o.remove("range_rate");
        o.remove("copy_rate");
        let back: NcclProfile = serde_json::from_value(js).unwrap();
        assert_eq!(back.p2p_one, None);
        assert_eq!((back.range_rate, back.copy_rate), (0.0, 0.0));
        let round: NcclProfile =
            serde_json::from_str(&serde_json::to_string(&so).unwrap()).unwrap();
        assert_eq!(round, so);
    }

    /// Hand-computed predictions of the round-number profile.
    #[test]
    fn predictions_by_hand() {
        let so = round_profile();
        let c = CodecKind::Aatrox;
        // allreduce of 400 MB per rank, 2 ranks, 2 pieces of 100 MB per segment, ratios 50
        // (major) and 100: pieces of 2 MB and 1 MB on the wire
        let b = 400e6;
        let wr = WireRatio {
            major: 50.0,
            minor: 100.0,
        };
        // codec stage: compress 1 ms + 10 us + 1 us, decompress-and-add 1 ms + 10 us
        let comp: f64 = 1e-3 + 10e-6 + 1e-6;
        let dec: f64 = 1e-3 + 10e-6;
        // network stage: 1 MB each way 1.1 ms, then 1 MB one way 0.5 ms = 1.6 ms
        let net = 1.6e-3;
        // ring step: both stages for the first piece, then the slower (codec 2.021 ms) again
        let g = comp + dec;
        let rs = g + net + g.max(net);
        // allgather round: two decompressions per piece (3.031 ms per piece)
        let g2 = comp + 2.0 * dec;
        let ag = g2 + net + g2.max(net);
        // preparation: range 0.4 ms, size message round 1 us, copy 0.8 ms
        let prep = 0.4e-3 + 1e-6 + 0.8e-3;
        let (raw, cmp) = so.predict_allreduce(b, 2, wr, 2, c, 1, false);
        assert!(
            (cmp - (prep + rs + ag)).abs() < 1e-12,
            "{cmp} vs {}",
            prep + rs + ag
        );
        assert!((cmp - 14.505e-3).abs() < 1e-12, "{cmp}");
        assert_eq!(raw, so.allreduce.time(b));
        let (_, rso) = so.predict_allreduce(b, 2, wr, 2, c, 1, true);
        assert!((rso - (prep + rs)).abs() < 1e-12);
        // network-bound: ratio 10 (10 MB pieces both ways, 10.1 ms) over codec 2.021 ms
        let (_, slow) = so.predict_allreduce(b, 2, 10.0, 2, c, 1, false);
        let want = prep + (g + 2.0 * 10.1e-3) + (g2 + 2.0 * 10.1e-3);
        assert!((slow - want).abs() < 1e-12, "{slow} vs {want}");
        // allgather of 200 MB per rank over 2 ranks in 2 pieces at ratio 100: 1 MB pieces both
        // ways (1.1 ms), codec stage 1 ms + 11 us + 2 x 1.01 ms = 3.031 ms
        let (graw, gcmp) = so.predict_allgather(200e6, 2, 100.0, 2, c, 1);
        let want = 0.2e-3 + 2.0 * 3.031e-3 + 1.1e-3;
        assert!((gcmp - want).abs() < 1e-12, "{gcmp} vs {want}");
        assert_eq!(graw, so.allgather.time(400e6));
        // point to point of 100 MB at ratio 50 in 1 piece: one way 2 MB (1.1 ms), codec 2.021 ms
        let (praw, pcmp) = so.predict_p2p(100e6, 50.0, 1, c, 1);
        let want = 0.1e-3 + 2.021e-3 + 1.1e-3;
        assert!((pcmp - want).abs() < 1e-12, "{pcmp} vs {want}");
        assert!((praw - (1e-4 + 0.05)).abs() < 1e-12);
    }

    #[test]
    fn a_lopsided_exchange_is_between_its_symmetric_bounds() {
        let so = round_profile();
        let c = CodecKind::Aatrox;
        let b = 1e9;
        let t = |wr: WireRatio| so.predict_allreduce(b, 2, wr, 4, c, 1, false).1;
        let lop = t(WireRatio {
            major: 20.0,
            minor: 200.0,
        });
        // both directions at the larger piece: slower; both at the smaller: faster
        assert!(lop < t(20.0.into()) && lop > t(200.0.into()));
        // ratios from the measured bytes: 4 MB and 1 MB per piece
        let w = Wire {
            sent: 5,
            critical: 4,
            minor: 1,
        };
        let r = w.ratios(20.0);
        assert_eq!((r.major, r.minor), (5.0, 20.0));
        let none = Wire::default().ratios(20.0);
        assert_eq!((none.major, none.minor), (20.0, 20.0));
    }
}
