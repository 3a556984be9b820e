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

use std::future::Future;
use std::pin::Pin;
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::task::{Context, Poll, Waker};
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

/// Where the progress thread leaves an operation's result, and who to wake when it does.
struct Slot<T> {
    result: Option<Result<(T, OpStats)>>,
    /// The task polling the request as a future (the last one to poll).
    waker: Option<Waker>,
    /// Set when the job was dropped unrun (the progress thread stopped).
    abandoned: bool,
}

/// The progress thread's end of a request: fills the slot and wakes the waiting task. Dropped
/// without [`Completion::complete`] (the thread stopped), it marks the request abandoned so that
/// `wait` and `.await` end with an error instead of hanging.
pub(crate) struct Completion<T> {
    slot: Arc<(Mutex<Slot<T>>, Condvar)>,
    done: bool,
}

impl<T> Completion<T> {
    pub(crate) fn complete(mut self, r: Result<(T, OpStats)>) {
        self.finish(Some(r));
    }

    fn finish(&mut self, r: Option<Result<(T, OpStats)>>) {
        self.done = true;
        let (m, cv) = &*self.slot;
        let mut s = m.lock().unwrap_or_else(|e| e.into_inner());
        match r {
            Some(r) => s.result = Some(r),
            None => s.abandoned = true,
        }
        let w = s.waker.take();
        drop(s);
        cv.notify_all();
        if let Some(w) = w {
            w.wake();
        }
    }
}

impl<T> Drop for Completion<T> {
    fn drop(&mut self) {
        if !self.done {
            self.finish(None);
        }
    }
}

/// A pending non-blocking operation run on the progress thread (see
/// [`Communicator::iallreduce`] and the `comm` module docs); its result is a `T` and the
/// operation's [`OpStats`].
///
/// Three ways to complete it: [`test`](Self::test) (never blocks), [`wait`](Self::wait)
/// (blocks the thread), or `.await` — it is a [`std::future::Future`] woken by the progress
/// thread when the operation ends, so an async runtime (e.g. tokio) can run other tasks, such as
/// a compute loop, while the compressed collective proceeds.
pub struct OpRequest<T> {
    slot: Arc<(Mutex<Slot<T>>, Condvar)>,
    what: &'static str,
}

impl<T> std::fmt::Debug for OpRequest<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "OpRequest({})", self.what)
    }
}

impl<T> OpRequest<T> {
    /// A request and the progress thread's end of it.
    pub(crate) fn new(what: &'static str) -> (Self, Completion<T>) {
        let slot = Arc::new((
            Mutex::new(Slot {
                result: None,
                waker: None,
                abandoned: false,
            }),
            Condvar::new(),
        ));
        (
            OpRequest {
                slot: slot.clone(),
                what,
            },
            Completion { slot, done: false },
        )
    }

    fn stopped(&self) -> Error {
        Error::Comm(format!("{}: the progress thread stopped", self.what))
    }

    /// Whether the operation has completed (never blocks).
    pub fn test(&mut self) -> Result<bool> {
        let s = self.slot.0.lock().unwrap_or_else(|e| e.into_inner());
        if s.result.is_some() {
            Ok(true)
        } else if s.abandoned {
            Err(self.stopped())
        } else {
            Ok(false)
        }
    }

    /// Block until done; the result and the operation's stats (or its error).
    pub fn wait(self) -> Result<(T, OpStats)> {
        let _watchdog = super::watchdog::arm(self.what);
        let (m, cv) = &*self.slot;
        let mut s = m.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(r) = s.result.take() {
                return r;
            }
            if s.abandoned {
                return Err(self.stopped());
            }
            s = cv.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl<T> Future for OpRequest<T> {
    type Output = Result<(T, OpStats)>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut s = self.slot.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = s.result.take() {
            return Poll::Ready(r);
        }
        if s.abandoned {
            return Poll::Ready(Err(self.stopped()));
        }
        // checked and registered under the lock: the progress thread cannot complete in between
        s.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}
