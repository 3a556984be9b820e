//! Compressed communication over MPI (and, through the [`Transport`] trait, NCCL later).
//!
//! A [`Communicator`] moves host buffers of `f32`, `f64`, complex64 (`[f32; 2]`) and complex128
//! (`[f64; 2]`) between ranks, compressing them with an error-bounded codec when its
//! [`Policy`] says so. Every operation returns an [`OpStats`] (decision, ratio, predicted and
//! measured time, guaranteed bound) and logs it with `tracing` (target `zcomm::comm`).
//!
//! ```no_run
//! # #[cfg(feature = "mpi")] {
//! use zcomm::comm::{Communicator, Config};
//! use zcomm::{model::Policy, CodecKind, ErrorBound};
//! let cfg = Config::new(ErrorBound::Noa(1e-3)).with_policy(Policy::Auto(CodecKind::Aatrox));
//! let mut comm = Communicator::init(cfg).unwrap(); // collective: every rank calls it (MPI)
//! let grad: Vec<f32> = vec![0.5; 1 << 20];
//! let mut avg = vec![0.0f32; grad.len()];
//! let stats = comm.allreduce_mean(&grad, &mut avg).unwrap();
//! println!("{stats}");
//! # }
//! ```
//!
//! Without MPI (feature `mpi` off, or in tests), the same operations run over the in-process
//! [`LoopbackTransport`](transport::LoopbackTransport): one thread per rank, each building its
//! communicator with [`Communicator::with_transport`].
//!
//! Operations: [`send`](Communicator::send) / [`recv`](Communicator::recv) /
//! [`recv_vec`](Communicator::recv_vec), [`sendrecv`](Communicator::sendrecv), the non-blocking
//! [`isend`](Communicator::isend) + [`wait_send`](Communicator::wait_send) and
//! [`irecv`](Communicator::irecv) (a [`RecvRequest`] with `test`/`wait`),
//! [`allgather`](Communicator::allgather), [`bcast`](Communicator::bcast),
//! [`allreduce`](Communicator::allreduce) / [`allreduce_mean`](Communicator::allreduce_mean) /
//! [`allreduce_in_place`](Communicator::allreduce_in_place),
//! [`reduce_scatter`](Communicator::reduce_scatter). With feature `cuda`, `device` adds device
//! buffers through pinned host staging (`Communicator::sendrecv_device` (chunk-pipelined when
//! large), `allgather_device`, `bcast_device`, `allreduce_device` / `allreduce_mean_device` /
//! `reduce_scatter_device`, their non-blocking forms (`iallgather_device`, `ibcast_device`,
//! `iallreduce_device`, ...; see the `device` module docs), `DeviceStager::stage_to_host` /
//! `restore_to_device`) and a GPU [`Compressor`]. Collectives
//! have non-blocking variants: [`iallgather`](Communicator::iallgather) and
//! [`ibcast`](Communicator::ibcast) (MPI non-blocking collectives on the streams), and
//! [`iallreduce`](Communicator::iallreduce) / [`iallreduce_mean`](Communicator::iallreduce_mean) /
//! [`ireduce_scatter`](Communicator::ireduce_scatter) / [`isendrecv`](Communicator::isendrecv),
//! which run the blocking algorithm on a progress thread with its own duplicated communicator
//! (needs `MPI_THREAD_MULTIPLE`, else [`Error::Unavailable`]; they return an [`OpRequest`]
//! with `test`/`wait`; see below).
//!
//! # Protocol: agreement before data
//!
//! Every operation first exchanges a 64-byte descriptor (operation, sequence number, dtype,
//! element count, policy/codec, bound mode and value, root, the sender's decision and payload
//! size, the local ratio estimate):
//!
//! * collectives allgather the descriptors; every rank runs the same deterministic check on the
//!   same table, so a mismatch (count, dtype, codec, bound, root, or two different collectives)
//!   becomes the same [`Error::Mismatch`] on **every** rank before any payload moves;
//! * `send`/`recv`: the sender posts its descriptor and payload; the receiver learns the payload
//!   size by probing, always drains it, and answers with its own descriptor (the "verdict"); both
//!   sides check the pair, so both fail on a mismatch; `sendrecv` exchanges descriptors, payloads
//!   and verdicts pairwise.
//!
//! The decision to compress is made identically on all ranks of a collective (from the gathered
//! ratio estimates and the shared calibration profile), so every rank takes the same path.
//!
//! # Non-blocking reductions: the progress thread
//!
//! `init` asks MPI for `MPI_THREAD_MULTIPLE`; when it is provided it duplicates the communicator
//! once more (collectively) and starts one progress thread owning a second `Communicator` over
//! that duplicate. `iallreduce`, `iallreduce_mean`, `ireduce_scatter` and `isendrecv` copy their
//! input and queue the blocking operation there with the caller's current policy, bound and
//! settings; the thread runs the queue in order, so all ranks must issue their non-blocking
//! operations in the same order (as for MPI's non-blocking collectives). The calling thread may
//! keep communicating meanwhile (its messages use the other communicator). Results are
//! identical to the blocking calls (same algorithm, same bound split), and a mismatch is an
//! error in every rank's request. [`Communicator::has_progress_thread`] tells whether they are
//! available.
//!
//! # Chunk pipelining of large point-to-point messages
//!
//! A `send`/`isend`/`sendrecv` payload that is compressed and larger than
//! [`Config::pipeline_min_bytes`] (default 64 MiB) is cut into chunks of
//! [`Config::chunk_bytes`] (default 32 MiB; a multiple of the element's lanes, so complex values
//! are never split), each compressed into its own stream and sent as its own message on the user
//! tag. The descriptor carries the chunk length (the payload size field is then 0), so the
//! receiver knows the chunk count and ranges; it learns each chunk's compressed size by probing.
//! The sender compresses chunk `k+1` while chunk `k` is in flight (non-blocking sends), the
//! receiver posts the receive of chunk `k+1` and then decompresses chunk `k`. `sendrecv` runs both
//! directions in one schedule; either side may pipeline independently of the other (the decision
//! is the sender's). The agreement protocol is unchanged: descriptors first, every announced chunk
//! is drained even on a mismatch, then the verdicts, so a mismatch is an error on both ends and the
//! tag stays usable. With `noa` bounds each chunk is bounded relative to its own value range (at
//! most the whole message's). The schedule is generic over a chunk codec: host slices with any
//! [`Compressor`], and device buffers (feature `cuda`, `sendrecv_device`: GPU compression + D2H
//! per chunk). [`Communicator::pipeline_chunks`] counts the chunks moved.
//!
//! # Allreduce with an end-to-end bound
//!
//! The compressed allreduce is a ring reduce-scatter followed by a compressed allgather.
//! With `p` ranks the buffer is cut into `p` segments; in reduce-scatter step `s = 0..p-2` rank
//! `r` compresses its partial sum of segment `(r-s-1) mod p`, sends it to `r+1`, receives the
//! partial of segment `(r-s-2) mod p` from `r-1`, decompresses it and adds its own values. After
//! `p-1` steps rank `r` holds the sum of segment `r`; it compresses it once and the streams are
//! allgathered (forwarded as bytes, never requantized). So **every element passes through exactly
//! `p` quantizations**: `p-1` of partial sums and 1 of the final value (`p-1` for
//! `reduce_scatter`), plus `p-1` floating-point additions (and one division for the mean).
//!
//! Given the bound `E` on the result (`abs:E`, or `noa:E` meaning `E·(max-min)` over all ranks'
//! inputs, obtained with an allreduce of min/max first), let `M` be the largest finite `|x|` over
//! all inputs, `u` the unit roundoff of the dtype, `d` the divisor (1 for sum, `p` for mean) and
//! `B = p·M + E·d` a bound on every partial sum. The rounding of the additions and the division
//! is bounded by `R = p·u·B/d`. Each quantization gets `eb = (E - R)/p` (in result units; a
//! partial sum is quantized with `eb·d`), so the total error is at most
//! `(p-1)·eb + eb + R = E`. When `eb` is not usable (`E <= R`, or non-finite inputs) or the policy
//! says raw, the native MPI allreduce runs instead (rounding error only). `rel` bounds are not
//! supported for reductions.
//!
//! The final values are identical on every rank (the owner of a segment uses the decompressed
//! form of its own stream too). Allgather and bcast likewise give every rank the same values.

mod compressor;
#[cfg(feature = "cuda")]
pub mod device;
#[cfg(feature = "cuda")]
pub mod device_ring;
mod element;
#[cfg(feature = "nccl")]
pub mod nccl;
mod pipeline;
mod progress;
mod ring;
pub mod transport;
pub mod watchdog;

use std::fmt;
use std::ops::Range;
use std::path::PathBuf;

pub use compressor::{Compressor, CpuCompressor};
#[cfg(feature = "cuda")]
pub use device::{
    DeviceAllgatherRequest, DeviceBcastRequest, DeviceProfile, DeviceRequest, DeviceStager,
    GpuCompressor, StageTimes, Staged,
};
pub use element::{CommElement, Real};
pub use progress::OpRequest;
#[cfg(feature = "mpi")]
pub use transport::MpiTransport;
pub use transport::{PendingBytes, ReduceOp, SendHandle, Transport};

use crate::codec::CodecKind;
use crate::error::{Error, Result};
use crate::format::Dtype;
use crate::model::{self, choice, Link, Policy, Profile, RatioCache, Scenario};
use crate::quant::ErrorBound;
use element::{dtype_name, scalar_bytes, scalars_from_bytes};
use pipeline::ChunkCodec;

/// Point-to-point tags must be below this (larger tags are the communicator's own).
pub const MAX_USER_TAG: i32 = 4096;
const TAG_DESC: i32 = 8192;
const TAG_VERDICT: i32 = 12288;
const TAG_RING: i32 = 16384;
const TAG_PING: i32 = 16385;

const OP_SEND: u8 = 1;
const OP_RECV: u8 = 2;
const OP_SENDRECV: u8 = 3;
const OP_ALLGATHER: u8 = 4;
const OP_ALLREDUCE: u8 = 5;
const OP_REDUCE_SCATTER: u8 = 6;
const OP_BCAST: u8 = 7;
const OP_ALLREDUCE_MEAN: u8 = 8;

/// Receive any element count (`recv_vec`).
const ANY_COUNT: u64 = u64::MAX;

fn op_name(op: u8) -> &'static str {
    match op {
        OP_SEND => "send",
        OP_RECV => "recv",
        OP_SENDRECV => "sendrecv",
        OP_ALLGATHER => "allgather",
        OP_ALLREDUCE => "allreduce",
        OP_REDUCE_SCATTER => "reduce_scatter",
        OP_BCAST => "bcast",
        OP_ALLREDUCE_MEAN => "allreduce_mean",
        _ => "unknown",
    }
}

/// Where the calibration profile comes from.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Calibration {
    /// Load the cached profile file if it exists, else measure and save it (default).
    LoadOrMeasure,
    /// Measure now and overwrite the cache.
    Measure,
    /// Use this profile; measure nothing.
    Fixed(Profile),
}

/// Communicator settings (all ranks must use the same policy and bound).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Config {
    /// When to compress.
    pub policy: Policy,
    /// Error bound of every compressed value (for reductions: of the result).
    pub bound: ErrorBound,
    /// Compute the actual max error of what this rank sends (costs one extra decompression).
    pub verify: bool,
    /// Profile source.
    pub calibration: Calibration,
    /// Profile cache path (default: [`Profile::default_path`]).
    pub profile_path: Option<PathBuf>,
    /// Codec chunks (32,768 values) compressed to estimate a message's ratio.
    pub sample_chunks: usize,
    /// Message size of the bandwidth ping-pong in calibration (bytes).
    pub pingpong_bytes: usize,
    /// Chunk size of pipelined point-to-point messages (uncompressed bytes; default 32 MiB).
    pub chunk_bytes: usize,
    /// Compressed point-to-point messages larger than this (uncompressed bytes; default 64 MiB)
    /// are chunk-pipelined (see the [module docs](self)).
    pub pipeline_min_bytes: usize,
}

impl Config {
    /// Default policy (`Auto(aatrox)`) with `bound`.
    pub fn new(bound: ErrorBound) -> Self {
        Config {
            policy: Policy::default(),
            bound,
            verify: false,
            calibration: Calibration::LoadOrMeasure,
            profile_path: None,
            sample_chunks: 4,
            pingpong_bytes: 16 << 20,
            chunk_bytes: 32 << 20,
            pipeline_min_bytes: 64 << 20,
        }
    }
    /// With a pipeline chunk size and threshold (uncompressed bytes; a message is pipelined when
    /// it is compressed, larger than `min_bytes` and longer than one chunk).
    pub fn with_pipeline(mut self, chunk_bytes: usize, min_bytes: usize) -> Self {
        self.chunk_bytes = chunk_bytes.max(16);
        self.pipeline_min_bytes = min_bytes;
        self
    }
    /// With a ping-pong message size for calibration.
    pub fn with_pingpong_bytes(mut self, b: usize) -> Self {
        self.pingpong_bytes = b.max(1 << 16);
        self
    }
    /// With a policy.
    pub fn with_policy(mut self, p: Policy) -> Self {
        self.policy = p;
        self
    }
    /// With max-error verification on the sending side.
    pub fn with_verify(mut self, v: bool) -> Self {
        self.verify = v;
        self
    }
    /// With a calibration source.
    pub fn with_calibration(mut self, c: Calibration) -> Self {
        self.calibration = c;
        self
    }
    /// With a profile cache path.
    pub fn with_profile_path(mut self, p: impl Into<PathBuf>) -> Self {
        self.profile_path = Some(p.into());
        self
    }
}

/// What an operation did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Decision {
    /// Sent uncompressed.
    Raw,
    /// Sent compressed.
    Compressed,
}

/// Per-operation report (also logged with `tracing::debug!`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct OpStats {
    /// Operation name.
    pub op: &'static str,
    /// Raw or compressed.
    pub decision: Decision,
    /// Codec used (when compressed).
    pub codec: Option<CodecKind>,
    /// Ratio the decision was based on (1 when not estimated).
    pub ratio_estimate: f64,
    /// Ratio achieved on what this rank sent (uncompressed bytes / bytes sent).
    pub ratio: f64,
    /// Uncompressed bytes this rank's sends represent.
    pub bytes: u64,
    /// Bytes this rank put on the wire (payloads only).
    pub wire_bytes: u64,
    /// Model: time of the raw path (s).
    pub predicted_raw_s: f64,
    /// Model: time of the compressed path (s).
    pub predicted_compressed_s: f64,
    /// Model: time of the chosen path (s).
    pub predicted_s: f64,
    /// Measured wall time of the whole call on this rank (s).
    pub measured_s: f64,
    /// Guaranteed absolute error per value (abs/noa), `E` for rel, 0 when raw.
    pub bound: f64,
    /// Measured max error of this rank's sent values, when verification is on.
    pub max_error: Option<f64>,
}

impl OpStats {
    fn raw(op: u8) -> Self {
        OpStats {
            op: op_name(op),
            decision: Decision::Raw,
            codec: None,
            ratio_estimate: 1.0,
            ratio: 1.0,
            bytes: 0,
            wire_bytes: 0,
            predicted_raw_s: 0.0,
            predicted_compressed_s: 0.0,
            predicted_s: 0.0,
            measured_s: 0.0,
            bound: 0.0,
            max_error: None,
        }
    }
    /// `(measured - predicted) / predicted`.
    pub fn prediction_error(&self) -> f64 {
        (self.measured_s - self.predicted_s) / self.predicted_s
    }
}

impl fmt::Display for OpStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {:?}{} ratio {:.2} (est {:.2}) {} B -> {} B, time {:.3} ms (predicted {:.3} ms; raw {:.3} ms, compressed {:.3} ms), bound {:.3e}",
            self.op,
            self.decision,
            self.codec.map(|c| format!("[{c}]")).unwrap_or_default(),
            self.ratio,
            self.ratio_estimate,
            self.bytes,
            self.wire_bytes,
            self.measured_s * 1e3,
            self.predicted_s * 1e3,
            self.predicted_raw_s * 1e3,
            self.predicted_compressed_s * 1e3,
            self.bound
        )?;
        if let Some(e) = self.max_error {
            write!(f, ", max error {e:.3e}")?;
        }
        Ok(())
    }
}

const DESC_LEN: usize = 80;
const DESC_MAGIC: u32 = 0x3144_435a; // "ZCD1"

/// The agreement record exchanged before every operation.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Desc {
    op: u8,
    dtype: u8,
    policy: u8,
    mode: u8,
    decision: u8,
    root: u32,
    bound: f64,
    count: u64,
    payload: u64,
    ratio: f64,
    seq: u64,
    /// Smallest finite value of the local input (reductions), +inf if none.
    lo: f64,
    /// Largest finite value of the local input (reductions), -inf if none.
    hi: f64,
    /// 1 when this rank rejected its own arguments (so every rank fails together).
    bad: u8,
    /// Bit 0: verification on (reductions then run an extra exact reduction on every rank).
    flags: u8,
    /// Point-to-point: scalars per pipelined chunk (0: the payload is one message).
    chunk: u64,
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
        b[12..16].copy_from_slice(&self.root.to_le_bytes());
        b[16..24].copy_from_slice(&self.bound.to_le_bytes());
        b[24..32].copy_from_slice(&self.count.to_le_bytes());
        b[32..40].copy_from_slice(&self.payload.to_le_bytes());
        b[40..48].copy_from_slice(&self.ratio.to_le_bytes());
        b[48..56].copy_from_slice(&self.seq.to_le_bytes());
        b[56..64].copy_from_slice(&self.lo.to_le_bytes());
        b[64..72].copy_from_slice(&self.hi.to_le_bytes());
        b[72..80].copy_from_slice(&self.chunk.to_le_bytes());
        b[9] = self.bad;
        b[10] = self.flags;
        b
    }
    fn parse(b: &[u8]) -> Result<Self> {
        if b.len() != DESC_LEN || b[0..4] != DESC_MAGIC.to_le_bytes() {
            return Err(Error::Comm(format!(
                "malformed descriptor from peer ({} bytes): the ranks are not running the same operation",
                b.len()
            )));
        }
        let u64at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        Ok(Desc {
            op: b[4],
            dtype: b[5],
            policy: b[6],
            mode: b[7],
            decision: b[8],
            root: u32::from_le_bytes(b[12..16].try_into().unwrap()),
            bound: f64::from_bits(u64at(16)),
            count: u64at(24),
            payload: u64at(32),
            ratio: f64::from_bits(u64at(40)),
            seq: u64at(48),
            lo: f64::from_bits(u64at(56)),
            hi: f64::from_bits(u64at(64)),
            bad: b[9],
            flags: b[10],
            chunk: u64at(72),
        })
    }
}

fn mismatch(what: &'static str, expected: String, found: String) -> Error {
    Error::Mismatch {
        what,
        expected,
        found,
    }
}

fn mode_name(m: u8) -> &'static str {
    match m {
        1 => "abs",
        2 => "noa",
        3 => "rel",
        _ => "?",
    }
}

fn fmt_policy(tag: u8) -> String {
    let codec = CodecKind::from_tag(tag & 0xf)
        .map(|c| c.to_string())
        .unwrap_or_default();
    match tag >> 4 {
        0 => "never".into(),
        1 => format!("auto:{codec}"),
        2 => format!("always:{codec}"),
        _ => format!("?{tag}"),
    }
}

/// Check that a sender's descriptor matches the receiver's expectation (same answer on both).
fn check_pair(s: &Desc, r: &Desc) -> Result<()> {
    let pair_ok =
        (s.op == OP_SEND && r.op == OP_RECV) || (s.op == OP_SENDRECV && r.op == OP_SENDRECV);
    if !pair_ok {
        return Err(mismatch(
            "operation",
            format!("{} matched by its counterpart", op_name(s.op)),
            format!("{} against {}", op_name(s.op), op_name(r.op)),
        ));
    }
    if s.dtype != r.dtype {
        return Err(mismatch(
            "dtype",
            dtype_name(r.dtype).into(),
            dtype_name(s.dtype).into(),
        ));
    }
    if r.count != ANY_COUNT && s.count != r.count {
        return Err(mismatch(
            "element count",
            r.count.to_string(),
            s.count.to_string(),
        ));
    }
    if s.policy != r.policy {
        return Err(mismatch(
            "policy/codec",
            fmt_policy(r.policy),
            fmt_policy(s.policy),
        ));
    }
    if s.mode != r.mode || s.bound.to_bits() != r.bound.to_bits() {
        return Err(mismatch(
            "error bound",
            format!("{}:{:e}", mode_name(r.mode), r.bound),
            format!("{}:{:e}", mode_name(s.mode), s.bound),
        ));
    }
    Ok(())
}

/// Check a gathered table of collective descriptors (identical result on every rank).
fn check_table(all: &[Desc]) -> Result<()> {
    if let Some(r) = all.iter().position(|d| d.bad != 0) {
        return Err(Error::Comm(format!(
            "{}: rank {r} rejected its arguments",
            op_name(all[r].op)
        )));
    }
    let a = &all[0];
    for (r, d) in all.iter().enumerate().skip(1) {
        let who = |x: String, y: String| (format!("{x} (rank 0)"), format!("{y} (rank {r})"));
        if d.op != a.op || d.seq != a.seq {
            let (e, f) = who(
                format!("{} #{}", op_name(a.op), a.seq),
                format!("{} #{}", op_name(d.op), d.seq),
            );
            return Err(mismatch("collective operation", e, f));
        }
        if d.dtype != a.dtype {
            let (e, f) = who(dtype_name(a.dtype).into(), dtype_name(d.dtype).into());
            return Err(mismatch("dtype", e, f));
        }
        if d.count != a.count {
            let (e, f) = who(a.count.to_string(), d.count.to_string());
            return Err(mismatch("element count", e, f));
        }
        if d.policy != a.policy {
            let (e, f) = who(fmt_policy(a.policy), fmt_policy(d.policy));
            return Err(mismatch("policy/codec", e, f));
        }
        if d.mode != a.mode || d.bound.to_bits() != a.bound.to_bits() {
            let (e, f) = who(
                format!("{}:{:e}", mode_name(a.mode), a.bound),
                format!("{}:{:e}", mode_name(d.mode), d.bound),
            );
            return Err(mismatch("error bound", e, f));
        }
        if d.flags != a.flags {
            let (e, f) = who(
                format!("flags {:#x}", a.flags),
                format!("flags {:#x}", d.flags),
            );
            return Err(mismatch("verify setting", e, f));
        }
        if d.root != a.root {
            let (e, f) = who(a.root.to_string(), d.root.to_string());
            return Err(mismatch("root", e, f));
        }
    }
    Ok(())
}

/// Split `n` elements into `p` contiguous segments (the first `n % p` get one more).
pub fn partition(n: usize, p: usize) -> Vec<Range<usize>> {
    let (q, rem) = (n / p, n % p);
    let mut out = Vec::with_capacity(p);
    let mut lo = 0;
    for k in 0..p {
        let len = q + usize::from(k < rem);
        out.push(lo..lo + len);
        lo += len;
    }
    out
}

/// The absolute bound on a reduction's result for the configured `bound`: `abs:E` → `E`,
/// `noa:E` → `E` × the global value range `[lo, hi]` (0 without finite values), `rel` → NaN
/// (not supported for reductions).
pub(crate) fn reduction_result_bound(bound: ErrorBound, lo: f64, hi: f64) -> f64 {
    match bound {
        ErrorBound::Abs(e) => e,
        ErrorBound::Noa(e) if hi >= lo => e * (hi - lo),
        ErrorBound::Noa(_) => 0.0,
        ErrorBound::Rel(_) => f64::NAN,
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
    let m = if max_abs.is_finite() {
        max_abs
    } else {
        return None;
    };
    let b = pf * m + e * divisor;
    let r = pf * unit_roundoff * b / divisor;
    let eb = (e - r) / quantizations.max(1) as f64;
    (eb.is_finite() && eb > 0.0).then_some(eb)
}

fn max_abs_diff<S: Real>(a: &[S], b: &[S]) -> f64 {
    use rayon::prelude::*;
    a.par_iter()
        .zip(b.par_iter())
        .map(|(x, y)| {
            let (x, y) = (x.to_f64(), y.to_f64());
            if x.is_finite() || y.is_finite() {
                (x - y).abs()
            } else {
                0.0
            }
        })
        .reduce(|| 0.0, f64::max)
}

/// A pending non-blocking send ([`Communicator::isend`]).
pub struct SendRequest {
    handles: Vec<Box<dyn SendHandle>>,
    desc: Desc,
    dest: usize,
    tag: i32,
    stats: OpStats,
    t0: f64,
    /// A compression error of a pipelined send (reported by `wait_send`).
    error: Option<Error>,
}

/// An encoded point-to-point payload.
enum Payload<'a> {
    /// One message (raw or compressed bytes).
    Bytes(std::borrow::Cow<'a, [u8]>),
    /// Compressed chunk by chunk by the pipeline.
    Chunked { chunk: usize, codec: CodecKind },
}

impl fmt::Debug for SendRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SendRequest(dest {}, tag {})", self.dest, self.tag)
    }
}

/// A pending non-blocking allgather ([`Communicator::iallgather`]).
pub struct AllgatherRequest<E: CommElement> {
    pending: Box<dyn transport::PendingBytes>,
    compressed: bool,
    n: usize,
    st: OpStats,
    t0: f64,
    verify: Option<Vec<E::Scalar>>,
}

impl<E: CommElement> AllgatherRequest<E> {
    /// Whether the transfer has completed (never blocks).
    pub fn test(&mut self) -> Result<bool> {
        self.pending.test()
    }
}

impl<E: CommElement> fmt::Debug for AllgatherRequest<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AllgatherRequest({} x {})", self.n, E::NAME)
    }
}

/// A pending non-blocking broadcast ([`Communicator::ibcast`]).
pub struct BcastRequest<E: CommElement> {
    pending: Box<dyn transport::PendingBytes>,
    compressed: bool,
    n: usize,
    root: usize,
    st: OpStats,
    t0: f64,
    verify: Option<Vec<E::Scalar>>,
}

impl<E: CommElement> BcastRequest<E> {
    /// Whether the transfer has completed (never blocks).
    pub fn test(&mut self) -> Result<bool> {
        self.pending.test()
    }
}

impl<E: CommElement> fmt::Debug for BcastRequest<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "BcastRequest({} x {} from {})",
            self.n,
            E::NAME,
            self.root
        )
    }
}

/// A pending receive ([`Communicator::irecv`]): nothing is posted until it is waited on; `test`
/// reports whether the sender's message has arrived.
#[derive(Debug, Clone, Copy)]
pub struct RecvRequest {
    src: usize,
    tag: i32,
}

impl RecvRequest {
    /// Whether the sender's descriptor has arrived (never blocks).
    pub fn test(&self, comm: &Communicator) -> Result<bool> {
        comm.transport.iprobe(self.src, TAG_DESC + self.tag)
    }
    /// Complete the receive into `out`.
    pub fn wait<E: CommElement>(self, comm: &mut Communicator, out: &mut [E]) -> Result<OpStats> {
        let _watchdog = watchdog::arm("irecv wait");
        comm.recv(out, self.src, self.tag)
    }
}

/// Compressed communication over a [`Transport`]. See the [module docs](self).
pub struct Communicator {
    transport: Box<dyn Transport>,
    compressor: std::sync::Arc<dyn Compressor>,
    config: Config,
    profile: Profile,
    ratios: RatioCache,
    seq: u64,
    /// Pipelined chunks sent + received so far.
    chunks: u64,
    /// The progress thread of the non-blocking reductions (dropped before MPI is finalized).
    worker: Option<progress::Worker>,
    #[cfg(feature = "mpi")]
    _universe: Option<mpi::environment::Universe>,
}

impl fmt::Debug for Communicator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Communicator(rank {} of {}, {}, {}, {})",
            self.rank(),
            self.size(),
            self.config.policy,
            self.config.bound,
            self.compressor.name()
        )
    }
}

impl Communicator {
    /// Initialize MPI (if not yet initialized, asking for `MPI_THREAD_MULTIPLE`) and build a
    /// communicator over a duplicate of `MPI_COMM_WORLD` with the CPU codec. Collective:
    /// calibrates or loads the profile; with `MPI_THREAD_MULTIPLE` also duplicates the
    /// communicator once more for the progress thread of the non-blocking reductions.
    #[cfg(feature = "mpi")]
    pub fn init(config: Config) -> Result<Self> {
        Self::init_with(config, Box::new(CpuCompressor))
    }

    /// [`init`](Self::init) with another compressor (e.g. `device::GpuCompressor`).
    #[cfg(feature = "mpi")]
    pub fn init_with(config: Config, compressor: Box<dyn Compressor>) -> Result<Self> {
        use mpi::environment::Threading;
        let universe = mpi::initialize_with_threading(Threading::Multiple).map(|(u, _)| u);
        let world = mpi::topology::SimpleCommunicator::world();
        let t = MpiTransport::new(&world);
        let compressor: std::sync::Arc<dyn Compressor> = std::sync::Arc::from(compressor);
        let mut c = Self::build(Box::new(t), compressor.clone(), config)?;
        c._universe = universe;
        if mpi::environment::threading_support() == Threading::Multiple {
            // collective (every rank sees the same thread level)
            let wt = SendTransport(MpiTransport::new(&world));
            let config = Config {
                calibration: Calibration::Fixed(c.profile.clone()),
                ..c.config.clone()
            };
            c.worker = Some(progress::Worker::start(Box::new(move || {
                let wt = wt;
                Self::build(Box::new(wt.0), compressor, config)
            }))?);
        }
        Ok(c)
    }

    /// Build over any transport and compressor. Collective over the transport's ranks. When the
    /// transport can [duplicate](Transport::duplicate) itself (the loopback can), the
    /// non-blocking reductions get a progress thread over the duplicate, as with MPI.
    pub fn with_transport(
        transport: Box<dyn Transport>,
        compressor: Box<dyn Compressor>,
        config: Config,
    ) -> Result<Self> {
        let dup = transport.duplicate()?;
        let compressor: std::sync::Arc<dyn Compressor> = std::sync::Arc::from(compressor);
        let mut c = Self::build(transport, compressor.clone(), config)?;
        if let Some(dup) = dup {
            let config = Config {
                calibration: Calibration::Fixed(c.profile.clone()),
                ..c.config.clone()
            };
            c.worker = Some(progress::Worker::start(Box::new(move || {
                Self::build(dup, compressor, config)
            }))?);
        }
        Ok(c)
    }

    fn build(
        transport: Box<dyn Transport>,
        compressor: std::sync::Arc<dyn Compressor>,
        config: Config,
    ) -> Result<Self> {
        config.bound.validate()?;
        watchdog::init(transport.rank())?;
        let mut c = Communicator {
            transport,
            compressor,
            profile: Profile::new(Link {
                bandwidth: 10e9,
                latency: 2e-6,
            }),
            config,
            ratios: RatioCache::default(),
            seq: 0,
            chunks: 0,
            worker: None,
            #[cfg(feature = "mpi")]
            _universe: None,
        };
        c.setup_profile()?;
        Ok(c)
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.transport.rank()
    }
    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.transport.size()
    }
    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }
    /// The calibration profile in use (identical on all ranks).
    pub fn profile(&self) -> &Profile {
        &self.profile
    }
    /// The transport.
    pub fn transport(&self) -> &dyn Transport {
        &*self.transport
    }
    /// Change the policy (all ranks must do the same before their next operation).
    pub fn set_policy(&mut self, p: Policy) {
        self.config.policy = p;
    }
    /// Turn max-error verification on or off (all ranks together: reductions then run an extra
    /// exact f64 reduction, collectively).
    pub fn set_verify(&mut self, v: bool) {
        self.config.verify = v;
    }
    /// Change the bound (all ranks must do the same before their next operation).
    pub fn set_bound(&mut self, b: ErrorBound) -> Result<()> {
        b.validate()?;
        self.config.bound = b;
        Ok(())
    }
    /// Change the point-to-point pipeline chunk size and threshold (see
    /// [`Config::with_pipeline`]); each sender decides alone, receivers follow its descriptor.
    pub fn set_pipeline(&mut self, chunk_bytes: usize, min_bytes: usize) {
        self.config = self.config.clone().with_pipeline(chunk_bytes, min_bytes);
    }
    /// Pipelined chunks this rank has sent and received so far (0 while every message went as
    /// one piece).
    pub fn pipeline_chunks(&self) -> u64 {
        self.chunks
    }
    /// Synchronize all ranks.
    pub fn barrier(&self) -> Result<()> {
        let _watchdog = watchdog::arm("barrier");
        self.transport.barrier()
    }
    /// Wall-clock seconds.
    pub fn wtime(&self) -> f64 {
        self.transport.wtime()
    }

    // ----------------------------------------------------------------- calibration

    fn setup_profile(&mut self) -> Result<()> {
        let key = format!("{}-p{}-{}", hostname(), self.size(), self.compressor.name());
        let path = self
            .config
            .profile_path
            .clone()
            .unwrap_or_else(|| Profile::default_path(&key));
        match self.config.calibration.clone() {
            Calibration::Fixed(p) => {
                self.profile = p;
                return Ok(());
            }
            Calibration::LoadOrMeasure => {
                // rank 0 reads the file; everybody gets its bytes (empty: none).
                let mut bytes = if self.rank() == 0 {
                    std::fs::read(&path).unwrap_or_default()
                } else {
                    Vec::new()
                };
                self.transport.bcast(0, &mut bytes)?;
                if !bytes.is_empty() {
                    if let Some(p) = Profile::from_cache(&bytes, &path) {
                        if p.ranks == self.size() && p.compressor == self.compressor.name() {
                            tracing::debug!(target: "zcomm::comm", path = %path.display(), "loaded profile");
                            self.profile = p;
                            return Ok(());
                        }
                    }
                }
            }
            Calibration::Measure => {}
        }
        let p = self.calibrate()?;
        if self.rank() == 0 {
            if let Err(e) = p.save(&path) {
                tracing::warn!(target: "zcomm::comm", "cannot save profile {}: {e}", path.display());
            }
        }
        self.profile = p;
        Ok(())
    }

    /// Measure the link (ping-pong between ranks 0 and 1) and the codec throughput (all ranks at
    /// once, slowest rank counts), and agree on the result. Collective.
    pub fn calibrate(&mut self) -> Result<Profile> {
        let t = &*self.transport;
        let (r, p) = (t.rank(), t.size());
        let mut link = Link {
            bandwidth: 10e9,
            latency: 2e-6,
        };
        if p > 1 {
            t.barrier()?;
            let mut vals = [0.0f64; 2];
            if r < 2 {
                let peer = 1 - r;
                let small = [0u8; 8];
                let big = vec![1u8; self.config.pingpong_bytes];
                let mut back = vec![0u8; big.len()];
                let lat_rt = pingpong(t, r, peer, &small, 50)?;
                let lat = lat_rt / 2.0;
                // bandwidth: simultaneous exchanges (what sendrecv and ring steps do) into
                // preallocated buffers, one warm-up
                let reps = ((256usize << 20) / big.len()).clamp(2, 8);
                t.sendrecv_sized(peer, &big, peer, &mut back, TAG_PING)?;
                let t0 = t.wtime();
                for _ in 0..reps {
                    t.sendrecv_sized(peer, &big, peer, &mut back, TAG_PING)?;
                }
                let each = ((t.wtime() - t0) / reps as f64 - lat).max(1e-9);
                vals = [lat, big.len() as f64 / each];
            }
            t.allreduce_f64(&mut vals, ReduceOp::Max)?;
            link = Link {
                latency: vals[0],
                bandwidth: vals[1],
            };
        }
        let codec = self.config.policy.codec().unwrap_or_default();
        // every codec, so that `Auto` can choose among them per message
        let mut codecs = Vec::new();
        for (&c, dt) in CodecKind::WITH_GPU
            .iter()
            .flat_map(|c| [(c, Dtype::F32), (c, Dtype::F64)])
        {
            t.barrier()?;
            let s = measure_compressor(&*self.compressor, c, dt, 1 << 21)?;
            let mut v = [-s.compress, -s.decompress];
            t.allreduce_f64(&mut v, ReduceOp::Max)?; // min of throughputs
            codecs.push(model::CodecSpeed {
                compress: -v[0],
                decompress: -v[1],
                ..s
            });
        }
        // the native allreduce (the raw path of allreduce): small and large buffer
        let mut allreduce = None;
        if p > 1 {
            let big = vec![1.0f32; (self.config.pingpong_bytes / 4).max(1)];
            let mut o = vec![0.0f32; big.len()];
            let small = [1.0f32; 2];
            let mut os = [0.0f32; 2];
            let time = |input: &[f32], out: &mut [f32], reps: usize| -> Result<f64> {
                t.allreduce_sum_f32(input, out)?; // warm-up
                t.barrier()?;
                let t0 = t.wtime();
                for _ in 0..reps {
                    t.allreduce_sum_f32(input, out)?;
                }
                Ok((t.wtime() - t0) / reps as f64)
            };
            let ts = time(&small, &mut os, 20)?;
            let tb = time(&big, &mut o, 4)?;
            let mut v = [ts, tb];
            t.allreduce_f64(&mut v, ReduceOp::Max)?;
            allreduce = Some(Link {
                latency: v[0],
                bandwidth: (big.len() * 4) as f64 / (v[1] - v[0]).max(1e-9),
            });
        }
        let mut prof = Profile::new(link);
        prof.allreduce = allreduce;
        prof.host = hostname();
        prof.ranks = p;
        prof.compressor = self.compressor.name();
        prof.codecs = codecs;
        // everybody uses rank 0's exact numbers
        let mut bytes = if r == 0 {
            prof.to_json().into_bytes()
        } else {
            Vec::new()
        };
        t.bcast(0, &mut bytes)?;
        let prof = Profile::from_json(&String::from_utf8_lossy(&bytes))?;
        if let Some(cs) = prof.codec_speed(codec, Dtype::F32) {
            tracing::info!(target: "zcomm::comm", "calibrated: link {} latency {:.1} us; {codec} f32 compress {} decompress {}",
                model::fmt_rate(prof.link.bandwidth), prof.link.latency * 1e6,
                model::fmt_rate(cs.compress), model::fmt_rate(cs.decompress));
        }
        Ok(prof)
    }

    fn speeds<S: Real>(&self, codec: CodecKind) -> (f64, f64) {
        self.profile
            .codec_speed(codec, S::DTYPE)
            .map(|c| (c.compress, c.decompress))
            .unwrap_or((1e9, 2e9))
    }

    /// The codecs `Auto(preferred)` chooses among for messages of `S`: `preferred` first (it
    /// wins ties), then every other codec the profile has speeds for.
    fn candidates<S: Real>(&self, preferred: CodecKind) -> Vec<CodecKind> {
        let mut v = vec![preferred];
        v.extend(
            self.profile
                .codecs
                .iter()
                .filter(|c| c.dtype == S::DTYPE.tag() && c.codec != preferred)
                .map(|c| c.codec),
        );
        v.dedup();
        v
    }

    // ----------------------------------------------------------------- helpers

    fn local_desc<E: CommElement>(&self, op: u8, count: usize) -> Desc {
        Desc {
            op,
            dtype: E::TAG,
            policy: self.config.policy.tag(),
            mode: self.config.bound.mode().tag(),
            decision: 0,
            root: 0,
            bound: self.config.bound.value(),
            count: count as u64,
            payload: 0,
            ratio: 1.0,
            seq: self.seq,
            lo: f64::INFINITY,
            hi: f64::NEG_INFINITY,
            bad: 0,
            flags: u8::from(self.config.verify),
            chunk: 0,
        }
    }

    /// Allgather the descriptors and check them. `local` is this rank's own argument check: when
    /// it failed, every rank fails (this one with its own error).
    fn agree(&mut self, mut d: Desc, local: Result<()>) -> Result<Vec<Desc>> {
        self.seq += 1;
        d.bad = u8::from(local.is_err());
        let raw = self.transport.allgather_fixed(&d.to_bytes())?;
        local?;
        let all = raw
            .chunks_exact(DESC_LEN)
            .map(Desc::parse)
            .collect::<Result<Vec<_>>>()?;
        check_table(&all)?;
        Ok(all)
    }

    /// Ratio estimate of a message: previous same-tag message, else a sample.
    fn estimate<S: Real>(
        &mut self,
        data: &[S],
        bound: ErrorBound,
        codec: CodecKind,
        op: u8,
        tag: i64,
    ) -> Result<(f64, Option<Vec<u8>>)> {
        if let Some(r) = self.ratios.get_fresh(op, tag) {
            return Ok((r, None));
        }
        if data.is_empty() {
            return Ok((1.0, None));
        }
        const CHUNK: usize = 1 << crate::codec::blocked::CHUNK_LOG2;
        let k = self.config.sample_chunks.max(1);
        let (r, s) = if data.len() <= k * CHUNK {
            let s = S::compress_with(&*self.compressor, data, bound, codec)?;
            ((data.len() * S::SIZE) as f64 / s.len() as f64, Some(s))
        } else {
            (model::estimate_ratio(data, bound, codec, k)?.0, None)
        };
        // remembered for the next messages with this tag (refreshed after a few uses)
        self.ratios.put(op, tag, r);
        Ok((r, s))
    }

    fn p2p_times<S: Real>(&self, n: usize, ratio: f64, codec: CodecKind) -> (f64, f64) {
        let (tc, td) = self.speeds::<S>(codec);
        let p = model::predict(&Scenario::new(
            (n * S::SIZE) as f64,
            ratio,
            self.profile.link,
            tc,
            td,
        ));
        (p.raw_serial, p.compressed_serial)
    }

    /// Encode one point-to-point payload: decides, compresses or passes through raw. With
    /// `lanes` (scalars per element) a large compressed message is left to the chunk pipeline
    /// ([`Payload::Chunked`]); `None` never chunks.
    fn encode_p2p<'a, S: Real>(
        &mut self,
        data: &'a [S],
        op: u8,
        tag: i32,
        lanes: Option<usize>,
    ) -> Result<(Payload<'a>, OpStats)> {
        let mut st = OpStats::raw(op);
        st.bytes = (data.len() * S::SIZE) as u64;
        let bound = self.config.bound;
        let (compress, codec, est, stream) = match self.config.policy {
            Policy::Never => (false, None, 1.0, None),
            Policy::Always(c) => (true, Some(c), 1.0, None),
            Policy::Auto(preferred) => {
                let mut cands = Vec::new();
                let mut streams = Vec::new();
                let mut raw_t = 0.0;
                for c in self.candidates::<S>(preferred) {
                    // even an infinite ratio cannot pay: skip the estimate
                    let (tr, best) = self.p2p_times::<S>(data.len(), f64::INFINITY, c);
                    raw_t = tr;
                    if choice::choose(tr, [cand(c, f64::INFINITY, best)])
                        .codec
                        .is_none()
                    {
                        continue;
                    }
                    let (r, s) = self.estimate(data, bound, c, op, codec_key(tag as i64, c))?;
                    let (_, tcmp) = self.p2p_times::<S>(data.len(), r, c);
                    cands.push(cand(c, r, tcmp));
                    streams.push((c, s));
                }
                let ch = choice::choose(raw_t, cands);
                let est = ch.best.map_or(1.0, |b| b.ratio);
                match ch.codec {
                    Some(c) => {
                        let s = streams.into_iter().find(|(k, _)| *k == c).and_then(|x| x.1);
                        (true, Some(c), est, s)
                    }
                    None => (
                        false,
                        Some(ch.best.map_or(preferred, |b| b.codec)),
                        est,
                        None,
                    ),
                }
            }
        };
        st.ratio_estimate = est;
        let (tr, tcmp) = self.p2p_times::<S>(data.len(), est, codec.unwrap_or_default());
        st.predicted_raw_s = tr;
        st.predicted_compressed_s = tcmp;
        st.predicted_s = tr;
        if !compress || data.is_empty() {
            st.wire_bytes = st.bytes;
            return Ok((Payload::Bytes(scalar_bytes(data)), st));
        }
        let codec = codec.unwrap_or_default();
        if let Some(lanes) = lanes {
            let chunk = pipeline::chunk_scalars(self.config.chunk_bytes, S::SIZE, lanes);
            if st.bytes > self.config.pipeline_min_bytes as u64 && data.len() > chunk {
                st.decision = Decision::Compressed;
                st.codec = Some(codec);
                // the model's pipelined form with this chunk count
                let (sc, sd) = self.speeds::<S>(codec);
                let pr = model::predict(
                    &Scenario::new(st.bytes as f64, est, self.profile.link, sc, sd)
                        .with_chunks(pipeline::chunk_count(data.len(), chunk)),
                );
                st.predicted_compressed_s = pr.compressed_pipelined;
                st.predicted_s = pr.compressed_pipelined;
                st.bound = self.bound_of(data);
                return Ok((Payload::Chunked { chunk, codec }, st));
            }
        }
        let s = match stream {
            Some(s) => s,
            None => S::compress_with(&*self.compressor, data, bound, codec)?,
        };
        st.decision = Decision::Compressed;
        st.codec = Some(codec);
        st.predicted_s = tcmp;
        st.wire_bytes = s.len() as u64;
        st.ratio = st.bytes as f64 / s.len() as f64;
        st.bound = self.bound_of(data);
        self.ratios.put(op, codec_key(tag as i64, codec), st.ratio);
        if self.config.verify {
            let mut back = vec![S::default(); data.len()];
            S::decompress_with(&*self.compressor, &s, &mut back)?;
            st.max_error = Some(max_abs_diff(data, &back));
        }
        Ok((Payload::Bytes(std::borrow::Cow::Owned(s)), st))
    }

    /// Guaranteed abs bound for one compression of `data` (rel: E).
    fn bound_of<S: Real>(&self, data: &[S]) -> f64 {
        match self.config.bound {
            ErrorBound::Abs(e) | ErrorBound::Rel(e) => e,
            ErrorBound::Noa(e) => {
                let (lo, hi) = crate::quant::finite_range(data).unwrap_or((0.0, 0.0));
                e * (hi - lo)
            }
        }
    }

    fn decode_payload<S: Real>(
        &self,
        compressed: bool,
        payload: &[u8],
        out: &mut [S],
    ) -> Result<()> {
        if compressed {
            S::decompress_with(&*self.compressor, payload, out)
        } else {
            scalars_from_bytes(payload, out)
        }
    }

    fn finish(&self, mut st: OpStats, t0: f64) -> OpStats {
        st.measured_s = self.wtime() - t0;
        tracing::debug!(target: "zcomm::comm", rank = self.rank(), "{st}");
        st
    }

    fn check_tag(tag: i32) -> Result<()> {
        if !(0..MAX_USER_TAG).contains(&tag) {
            return Err(Error::invalid(format!(
                "tag {tag} outside 0..{MAX_USER_TAG}"
            )));
        }
        Ok(())
    }

    // ----------------------------------------------------------------- point to point

    /// Send `data` to `dest` (matched by [`recv`](Self::recv) / [`recv_vec`](Self::recv_vec)).
    /// Returns after the receiver has checked the message; a mismatch is an error on both ranks.
    pub fn send<E: CommElement>(&mut self, data: &[E], dest: usize, tag: i32) -> Result<OpStats> {
        let req = self.isend(data, dest, tag)?;
        self.wait_send(req)
    }

    /// Non-blocking send: compresses now, posts the descriptor and the payload, and returns;
    /// [`wait_send`](Self::wait_send) completes it and collects the receiver's verdict.
    pub fn isend<E: CommElement>(
        &mut self,
        data: &[E],
        dest: usize,
        tag: i32,
    ) -> Result<SendRequest> {
        Self::check_tag(tag)?;
        if dest >= self.size() {
            return Err(Error::invalid(format!("rank {dest} out of range")));
        }
        let t0 = self.wtime();
        let sc = E::scalars(data);
        let (payload, mut st) = self.encode_p2p(sc, OP_SEND, tag, Some(E::LANES))?;
        let mut d = self.local_desc::<E>(OP_SEND, data.len());
        d.decision = u8::from(st.decision == Decision::Compressed);
        d.ratio = st.ratio_estimate;
        let mut error = None;
        let handles = match payload {
            Payload::Bytes(payload) => {
                d.payload = payload.len() as u64;
                let h1 = self
                    .transport
                    .isend(dest, TAG_DESC + tag, d.to_bytes().to_vec())?;
                let h2 = self.transport.isend(dest, tag, payload.into_owned())?;
                vec![h1, h2]
            }
            Payload::Chunked { chunk, codec } => {
                // descriptor first, then chunk k is compressed while chunks < k are in flight
                d.chunk = chunk as u64;
                let mut hs =
                    vec![self
                        .transport
                        .isend(dest, TAG_DESC + tag, d.to_bytes().to_vec())?];
                let mut hc = pipeline::HostChunks {
                    compressor: &*self.compressor,
                    out: pipeline::Outgoing::Chunks {
                        data: sc,
                        chunk,
                        bound: self.config.bound,
                        codec,
                    },
                    inc: pipeline::Incoming::Discard,
                    verify: self.config.verify.then_some(0.0),
                };
                let mut wire = 0usize;
                for k in 0..pipeline::chunk_count(sc.len(), chunk) {
                    // after an error the remaining chunks go out empty (the receiver drains them
                    // and fails too); the error is reported by wait_send after the verdict
                    let b = if error.is_none() {
                        hc.encode(k).unwrap_or_else(|e| {
                            error = Some(e);
                            Vec::new()
                        })
                    } else {
                        Vec::new()
                    };
                    wire += b.len();
                    hs.push(self.transport.isend(dest, tag, b)?);
                }
                st.wire_bytes = wire as u64;
                st.ratio = st.bytes as f64 / wire.max(1) as f64;
                st.max_error = hc.verify;
                self.chunks += pipeline::chunk_count(sc.len(), chunk) as u64;
                if error.is_none() {
                    self.ratios.put(OP_SEND, tag as i64, st.ratio);
                }
                hs
            }
        };
        Ok(SendRequest {
            handles,
            desc: d,
            dest,
            tag,
            stats: st,
            t0,
            error,
        })
    }

    /// Complete a non-blocking send.
    pub fn wait_send(&mut self, req: SendRequest) -> Result<OpStats> {
        let _watchdog = watchdog::arm("send");
        for h in req.handles {
            h.wait()?;
        }
        let v = Desc::parse(&self.transport.recv(req.dest, TAG_VERDICT + req.tag)?)?;
        check_pair(&req.desc, &v)?;
        if let Some(e) = req.error {
            return Err(e);
        }
        Ok(self.finish(req.stats, req.t0))
    }

    /// Receive exactly `out.len()` elements from `src`.
    pub fn recv<E: CommElement>(&mut self, out: &mut [E], src: usize, tag: i32) -> Result<OpStats> {
        let _watchdog = watchdog::arm("recv");
        let n = out.len() as u64;
        self.recv_impl::<E>(src, tag, n, move |_| Ok(E::scalars_mut(out)))
    }

    /// Receive a message of any length from `src`.
    pub fn recv_vec<E: CommElement>(&mut self, src: usize, tag: i32) -> Result<(Vec<E>, OpStats)> {
        let _watchdog = watchdog::arm("recv_vec");
        let mut out = Vec::new();
        let slot = &mut out;
        let st = self.recv_impl::<E>(src, tag, ANY_COUNT, move |sd| {
            let n = usize::try_from(sd.count)
                .ok()
                .filter(|&n| {
                    n.checked_mul(E::LANES * <E::Scalar as crate::Element>::SIZE)
                        .is_some()
                })
                .ok_or_else(|| Error::Comm(format!("peer announced {} elements", sd.count)))?;
            *slot = vec![E::default(); n];
            Ok(E::scalars_mut(slot))
        })?;
        Ok((out, st))
    }

    /// Start a receive (see [`RecvRequest`]).
    pub fn irecv(&self, src: usize, tag: i32) -> Result<RecvRequest> {
        Self::check_tag(tag)?;
        if src >= self.size() {
            return Err(Error::invalid(format!("rank {src} out of range")));
        }
        Ok(RecvRequest { src, tag })
    }

    /// The receiving side: descriptor, payload (one message or pipelined chunks, always
    /// drained), verdict. `target` gives the output scalars once the sender's descriptor is
    /// known and matches (it must have `count * lanes` scalars).
    fn recv_impl<'a, E: CommElement>(
        &mut self,
        src: usize,
        tag: i32,
        count: u64,
        target: impl FnOnce(&Desc) -> Result<&'a mut [E::Scalar]>,
    ) -> Result<OpStats> {
        Self::check_tag(tag)?;
        if src >= self.size() {
            return Err(Error::invalid(format!("rank {src} out of range")));
        }
        let t0 = self.wtime();
        let sd_raw = self.transport.recv(src, TAG_DESC + tag)?;
        let mine = self.local_desc::<E>(OP_RECV, 0);
        let mine = Desc { count, ..mine };
        let parsed = Desc::parse(&sd_raw);
        let chunked = parsed.as_ref().map_or(0, |d| d.chunk);
        let wire;
        let sd;
        if chunked == 0 {
            let payload = self.transport.recv(src, tag)?;
            self.transport
                .send(src, TAG_VERDICT + tag, &mine.to_bytes())?;
            sd = parsed?;
            check_pair(&sd, &mine)?;
            let out = target(&sd)?;
            self.decode_payload(sd.decision == 1, &payload, out)?;
            wire = payload.len();
        } else {
            sd = parsed?;
            self.transport
                .send(src, TAG_VERDICT + tag, &mine.to_bytes())?;
            let lanes = E::LANES as u64;
            let total = sd
                .count
                .checked_mul(lanes)
                .and_then(|v| usize::try_from(v).ok())
                .ok_or_else(|| Error::Comm(format!("peer announced {} elements", sd.count)))?;
            let chunk =
                usize::try_from(sd.chunk).map_err(|_| Error::Comm("bad chunk length".into()))?;
            let nchunks = pipeline::chunk_count(total, chunk);
            let checked = check_pair(&sd, &mine).and_then(|()| target(&sd));
            let (inc, bad) = match checked {
                Ok(out) if out.len() == total => (pipeline::Incoming::Chunks(out, chunk), None),
                Ok(_) => (
                    pipeline::Incoming::Discard,
                    Some(Error::invalid("receive buffer length")),
                ),
                Err(e) => (pipeline::Incoming::Discard, Some(e)),
            };
            let mut hc = pipeline::HostChunks::<E::Scalar> {
                compressor: &*self.compressor,
                out: pipeline::Outgoing::None,
                inc,
                verify: None,
            };
            let mut got = 0usize;
            let mut counting = CountingCodec {
                inner: &mut hc,
                bytes: &mut got,
            };
            let (_, r) = pipeline::exchange_chunks(
                &*self.transport,
                &mut counting,
                src,
                0,
                src,
                nchunks,
                tag,
            )?;
            self.chunks += nchunks as u64;
            if let Some(e) = bad {
                return Err(e);
            }
            r?;
            wire = got;
        }
        let mut st = OpStats::raw(OP_RECV);
        st.bytes = sd
            .count
            .saturating_mul((E::LANES * <E::Scalar as crate::Element>::SIZE) as u64);
        st.wire_bytes = wire as u64;
        st.ratio = if wire == 0 {
            1.0
        } else {
            st.bytes as f64 / wire as f64
        };
        st.ratio_estimate = sd.ratio;
        if sd.decision == 1 {
            st.decision = Decision::Compressed;
            st.codec = self.config.policy.codec();
        }
        let (tr, tc) = self.p2p_times::<E::Scalar>(
            sd.count as usize * E::LANES,
            sd.ratio,
            self.config.policy.codec().unwrap_or_default(),
        );
        st.predicted_raw_s = tr;
        st.predicted_compressed_s = tc;
        st.predicted_s = if sd.decision == 1 { tc } else { tr };
        Ok(self.finish(st, t0))
    }

    /// Send `send` to `dest` and receive `recv.len()` elements from `src` (the pairwise swap of
    /// state-vector halves when `dest == src`). A mismatch is an error on both ends of each pair.
    pub fn sendrecv<E: CommElement>(
        &mut self,
        send: &[E],
        dest: usize,
        recv: &mut [E],
        src: usize,
        tag: i32,
    ) -> Result<OpStats> {
        let _watchdog = watchdog::arm("sendrecv");
        Self::check_tag(tag)?;
        for r in [dest, src] {
            if r >= self.size() {
                return Err(Error::invalid(format!("rank {r} out of range")));
            }
        }
        let t0 = self.wtime();
        let sc = E::scalars(send);
        let (payload, mut st) = self.encode_p2p(sc, OP_SENDRECV, tag, Some(E::LANES))?;
        let compressed = st.decision == Decision::Compressed;
        let mut d = Desc {
            decision: u8::from(compressed),
            ratio: st.ratio_estimate,
            ..self.local_desc::<E>(OP_SENDRECV, send.len())
        };
        let expect = Desc {
            count: recv.len() as u64,
            ..self.local_desc::<E>(OP_SENDRECV, 0)
        };
        let out = E::scalars_mut(recv);
        let (outgoing, nsend) = match payload {
            Payload::Bytes(b) => {
                d.payload = b.len() as u64;
                // the peer may pipeline; when its descriptor says so, use the chunk schedule
                // (our payload then travels as its single "chunk")
                let theirs = self
                    .transport
                    .sendrecv(dest, &d.to_bytes(), src, TAG_DESC + tag)?;
                let sd = Desc::parse(&theirs)?;
                if sd.chunk == 0 {
                    let got = self.exchange_after_desc(
                        &d,
                        &sd,
                        &b,
                        dest,
                        &expect,
                        src,
                        tag,
                        element::scalar_bytes_mut(out),
                    )?;
                    if let Some((sd, bytes)) = got {
                        self.decode_payload(sd.decision == 1, &bytes, out)?;
                    }
                    return Ok(self.finish(st, t0));
                }
                return self.sendrecv_chunked(
                    d,
                    sd,
                    pipeline::Outgoing::Whole(b.into_owned()),
                    1,
                    out,
                    dest,
                    &expect,
                    src,
                    tag,
                    E::LANES,
                    (st, t0),
                );
            }
            Payload::Chunked { chunk, codec } => {
                d.chunk = chunk as u64;
                let out_c = pipeline::Outgoing::Chunks {
                    data: sc,
                    chunk,
                    bound: self.config.bound,
                    codec,
                };
                (out_c, pipeline::chunk_count(sc.len(), chunk))
            }
        };
        let theirs = self
            .transport
            .sendrecv(dest, &d.to_bytes(), src, TAG_DESC + tag)?;
        let sd = Desc::parse(&theirs)?;
        st.decision = Decision::Compressed;
        self.sendrecv_chunked(
            d,
            sd,
            outgoing,
            nsend,
            out,
            dest,
            &expect,
            src,
            tag,
            E::LANES,
            (st, t0),
        )
    }

    /// The pipelined sendrecv after the descriptor exchange (one side or both chunked): chunks
    /// both ways (see [`pipeline`]), then the verdicts.
    #[allow(clippy::too_many_arguments)]
    fn sendrecv_chunked<S: Real>(
        &mut self,
        d: Desc,
        sd: Desc,
        outgoing: pipeline::Outgoing<'_, S>,
        nsend: usize,
        out: &mut [S],
        dest: usize,
        expect: &Desc,
        src: usize,
        tag: i32,
        lanes: usize,
        (mut st, t0): (OpStats, f64),
    ) -> Result<OpStats> {
        let pair = check_pair(&sd, expect);
        let (inc, nrecv) = if sd.chunk > 0 {
            let chunk =
                usize::try_from(sd.chunk).map_err(|_| Error::Comm("bad chunk length".into()))?;
            let n = sd
                .count
                .checked_mul(lanes as u64)
                .and_then(|v| usize::try_from(v).ok())
                .ok_or_else(|| Error::Comm(format!("peer announced {} elements", sd.count)))?;
            let k = pipeline::chunk_count(n, chunk);
            if pair.is_ok() {
                (pipeline::Incoming::Chunks(out, chunk), k)
            } else {
                (pipeline::Incoming::Discard, k)
            }
        } else if pair.is_ok() {
            (pipeline::Incoming::Whole(out, sd.decision == 1), 1)
        } else {
            (pipeline::Incoming::Discard, 1)
        };
        let mut hc = pipeline::HostChunks {
            compressor: &*self.compressor,
            out: outgoing,
            inc,
            verify: (self.config.verify && d.chunk > 0).then_some(0.0),
        };
        let (sent, r) =
            pipeline::exchange_chunks(&*self.transport, &mut hc, dest, nsend, src, nrecv, tag)?;
        let verify = hc.verify;
        if d.chunk > 0 {
            self.chunks += nsend as u64;
        }
        if sd.chunk > 0 {
            self.chunks += nrecv as u64;
        }
        let verdict = self
            .transport
            .sendrecv(src, &expect.to_bytes(), dest, TAG_VERDICT + tag)?;
        pair?;
        check_pair(&d, &Desc::parse(&verdict)?)?;
        r?;
        if d.chunk > 0 {
            st.wire_bytes = sent as u64;
            st.ratio = st.bytes as f64 / sent.max(1) as f64;
            st.max_error = verify;
            self.ratios.put(OP_SENDRECV, tag as i64, st.ratio);
        }
        Ok(self.finish(st, t0))
    }

    /// The sendrecv protocol on bytes once the descriptors are swapped (`sd` is the peer's):
    /// payloads (sized from the descriptors) and verdicts. A raw incoming payload of exactly
    /// `direct.len()` bytes lands in `direct` (returns `None`); anything else is returned with
    /// the sender's descriptor.
    #[allow(clippy::too_many_arguments)]
    fn exchange_after_desc(
        &self,
        d: &Desc,
        sd: &Desc,
        payload: &[u8],
        dest: usize,
        expect: &Desc,
        src: usize,
        tag: i32,
        direct: Option<&mut [u8]>,
    ) -> Result<Option<(Desc, Vec<u8>)>> {
        let sd = *sd;
        let t = &*self.transport;
        let n = usize::try_from(sd.payload)
            .map_err(|_| Error::Comm(format!("peer announced a {}-byte payload", sd.payload)))?;
        let fits = sd.decision == 0 && check_pair(&sd, expect).is_ok();
        let result = match direct {
            Some(buf) if fits && buf.len() == n => {
                t.sendrecv_sized(dest, payload, src, buf, tag)?;
                None
            }
            _ => {
                let mut v = vec![0u8; n];
                t.sendrecv_sized(dest, payload, src, &mut v, tag)?;
                Some((sd, v))
            }
        };
        let verdict = t.sendrecv(src, &expect.to_bytes(), dest, TAG_VERDICT + tag)?;
        check_pair(&sd, expect)?;
        check_pair(d, &Desc::parse(&verdict)?)?;
        Ok(result)
    }

    // ----------------------------------------------------------------- collectives

    /// Gather `send` from every rank into `out` (`out.len() == size * send.len()`, rank order).
    /// Every rank ends with identical values.
    pub fn allgather<E: CommElement>(&mut self, send: &[E], out: &mut [E]) -> Result<OpStats> {
        let _watchdog = watchdog::arm("allgather");
        let p = self.size();
        let local = if out.len() != send.len() * p {
            Err(Error::invalid(format!(
                "allgather: output has {} elements, expected {} x {}",
                out.len(),
                p,
                send.len()
            )))
        } else {
            Ok(())
        };
        let req = self.iallgather_impl(send, local)?;
        self.wait_allgather(req, out)
    }

    /// Non-blocking [`allgather`](Self::allgather): agrees and compresses now, starts the
    /// transfer (`MPI_Iallgatherv` of the streams) and returns; finish with
    /// [`wait_allgather`](Self::wait_allgather). Collective.
    pub fn iallgather<E: CommElement>(&mut self, send: &[E]) -> Result<AllgatherRequest<E>> {
        self.iallgather_impl(send, Ok(()))
    }

    fn iallgather_impl<E: CommElement>(
        &mut self,
        send: &[E],
        mut local: Result<()>,
    ) -> Result<AllgatherRequest<E>> {
        let t0 = self.wtime();
        let p = self.size();
        let sc = E::scalars(send);
        let bound = self.config.bound;
        let mut d = self.local_desc::<E>(OP_ALLGATHER, send.len());
        let mut stream = None;
        let pays = {
            let (raw_t, best) = self.allgather_times::<E::Scalar>(sc.len(), f64::INFINITY);
            best < choice::HYSTERESIS * raw_t
        };
        if let (Policy::Auto(c), true, true) = (self.config.policy, local.is_ok(), pays) {
            match self.estimate(sc, bound, c, OP_ALLGATHER, coll_key(sc.len(), bound)) {
                Ok((r, s)) => {
                    d.ratio = r;
                    stream = s;
                }
                Err(e) => local = Err(e),
            }
        }
        let all = self.agree(d, local)?;
        let ratio = harmonic(&all);
        let n = sc.len();
        let bytes = (n * <E::Scalar as crate::Element>::SIZE) as f64;
        let codec = self.config.policy.codec().unwrap_or_default();
        let (raw_t, cmp_t) = self.allgather_times::<E::Scalar>(n, ratio);
        let compress = self.decide(raw_t, cmp_t) && n > 0;
        let mut st = OpStats::raw(OP_ALLGATHER);
        st.bytes = bytes as u64;
        st.ratio_estimate = ratio;
        st.predicted_raw_s = raw_t;
        st.predicted_compressed_s = cmp_t;
        st.predicted_s = if compress { cmp_t } else { raw_t };
        let (payload, lens) = if compress {
            let s = match stream {
                Some(s) => s,
                None => E::Scalar::compress_with(&*self.compressor, sc, bound, codec)?,
            };
            st.wire_bytes = s.len() as u64;
            st.ratio = bytes / s.len() as f64;
            st.decision = Decision::Compressed;
            st.codec = Some(codec);
            st.bound = self.bound_of(sc);
            self.ratios
                .put(OP_ALLGATHER, coll_key(sc.len(), bound), st.ratio);
            let lens = self.transport.allgather_lens(s.len())?;
            (s, lens)
        } else {
            st.wire_bytes = bytes as u64;
            (scalar_bytes(sc).into_owned(), vec![bytes as usize; p])
        };
        let pending = self.transport.iallgatherv(payload, &lens)?;
        let verify = (self.config.verify && compress).then(|| sc.to_vec());
        Ok(AllgatherRequest {
            pending,
            compressed: compress,
            n: send.len(),
            st,
            t0,
            verify,
        })
    }

    /// Complete a non-blocking allgather into `out` (`size * count` elements).
    pub fn wait_allgather<E: CommElement>(
        &mut self,
        req: AllgatherRequest<E>,
        out: &mut [E],
    ) -> Result<OpStats> {
        let _watchdog = watchdog::arm("iallgather wait");
        let AllgatherRequest {
            pending,
            compressed,
            n,
            mut st,
            t0,
            verify,
        } = req;
        let parts = pending.wait()?;
        if out.len() != n * self.size() {
            return Err(Error::invalid(format!(
                "allgather: output has {} elements, expected {} x {}",
                out.len(),
                self.size(),
                n
            )));
        }
        let ns = n * E::LANES;
        let outs = E::scalars_mut(out);
        for (k, part) in parts.iter().enumerate() {
            self.decode_payload(compressed, part, &mut outs[k * ns..(k + 1) * ns])?;
        }
        if let Some(orig) = verify {
            let r = self.rank();
            st.max_error = Some(max_abs_diff(&orig, &outs[r * ns..(r + 1) * ns]));
        }
        Ok(self.finish(st, t0))
    }

    /// Broadcast `buf` from `root`; every rank (root included) ends with identical values.
    pub fn bcast<E: CommElement>(&mut self, buf: &mut [E], root: usize) -> Result<OpStats> {
        let _watchdog = watchdog::arm("bcast");
        let req = self.ibcast(buf, root)?;
        self.wait_bcast(req, buf)
    }

    /// Non-blocking [`bcast`](Self::bcast): the root compresses now; every rank agrees and the
    /// transfer (`MPI_Ibcast`) starts. `buf` is the data on the root; elsewhere only its length
    /// matters. Finish with [`wait_bcast`](Self::wait_bcast) (which writes the values, on the
    /// root too). Collective.
    pub fn ibcast<E: CommElement>(&mut self, buf: &[E], root: usize) -> Result<BcastRequest<E>> {
        let t0 = self.wtime();
        let mut local = Ok(());
        if root >= self.size() {
            local = Err(Error::invalid(format!("bcast root {root} out of range")));
        }
        let r = self.rank();
        let mut d = self.local_desc::<E>(OP_BCAST, buf.len());
        d.root = root as u32;
        let mut payload = Vec::new();
        let mut st = OpStats::raw(OP_BCAST);
        if r == root && local.is_ok() {
            match self.encode_p2p(E::scalars(buf), OP_BCAST, 0, None) {
                Ok((Payload::Chunked { .. }, _)) => {
                    local = Err(Error::Comm("bcast payload cannot be chunked".into()))
                }
                Ok((Payload::Bytes(pl), s)) => {
                    payload = pl.into_owned();
                    d.decision = u8::from(s.decision == Decision::Compressed);
                    d.ratio = s.ratio_estimate;
                    d.payload = payload.len() as u64;
                    st = s;
                }
                Err(e) => local = Err(e),
            }
        }
        let all = self.agree(d, local)?;
        let rd = all[root];
        let len = usize::try_from(rd.payload)
            .map_err(|_| Error::Comm(format!("root announced a {}-byte payload", rd.payload)))?;
        let pending = self.transport.ibcast(root, payload, len)?;
        let verify =
            (r == root && self.config.verify && rd.decision == 1).then(|| E::scalars(buf).to_vec());
        if r != root {
            st.decision = if rd.decision == 1 {
                Decision::Compressed
            } else {
                Decision::Raw
            };
            st.ratio_estimate = rd.ratio;
            st.wire_bytes = len as u64;
            st.bytes = (buf.len() * E::LANES * <E::Scalar as crate::Element>::SIZE) as u64;
            st.ratio = if len == 0 {
                1.0
            } else {
                st.bytes as f64 / len as f64
            };
        }
        Ok(BcastRequest {
            pending,
            compressed: rd.decision == 1,
            n: buf.len(),
            root,
            st,
            t0,
            verify,
        })
    }

    /// Complete a non-blocking broadcast into `buf` (same length as given to `ibcast`).
    pub fn wait_bcast<E: CommElement>(
        &mut self,
        req: BcastRequest<E>,
        buf: &mut [E],
    ) -> Result<OpStats> {
        let _watchdog = watchdog::arm("ibcast wait");
        let BcastRequest {
            pending,
            compressed,
            n,
            root,
            mut st,
            t0,
            verify,
        } = req;
        let mut parts = pending.wait()?;
        if buf.len() != n {
            return Err(Error::invalid(format!(
                "bcast: buffer has {} elements, ibcast was given {n}",
                buf.len()
            )));
        }
        let payload = parts.pop().unwrap_or_default();
        // every rank, the root included, takes the values from the payload (identical everywhere)
        let _ = root;
        self.decode_payload(compressed, &payload, E::scalars_mut(buf))?;
        if let Some(o) = verify {
            st.max_error = Some(max_abs_diff(&o, E::scalars(buf)));
        }
        Ok(self.finish(st, t0))
    }

    /// Model times (raw, compressed) of an allgather of `n` scalars per rank.
    fn allgather_times<S: Real>(&self, n: usize, ratio: f64) -> (f64, f64) {
        let bytes = (n * S::SIZE) as f64;
        let codec = self.config.policy.codec().unwrap_or_default();
        let (tc, td) = self.speeds::<S>(codec);
        let l = self.profile.link;
        let pf = self.size() as f64;
        let raw_t = (pf - 1.0) * (l.latency + bytes / l.bandwidth);
        let cmp_t =
            bytes / tc + pf * bytes / td + (pf - 1.0) * (l.latency + bytes / (ratio * l.bandwidth));
        (raw_t, cmp_t)
    }

    /// Model times (raw, compressed) of an allreduce (`full`) or reduce-scatter of `n` scalars.
    fn reduce_times<S: Real>(
        &self,
        n: usize,
        full: bool,
        ratio: f64,
        codec: CodecKind,
    ) -> (f64, f64) {
        let pf = self.size() as f64;
        let seg_b = (n * S::SIZE) as f64 / pf;
        let (tc, td) = self.speeds::<S>(codec);
        let l = self.profile.link;
        let steps = pf - 1.0;
        let rs = steps * (seg_b / tc + seg_b / td + l.latency + seg_b / (ratio * l.bandwidth));
        if full {
            let raw = match self.profile.allreduce {
                Some(a) => a.latency + (n * S::SIZE) as f64 / a.bandwidth,
                None => 2.0 * steps * (l.latency + seg_b / l.bandwidth),
            };
            (
                raw,
                rs + seg_b / tc
                    + pf * seg_b / td
                    + steps * (l.latency + seg_b / (ratio * l.bandwidth)),
            )
        } else {
            (steps * (l.latency + seg_b / l.bandwidth), rs)
        }
    }

    fn decide(&self, raw_t: f64, cmp_t: f64) -> bool {
        match self.config.policy {
            Policy::Never => false,
            Policy::Always(_) => true,
            Policy::Auto(_) => cmp_t < choice::HYSTERESIS * raw_t,
        }
    }

    /// Sum over all ranks into `out` with the end-to-end bound of the [module docs](self).
    pub fn allreduce<E: CommElement>(&mut self, input: &[E], out: &mut [E]) -> Result<OpStats> {
        let _watchdog = watchdog::arm("allreduce");
        self.reduce_impl(
            OP_ALLREDUCE,
            E::scalars(input),
            E::scalars_mut(out),
            E::TAG,
            input.len(),
            E::LANES,
        )
    }

    /// Mean over all ranks (gradient averaging); the bound applies to the mean.
    pub fn allreduce_mean<E: CommElement>(
        &mut self,
        input: &[E],
        out: &mut [E],
    ) -> Result<OpStats> {
        let _watchdog = watchdog::arm("allreduce_mean");
        self.reduce_impl(
            OP_ALLREDUCE_MEAN,
            E::scalars(input),
            E::scalars_mut(out),
            E::TAG,
            input.len(),
            E::LANES,
        )
    }

    /// In-place sum (copies the input once).
    pub fn allreduce_in_place<E: CommElement>(&mut self, buf: &mut [E]) -> Result<OpStats> {
        let _watchdog = watchdog::arm("allreduce_in_place");
        let input = buf.to_vec();
        self.allreduce(&input, buf)
    }

    /// Reduce-scatter (sum): rank `r` receives segment `r` of [`partition`]`(input.len(), size)`
    /// in `out`. Every element passes `p-1` quantizations; the bound holds on the result.
    pub fn reduce_scatter<E: CommElement>(
        &mut self,
        input: &[E],
        out: &mut [E],
    ) -> Result<OpStats> {
        let _watchdog = watchdog::arm("reduce_scatter");
        let seg = partition(input.len(), self.size())[self.rank()].clone();
        if out.len() != seg.len() {
            return Err(Error::invalid(format!(
                "reduce_scatter: output has {} elements, this rank's segment has {}",
                out.len(),
                seg.len()
            )));
        }
        self.reduce_impl(
            OP_REDUCE_SCATTER,
            E::scalars(input),
            E::scalars_mut(out),
            E::TAG,
            input.len(),
            E::LANES,
        )
    }

    /// Whether the non-blocking reductions and `isendrecv` are available (a progress thread
    /// with its own communicator: needs `MPI_THREAD_MULTIPLE`, see [`OpRequest`]).
    pub fn has_progress_thread(&self) -> bool {
        self.worker.is_some()
    }

    fn submit<T: Send + 'static>(
        &self,
        what: &'static str,
        f: impl FnOnce(&mut Communicator) -> Result<(T, OpStats)> + Send + 'static,
    ) -> Result<OpRequest<T>> {
        let w = self.worker.as_ref().ok_or_else(|| {
            Error::Unavailable(format!(
                "{what}: needs the progress thread (MPI_THREAD_MULTIPLE with Communicator::init, or a \
                 transport that can duplicate itself, such as the loopback)"
            ))
        })?;
        let (config, profile) = (self.config.clone(), self.profile.clone());
        let (req, done) = OpRequest::new(what);
        w.submit(Box::new(move |c: &mut Communicator| {
            c.config = Config {
                calibration: c.config.calibration.clone(),
                ..config
            };
            c.profile = profile;
            done.complete(f(c));
        }))?;
        Ok(req)
    }

    /// Non-blocking [`allreduce`](Self::allreduce) (sum): copies `input` and runs the same
    /// algorithm, with the same bound, on the progress thread; `wait` gives the sum. Collective:
    /// every rank must issue its non-blocking operations in the same order. Returns
    /// [`Error::Unavailable`] without `MPI_THREAD_MULTIPLE`.
    pub fn iallreduce<E: CommElement>(&mut self, input: &[E]) -> Result<OpRequest<Vec<E>>> {
        let input = input.to_vec();
        self.submit("iallreduce", move |c| {
            let mut out = vec![E::default(); input.len()];
            let st = c.allreduce(&input, &mut out)?;
            Ok((out, st))
        })
    }

    /// Non-blocking [`allreduce_mean`](Self::allreduce_mean) (see
    /// [`iallreduce`](Self::iallreduce)).
    pub fn iallreduce_mean<E: CommElement>(&mut self, input: &[E]) -> Result<OpRequest<Vec<E>>> {
        let input = input.to_vec();
        self.submit("iallreduce_mean", move |c| {
            let mut out = vec![E::default(); input.len()];
            let st = c.allreduce_mean(&input, &mut out)?;
            Ok((out, st))
        })
    }

    /// Non-blocking [`reduce_scatter`](Self::reduce_scatter): `wait` gives this rank's segment
    /// of [`partition`]`(input.len(), size)`. Collective (see [`iallreduce`](Self::iallreduce)).
    pub fn ireduce_scatter<E: CommElement>(&mut self, input: &[E]) -> Result<OpRequest<Vec<E>>> {
        let input = input.to_vec();
        let seg = partition(input.len(), self.size())[self.rank()].len();
        self.submit("ireduce_scatter", move |c| {
            let mut out = vec![E::default(); seg];
            let st = c.reduce_scatter(&input, &mut out)?;
            Ok((out, st))
        })
    }

    /// Non-blocking [`sendrecv`](Self::sendrecv): copies `send`, and on the progress thread
    /// sends it to `dest` and receives `recv_len` elements from `src`; `wait` gives them. The
    /// peers must use `isendrecv` too (their progress threads talk to each other), in the same
    /// order relative to their other non-blocking operations.
    pub fn isendrecv<E: CommElement>(
        &mut self,
        send: &[E],
        dest: usize,
        recv_len: usize,
        src: usize,
        tag: i32,
    ) -> Result<OpRequest<Vec<E>>> {
        Self::check_tag(tag)?;
        for r in [dest, src] {
            if r >= self.size() {
                return Err(Error::invalid(format!("rank {r} out of range")));
            }
        }
        let send = send.to_vec();
        self.submit("isendrecv", move |c| {
            let mut out = vec![E::default(); recv_len];
            let st = c.sendrecv(&send, dest, &mut out, src, tag)?;
            Ok((out, st))
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn reduce_impl<S: Real>(
        &mut self,
        op: u8,
        x: &[S],
        out: &mut [S],
        dtype: u8,
        count: usize,
        lanes: usize,
    ) -> Result<OpStats> {
        let t0 = self.wtime();
        let (p, r) = (self.size(), self.rank());
        let full = op != OP_REDUCE_SCATTER;
        let mut local = Ok(());
        if full && out.len() != x.len() {
            local = Err(Error::invalid(format!(
                "{}: output has {} scalars, input {}",
                op_name(op),
                out.len(),
                x.len()
            )));
        }
        // 1. agreement, global range and magnitude (from the descriptor table)
        let (lo, hi) = crate::quant::finite_range(x).unwrap_or((f64::INFINITY, f64::NEG_INFINITY));
        let desc = Desc {
            count: count as u64,
            dtype,
            lo,
            hi,
            ..self.local_desc::<f32>(op, count)
        };
        let all = self.agree(desc, local)?;
        if matches!(self.config.bound, ErrorBound::Rel(_)) {
            return Err(Error::invalid(format!(
                "{}: rel bounds are not supported for reductions (use abs or noa)",
                op_name(op)
            )));
        }
        let glo = all.iter().map(|d| d.lo).fold(f64::INFINITY, f64::min);
        let ghi = all.iter().map(|d| d.hi).fold(f64::NEG_INFINITY, f64::max);
        // 2. the per-quantization bound
        let split = ring::BoundSplit::new(
            self.config.bound,
            (glo, ghi),
            p,
            S::UNIT_ROUNDOFF,
            op == OP_ALLREDUCE_MEAN,
            full,
        );
        let (e, d) = (split.result, split.divisor);
        let pf = p as f64;
        let usable = split.step.is_some();
        let eb = split.step.unwrap_or(f64::NAN);
        // 3. ratio estimate at the per-step bound, per candidate codec (mean over ranks of
        //    1/ratio: every rank then sees the same numbers and makes the same choice)
        let mut ratio_of = 1.0;
        let preferred = self.config.policy.codec().unwrap_or_default();
        let mut cands = vec![preferred];
        if let (Policy::Auto(c), true, true) = (self.config.policy, usable, p > 1) {
            cands = self
                .candidates::<S>(c)
                .into_iter()
                .filter(|&k| {
                    let (raw_t, best) = self.reduce_times::<S>(x.len(), full, f64::INFINITY, k);
                    choice::choose(raw_t, [cand(k, f64::INFINITY, best)])
                        .codec
                        .is_some()
                })
                .collect();
            let seg0 = &x[..x.len().div_ceil(p).min(x.len())];
            let mut inv = Vec::with_capacity(cands.len());
            for &k in &cands {
                let key = codec_key(coll_key(x.len(), self.config.bound), k);
                inv.push(
                    match self.estimate(seg0, ErrorBound::Abs(eb * d), k, op, key) {
                        Ok((er, _)) => 1.0 / er.max(1e-9),
                        Err(_) => 1.0, // (cannot happen for a valid abs bound) assume no gain
                    },
                );
            }
            // every rank filtered the same candidates (same profile, same sizes)
            self.transport.allreduce_f64(&mut inv, ReduceOp::Sum)?;
            let ratios: Vec<f64> = inv.iter().map(|v| pf / v).collect();
            let (raw_t, _) = self.reduce_times::<S>(x.len(), full, 1.0, preferred);
            let ch = choice::choose(
                raw_t,
                cands
                    .iter()
                    .zip(&ratios)
                    .map(|(&k, &r)| cand(k, r, self.reduce_times::<S>(x.len(), full, r, k).1)),
            );
            cands = match (ch.codec, ch.best) {
                (Some(k), _) => vec![k],
                (None, Some(b)) => vec![b.codec],
                (None, None) => vec![preferred],
            };
            ratio_of = ch.best.map_or(1.0, |b| b.ratio);
        }
        let codec = cands[0];
        let ratio = ratio_of;
        // 4. model
        let bytes = (x.len() * S::SIZE) as f64;
        let seg_b = bytes / pf;
        let steps = pf - 1.0;
        let (raw_t, cmp_t) = self.reduce_times::<S>(x.len(), full, ratio, codec);
        let compress = usable && p > 1 && !x.is_empty() && self.decide(raw_t, cmp_t);
        let mut st = OpStats::raw(op);
        st.bytes = bytes as u64;
        st.ratio_estimate = ratio;
        st.predicted_raw_s = raw_t;
        st.predicted_compressed_s = cmp_t;
        st.predicted_s = if compress { cmp_t } else { raw_t };
        let segs = partition(count, p)
            .into_iter()
            .map(|s| s.start * lanes..s.end * lanes)
            .collect::<Vec<_>>();
        if !compress {
            st.wire_bytes = st.bytes;
            if full {
                S::native_sum(&*self.transport, x, out)?;
                if d != 1.0 {
                    let dd = S::from_f64(d);
                    out.iter_mut().for_each(|v| *v = *v / dd);
                }
            } else {
                let mut tmp = vec![S::default(); x.len()];
                S::native_sum(&*self.transport, x, &mut tmp)?;
                out.copy_from_slice(&tmp[segs[r].clone()]);
            }
            return Ok(self.finish(st, t0));
        }
        st.decision = Decision::Compressed;
        st.codec = Some(codec);
        st.bound = e;
        // 5. the ring (reduce-scatter, then for the allreduces the allgather)
        let plan = ring::RingPlan {
            rank: r,
            size: p,
            step_bound: eb * d,
            final_bound: eb,
            divisor: d,
            full,
            codec,
        };
        let left = (r + p - 1) % p;
        let mut place = HostRing {
            transport: &*self.transport,
            compressor: &*self.compressor,
            acc: x[segs[left].clone()].to_vec(),
            acc_seg: left,
            x,
            out: &mut *out,
            segs: &segs,
        };
        let sent = ring::reduce(&mut place, plan)?;
        if !full {
            let acc = std::mem::take(&mut place.acc);
            out.copy_from_slice(&acc);
        }
        st.wire_bytes = sent.total(p) as u64;
        let moved = if full { 2.0 } else { 1.0 } * bytes * steps / pf;
        st.ratio = moved / st.wire_bytes.max(1) as f64;
        if self.config.verify {
            let range = if full { 0..x.len() } else { segs[r].clone() };
            st.max_error = Some(self.reduce_error(x, out, range, d)?);
        }
        if full {
            self.ratios.put(
                op,
                codec_key(coll_key(x.len(), self.config.bound), codec),
                (seg_b / sent.final_stream.max(1) as f64).max(1.0),
            );
        }
        Ok(self.finish(st, t0))
    }
}

/// The ring's buffers on the host: the CPU (or any [`Compressor`]) codec over a [`Transport`].
struct HostRing<'a, S: Real> {
    transport: &'a dyn Transport,
    compressor: &'a dyn Compressor,
    /// This rank's input.
    x: &'a [S],
    /// The allreduce's output.
    out: &'a mut [S],
    /// Scalar range of each rank's segment.
    segs: &'a [Range<usize>],
    /// The partial sum of segment `acc_seg` (before the first step: the input there).
    acc: Vec<S>,
    acc_seg: usize,
}

impl<S: Real> ring::RingPlace for HostRing<'_, S> {
    type Msg = Vec<u8>;
    fn wire_len(&self, m: &Vec<u8>) -> usize {
        m.len()
    }
    fn encode(&mut self, seg: usize, bound: ErrorBound, codec: CodecKind) -> Result<Vec<u8>> {
        debug_assert_eq!(
            seg, self.acc_seg,
            "the ring compresses the segment it holds"
        );
        S::compress_with(self.compressor, &self.acc, bound, codec)
    }
    fn exchange(&mut self, m: Vec<u8>, to: usize, from: usize) -> Result<Vec<u8>> {
        self.transport.sendrecv(to, &m, from, TAG_RING)
    }
    fn accumulate(&mut self, seg: usize, m: &Vec<u8>) -> Result<()> {
        let range = self.segs[seg].clone();
        let mut part = vec![S::default(); range.len()];
        S::decompress_with(self.compressor, m, &mut part)?;
        for (a, &v) in part.iter_mut().zip(&self.x[range]) {
            *a = *a + v;
        }
        self.acc = part;
        self.acc_seg = seg;
        Ok(())
    }
    fn scale(&mut self, seg: usize, d: f64) -> Result<()> {
        debug_assert_eq!(seg, self.acc_seg);
        let d = S::from_f64(d);
        self.acc.iter_mut().for_each(|v| *v = *v / d);
        Ok(())
    }
    fn allgather(&mut self, m: Vec<u8>) -> Result<Vec<Vec<u8>>> {
        self.transport.allgatherv(&m)
    }
    fn decode_into_output(&mut self, seg: usize, m: &Vec<u8>) -> Result<()> {
        S::decompress_with(self.compressor, m, &mut self.out[self.segs[seg].clone()])
    }
}

impl Communicator {
    /// Verification of a reduction: max |result - exact| where exact is the f64 sum of every
    /// rank's input (native allreduce in f64, collective), divided by `d`; `got` holds the
    /// scalars `range` of the result.
    fn reduce_error<S: Real>(
        &self,
        x: &[S],
        got: &[S],
        range: Range<usize>,
        d: f64,
    ) -> Result<f64> {
        let x64: Vec<f64> = x.iter().map(|v| v.to_f64()).collect();
        let mut exact = vec![0.0f64; x64.len()];
        self.transport.allreduce_sum_f64(&x64, &mut exact)?;
        Ok(got
            .iter()
            .zip(&exact[range])
            .map(|(g, e)| (g.to_f64() - e / d).abs())
            .filter(|v| v.is_finite())
            .fold(0.0, f64::max))
    }
}

/// An MPI transport moved to the progress thread once, before any use there.
#[cfg(feature = "mpi")]
struct SendTransport(MpiTransport);

// SAFETY: only created when MPI provides MPI_THREAD_MULTIPLE; the communicator handle is moved to
// the progress thread before it is used there and is used by that thread only.
#[cfg(feature = "mpi")]
unsafe impl Send for SendTransport {}

/// Counts the bytes a [`pipeline::ChunkCodec`] receives.
struct CountingCodec<'a> {
    inner: &'a mut dyn pipeline::ChunkCodec,
    bytes: &'a mut usize,
}

impl pipeline::ChunkCodec for CountingCodec<'_> {
    fn encode(&mut self, k: usize) -> Result<Vec<u8>> {
        self.inner.encode(k)
    }
    fn decode(&mut self, k: usize, bytes: Vec<u8>) -> Result<()> {
        *self.bytes += bytes.len();
        self.inner.decode(k, bytes)
    }
}

/// Ratio-cache key of one codec's estimate for the message stream `key`.
fn codec_key(key: i64, codec: CodecKind) -> i64 {
    key ^ (i64::from(codec.tag()) << 52)
}

/// A model candidate (shorthand).
fn cand(codec: CodecKind, ratio: f64, predicted_s: f64) -> choice::Candidate {
    choice::Candidate {
        codec,
        ratio,
        predicted_s,
    }
}

/// Ratio-cache key of a collective: its size and bound (collectives have no tag).
fn coll_key(n: usize, bound: ErrorBound) -> i64 {
    let h = (n as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ bound.value().to_bits().rotate_left(17)
        ^ u64::from(bound.mode().tag());
    (h >> 1) as i64 | i64::MIN // negative: never a user tag
}

fn harmonic(all: &[Desc]) -> f64 {
    let inv: f64 = all.iter().map(|d| 1.0 / d.ratio.max(1e-9)).sum::<f64>() / all.len() as f64;
    1.0 / inv
}

fn pingpong(t: &dyn Transport, r: usize, peer: usize, msg: &[u8], reps: usize) -> Result<f64> {
    // one warm-up, then the mean round trip
    let mut t0 = 0.0;
    for i in 0..=reps {
        if i == 1 {
            t0 = t.wtime();
        }
        if r == 0 {
            t.send(peer, TAG_PING, msg)?;
            t.recv(peer, TAG_PING)?;
        } else {
            t.recv(peer, TAG_PING)?;
            t.send(peer, TAG_PING, msg)?;
        }
    }
    Ok((t.wtime() - t0) / reps as f64)
}

fn measure_compressor(
    c: &dyn Compressor,
    codec: CodecKind,
    dt: Dtype,
    n: usize,
) -> Result<model::CodecSpeed> {
    fn run<S: Real>(c: &dyn Compressor, codec: CodecKind, n: usize) -> Result<model::CodecSpeed> {
        let data: Vec<S> = (0..n)
            .map(|i| {
                let x = i as f64 * 1e-4;
                S::from_f64((x.sin() * 3.0 + (x * 7.3).cos()) * 100.0 + (i % 17) as f64 * 1e-3)
            })
            .collect();
        let b = ErrorBound::Noa(1e-3);
        let mut out = vec![S::default(); n];
        let (mut bc, mut bd, mut len) = (f64::INFINITY, f64::INFINITY, 1);
        for _ in 0..3 {
            let t = std::time::Instant::now();
            let s = S::compress_with(c, &data, b, codec)?;
            bc = bc.min(t.elapsed().as_secs_f64());
            let t = std::time::Instant::now();
            S::decompress_with(c, &s, &mut out)?;
            bd = bd.min(t.elapsed().as_secs_f64());
            len = s.len();
        }
        let bytes = (n * S::SIZE) as f64;
        Ok(model::CodecSpeed {
            codec,
            dtype: S::DTYPE.tag(),
            compress: bytes / bc.max(1e-9),
            decompress: bytes / bd.max(1e-9),
            ratio: bytes / len as f64,
        })
    }
    match dt {
        Dtype::F32 => run::<f32>(c, codec, n),
        Dtype::F64 => run::<f64>(c, codec, n),
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "host".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_covers_everything() {
        for (n, p) in [(0, 3), (1, 4), (10, 3), (7, 7), (100, 8)] {
            let s = partition(n, p);
            assert_eq!(s.len(), p);
            assert_eq!(s[0].start, 0);
            assert_eq!(s[p - 1].end, n);
            for w in s.windows(2) {
                assert_eq!(w[0].end, w[1].start);
                assert!(w[0].len() >= w[1].len() && w[0].len() - w[1].len() <= 1);
            }
        }
    }

    #[test]
    fn descriptors_round_trip_and_disagree() {
        let d = Desc {
            op: OP_ALLREDUCE,
            dtype: 1,
            policy: Policy::default().tag(),
            mode: 2,
            decision: 1,
            root: 3,
            bound: 1e-3,
            count: 12345,
            payload: 99,
            ratio: 7.5,
            seq: 42,
            lo: -1.5,
            hi: 2.5,
            bad: 0,
            flags: 0,
            chunk: 77,
        };
        assert_eq!(Desc::parse(&d.to_bytes()).unwrap(), d);
        assert!(Desc::parse(&[0u8; 64]).is_err());
        assert!(check_table(&[d, d, d]).is_ok());
        let e = check_table(&[d, Desc { bad: 1, ..d }]).unwrap_err();
        assert!(e.to_string().contains("rank 1 rejected"), "{e}");
        let e = check_table(&[d, Desc { count: 1, ..d }]).unwrap_err();
        assert!(e.to_string().contains("element count"), "{e}");
        let e = check_table(&[
            d,
            Desc {
                op: OP_ALLGATHER,
                ..d
            },
        ])
        .unwrap_err();
        assert!(e.to_string().contains("collective"), "{e}");
        let s = Desc { op: OP_SEND, ..d };
        let r = Desc { op: OP_RECV, ..d };
        assert!(check_pair(&s, &r).is_ok());
        assert!(check_pair(
            &s,
            &Desc {
                count: ANY_COUNT,
                ..r
            }
        )
        .is_ok());
        assert!(check_pair(&s, &Desc { dtype: 2, ..r }).is_err());
        assert!(check_pair(&s, &Desc { bound: 1e-4, ..r }).is_err());
        assert!(check_pair(&s, &s).is_err());
    }
}
