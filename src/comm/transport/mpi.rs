//! [`Transport`] over an MPI communicator (the `mpi` crate).

use super::*;
use ::mpi::datatype::PartitionMut;
use ::mpi::point_to_point::MatchedReceiveVec;
use ::mpi::request::{Request, StaticScope};
use ::mpi::topology::SimpleCommunicator;
use ::mpi::traits::*;
use ::mpi::Count;

/// Start of each record when records of `lens` bytes are laid out back to back.
fn exclusive_offsets(lens: &[usize]) -> Vec<usize> {
    lens.iter()
        .scan(0, |acc, &x| {
            let d = *acc;
            *acc += x;
            Some(d)
        })
        .collect()
}

/// MPI counts and displacements of records of `lens` bytes (callers check the total fits).
fn counts_displs(lens: &[usize]) -> (Vec<Count>, Vec<Count>) {
    let counts = lens.iter().map(|&l| l as Count).collect();
    let displs = exclusive_offsets(lens)
        .into_iter()
        .map(|d| d as Count)
        .collect();
    (counts, displs)
}

/// Largest single MPI message (bytes); longer messages are split into pieces of this size
/// followed by a shorter (possibly empty) final piece, so MPI's `int` counts never overflow.
pub(crate) const PIECE: usize = 1 << 30;

/// Test knob: `ZCOMM_MPI_PIECE=<bytes>` makes every [`MpiTransport`] cut messages into pieces
/// of that size and treat collectives larger than it as "too large for MPI's int counts", so
/// the multi-piece and fallback paths can be exercised with small messages (mpi-tests).
fn piece_limits() -> (usize, usize) {
    match std::env::var("ZCOMM_MPI_PIECE")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
    {
        Some(k) if k > 0 => (k.min(PIECE), k.min(i32::MAX as usize)),
        _ => (PIECE, i32::MAX as usize),
    }
}

/// The pieces a message of `len` bytes is cut into: `len / piece` full pieces followed by one
/// shorter (possibly empty) piece; the receiver stops at the first piece shorter than `piece`.
pub(crate) fn piece_ranges(len: usize, piece: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..len / piece + 1).map(move |k| (k * piece, ((k + 1) * piece).min(len)))
}

/// A real (non-dangling) address for empty MPI buffers: an empty slice's dangling pointer can
/// equal Open MPI's `MPI_IN_PLACE` (`(void*)1`).
static ANCHOR: [u8; 1] = [0];

/// [`Transport`] over an MPI communicator (a private duplicate of the one it was built from,
/// so zcomm's messages never match the application's).
pub struct MpiTransport {
    comm: SimpleCommunicator,
    rank: usize,
    size: usize,
    /// Largest single point-to-point / broadcast piece (bytes), [`PIECE`] by default.
    piece: usize,
    /// Largest total byte count handed to one variable-count collective (`i32::MAX`).
    max_count: usize,
}

impl std::fmt::Debug for MpiTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MpiTransport(rank {} of {})", self.rank, self.size)
    }
}

impl MpiTransport {
    /// Build on a duplicate of `comm`.
    pub fn new(comm: &SimpleCommunicator) -> Self {
        let comm = comm.duplicate();
        let rank = comm.rank() as usize;
        let size = comm.size() as usize;
        let (piece, max_count) = piece_limits();
        MpiTransport {
            comm,
            rank,
            size,
            piece,
            max_count,
        }
    }

    /// As [`new`](Self::new) with explicit limits (tests): messages are cut into pieces of
    /// `piece` bytes and variable-count collectives over `max_count` total bytes take the
    /// pairwise fallback.
    pub fn with_limits(comm: &SimpleCommunicator, piece: usize, max_count: usize) -> Self {
        let mut t = Self::new(comm);
        t.piece = piece.clamp(1, PIECE);
        t.max_count = max_count.clamp(1, i32::MAX as usize);
        t
    }

    /// The underlying (duplicated) MPI communicator.
    pub fn raw(&self) -> &SimpleCommunicator {
        &self.comm
    }

    fn check_rank(&self, r: usize) -> Result<()> {
        check_rank(r, self.size)
    }

    /// `MPI_Allreduce` (sum) of `input` into `out`, in pieces of at most `piece` bytes, which
    /// keep MPI's int count in range.
    fn allreduce_sum_pieces<T: Equivalence>(&self, input: &[T], out: &mut [T]) -> Result<()> {
        use ::mpi::collective::SystemOperation;
        if input.len() != out.len() {
            return Err(Error::invalid("allreduce: input and output lengths differ"));
        }
        let c = (self.piece / std::mem::size_of::<T>()).max(1);
        for (i, o) in input.chunks(c).zip(out.chunks_mut(c)) {
            self.comm.all_reduce_into(i, o, SystemOperation::sum());
        }
        Ok(())
    }

    fn recv_piece(&self, src: usize, tag: i32) -> Vec<u8> {
        let (msg, status) = self
            .comm
            .process_at_rank(src as i32)
            .matched_probe_with_tag(tag);
        let mut v = super::pool::zeroed(status.count(u8::equivalent_datatype()) as usize);
        msg.matched_receive_into(&mut v[..]);
        v
    }
}

/// In-flight send: one request per piece (a message longer than the piece size is posted as
/// several `MPI_Isend`s on the same tag, which MPI matches in order), on a leaked buffer.
struct MpiSend {
    reqs: Vec<Request<'static, [u8], StaticScope>>,
    buf: *mut [u8],
}

impl MpiSend {
    fn finish(&mut self) {
        for r in self.reqs.drain(..) {
            r.wait_without_status();
        }
        if !self.buf.is_null() {
            // SAFETY: `buf` came from `Box::into_raw` in `isend` and the request that borrowed
            // it has completed (waited above), so nobody else references the allocation.
            super::pool::give(unsafe { Box::from_raw(self.buf) }.into_vec());
            self.buf = std::ptr::slice_from_raw_parts_mut(std::ptr::null_mut(), 0);
        }
    }
}

/// Test every request once, keep the pending ones; true when none is left.
fn drain_completed<D: ?Sized>(reqs: &mut Vec<Request<'static, D, StaticScope>>) -> bool {
    let mut pending = Vec::with_capacity(reqs.len());
    for r in reqs.drain(..) {
        if let Err(r) = r.test() {
            pending.push(r);
        }
    }
    *reqs = pending;
    reqs.is_empty()
}

impl SendHandle for MpiSend {
    fn wait(mut self: Box<Self>) -> Result<()> {
        self.finish();
        Ok(())
    }
    fn test(&mut self) -> Result<bool> {
        let done = drain_completed(&mut self.reqs);
        if done {
            self.finish();
        }
        Ok(done)
    }
}

impl Drop for MpiSend {
    fn drop(&mut self) {
        self.finish();
    }
}

fn i32_tag(tag: i32) -> Result<i32> {
    if !(0..=32767).contains(&tag) {
        return Err(Error::invalid(format!("tag {tag} outside 0..=32767")));
    }
    Ok(tag)
}

type Part = PartitionMut<'static, [u8], Vec<Count>, Vec<Count>>;

/// In-flight `MPI_Iallgatherv`: owns (leaked, then reclaimed) send, receive and partition.
struct MpiGather {
    req: Option<Request<'static, Part, StaticScope>>,
    part: *mut Part,
    recv: *mut [u8],
    send: *mut [u8],
    lens: Vec<usize>,
    result: Option<Vec<Vec<u8>>>,
    freed: bool,
}

impl MpiGather {
    /// Wait (if still pending) and reclaim the buffers into `result`.
    fn finish(&mut self) {
        if self.freed {
            return;
        }
        if let Some(r) = self.req.take() {
            r.wait_without_status();
        }
        self.reclaim();
    }
    /// The request has completed: free the leaked buffers, keep the records.
    fn reclaim(&mut self) {
        if self.freed {
            return;
        }
        self.freed = true;
        // SAFETY: all three came from Box::leak in `iallgatherv`; the request that borrowed
        // them has completed (waited or tested), and the partition (which borrows `recv`)
        // is dropped first; `freed` makes this run once.
        unsafe {
            drop(Box::from_raw(self.part));
            drop(Box::from_raw(self.send));
            let recv = Box::from_raw(self.recv);
            let mut out = Vec::with_capacity(self.lens.len());
            let mut off = 0;
            for &l in &self.lens {
                out.push(recv[off..off + l].to_vec());
                off += l;
            }
            self.result = Some(out);
        }
    }
}

impl PendingBytes for MpiGather {
    fn wait(mut self: Box<Self>) -> Result<Vec<Vec<u8>>> {
        self.finish();
        Ok(self.result.take().unwrap_or_default())
    }
    fn test(&mut self) -> Result<bool> {
        if self.freed {
            return Ok(true);
        }
        match self.req.take() {
            None => Ok(true),
            Some(r) => match r.test() {
                Ok(_) => {
                    self.reclaim();
                    Ok(true)
                }
                Err(r) => {
                    self.req = Some(r);
                    Ok(false)
                }
            },
        }
    }
}

impl Drop for MpiGather {
    fn drop(&mut self) {
        self.finish();
    }
}

/// In-flight `MPI_Ibcast` (or `MPI_Imrecv` of [`Transport::irecv`]) on a leaked buffer.
struct MpiBcast {
    req: Option<Request<'static, [u8], StaticScope>>,
    buf: *mut [u8],
    done: bool,
}

impl MpiBcast {
    fn finish(&mut self) -> Option<Vec<u8>> {
        if self.done {
            return None;
        }
        if let Some(r) = self.req.take() {
            r.wait_without_status();
        }
        self.done = true;
        // SAFETY: from Box::leak in `ibcast`; the request using it has completed.
        Some(unsafe { Box::from_raw(self.buf) }.into_vec())
    }
}

impl PendingBytes for MpiBcast {
    fn wait(mut self: Box<Self>) -> Result<Vec<Vec<u8>>> {
        Ok(vec![self.finish().unwrap_or_default()])
    }
    fn test(&mut self) -> Result<bool> {
        match self.req.take() {
            None => Ok(true),
            Some(r) => match r.test() {
                Ok(_) => Ok(true),
                Err(r) => {
                    self.req = Some(r);
                    Ok(false)
                }
            },
        }
    }
}

impl Drop for MpiBcast {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}

/// In-flight non-blocking collective(s) on owned buffers ([`Transport::ibcast_into`]: one
/// `MPI_Ibcast` per piece; [`Transport::iallgatherv_into`]: one `MPI_Iallgatherv` on a
/// leaked partition). The requests borrow the buffers' memory: they are waited for (in
/// `finish`, also on drop) before the buffers are handed back or dropped.
struct MpiOwned<D: ?Sized + 'static> {
    reqs: Vec<Request<'static, D, StaticScope>>,
    bufs: Vec<Box<dyn OwnedBytes>>,
    /// Frees what the requests borrowed besides `bufs` (the leaked partition), after them.
    cleanup: Option<Box<dyn FnOnce()>>,
}

impl<D: ?Sized + 'static> MpiOwned<D> {
    fn finish(&mut self) {
        for r in self.reqs.drain(..) {
            r.wait_without_status();
        }
        if let Some(f) = self.cleanup.take() {
            f();
        }
    }
}

impl<D: ?Sized + 'static> PendingBuf for MpiOwned<D> {
    fn wait(mut self: Box<Self>) -> Result<Vec<Box<dyn OwnedBytes>>> {
        self.finish();
        Ok(std::mem::take(&mut self.bufs))
    }
    fn test(&mut self) -> Result<bool> {
        let done = drain_completed(&mut self.reqs);
        if done {
            self.finish();
        }
        Ok(done)
    }
}

impl<D: ?Sized + 'static> Drop for MpiOwned<D> {
    fn drop(&mut self) {
        // the buffers (fields) are dropped after this: never while MPI may use them
        self.finish();
    }
}

impl Transport for MpiTransport {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn send(&self, dest: usize, tag: i32, bytes: &[u8]) -> Result<()> {
        self.check_rank(dest)?;
        let tag = i32_tag(tag)?;
        let p = self.comm.process_at_rank(dest as i32);
        for (a, b) in piece_ranges(bytes.len(), self.piece) {
            let sp = if a == b { &ANCHOR[..0] } else { &bytes[a..b] };
            p.send_with_tag(sp, tag);
        }
        Ok(())
    }
    fn recv_into(&self, src: usize, tag: i32, buf: &mut [u8]) -> Result<Option<Vec<u8>>> {
        self.check_rank(src)?;
        let tag = i32_tag(tag)?;
        let p = self.comm.process_at_rank(src as i32);
        let mut off = 0usize;
        loop {
            let (msg, status) = p.matched_probe_with_tag(tag);
            let n = status.count(u8::equivalent_datatype()) as usize;
            let full = self.piece;
            if off + n > buf.len() || (n < full && off + n != buf.len()) {
                // Length differs from the buffer: collect into a vector instead.
                let mut v = buf[..off].to_vec();
                let (piece, _): (Vec<u8>, _) = (msg, status).matched_receive_vec();
                v.extend_from_slice(&piece);
                if n == full {
                    v.extend_from_slice(&self.recv(src, tag)?);
                }
                return Ok(Some(v));
            }
            msg.matched_receive_into(&mut buf[off..off + n]);
            off += n;
            if n < full {
                return Ok(None);
            }
        }
    }
    fn recv(&self, src: usize, tag: i32) -> Result<Vec<u8>> {
        self.check_rank(src)?;
        let tag = i32_tag(tag)?;
        let mut out = self.recv_piece(src, tag);
        if out.len() < self.piece {
            return Ok(out);
        }
        loop {
            let piece = self.recv_piece(src, tag);
            let last = piece.len() < self.piece;
            out.extend_from_slice(&piece);
            if last {
                return Ok(out);
            }
        }
    }
    fn sendrecv(&self, dest: usize, bytes: &[u8], src: usize, tag: i32) -> Result<Vec<u8>> {
        self.check_rank(dest)?;
        self.check_rank(src)?;
        let h = self.isend(dest, tag, bytes.to_vec())?;
        let out = self.recv(src, tag)?;
        h.wait()?;
        Ok(out)
    }
    fn sendrecv_sized(
        &self,
        dest: usize,
        bytes: &[u8],
        src: usize,
        recv: &mut [u8],
        tag: i32,
    ) -> Result<()> {
        self.check_rank(dest)?;
        self.check_rank(src)?;
        let tag = i32_tag(tag)?;
        let d = self.comm.process_at_rank(dest as i32);
        let s = self.comm.process_at_rank(src as i32);
        // Both sides cut their message into the same piece sequence as `send`: full pieces,
        // then one short (possibly empty) piece.
        let piece = self.piece;
        let pieces = |n: usize| n / piece + 1;
        let (ns, nr) = (pieces(bytes.len()), pieces(recv.len()));
        let anchor = [0u8; 1];
        let mut anchor_r = [0u8; 1];
        for k in 0..ns.max(nr) {
            let sp = if k < ns {
                &bytes[k * piece..((k + 1) * piece).min(bytes.len())]
            } else {
                &anchor[..0]
            };
            let rlen = recv.len();
            let rp: &mut [u8] = if k < nr {
                &mut recv[k * piece..((k + 1) * piece).min(rlen)]
            } else {
                &mut anchor_r[..0]
            };
            let sp = if sp.is_empty() { &anchor[..0] } else { sp };
            match (k < ns, k < nr) {
                (true, true) => {
                    ::mpi::point_to_point::send_receive_into_with_tags(sp, &d, tag, rp, &s, tag);
                }
                (true, false) => d.send_with_tag(sp, tag),
                (false, true) => {
                    s.receive_into_with_tag(rp, tag);
                }
                (false, false) => {}
            }
        }
        Ok(())
    }
    fn isend(&self, dest: usize, tag: i32, bytes: Vec<u8>) -> Result<Box<dyn SendHandle>> {
        self.check_rank(dest)?;
        let tag = i32_tag(tag)?;
        // Every piece is posted non-blocking (a blocking send of a large piece here would
        // deadlock two ranks that isend to each other before receiving, as `sendrecv` does).
        let raw: *mut [u8] = Box::into_raw(bytes.into_boxed_slice());
        // SAFETY: the allocation stays alive (and unaliased by safe code) until `MpiSend`
        // waits for the requests and frees it; MpiSend's Drop always waits first.
        let slice: &'static [u8] = unsafe { &*raw };
        let p = self.comm.process_at_rank(dest as i32);
        let reqs = piece_ranges(slice.len(), self.piece)
            .map(|(a, b)| {
                let sp: &'static [u8] = if a == b { &ANCHOR[..0] } else { &slice[a..b] };
                p.immediate_send_with_tag(StaticScope, sp, tag)
            })
            .collect();
        Ok(Box::new(MpiSend { reqs, buf: raw }))
    }
    fn irecv(&self, src: usize, tag: i32) -> Result<Box<dyn PendingBytes>> {
        self.check_rank(src)?;
        let tag = i32_tag(tag)?;
        let (msg, status) = self
            .comm
            .process_at_rank(src as i32)
            .matched_probe_with_tag(tag);
        let n = status.count(u8::equivalent_datatype()) as usize;
        if n >= self.piece {
            // a multi-piece message: receive it blocking (pieces are matched in order)
            let (first, _): (Vec<u8>, _) = (msg, status).matched_receive_vec();
            let mut out = first;
            out.extend_from_slice(&self.recv(src, tag)?);
            return Ok(Box::new(Ready(vec![out])));
        }
        let buf: &'static mut [u8] = Box::leak(vec![0u8; n].into_boxed_slice());
        let ptr: *mut [u8] = buf;
        let req = msg.immediate_matched_receive_into(StaticScope, buf);
        // same ownership shape as a broadcast: a leaked buffer reclaimed after completion
        Ok(Box::new(MpiBcast {
            req: Some(req),
            buf: ptr,
            done: false,
        }))
    }
    fn iprobe(&self, src: usize, tag: i32) -> Result<bool> {
        self.check_rank(src)?;
        Ok(self
            .comm
            .process_at_rank(src as i32)
            .immediate_probe_with_tag(i32_tag(tag)?)
            .is_some())
    }
    fn allgather_fixed(&self, mine: &[u8]) -> Result<Vec<u8>> {
        if mine.is_empty() {
            return Ok(Vec::new());
        }
        let (p, r, n) = (self.size, self.rank, mine.len());
        if n * p > self.max_count {
            // ring of sized pairwise exchanges (every record has this length)
            let mut out = vec![0u8; n * p];
            out[r * n..(r + 1) * n].copy_from_slice(mine);
            for s in 1..p {
                let dest = (r + s) % p;
                let src = (r + p - s) % p;
                self.sendrecv_sized(dest, mine, src, &mut out[src * n..(src + 1) * n], 32001)?;
            }
            return Ok(out);
        }
        let mut out = vec![0u8; mine.len() * self.size];
        self.comm.all_gather_into(mine, &mut out[..]);
        Ok(out)
    }
    fn allgatherv(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let lens = self.allgather_lens(mine.len())?;
        let total: usize = lens.iter().sum();
        if total <= self.max_count {
            let (counts, displs) = counts_displs(lens.as_slice());
            if total == 0 {
                return Ok(vec![Vec::new(); self.size]);
            }
            let mut buf = vec![0u8; total];
            // An empty slice's dangling pointer can equal Open MPI's MPI_IN_PLACE ((void*)1):
            // give MPI a real address instead.
            let anchor = [0u8; 1];
            let send: &[u8] = if mine.is_empty() { &anchor[..0] } else { mine };
            {
                let mut part = PartitionMut::new(&mut buf[..], counts, &displs[..]);
                self.comm.all_gather_varcount_into(send, &mut part);
            }
            let mut out = Vec::with_capacity(self.size);
            let mut off = 0;
            for l in lens {
                out.push(buf[off..off + l].to_vec());
                off += l;
            }
            return Ok(out);
        }
        // Too large for MPI's int displacements: ring of pairwise exchanges of known sizes
        // (`MPI_Sendrecv` per piece: no copy of `mine`, no send that waits for a receive the
        // peer has not posted yet).
        let (p, r) = (self.size, self.rank);
        let mut out = vec![Vec::new(); p];
        out[r] = mine.to_vec();
        for s in 1..p {
            let dest = (r + s) % p;
            let src = (r + p - s) % p;
            let mut v = vec![0u8; lens[src]];
            self.sendrecv_sized(dest, mine, src, &mut v, 32000)?;
            out[src] = v;
        }
        Ok(out)
    }
    fn iallgatherv(&self, mine: Vec<u8>, lens: &[usize]) -> Result<Box<dyn PendingBytes>> {
        if lens.len() != self.size || lens[self.rank] != mine.len() {
            return Err(Error::invalid(
                "iallgatherv: lengths disagree with the records",
            ));
        }
        let total: usize = lens.iter().sum();
        if total == 0 {
            return Ok(Box::new(Ready(vec![Vec::new(); self.size])));
        }
        if total > self.max_count {
            return Ok(Box::new(Ready(self.allgatherv(&mine)?)));
        }
        let (counts, displs) = counts_displs(lens);
        // a non-empty allocation, so an empty record never has Open MPI's MPI_IN_PLACE address
        let n = mine.len();
        let mut sb = mine;
        sb.push(0);
        let send: &'static mut [u8] = Box::leak(sb.into_boxed_slice());
        let send_ptr: *mut [u8] = send;
        let recv: &'static mut [u8] = Box::leak(vec![0u8; total].into_boxed_slice());
        let recv_ptr: *mut [u8] = recv;
        let part: &'static mut Part = Box::leak(Box::new(PartitionMut::new(recv, counts, displs)));
        let part_ptr: *mut Part = part;
        // SAFETY: `send_ptr` stays valid (leaked) until MpiGather reclaims it after the wait.
        let send_view: &'static [u8] = unsafe { &(&*send_ptr)[..n] };
        let req = self
            .comm
            .immediate_all_gather_varcount_into(StaticScope, send_view, part);
        Ok(Box::new(MpiGather {
            req: Some(req),
            part: part_ptr,
            recv: recv_ptr,
            send: send_ptr,
            lens: lens.to_vec(),
            result: None,
            freed: false,
        }))
    }
    fn ibcast(&self, root: usize, bytes: Vec<u8>, len: usize) -> Result<Box<dyn PendingBytes>> {
        self.check_rank(root)?;
        if len == 0 {
            return Ok(Box::new(Ready(vec![Vec::new()])));
        }
        if len > self.max_count {
            let mut b = bytes;
            b.resize(len, 0);
            self.bcast(root, &mut b)?;
            return Ok(Box::new(Ready(vec![b])));
        }
        let mut b = bytes;
        b.resize(len, 0);
        let buf: &'static mut [u8] = Box::leak(b.into_boxed_slice());
        let ptr: *mut [u8] = buf;
        let req = self
            .comm
            .process_at_rank(root as i32)
            .immediate_broadcast_into(StaticScope, buf);
        Ok(Box::new(MpiBcast {
            req: Some(req),
            buf: ptr,
            done: false,
        }))
    }
    fn bcast(&self, root: usize, bytes: &mut Vec<u8>) -> Result<()> {
        self.check_rank(root)?;
        let rootp = self.comm.process_at_rank(root as i32);
        let mut len = bytes.len() as u64;
        rootp.broadcast_into(&mut len);
        if self.rank != root {
            bytes.clear();
            bytes.resize(len as usize, 0);
        }
        for piece in bytes.chunks_mut(self.piece) {
            rootp.broadcast_into(piece);
        }
        Ok(())
    }
    fn allgatherv_into(&self, mine: &[u8], lens: &[usize], out: &mut [u8]) -> Result<()> {
        check_gather_lens(self.rank, self.size, mine, lens, out)?;
        let total = out.len();
        if total == 0 {
            return Ok(());
        }
        let (p, r) = (self.size, self.rank);
        let offs = exclusive_offsets(lens);
        if total <= self.max_count {
            let (counts, displs) = counts_displs(lens);
            // a real address for an empty record (see ANCHOR)
            let send: &[u8] = if mine.is_empty() { &ANCHOR[..0] } else { mine };
            let mut part = PartitionMut::new(out, counts, &displs[..]);
            self.comm.all_gather_varcount_into(send, &mut part);
            return Ok(());
        }
        // Too large for MPI's int displacements: the ring of sized pairwise exchanges of
        // `allgatherv`, straight into `out` (this rank's range is not written)
        for s in 1..p {
            let dest = (r + s) % p;
            let src = (r + p - s) % p;
            let dst = &mut out[offs[src]..offs[src] + lens[src]];
            self.sendrecv_sized(dest, mine, src, dst, 32000)?;
        }
        Ok(())
    }
    fn bcast_into(&self, root: usize, buf: &mut [u8]) -> Result<()> {
        self.check_rank(root)?;
        let rootp = self.comm.process_at_rank(root as i32);
        // every rank knows the length: pieces of at most `piece` bytes, no length message
        for piece in buf.chunks_mut(self.piece) {
            rootp.broadcast_into(piece);
        }
        Ok(())
    }
    fn ibcast_into(
        &self,
        root: usize,
        mut buf: Box<dyn OwnedBytes>,
        len: usize,
    ) -> Result<Box<dyn PendingBuf>> {
        self.check_rank(root)?;
        let ptr = owned_prefix(buf.as_mut(), len, "ibcast_into")?.as_mut_ptr();
        if len == 0 {
            return Ok(Box::new(ReadyBuf(vec![buf])));
        }
        // SAFETY: `ptr..ptr+len` lies in `buf`'s memory, which stays at its address (the
        // `OwnedBytes` contract) and is not touched by safe code until `MpiOwned` has waited
        // for every request (`finish`, also run on drop, before `bufs` is released).
        let all: &'static mut [u8] = unsafe { std::slice::from_raw_parts_mut(ptr, len) };
        let rootp = self.comm.process_at_rank(root as i32);
        // every rank knows `len`: the same pieces of at most `piece` bytes everywhere (as
        // `bcast_into`); outstanding non-blocking collectives match in the order posted
        let reqs = all
            .chunks_mut(self.piece)
            .map(|piece| rootp.immediate_broadcast_into(StaticScope, piece))
            .collect();
        Ok(Box::new(MpiOwned::<[u8]> {
            reqs,
            bufs: vec![buf],
            cleanup: None,
        }))
    }
    fn iallgatherv_into(
        &self,
        mut mine: Box<dyn OwnedBytes>,
        lens: &[usize],
        mut out: Box<dyn OwnedBytes>,
    ) -> Result<Box<dyn PendingBuf>> {
        if lens.len() != self.size {
            return Err(Error::invalid(
                "iallgatherv_into: lengths disagree with the ranks",
            ));
        }
        let (total, ml) = (lens.iter().sum::<usize>(), lens[self.rank]);
        let mptr = owned_prefix(mine.as_mut(), ml, "iallgatherv_into")?.as_mut_ptr();
        let optr = owned_prefix(out.as_mut(), total, "iallgatherv_into")?.as_mut_ptr();
        if total == 0 {
            return Ok(Box::new(ReadyBuf(vec![mine, out])));
        }
        if total > self.max_count {
            // too large for MPI's int displacements: the blocking ring of sized exchanges
            {
                let m = owned_prefix(mine.as_mut(), ml, "iallgatherv_into")?;
                let o = owned_prefix(out.as_mut(), total, "iallgatherv_into")?;
                self.allgatherv_into(m, lens, o)?;
            }
            return Ok(Box::new(ReadyBuf(vec![mine, out])));
        }
        // SAFETY: both ranges lie in the owned buffers' memory, which stays at its address
        // and is not touched by safe code until `MpiOwned` has waited for the request.
        let (send, recv): (&'static [u8], &'static mut [u8]) = unsafe {
            (
                std::slice::from_raw_parts(mptr, ml),
                std::slice::from_raw_parts_mut(optr, total),
            )
        };
        // a real address for an empty record (see ANCHOR)
        let send: &'static [u8] = if send.is_empty() { &ANCHOR[..0] } else { send };
        let (counts, displs) = counts_displs(lens);
        let part: &'static mut Part = Box::leak(Box::new(PartitionMut::new(recv, counts, displs)));
        let part_ptr: *mut Part = part;
        let req = self
            .comm
            .immediate_all_gather_varcount_into(StaticScope, send, part);
        // SAFETY: `part_ptr` came from Box::leak above; the cleanup runs once, after the
        // request that borrowed it has completed.
        let cleanup = move || drop(unsafe { Box::from_raw(part_ptr) });
        Ok(Box::new(MpiOwned::<Part> {
            reqs: vec![req],
            bufs: vec![mine, out],
            cleanup: Some(Box::new(cleanup)),
        }))
    }
    fn allreduce_f64(&self, vals: &mut [f64], op: ReduceOp) -> Result<()> {
        use ::mpi::collective::SystemOperation;
        let inp = vals.to_vec();
        let o = match op {
            ReduceOp::Sum => SystemOperation::sum(),
            ReduceOp::Min => SystemOperation::min(),
            ReduceOp::Max => SystemOperation::max(),
        };
        self.comm.all_reduce_into(&inp[..], vals, o);
        Ok(())
    }
    fn allreduce_sum_f32(&self, input: &[f32], out: &mut [f32]) -> Result<()> {
        self.allreduce_sum_pieces(input, out)
    }
    fn allreduce_sum_f64(&self, input: &[f64], out: &mut [f64]) -> Result<()> {
        self.allreduce_sum_pieces(input, out)
    }
    fn barrier(&self) -> Result<()> {
        self.comm.barrier();
        Ok(())
    }
    fn wtime(&self) -> f64 {
        ::mpi::time()
    }
}
