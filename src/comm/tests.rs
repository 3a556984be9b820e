//! Unit tests of the host communicator over the loopback transport.

use super::*;

#[test]
fn partition_covers_everything() {
    for (n, p) in [(0, 3), (1, 4), (10, 3), (7, 7), (100, 8)] {
        let s = partition(n, p);
        assert_eq!(s.len(), p);
        assert_eq!(s[0].start, 0);
        assert_eq!(s[p - 1].end, n);
        for w in s.windows(2) {
            assert_eq!(w[0].end, w[1].start);
            assert!(w[0].len() >= w[1].len() && w[0].len() - w[1].len() <= 1);
        }
    }
}

#[test]
fn descriptors_round_trip_and_disagree() {
    let d = Desc {
        op: OP_ALLREDUCE,
        dtype: 1,
        policy: Policy::default().tag(),
        mode: 2,
        decision: 1,
        root: 3,
        bound: 1e-3,
        count: 12345,
        payload: 99,
        ratio: 7.5,
        seq: 42,
        lo: -1.5,
        hi: 2.5,
        bad: 0,
        flags: 0,
        chunk: 77,
        codec: 4,
    };
    assert_eq!(Desc::parse(&d.to_bytes()).unwrap(), d);
    assert!(Desc::parse(&[0u8; 64]).is_err());
    assert!(check_table(&[d, d, d]).is_ok());
    let e = check_table(&[d, Desc { bad: 1, ..d }]).unwrap_err();
    assert!(e.to_string().contains("rank 1 rejected"), "{e}");
    let e = check_table(&[d, Desc { count: 1, ..d }]).unwrap_err();
    assert!(e.to_string().contains("element count"), "{e}");
    let e = check_table(&[
        d,
        Desc {
            op: OP_ALLGATHER,
            ..d
        },
    ])
    .unwrap_err();
    assert!(e.to_string().contains("collective"), "{e}");
    let s = Desc { op: OP_SEND, ..d };
    let r = Desc { op: OP_RECV, ..d };
    assert!(check_pair(&s, &r).is_ok());
    assert!(check_pair(
        &s,
        &Desc {
            count: ANY_COUNT,
            ..r
        }
    )
    .is_ok());
    assert!(check_pair(&s, &Desc { dtype: 2, ..r }).is_err());
    assert!(check_pair(&s, &Desc { bound: 1e-4, ..r }).is_err());
    assert!(check_pair(&s, &s).is_err());
}

/// The raw reduce-scatter is the ring over the host link plus the host addition of every
/// received segment: its prediction charges the calibrated addition rate (and nothing for it
/// in a profile written before the rate existed).
#[test]
fn raw_reduce_scatter_prediction_charges_the_host_addition() {
    use crate::comm::transport::{run_ranks, LoopbackTransport};
    let link = Link {
        bandwidth: 4e9,
        latency: 2e-6,
    };
    let times = |host_add: f64| {
        let mut prof = Profile::new(link);
        prof.host_add = host_add;
        let cfg = Config::new(ErrorBound::Noa(1e-3)).with_calibration(Calibration::Fixed(prof));
        run_ranks(LoopbackTransport::group(4), |t| {
            let c = Communicator::with_transport(Box::new(t), Box::new(CpuCompressor), cfg.clone())
                .expect("communicator");
            c.reduce_times::<f32>(1 << 24, false, false, 1.0, CodecKind::Aatrox)
                .0
        })
        .into_iter()
        .map(|r| r.expect("rank"))
        .collect::<Vec<_>>()
    };
    let seg = (4usize << 24) as f64 / 4.0;
    let without = times(0.0);
    let with = times(8e9);
    for (a, b) in without.iter().zip(&with) {
        assert!((a - 3.0 * (2e-6 + seg / 4e9)).abs() < 1e-12, "{a}");
        assert!((b - a - 3.0 * seg / 8e9).abs() < 1e-12, "{b} vs {a}");
    }
}

/// An allreduce's mean divides by the rank count in one more host pass: over the whole result
/// on the raw path (after the transport's allreduce), over this rank's final segment in the
/// compressed ring; both predictions charge it at the calibrated pass rate, the sum's do not.
#[test]
fn allreduce_mean_prediction_charges_the_division() {
    use crate::comm::transport::{run_ranks, LoopbackTransport};
    let mut prof = Profile::new(Link {
        bandwidth: 4e9,
        latency: 2e-6,
    });
    prof.host_add = 8e9;
    let cfg = Config::new(ErrorBound::Noa(1e-3)).with_calibration(Calibration::Fixed(prof));
    let n = 1usize << 24;
    let results = run_ranks(LoopbackTransport::group(4), |t| {
        let c = Communicator::with_transport(Box::new(t), Box::new(CpuCompressor), cfg.clone())
            .expect("communicator");
        let sum = c.reduce_times::<f32>(n, true, false, 10.0, CodecKind::Aatrox);
        let mean = c.reduce_times::<f32>(n, true, true, 10.0, CodecKind::Aatrox);
        let scatter = c.reduce_times::<f32>(n, false, true, 10.0, CodecKind::Aatrox);
        let scatter_sum = c.reduce_times::<f32>(n, false, false, 10.0, CodecKind::Aatrox);
        (sum, mean, scatter, scatter_sum)
    });
    let bytes = (4 * n) as f64;
    for r in results {
        let (sum, mean, scatter, scatter_sum) = r.expect("rank");
        assert!(
            (mean.0 - sum.0 - bytes / 8e9).abs() < 1e-12,
            "{mean:?} vs {sum:?}"
        );
        assert!(
            (mean.1 - sum.1 - bytes / 4.0 / 8e9).abs() < 1e-12,
            "{mean:?} vs {sum:?}"
        );
        // a reduce-scatter has no mean
        assert_eq!(scatter, scatter_sum);
    }
}

/// `Policy::Auto` chooses among every calibrated codec, `cuszi` and `gpz` included (they have
/// GPU kernels too), with the preferred codec first, but never offers `gpz` under a `rel` bound
/// (it refuses one).
#[test]
fn auto_candidates_include_the_shape_aware_codecs_except_gpz_under_rel() {
    use crate::comm::transport::{run_ranks, LoopbackTransport};
    use crate::model::{CodecSpeed, Link, Profile};
    assert_eq!(CodecKind::WITH_GPU, CodecKind::ALL);
    for (bound, with_gpz) in [
        (ErrorBound::Noa(1e-3), true),
        (ErrorBound::Abs(1e-3), true),
        (ErrorBound::Rel(1e-3), false),
    ] {
        let mut prof = Profile::new(Link {
            bandwidth: 1e9,
            latency: 1e-6,
        });
        prof.codecs = CodecKind::WITH_GPU
            .iter()
            .map(|&c| CodecSpeed::new(c, 1, 1e9, 1e9, 4.0))
            .collect();
        let cfg = Config::new(bound).with_calibration(Calibration::Fixed(prof));
        let got = run_ranks(LoopbackTransport::group(1), |t| {
            let c = Communicator::with_transport(Box::new(t), Box::new(CpuCompressor), cfg.clone())
                .expect("communicator");
            c.candidates::<f32>(CodecKind::Cuszi)
        });
        let v = got.into_iter().next().expect("one rank").expect("rank");
        assert_eq!(v[0], CodecKind::Cuszi, "{bound}: {v:?}");
        assert_eq!(v.contains(&CodecKind::Gpz), with_gpz, "{bound}: {v:?}");
        assert_eq!(
            v.len(),
            CodecKind::ALL.len() - usize::from(!with_gpz),
            "{bound}: {v:?}"
        );
    }
}

/// A cached profile whose link no longer fits the job's (here one a million times too fast) is
/// measured again and the file replaced; every rank ends with the same new profile.
#[test]
fn a_stale_cached_profile_is_measured_again() {
    use crate::comm::transport::{run_ranks, LoopbackTransport};
    let dir = std::env::temp_dir().join(format!("zcomm-stale-{}", std::process::id()));
    let path = dir.join("profile.json");
    let mut stale = Profile::new(Link {
        bandwidth: 1e15,
        latency: 1e-12,
    });
    stale.ranks = 2;
    stale.compressor = CpuCompressor.name();
    stale.save(&path).expect("save");
    let cfg = Config::new(ErrorBound::Noa(1e-3))
        .with_calibration(Calibration::LoadOrMeasure)
        .with_profile_path(&path)
        .with_pingpong_bytes(1 << 16);
    let links = run_ranks(LoopbackTransport::group(2), |t| {
        let c = Communicator::with_transport(Box::new(t), Box::new(CpuCompressor), cfg.clone())
            .expect("communicator");
        c.profile().link
    });
    let links: Vec<Link> = links.into_iter().map(|r| r.expect("rank")).collect();
    assert!(links[0].bandwidth < 1e14, "{:?}", links[0]);
    assert_eq!(links[0].bandwidth, links[1].bandwidth);
    let saved = Profile::from_json(&std::fs::read_to_string(&path).expect("read")).expect("json");
    assert_eq!(saved.link.bandwidth, links[0].bandwidth);
    std::fs::remove_dir_all(&dir).ok();
}
