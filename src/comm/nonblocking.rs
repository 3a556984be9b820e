//! The non-blocking reductions and exchange, run on the progress thread with its own
//! duplicated communicator.

use super::*;

impl Communicator {
    /// Whether the non-blocking reductions and `isendrecv` are available (a progress thread
    /// with its own communicator: needs `MPI_THREAD_MULTIPLE`, see [`OpRequest`]).
    pub fn has_progress_thread(&self) -> bool {
        self.worker.is_some()
    }

    pub(super) fn submit<T: Send + 'static>(
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
            run_into(c, Self::allreduce, &input, input.len())
        })
    }

    /// Non-blocking [`allreduce_mean`](Self::allreduce_mean) (see
    /// [`iallreduce`](Self::iallreduce)).
    pub fn iallreduce_mean<E: CommElement>(&mut self, input: &[E]) -> Result<OpRequest<Vec<E>>> {
        let input = input.to_vec();
        self.submit("iallreduce_mean", move |c| {
            run_into(c, Self::allreduce_mean, &input, input.len())
        })
    }

    /// Non-blocking [`reduce_scatter`](Self::reduce_scatter): `wait` gives this rank's segment
    /// of [`partition`]`(input.len(), size)`. Collective (see [`iallreduce`](Self::iallreduce)).
    pub fn ireduce_scatter<E: CommElement>(&mut self, input: &[E]) -> Result<OpRequest<Vec<E>>> {
        let input = input.to_vec();
        let seg = partition(input.len(), self.size())[self.rank()].len();
        self.submit("ireduce_scatter", move |c| {
            run_into(c, Self::reduce_scatter, &input, seg)
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
}

/// A blocking host operation from an input into an output slice, as a non-blocking form runs it
/// on the progress thread (`Communicator::allreduce`, `allreduce_mean`, `reduce_scatter`).
pub(super) type IntoOp<E> = fn(&mut Communicator, &[E], &mut [E]) -> Result<OpStats>;

/// `op` of `input` into a new output of `out_len` elements, returned with the stats: the job a
/// non-blocking reduction queues on the progress thread (which owns the output until `wait`).
pub(super) fn run_into<E: CommElement>(
    c: &mut Communicator,
    op: IntoOp<E>,
    input: &[E],
    out_len: usize,
) -> Result<(Vec<E>, OpStats)> {
    let mut out = vec![E::default(); out_len];
    let st = op(c, input, &mut out)?;
    Ok((out, st))
}

/// An MPI transport moved to the progress thread once, before any use there.
#[cfg(feature = "mpi")]
pub(super) struct SendTransport(pub(super) MpiTransport);

// SAFETY: only created when MPI provides MPI_THREAD_MULTIPLE; the communicator handle is moved to
// the progress thread before it is used there and is used by that thread only.
#[cfg(feature = "mpi")]
unsafe impl Send for SendTransport {}
