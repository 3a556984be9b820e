//! The NCCL communicator as a [`DeviceTransport`], so that the compressed reductions run the
//! one device-resident ring (`comm::device_ring`, the same algorithm as over the loopback and
//! the staged MPI links) with NCCL moving the compressed bytes GPU to GPU.
//!
//! A message costs small host exchanges on the bootstrap transport and one grouped
//! ncclSend/ncclRecv on the NCCL stream, ordered after the codec stream's work with events. The
//! calls return once the transfer is queued: each received message carries the group's event
//! ([`DeviceBytes::wait_ready`]), so the codec stream goes on compressing the next piece while
//! this one moves.
//!
//! NCCL must post a receive for every send, so a receiver that cannot allocate room for a
//! message must say so before the sender posts it. A ring step (`sendrecv_device`) sends its
//! length forward and gets back its receiver's answer (room found or not: received buffers are
//! recycled, so after the first calls no allocation is made). The allgather shares every
//! rank's length and room (how long a message each can take without allocating) in one round;
//! only when some receiver must allocate does a second round report whether it could. A failed
//! receiver gets an empty message, which the ring carries to every rank as a failure, so no
//! rank is left waiting.

use std::cell::{Cell, RefCell};
use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, CudaView, DevicePtr, DevicePtrMut};
use cudarc::nccl::sys as nsys;

use super::{gpu_err, size_msg, Shared, Wire};
use crate::comm::transport::{DeviceBytes, DeviceTransport, Transport};
use crate::error::{Error, Result};

/// Host tag of the link's size and readiness messages.
const TAG_LINK: i32 = 30001;

const U8: nsys::ncclDataType_t = nsys::ncclDataType_t::ncclUint8;

/// One rank's NCCL device link for the operations of one call (see the [module docs](self)).
pub(super) struct NcclLink<'a> {
    sh: &'a Shared,
    /// Buffers received messages landed in, given back by the ring for reuse.
    pool: RefCell<&'a mut Vec<CudaSlice<u8>>>,
    /// Bytes this rank sent, and per message round the larger and smaller direction.
    wire: Cell<Wire>,
}

impl<'a> NcclLink<'a> {
    pub(super) fn new(sh: &'a Shared, pool: &'a mut Vec<CudaSlice<u8>>) -> Self {
        NcclLink {
            sh,
            pool: RefCell::new(pool),
            wire: Cell::new(Wire::default()),
        }
    }

    /// What this rank sent, and the larger and smaller direction of every round.
    pub(super) fn wire(&self) -> Wire {
        self.wire.get()
    }

    fn tally(&self, sent: usize, major: usize, minor: usize) {
        let mut w = self.wire.get();
        w += Wire {
            sent,
            critical: major,
            minor,
        };
        self.wire.set(w);
    }

    /// The length every one of `count` messages may have and still land in a pooled buffer
    /// (the `count`-th largest buffer's).
    fn room(&self, count: usize) -> usize {
        let caps: Vec<usize> = self.pool.borrow().iter().map(|b| b.len()).collect();
        room_of(&caps, count)
    }

    /// Room for a `len`-byte message: the smallest pooled buffer that fits, else a new one;
    /// `None` for an empty message or when the allocation fails.
    fn take_room(&self, len: usize, stream: &Arc<CudaStream>) -> Option<CudaSlice<u8>> {
        if len == 0 {
            return None;
        }
        let mut pool = self.pool.borrow_mut();
        let caps: Vec<usize> = pool.iter().map(|b| b.len()).collect();
        if let Some(i) = best_fit(&caps, len) {
            return Some(pool.swap_remove(i));
        }
        // round up so that slightly longer messages later still fit
        let cap = len.next_multiple_of(1 << 20);
        // SAFETY: only the first `len` bytes of a message buffer are read, after NCCL wrote them.
        unsafe { stream.alloc::<u8>(cap) }.ok()
    }

    /// `[len, room]` as the 16-byte size message.
    fn size_record(len: usize, room: usize) -> [u8; 16] {
        let mut m = [0u8; 16];
        m[..8].copy_from_slice(&(len as u64).to_le_bytes());
        m[8..].copy_from_slice(&(room.min(u64::MAX as usize) as u64).to_le_bytes());
        m
    }

    fn parse_record(b: &[u8]) -> Result<(usize, usize)> {
        if b.len() != 16 {
            return Err(Error::Comm(format!(
                "NCCL link: {}-byte size message",
                b.len()
            )));
        }
        Ok((size_msg(&b[..8])?, size_msg(&b[8..])?))
    }

    /// Enqueue, in one NCCL group on the NCCL stream, the send of `send` to each of `to` and the
    /// receives `recv` (peer, buffer, length), after the work queued on `stream` so far. Returns
    /// the event that completes with the group (`stream` does not wait for it: the readers of
    /// the received messages do).
    fn transfer(
        &self,
        send: Option<&CudaView<'_, u8>>,
        to: &[usize],
        recv: &mut [(usize, &mut CudaSlice<u8>, usize)],
        stream: &Arc<CudaStream>,
    ) -> Result<Arc<CudaEvent>> {
        let sh = self.sh;
        if let Some((_, buf, len)) = recv.iter().find(|(_, buf, len)| *len > buf.len()) {
            return Err(Error::Comm(format!(
                "NCCL link: a {len}-byte message cannot land in a {}-byte buffer",
                buf.len()
            )));
        }
        let ready = stream.record_event(None).map_err(gpu_err)?;
        sh.net.wait(&ready).map_err(gpu_err)?;
        {
            let mut guards = Vec::new();
            let sptr = match send {
                Some(b) if !b.is_empty() && !to.is_empty() => {
                    let (p, g) = b.device_ptr(&sh.net);
                    guards.push(g);
                    Some((p, b.len()))
                }
                _ => None,
            };
            let mut rptrs = Vec::with_capacity(recv.len());
            for (peer, buf, len) in recv.iter_mut() {
                let (p, g) = buf.device_ptr_mut(&sh.net);
                guards.push(g);
                rptrs.push((*peer, p, *len));
            }
            sh.group(|| {
                // SAFETY: every buffer holds at least the bytes named (receives: checked above)
                // and stays borrowed until the guards record on the NCCL stream after the group
                // has been enqueued.
                unsafe {
                    if let Some((p, n)) = sptr {
                        for &j in to {
                            sh.send_raw(p, n, U8, j)?;
                        }
                    }
                    for &(j, p, n) in &rptrs {
                        sh.recv_raw(p, n, U8, j)?;
                    }
                }
                Ok(())
            })?;
            drop(guards);
        }
        let done = sh.net.record_event(None).map_err(gpu_err)?;
        Ok(Arc::new(done))
    }

    /// An empty message (a failed receive): the ring treats it as the peer's failure. Its
    /// reader also waits for the group `done` (this rank's own send in it may still be reading
    /// the sender's buffer).
    fn empty(&self, stream: &Arc<CudaStream>, done: &Arc<CudaEvent>) -> Result<DeviceBytes> {
        let buf = match self.pool.borrow_mut().pop() {
            Some(b) => b,
            None => stream.alloc_zeros::<u8>(1).map_err(gpu_err)?,
        };
        DeviceBytes::arriving(buf, 0, done.clone())
    }

    fn host_transport(&self) -> &dyn Transport {
        &*self.sh.boot
    }
}

/// The length every one of `count` messages may have and still land in one of the buffers of
/// capacities `caps` (the `count`-th largest capacity; any length for no message).
fn room_of(caps: &[usize], count: usize) -> usize {
    let mut caps = caps.to_vec();
    caps.sort_unstable_by(|a, b| b.cmp(a));
    match count {
        0 => usize::MAX,
        c => caps.get(c - 1).copied().unwrap_or(0),
    }
}

/// The buffer (index into `caps`) a `len`-byte message lands in: the smallest that holds it.
fn best_fit(caps: &[usize], len: usize) -> Option<usize> {
    (0..caps.len())
        .filter(|&i| caps[i] >= len)
        .min_by_key(|&i| caps[i])
}

/// Whether some receiver of an allgather must allocate, from every rank's `(length, room)`: when
/// another rank's message is longer than its room. Every rank computes it from the same records,
/// so all agree on whether the readiness round follows.
fn someone_allocates(recs: &[(usize, usize)]) -> bool {
    (0..recs.len()).any(|j| {
        recs.iter()
            .enumerate()
            .any(|(k, &(len, _))| k != j && len > recs[j].1)
    })
}

impl DeviceTransport for NcclLink<'_> {
    fn host(&self) -> &dyn Transport {
        self.host_transport()
    }

    fn queue_decodes(&self) -> bool {
        true
    }

    // the transfer queued on the NCCL stream (see the module docs)
    fn sendrecv_device(
        &self,
        dest: usize,
        bytes: &CudaView<'_, u8>,
        src: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<DeviceBytes> {
        let host = self.host_transport();
        let slen = bytes.len();
        let got = host.sendrecv(dest, &(slen as u64).to_le_bytes(), src, TAG_LINK)?;
        let rlen = size_msg(&got)?;
        let mut room = self.take_room(rlen, stream);
        // the receiver of this rank's message is `dest`, whose room only `dest` knows: every
        // receiver answers its sender (the reverse direction of the ring) before NCCL moves
        let ready = rlen == 0 || room.is_some();
        let answer = host.sendrecv(src, &[u8::from(ready)], dest, TAG_LINK)?;
        let send_ok = answer.first() == Some(&1);
        let send = send_ok.then_some(bytes);
        let to = if send_ok && slen > 0 {
            vec![dest]
        } else {
            vec![]
        };
        let done = match room.as_mut() {
            Some(buf) => self.transfer(send, &to, &mut [(src, buf, rlen)], stream)?,
            None => self.transfer(send, &to, &mut [], stream)?,
        };
        self.tally(
            if send_ok { slen } else { 0 },
            slen.max(rlen),
            slen.min(rlen),
        );
        match room {
            Some(buf) => DeviceBytes::arriving(buf, rlen, done.clone()),
            None if rlen == 0 => self.empty(stream, &done),
            None => {
                tracing::warn!(target: "zcomm::nccl", "no device memory for a {rlen}-byte ring message");
                self.empty(stream, &done)
            }
        }
    }

    fn allgather_device(
        &self,
        mine: &CudaView<'_, u8>,
        stream: &Arc<CudaStream>,
    ) -> Result<Vec<Option<DeviceBytes>>> {
        let host = self.host_transport();
        let (r, p) = (host.rank(), host.size());
        let all = host.allgather_fixed(&Self::size_record(mine.len(), self.room(p - 1)))?;
        if all.len() != 16 * p {
            return Err(Error::Comm(format!(
                "NCCL link: {} bytes of sizes from {p} ranks",
                all.len()
            )));
        }
        let recs = all
            .chunks_exact(16)
            .map(Self::parse_record)
            .collect::<Result<Vec<_>>>()?;
        let lens: Vec<usize> = recs.iter().map(|x| x.0).collect();
        let mut rooms: Vec<Option<CudaSlice<u8>>> = Vec::with_capacity(p);
        let mut failed = false;
        for (k, &len) in lens.iter().enumerate() {
            let room = (k != r).then(|| self.take_room(len, stream)).flatten();
            failed |= k != r && len > 0 && room.is_none();
            rooms.push(room);
        }
        // receivers that allocated tell everyone whether they could
        let ok: Vec<bool> = if someone_allocates(&recs) {
            host.allgather_fixed(&[u8::from(!failed)])?
                .iter()
                .map(|&b| b != 0)
                .collect()
        } else {
            vec![true; p]
        };
        if ok.len() != p {
            return Err(Error::Comm(
                "NCCL link: readiness from too few ranks".into(),
            ));
        }
        let to: Vec<usize> = (0..p).filter(|&j| j != r && ok[j]).collect();
        let mut recv: Vec<(usize, &mut CudaSlice<u8>, usize)> = Vec::new();
        if ok[r] {
            for (k, room) in rooms.iter_mut().enumerate() {
                if let Some(buf) = room.as_mut().filter(|_| lens[k] > 0) {
                    recv.push((k, buf, lens[k]));
                }
            }
        }
        let send = (!mine.is_empty()).then_some(mine);
        let done = self.transfer(send, &to, &mut recv, stream)?;
        let peers = p.saturating_sub(1);
        let (hi, lo) = (
            lens.iter().copied().max().unwrap_or(0),
            lens.iter().copied().min().unwrap_or(0),
        );
        self.tally(mine.len() * to.len(), hi * peers, lo * peers);
        rooms
            .into_iter()
            .enumerate()
            .map(|(k, room)| {
                if k == r {
                    return Ok(None);
                }
                Some(match room.filter(|_| ok[r]) {
                    Some(buf) => DeviceBytes::arriving(buf, lens[k], done.clone()),
                    None => self.empty(stream, &done),
                })
                .transpose()
            })
            .collect()
    }

    fn recycle(&self, bytes: DeviceBytes) {
        self.pool.borrow_mut().push(bytes.into_buffer());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn room_is_the_count_th_largest_buffer() {
        assert_eq!(room_of(&[4, 10, 7], 1), 10);
        assert_eq!(room_of(&[4, 10, 7], 2), 7);
        assert_eq!(room_of(&[4, 10, 7], 3), 4);
        assert_eq!(room_of(&[4, 10, 7], 4), 0);
        assert_eq!(room_of(&[], 0), usize::MAX);
        assert_eq!(best_fit(&[4, 10, 7], 5), Some(2));
        assert_eq!(best_fit(&[4, 10, 7], 11), None);
        // each message fits the other rank's room exactly
        assert!(!someone_allocates(&[(5, 9), (9, 5)]));
        assert!(someone_allocates(&[(5, 9), (10, 5)]));
        assert!(!someone_allocates(&[(5, 9), (9, 5), (0, 9)]));
    }

    proptest! {
        /// When no rank must allocate by the shared records, every receiver finds a pooled
        /// buffer for each of its messages (taking the smallest that fits, one per message), so
        /// no rank allocates without the others knowing.
        #[test]
        fn no_announced_allocation_means_none_happens(
            pools in proptest::collection::vec(proptest::collection::vec(0usize..64, 0..6), 2..6),
            lens in proptest::collection::vec(0usize..64, 6),
        ) {
            let p = pools.len();
            let lens = &lens[..p];
            let recs: Vec<(usize, usize)> =
                (0..p).map(|j| (lens[j], room_of(&pools[j], p - 1))).collect();
            if !someone_allocates(&recs) {
                for (r, pool) in pools.iter().enumerate() {
                    let mut caps = pool.clone();
                    for (k, &len) in lens.iter().enumerate() {
                        if k == r || len == 0 {
                            continue;
                        }
                        let i = best_fit(&caps, len);
                        prop_assert!(i.is_some(), "rank {r} has no buffer for {len} bytes");
                        caps.swap_remove(i.unwrap());
                    }
                }
            }
        }
    }
}
