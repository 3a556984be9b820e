//! Non-blocking collectives (`MPI_Iallreduce`): one progress thread per communicator.
//!
//! A compressed `MPI_Iallreduce` must progress while the program computes, and its ranks may
//! complete it in any order relative to their other MPI calls (legal MPI: a rank may wait for it
//! after a barrier or a receive that another rank only reaches after its own wait). So the
//! blocking zcomm allreduce runs on a thread of the library's own, one per communicator, over a
//! second private duplicate of the communicator (made, collectively, when the communicator's
//! zcomm state is made). The thread runs the communicator's operations in the order they were
//! issued, which MPI makes the same on every rank.
//!
//! The program gets an MPI *generalized request* (`MPI_Grequest_start`) that the thread
//! completes (`MPI_Grequest_complete`) after the result is in the receive buffer, so
//! `MPI_Wait`, `MPI_Test` (repeatedly), `MPI_Waitall`, `MPI_Testany`, ..., and mixing with any
//! other request work as with the MPI library's own requests. The thread calls MPI while the
//! program does, so this needs `MPI_THREAD_MULTIPLE`: with `ZCOMM_NONBLOCKING=on` (the default)
//! `MPI_Init`/`MPI_Init_thread` ask the MPI library for it (the program is told the level it
//! asked for); when the MPI library provides less on any rank, `MPI_Iallreduce` passes through.
//!
//! A failure on the thread (a corrupt stream, ranks that disagree) ends the job with
//! `MPI_Abort` there and then; a panic is caught and does the same.

use std::ffi::{c_int, c_void};
use std::sync::{mpsc, Mutex, PoisonError};
use std::thread::JoinHandle;

use zcomm::comm::{Communicator, OpStats};

use crate::ffi::{self, MPI_Status};
use crate::state::{guarded, Inside, Zc};

/// An operation for the progress thread.
pub type Job = Box<dyn FnOnce(&mut Communicator) + Send>;

/// One communicator's progress thread and its queue.
pub struct Progress {
    jobs: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

/// Stats of the operations the progress threads finished, not yet in the report.
static FINISHED: Mutex<Vec<(&'static str, OpStats)>> = Mutex::new(Vec::new());

/// Note a finished operation (called on a progress thread).
pub fn finished(op: &'static str, s: OpStats) {
    FINISHED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push((op, s));
}

/// Take the finished operations' stats (for the report).
pub fn drain() -> Vec<(&'static str, OpStats)> {
    std::mem::take(&mut *FINISHED.lock().unwrap_or_else(PoisonError::into_inner))
}

impl Progress {
    /// Start the thread; it owns `zc` (a communicator over its own duplicate) and drops it, on
    /// the thread, when the queue closes.
    pub fn start(zc: Zc) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel::<Job>();
        let thread = std::thread::Builder::new()
            .name("zcomm-mpi-progress".into())
            .spawn(move || {
                // every MPI call of this thread is zcomm's: straight to PMPI
                let _inside = Inside::enter();
                let mut zc = zc;
                while let Ok(job) = rx.recv() {
                    guarded("MPI_Iallreduce (progress thread)", || job(&mut zc.0));
                }
            })?;
        Ok(Progress {
            jobs: Some(tx),
            thread: Some(thread),
        })
    }

    /// Queue `job` (`false` when the thread has stopped).
    pub fn submit(&self, job: Job) -> bool {
        self.jobs.as_ref().is_some_and(|j| j.send(job).is_ok())
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        // close the queue: the thread finishes what was queued, frees its duplicate and ends
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The status of a completed non-blocking collective: empty (no source, tag or elements), like
/// the MPI library's own.
unsafe extern "C" fn query(_extra: *mut c_void, status: *mut MPI_Status) -> c_int {
    if !status.is_null() {
        // SAFETY: MPI passes a status to fill; both calls only write into it
        mpi::ffi::PMPI_Status_set_elements(status, ffi::byte(), 0);
        mpi::ffi::PMPI_Status_set_cancelled(status, 0);
        (*status).MPI_SOURCE = mpi::ffi::RSMPI_ANY_SOURCE;
        (*status).MPI_TAG = mpi::ffi::RSMPI_ANY_TAG;
        (*status).MPI_ERROR = 0;
    }
    0
}

unsafe extern "C" fn free_state(_extra: *mut c_void) -> c_int {
    0
}

/// Cancelling a collective is erroneous in MPI; the operation simply completes.
unsafe extern "C" fn cancel(_extra: *mut c_void, _complete: c_int) -> c_int {
    0
}

/// A new generalized request for a non-blocking collective (completed with [`complete`]).
///
/// # Safety
/// MPI must be initialized.
pub unsafe fn new_request() -> Result<ffi::MPI_Request, c_int> {
    let mut r = ffi::request_null();
    let rc = mpi::ffi::PMPI_Grequest_start(
        Some(query),
        Some(free_state),
        Some(cancel),
        std::ptr::null_mut(),
        &mut r,
    );
    if rc == 0 {
        Ok(r)
    } else {
        Err(rc)
    }
}

/// Complete a request made by [`new_request`] (once).
///
/// # Safety
/// `r` must come from [`new_request`] and not have been completed yet.
pub unsafe fn complete(r: ffi::MPI_Request) -> c_int {
    mpi::ffi::PMPI_Grequest_complete(r)
}
