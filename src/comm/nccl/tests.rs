//! Unit tests of the NCCL layer that need no GPU (model, descriptors, outcomes).

use super::*;
use crate::model::CodecSpeed;

#[test]
fn pieces_cover_on_chunk_boundaries() {
    const C: usize = 1 << 15;
    for (n, pe) in [
        (0, 100),
        (1, 100),
        (C, C),
        (10 * C + 7, 3 * C),
        (5 * C, 1),
        (1 << 24, 1 << 22),
    ] {
        let v = pieces(n, pe);
        assert!(!v.is_empty());
        assert_eq!(v[0].start, 0);
        assert_eq!(v.last().unwrap().end, n);
        for w in v.windows(2) {
            assert_eq!(w[0].end, w[1].start);
            assert_eq!(w[0].end % C, 0, "piece boundary off a chunk boundary");
        }
    }
    assert_eq!(pieces(10 * C + 7, 3 * C).len(), 4);
}

#[test]
fn step_bound_matches_the_mpi_rule() {
    // p = 4, E = 1e-2, M = 10, f32, sum: R = 4 u (40 + 0.01), eb = (E - R) / 4
    let u = f32::UNIT_ROUNDOFF;
    let eb = reduction_step_bound(1e-2, 10.0, 4, u, 1.0, 4).unwrap();
    let r = 4.0 * u * (4.0 * 10.0 + 1e-2);
    assert!((eb - (1e-2 - r) / 4.0).abs() < 1e-18);
    // p quantizations of eb plus the rounding stay within E
    assert!(4.0 * eb + r <= 1e-2);
    // mean: partial sums are quantized with eb * p
    let m = reduction_step_bound(1e-3, 1.0, 2, u, 2.0, 2).unwrap();
    assert!(m > 0.0 && 2.0 * m < 1e-3);
    // nothing left for quantization
    assert!(reduction_step_bound(1e-9, 1e6, 8, u, 1.0, 8).is_none());
    assert!(reduction_step_bound(1e-3, f64::INFINITY, 2, u, 1.0, 2).is_none());
}

#[test]
fn descriptors_round_trip_and_pair() {
    let d = Desc {
        op: OP_SEND,
        dtype: 1,
        policy: Policy::default().tag(),
        mode: 2,
        decision: 1,
        bound: 1e-3,
        count: 77,
        ratio: 9.5,
        ..Desc::EMPTY
    };
    assert_eq!(Desc::parse(&d.to_bytes()).unwrap(), d);
    assert!(Desc::parse(&[0u8; DESC_LEN]).is_err());
    let r = Desc {
        op: OP_RECV,
        decision: 0,
        ratio: 1.0,
        ..d
    };
    assert!(check_pair(&d, &r).is_ok());
    assert!(check_pair(&r, &d).is_ok());
    assert!(check_pair(&d, &Desc { count: 78, ..r }).is_err());
    assert!(check_pair(&d, &Desc { dtype: 2, ..r }).is_err());
    assert!(check_pair(&d, &Desc { bound: 1e-4, ..r }).is_err());
    assert!(check_pair(&d, &d).is_err());
    let a = Desc {
        op: OP_ALLREDUCE,
        ..d
    };
    assert!(check_table(&[a, a]).is_ok());
    assert!(check_table(&[a, Desc { seq: 1, ..a }]).is_err());
}

#[test]
fn p2p_outcome_is_the_same_on_both_ends() {
    // the sender wanted raw: raw whatever the receiver can do
    for always in [false, true] {
        assert_eq!(p2p_outcome(0, 0, always), P2p::Raw);
        assert_eq!(p2p_outcome(0, 1, always), P2p::Raw);
        assert_eq!(p2p_outcome(1, 1, always), P2p::Compressed);
    }
    // a receiver without codec: Auto falls back to raw, Always fails (on both ends)
    assert_eq!(p2p_outcome(1, 0, false), P2p::Raw);
    assert_eq!(p2p_outcome(1, 0, true), P2p::Unavailable);
    // the "unavailable" verdict survives the descriptor round trip
    let d = Desc {
        op: OP_SEND,
        dtype: 1,
        policy: Policy::Always(CodecKind::Aatrox).tag(),
        mode: 2,
        decision: DEC_UNAVAILABLE,
        bound: 1e-3,
        count: 5,
        ..Desc::EMPTY
    };
    assert_eq!(
        Desc::parse(&d.to_bytes()).unwrap().decision,
        DEC_UNAVAILABLE
    );
    let r = Desc {
        op: OP_RECV,
        decision: 0,
        ..d
    };
    assert!(check_pair(&d, &r).is_ok());
}

#[test]
fn auto_prefers_raw_on_nvlink_and_compression_on_sockets() {
    let mut nv = Profile::direct_guess("nvlink");
    nv.allreduce = Some(Curve::linear(316e9, 20e-6));
    nv.gpu_codecs = vec![CodecSpeed::new(CodecKind::Aatrox, 1, 300e9, 400e9, 10.0)];
    let b = (1u64 << 30) as f64;
    let (raw, best) = nv.predict_allreduce(b, 2, 1e12, 8, CodecKind::Aatrox, 1, false);
    assert!(
        best > raw,
        "NVLink: even infinite ratio must not beat raw ({best} vs {raw})"
    );
    let mut so = nv.clone();
    so.allreduce = Some(Curve::linear(3.7e9, 50e-6));
    so.allgather = Some(Curve::linear(7.4e9, 50e-6));
    so.link_exchange = Curve::linear(3.7e9, 50e-6);
    let (raw, cmp) = so.predict_allreduce(b, 2, 10.0, 8, CodecKind::Aatrox, 1, false);
    assert!(
        raw / cmp > 3.0,
        "socket: ratio 10 should give > 3x ({raw} / {cmp})"
    );
    let (raw, cmp) = so.predict_allgather(b, 2, 10.0, 16, CodecKind::Aatrox, 1);
    assert!(raw / cmp > 3.0);
}

/// A socket profile with a concave p2p/allreduce ramp (mid-size messages slow), as
/// calibrated on 2xH200 with NCCL forced onto sockets (shape, not the exact numbers).
fn socket_ramp() -> Profile {
    const MIB: f64 = 1048576.0;
    let ramp = |scale: f64| {
        let pts = [
            (0.25, 0.30e-3),
            (1.0, 0.80e-3),
            (2.0, 1.25e-3),
            (4.0, 1.9e-3),
            (8.0, 3.0e-3),
            (16.0, 5.6e-3),
            (64.0, 19.6e-3),
        ]
        .iter()
        .map(|&(m, t)| (m * MIB * scale, t))
        .collect();
        Curve::from_points(pts, &Curve::linear(3.5e9, 20e-6))
    };
    let mut so = Profile::direct_guess("socket");
    so.link_exchange = ramp(1.0);
    so.allreduce = Some(ramp(1.0));
    so.allgather = Some(ramp(2.0));
    so.gpu_codecs = vec![CodecSpeed::new(CodecKind::Aatrox, 1, 300e9, 400e9, 10.0)];
    so
}

#[test]
fn predictions_use_the_piece_size_on_the_curve() {
    const MIB: f64 = 1048576.0;
    let so = socket_ramp();
    // the two-point linear fit through 1 and 64 MiB the former calibration made
    let mut lin = so.clone();
    for l in [&mut lin.link_exchange, lin.allreduce.as_mut().unwrap()] {
        *l = Curve::from_points(
            vec![(MIB, l.time(MIB)), (64.0 * MIB, l.time(64.0 * MIB))],
            l,
        );
    }
    // 64 MiB allreduce over 2 ranks at ratio 8.5: 32 MiB segments, ~3.9 MB pieces, which
    // the ramp moves slower than the line does
    let b = 64.0 * MIB;
    let (_, ramp) = so.predict_allreduce(b, 2, 8.5, 1, CodecKind::Aatrox, 1, false);
    let (_, line) = lin.predict_allreduce(b, 2, 8.5, 1, CodecKind::Aatrox, 1, false);
    assert!(ramp > 1.05 * line, "ramp {ramp} vs linear {line}");
    // exactly: two steps of one piece each, the codec and fixed costs around them
    let msg = b / 2.0 / 8.5;
    let (tc, td) = so.gpu_speed(CodecKind::Aatrox, 1);
    let (fc, fd) = so.gpu_fixed(CodecKind::Aatrox, 1);
    let comp = (b / 2.0) / tc + fc + so.piece_overhead;
    let dec = (b / 2.0) / td + fd;
    let rs = comp + dec + so.link_exchange.time(msg);
    let ag = comp + dec + so.link_exchange.time(msg);
    // uncalibrated range pass: only the agreement round of the range
    let prep = so.piece_overhead;
    assert!(
        (ramp - (prep + rs + ag)).abs() < 1e-12,
        "{ramp} vs {}",
        prep + rs + ag
    );
    // large messages (the pieces near 64 MiB) are where the two agree
    let (_, r1) = so.predict_p2p(4096.0 * MIB, 1.0, 64, CodecKind::Aatrox, 1);
    let (_, l1) = lin.predict_p2p(4096.0 * MIB, 1.0, 64, CodecKind::Aatrox, 1);
    assert!((r1 - l1).abs() / l1 < 0.01, "{r1} vs {l1}");
    // raw: the curves at the buffer size
    let (raw, _) = so.predict_allreduce(b, 2, 8.5, 1, CodecKind::Aatrox, 1, false);
    assert_eq!(raw, so.allreduce.as_ref().unwrap().time(b));
    let (raw, _) = so.predict_allgather(b, 2, 8.5, 1, CodecKind::Aatrox, 1);
    assert_eq!(raw, so.allgather.as_ref().unwrap().time(2.0 * b));
}

#[test]
fn predictions_are_monotone() {
    const MIB: f64 = 1048576.0;
    let so = socket_ramp();
    let c = CodecKind::Aatrox;
    let sizes: Vec<f64> = (0..=48)
        .map(|i| 0.25 * MIB * 2f64.powf(i as f64 / 4.0))
        .collect();
    let ratios = [1.0, 1.5, 2.0, 4.7, 8.5, 20.0, 43.0, 100.0, 1e3, 1e12];
    for p in [2usize, 3, 4, 8] {
        for &k in &[1usize, 2, 4, 16] {
            for &cr in &ratios {
                let mut prev = [0.0f64; 8];
                for &b in &sizes {
                    let (a0, a1) = so.predict_allreduce(b, p, cr, k, c, 1, false);
                    let (r0, r1) = so.predict_allreduce(b, p, cr, k, c, 1, true);
                    let (g0, g1) = so.predict_allgather(b, p, cr, k, c, 1);
                    let (p0, p1) = so.predict_p2p(b, cr, k, c, 1);
                    let now = [a0, a1, r0, r1, g0, g1, p0, p1];
                    for (j, (&x, &y)) in now.iter().zip(&prev).enumerate() {
                        assert!(x.is_finite() && x > 0.0);
                        assert!(x >= y, "p {p} k {k} ratio {cr} bytes {b}: [{j}] {x} < {y}");
                    }
                    prev = now;
                }
            }
            // in the ratio: higher ratios never predict slower
            for &b in &sizes {
                let mut prev = [f64::INFINITY; 4];
                for &cr in &ratios {
                    let now = [
                        so.predict_allreduce(b, p, cr, k, c, 1, false).1,
                        so.predict_allreduce(b, p, cr, k, c, 1, true).1,
                        so.predict_allgather(b, p, cr, k, c, 1).1,
                        so.predict_p2p(b, cr, k, c, 1).1,
                    ];
                    for (j, (&x, &y)) in now.iter().zip(&prev).enumerate() {
                        assert!(x <= y, "p {p} k {k} bytes {b} ratio {cr}: [{j}] {x} > {y}");
                    }
                    prev = now;
                }
            }
        }
    }
    // the raw times in p as well (more data per rank to move)
    let b = 256.0 * MIB;
    let (g2, _) = so.predict_allgather(b, 2, 10.0, 4, c, 1);
    let (g4, _) = so.predict_allgather(b, 4, 10.0, 4, c, 1);
    assert!(g4 > g2);
}

/// A two-rank socket profile with round numbers: pairwise 1 ms per MB each way plus 0.1 ms,
/// one way twice as fast; codec 1e11 B/s both ways, 10 us fixed per call, 1 us size
/// message; range pass 1e12 B/s, copy 5e11 B/s.
fn round_profile() -> Profile {
    let mut so = Profile::direct_guess("socket");
    so.link_exchange = Curve::linear(1e9, 1e-4);
    so.link_one_way = Curve::linear(2e9, 1e-4);
    so.gpu_codecs = vec![CodecSpeed {
        compress_overhead: 10e-6,
        decompress_overhead: 10e-6,
        ..CodecSpeed::new(CodecKind::Aatrox, 1, 1e11, 1e11, 10.0)
    }];
    so.piece_overhead = 1e-6;
    so.range_pass = 1e12;
    so.device_copy = 5e11;
    so
}

#[test]
fn exchange_shares_the_link_then_runs_one_way() {
    let so = round_profile();
    // symmetric: the pairwise curve; nothing back: the one-way curve
    assert!((so.exchange(4e6, 4e6, 1.0) - (1e-4 + 4e-3)).abs() < 1e-15);
    assert!((so.exchange(4e6, 0.0, 1.0) - (1e-4 + 2e-3)).abs() < 1e-15);
    // 4 MB one way, 1 MB back: 1 MB each way (1.1 ms), then 3 MB alone (1.5 ms)
    assert!((so.exchange(4e6, 1e6, 1.0) - 2.6e-3).abs() < 1e-15);
    // minor above major is clamped (the roles are the same)
    assert_eq!(so.exchange(1e6, 4e6, 1.0), so.exchange(1e6, 1e6, 1.0));
    // three peers: the latency once, the transfers three times
    assert!((so.exchange(4e6, 1e6, 3.0) - (1e-4 + 3.0 * 1e-3 + 3.0 * 1.5e-3)).abs() < 1e-15);
    // without a one-way curve the pairwise one stands in: the larger message decides
    let mut old = so.clone();
    old.link_one_way = Curve::default();
    assert!((old.exchange(4e6, 1e6, 1.0) - (1e-4 + 4e-3)).abs() < 1e-15);
    // the profile round-trips through its JSON (an empty one-way curve included)
    assert_eq!(Profile::from_json(&old.to_json()).unwrap(), old);
    assert_eq!(Profile::from_json(&so.to_json()).unwrap(), so);
}

/// The ring's steps are charged the fused decompress-and-add's own line and its final round
/// the plain decode's; the range pass its line (rate and fixed cost).
#[test]
fn ring_steps_use_the_fused_line_and_the_final_round_the_plain_decode() {
    let mut so = round_profile();
    so.gpu_codecs[0].decompress_add = 5e10;
    so.gpu_codecs[0].decompress_add_overhead = 20e-6;
    so.range_fixed = 30e-6;
    // 400 MB per rank over 2 ranks in one piece per segment (200 MB), ratios 50 and 100
    let wr = WireRatio {
        major: 50.0,
        minor: 100.0,
    };
    let c = CodecKind::Aatrox;
    let comp = 2e-3 + 10e-6 + 1e-6; // 200 MB at 100 GB/s, fixed, size message
    let dec = 2e-3 + 10e-6; // plain decode at 100 GB/s
    let dec_add = 4e-3 + 20e-6; // fused at 50 GB/s
    let net = 2.1e-3 + 1e-3; // 2 MB each way, then 2 MB one way
                             // an allreduce samples the range (the fixed cost: its ring's kernels measure the exact
                             // one), then the agreement round
    let prep = 30e-6 + 1e-6;
    let (_, cmp) = so.predict_allreduce(400e6, 2, wr, 1, c, 1, false);
    let want = prep + (comp + dec_add + net) + (comp + dec + net);
    assert!((cmp - want).abs() < 1e-12, "{cmp} vs {want}");
    assert!((cmp - 16.283e-3).abs() < 1e-12, "{cmp}");
    // a reduce-scatter runs the range pass: 400 MB at 1 TB/s + fixed
    let (_, rs) = so.predict_allreduce(400e6, 2, wr, 1, c, 1, true);
    assert!(
        (rs - (0.4e-3 + prep + comp + dec_add + net)).abs() < 1e-12,
        "{rs}"
    );
    // the allgather decodes both ranks' streams with the plain decode; 2 MB each way
    let (_, g) = so.predict_allgather(200e6, 2, 100.0, 1, c, 1);
    let want = 0.2e-3 + 30e-6 + (comp + 2.0 * dec) + 2.1e-3;
    assert!((g - want).abs() < 1e-12, "{g} vs {want}");
}

/// A round to all peers at once is charged as an allgather of the streams (the links carry them
/// side by side), a round to one peer as the pairwise exchange.
#[test]
fn gather_rounds_to_several_peers_follow_the_allgather_curve() {
    let mut so = round_profile();
    so.allgather = Some(Curve::linear(4e9, 50e-6));
    // three peers, streams of 4 MB (major) and 1 MB: the allgather of 4 x 4 MB
    let t = so.gather_exchange(4e6, 1e6, 3.0);
    assert!((t - (50e-6 + 16e6 / 4e9)).abs() < 1e-15, "{t}");
    assert!(t < so.exchange(4e6, 1e6, 3.0));
    // one peer: the pairwise exchange
    assert_eq!(
        so.gather_exchange(4e6, 1e6, 1.0),
        so.exchange(4e6, 1e6, 1.0)
    );
    // the allgather of 4 ranks at ratio 10 charges its round that way
    let c = CodecKind::Aatrox;
    let (_, g4) = so.predict_allgather(40e6, 4, 10.0, 1, c, 1);
    let (comp, dec) = (40e6 / 1e11 + 10e-6 + 1e-6, 40e6 / 1e11 + 10e-6);
    let want = 40e6 / 1e12 + (comp + 4.0 * dec) + (50e-6 + 16e6 / 4e9);
    assert!((g4 - want).abs() < 1e-12, "{g4} vs {want}");
}

/// Hand-computed predictions of the round-number profile.
#[test]
fn predictions_by_hand() {
    let so = round_profile();
    let c = CodecKind::Aatrox;
    // allreduce of 400 MB per rank, 2 ranks, 2 pieces of 100 MB per segment, ratios 50
    // (major) and 100: pieces of 2 MB and 1 MB on the wire
    let b = 400e6;
    let wr = WireRatio {
        major: 50.0,
        minor: 100.0,
    };
    // codec stage: compress 1 ms + 10 us + 1 us, decompress-and-add 1 ms + 10 us
    let comp: f64 = 1e-3 + 10e-6 + 1e-6;
    let dec: f64 = 1e-3 + 10e-6;
    // network stage: 1 MB each way 1.1 ms, then 1 MB one way 0.5 ms = 1.6 ms
    let net = 1.6e-3;
    // ring step: both stages for the first piece, then the slower (codec 2.021 ms) again
    let g = comp + dec;
    let rs = g + net + g.max(net);
    // allgather round: one decompression per piece (the other rank's; this rank's own values
    // are left in place by its compression)
    let g2 = comp + dec;
    let ag = g2 + net + g2.max(net);
    // preparation: the sampled range (no fixed cost in this profile), size message round
    // 1 us (the ring reads its input in place)
    let prep = 1e-6;
    let (raw, cmp) = so.predict_allreduce(b, 2, wr, 2, c, 1, false);
    assert!(
        (cmp - (prep + rs + ag)).abs() < 1e-12,
        "{cmp} vs {}",
        prep + rs + ag
    );
    assert!((cmp - 11.285e-3).abs() < 1e-12, "{cmp}");
    assert_eq!(raw, so.allreduce.as_ref().unwrap().time(b));
    // the reduce-scatter runs the range pass (0.4 ms)
    let (_, rso) = so.predict_allreduce(b, 2, wr, 2, c, 1, true);
    assert!((rso - (0.4e-3 + prep + rs)).abs() < 1e-12);
    // network-bound: ratio 10 (10 MB pieces both ways, 10.1 ms) over codec 2.021 ms
    let (_, slow) = so.predict_allreduce(b, 2, 10.0, 2, c, 1, false);
    let want = prep + (g + 2.0 * 10.1e-3) + (g2 + 2.0 * 10.1e-3);
    assert!((slow - want).abs() < 1e-12, "{slow} vs {want}");
    // allgather of 200 MB per rank over 2 ranks in 2 pieces at ratio 100: 1 MB pieces both
    // ways (1.1 ms), codec stage 1 ms + 11 us + 2 x 1.01 ms = 3.031 ms
    let (graw, gcmp) = so.predict_allgather(200e6, 2, 100.0, 2, c, 1);
    let want = 0.2e-3 + 2.0 * 3.031e-3 + 1.1e-3;
    assert!((gcmp - want).abs() < 1e-12, "{gcmp} vs {want}");
    assert_eq!(graw, so.allgather.as_ref().unwrap().time(400e6));
    // point to point of 100 MB at ratio 50 in 1 piece: one way 2 MB (1.1 ms), codec 2.021 ms
    let (praw, pcmp) = so.predict_p2p(100e6, 50.0, 1, c, 1);
    let want = 0.1e-3 + 2.021e-3 + 1.1e-3;
    assert!((pcmp - want).abs() < 1e-12, "{pcmp} vs {want}");
    assert!((praw - (1e-4 + 0.05)).abs() < 1e-12);
}

#[test]
fn a_lopsided_exchange_is_between_its_symmetric_bounds() {
    let so = round_profile();
    let c = CodecKind::Aatrox;
    let b = 1e9;
    let t = |wr: WireRatio| so.predict_allreduce(b, 2, wr, 4, c, 1, false).1;
    let lop = t(WireRatio {
        major: 20.0,
        minor: 200.0,
    });
    // both directions at the larger piece: slower; both at the smaller: faster
    assert!(lop < t(20.0.into()) && lop > t(200.0.into()));
    // ratios from the measured bytes: 4 MB and 1 MB per piece
    let w = Wire {
        sent: 5,
        critical: 4,
        minor: 1,
    };
    let r = w.ratios(20.0);
    assert_eq!((r.major, r.minor), (5.0, 20.0));
    let none = Wire::default().ratios(20.0);
    assert_eq!((none.major, none.minor), (20.0, 20.0));
}
