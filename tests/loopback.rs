//! Every host operation of the communication layer on 1 to 4 ranks of the in-process loopback
//! transport, with the CPU codec: the same algorithms `mpirun` runs, inside `cargo test`.

use zcomm::comm::transport::{run_ranks, LinkEmulation, LoopbackTransport, Transport};
use zcomm::comm::{partition, Calibration, Communicator, Config, CpuCompressor, Decision};
use zcomm::model::{Link, Policy, Profile};
use zcomm::{CodecKind, ErrorBound};

/// A profile for a link of `bandwidth` bytes/s (no measurement: tests stay fast and
/// deterministic).
fn profile(bandwidth: f64) -> Profile {
    Profile::new(Link {
        bandwidth,
        latency: 1e-6,
    })
}

/// Run `f` on every rank of a loopback group of `p` ranks, each on its own thread with its own
/// communicator; results in rank order.
fn on_ranks<R: Send>(
    p: usize,
    link: LinkEmulation,
    cfg: Config,
    f: impl Fn(&mut Communicator) -> R + Sync,
) -> Vec<R> {
    run_ranks(LoopbackTransport::group_with_link(p, link), |t| {
        let mut c = Communicator::with_transport(Box::new(t), Box::new(CpuCompressor), cfg.clone())
            .expect("communicator over loopback");
        f(&mut c)
    })
    .into_iter()
    .map(|r| r.expect("rank thread"))
    .collect()
}

fn cfg(policy: Policy, bound: ErrorBound) -> Config {
    Config::new(bound)
        .with_policy(policy)
        .with_calibration(Calibration::Fixed(profile(1e9)))
}

/// A smooth, rank-dependent signal.
fn field(rank: usize, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i as f32) * 1e-3 + rank as f32).sin() * 100.0 + rank as f32)
        .collect()
}

fn max_err(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (*x as f64 - *y as f64).abs())
        .fold(0.0, f64::max)
}

const ALWAYS: Policy = Policy::Always(CodecKind::Aatrox);

#[test]
fn sendrecv_ring_holds_the_bound_on_every_rank_count() {
    for p in 1..=4 {
        for policy in [ALWAYS, Policy::Never] {
            let got = on_ranks(
                p,
                LinkEmulation::default(),
                cfg(policy, ErrorBound::Abs(1e-2)),
                |c| {
                    let (r, p) = (c.rank(), c.size());
                    let send = field(r, 50_000);
                    let mut recv = vec![0.0f32; 50_000];
                    let st = c
                        .sendrecv(&send, (r + 1) % p, &mut recv, (r + p - 1) % p, 3)
                        .unwrap();
                    (max_err(&recv, &field((r + p - 1) % p, 50_000)), st)
                },
            );
            for (e, st) in got {
                match policy {
                    Policy::Never => {
                        assert_eq!(e, 0.0);
                        assert_eq!(st.decision, Decision::Raw);
                    }
                    _ => {
                        assert!(e <= 1e-2, "p={p}: error {e}");
                        assert_eq!(st.decision, Decision::Compressed);
                        assert!(st.ratio > 2.0, "p={p}: ratio {}", st.ratio);
                    }
                }
            }
        }
    }
}

#[test]
fn send_and_recv_with_pipelined_chunks() {
    // 400 KB messages in 64 KB chunks: the chunk pipeline runs.
    let c0 = cfg(ALWAYS, ErrorBound::Noa(1e-4)).with_pipeline(64 << 10, 128 << 10);
    let got = on_ranks(2, LinkEmulation::default(), c0, |c| {
        let data = field(7, 100_000);
        if c.rank() == 0 {
            c.send(&data, 1, 11).unwrap();
            assert!(c.pipeline_chunks() >= 6, "chunks: {}", c.pipeline_chunks());
            0.0
        } else {
            let mut out = vec![0.0f32; data.len()];
            c.recv(&mut out, 0, 11).unwrap();
            let (lo, hi) = data.iter().fold((f64::MAX, f64::MIN), |(lo, hi), &v| {
                (lo.min(v as f64), hi.max(v as f64))
            });
            max_err(&out, &data) / (1e-4 * (hi - lo))
        }
    });
    assert!(got[1] <= 1.0, "error/bound = {}", got[1]);
}

#[test]
fn allgather_and_bcast_hold_the_bound() {
    for p in 1..=4 {
        let got = on_ranks(
            p,
            LinkEmulation::default(),
            cfg(ALWAYS, ErrorBound::Abs(1e-3)),
            |c| {
                let (r, p) = (c.rank(), c.size());
                let n = 10_000;
                let mut all = vec![0.0f32; n * p];
                c.allgather(&field(r, n), &mut all).unwrap();
                let gather_err = (0..p)
                    .map(|k| max_err(&all[k * n..(k + 1) * n], &field(k, n)))
                    .fold(0.0, f64::max);
                let mut b = if r == p - 1 {
                    field(99, n)
                } else {
                    vec![0.0; n]
                };
                c.bcast(&mut b, p - 1).unwrap();
                (gather_err, max_err(&b, &field(99, n)), b)
            },
        );
        for (g, b, v) in &got {
            assert!(*g <= 1e-3 && *b <= 1e-3, "p={p}: {g} {b}");
            assert_eq!(v, &got[0].2, "p={p}: ranks disagree after bcast");
        }
    }
}

#[test]
fn raw_reduce_scatter_is_exact_on_integer_data_for_every_rank_count() {
    // small integers: every partial sum is exact in f32, so the ring's result must equal the
    // sum exactly, whatever the order of the additions (uneven segments, one-value segments)
    for p in 1..=5 {
        for n in [1usize, 7, 30_001] {
            let ints = |r: usize| -> Vec<f32> {
                (0..n)
                    .map(|i| ((i * 7 + r * 13) % 101) as f32 - 50.0)
                    .collect()
            };
            let got = on_ranks(
                p,
                LinkEmulation::default(),
                cfg(Policy::Never, ErrorBound::Abs(1e-3)),
                |c| {
                    let (r, p) = (c.rank(), c.size());
                    let seg = partition(n, p)[r].clone();
                    let mut part = vec![f32::NAN; seg.len()];
                    let st = c.reduce_scatter(&ints(r), &mut part).unwrap();
                    (part, seg, st.decision)
                },
            );
            let inputs: Vec<Vec<f32>> = (0..p).map(ints).collect();
            for (part, seg, decision) in &got {
                let want: Vec<f32> = seg
                    .clone()
                    .map(|i| inputs.iter().map(|x| x[i]).sum())
                    .collect();
                assert_eq!(part, &want, "p={p} n={n}");
                assert_eq!(*decision, Decision::Raw, "p={p} n={n}");
            }
        }
    }
}

#[test]
fn reductions_hold_the_end_to_end_bound_and_agree_bitwise() {
    for p in 1..=4 {
        for bound in [ErrorBound::Abs(1e-2), ErrorBound::Noa(1e-4)] {
            let n = 30_001;
            let got = on_ranks(p, LinkEmulation::default(), cfg(ALWAYS, bound), |c| {
                let (r, p) = (c.rank(), c.size());
                let x = field(r, n);
                let mut sum = vec![0.0f32; n];
                let s1 = c.allreduce(&x, &mut sum).unwrap();
                let mut mean = vec![0.0f32; n];
                let s2 = c.allreduce_mean(&x, &mut mean).unwrap();
                let seg = partition(n, p)[r].clone();
                let mut part = vec![0.0f32; seg.len()];
                let s3 = c.reduce_scatter(&x, &mut part).unwrap();
                let mut inplace = x.clone();
                c.allreduce_in_place(&mut inplace).unwrap();
                (sum, mean, part, seg, inplace, [s1, s2, s3])
            });
            let inputs: Vec<Vec<f32>> = (0..p).map(|r| field(r, n)).collect();
            let exact: Vec<f64> = (0..n)
                .map(|i| inputs.iter().map(|x| x[i] as f64).sum())
                .collect();
            for (sum, mean, part, seg, inplace, st) in &got {
                let e_sum = sum.iter().zip(&exact).map(|(a, b)| (*a as f64 - b).abs());
                assert!(
                    e_sum.fold(0.0, f64::max) <= st[0].bound,
                    "p={p} {bound:?} sum"
                );
                let e_mean = mean
                    .iter()
                    .zip(&exact)
                    .map(|(a, b)| (*a as f64 - b / p as f64).abs());
                assert!(
                    e_mean.fold(0.0, f64::max) <= st[1].bound,
                    "p={p} {bound:?} mean"
                );
                let e_rs = part
                    .iter()
                    .zip(&exact[seg.clone()])
                    .map(|(a, b)| (*a as f64 - b).abs());
                assert!(
                    e_rs.fold(0.0, f64::max) <= st[2].bound,
                    "p={p} {bound:?} rs"
                );
                // identical results on every rank (same algorithm, same order)
                assert_eq!(sum, &got[0].0);
                assert_eq!(inplace, &got[0].0);
                if p > 1 {
                    assert_eq!(st[0].decision, Decision::Compressed);
                }
            }
        }
    }
}

/// An allreduce's ring bounds its first quantisations with a sampled range
/// (`quant::sampled_range`) and its final segment with what the exact range leaves: values the
/// sample misses, a wider range or a magnitude that takes most of an `abs` bound in rounding
/// (the ring then starts again with the exact split), still hold the end-to-end bound.
#[test]
fn allreduces_hold_the_bound_when_the_sample_misses_the_extremes() {
    let n = 200_003; // above RANGE_SAMPLES: a value at an odd index is not sampled
    let cases: [(&str, ErrorBound, f32); 3] = [
        ("wider range", ErrorBound::Noa(1e-3), -500.0),
        ("larger magnitude, noa", ErrorBound::Noa(1e-3), 15_000.0),
        (
            "larger magnitude, abs (restart)",
            ErrorBound::Abs(1e-2),
            15_000.0,
        ),
    ];
    for p in 2..=4 {
        for (what, bound, outlier) in cases {
            // the magnitude's rounding share of the bound grows with p²: keep it below the
            // whole bound (else no split has room) but above what a sampled step leaves
            let scale = if outlier > 0.0 {
                4.0 / (p * p) as f32
            } else {
                1.0
            };
            let input = |r: usize| {
                let mut x = field(r, n);
                x[1 + 2 * r] = outlier * scale;
                x
            };
            let got = on_ranks(p, LinkEmulation::default(), cfg(ALWAYS, bound), |c| {
                let x = input(c.rank());
                let mut sum = vec![0.0f32; n];
                let s1 = c.allreduce(&x, &mut sum).unwrap();
                let mut mean = vec![0.0f32; n];
                let s2 = c.allreduce_mean(&x, &mut mean).unwrap();
                (sum, mean, s1, s2)
            });
            let inputs: Vec<Vec<f32>> = (0..p).map(input).collect();
            let exact: Vec<f64> = (0..n)
                .map(|i| inputs.iter().map(|x| x[i] as f64).sum())
                .collect();
            let (lo, hi) = inputs
                .iter()
                .flatten()
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), &v| {
                    (l.min(v as f64), h.max(v as f64))
                });
            let want = match bound {
                ErrorBound::Noa(e) => e * (hi - lo),
                ErrorBound::Abs(e) => e,
                ErrorBound::Rel(_) => unreachable!(),
            };
            for (sum, mean, s1, s2) in &got {
                // the reported bound is the exact range's, not the sample's
                assert_eq!(s1.bound, want, "p={p} {what}");
                assert_eq!(s1.decision, Decision::Compressed, "p={p} {what}");
                let e_sum = sum.iter().zip(&exact).map(|(a, b)| (*a as f64 - b).abs());
                assert!(e_sum.fold(0.0, f64::max) <= want, "p={p} {what} sum");
                let e_mean = mean
                    .iter()
                    .zip(&exact)
                    .map(|(a, b)| (*a as f64 - b / p as f64).abs());
                assert!(e_mean.fold(0.0, f64::max) <= s2.bound, "p={p} {what} mean");
                assert_eq!(sum, &got[0].0, "p={p} {what}: ranks differ");
                assert_eq!(mean, &got[0].1, "p={p} {what}: ranks differ");
            }
        }
    }
}

#[test]
fn a_count_mismatch_fails_on_every_rank() {
    let got = on_ranks(
        3,
        LinkEmulation::default(),
        cfg(ALWAYS, ErrorBound::Abs(1e-3)),
        |c| {
            let n = 1000 + usize::from(c.rank() == 1);
            let x = vec![1.0f32; n];
            let mut out = vec![0.0f32; n];
            c.allreduce(&x, &mut out)
                .map(|_| ())
                .map_err(|e| e.to_string())
        },
    );
    for r in got {
        let e = r.unwrap_err();
        assert!(e.contains("mismatch"), "{e}");
    }
}

#[test]
fn auto_compresses_over_a_slow_link_and_not_over_a_fast_one() {
    // The model's link speed is what decides: 10 MB/s makes compression pay for smooth data,
    // 10 TB/s (faster than the CPU codec) does not.
    for (bandwidth, want) in [(10e6, Decision::Compressed), (10e12, Decision::Raw)] {
        let c0 = Config::new(ErrorBound::Noa(1e-3))
            .with_policy(Policy::Auto(CodecKind::Aatrox))
            .with_calibration(Calibration::Fixed(profile(bandwidth)));
        let got = on_ranks(2, LinkEmulation::default(), c0, |c| {
            let r = c.rank();
            let send = field(r, 1 << 20);
            let mut recv = vec![0.0f32; send.len()];
            c.sendrecv(&send, 1 - r, &mut recv, 1 - r, 0)
                .unwrap()
                .decision
        });
        assert_eq!(got, vec![want; 2], "bandwidth {bandwidth}");
    }
}

#[test]
fn the_transport_is_usable_directly() {
    let g = LoopbackTransport::group(1);
    assert_eq!((g[0].rank(), g[0].size()), (0, 1));
    let mut b = b"x".to_vec();
    g[0].bcast(0, &mut b).unwrap();
    assert_eq!(b, b"x");
}

/// On a log-normal field (most values near 1, a few near e^6: the heavy tail stretches the `noa`
/// range) pfpl reaches the higher ratio, aatrox is the faster codec.
#[test]
fn auto_chooses_the_codec_per_message_by_link_speed() {
    let data = zcomm::model::choice::log_normal_field(1 << 20);
    let bound = ErrorBound::Noa(1e-2);
    let ratio =
        |c| (data.len() * 4) as f64 / zcomm::compress(&data, bound, c).unwrap().len() as f64;
    let (r_aatrox, r_pfpl) = (ratio(CodecKind::Aatrox), ratio(CodecKind::Pfpl));
    // the premise: on a heavy-tailed field pfpl reaches the higher ratio
    assert!(
        r_pfpl > 1.3 * r_aatrox,
        "pfpl {r_pfpl} vs aatrox {r_aatrox}"
    );
    // GPU-like codec speeds (bytes/s): aatrox the faster, pfpl the denser
    let speeds = [
        (CodecKind::Aatrox, 1300e9, 1900e9),
        (CodecKind::Pfpl, 500e9, 600e9),
    ];
    let with_codecs = |bandwidth: f64| {
        let mut p = profile(bandwidth);
        p.codecs = speeds
            .iter()
            .flat_map(|&(codec, compress, decompress)| {
                [1, 2].map(|dtype| {
                    zcomm::model::CodecSpeed::new(codec, dtype, compress, decompress, 10.0)
                })
            })
            .collect();
        Config::new(bound)
            .with_policy(Policy::Auto(CodecKind::Aatrox))
            .with_calibration(Calibration::Fixed(p))
    };
    for (bandwidth, want) in [(1e9, CodecKind::Pfpl), (400e9, CodecKind::Aatrox)] {
        let got = on_ranks(2, LinkEmulation::default(), with_codecs(bandwidth), |c| {
            let r = c.rank();
            let mut recv = vec![0.0f32; data.len()];
            let st = c.sendrecv(&data, 1 - r, &mut recv, 1 - r, 0).unwrap();
            assert!(max_err(&recv, &data) <= st.bound, "bound");
            (st.decision, st.codec)
        });
        assert_eq!(
            got,
            vec![(Decision::Compressed, Some(want)); 2],
            "link {bandwidth}"
        );
        // the reductions choose the same way, one choice for all ranks
        let got = on_ranks(2, LinkEmulation::default(), with_codecs(bandwidth), |c| {
            let mut out = vec![0.0f32; data.len()];
            let st = c.allreduce(&data, &mut out).unwrap();
            (st.decision, st.codec)
        });
        assert_eq!(
            got,
            vec![(Decision::Compressed, Some(want)); 2],
            "allreduce, link {bandwidth}"
        );
    }
}

#[test]
fn nonblocking_reductions_are_futures_and_match_the_blocking_calls() {
    let got = on_ranks(
        3,
        LinkEmulation::default(),
        cfg(ALWAYS, ErrorBound::Abs(1e-3)),
        |c| {
            assert!(c.has_progress_thread(), "the loopback duplicates itself");
            let x = field(c.rank(), 20_000);
            let mut blocking = vec![0.0f32; x.len()];
            c.allreduce(&x, &mut blocking).unwrap();
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            let (awaited, st) = rt.block_on(c.iallreduce(&x).unwrap()).unwrap();
            let mut req = c.iallreduce(&x).unwrap();
            while !req.test().unwrap() {
                std::thread::yield_now();
            }
            let (tested, _) = req.wait().unwrap();
            (blocking, awaited, tested, st.decision)
        },
    );
    for (blocking, awaited, tested, decision) in got {
        assert_eq!(decision, Decision::Compressed);
        assert_eq!(awaited, blocking);
        assert_eq!(tested, blocking);
    }
}

/// `Policy::Always(gpz)` on host communicators: messages are 1-D (`N x 1` particles) and hold
/// the bound in sendrecv, allgather, bcast and allreduce; under a rel bound (which gpz refuses)
/// point-to-point messages go raw, on every rank alike, instead of failing on the sender.
#[test]
fn gpz_policy_on_host_communicators() {
    let gpz = Policy::Always(CodecKind::Gpz);
    for p in [1, 3] {
        let got = on_ranks(
            p,
            LinkEmulation::default(),
            cfg(gpz, ErrorBound::Abs(1e-2)),
            |c| {
                let (r, p) = (c.rank(), c.size());
                let n = 20_000;
                let mut recv = vec![0.0f32; n];
                let st = c
                    .sendrecv(&field(r, n), (r + 1) % p, &mut recv, (r + p - 1) % p, 5)
                    .unwrap();
                let e_p2p = max_err(&recv, &field((r + p - 1) % p, n));
                let mut all = vec![0.0f32; n * p];
                c.allgather(&field(r, n), &mut all).unwrap();
                let e_gather = (0..p)
                    .map(|k| max_err(&all[k * n..(k + 1) * n], &field(k, n)))
                    .fold(0.0, f64::max);
                let mut b = if r == 0 { field(42, n) } else { vec![0.0; n] };
                c.bcast(&mut b, 0).unwrap();
                let mut sum = vec![0.0f32; n];
                let s = c.allreduce(&field(r, n), &mut sum).unwrap();
                let fields: Vec<Vec<f32>> = (0..p).map(|k| field(k, n)).collect();
                let exact: Vec<f32> = (0..n)
                    .map(|i| fields.iter().map(|f| f[i] as f64).sum::<f64>() as f32)
                    .collect();
                let e_sum = max_err(&sum, &exact);
                (
                    st,
                    e_p2p,
                    e_gather,
                    max_err(&b, &field(42, n)),
                    e_sum,
                    s.bound,
                )
            },
        );
        for (st, e_p2p, e_gather, e_b, e_sum, sum_bound) in got {
            assert!(e_p2p <= 1e-2 && e_gather <= 1e-2 && e_b <= 1e-2, "p={p}");
            // (the f32 rounding of the exact sum adds at most half an ulp of values near 400)
            assert!(e_sum <= sum_bound + 1e-4, "p={p}: {e_sum} > {sum_bound}");
            assert_eq!(st.decision, Decision::Compressed);
            assert_eq!(st.codec, Some(CodecKind::Gpz));
        }
    }
    let got = on_ranks(
        2,
        LinkEmulation::default(),
        cfg(gpz, ErrorBound::Rel(1e-3)),
        |c| {
            let r = c.rank();
            let mut recv = vec![0.0f32; 5000];
            let st = c
                .sendrecv(&field(r, 5000), 1 - r, &mut recv, 1 - r, 6)
                .unwrap();
            (st.decision, recv == field(1 - r, 5000))
        },
    );
    for (d, exact) in got {
        assert_eq!(d, Decision::Raw);
        assert!(exact);
    }
}

/// The CPU codec, except that compression fails on the rank built with `fail`.
struct FailingCompressor {
    fail: bool,
}

impl zcomm::comm::Compressor for FailingCompressor {
    fn name(&self) -> String {
        "cpu".into()
    }
    fn compress_f32(&self, d: &[f32], b: ErrorBound, c: CodecKind) -> zcomm::Result<Vec<u8>> {
        if self.fail {
            return Err(zcomm::Error::Gpu("injected compression failure".into()));
        }
        zcomm::compress(d, b, c)
    }
    fn compress_f64(&self, d: &[f64], b: ErrorBound, c: CodecKind) -> zcomm::Result<Vec<u8>> {
        zcomm::compress(d, b, c)
    }
    fn decompress_f32(&self, s: &[u8], out: &mut [f32]) -> zcomm::Result<()> {
        zcomm::decompress_into(s, out)
    }
    fn decompress_f64(&self, s: &[u8], out: &mut [f64]) -> zcomm::Result<()> {
        zcomm::decompress_into(s, out)
    }
}

#[test]
fn a_rank_whose_compression_fails_fails_every_rank_of_the_ring_without_a_hang() {
    let n = 30_000;
    for (p, bad) in [(2, 0), (3, 1), (4, 3)] {
        for reduce_scatter in [false, true] {
            let c = cfg(Policy::Always(CodecKind::Aatrox), ErrorBound::Noa(1e-3));
            let res = run_ranks(LoopbackTransport::group(p), |t| {
                let r = t.rank();
                let comp = Box::new(FailingCompressor { fail: r == bad });
                let mut comm = Communicator::with_transport(Box::new(t), comp, c.clone())?;
                let x = field(r, n);
                if reduce_scatter {
                    let mut out = vec![0f32; partition(n, p)[r].len()];
                    comm.reduce_scatter(&x, &mut out).map(|_| ())
                } else {
                    let mut out = vec![0f32; n];
                    comm.allreduce(&x, &mut out).map(|_| ())
                }
            });
            let res: Vec<zcomm::Result<()>> = res.into_iter().map(|r| r.expect("rank")).collect();
            for (r, x) in res.iter().enumerate() {
                let e = x.as_ref().expect_err("every rank fails");
                if r == bad {
                    assert!(e.to_string().contains("injected"), "rank {r}: {e}");
                } else {
                    // the others only learn of it: a kind of their own, so that a caller who
                    // ends the job can let the failing rank report the cause first
                    assert!(matches!(e, zcomm::Error::PeerFailed(_)), "rank {r}: {e:?}");
                }
            }
        }
    }
}
