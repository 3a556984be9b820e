//! The byte-level transport under a [`Communicator`](super::Communicator).
//!
//! A [`Transport`] moves opaque byte messages between ranks and offers the few small native
//! collectives the compressed algorithms need (fixed-size allgather of descriptors, min/max/sum of
//! a few f64s, byte broadcast). [`MpiTransport`] implements it over the `mpi` crate; an NCCL
//! transport can implement the same trait (byte messages on device memory staged through host, or
//! a device-side trait extension) without touching the algorithms in `comm`.

use crate::error::{Error, Result};

/// Element-wise operations the transport's small reductions support.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    /// Sum.
    Sum,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
}

/// A pending non-blocking send; completing it returns the buffer's ownership to the transport.
pub trait SendHandle {
    /// Block until the send buffer may be reused (freed).
    fn wait(self: Box<Self>) -> Result<()>;
    /// Whether the send has completed (never blocks).
    fn test(&mut self) -> Result<bool>;
}

/// A pending non-blocking collective on bytes ([`Transport::iallgatherv`],
/// [`Transport::ibcast`]).
pub trait PendingBytes {
    /// Block until done; returns the gathered records (one per rank) or the broadcast bytes
    /// (one record).
    fn wait(self: Box<Self>) -> Result<Vec<Vec<u8>>>;
    /// Whether it has completed (never blocks).
    fn test(&mut self) -> Result<bool>;
}

/// An already completed [`PendingBytes`] (used by blocking fallbacks).
#[derive(Debug)]
pub struct Ready(pub Vec<Vec<u8>>);

impl PendingBytes for Ready {
    fn wait(self: Box<Self>) -> Result<Vec<Vec<u8>>> {
        Ok(self.0)
    }
    fn test(&mut self) -> Result<bool> {
        Ok(true)
    }
}

/// Host memory that a non-blocking transfer owns while it runs and hands back when it completes
/// ([`Transport::ibcast_into`], [`Transport::iallgatherv_into`]): a `Vec<u8>`, or a caller's
/// page-locked buffer (the device staging's pinned memory) wrapped in a type of its own, so the
/// transfer needs neither an allocation nor a copy. The memory behind
/// [`bytes`](Self::bytes) must stay at the same address while the object is alive and
/// unmoved-from (true of heap and pinned allocations).
pub trait OwnedBytes: std::any::Any {
    /// The whole buffer.
    fn bytes(&mut self) -> Result<&mut [u8]>;
    /// For getting the concrete buffer back (`Box<dyn Any>::downcast`).
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any>;
}

impl OwnedBytes for Vec<u8> {
    fn bytes(&mut self) -> Result<&mut [u8]> {
        Ok(self.as_mut_slice())
    }
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any> {
        self
    }
}

/// A pending non-blocking transfer on owned buffers ([`Transport::ibcast_into`],
/// [`Transport::iallgatherv_into`]). Dropping it waits for the transfer (the buffers are never
/// freed while MPI may still use them).
pub trait PendingBuf {
    /// Block until done; hands the buffers back in the order they were given.
    fn wait(self: Box<Self>) -> Result<Vec<Box<dyn OwnedBytes>>>;
    /// Whether it has completed (never blocks).
    fn test(&mut self) -> Result<bool>;
}

/// An already completed [`PendingBuf`] (blocking fallbacks).
pub struct ReadyBuf(pub Vec<Box<dyn OwnedBytes>>);

impl std::fmt::Debug for ReadyBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ReadyBuf({} buffers)", self.0.len())
    }
}

impl PendingBuf for ReadyBuf {
    fn wait(self: Box<Self>) -> Result<Vec<Box<dyn OwnedBytes>>> {
        Ok(self.0)
    }
    fn test(&mut self) -> Result<bool> {
        Ok(true)
    }
}

/// The first `len` bytes of an owned buffer (an error when it is shorter).
fn owned_prefix<'a>(b: &'a mut dyn OwnedBytes, len: usize, what: &str) -> Result<&'a mut [u8]> {
    let s = b.bytes()?;
    let have = s.len();
    s.get_mut(..len)
        .ok_or_else(|| Error::invalid(format!("{what}: buffer has {have} bytes, {len} needed")))
}

/// Check the arguments of [`Transport::allgatherv_into`].
fn check_gather_lens(
    rank: usize,
    size: usize,
    mine: &[u8],
    lens: &[usize],
    out: &[u8],
) -> Result<()> {
    if lens.len() != size || lens[rank] != mine.len() || lens.iter().sum::<usize>() != out.len() {
        return Err(Error::invalid(
            "allgatherv_into: lengths disagree with the records or the output",
        ));
    }
    Ok(())
}

/// Moves byte messages between the ranks of one group.
///
/// Messages between one pair of ranks with one tag are delivered in order. Tags must lie in
/// `0..=32767` (the smallest upper bound MPI guarantees).
pub trait Transport {
    /// This process's rank.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn size(&self) -> usize;
    /// Blocking send of `bytes` (any length, including 0) to `dest`.
    fn send(&self, dest: usize, tag: i32, bytes: &[u8]) -> Result<()>;
    /// Blocking receive of one message from `src`; its length is learnt by probing.
    fn recv(&self, src: usize, tag: i32) -> Result<Vec<u8>>;
    /// Receive one message from `src` straight into `buf` when its length is exactly
    /// `buf.len()` (returns `None`); a message of any other length is returned as a vector.
    fn recv_into(&self, src: usize, tag: i32, buf: &mut [u8]) -> Result<Option<Vec<u8>>> {
        let v = self.recv(src, tag)?;
        if v.len() == buf.len() {
            buf.copy_from_slice(&v);
            Ok(None)
        } else {
            Ok(Some(v))
        }
    }
    /// Send `bytes` to `dest` and receive one message from `src` (deadlock-free pairwise exchange).
    fn sendrecv(&self, dest: usize, bytes: &[u8], src: usize, tag: i32) -> Result<Vec<u8>>;
    /// Pairwise exchange when the incoming length is known: send `bytes` to `dest` and receive
    /// exactly `recv.len()` bytes from `src` into `recv` (no copies, no probing).
    fn sendrecv_sized(
        &self,
        dest: usize,
        bytes: &[u8],
        src: usize,
        recv: &mut [u8],
        tag: i32,
    ) -> Result<()> {
        let h = self.isend(dest, tag, bytes.to_vec())?;
        let r = self.recv_into(src, tag, recv)?;
        h.wait()?;
        match r {
            None => Ok(()),
            Some(v) => Err(Error::Comm(format!(
                "expected a {}-byte message from rank {src}, got {} bytes",
                recv.len(),
                v.len()
            ))),
        }
    }
    /// Non-blocking send; the transport owns `bytes` until the handle completes.
    fn isend(&self, dest: usize, tag: i32, bytes: Vec<u8>) -> Result<Box<dyn SendHandle>>;
    /// Receive the next message from `src` with `tag` without waiting for its data: blocks only
    /// until the message's envelope is visible (probe, to learn its length), then posts a
    /// non-blocking receive and returns; the one record of the result is the message. Lets a
    /// caller compute while the payload arrives (the chunk pipeline). Default: blocking
    /// [`recv`](Self::recv).
    fn irecv(&self, src: usize, tag: i32) -> Result<Box<dyn PendingBytes>> {
        Ok(Box::new(Ready(vec![self.recv(src, tag)?])))
    }
    /// Whether a message from `src` with `tag` is waiting (never blocks).
    fn iprobe(&self, src: usize, tag: i32) -> Result<bool>;
    /// Gather one equal-length byte record from every rank, in rank order.
    fn allgather_fixed(&self, mine: &[u8]) -> Result<Vec<u8>>;
    /// Every rank's `len` (rank order): an [`allgather_fixed`](Self::allgather_fixed) of one
    /// little-endian u64 each.
    fn allgather_lens(&self, len: usize) -> Result<Vec<usize>> {
        let all = self.allgather_fixed(&(len as u64).to_le_bytes())?;
        Ok(all
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8-byte chunks")) as usize)
            .collect())
    }
    /// Gather one byte record of any length from every rank.
    fn allgatherv(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>>;
    /// Non-blocking allgather of byte records whose lengths every rank already knows (`lens`, in
    /// rank order; `mine.len() == lens[rank]`). Default: the blocking [`allgatherv`](Self::allgatherv).
    fn iallgatherv(&self, mine: Vec<u8>, lens: &[usize]) -> Result<Box<dyn PendingBytes>> {
        let _ = lens;
        Ok(Box::new(Ready(self.allgatherv(&mine)?)))
    }
    /// Non-blocking broadcast of `len` bytes from `root` (`bytes` is the data on the root and
    /// ignored elsewhere). Default: the blocking [`bcast`](Self::bcast).
    fn ibcast(&self, root: usize, bytes: Vec<u8>, len: usize) -> Result<Box<dyn PendingBytes>> {
        let mut b = bytes;
        b.resize(len, 0);
        self.bcast(root, &mut b)?;
        Ok(Box::new(Ready(vec![b])))
    }
    /// Broadcast `bytes` from `root` (other ranks' vectors are replaced).
    fn bcast(&self, root: usize, bytes: &mut Vec<u8>) -> Result<()>;
    /// Blocking allgather of byte records of known lengths (`lens`, rank order, `mine.len() ==
    /// lens[rank]`) into the borrowed `out` (`lens` summed; the records concatenated in rank
    /// order), e.g. pinned host memory: no allocation and no copy of the records. This rank's
    /// range of `out` may be left untouched (callers read their own record from `mine`).
    /// Default: [`allgatherv`](Self::allgatherv) and a copy.
    fn allgatherv_into(&self, mine: &[u8], lens: &[usize], out: &mut [u8]) -> Result<()> {
        check_gather_lens(self.rank(), self.size(), mine, lens, out)?;
        let parts = self.allgatherv(mine)?;
        let mut off = 0;
        for (k, (part, &l)) in parts.iter().zip(lens).enumerate() {
            if part.len() != l {
                return Err(Error::Comm(format!(
                    "allgatherv_into: rank {k} sent {} bytes, {l} announced",
                    part.len()
                )));
            }
            out[off..off + l].copy_from_slice(part);
            off += l;
        }
        Ok(())
    }
    /// Blocking broadcast of `buf` from `root` into the borrowed `buf` of every rank (the same
    /// length everywhere, known in advance), e.g. pinned host memory. Default:
    /// [`bcast`](Self::bcast) and a copy.
    fn bcast_into(&self, root: usize, buf: &mut [u8]) -> Result<()> {
        let mut v = buf.to_vec();
        self.bcast(root, &mut v)?;
        if v.len() != buf.len() {
            return Err(Error::Comm(format!(
                "bcast_into: {} bytes received, {} expected",
                v.len(),
                buf.len()
            )));
        }
        buf.copy_from_slice(&v);
        Ok(())
    }
    /// Non-blocking [`bcast_into`](Self::bcast_into) of the first `len` bytes of the owned
    /// `buf` (the same `len` on every rank, known in advance; `buf` may be longer), e.g. pinned
    /// host memory: no allocation and no copy. The transfer owns `buf` until it completes;
    /// [`PendingBuf::wait`] hands it back (one buffer) with the root's bytes in `..len`.
    /// Default: the blocking [`bcast_into`](Self::bcast_into).
    fn ibcast_into(
        &self,
        root: usize,
        mut buf: Box<dyn OwnedBytes>,
        len: usize,
    ) -> Result<Box<dyn PendingBuf>> {
        self.bcast_into(root, owned_prefix(buf.as_mut(), len, "ibcast_into")?)?;
        Ok(Box::new(ReadyBuf(vec![buf])))
    }
    /// Non-blocking [`allgatherv_into`](Self::allgatherv_into) on owned buffers: this rank's
    /// record is `mine[..lens[rank]]`, the records land in `out[..lens.iter().sum()]` (rank
    /// order; this rank's range may be left untouched). No allocation, no copy of the records.
    /// [`PendingBuf::wait`] hands back `[mine, out]`. Default: the blocking
    /// [`allgatherv_into`](Self::allgatherv_into).
    fn iallgatherv_into(
        &self,
        mut mine: Box<dyn OwnedBytes>,
        lens: &[usize],
        mut out: Box<dyn OwnedBytes>,
    ) -> Result<Box<dyn PendingBuf>> {
        if lens.len() != self.size() {
            return Err(Error::invalid(
                "iallgatherv_into: lengths disagree with the ranks",
            ));
        }
        let (total, ml) = (lens.iter().sum::<usize>(), lens[self.rank()]);
        {
            let m = owned_prefix(mine.as_mut(), ml, "iallgatherv_into")?;
            let o = owned_prefix(out.as_mut(), total, "iallgatherv_into")?;
            self.allgatherv_into(m, lens, o)?;
        }
        Ok(Box::new(ReadyBuf(vec![mine, out])))
    }
    /// In-place element-wise reduction of a small f64 vector over all ranks.
    fn allreduce_f64(&self, vals: &mut [f64], op: ReduceOp) -> Result<()>;
    /// Native (uncompressed) sum over all ranks of `input` into `out` (same length).
    fn allreduce_sum_f32(&self, input: &[f32], out: &mut [f32]) -> Result<()>;
    /// Native (uncompressed) sum over all ranks of `input` into `out` (same length).
    fn allreduce_sum_f64(&self, input: &[f64], out: &mut [f64]) -> Result<()>;
    /// Synchronize all ranks.
    fn barrier(&self) -> Result<()>;
    /// Wall-clock time in seconds (monotonic within a process).
    fn wtime(&self) -> f64;
    /// A second transport over the same ranks whose messages never match this one's, that can
    /// be moved to another thread (the progress thread of the non-blocking operations), or
    /// `None` when the transport cannot offer one. Collective: every rank calls it at the same
    /// point. Default: `None`.
    fn duplicate(&self) -> Result<Option<Box<dyn Transport + Send>>> {
        Ok(None)
    }
}

/// The peer check of the transports and communicators: an invalid-argument error unless `r`
/// is a rank of a communicator of `size` ranks.
pub(crate) fn check_rank(r: usize, size: usize) -> Result<()> {
    if r >= size {
        return Err(Error::invalid(format!(
            "rank {r} out of range (size {size})"
        )));
    }
    Ok(())
}

#[cfg(feature = "mpi")]
mod mpi;
pub(crate) mod pool;
#[cfg(feature = "mpi")]
pub use self::mpi::MpiTransport;

pub mod loopback;
pub use self::loopback::{run_ranks, LinkEmulation, LoopbackTransport};

#[cfg(feature = "cuda")]
pub mod device_loopback;
#[cfg(feature = "cuda")]
pub use self::device_loopback::DeviceLoopback;

/// A message in device memory: the first `len` bytes of a buffer that may be longer (received
/// messages land in reused buffers; give them back with [`DeviceTransport::recycle`]).
///
/// A message from a queued transfer ([`DeviceTransport::sendrecv_device`] over NCCL) may still
/// be on its way: a stream that reads it must first [`wait_ready`](DeviceBytes::wait_ready).
/// Dropping one orders the buffer's release after the transfer.
#[cfg(feature = "cuda")]
#[derive(Debug)]
pub struct DeviceBytes {
    buf: Option<cudarc::driver::CudaSlice<u8>>,
    len: usize,
    /// Completes when the bytes are in `buf` (a queued transfer), `None` when they already are.
    ready: Option<std::sync::Arc<cudarc::driver::CudaEvent>>,
}

#[cfg(feature = "cuda")]
impl DeviceBytes {
    /// The first `len` bytes of `buf` (`len <= buf.len()`, else an error).
    pub fn new(buf: cudarc::driver::CudaSlice<u8>, len: usize) -> Result<Self> {
        if len > buf.len() {
            return Err(Error::invalid(format!(
                "a {len}-byte message cannot live in a {}-byte buffer",
                buf.len()
            )));
        }
        Ok(DeviceBytes {
            buf: Some(buf),
            len,
            ready: None,
        })
    }
    /// The message, in `buf` once `ready` has completed.
    pub fn arriving(
        buf: cudarc::driver::CudaSlice<u8>,
        len: usize,
        ready: std::sync::Arc<cudarc::driver::CudaEvent>,
    ) -> Result<Self> {
        let mut b = Self::new(buf, len)?;
        b.ready = Some(ready);
        Ok(b)
    }
    /// The message's length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the message is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Make `stream` wait until the message is in its buffer (nothing to wait for unless it
    /// came from a queued transfer).
    pub fn wait_ready(&self, stream: &cudarc::driver::CudaStream) -> Result<()> {
        match &self.ready {
            Some(ev) => stream
                .wait(ev)
                .map_err(|e| Error::Gpu(format!("waiting for a device message: {e:?}"))),
            None => Ok(()),
        }
    }
    /// The message's bytes (after [`wait_ready`](Self::wait_ready) on the stream that reads them,
    /// for a queued transfer's).
    pub fn view(&self) -> cudarc::driver::CudaView<'_, u8> {
        self.buf
            .as_ref()
            .expect("a DeviceBytes holds its buffer until dropped")
            .slice(..self.len)
    }
    /// The whole buffer back; its own stream first waits for a transfer still under way.
    pub fn into_buffer(mut self) -> cudarc::driver::CudaSlice<u8> {
        let buf = self
            .buf
            .take()
            .expect("a DeviceBytes holds its buffer until dropped");
        if let Some(ev) = self.ready.take() {
            let _ = buf.stream().wait(&ev);
        }
        buf
    }
}

#[cfg(feature = "cuda")]
impl Drop for DeviceBytes {
    fn drop(&mut self) {
        // a buffer freed on its stream before the transfer into it has finished would be
        // written after its release
        if let (Some(buf), Some(ev)) = (&self.buf, &self.ready) {
            let _ = buf.stream().wait(ev);
        }
    }
}

/// A [`Transport`] that also moves bytes that live in device memory, without staging them
/// through the host (NVLink, PCIe peer copies, or the in-process [`DeviceLoopback`]).
///
/// The device-resident algorithms (`comm::device_ring`) are written against it; the host
/// transport ([`host`](Self::host)) carries their small agreements (descriptors, value ranges).
#[cfg(feature = "cuda")]
pub trait DeviceTransport {
    /// The host transport of the same ranks, for the small agreements.
    fn host(&self) -> &dyn Transport;

    /// Send `bytes` (device memory, ready on `stream`) to `dest` and receive one message from
    /// `src`. A link may return while the bytes still move (NCCL queues the transfer on its own
    /// stream): a stream that reads the received message first calls its
    /// [`DeviceBytes::wait_ready`], and `bytes` stays unchanged until then.
    fn sendrecv_device(
        &self,
        dest: usize,
        bytes: &cudarc::driver::CudaView<'_, u8>,
        src: usize,
        stream: &std::sync::Arc<cudarc::driver::CudaStream>,
    ) -> Result<DeviceBytes>;

    /// Gather one device record of any length from every rank, in rank order; this rank's own
    /// entry is `None` (its record is the caller's `mine`: no copy of it is made). As with
    /// [`sendrecv_device`](Self::sendrecv_device), the received records may still be moving
    /// when this returns ([`DeviceBytes::wait_ready`]).
    fn allgather_device(
        &self,
        mine: &cudarc::driver::CudaView<'_, u8>,
        stream: &std::sync::Arc<cudarc::driver::CudaStream>,
    ) -> Result<Vec<Option<DeviceBytes>>>;

    /// Uncompressed bytes per piece the device algorithms cut their buffers into (a ring its
    /// segments, an allgather its buffer) when the caller leaves it to the link, so that one
    /// piece's transfer overlaps the work on the next (`usize::MAX`: whole buffers). Every rank
    /// of a group must answer the same. Default: whole buffers (the NCCL collectives take the
    /// model's count instead).
    fn piece_bytes(&self) -> usize {
        usize::MAX
    }

    /// Whether the device algorithms over this link may queue their decompressions and judge
    /// them at their next wait (a piece then costs the host one wait, for its compressed
    /// length, instead of one per kernel). `false` (the default) keeps every codec call
    /// waited for and its time exact, for a link that reports per-stage codec times (the
    /// staged MPI link).
    fn queue_decodes(&self) -> bool {
        false
    }

    /// Give a received message's buffer back once nothing reads it any more (the work reading it
    /// has completed), so later messages reuse it instead of allocating. Default: drop it.
    fn recycle(&self, bytes: DeviceBytes) {
        drop(bytes);
    }
}
