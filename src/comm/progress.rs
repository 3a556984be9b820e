//! Non-blocking reductions and sendrecv on a progress thread.
//!
//! [`Communicator::iallreduce`], [`Communicator::ireduce_scatter`] and
//! [`Communicator::isendrecv`] copy their input and queue the *blocking* algorithm (same code,
//! same bound, same protocol) on one progress thread that owns its own [`Communicator`] over a
//! private duplicate of the MPI communicator (made at [`Communicator::init`], collectively). The
//! thread runs the queued operations in order, so every rank runs its non-blocking operations
//! in the order it issued them, and a mismatch is reported by every rank's request. This needs
//! `MPI_THREAD_MULTIPLE` (the calling thread keeps using MPI concurrently): `init` asks for it,
//! and when the MPI library provides less (or the communicator was built over another
//! transport) these calls return [`Error::Unavailable`].
//!
//! The policy, bound, verification and pipeline settings are those of the calling communicator
//! at the time of the call. The requests are [`OpRequest`]s: `test` never blocks, `wait` returns
//! the result vector and the operation's [`OpStats`].

use std::sync::mpsc;
use std::thread::JoinHandle;

use super::{Communicator, OpStats};
use crate::error::{Error, Result};

type Job = Box<dyn FnOnce(&mut Communicator) + Send>;

/// The progress thread and its job queue.
pub(crate) struct Worker {
    jobs: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

impl Worker {
    /// Start the thread; `make` builds its communicator on the thread.
    #[cfg(feature = "mpi")]
    pub(crate) fn start(make: Box<dyn FnOnce() -> Result<Communicator> + Send>) -> Result<Self> {
        let (tx, rx) = mpsc::channel::<Job>();
        let thread = std::thread::Builder::new()
            .name("zcomm-progress".into())
            .spawn(move || {
                let mut comm = match make() {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(target: "zcomm::comm", "progress communicator: {e}");
                        // drain the queue so that requests see a closed channel
                        while rx.recv().is_ok() {}
                        return;
                    }
                };
                while let Ok(job) = rx.recv() {
                    job(&mut comm);
                }
            })
            .map_err(|e| Error::Comm(format!("cannot start the progress thread: {e}")))?;
        Ok(Worker {
            jobs: Some(tx),
            thread: Some(thread),
        })
    }

    pub(crate) fn submit(&self, job: Job) -> Result<()> {
        self.jobs
            .as_ref()
            .and_then(|j| j.send(job).ok())
            .ok_or_else(|| Error::Comm("the progress thread has stopped".into()))
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // close the queue, let the thread finish what was queued, then join
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A pending non-blocking operation run on the progress thread (see
/// [`Communicator::iallreduce`] and the `comm` module docs); its result is a `T` and the
/// operation's [`OpStats`].
pub struct OpRequest<T> {
    rx: mpsc::Receiver<Result<(T, OpStats)>>,
    done: Option<Result<(T, OpStats)>>,
    what: &'static str,
}

impl<T> std::fmt::Debug for OpRequest<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "OpRequest({}, done: {})", self.what, self.done.is_some())
    }
}

impl<T> OpRequest<T> {
    pub(crate) fn new(what: &'static str, rx: mpsc::Receiver<Result<(T, OpStats)>>) -> Self {
        OpRequest {
            rx,
            done: None,
            what,
        }
    }
    /// Whether the operation has completed (never blocks).
    pub fn test(&mut self) -> Result<bool> {
        if self.done.is_some() {
            return Ok(true);
        }
        match self.rx.try_recv() {
            Ok(r) => {
                self.done = Some(r);
                Ok(true)
            }
            Err(mpsc::TryRecvError::Empty) => Ok(false),
            Err(mpsc::TryRecvError::Disconnected) => Err(Error::Comm(format!(
                "{}: the progress thread stopped",
                self.what
            ))),
        }
    }
    /// Block until done; the result and the operation's stats (or its error).
    pub fn wait(mut self) -> Result<(T, OpStats)> {
        let _watchdog = super::watchdog::arm(self.what);
        if let Some(r) = self.done.take() {
            return r;
        }
        self.rx
            .recv()
            .map_err(|_| Error::Comm(format!("{}: the progress thread stopped", self.what)))?
    }
}
