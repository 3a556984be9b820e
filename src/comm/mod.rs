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
//! The collectives every communicator shares (allreduce, allreduce_mean, reduce_scatter,
//! allgather) also have one call shape for host slices and device buffers, over MPI, loopback
//! or NCCL: the [`Collectives`] trait (with [`Communicator::staged`] for device buffers staged
//! through pinned memory).
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

mod agreement;
mod bounds;
mod calibrate;
mod collectives;
mod compressor;
mod config;
#[cfg(feature = "cuda")]
pub mod device;
#[cfg(feature = "cuda")]
mod device_calibrate;
#[cfg(feature = "cuda")]
pub mod device_gather;
#[cfg(feature = "cuda")]
pub mod device_ring;
mod element;
mod gather;
mod link_calibrate;
#[cfg(feature = "nccl")]
pub mod nccl;
mod nonblocking;
mod p2p;
mod pipeline;
mod plan;
mod progress;
mod reduce;
mod requests;
mod ring;
mod stats;
#[cfg(test)]
mod tests;
pub mod transport;
pub mod watchdog;

use std::fmt;
use std::ops::Range;
use std::path::PathBuf;

pub use collectives::Collectives;
#[cfg(feature = "cuda")]
pub use collectives::StagedDevice;
pub use compressor::{Compressor, CpuCompressor};
#[cfg(feature = "cuda")]
pub use device::{
    DeviceAllgatherRequest, DeviceBcastRequest, DeviceRequest, DeviceStager, GpuCompressor,
    StageTimes, Staged,
};
pub use element::{CommElement, Real};
#[cfg(feature = "cuda")]
use p2p::Swapped;
pub use progress::OpRequest;
#[cfg(feature = "mpi")]
pub use transport::MpiTransport;
pub use transport::{PendingBytes, ReduceOp, SendHandle, Transport};

use crate::codec::CodecKind;
use crate::error::{Error, Result};
use crate::format::Dtype;
use crate::model::{self, choice, Link, Policy, Profile, RatioCache, Scenario};
use crate::quant::ErrorBound;
use element::{dtype_name, scalar_bytes, scalar_bytes_mut, scalars_from_bytes};
use pipeline::ChunkCodec;

use agreement::*;
use bounds::*;
pub use bounds::{partition, reduction_step_bound};
#[cfg(feature = "cuda")]
use calibrate::hostname;
pub use config::{Calibration, Config};
#[cfg(feature = "mpi")]
use nonblocking::SendTransport;
use plan::*;
use requests::*;
pub use requests::{AllgatherRequest, BcastRequest, RecvRequest, SendRequest};
pub use stats::{Decision, OpStats};

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
}
