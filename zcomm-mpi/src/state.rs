//! The process's state: settings, one zcomm communicator per MPI communicator, the report, the
//! re-entrancy flag and the fatal-error path.

/// Print one line to stderr in a single `write`: lines of several ranks then never interleave
/// mid-line in the launcher's merged output (`eprintln!` may write a line in several pieces).
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let line = format!("{}\n", format_args!($($arg)*));
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }};
}
// used by the test hooks (feature `test-hooks`)
#[allow(unused_imports)]
pub(crate) use say;

use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::mem::ManuallyDrop;
use std::sync::{Mutex, MutexGuard, PoisonError};

use mpi::raw::{AsRaw, FromRaw};
use mpi::topology::SimpleCommunicator;
use zcomm::comm::{Calibration, Communicator, Config, CpuCompressor, MpiTransport, Transport};
use zcomm::model::{Link, Profile};

use crate::ffi::{self, MPI_Comm};
use crate::report::RankReport;
use crate::settings::{CalibrationMode, Comms, Settings};

thread_local! {
    /// Set while this thread runs zcomm code (whose MPI calls must go straight to PMPI).
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

/// Whether this thread is inside zcomm (its MPI calls must pass through).
pub fn inside() -> bool {
    INSIDE.with(Cell::get)
}

/// Marks this thread as inside zcomm until dropped.
pub struct Inside(bool);

impl Inside {
    /// Enter (nesting is harmless: the outermost guard clears the flag).
    pub fn enter() -> Self {
        Inside(INSIDE.with(|c| c.replace(true)))
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        let prev = self.0;
        INSIDE.with(|c| c.set(prev));
    }
}

/// A zcomm communicator, moved between threads only under [`STATE`]'s lock.
pub struct Zc(pub Communicator);

// SAFETY: the communicator holds MPI handles and a boxed transport that are not `Send` by
// declaration only; they are plain process-wide MPI objects. Every use happens under the
// `STATE` mutex, so no two threads touch it at once (MPI itself is initialized by the
// application with the thread level it needs; calls are serialized here).
unsafe impl Send for Zc {}

/// The zcomm side of one MPI communicator.
pub struct Entry {
    /// The application's communicator handle.
    pub comm: usize,
    /// zcomm's communicator (over a private duplicate), `None` when this communicator never
    /// compresses (opted out, inter-communicator, single rank).
    pub zc: Option<Zc>,
    /// Why it never compresses.
    pub off_reason: &'static str,
    /// Opted out after creation (`MPI_Comm_set_info` with `zcomm=off`).
    pub disabled: bool,
    /// The progress thread of the non-blocking collectives (over a second duplicate), when
    /// `ZCOMM_NONBLOCKING=on` and MPI provides `MPI_THREAD_MULTIPLE` on every rank.
    pub progress: Option<crate::progress::Progress>,
}

/// The process's state.
pub struct State {
    /// Settings (identical on every rank).
    pub settings: Settings,
    /// Rank in `MPI_COMM_WORLD`.
    pub wrank: usize,
    /// Size of `MPI_COMM_WORLD`.
    pub wsize: usize,
    /// Every rank has `MPI_THREAD_MULTIPLE` (progress threads are possible).
    pub multiple: bool,
    /// Counters.
    pub report: RankReport,
    /// Entries in creation order.
    pub entries: Vec<Entry>,
    /// `zcomm` info-key choices made before the entry existed (communicator → on).
    pub overrides: HashMap<usize, bool>,
    /// Pending point-to-point requests (see `wrappers`).
    pub pending: crate::wrappers::Pending,
    /// The GPU codecs of the device ordinals whose buffers the collectives have seen.
    pub gpus: crate::gpu::Gpus,
}

/// The state, `None` before `MPI_Init` and after `MPI_Finalize`.
pub static STATE: Mutex<Option<State>> = Mutex::new(None);

/// Lock the state (a panic in another thread already aborted the job, so poisoning is ignored).
pub fn lock() -> MutexGuard<'static, Option<State>> {
    STATE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Rank in `MPI_COMM_WORLD` without the lock (for messages).
fn world_rank() -> c_int {
    let mut r: c_int = -1;
    // SAFETY: MPI_Comm_rank on MPI_COMM_WORLD writes one int; harmless if MPI is not initialized
    // (an error code is returned and `r` stays -1).
    unsafe {
        mpi::ffi::PMPI_Comm_rank(ffi::world(), &mut r);
    }
    r
}

/// Print `msg` (one line, naming the rank) and end the whole job with `MPI_Abort`.
pub fn fatal(msg: &str) -> ! {
    say!("zcomm-mpi: rank {}: {msg}; aborting the job", world_rank());
    // SAFETY: MPI_Abort on MPI_COMM_WORLD ends every process of the job; it does not return.
    unsafe {
        mpi::ffi::PMPI_Abort(ffi::world(), 1);
    }
    std::process::exit(1)
}

/// [`fatal`] for a failed zcomm operation `what`.
///
/// A rank that fails only because another rank did ([`zcomm::Error::PeerFailed`]: a compressed
/// ring passes a failure on as an empty message) waits a moment first: the rank that saw the
/// cause (a corrupt stream, say) then prints it and ends the job itself, instead of being killed
/// before its line is out.
pub fn fatal_error(what: &str, e: &zcomm::Error) -> ! {
    if matches!(e, zcomm::Error::PeerFailed(_)) {
        std::thread::sleep(std::time::Duration::from_secs(2));
    }
    fatal(&format!("{what}: {e}"))
}

/// Run `f` with panics turned into [`fatal`] (no unwinding across the C boundary).
pub fn guarded<R>(what: &str, f: impl FnOnce() -> R) -> R {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let m = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            fatal(&format!("{what}: internal error (panic): {m}"))
        }
    }
}

impl State {
    /// The zcomm configuration for a new communicator.
    fn config(&self) -> Config {
        let s = &self.settings;
        let cal = match s.effective_calibration() {
            CalibrationMode::Measure => Calibration::Measure,
            CalibrationMode::Load => Calibration::LoadOrMeasure,
            _ => Calibration::Fixed(Profile::new(Link {
                bandwidth: 10e9,
                latency: 2e-6,
            })),
        };
        Config::new(s.bound)
            .with_policy(s.policy)
            .with_verify(s.verify)
            .with_calibration(cal)
            .with_pingpong_bytes(4 << 20)
    }

    /// Move the stats of the operations the progress threads finished into the report.
    pub fn drain_finished(&mut self) {
        for (op, s) in crate::progress::drain() {
            self.report.op(op).record(&s);
        }
    }

    /// The entry of `comm`, if it exists.
    pub fn find(&mut self, comm: MPI_Comm) -> Option<&mut Entry> {
        self.entries.iter_mut().find(|e| e.comm == ffi::key(comm))
    }

    /// The entry of `comm`, created now if needed (collective over `comm` when it is created:
    /// call only from a collective every rank of `comm` makes).
    pub fn entry(&mut self, comm: MPI_Comm) -> &mut Entry {
        if let Some(i) = self.entries.iter().position(|e| e.comm == ffi::key(comm)) {
            return &mut self.entries[i];
        }
        let e = self.create(comm);
        self.entries.push(e);
        self.entries.last_mut().expect("just pushed")
    }

    fn create(&mut self, comm: MPI_Comm) -> Entry {
        let off = |reason| Entry {
            comm: ffi::key(comm),
            zc: None,
            off_reason: reason,
            disabled: false,
            progress: None,
        };
        let mut inter: c_int = 0;
        let mut size: c_int = 0;
        // SAFETY: `comm` is a communicator the application passed to a collective (MPI checks
        // it); both calls write one int.
        unsafe {
            mpi::ffi::PMPI_Comm_test_inter(comm, &mut inter);
            mpi::ffi::PMPI_Comm_size(comm, &mut size);
        }
        if inter != 0 {
            return off("inter-communicator");
        }
        if size < 2 {
            return off("single-rank communicator");
        }
        let default_on = match self.settings.comms {
            Comms::All => true,
            Comms::World => comm == ffi::world(),
        };
        if !self
            .overrides
            .get(&(ffi::key(comm)))
            .copied()
            .unwrap_or(default_on)
        {
            return off("communicator opted out");
        }
        let cfg = self.config();
        let _inside = Inside::enter();
        // SAFETY: the handle is live (see above) and the wrapper is never dropped (the
        // application owns the handle; `MpiTransport::new` duplicates it, which is collective and
        // happens on every rank at this same collective call).
        let sc = ManuallyDrop::new(unsafe { SimpleCommunicator::from_raw(comm) });
        let zc = match Communicator::with_transport(
            self.transport(&sc),
            Box::new(CpuCompressor),
            cfg.clone(),
        ) {
            Ok(c) => c,
            Err(e) => fatal_error("cannot set up zcomm on a communicator", &e),
        };
        // the non-blocking collectives' communicator: a second duplicate, the same profile
        let progress = (self.settings.nonblocking && self.multiple).then(|| {
            let cfg = cfg.with_calibration(Calibration::Fixed(zc.profile().clone()));
            let c = match Communicator::with_transport(
                self.transport(&sc),
                Box::new(CpuCompressor),
                cfg,
            ) {
                Ok(c) => c,
                Err(e) => fatal(&format!("cannot set up zcomm's progress communicator: {e}")),
            };
            match crate::progress::Progress::start(Zc(c)) {
                Ok(p) => p,
                Err(e) => fatal(&format!("cannot start zcomm's progress thread: {e}")),
            }
        });
        Entry {
            comm: ffi::key(comm),
            zc: Some(Zc(zc)),
            off_reason: "",
            disabled: false,
            progress,
        }
    }

    /// A transport over a new duplicate of `sc` (collective), damaged by the test hook when
    /// `ZCOMM_TEST_CORRUPT` is set (builds with the `test-hooks` feature only).
    fn transport(&self, sc: &SimpleCommunicator) -> Box<dyn Transport> {
        let t = MpiTransport::new(sc);
        debug_assert!(!t.raw().as_raw().0.is_null());
        #[cfg(feature = "test-hooks")]
        if let Some(c) = self.settings.test_corrupt {
            return Box::new(crate::hooks::CorruptTransport::new(t, c, self.wrank));
        }
        Box::new(t)
    }
}

/// Set up the library after `PMPI_Init*`: read and check the settings (identical on every rank),
/// start logging, build `MPI_COMM_WORLD`'s zcomm communicator.
pub fn setup() {
    let _inside = Inside::enter();
    let parsed = crate::settings::Settings::from_env();
    let (mut rank, mut size): (c_int, c_int) = (0, 0);
    // SAFETY: MPI is initialized (called right after PMPI_Init*); the calls write ints and
    // reduce two i64 arrays of length 3 on MPI_COMM_WORLD, which every rank does here.
    let (ok_min, h_min, h_max, multiple) = unsafe {
        mpi::ffi::PMPI_Comm_rank(ffi::world(), &mut rank);
        mpi::ffi::PMPI_Comm_size(ffi::world(), &mut size);
        let hash = parsed.as_ref().map_or(0, |s| s.agreement_hash() as i64);
        let mut level: c_int = 0;
        mpi::ffi::PMPI_Query_thread(&mut level);
        let multiple = i64::from(level == mpi::ffi::RSMPI_THREAD_MULTIPLE);
        let mine = [i64::from(parsed.is_ok()), hash, multiple];
        let mut lo = [0i64; 3];
        let mut hi = [0i64; 3];
        mpi::ffi::PMPI_Allreduce(
            mine.as_ptr().cast::<c_void>(),
            lo.as_mut_ptr().cast(),
            3,
            mpi::ffi::RSMPI_INT64_T,
            mpi::ffi::RSMPI_MIN,
            ffi::world(),
        );
        mpi::ffi::PMPI_Allreduce(
            mine.as_ptr().cast::<c_void>(),
            hi.as_mut_ptr().cast(),
            3,
            mpi::ffi::RSMPI_INT64_T,
            mpi::ffi::RSMPI_MAX,
            ffi::world(),
        );
        (lo[0], lo[1], hi[1], lo[2] == 1)
    };
    let settings = match parsed {
        Err(e) => {
            say!("zcomm-mpi: rank {rank}: invalid setting {e}; aborting the job");
            end_job_together()
        }
        Ok(_) if ok_min == 0 => {
            say!(
                "zcomm-mpi: rank {rank}: another rank has an invalid ZCOMM_* setting (see its message); aborting the job"
            );
            end_job_together()
        }
        Ok(_) if h_min != h_max => {
            say!(
                "zcomm-mpi: rank {rank}: the ZCOMM_* settings differ between ranks (every rank must use the same); aborting the job"
            );
            end_job_together()
        }
        Ok(s) => s,
    };
    if let Some(f) = &settings.log {
        // a filter validated by Settings; a subscriber set by someone else wins
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(f))
            .with_writer(std::io::stderr)
            .try_init();
    }
    let mut st = State {
        settings,
        wrank: rank as usize,
        wsize: size as usize,
        multiple,
        report: RankReport {
            rank: rank as usize,
            ..Default::default()
        },
        entries: Vec::new(),
        overrides: HashMap::new(),
        pending: Default::default(),
        gpus: Default::default(),
    };
    if st.settings.nonblocking {
        st.report.note(if multiple {
            "ZCOMM_NONBLOCKING=on: MPI was initialized with MPI_THREAD_MULTIPLE; MPI_Iallreduce runs on a progress thread per communicator"
        } else {
            "ZCOMM_NONBLOCKING=on but MPI_THREAD_MULTIPLE was not provided on every rank: MPI_Iallreduce passes through"
        });
    }
    st.entry(ffi::world());
    *lock() = Some(st);
}

/// Every rank has printed its line: meet, then end the job.
fn end_job_together() -> ! {
    use std::io::Write;
    let _ = std::io::stderr().flush();
    // SAFETY: every rank reaches this point together (the decision came from an allreduce).
    unsafe {
        mpi::ffi::PMPI_Barrier(ffi::world());
    }
    // The other ranks leave first: a process that exits closes its output, so the launcher
    // forwards every line it wrote (a process killed by the abort may lose lines still in the
    // launcher's pipe). Rank 0 then aborts, which ends the job with a failure status.
    if world_rank() != 0 {
        std::process::exit(1);
    }
    std::thread::sleep(std::time::Duration::from_millis(1000));
    // SAFETY: MPI_Abort ends every process of the job; it does not return.
    unsafe {
        mpi::ffi::PMPI_Abort(ffi::world(), 1);
    }
    std::process::exit(1)
}

/// Tear down before `PMPI_Finalize`: free the zcomm communicators, gather the reports and write
/// `ZCOMM_REPORT` on rank 0.
pub fn teardown() {
    let _inside = Inside::enter();
    let Some(mut st) = lock().take() else {
        return;
    };
    // free the private duplicates in reverse creation order (the same order on every rank)
    while let Some(e) = st.entries.pop() {
        drop(e);
    }
    st.drain_finished();
    let Some(path) = st.settings.report.clone() else {
        return;
    };
    let mine = serde_json::to_vec(&st.report).unwrap_or_default();
    let n = mine.len() as c_int;
    let mut lens = vec![0 as c_int; st.wsize];
    // SAFETY: a gather of one int and a gatherv of each rank's bytes to rank 0 on
    // MPI_COMM_WORLD, every rank in MPI_Finalize; the buffers have the announced sizes.
    let all = unsafe {
        mpi::ffi::PMPI_Gather(
            (&n as *const c_int).cast(),
            1,
            mpi::ffi::RSMPI_INT32_T,
            lens.as_mut_ptr().cast(),
            1,
            mpi::ffi::RSMPI_INT32_T,
            0,
            ffi::world(),
        );
        let mut displs = Vec::with_capacity(st.wsize);
        let mut total: c_int = 0;
        for &l in &lens {
            displs.push(total);
            total = total.saturating_add(l);
        }
        let mut all = vec![0u8; if st.wrank == 0 { total as usize } else { 0 }];
        mpi::ffi::PMPI_Gatherv(
            mine.as_ptr().cast(),
            n,
            ffi::byte(),
            all.as_mut_ptr().cast(),
            lens.as_ptr(),
            displs.as_ptr(),
            ffi::byte(),
            0,
            ffi::world(),
        );
        (all, displs)
    };
    if st.wrank != 0 {
        return;
    }
    let (bytes, displs) = all;
    let mut ranks = Vec::with_capacity(st.wsize);
    for (i, &d) in displs.iter().enumerate() {
        let s = &bytes[d as usize..d as usize + lens[i] as usize];
        ranks.push(serde_json::from_slice(s).unwrap_or_default());
    }
    let job = crate::report::JobReport::new(&st.settings, ranks);
    let text = serde_json::to_string_pretty(&job).unwrap_or_default();
    if let Err(e) = std::fs::write(&path, text + "\n") {
        say!("zcomm-mpi: rank 0: cannot write ZCOMM_REPORT={path}: {e}");
    }
}
