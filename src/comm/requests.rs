//! The pending non-blocking host operations: sends, receives, allgathers and broadcasts.

use super::*;

/// A pending non-blocking send ([`Communicator::isend`]).
pub struct SendRequest {
    pub(super) handles: Vec<Box<dyn SendHandle>>,
    pub(super) desc: Desc,
    pub(super) dest: usize,
    pub(super) tag: i32,
    pub(super) stats: OpStats,
    pub(super) t0: f64,
    /// A compression error of a pipelined send (reported by `wait_send`).
    pub(super) error: Option<Error>,
}

/// An encoded point-to-point payload.
pub(super) enum Payload<'a> {
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
    pub(super) pending: Box<dyn transport::PendingBytes>,
    pub(super) compressed: bool,
    pub(super) n: usize,
    pub(super) st: OpStats,
    pub(super) t0: f64,
    pub(super) verify: Option<Vec<E::Scalar>>,
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
    pub(super) pending: Box<dyn transport::PendingBytes>,
    pub(super) compressed: bool,
    pub(super) n: usize,
    pub(super) root: usize,
    pub(super) st: OpStats,
    pub(super) t0: f64,
    pub(super) verify: Option<Vec<E::Scalar>>,
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
    pub(super) src: usize,
    pub(super) tag: i32,
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
