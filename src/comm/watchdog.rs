//! Optional watchdog of blocking operations (`ZCOMM_TIMEOUT`, seconds).
//!
//! Ranks that disagree on the sequence of operations (one rank runs an extra iteration, another
//! skips a collective) block forever: that is ordinary MPI behaviour, and a batch job then burns
//! its whole allocation without a word. With `ZCOMM_TIMEOUT=S` in the environment, every blocking
//! operation of [`Communicator`](super::Communicator) arms a deadline `S` seconds ahead ([`arm`],
//! disarmed when the returned guard drops). One background thread per process, started with the
//! first communicator ([`init`]), sleeps until the earliest deadline; when one passes while its
//! operation is still running it prints
//! `zcomm: <op> exceeded ZCOMM_TIMEOUT=<S>s on rank <R>; aborting` to stderr and calls
//! `MPI_Abort` on `MPI_COMM_WORLD`, which ends every rank of the job (the other ranks are blocked
//! too, or are waiting in `MPI_Finalize` for this one).
//!
//! Unset, empty or `0`: no watchdog (no thread, and [`arm`] costs one atomic load). Anything
//! else that is not a finite number of seconds `> 0` is an error of the communicator's `init`,
//! so that a typo does not silently leave a job unguarded.

use std::sync::{Condvar, Mutex, Once, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// The environment variable holding the timeout in seconds.
pub const ENV: &str = "ZCOMM_TIMEOUT";

/// Parse a `ZCOMM_TIMEOUT` value: `None`, empty or `0` → no watchdog; a finite number of seconds
/// `> 0` → that timeout (in seconds); anything else → an error naming the variable.
pub fn parse_timeout(value: Option<&str>) -> Result<Option<f64>> {
    let Some(v) = value.map(str::trim).filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    match v.parse::<f64>() {
        Ok(0.0) => Ok(None),
        // Duration::from_secs_f64 panics above ~1.8e19 s: such a timeout never fires anyway
        Ok(s) if s.is_finite() && s > 0.0 && s < 1e15 => Ok(Some(s)),
        _ => Err(Error::invalid(format!(
            "{ENV}=`{v}`: expected a number of seconds > 0 (or 0 / unset for no timeout)"
        ))),
    }
}

/// The process's watchdog: the timeout, this rank and the armed operations.
struct Dog {
    secs: f64,
    rank: usize,
    armed: Mutex<Armed>,
    wake: Condvar,
}

/// Armed operations: `(id, name, deadline)`, several at once when the progress thread of the
/// non-blocking operations and the calling thread both block.
#[derive(Default)]
struct Armed {
    next_id: u64,
    slots: Vec<(u64, &'static str, Instant)>,
}

static DOG: OnceLock<Option<Dog>> = OnceLock::new();
static THREAD: Once = Once::new();

fn dog() -> Option<&'static Dog> {
    DOG.get().and_then(Option::as_ref)
}

/// Read `ZCOMM_TIMEOUT` and, when it is set, start the watchdog thread (once per process; later
/// calls keep the first rank and timeout). `rank` is this process's rank in `MPI_COMM_WORLD`, for
/// the message. Errors when the variable holds no valid timeout.
pub fn init(rank: usize) -> Result<()> {
    let secs = parse_timeout(std::env::var(ENV).ok().as_deref())?;
    let d = DOG.get_or_init(|| secs.map(|secs| Dog::new(secs, rank)));
    if let Some(d) = d.as_ref() {
        THREAD.call_once(|| {
            let spawned = std::thread::Builder::new()
                .name("zcomm-watchdog".into())
                .spawn(move || d.watch());
            if let Err(e) = spawned {
                tracing::warn!(target: "zcomm::comm", "{ENV}: cannot start the watchdog thread: {e}");
            }
        });
    }
    Ok(())
}

/// The timeout in force (seconds), if the watchdog runs.
pub fn timeout() -> Option<f64> {
    dog().map(|d| d.secs)
}

/// An armed deadline; dropping it disarms it.
#[must_use = "the deadline is disarmed when the guard drops"]
#[derive(Debug)]
pub struct Guard(Option<u64>);

/// Arm the deadline of the blocking operation `op` (a no-op without `ZCOMM_TIMEOUT`): the job is
/// aborted if the returned guard still lives `ZCOMM_TIMEOUT` seconds from now.
pub fn arm(op: &'static str) -> Guard {
    Guard(dog().map(|d| d.arm(op)))
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let (Some(id), Some(d)) = (self.0, dog()) {
            d.disarm(id);
        }
    }
}

impl Dog {
    fn new(secs: f64, rank: usize) -> Self {
        Dog {
            secs,
            rank,
            armed: Mutex::new(Armed::default()),
            wake: Condvar::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Armed> {
        // a panicking thread holding the lock leaves the slots consistent (plain pushes and
        // removals): keep watching
        self.armed.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn arm(&self, op: &'static str) -> u64 {
        let mut a = self.lock();
        let id = a.next_id;
        a.next_id += 1;
        let deadline = Instant::now() + Duration::from_secs_f64(self.secs);
        a.slots.push((id, op, deadline));
        // the thread may sleep without any deadline (nothing armed before)
        self.wake.notify_one();
        id
    }

    fn disarm(&self, id: u64) {
        // no wake-up: the thread finds the slot gone at its deadline and sleeps on
        self.lock().slots.retain(|s| s.0 != id);
    }

    /// The earliest armed deadline and its operation.
    fn first(a: &Armed) -> Option<(&'static str, Instant)> {
        a.slots.iter().min_by_key(|s| s.2).map(|s| (s.1, s.2))
    }

    fn watch(&self) {
        let mut a = self.lock();
        loop {
            let now = Instant::now();
            a = match Self::first(&a) {
                None => self.wake.wait(a).unwrap_or_else(PoisonError::into_inner),
                Some((op, deadline)) if deadline <= now => self.expire(op),
                Some((_, deadline)) => {
                    self.wake
                        .wait_timeout(a, deadline - now)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
            };
        }
    }

    fn expire(&self, op: &str) -> ! {
        eprintln!(
            "zcomm: {op} exceeded {ENV}={}s on rank {}; aborting",
            self.secs, self.rank
        );
        #[cfg(feature = "mpi")]
        if mpi::environment::is_initialized() && !mpi::environment::is_finalized() {
            use mpi::topology::Communicator;
            mpi::topology::SimpleCommunicator::world().abort(1)
        }
        // not over MPI (another transport): this process is all there is to end
        std::process::abort()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_parse_and_bad_values_are_errors() {
        assert_eq!(parse_timeout(None).unwrap(), None);
        assert_eq!(parse_timeout(Some("")).unwrap(), None);
        assert_eq!(parse_timeout(Some(" 0 ")).unwrap(), None);
        assert_eq!(parse_timeout(Some("2")).unwrap(), Some(2.0));
        assert_eq!(parse_timeout(Some("0.25")).unwrap(), Some(0.25));
        for bad in ["-1", "abc", "NaN", "inf", "2s", "1e300"] {
            let e = parse_timeout(Some(bad)).unwrap_err().to_string();
            assert!(e.contains("ZCOMM_TIMEOUT") && e.contains(bad), "{bad}: {e}");
        }
    }

    #[test]
    fn the_earliest_live_deadline_is_watched() {
        let d = Dog::new(1000.0, 3);
        assert!(Dog::first(&d.lock()).is_none());
        let a = d.arm("allreduce");
        let b = d.arm("bcast");
        let (op, t) = Dog::first(&d.lock()).unwrap();
        assert_eq!(op, "allreduce");
        assert!(t > Instant::now() + Duration::from_secs(900));
        d.disarm(a);
        assert_eq!(Dog::first(&d.lock()).unwrap().0, "bcast");
        d.disarm(b);
        assert!(Dog::first(&d.lock()).is_none());
    }
}
