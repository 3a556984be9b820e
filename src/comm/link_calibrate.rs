//! The schedule of the calibrations ([`repeat`], [`repeat_solo`]) and the one calibration of
//! the link curves between ranks, shared by the communicators that keep curves (the staged MPI
//! link between pinned host buffers, NCCL between device buffers; the host communicator checks
//! a cached profile's link with it): the same sizes walk, the same schedule ([`repeat`]: a barrier before every
//! timed transfer, warm-ups, the median), the slowest rank's time adopted by all, and the same
//! curve fitting ([`Curve::from_points`]). What differs between transports is only which bytes
//! move for a pattern, behind [`LinkProbe`].

use super::transport::{ReduceOp, Transport};
use crate::error::{Error, Result};
use crate::model::{self, Curve};

/// Warm-up calls before each calibrated quantity.
pub const CALIBRATION_WARMUP: usize = 2;
/// Timed repetitions (median) of each calibrated quantity.
pub const CALIBRATION_REPS: usize = 9;

/// Warm-up calls, then the median of [`CALIBRATION_REPS`] timed calls of `f`, a barrier on
/// `t` before each (so every rank's call starts together and ranks sharing a GPU see their
/// share). This rank's median; callers reduce over ranks.
pub(crate) fn repeat(t: &dyn Transport, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    let mut times = Vec::with_capacity(CALIBRATION_REPS);
    for k in 0..CALIBRATION_WARMUP + CALIBRATION_REPS {
        t.barrier()?;
        let t0 = std::time::Instant::now();
        f()?;
        if k >= CALIBRATION_WARMUP {
            times.push(t0.elapsed().as_secs_f64());
        }
    }
    Ok(model::median(&times))
}

/// Like [`repeat`], but only where `me` (one rank) runs the calls, without barriers between
/// them, while the other ranks wait (a barrier before, one reduction of the error status after;
/// they return 0): the *solo* rates. Every rank fails when the calling rank failed.
// the solo rates are the device calibrations' (a GPU shared by ranks, or not)
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn repeat_solo(
    t: &dyn Transport,
    me: bool,
    mut f: impl FnMut() -> Result<()>,
) -> Result<f64> {
    t.barrier()?;
    let r = if me {
        let mut times = Vec::with_capacity(CALIBRATION_REPS);
        let mut res = Ok(());
        for k in 0..CALIBRATION_WARMUP + CALIBRATION_REPS {
            let t0 = std::time::Instant::now();
            if let Err(e) = f() {
                res = Err(e);
                break;
            }
            if k >= CALIBRATION_WARMUP {
                times.push(t0.elapsed().as_secs_f64());
            }
        }
        res.map(|()| model::median(&times))
    } else {
        Ok(0.0)
    };
    let mut failed = [f64::from(u8::from(r.is_err()))];
    t.allreduce_f64(&mut failed, ReduceOp::Max)?;
    match r {
        Ok(_) if failed[0] > 0.5 => Err(Error::PeerFailed(
            "device calibration: the solo calls failed on another rank".into(),
        )),
        r => r,
    }
}

/// A transfer pattern whose time the link calibration measures at several sizes.
// the transport-own collectives are timed by the NCCL calibration only
#[cfg_attr(not(feature = "nccl"), allow(dead_code))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LinkPattern {
    /// The ranks taking part send `bytes` and receive `bytes` at once (a ring step, `sendrecv`).
    Exchange,
    /// A message of `bytes` in one direction with nothing coming back (a broadcast hop, the
    /// first message of a pipelined exchange).
    OneWay,
    /// The transport's own allreduce of `bytes` per rank (the reductions' raw path).
    Allreduce,
    /// The transport's own allgather of `bytes` per rank.
    Allgather,
}

/// One transport's side of the link calibration.
pub(crate) trait LinkProbe {
    /// Moves the bytes of `pattern` once, this rank's part, returning when that part is
    /// complete (its messages received, its device streams drained); a rank with no part in
    /// the pattern returns at once. Every rank calls it with the same arguments.
    fn transfer(&mut self, pattern: LinkPattern, bytes: usize) -> Result<()>;
    /// The size a time of `pattern` at `bytes` is recorded at in its curve (default `bytes`;
    /// an allgather's curve is by its output, `size * bytes`).
    fn curve_bytes(&self, pattern: LinkPattern, bytes: usize) -> f64 {
        let _ = pattern;
        bytes as f64
    }
}

/// The link between ranks 0 and 1 over a host transport, between two host buffers of theirs
/// (pinned staging buffers, or plain vectors): [`LinkPattern::Exchange`] (both send and receive
/// at once, as a ring step or `sendrecv` does) and [`LinkPattern::OneWay`] (rank 0 sends to
/// rank 1); the other ranks, and the other patterns, have no part.
pub(crate) struct PairLink<'a> {
    pub t: &'a dyn Transport,
    pub rank: usize,
    pub snd: &'a [u8],
    pub rcv: &'a mut [u8],
}

impl LinkProbe for PairLink<'_> {
    fn transfer(&mut self, pattern: LinkPattern, bytes: usize) -> Result<()> {
        let (snd, rcv) = (&self.snd[..bytes], &mut self.rcv[..bytes]);
        let tag = crate::comm::TAG_PING;
        match (pattern, self.rank) {
            (LinkPattern::Exchange, r @ (0 | 1)) => {
                self.t.sendrecv_sized(1 - r, snd, 1 - r, rcv, tag)
            }
            (LinkPattern::OneWay, 0) => self.t.send(1, tag, snd),
            (LinkPattern::OneWay, 1) => match self.t.recv_into(0, tag, rcv)? {
                Some(v) => Err(Error::Comm(format!(
                    "link calibration: expected {bytes} bytes from rank 0, got {}",
                    v.len()
                ))),
                None => Ok(()),
            },
            _ => Ok(()),
        }
    }
}

/// The measured curves of [`measure`], one per pattern asked for (`None` otherwise).
#[derive(Debug, Clone, Default)]
pub(crate) struct LinkCurves {
    pub exchange: Option<Curve>,
    pub one_way: Option<Curve>,
    pub allreduce: Option<Curve>,
    pub allgather: Option<Curve>,
}

/// Times every pattern of `patterns` at every size of `sizes` (bytes, the same on every rank)
/// with the [`repeat`] schedule on the host transport `host` (barriers, the reduction over
/// ranks), takes the slowest rank's median of
/// each (one reduction over ranks for all of them) and fits the curves. A one-way time is
/// capped by the exchange's at the same size where both are measured: a message alone is
/// never slower than with traffic coming back, and a slower sample is noise. Collective.
pub(crate) fn measure(
    host: &dyn Transport,
    probe: &mut dyn LinkProbe,
    sizes: &[usize],
    patterns: &[LinkPattern],
) -> Result<LinkCurves> {
    let mut times = Vec::with_capacity(sizes.len() * patterns.len());
    for &bytes in sizes {
        for &pattern in patterns {
            times.push(repeat(host, || probe.transfer(pattern, bytes))?);
        }
    }
    host.allreduce_f64(&mut times, ReduceOp::Max)?;
    let points = |k: usize| -> Vec<(f64, f64)> {
        sizes
            .iter()
            .enumerate()
            .map(|(i, &b)| {
                (
                    probe.curve_bytes(patterns[k], b),
                    times[i * patterns.len() + k],
                )
            })
            .collect()
    };
    let fallback = Curve::default();
    let mut out = LinkCurves::default();
    for (k, &pattern) in patterns.iter().enumerate() {
        let curve = Some(Curve::from_points(points(k), &fallback));
        match pattern {
            LinkPattern::Exchange => out.exchange = curve,
            LinkPattern::OneWay => out.one_way = curve,
            LinkPattern::Allreduce => out.allreduce = curve,
            LinkPattern::Allgather => out.allgather = curve,
        }
    }
    if let (Some(x), Some(k)) = (
        out.exchange.as_ref(),
        patterns.iter().position(|&p| p == LinkPattern::OneWay),
    ) {
        let capped = points(k)
            .into_iter()
            .map(|(b, t)| (b, t.min(x.time(b))))
            .collect();
        out.one_way = Some(Curve::from_points(capped, x));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::transport::{run_ranks, LoopbackTransport};

    /// The shared schedule on two ranks of one process: every rank times the same calls (the
    /// median of its timed ones), the solo calls run on the chosen rank only (0 elsewhere), and
    /// a solo call that fails fails every rank, not only the caller.
    #[test]
    fn the_schedule_times_every_rank_and_fails_together() {
        let out = run_ranks(LoopbackTransport::group(2), |t| {
            let mut calls = 0;
            let shared = repeat(&t, || {
                calls += 1;
                std::thread::sleep(std::time::Duration::from_millis(2));
                Ok(())
            })?;
            let me = t.rank() == 1;
            let mut solo_calls = 0;
            let solo = repeat_solo(&t, me, || {
                solo_calls += 1;
                Ok(())
            })?;
            let failed = repeat_solo(&t, me, || Err(Error::invalid("boom")));
            Ok::<_, Error>((calls, shared, solo_calls, solo, failed.is_err()))
        });
        for (rank, r) in out.into_iter().enumerate() {
            let (calls, shared, solo_calls, solo, failed) = r.expect("rank").expect("schedule");
            assert_eq!(calls, CALIBRATION_WARMUP + CALIBRATION_REPS);
            assert!((2e-3..1.0).contains(&shared), "rank {rank}: {shared}");
            if rank == 1 {
                assert_eq!(solo_calls, CALIBRATION_WARMUP + CALIBRATION_REPS);
                assert!(solo > 0.0);
            } else {
                assert_eq!((solo_calls, solo), (0, 0.0));
            }
            assert!(failed, "rank {rank} did not see the solo failure");
        }
    }

    /// A probe whose transfers sleep for a time that grows with the size (rank 1 slower).
    struct Sleepy {
        rank: usize,
        calls: usize,
    }

    impl LinkProbe for Sleepy {
        fn transfer(&mut self, pattern: LinkPattern, bytes: usize) -> Result<()> {
            self.calls += 1;
            let base = match pattern {
                LinkPattern::Exchange => 2e-3,
                LinkPattern::OneWay => 3e-3, // slower than the exchange: capped
                _ => 1e-3,
            };
            let slow = if self.rank == 1 { 2.0 } else { 1.0 };
            let s = slow * base * (bytes as f64 / (1 << 20) as f64);
            std::thread::sleep(std::time::Duration::from_secs_f64(s));
            Ok(())
        }
        fn curve_bytes(&self, pattern: LinkPattern, bytes: usize) -> f64 {
            if pattern == LinkPattern::Allgather {
                (2 * bytes) as f64
            } else {
                bytes as f64
            }
        }
    }

    #[test]
    fn the_slowest_rank_and_the_capped_one_way_make_the_curves() {
        let out = run_ranks(LoopbackTransport::group(2), |t| {
            let mut p = Sleepy {
                rank: t.rank(),
                calls: 0,
            };
            let sizes = [1 << 20, 2 << 20];
            let pats = [
                LinkPattern::Exchange,
                LinkPattern::OneWay,
                LinkPattern::Allgather,
            ];
            let c = measure(&t, &mut p, &sizes, &pats)?;
            Ok::<_, crate::Error>((c, p.calls))
        });
        for r in out {
            let (c, calls) = r.expect("rank").expect("measure");
            // 2 sizes x 3 patterns x (warm-ups + repetitions)
            assert_eq!(calls, 6 * (CALIBRATION_WARMUP + CALIBRATION_REPS));
            let x = c.exchange.expect("exchange");
            let o = c.one_way.expect("one way");
            let g = c.allgather.expect("allgather");
            assert!(c.allreduce.is_none());
            // rank 1's 4 ms per MiB of exchange (the slower rank), not rank 0's 2 ms
            let t1 = x.time((1 << 20) as f64);
            assert!((3.9e-3..6e-3).contains(&t1), "exchange at 1 MiB: {t1}");
            // the one-way samples (6 ms per MiB on rank 1) are capped at the exchange's
            assert!(o.time((2 << 20) as f64) <= x.time((2 << 20) as f64) * 1.000_001);
            // the allgather is recorded by its output size
            assert_eq!(g.points.len(), 2);
            assert_eq!(g.points[0].0, (2 << 20) as f64);
        }
    }
}
