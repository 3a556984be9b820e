//! Multi-process tests of `zcomm::comm`: every operation, every policy, odd sizes, empty
//! buffers, mismatches and the error bounds. Run under `mpirun -n P` (see `mpi-tests/run.sh`);
//! exits non-zero when any check fails on any rank.
//!
//! `--only-reduce` runs just the allreduce/reduce_scatter bound tests and the f32 non-blocking
//! reductions (used for p = 3 and 8). `--watchdog` (with `ZCOMM_TIMEOUT`) runs only the case
//! that must be aborted by the watchdog (see `watchdog_case`).

use zcomm::comm::{partition, Calibration, CommElement, Communicator, Config, Decision, Real};
use zcomm::model::Policy;
use zcomm::{CodecKind, Element, Error, ErrorBound};

struct Checker {
    rank: usize,
    fails: usize,
    checks: usize,
}

impl Checker {
    fn check(&mut self, ok: bool, what: impl FnOnce() -> String) {
        self.checks += 1;
        if !ok {
            self.fails += 1;
            eprintln!("[rank {}] FAIL: {}", self.rank, what());
        }
    }
}

/// Deterministic test values of rank `seed`: smooth field plus a little noise.
fn gen_f64(seed: usize, n: usize) -> Vec<f64> {
    let mut s = (seed as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let noise = (s >> 11) as f64 / (1u64 << 53) as f64 - 0.5;
            let x = i as f64 * 1e-3;
            (x + seed as f64).sin() * 10.0 + 0.01 * noise + seed as f64
        })
        .collect()
}

fn gen<E: CommElement>(seed: usize, n: usize) -> Vec<E> {
    let vals = gen_f64(seed, n * E::LANES);
    let mut v = vec![E::default(); n];
    for (o, x) in E::scalars_mut(&mut v).iter_mut().zip(vals) {
        *o = E::Scalar::from_f64(x);
    }
    v
}

/// Every rank's input (`gen(rank, n)`) as its scalars in f64, exactly as the ranks hold them.
fn held_inputs<E: CommElement>(p: usize, n: usize) -> Vec<Vec<f64>> {
    (0..p)
        .map(|k| {
            E::scalars(&gen::<E>(k, n))
                .iter()
                .map(|x| x.to_f64())
                .collect()
        })
        .collect()
}

/// Check `got` against `orig` under a single-compression bound; returns the max error.
fn within<S: Real>(orig: &[S], got: &[S], b: ErrorBound) -> std::result::Result<f64, String> {
    if orig.len() != got.len() {
        return Err(format!("length {} vs {}", got.len(), orig.len()));
    }
    let (lo, hi) = orig
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), x| {
            (l.min(x.to_f64()), h.max(x.to_f64()))
        });
    let mut maxe: f64 = 0.0;
    for (i, (a, g)) in orig.iter().zip(got).enumerate() {
        let (a, g) = (a.to_f64(), g.to_f64());
        let e = (a - g).abs();
        let lim = match b {
            ErrorBound::Abs(e) => e,
            ErrorBound::Noa(e) => e * (hi - lo),
            ErrorBound::Rel(e) => e * a.abs(),
        };
        if matches!(
            e.partial_cmp(&lim),
            None | Some(std::cmp::Ordering::Greater)
        ) {
            return Err(format!("value {i}: {a} -> {g}, error {e:e} > {lim:e}"));
        }
        maxe = maxe.max(e);
    }
    Ok(maxe)
}

const POLICIES: [Policy; 5] = [
    Policy::Never,
    Policy::Always(CodecKind::Aatrox),
    Policy::Always(CodecKind::CuszpPlain),
    Policy::Always(CodecKind::CuszpOutlier),
    Policy::Auto(CodecKind::Aatrox),
];
const SIZES: [usize; 5] = [0, 1, 33, 40_000, 100_003];

fn p2p_suite<E: CommElement>(c: &mut Communicator, t: &mut Checker) {
    let (p, r) = (c.size(), c.rank());
    let next = (r + 1) % p;
    let prev = (r + p - 1) % p;
    for pol in POLICIES {
        c.set_policy(pol);
        for b in [
            ErrorBound::Abs(1e-3),
            ErrorBound::Noa(1e-4),
            ErrorBound::Rel(1e-3),
        ] {
            c.set_bound(b).unwrap();
            for n in SIZES {
                let ctx = || format!("{} {pol} {b} n={n}", E::NAME);
                // ring send/recv (isend so that the ring cannot deadlock)
                let mine = gen::<E>(r, n);
                let req = c.isend(&mine, next, 7);
                let mut got = vec![E::default(); n];
                let st = c.recv(&mut got, prev, 7);
                t.check(st.is_ok(), || {
                    format!("recv {}: {:?}", ctx(), st.as_ref().err())
                });
                let w = req.and_then(|q| c.wait_send(q));
                t.check(w.is_ok(), || {
                    format!("isend {}: {:?}", ctx(), w.as_ref().err())
                });
                let want = gen::<E>(prev, n);
                let res = within(E::scalars(&want), E::scalars(&got), b);
                t.check(res.is_ok(), || {
                    format!("send/recv bound {}: {:?}", ctx(), res.err())
                });
                if pol == Policy::Never {
                    t.check(E::scalars(&want) == E::scalars(&got), || {
                        format!("raw not exact {}", ctx())
                    });
                }
                if let (Policy::Always(_), Ok(s)) = (pol, &w) {
                    t.check(n == 0 || s.decision == Decision::Compressed, || {
                        format!("always not compressed {}", ctx())
                    });
                }
                // sendrecv: ring shift
                let mut got2 = vec![E::default(); n];
                let st = c.sendrecv(&mine, next, &mut got2, prev, 9);
                t.check(st.is_ok(), || {
                    format!("sendrecv {}: {:?}", ctx(), st.as_ref().err())
                });
                let res = within(E::scalars(&want), E::scalars(&got2), b);
                t.check(res.is_ok(), || {
                    format!("sendrecv bound {}: {:?}", ctx(), res.err())
                });
                // recv_vec with unknown count
                let req = c.isend(&mine, next, 11);
                let rv = c.recv_vec::<E>(prev, 11);
                let w = req.and_then(|q| c.wait_send(q));
                t.check(w.is_ok() && rv.is_ok(), || {
                    format!("recv_vec {}: {:?}", ctx(), rv.as_ref().err())
                });
                if let Ok((v, _)) = rv {
                    let res = within(E::scalars(&want), E::scalars(&v), b);
                    t.check(res.is_ok(), || {
                        format!("recv_vec bound {}: {:?}", ctx(), res.err())
                    });
                }
                // allgather
                let mut all = vec![E::default(); n * p];
                let st = c.allgather(&mine, &mut all);
                t.check(st.is_ok(), || {
                    format!("allgather {}: {:?}", ctx(), st.as_ref().err())
                });
                for k in 0..p {
                    let want = gen::<E>(k, n);
                    let res = within(E::scalars(&want), E::scalars(&all[k * n..(k + 1) * n]), b);
                    t.check(res.is_ok(), || {
                        format!("allgather bound {} from {k}: {:?}", ctx(), res.err())
                    });
                }
                consistent(c, t, E::scalars(&all), &format!("allgather {}", ctx()));
                // bcast from the last rank
                let root = p - 1;
                let mut buf = if r == root {
                    gen::<E>(root, n)
                } else {
                    vec![E::default(); n]
                };
                let st = c.bcast(&mut buf, root);
                t.check(st.is_ok(), || {
                    format!("bcast {}: {:?}", ctx(), st.as_ref().err())
                });
                let res = within(E::scalars(&gen::<E>(root, n)), E::scalars(&buf), b);
                t.check(res.is_ok(), || {
                    format!("bcast bound {}: {:?}", ctx(), res.err())
                });
                consistent(c, t, E::scalars(&buf), &format!("bcast {}", ctx()));
                // non-blocking allgather and bcast (test() until done, then wait)
                let rq = c.iallgather(&mine);
                t.check(rq.is_ok(), || {
                    format!("iallgather {}: {:?}", ctx(), rq.as_ref().err())
                });
                if let Ok(mut rq) = rq {
                    let t0 = std::time::Instant::now();
                    while !rq.test().unwrap_or(true) && t0.elapsed().as_secs() < 20 {
                        std::hint::spin_loop();
                    }
                    let mut all2 = vec![E::default(); n * p];
                    let st = c.wait_allgather(rq, &mut all2);
                    t.check(st.is_ok(), || {
                        format!("wait_allgather {}: {:?}", ctx(), st.as_ref().err())
                    });
                    t.check(E::scalars(&all2) == E::scalars(&all), || {
                        format!("iallgather differs from allgather {}", ctx())
                    });
                }
                let src = if r == root {
                    gen::<E>(root, n)
                } else {
                    vec![E::default(); n]
                };
                let rq = c.ibcast(&src, root);
                t.check(rq.is_ok(), || {
                    format!("ibcast {}: {:?}", ctx(), rq.as_ref().err())
                });
                if let Ok(rq) = rq {
                    let mut b2 = vec![E::default(); n];
                    let st = c.wait_bcast(rq, &mut b2);
                    t.check(st.is_ok(), || {
                        format!("wait_bcast {}: {:?}", ctx(), st.as_ref().err())
                    });
                    t.check(E::scalars(&b2) == E::scalars(&buf), || {
                        format!("ibcast differs from bcast {}", ctx())
                    });
                }
            }
        }
    }
    // non-blocking receive: test() then wait()
    c.set_policy(Policy::Always(CodecKind::Aatrox));
    c.set_bound(ErrorBound::Abs(1e-3)).unwrap();
    let mine = gen::<E>(r, 5000);
    let rr = c.irecv(prev, 13).unwrap();
    let req = c.isend(&mine, next, 13).unwrap();
    let t0 = std::time::Instant::now();
    while !rr.test(c).unwrap() {
        if t0.elapsed().as_secs() > 20 {
            t.check(false, || "irecv test never saw the message".into());
            break;
        }
        std::thread::yield_now();
    }
    let mut got = vec![E::default(); 5000];
    let st = rr.wait(c, &mut got);
    let w = c.wait_send(req);
    t.check(st.is_ok() && w.is_ok(), || {
        format!("irecv/isend {}: {:?} {:?}", E::NAME, st.err(), w.err())
    });
    let res = within(
        E::scalars(&gen::<E>(prev, 5000)),
        E::scalars(&got),
        ErrorBound::Abs(1e-3),
    );
    t.check(res.is_ok(), || {
        format!("irecv bound {}: {:?}", E::NAME, res.err())
    });
}

/// All ranks must hold the same values: compare a hash across ranks.
fn consistent<S: Real>(c: &mut Communicator, t: &mut Checker, v: &[S], what: &str) {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for x in v {
        h = (h ^ x.to_bits_u64()).wrapping_mul(0x100_0000_01b3);
    }
    let hv = (h & ((1 << 52) - 1)) as f64;
    let mut mm = [hv, -hv];
    c.transport()
        .allreduce_f64(&mut mm, zcomm::comm::ReduceOp::Max)
        .unwrap();
    t.check(mm[0] == -mm[1], || {
        format!("{what}: ranks hold different values")
    });
}

/// allreduce / mean / reduce_scatter against the exact (f64) reduction.
fn reduce_suite<E: CommElement>(c: &mut Communicator, t: &mut Checker, sizes: &[usize]) {
    let (p, r) = (c.size(), c.rank());
    let u = E::Scalar::UNIT_ROUNDOFF;
    for pol in POLICIES {
        c.set_policy(pol);
        for b in [
            ErrorBound::Abs(1e-2),
            ErrorBound::Abs(1e-4),
            ErrorBound::Noa(1e-4),
            ErrorBound::Noa(1e-6),
        ] {
            c.set_bound(b).unwrap();
            for &n in sizes {
                let ctx = || format!("p={p} {} {pol} {b} n={n}", E::NAME);
                // the inputs as the ranks hold them (rounded to the dtype)
                let held = held_inputs::<E>(p, n);
                let exact: Vec<f64> = (0..n * E::LANES)
                    .map(|i| held.iter().map(|h| h[i]).sum())
                    .collect();
                let (glo, ghi) = held
                    .iter()
                    .flatten()
                    .fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), &x| {
                        (l.min(x), h.max(x))
                    });
                let m = glo.abs().max(ghi.abs());
                let e = match b {
                    ErrorBound::Abs(e) => e,
                    ErrorBound::Noa(e) => e * (ghi - glo).max(0.0),
                    ErrorBound::Rel(_) => unreachable!(),
                };
                // slack for the f64 reference sum itself
                let slack = p as f64 * 1.2e-16 * (p as f64 * m) + 1e-300;
                let mine = gen::<E>(r, n);
                for mean in [false, true] {
                    let d = if mean { p as f64 } else { 1.0 };
                    let mut out = vec![E::default(); n];
                    let st = if mean {
                        c.allreduce_mean(&mine, &mut out)
                    } else {
                        c.allreduce(&mine, &mut out)
                    };
                    t.check(st.is_ok(), || {
                        format!("allreduce(mean={mean}) {}: {:?}", ctx(), st.as_ref().err())
                    });
                    let Ok(st) = st else { continue };
                    // raw path: rounding only (native MPI sum order unknown: p·u·B)
                    let lim = if st.decision == Decision::Compressed {
                        e + slack
                    } else {
                        (p as f64 + 1.0) * u * (p as f64 * m) / d + slack
                    };
                    let mut worst: f64 = 0.0;
                    for (o, x) in E::scalars(&out).iter().zip(&exact) {
                        worst = worst.max((o.to_f64() - x / d).abs());
                    }
                    t.check(worst <= lim, || {
                        format!(
                            "allreduce(mean={mean}) {}: error {worst:e} > {lim:e} ({:?})",
                            ctx(),
                            st.decision
                        )
                    });
                    if matches!(pol, Policy::Always(_))
                        && n > 0
                        && p > 1
                        && e > 10.0 * p as f64 * u * p as f64 * m
                    {
                        t.check(st.decision == Decision::Compressed, || {
                            format!("allreduce {}: always but raw", ctx())
                        });
                    }
                    consistent(c, t, E::scalars(&out), &format!("allreduce {}", ctx()));
                    if st.decision == Decision::Compressed && n > 0 {
                        // verification reports the same max error the test measured
                        c.set_verify(true);
                        let mut o2 = vec![E::default(); n];
                        let sv = if mean {
                            c.allreduce_mean(&mine, &mut o2)
                        } else {
                            c.allreduce(&mine, &mut o2)
                        };
                        c.set_verify(false);
                        // Auto may choose raw the second time (the ratio cache now holds the
                        // achieved ratio, and the calibration is timing-dependent): then there
                        // is no compression error to report, and the raw sum must hold the
                        // rounding limit of the raw path
                        let flipped = matches!(pol, Policy::Auto(_))
                            && matches!(&sv, Ok(s) if s.decision == Decision::Raw);
                        // the error of the second run itself: under Auto the second plan may
                        // differ from the first (a different mix of compressed and raw rounds),
                        // so the reported error is compared with the output it describes
                        let w2 = E::scalars(&o2)
                            .iter()
                            .zip(&exact)
                            .map(|(o, x)| (o.to_f64() - x / d).abs())
                            .fold(0.0, f64::max);
                        if flipped {
                            let raw_lim = (p as f64 + 1.0) * u * (p as f64 * m) / d + slack;
                            t.check(w2 <= raw_lim, || {
                                format!(
                                    "allreduce verify {} (Auto chose raw): error {w2:e} > {raw_lim:e}",
                                    ctx()
                                )
                            });
                        } else {
                            let me = sv.as_ref().ok().and_then(|s| s.max_error);
                            t.check(
                                w2 <= lim
                                    && me.is_some_and(|v| {
                                        v <= lim && (v - w2).abs() <= 1e-9 * m.max(1.0) + slack
                                    }),
                                || {
                                    format!(
                                        "allreduce verify {}: reported {me:?}, measured {w2:e} (first run {worst:e}, limit {lim:e}) ({:?})",
                                        ctx(),
                                        sv.as_ref().err()
                                    )
                                },
                            );
                            if !matches!(pol, Policy::Auto(_)) {
                                // a fixed policy runs the same plan twice: same result
                                t.check(w2 == worst, || {
                                    format!(
                                        "allreduce verify {}: second run error {w2:e} != first {worst:e}",
                                        ctx()
                                    )
                                });
                            }
                        }
                    }
                }
                // reduce_scatter
                let seg = partition(n, p)[r].clone();
                let mut out = vec![E::default(); seg.len()];
                let st = c.reduce_scatter(&mine, &mut out);
                t.check(st.is_ok(), || {
                    format!("reduce_scatter {}: {:?}", ctx(), st.as_ref().err())
                });
                if let Ok(st) = st {
                    let lim = if st.decision == Decision::Compressed {
                        e + slack
                    } else {
                        (p as f64 + 1.0) * u * p as f64 * m + slack
                    };
                    let base = seg.start * E::LANES;
                    let worst = E::scalars(&out)
                        .iter()
                        .enumerate()
                        .map(|(i, o)| (o.to_f64() - exact[base + i]).abs())
                        .fold(0.0, f64::max);
                    t.check(worst <= lim, || {
                        format!("reduce_scatter {}: error {worst:e} > {lim:e}", ctx())
                    });
                }
            }
        }
    }
    // rel is refused on every rank
    c.set_bound(ErrorBound::Rel(1e-3)).unwrap();
    let mine = gen::<E>(r, 100);
    let mut out = vec![E::default(); 100];
    let st = c.allreduce(&mine, &mut out);
    t.check(matches!(st, Err(Error::InvalidArgument(_))), || {
        format!("rel allreduce not refused: {st:?}")
    });
}

fn mismatch_suite(c: &mut Communicator, t: &mut Checker) {
    let (p, r) = (c.size(), c.rank());
    c.set_policy(Policy::Always(CodecKind::Aatrox));
    c.set_bound(ErrorBound::Abs(1e-3)).unwrap();
    let fine = |c: &mut Communicator, t: &mut Checker, what: &str| {
        let x = gen::<f32>(r, 1000);
        let mut o = vec![0.0f32; 1000];
        let st = c.allreduce(&x, &mut o);
        t.check(st.is_ok(), || {
            format!("communicator unusable after {what}: {:?}", st.err())
        });
    };
    // 1. count mismatch in allreduce
    let n = if r == 0 { 1001 } else { 1000 };
    let x = gen::<f32>(r, n);
    let mut o = vec![0.0f32; n];
    let st = c.allreduce(&x, &mut o);
    if p > 1 {
        t.check(
            matches!(
                st,
                Err(Error::Mismatch {
                    what: "element count",
                    ..
                })
            ),
            || format!("allreduce count mismatch: {st:?}"),
        );
    }
    fine(c, t, "count mismatch");
    // 2. dtype mismatch in allgather
    let st = if r == p - 1 {
        let x = gen::<f64>(r, 100);
        let mut o = vec![0.0f64; 100 * p];
        c.allgather(&x, &mut o).map(|_| ())
    } else {
        let x = gen::<f32>(r, 100);
        let mut o = vec![0.0f32; 100 * p];
        c.allgather(&x, &mut o).map(|_| ())
    };
    if p > 1 {
        t.check(
            matches!(st, Err(Error::Mismatch { what: "dtype", .. })),
            || format!("allgather dtype mismatch: {st:?}"),
        );
    }
    fine(c, t, "dtype mismatch");
    // 3. bound mismatch in bcast
    if r == p - 1 {
        c.set_bound(ErrorBound::Abs(1e-4)).unwrap();
    }
    let mut buf = gen::<f32>(0, 500);
    let st = c.bcast(&mut buf, 0);
    if p > 1 {
        t.check(
            matches!(
                st,
                Err(Error::Mismatch {
                    what: "error bound",
                    ..
                })
            ),
            || format!("bcast bound mismatch: {st:?}"),
        );
    }
    c.set_bound(ErrorBound::Abs(1e-3)).unwrap();
    fine(c, t, "bound mismatch");
    // 4. different collectives
    let x = gen::<f32>(r, 64);
    let st = if r == 0 {
        let mut o = vec![0.0f32; 64 * p];
        c.allgather(&x, &mut o).map(|_| ())
    } else {
        let mut o = vec![0.0f32; 64];
        c.allreduce(&x, &mut o).map(|_| ())
    };
    if p > 1 {
        t.check(
            matches!(
                st,
                Err(Error::Mismatch {
                    what: "collective operation",
                    ..
                })
            ),
            || format!("op mismatch: {st:?}"),
        );
    }
    fine(c, t, "op mismatch");
    // 5. bad arguments on one rank only
    let x = gen::<f32>(r, 64);
    let mut o = vec![0.0f32; if r == p - 1 { 3 } else { 64 * p }];
    let st = c.allgather(&x, &mut o);
    t.check(st.is_err(), || {
        "allgather with a wrong output length did not fail everywhere".into()
    });
    fine(c, t, "bad arguments");
    // 6. codec mismatch in bcast
    if r == 0 {
        c.set_policy(Policy::Always(CodecKind::CuszpPlain));
    }
    let mut buf = gen::<f32>(0, 500);
    let st = c.bcast(&mut buf, 0);
    if p > 1 {
        t.check(
            matches!(
                st,
                Err(Error::Mismatch {
                    what: "policy/codec",
                    ..
                })
            ),
            || format!("bcast codec mismatch: {st:?}"),
        );
    }
    c.set_policy(Policy::Always(CodecKind::Aatrox));
    fine(c, t, "codec mismatch");
    if p >= 2 && r < 2 {
        // 7. send f32 / recv f64: both sides fail
        let st = if r == 0 {
            c.send(&gen::<f32>(0, 300), 1, 3).map(|_| ())
        } else {
            let mut o = vec![0.0f64; 300];
            c.recv(&mut o, 0, 3).map(|_| ())
        };
        t.check(
            matches!(st, Err(Error::Mismatch { what: "dtype", .. })),
            || format!("p2p dtype mismatch: {st:?}"),
        );
        // 8. count mismatch in send/recv
        let st = if r == 0 {
            c.send(&gen::<f32>(0, 300), 1, 3).map(|_| ())
        } else {
            let mut o = vec![0.0f32; 299];
            c.recv(&mut o, 0, 3).map(|_| ())
        };
        t.check(
            matches!(
                st,
                Err(Error::Mismatch {
                    what: "element count",
                    ..
                })
            ),
            || format!("p2p count mismatch: {st:?}"),
        );
        // 9. sendrecv count mismatch: both fail
        let peer = 1 - r;
        let mine = gen::<f32>(r, 200 + r);
        let mut o = vec![0.0f32; 200 + r];
        let st = c.sendrecv(&mine, peer, &mut o, peer, 5);
        t.check(matches!(st, Err(Error::Mismatch { .. })), || {
            format!("sendrecv count mismatch: {st:?}")
        });
        // 10. send with a different bound on the receiver
        if r == 1 {
            c.set_bound(ErrorBound::Noa(1e-3)).unwrap();
        }
        let st = if r == 0 {
            c.send(&gen::<f32>(0, 300), 1, 3).map(|_| ())
        } else {
            let mut o = vec![0.0f32; 300];
            c.recv(&mut o, 0, 3).map(|_| ())
        };
        t.check(
            matches!(
                st,
                Err(Error::Mismatch {
                    what: "error bound",
                    ..
                })
            ),
            || format!("p2p bound mismatch: {st:?}"),
        );
        c.set_bound(ErrorBound::Abs(1e-3)).unwrap();
        // and p2p still works
        let st = if r == 0 {
            c.send(&gen::<f32>(0, 300), 1, 3).map(|_| ())
        } else {
            let mut o = vec![0.0f32; 300];
            c.recv(&mut o, 0, 3).map(|_| ())
        };
        t.check(st.is_ok(), || format!("p2p after mismatches: {st:?}"));
    }
    fine(c, t, "p2p mismatches");
}

/// Chunk-pipelined point-to-point: odd sizes around chunk boundaries, both sides chunked, one
/// side chunked (mixed sendrecv), recv_vec, a count mismatch (then a good message on the same
/// tag), and the bound.
fn pipeline_suite<E: CommElement>(c: &mut Communicator, t: &mut Checker) {
    let (p, r) = (c.size(), c.rank());
    let next = (r + 1) % p;
    let prev = (r + p - 1) % p;
    // 4 KiB chunks, pipelined above 8 KiB
    c.set_pipeline(4096, 8192);
    let sb = <E::Scalar as Element>::SIZE;
    let chunk_elems = 4096 / sb / E::LANES;
    let sizes = [
        8192 / sb / E::LANES,     // exactly at the threshold: one message
        8192 / sb / E::LANES + 1, // just above: three chunks, the last one short
        3 * chunk_elems,          // exact chunk multiple
        3 * chunk_elems - 1,
        5 * chunk_elems + 1,
        100_003,
    ];
    for pol in [
        Policy::Always(CodecKind::Aatrox),
        Policy::Always(CodecKind::CuszpOutlier),
        Policy::Never,
    ] {
        c.set_policy(pol);
        for b in [ErrorBound::Abs(1e-3), ErrorBound::Noa(1e-4)] {
            c.set_bound(b).unwrap();
            for n in sizes {
                let ctx = || format!("pipeline {} {pol} {b} n={n}", E::NAME);
                let mine = gen::<E>(r + 11, n);
                let want = gen::<E>(prev + 11, n);
                // ring isend/recv
                let chunks0 = c.pipeline_chunks();
                c.set_verify(true);
                let req = c.isend(&mine, next, 9);
                let mut got = vec![E::default(); n];
                let st = c.recv(&mut got, prev, 9);
                let w = req.and_then(|q| c.wait_send(q));
                c.set_verify(false);
                t.check(st.is_ok() && w.is_ok(), || {
                    format!(
                        "{}: recv {:?} send {:?}",
                        ctx(),
                        st.as_ref().err(),
                        w.as_ref().err()
                    )
                });
                let res = within(E::scalars(&want), E::scalars(&got), b);
                t.check(res.is_ok(), || {
                    format!("{} send/recv bound: {:?}", ctx(), res.err())
                });
                // sent + received chunks: ceil(scalars / chunk) each way above the threshold
                let scal = n * E::LANES;
                let per = 4096 / sb;
                let expect = if pol != Policy::Never && scal * sb > 8192 {
                    2 * scal.div_ceil(per) as u64
                } else {
                    0
                };
                let moved = c.pipeline_chunks() - chunks0;
                t.check(moved == expect, || {
                    format!("{}: {moved} pipelined chunks, expected {expect}", ctx())
                });
                if let (Policy::Always(_), Ok(s)) = (pol, &w) {
                    let lim = match b {
                        ErrorBound::Noa(_) => s.bound,
                        _ => b.value(),
                    };
                    t.check(
                        s.decision == Decision::Compressed
                            && s.wire_bytes > 0
                            && s.max_error.is_some_and(|e| e <= lim),
                        || format!("{} send stats: {s}", ctx()),
                    );
                }
                // recv_vec of a pipelined message
                let req = c.isend(&mine, next, 10);
                let rv = c.recv_vec::<E>(prev, 10);
                let w = req.and_then(|q| c.wait_send(q));
                match rv {
                    Ok((v, _)) => {
                        let res = within(E::scalars(&want), E::scalars(&v), b);
                        t.check(res.is_ok() && w.is_ok(), || {
                            format!("{} recv_vec: {:?} {:?}", ctx(), res.err(), w.err())
                        });
                    }
                    Err(e) => t.check(false, || format!("{} recv_vec: {e}", ctx())),
                }
                // sendrecv ring, same size both ways
                let mut got = vec![E::default(); n];
                let st = c.sendrecv(&mine, next, &mut got, prev, 11);
                let res = within(E::scalars(&want), E::scalars(&got), b);
                t.check(st.is_ok() && res.is_ok(), || {
                    format!("{} sendrecv: {:?} {:?}", ctx(), st.err(), res.err())
                });
                // mixed: even ranks send n (maybe chunked), odd ranks send 17 (one message)
                let len_of = |k: usize| if k % 2 == 0 { n } else { 17 };
                let mine_m = gen::<E>(r + 11, len_of(r));
                let want_m = gen::<E>(prev + 11, len_of(prev));
                let mut got = vec![E::default(); len_of(prev)];
                let st = c.sendrecv(&mine_m, next, &mut got, prev, 12);
                let res = within(E::scalars(&want_m), E::scalars(&got), b);
                t.check(st.is_ok() && res.is_ok(), || {
                    format!("{} mixed sendrecv: {:?} {:?}", ctx(), st.err(), res.err())
                });
            }
        }
        // count mismatch on a pipelined send: both ends fail, the tag stays usable
        if p > 1 {
            let n = sizes[4];
            let mine = gen::<E>(r, n);
            let req = c.isend(&mine, next, 13);
            let mut got = vec![E::default(); n + 1];
            let st = c.recv(&mut got, prev, 13);
            let w = req.and_then(|q| c.wait_send(q));
            t.check(
                matches!(st, Err(Error::Mismatch { .. }))
                    && matches!(w, Err(Error::Mismatch { .. })),
                || {
                    format!(
                        "pipeline {} {pol} mismatch: recv {st:?} send {w:?}",
                        E::NAME
                    )
                },
            );
            let mut got = vec![E::default(); n];
            let st = c.sendrecv(&mine, next, &mut got, prev, 13);
            let want = gen::<E>(prev, n);
            let res = within(E::scalars(&want), E::scalars(&got), c.config().bound);
            t.check(st.is_ok() && res.is_ok(), || {
                format!(
                    "pipeline {} {pol} after mismatch: {:?} {:?}",
                    E::NAME,
                    st.err(),
                    res.err()
                )
            });
        }
    }
    c.set_pipeline(32 << 20, 64 << 20);
}

/// Non-blocking reductions and sendrecv on the progress thread: same results as the blocking
/// operations run concurrently on the calling thread, the bound against an exact sum, several
/// outstanding requests, `test` polling, a count mismatch on every rank, then recovery.
fn nonblocking_suite<E: CommElement>(c: &mut Communicator, t: &mut Checker) {
    let (p, r) = (c.size(), c.rank());
    let next = (r + 1) % p;
    let prev = (r + p - 1) % p;
    if !c.has_progress_thread() {
        let e = c.iallreduce(&[E::default(); 4]);
        t.check(matches!(e, Err(Error::Unavailable(_))), || {
            format!("iallreduce without a progress thread: {e:?}")
        });
        if r == 0 {
            println!("nonblocking suite skipped: no MPI_THREAD_MULTIPLE");
        }
        return;
    }
    for pol in [Policy::Always(CodecKind::Aatrox), Policy::Never] {
        c.set_policy(pol);
        for b in [ErrorBound::Abs(1e-3), ErrorBound::Noa(1e-4)] {
            c.set_bound(b).unwrap();
            for n in [0usize, 7, 50_001] {
                let ctx = || format!("nonblocking p={p} {} {pol} {b} n={n}", E::NAME);
                let mine = gen::<E>(r, n);
                let q1 = c.iallreduce(&mine);
                let q2 = c.ireduce_scatter(&mine);
                let q3 = c.isendrecv(&mine, next, n, prev, 5);
                let q4 = c.iallreduce_mean(&mine);
                // the calling thread keeps communicating meanwhile
                let mut blk = vec![E::default(); n];
                let sb = c.allreduce(&mine, &mut blk);
                let seg = partition(n, p)[r].clone();
                let mut blk_rs = vec![E::default(); seg.len()];
                let sr = c.reduce_scatter(&mine, &mut blk_rs);
                let mut blk_sr = vec![E::default(); n];
                let ss = c.sendrecv(&mine, next, &mut blk_sr, prev, 5);
                t.check(sb.is_ok() && sr.is_ok() && ss.is_ok(), || {
                    format!("{} blocking: {sb:?} {sr:?} {ss:?}", ctx())
                });
                let (Ok(mut q1), Ok(q2), Ok(q3), Ok(q4)) = (q1, q2, q3, q4) else {
                    t.check(false, || format!("{}: could not start", ctx()));
                    continue;
                };
                // poll the first one until done (bounded)
                let t0 = std::time::Instant::now();
                let mut polled = false;
                while t0.elapsed().as_secs() < 60 {
                    match q1.test() {
                        Ok(true) => {
                            polled = true;
                            break;
                        }
                        Ok(false) => std::thread::sleep(std::time::Duration::from_micros(200)),
                        Err(_) => break,
                    }
                }
                t.check(polled, || format!("{}: test() never became true", ctx()));
                let (a, b1, b2, b3) = (q1.wait(), q2.wait(), q3.wait(), q4.wait());
                match (&a, &b1, &b2, &b3) {
                    (Ok((a, _)), Ok((rs, _)), Ok((sr, _)), Ok((mean, _))) => {
                        let same = |x: &[E], y: &[E]| {
                            E::scalars(x)
                                .iter()
                                .zip(E::scalars(y))
                                .all(|(u, v)| u.to_f64().to_bits() == v.to_f64().to_bits())
                                && x.len() == y.len()
                        };
                        if pol != Policy::Never {
                            // the same deterministic algorithm as the blocking calls
                            t.check(same(a, &blk) && same(rs, &blk_rs), || {
                                format!("{}: non-blocking result differs from blocking", ctx())
                            });
                        }
                        // the same message compressed (or not) the same way: the same values,
                        // raw and compressed alike
                        t.check(same(sr, &blk_sr), || {
                            format!("{}: isendrecv differs from sendrecv", ctx())
                        });
                        let want = gen::<E>(prev, n);
                        let res = within(E::scalars(&want), E::scalars(sr), b);
                        t.check(res.is_ok(), || {
                            format!("{} isendrecv bound: {:?}", ctx(), res.err())
                        });
                        // bound of the sum and mean against the exact f64 sum
                        let held = held_inputs::<E>(p, n);
                        let (glo, ghi) = held
                            .iter()
                            .flatten()
                            .fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), &x| {
                                (l.min(x), h.max(x))
                            });
                        let e = match b {
                            ErrorBound::Noa(e) => e * (ghi - glo).max(0.0),
                            _ => b.value(),
                        };
                        let m = glo.abs().max(ghi.abs());
                        let u = E::Scalar::UNIT_ROUNDOFF;
                        let lim = e + 2.0 * p as f64 * u * (p as f64 * m) + 1e-12;
                        let mut worst: f64 = 0.0;
                        for i in 0..n * E::LANES {
                            let ex: f64 = held.iter().map(|h| h[i]).sum();
                            let g = E::scalars(a)[i].to_f64();
                            let gm = E::scalars(mean)[i].to_f64();
                            worst = worst
                                .max((g - ex).abs())
                                .max((gm - ex / p as f64).abs() * 1.0);
                        }
                        t.check(worst <= lim, || {
                            format!("{}: iallreduce error {worst:e} > {lim:e}", ctx())
                        });
                    }
                    _ => t.check(false, || {
                        format!(
                            "{}: {:?} {:?} {:?} {:?}",
                            ctx(),
                            a.err(),
                            b1.err(),
                            b2.err(),
                            b3.err()
                        )
                    }),
                }
            }
        }
    }
    // a count mismatch fails on every rank; the next operation works
    if p > 1 {
        c.set_policy(Policy::Always(CodecKind::Aatrox));
        c.set_bound(ErrorBound::Abs(1e-3)).unwrap();
        let n = if r == 0 { 101 } else { 100 };
        let q = c.iallreduce(&gen::<E>(r, n)).and_then(|q| q.wait());
        t.check(matches!(q, Err(Error::Mismatch { .. })), || {
            format!(
                "iallreduce count mismatch {}: {:?}",
                E::NAME,
                q.map(|x| x.1)
            )
        });
        let q = c.iallreduce(&gen::<E>(r, 100)).and_then(|q| q.wait());
        t.check(q.as_ref().is_ok_and(|x| x.0.len() == 100), || {
            format!("iallreduce after mismatch {}: {:?}", E::NAME, q.err())
        });
    }
}

/// Auto chooses raw for incompressible data, and the decision is the same on every rank.
fn auto_suite(c: &mut Communicator, t: &mut Checker) {
    let r = c.rank();
    c.set_policy(Policy::Auto(CodecKind::Aatrox));
    c.set_bound(ErrorBound::Abs(1e-30)).unwrap();
    let noise: Vec<f32> = gen_f64(r + 100, 200_000)
        .iter()
        .map(|x| (x * 1e6).sin() as f32 * 1e3)
        .collect();
    let mut out = vec![0.0f32; noise.len()];
    let st = c.allreduce(&noise, &mut out).unwrap();
    t.check(st.decision == Decision::Raw, || {
        format!("auto compressed incompressible data: {st}")
    });
    let mut all = vec![0.0f32; noise.len() * c.size()];
    let st = c.allgather(&noise, &mut all).unwrap();
    t.check(st.decision == Decision::Raw, || {
        format!("auto allgather compressed incompressible data: {st}")
    });
    let code = f64::from(u8::from(st.decision == Decision::Compressed));
    let mut mm = [code, -code];
    c.transport()
        .allreduce_f64(&mut mm, zcomm::comm::ReduceOp::Max)
        .unwrap();
    t.check(mm[0] == -mm[1], || {
        "auto decisions differ between ranks".into()
    });
}

/// Deterministic test bytes of record `seed`.
fn bytes_of(seed: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i * 131 + seed * 7919 + len) % 251) as u8)
        .collect()
}

/// The transport's non-blocking collectives on owned buffers (`ibcast_into`,
/// `iallgatherv_into`): empty, odd and multi-piece sizes (pieces of 1000 bytes and a 3000-byte
/// collective limit on a second transport, besides the communicator's own, which
/// `ZCOMM_MPI_PIECE` scales down in run.sh), buffers longer than the transfer, two in flight,
/// results equal to the blocking forms, and too-short buffers failing on every rank.
fn transport_suite(c: &mut Communicator, t: &mut Checker) {
    use zcomm::comm::transport::OwnedBytes;
    use zcomm::comm::{MpiTransport, Transport};
    let world = mpi::topology::SimpleCommunicator::world();
    let limited = MpiTransport::with_limits(&world, 1000, 3000);
    let (p, r) = (c.size(), c.rank());
    let back = |bufs: Vec<Box<dyn OwnedBytes>>| -> Vec<Vec<u8>> {
        bufs.into_iter()
            .map(|b| *b.into_any().downcast::<Vec<u8>>().expect("a Vec<u8>"))
            .collect()
    };
    let transports: [(&dyn Transport, &str); 2] =
        [(c.transport(), "default"), (&limited, "piece=1000")];
    for (tr, name) in transports {
        for root in [0, p - 1] {
            for len in [0usize, 1, 7, 999, 1000, 1001, 2999, 3001, 4567] {
                let ctx = || format!("ibcast_into {name} p={p} root={root} len={len}");
                let want = bytes_of(root, len);
                let mine = if r == root {
                    let mut b = want.clone();
                    b.extend_from_slice(&[0xEE; 3]);
                    b
                } else {
                    vec![0xAB; len + 5]
                };
                let extra = mine.len() - len;
                let pad = mine[len..].to_vec();
                // two in flight, waited in reverse order
                let second_want = bytes_of(root + 100, len);
                let second = if r == root {
                    second_want.clone()
                } else {
                    vec![0u8; len]
                };
                let h1 = tr.ibcast_into(root, Box::new(mine), len);
                let h2 = tr.ibcast_into(root, Box::new(second), len);
                let (Ok(mut h1), Ok(h2)) = (h1, h2) else {
                    t.check(false, || format!("{}: could not start", ctx()));
                    continue;
                };
                let _ = h1.test();
                let got2 = h2.wait().map(back);
                let got1 = h1.wait().map(back);
                t.check(
                    matches!(&got2, Ok(v) if v.len() == 1 && v[0] == second_want),
                    || format!("{}: second broadcast differs", ctx()),
                );
                t.check(
                    matches!(&got1, Ok(v) if v.len() == 1 && v[0].len() == len + extra
                        && v[0][..len] == want[..] && v[0][len..] == pad[..]),
                    || format!("{}: received bytes (or the untouched tail) differ", ctx()),
                );
                // equal to the blocking form
                let mut blk = if r == root {
                    want.clone()
                } else {
                    vec![0u8; len]
                };
                let rb = tr.bcast_into(root, &mut blk);
                t.check(rb.is_ok() && blk == want, || {
                    format!("{}: bcast_into differs", ctx())
                });
            }
        }
        // a buffer shorter than the broadcast fails on every rank (locally, nothing posted)
        let e = tr.ibcast_into(0, Box::new(vec![0u8; 3]), 4);
        t.check(e.is_err(), || {
            format!("ibcast_into {name}: short buffer accepted")
        });
        for base in [0usize, 1, 333, 1001, 2000] {
            let lens: Vec<usize> = (0..p)
                .map(|k| (base + k * 37) * usize::from(k != 1 || base > 1))
                .collect();
            let total: usize = lens.iter().sum();
            let ctx = || format!("iallgatherv_into {name} p={p} lens={lens:?}");
            let recs: Vec<Vec<u8>> = (0..p).map(|k| bytes_of(k, lens[k])).collect();
            let mut mine = recs[r].clone();
            mine.push(0x5A);
            let out = vec![0xCDu8; total + 2];
            let h = tr.iallgatherv_into(Box::new(mine), &lens, Box::new(out));
            let Ok(h) = h else {
                t.check(false, || format!("{}: could not start", ctx()));
                continue;
            };
            let got = h.wait().map(back);
            let ok = match &got {
                Ok(v) if v.len() == 2 => {
                    let (m, o) = (&v[0], &v[1]);
                    let mut off = 0;
                    let mut good = m[..lens[r]] == recs[r][..] && o[total..] == [0xCD, 0xCD];
                    for k in 0..p {
                        // this rank's own range may be left untouched
                        if k != r {
                            good &= o[off..off + lens[k]] == recs[k][..];
                        }
                        off += lens[k];
                    }
                    good
                }
                _ => false,
            };
            t.check(ok, || format!("{}: records differ", ctx()));
            // equal to the blocking form
            let mut blk = vec![0u8; total];
            let rb = tr.allgatherv_into(&recs[r], &lens, &mut blk);
            let want: Vec<u8> = recs.concat();
            let mut same = rb.is_ok();
            let mut off = 0;
            for k in 0..p {
                if k != r {
                    same &= blk[off..off + lens[k]] == want[off..off + lens[k]];
                }
                off += lens[k];
            }
            t.check(same, || format!("{}: allgatherv_into differs", ctx()));
        }
        let mut lens = vec![4usize; p];
        lens[r] = 4;
        let e = tr.iallgatherv_into(
            Box::new(vec![0u8; 4]),
            &lens,
            Box::new(vec![0u8; 4 * p - 1]),
        );
        t.check(e.is_err(), || {
            format!("iallgatherv_into {name}: short output accepted")
        });
    }
    drop(limited);
}

/// `--watchdog` (run.sh: `ZCOMM_TIMEOUT=2`, expected to abort): the ranks disagree on the number
/// of allreduce calls, rank 0 making one more than the others, which go on to finish (and wait
/// in `MPI_Finalize` for rank 0). Without the watchdog that is a hang; with it, rank 0's extra
/// allreduce must end the whole job after `ZCOMM_TIMEOUT` with the message naming the operation
/// (run.sh checks the message, the failing exit status and the time taken).
fn watchdog_case(mut c: Communicator) -> ! {
    let r = c.rank();
    if zcomm::comm::watchdog::timeout().is_none() {
        eprintln!("[rank {r}] --watchdog needs ZCOMM_TIMEOUT (it would hang)");
        std::process::exit(2);
    }
    let x = gen::<f32>(r, 1000);
    let mut o = vec![0.0f32; 1000];
    for _ in 0..if r == 0 { 2 } else { 1 } {
        if let Err(e) = c.allreduce(&x, &mut o) {
            eprintln!("[rank {r}] watchdog case: allreduce failed instead of blocking: {e}");
            std::process::exit(4);
        }
    }
    drop(c);
    // rank 0 never gets here: its second allreduce has no partner
    eprintln!("[rank {r}] watchdog case: finished");
    std::process::exit(if r == 0 { 3 } else { 0 })
}

fn main() {
    let only_reduce = std::env::args().any(|a| a == "--only-reduce");
    let profile = std::env::temp_dir().join("zcomm-mpi-tests-profile.json");
    let cfg = Config::new(ErrorBound::Abs(1e-3))
        .with_calibration(Calibration::LoadOrMeasure)
        .with_profile_path(profile);
    let mut c = match Communicator::init(cfg) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cannot create the communicator: {e}");
            std::process::exit(2);
        }
    };
    if std::env::args().any(|a| a == "--watchdog") {
        watchdog_case(c);
    }
    let (p, r) = (c.size(), c.rank());
    let mut t = Checker {
        rank: r,
        fails: 0,
        checks: 0,
    };
    let t0 = std::time::Instant::now();
    transport_suite(&mut c, &mut t);
    if !only_reduce {
        p2p_suite::<f32>(&mut c, &mut t);
        p2p_suite::<f64>(&mut c, &mut t);
        p2p_suite::<[f32; 2]>(&mut c, &mut t);
        p2p_suite::<[f64; 2]>(&mut c, &mut t);
        mismatch_suite(&mut c, &mut t);
        auto_suite(&mut c, &mut t);
        pipeline_suite::<f32>(&mut c, &mut t);
        pipeline_suite::<f64>(&mut c, &mut t);
        pipeline_suite::<[f32; 2]>(&mut c, &mut t);
        pipeline_suite::<[f64; 2]>(&mut c, &mut t);
        nonblocking_suite::<[f64; 2]>(&mut c, &mut t);
    }
    nonblocking_suite::<f32>(&mut c, &mut t);
    let sizes: &[usize] = if only_reduce {
        &[0, 7, 50_001]
    } else {
        &[0, 1, 7, 50_001]
    };
    reduce_suite::<f32>(&mut c, &mut t, sizes);
    reduce_suite::<f64>(&mut c, &mut t, sizes);
    reduce_suite::<[f32; 2]>(&mut c, &mut t, &sizes[..sizes.len() - 1]);
    reduce_suite::<[f64; 2]>(&mut c, &mut t, &sizes[..sizes.len() - 1]);
    let mut v = [t.fails as f64, t.checks as f64];
    c.transport()
        .allreduce_f64(&mut v, zcomm::comm::ReduceOp::Sum)
        .unwrap();
    if r == 0 {
        println!(
            "mpi-tests/ops p={p}{}: {} checks, {} failures ({:.1} s)",
            if only_reduce { " (reduce only)" } else { "" },
            v[1],
            v[0],
            t0.elapsed().as_secs_f64()
        );
    }
    drop(c);
    if v[0] > 0.0 {
        std::process::exit(1);
    }
}
