//! Test hooks: fault injection for the test suite, compiled in only with the `test-hooks` cargo
//! feature (off by default: a production `libzcomm_mpi.so` contains none of it).
//!
//! `ZCOMM_TEST_CORRUPT=RANK:K` makes world rank `RANK` flip one bit in the middle of the `K`-th
//! (from 1) message of at least [`MIN_PAYLOAD`] bytes that it hands to MPI for zcomm (a
//! compressed payload: the host ring's blocks, a point-to-point stream, a gathered or broadcast
//! record), after compression, as a damaged link would. The receiver must detect it (the
//! streams' checksums) and the job must end with an error, never with wrong data:
//! `mpi-tests/pmpi/run.sh` checks this with a library built with
//! `cargo build --release -p zcomm-mpi --features test-hooks`.
//!
//! In a build without the feature, setting `ZCOMM_TEST_CORRUPT` is an invalid setting (the job
//! ends with a message saying so) rather than being silently ignored.

/// Where to inject a corruption (`ZCOMM_TEST_CORRUPT=RANK:K`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Corrupt {
    /// World rank that corrupts one of its outgoing messages.
    pub rank: usize,
    /// Which of its payload messages (1 = the first).
    pub nth: u64,
}

/// Smallest message considered a payload (control messages, descriptors and verdicts are
/// smaller).
pub const MIN_PAYLOAD: usize = 1024;

impl Corrupt {
    /// Parse `RANK:K` (`K` >= 1). Without the `test-hooks` feature every value is an error.
    pub fn parse(v: &str) -> Result<Self, String> {
        if !cfg!(feature = "test-hooks") {
            return Err(
                "a test hook, honoured only by a library built with `--features test-hooks`; unset it"
                    .into(),
            );
        }
        let bad =
            || "expected RANK:K (K >= 1: corrupt that rank's K-th payload message)".to_string();
        let (r, k) = v.trim().split_once(':').ok_or_else(bad)?;
        let rank = r.trim().parse::<usize>().map_err(|_| bad())?;
        let nth = k.trim().parse::<u64>().map_err(|_| bad())?;
        if nth == 0 {
            return Err(bad());
        }
        Ok(Corrupt { rank, nth })
    }
}

#[cfg(feature = "test-hooks")]
pub use imp::CorruptTransport;

#[cfg(feature = "test-hooks")]
mod imp {
    use std::sync::atomic::{AtomicU64, Ordering};

    use zcomm::comm::transport::{OwnedBytes, PendingBuf};
    use zcomm::comm::{MpiTransport, PendingBytes, ReduceOp, SendHandle, Transport};
    use zcomm::Result;

    use super::{Corrupt, MIN_PAYLOAD};

    /// Payload messages this process has sent so far (over all communicators).
    static SENT: AtomicU64 = AtomicU64::new(0);

    /// [`MpiTransport`] that damages one outgoing payload message (see the module docs).
    pub struct CorruptTransport {
        inner: MpiTransport,
        armed: bool,
        nth: u64,
        wrank: usize,
    }

    impl CorruptTransport {
        /// Wrap `inner`; `wrank` is this process's world rank.
        pub fn new(inner: MpiTransport, c: Corrupt, wrank: usize) -> Self {
            CorruptTransport {
                inner,
                armed: c.rank == wrank,
                nth: c.nth,
                wrank,
            }
        }

        /// `bytes`, damaged when this is the chosen message.
        fn maybe<'a>(&self, bytes: &'a [u8], dest: &str) -> std::borrow::Cow<'a, [u8]> {
            if !self.armed || bytes.len() < MIN_PAYLOAD {
                return bytes.into();
            }
            let k = SENT.fetch_add(1, Ordering::Relaxed) + 1;
            if k != self.nth {
                return bytes.into();
            }
            let mut v = bytes.to_vec();
            let i = v.len() / 2;
            v[i] ^= 0x10;
            crate::state::say!(
                "zcomm-mpi: rank {}: TEST HOOK ZCOMM_TEST_CORRUPT: flipped one bit (byte {i} of {}) of outgoing payload message #{k} ({dest})",
                self.wrank,
                v.len()
            );
            v.into()
        }
    }

    impl Transport for CorruptTransport {
        fn rank(&self) -> usize {
            self.inner.rank()
        }
        fn size(&self) -> usize {
            self.inner.size()
        }
        fn send(&self, dest: usize, tag: i32, bytes: &[u8]) -> Result<()> {
            let b = self.maybe(bytes, &format!("send to rank {dest}"));
            self.inner.send(dest, tag, &b)
        }
        fn recv(&self, src: usize, tag: i32) -> Result<Vec<u8>> {
            self.inner.recv(src, tag)
        }
        fn recv_into(&self, src: usize, tag: i32, buf: &mut [u8]) -> Result<Option<Vec<u8>>> {
            self.inner.recv_into(src, tag, buf)
        }
        fn sendrecv(&self, dest: usize, bytes: &[u8], src: usize, tag: i32) -> Result<Vec<u8>> {
            let b = self.maybe(bytes, &format!("sendrecv to rank {dest}"));
            self.inner.sendrecv(dest, &b, src, tag)
        }
        fn sendrecv_sized(
            &self,
            dest: usize,
            bytes: &[u8],
            src: usize,
            recv: &mut [u8],
            tag: i32,
        ) -> Result<()> {
            let b = self.maybe(bytes, &format!("sendrecv to rank {dest}"));
            self.inner.sendrecv_sized(dest, &b, src, recv, tag)
        }
        fn isend(&self, dest: usize, tag: i32, bytes: Vec<u8>) -> Result<Box<dyn SendHandle>> {
            let b = self
                .maybe(&bytes, &format!("isend to rank {dest}"))
                .into_owned();
            self.inner.isend(dest, tag, b)
        }
        fn irecv(&self, src: usize, tag: i32) -> Result<Box<dyn PendingBytes>> {
            self.inner.irecv(src, tag)
        }
        fn iprobe(&self, src: usize, tag: i32) -> Result<bool> {
            self.inner.iprobe(src, tag)
        }
        fn allgather_fixed(&self, mine: &[u8]) -> Result<Vec<u8>> {
            self.inner.allgather_fixed(mine)
        }
        fn allgatherv(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
            let b = self.maybe(mine, "allgather record");
            self.inner.allgatherv(&b)
        }
        fn iallgatherv(&self, mine: Vec<u8>, lens: &[usize]) -> Result<Box<dyn PendingBytes>> {
            let b = self.maybe(&mine, "allgather record").into_owned();
            self.inner.iallgatherv(b, lens)
        }
        fn ibcast(&self, root: usize, bytes: Vec<u8>, len: usize) -> Result<Box<dyn PendingBytes>> {
            let b = if root == self.rank() {
                self.maybe(&bytes, "bcast").into_owned()
            } else {
                bytes
            };
            self.inner.ibcast(root, b, len)
        }
        fn bcast(&self, root: usize, bytes: &mut Vec<u8>) -> Result<()> {
            if root == self.rank() {
                // the root keeps its own bytes; the others get the damaged copy
                let mut b = self.maybe(bytes, "bcast").into_owned();
                return self.inner.bcast(root, &mut b);
            }
            self.inner.bcast(root, bytes)
        }
        fn allgatherv_into(&self, mine: &[u8], lens: &[usize], out: &mut [u8]) -> Result<()> {
            let b = self.maybe(mine, "allgather record");
            self.inner.allgatherv_into(&b, lens, out)
        }
        fn bcast_into(&self, root: usize, buf: &mut [u8]) -> Result<()> {
            self.inner.bcast_into(root, buf)
        }
        fn ibcast_into(
            &self,
            root: usize,
            buf: Box<dyn OwnedBytes>,
            len: usize,
        ) -> Result<Box<dyn PendingBuf>> {
            self.inner.ibcast_into(root, buf, len)
        }
        fn iallgatherv_into(
            &self,
            mine: Box<dyn OwnedBytes>,
            lens: &[usize],
            out: Box<dyn OwnedBytes>,
        ) -> Result<Box<dyn PendingBuf>> {
            self.inner.iallgatherv_into(mine, lens, out)
        }
        fn allreduce_f64(&self, vals: &mut [f64], op: ReduceOp) -> Result<()> {
            self.inner.allreduce_f64(vals, op)
        }
        fn allreduce_sum_f32(&self, input: &[f32], out: &mut [f32]) -> Result<()> {
            self.inner.allreduce_sum_f32(input, out)
        }
        fn allreduce_sum_f64(&self, input: &[f64], out: &mut [f64]) -> Result<()> {
            self.inner.allreduce_sum_f64(input, out)
        }
        fn barrier(&self) -> Result<()> {
            self.inner.barrier()
        }
        fn wtime(&self) -> f64 {
            self.inner.wtime()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse() {
        if cfg!(feature = "test-hooks") {
            assert_eq!(Corrupt::parse("1:2"), Ok(Corrupt { rank: 1, nth: 2 }));
            assert!(Corrupt::parse("1:0").is_err());
            assert!(Corrupt::parse("1").is_err());
        } else {
            assert!(Corrupt::parse("1:2").unwrap_err().contains("test-hooks"));
        }
    }
}
