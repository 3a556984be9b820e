//! An in-process [`Transport`]: the ranks of one group are threads of one process exchanging
//! messages through shared queues.
//!
//! It exists so that every operation of the communication layer can run, and be tested, without
//! an MPI launcher or a second machine: `cargo test` in CI runs the same algorithms that
//! `mpirun` runs, on 1 to N ranks, with the CPU codec. An optional [`LinkEmulation`] delays each
//! message by `latency + bytes / bandwidth` on a per-direction link, so that the speedup model
//! and the pipelines can be exercised against a link of known speed.
//!
//! Semantics follow MPI's where the algorithms rely on them: messages between one pair of ranks
//! with one tag arrive in order; sends complete at once (the message is copied, as an eager MPI
//! send would); collectives must be called by every rank in the same order. Collectives reduce in
//! rank order, so every rank gets bit-identical results. A rank whose transport is dropped is
//! "gone": a receive that can only be satisfied by it fails instead of waiting forever.
//!
//! ```
//! use zcomm::comm::transport::{run_ranks, LoopbackTransport, ReduceOp, Transport};
//! // one thread per rank, as mpirun would start one process per rank
//! let sums = run_ranks(LoopbackTransport::group(3), |t| {
//!     let mut v = [t.rank() as f64];
//!     t.allreduce_f64(&mut v, ReduceOp::Sum).map(|()| v[0])
//! });
//! let sums: Vec<f64> = sums.into_iter().map(|r| r.unwrap().unwrap()).collect();
//! assert_eq!(sums, vec![3.0; 3]);
//! ```

use super::{ReduceOp, SendHandle, Transport};
use crate::element::Element;
use crate::error::{Error, Result};
use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The speed of the emulated link between every ordered pair of ranks.
///
/// Each direction of each pair is one link: messages on it are serialised (a message starts when
/// the previous one has left), take `bytes / bandwidth` seconds to leave and arrive `latency`
/// seconds after that. The default is an unthrottled link (messages are visible at once).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
#[non_exhaustive]
pub struct LinkEmulation {
    /// Bytes per second of one direction of one link; `None`: unlimited.
    pub bandwidth: Option<f64>,
    /// Seconds from a message's departure to its arrival.
    pub latency: f64,
}

impl LinkEmulation {
    /// A link of `bandwidth` bytes per second and `latency` seconds.
    pub fn new(bandwidth: f64, latency: f64) -> Result<Self> {
        if !(bandwidth.is_finite() && bandwidth > 0.0) {
            return Err(Error::invalid(format!(
                "loopback link bandwidth must be positive and finite, got {bandwidth}"
            )));
        }
        if !(latency.is_finite() && latency >= 0.0) {
            return Err(Error::invalid(format!(
                "loopback link latency must be non-negative and finite, got {latency}"
            )));
        }
        Ok(LinkEmulation {
            bandwidth: Some(bandwidth),
            latency,
        })
    }

    /// Seconds a message of `bytes` occupies the link.
    fn occupancy(&self, bytes: usize) -> f64 {
        self.bandwidth.map_or(0.0, |bw| bytes as f64 / bw)
    }
}

/// Which stream of messages between two ranks a message belongs to. Collectives get their own
/// channel per call so they can never match a user's point-to-point message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Channel {
    P2p(i32),
    Collective(u64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Route {
    /// Which transport of the group (the original or one of its duplicates) it belongs to.
    context: u64,
    src: usize,
    dst: usize,
    channel: Channel,
}

#[derive(Debug)]
struct Message {
    bytes: Vec<u8>,
    /// Seconds since the fabric's epoch at which the receiver may see it.
    arrives: f64,
}

#[derive(Debug, Default)]
struct Queues {
    messages: HashMap<Route, VecDeque<Message>>,
    /// For each `src * size + dst`: when that link is free again (seconds since the epoch).
    link_free: Vec<f64>,
}

/// State shared by the ranks of one group.
#[derive(Debug)]
struct Fabric {
    size: usize,
    link: LinkEmulation,
    epoch: Instant,
    queues: Mutex<Queues>,
    arrived: Condvar,
    /// `alive[r]`: how many transports (the original and its duplicates) rank `r` still holds;
    /// 0 once all are dropped.
    alive: Vec<AtomicUsize>,
}

impl Fabric {
    fn now(&self) -> f64 {
        self.epoch.elapsed().as_secs_f64()
    }

    fn lock(&self) -> MutexGuard<'_, Queues> {
        // A panicking rank thread cannot leave the queues half-updated (every update is one
        // push or pop), so a poisoned lock is still consistent.
        self.queues.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn post(&self, route: Route, bytes: Vec<u8>) {
        let now = self.now();
        let mut q = self.lock();
        let arrives = match self.link.bandwidth {
            None => now + self.link.latency,
            Some(_) => {
                let slot = &mut q.link_free[route.src * self.size + route.dst];
                let start = slot.max(now);
                *slot = start + self.link.occupancy(bytes.len());
                *slot + self.link.latency
            }
        };
        q.messages
            .entry(route)
            .or_default()
            .push_back(Message { bytes, arrives });
        drop(q);
        self.arrived.notify_all();
    }

    /// Wait for the next message on `route` and take it.
    fn take(&self, route: Route) -> Result<Vec<u8>> {
        let mut q = self.lock();
        loop {
            let now = self.now();
            let wait = match q.messages.get_mut(&route).and_then(|m| m.front()) {
                Some(m) if m.arrives <= now => {
                    let m = q
                        .messages
                        .get_mut(&route)
                        .and_then(VecDeque::pop_front)
                        .expect("front checked above");
                    return Ok(m.bytes);
                }
                Some(m) => Some(Duration::from_secs_f64(m.arrives - now)),
                None if self.alive[route.src].load(Ordering::Acquire) == 0 => {
                    return Err(Error::Comm(format!(
                        "loopback: rank {} left the group before sending the message rank {} \
                         waits for",
                        route.src, route.dst
                    )));
                }
                None => None,
            };
            q = match wait {
                Some(d) => {
                    self.arrived
                        .wait_timeout(q, d)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
                None => self.arrived.wait(q).unwrap_or_else(|e| e.into_inner()),
            };
        }
    }

    fn ready(&self, route: Route) -> bool {
        let now = self.now();
        self.lock()
            .messages
            .get(&route)
            .and_then(|m| m.front())
            .is_some_and(|m| m.arrives <= now)
    }
}

/// One rank of an in-process group (see the [module docs](self)). `Send`, so each rank can be
/// moved to its own thread; not `Sync` (one thread drives one rank, as with MPI).
#[derive(Debug)]
pub struct LoopbackTransport {
    rank: usize,
    fabric: Arc<Fabric>,
    /// Number of collectives this rank has started: every rank calls collectives in the same
    /// order, so equal counts name the same call.
    collectives: Cell<u64>,
    /// This transport's message space (0: the original; duplicates get their own).
    context: u64,
    /// Duplicates made of this transport so far (every rank makes them in the same order, so
    /// equal counts name the same duplicate).
    duplicates: Cell<u64>,
}

impl LoopbackTransport {
    /// A group of `n` ranks over an unthrottled link (`n >= 1`; zero gives an empty group).
    pub fn group(n: usize) -> Vec<Self> {
        Self::group_with_link(n, LinkEmulation::default())
    }

    /// A group of `n` ranks whose messages travel over emulated links of speed `link`.
    pub fn group_with_link(n: usize, link: LinkEmulation) -> Vec<Self> {
        let fabric = Arc::new(Fabric {
            size: n,
            link,
            epoch: Instant::now(),
            queues: Mutex::new(Queues {
                messages: HashMap::new(),
                link_free: vec![0.0; n * n],
            }),
            arrived: Condvar::new(),
            alive: (0..n).map(|_| AtomicUsize::new(1)).collect(),
        });
        (0..n)
            .map(|rank| LoopbackTransport {
                rank,
                fabric: fabric.clone(),
                collectives: Cell::new(0),
                context: 0,
                duplicates: Cell::new(0),
            })
            .collect()
    }

    /// Whether rank `r`'s transport is still alive (not dropped).
    #[cfg(feature = "cuda")]
    pub(crate) fn peer_alive(&self, r: usize) -> bool {
        self.fabric
            .alive
            .get(r)
            .is_some_and(|a| a.load(Ordering::Acquire) > 0)
    }

    /// The emulated link.
    pub fn link(&self) -> LinkEmulation {
        self.fabric.link
    }

    fn check_peer(&self, r: usize) -> Result<()> {
        super::check_rank(r, self.fabric.size)
    }

    fn p2p(&self, src: usize, dst: usize, tag: i32) -> Result<Route> {
        self.check_peer(src)?;
        self.check_peer(dst)?;
        if tag < 0 {
            return Err(Error::invalid(format!("negative message tag {tag}")));
        }
        Ok(Route {
            context: self.context,
            src,
            dst,
            channel: Channel::P2p(tag),
        })
    }

    /// Every rank's record of this collective call, in rank order (this rank's own included).
    fn exchange_all(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let seq = self.collectives.get();
        self.collectives.set(seq + 1);
        let channel = Channel::Collective(seq);
        let size = self.fabric.size;
        for dst in (0..size).filter(|&d| d != self.rank) {
            let route = Route {
                context: self.context,
                src: self.rank,
                dst,
                channel,
            };
            self.fabric.post(route, mine.to_vec());
        }
        (0..size)
            .map(|src| {
                if src == self.rank {
                    Ok(mine.to_vec())
                } else {
                    self.fabric.take(Route {
                        context: self.context,
                        src,
                        dst: self.rank,
                        channel,
                    })
                }
            })
            .collect()
    }

    /// Element-wise reduction with `op`, in rank order, of every rank's `input` into `out` (the
    /// same length everywhere): every rank folds the same values in the same order, so all get
    /// bit-identical results.
    fn reduce_all<T: Element>(
        &self,
        input: &[T],
        out: &mut [T],
        op: impl Fn(T, T) -> T,
    ) -> Result<()> {
        if input.len() != out.len() {
            return Err(Error::invalid(
                "loopback reduction: input and output lengths differ",
            ));
        }
        let bytes: Vec<u8> = input
            .iter()
            .flat_map(|v| v.to_bits_u64().to_le_bytes()[..T::SIZE].to_vec())
            .collect();
        let all = self.exchange_all(&bytes)?;
        if let Some((r, bad)) = all.iter().enumerate().find(|(_, a)| a.len() != bytes.len()) {
            return Err(Error::Comm(format!(
                "loopback reduction: rank {r} contributed {} bytes, {} expected",
                bad.len(),
                bytes.len()
            )));
        }
        let value = |c: &[u8]| {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            T::from_bits_u64(u64::from_le_bytes(w))
        };
        for (i, o) in out.iter_mut().enumerate() {
            let at = |k: usize| value(&all[k][i * T::SIZE..(i + 1) * T::SIZE]);
            *o = (1..all.len()).fold(at(0), |acc, k| op(acc, at(k)));
        }
        Ok(())
    }
}

impl Drop for LoopbackTransport {
    fn drop(&mut self) {
        self.fabric.alive[self.rank].fetch_sub(1, Ordering::AcqRel);
        self.fabric.arrived.notify_all();
    }
}

/// A send that completed when it was posted (the loopback copies the message).
struct Sent;

impl SendHandle for Sent {
    fn wait(self: Box<Self>) -> Result<()> {
        Ok(())
    }
    fn test(&mut self) -> Result<bool> {
        Ok(true)
    }
}

impl Transport for LoopbackTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.fabric.size
    }

    fn send(&self, dest: usize, tag: i32, bytes: &[u8]) -> Result<()> {
        let route = self.p2p(self.rank, dest, tag)?;
        self.fabric.post(route, bytes.to_vec());
        Ok(())
    }

    fn recv(&self, src: usize, tag: i32) -> Result<Vec<u8>> {
        let route = self.p2p(src, self.rank, tag)?;
        self.fabric.take(route)
    }

    fn sendrecv(&self, dest: usize, bytes: &[u8], src: usize, tag: i32) -> Result<Vec<u8>> {
        self.send(dest, tag, bytes)?;
        self.recv(src, tag)
    }

    fn isend(&self, dest: usize, tag: i32, bytes: Vec<u8>) -> Result<Box<dyn SendHandle>> {
        let route = self.p2p(self.rank, dest, tag)?;
        self.fabric.post(route, bytes);
        Ok(Box::new(Sent))
    }

    fn iprobe(&self, src: usize, tag: i32) -> Result<bool> {
        let route = self.p2p(src, self.rank, tag)?;
        Ok(self.fabric.ready(route))
    }

    fn allgather_fixed(&self, mine: &[u8]) -> Result<Vec<u8>> {
        let all = self.exchange_all(mine)?;
        if let Some((r, bad)) = all.iter().enumerate().find(|(_, a)| a.len() != mine.len()) {
            return Err(Error::Comm(format!(
                "allgather_fixed: rank {r} sent {} bytes, this rank {}",
                bad.len(),
                mine.len()
            )));
        }
        Ok(all.concat())
    }

    fn allgatherv(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.exchange_all(mine)
    }

    fn bcast(&self, root: usize, bytes: &mut Vec<u8>) -> Result<()> {
        self.check_peer(root)?;
        // Every rank takes part in the exchange so that the collective counters stay in step;
        // only the root's record is kept.
        let mine = if self.rank == root {
            bytes.as_slice()
        } else {
            &[]
        };
        let mut all = self.exchange_all(mine)?;
        *bytes = std::mem::take(&mut all[root]);
        Ok(())
    }

    fn allreduce_f64(&self, vals: &mut [f64], op: ReduceOp) -> Result<()> {
        let input = vals.to_vec();
        self.reduce_all(&input, vals, |x: f64, y| match op {
            ReduceOp::Sum => x + y,
            ReduceOp::Min => x.min(y),
            ReduceOp::Max => x.max(y),
        })
    }

    fn allreduce_sum_f32(&self, input: &[f32], out: &mut [f32]) -> Result<()> {
        self.reduce_all(input, out, |x, y| x + y)
    }

    fn allreduce_sum_f64(&self, input: &[f64], out: &mut [f64]) -> Result<()> {
        self.reduce_all(input, out, |x, y| x + y)
    }

    fn barrier(&self) -> Result<()> {
        self.exchange_all(&[]).map(drop)
    }

    fn wtime(&self) -> f64 {
        self.fabric.now()
    }

    fn duplicate(&self) -> Result<Option<Box<dyn Transport + Send>>> {
        let k = self.duplicates.get() + 1;
        self.duplicates.set(k);
        self.fabric.alive[self.rank].fetch_add(1, Ordering::AcqRel);
        // a context derived from the parent's and the duplicate's number: the same on every
        // rank, distinct from every other transport's
        let context = self
            .context
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .wrapping_add(k)
            .rotate_left(17)
            | 1;
        Ok(Some(Box::new(LoopbackTransport {
            rank: self.rank,
            fabric: self.fabric.clone(),
            collectives: Cell::new(0),
            context,
            duplicates: Cell::new(0),
        })))
    }
}

/// Run `f` on every rank of an in-process `group` (a [`LoopbackTransport::group`] or a
/// `DeviceLoopback::group`), each rank on its own thread, as `mpirun` runs one process per
/// rank; the results in rank order. A rank whose `f` panics gives an [`Error::Comm`] naming it
/// (its transport is dropped while unwinding, so the other ranks' receives from it fail
/// instead of waiting).
pub fn run_ranks<T: Send, R: Send>(group: Vec<T>, f: impl Fn(T) -> R + Sync) -> Vec<Result<R>> {
    std::thread::scope(|s| {
        let handles: Vec<_> = group
            .into_iter()
            .map(|t| {
                let f = &f;
                s.spawn(move || f(t))
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(r, h)| {
                h.join()
                    .map_err(|_| Error::Comm(format!("loopback rank {r} panicked")))
            })
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on_group<R: Send>(
        group: Vec<LoopbackTransport>,
        f: impl Fn(LoopbackTransport) -> R + Sync,
    ) -> Vec<R> {
        run_ranks(group, f)
            .into_iter()
            .map(|r| r.unwrap())
            .collect()
    }

    #[test]
    fn messages_between_a_pair_arrive_in_order_and_tags_do_not_mix() {
        let got = on_group(LoopbackTransport::group(2), |t| {
            if t.rank() == 0 {
                t.send(1, 7, b"a").unwrap();
                t.send(1, 9, b"x").unwrap();
                t.send(1, 7, b"b").unwrap();
                vec![]
            } else {
                vec![
                    t.recv(0, 9).unwrap(),
                    t.recv(0, 7).unwrap(),
                    t.recv(0, 7).unwrap(),
                ]
            }
        });
        assert_eq!(got[1], vec![b"x".to_vec(), b"a".to_vec(), b"b".to_vec()]);
    }

    #[test]
    fn collectives_agree_on_every_rank() {
        let got = on_group(LoopbackTransport::group(4), |t| {
            let r = t.rank();
            let fixed = t.allgather_fixed(&[r as u8; 2]).unwrap();
            let var = t.allgatherv(&vec![r as u8; r]).unwrap();
            let mut b = if r == 2 { b"root".to_vec() } else { vec![] };
            t.bcast(2, &mut b).unwrap();
            let mut out = [0.0f32; 3];
            t.allreduce_sum_f32(&[r as f32, 1.0, -0.5], &mut out)
                .unwrap();
            let mut m = [r as f64, -(r as f64)];
            t.allreduce_f64(&mut m, ReduceOp::Max).unwrap();
            t.barrier().unwrap();
            (fixed, var, b, out, m)
        });
        for (fixed, var, b, out, m) in got {
            assert_eq!(fixed, vec![0, 0, 1, 1, 2, 2, 3, 3]);
            assert_eq!(var, vec![vec![], vec![1], vec![2, 2], vec![3, 3, 3]]);
            assert_eq!(b, b"root");
            assert_eq!(out, [6.0, 4.0, -2.0]);
            assert_eq!(m, [3.0, 0.0]);
        }
    }

    #[test]
    fn a_departed_rank_is_an_error_not_a_hang() {
        let mut g = LoopbackTransport::group(2);
        let t1 = g.pop().unwrap();
        drop(g); // rank 0 leaves without sending
        let e = t1.recv(0, 0).unwrap_err();
        assert!(e.to_string().contains("rank 0 left"), "{e}");
    }

    #[test]
    fn bad_peers_and_tags_are_errors() {
        let g = LoopbackTransport::group(2);
        assert!(g[0].send(2, 0, b"").is_err());
        assert!(g[0].send(1, -1, b"").is_err());
        assert!(g[0].recv(5, 0).is_err());
        assert!(LinkEmulation::new(0.0, 0.0).is_err());
        assert!(LinkEmulation::new(1e9, f64::NAN).is_err());
    }

    #[test]
    fn an_emulated_link_delays_by_size() {
        // 1 MB at 100 MB/s = 10 ms on the link plus 1 ms latency, counted from the send (the
        // ranks share the fabric's clock, so no scheduling delay of the receiver can hide it)
        let link = LinkEmulation::new(100e6, 1e-3).unwrap();
        let sent_at = std::sync::Mutex::new(f64::NAN);
        let got = on_group(LoopbackTransport::group_with_link(2, link), |t| {
            if t.rank() == 0 {
                *sent_at.lock().unwrap() = t.wtime();
                t.send(1, 0, &vec![0u8; 1_000_000]).unwrap();
                0.0
            } else {
                t.recv(0, 0).unwrap();
                t.wtime()
            }
        });
        let delay = got[1] - *sent_at.lock().unwrap();
        assert!(delay >= 0.011, "arrived {delay} s after the send");
        assert!(delay < 5.0, "arrived {delay} s after the send");
    }
}
