//! [`NcclComm`]: construction over a bootstrap transport, accessors and the raw NCCL operations.

use super::*;

pub(super) fn local_rank(rank: usize) -> usize {
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

pub(super) fn transport_label_from_env() -> String {
    let on = |k: &str| std::env::var(k).map(|v| v.trim() == "1").unwrap_or(false);
    if on("NCCL_P2P_DISABLE") && on("NCCL_SHM_DISABLE") {
        "socket".into()
    } else {
        "nvlink".into()
    }
}

/// Compressed collectives on device buffers over NCCL. See the [module docs](super).
pub struct NcclComm {
    pub(super) sh: Rc<Shared>,
    pub(super) gpu: Option<crate::gpu::GpuCodec>,
    pub(super) gpu_error: String,
    pub(super) utils: kernels::Utils,
    pub(super) config: NcclConfig,
    pub(super) profile: Profile,
    /// Agreed `Auto` ratios of collectives (identical on all ranks, see [`auto`]).
    pub(super) ratios: AgreedRatios,
    /// The ratios of both directions of this rank's last compressed collective.
    pub(super) last_ratios: Option<WireRatio>,
    /// This rank's measured ratios of its compressed reductions and allgathers by shape and
    /// codec: what the piece count is chosen from when the policy gives no estimate (`Always`;
    /// [`NcclComm::piece_ratio`]). Local, not agreed: the count itself is agreed before the
    /// ring or gather.
    pub(super) measured_ratios: std::collections::HashMap<auto::RatioKey, WireRatio>,
    /// `Auto` ratios of this rank's sends (the sender alone decides a point-to-point message).
    pub(super) p2p_ratios: AgreedRatios,
    /// Whether each rank loaded its device codec (exchanged at construction).
    pub(super) codec_ranks: Vec<bool>,
    pub(super) seq: u64,
    pub(super) send_pool: Pool,
    pub(super) recv_pool: Pool,
    /// Device buffers the reductions' ring messages land in, reused across calls
    /// ([`device_link`]).
    pub(super) ring_pool: Vec<CudaSlice<u8>>,
    pub(super) device_name: String,
    pub(super) ordinal: usize,
    pub(super) _universe: Option<mpi::environment::Universe>,
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
        let boot = crate::comm::MpiTransport::new(&world);
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
            profile: Profile::direct_guess(&label),
            config,
            ratios: AgreedRatios::default(),
            last_ratios: None,
            measured_ratios: std::collections::HashMap::new(),
            p2p_ratios: AgreedRatios::default(),
            codec_ranks,
            seq: 0,
            send_pool: Pool::default(),
            recv_pool: Pool::default(),
            ring_pool: Vec::new(),
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
    /// device memory), for a host-buffer [`Communicator`](crate::comm::Communicator).
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
    /// Change the pipeline piece size of point-to-point messages (bytes; all ranks alike).
    pub fn set_piece_bytes(&mut self, b: usize) {
        self.config.piece_bytes = b;
    }
    /// The compression ratios of both directions ([`WireRatio`]) this rank measured in its
    /// last compressed collective (what its prediction used); `None` before the first.
    pub fn last_ratios(&self) -> Option<WireRatio> {
        self.last_ratios
    }
    /// The calibration profile in use (identical on all ranks).
    pub fn profile(&self) -> &Profile {
        &self.profile
    }
    /// Replace the profile (all ranks alike).
    pub fn set_profile(&mut self, p: Profile) {
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
    pub(super) fn codec_missing_msg(&self, ranks: &[usize]) -> String {
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

    pub(super) fn check_peer(&self, r: usize) -> Result<()> {
        crate::comm::transport::check_rank(r, self.size())
    }

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
}
