//! Unit tests of the staged device layer (profile arithmetic and CPU-side pieces).

use super::*;

/// A staged profile of the staging curve through `points` (bytes, D2H s, H2D s), the
/// staging line at `staging_bw`, aatrox's GPU `lines` and the device passes (copy, range,
/// scale rates); no solo rates, one-way curve or ranks-per-GPU count, as before any
/// calibration of those.
fn staged_profile(
    points: &[(f64, f64, f64)],
    staging_bw: f64,
    lines: model::CodecSpeed,
    [device_copy, range_pass, scale_pass]: [f64; 3],
) -> Profile {
    let mut curve = StagingCurve::default();
    for &(bytes, d2h, h2d) in points {
        curve.insert(StagingPoint { bytes, d2h, h2d });
    }
    Profile {
        staging: Some(Link {
            bandwidth: staging_bw,
            latency: 10e-6,
        }),
        staging_curve: curve,
        gpu_codecs: vec![lines],
        device_copy,
        range_pass,
        scale_pass,
        ..Profile::staged_guess()
    }
}

/// A calibrated-looking profile: H100-like numbers, every term set, staging by the curve,
/// aatrox's GPU lines.
fn profile() -> Profile {
    staged_profile(
        &[
            (16e6, 0.8e-3, 0.6e-3),
            (64e6, 2.4e-3, 1.3e-3),
            (1e9, 39e-3, 39e-3),
        ],
        27e9,
        model::CodecSpeed {
            compress_overhead: 0.3e-3,
            decompress_overhead: 0.2e-3,
            decompress_add: 400e9,
            decompress_add_overhead: 0.25e-3,
            ..model::CodecSpeed::new(CodecKind::Aatrox, 1, 260e9, 480e9, 1.0)
        },
        [1.2e12, 2.0e12, 1.0e12],
    )
}

/// The staged model of aatrox on `p`.
fn m(p: &Profile) -> StagedModel<'_> {
    p.staged(CodecKind::Aatrox)
}

/// [`profile`] with solo rates, a one-way link and `s` ranks per GPU: solo compression
/// 0.1 ms + 600 GB/s, solo decompression 0.05 ms + 1500 GB/s, solo copies 2 ms (D2H) /
/// 2.5 ms (H2D) per 100 MB, one-way link 16 ms per 100 MB (6.25 GB/s).
fn solo_profile(s: usize) -> Profile {
    let mut dp = profile();
    dp.ranks_per_gpu = s;
    let c = &mut dp.gpu_codecs[0];
    c.compress_solo = 600e9;
    c.compress_solo_overhead = 0.1e-3;
    c.decompress_solo = 1500e9;
    c.decompress_solo_overhead = 0.05e-3;
    dp.staging_curve_solo.insert(StagingPoint {
        bytes: 1e8,
        d2h: 2e-3,
        h2d: 2.5e-3,
    });
    dp.link_one_way = Curve::from_points(vec![(1e8, 16e-3)], &Curve::default());
    dp
}

/// The device profile of bench/results/2026-11-22-h100-mpi-staging-v5.jsonl (two ranks
/// sharing one H100; no solo rates, one-way curve or placement), as a profile: aatrox's lines
/// and the staging curve.
fn v5_profile() -> Profile {
    staged_profile(
        &[
            (1048576.0, 0.000048747, 0.000050172),
            (4194304.0, 0.000162442, 0.000163906),
            (16777216.0, 0.000618763, 0.000620922),
            (67108864.0, 0.002451287, 0.002454058),
            (268435456.0, 0.009757648, 0.009767423),
            (1073741824.0, 0.039001573, 0.039037274),
        ],
        27505553384.69587,
        model::CodecSpeed {
            compress_overhead: 0.0008994880293040292,
            decompress_overhead: 0.00033048289694749696,
            decompress_add: 539903675538.65643,
            decompress_add_overhead: 0.00034473846153846134,
            ..model::CodecSpeed::new(
                CodecKind::Aatrox,
                1,
                318533820564.29175,
                946016283949.4966,
                1.0,
            )
        },
        [624423519094.5659, 814696766606.0935, 526916148661.41425],
    )
}

fn close_terms(a: Terms, b: Terms) -> bool {
    close(a.compress, b.compress)
        && close(a.d2h, b.d2h)
        && close(a.link, b.link)
        && close(a.h2d, b.h2d)
        && close(a.decompress, b.decompress)
        && close(a.device, b.device)
}

const LINK: Link = Link {
    bandwidth: 3.8e9,
    latency: 2e-6,
};

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * a.abs().max(b.abs()).max(1e-9)
}

#[test]
fn predict_bcast_is_the_hand_formula() {
    let p0 = profile();
    let dp = m(&p0);
    let (b, r) = (1073741824.0, 19.0);
    let z = b / r;
    for (p, hops) in [(2usize, 1.0), (4, 2.0), (5, 3.0)] {
        let (raw, cmp) = dp.predict_bcast(LINK, p, b, r);
        let want_raw = dp.d2h_s(b) + hops * (2e-6 + b / 3.8e9) + dp.h2d_s(b);
        let want_cmp = (0.3e-3 + b / 260e9)
            + dp.d2h_s(z)
            + hops * (2e-6 + z / 3.8e9)
            + dp.h2d_s(z)
            + (0.2e-3 + b / 480e9);
        assert!(close(raw, want_raw), "p={p}: {raw} vs {want_raw}");
        assert!(close(cmp, want_cmp), "p={p}: {cmp} vs {want_cmp}");
        let (tr, tc) = dp.bcast_terms(LINK, p, b, r);
        assert!(close(tr.total(), raw) && close(tc.total(), cmp));
        assert!(close(tc.link, hops * (2e-6 + z / 3.8e9)) && tc.device == 0.0);
    }
    // one rank: no link hop
    assert_eq!(dp.bcast_terms(LINK, 1, b, r).1.link, 0.0);
}

#[test]
fn codec_calls_pay_their_fixed_cost_once() {
    let p0 = profile();
    let dp = m(&p0);
    let b = 1073741824.0;
    // the whole-message exchange: its scenario (one chunk) equals the stage sum, with one
    // compress + decompress call's fixed cost
    let (tr, tc) = dp.sendrecv_terms(LINK, b, 19.0);
    let pr = model::predict(&dp.scenario(LINK, b, 19.0, 1));
    assert!(close(pr.compressed_serial, tc.total()));
    assert!(close(pr.raw_serial, tr.total()));
    assert!(close(tc.compress, 0.3e-3 + b / 260e9));
    assert!(close(tc.decompress, 0.2e-3 + b / 480e9));
    // stage / restore
    let (_, s) = dp.stage_terms(b, 19.0);
    assert!(close(s.total(), 0.3e-3 + b / 260e9 + dp.d2h_s(b / 19.0)));
    let (_, r) = dp.restore_terms(b, 19.0);
    assert!(close(r.total(), dp.h2d_s(b / 19.0) + 0.2e-3 + b / 480e9));
    // allgather: one compression, p decompression calls, p-1 uploads (the own stream is
    // decoded from the device)
    let (_, g) = dp.allgather_terms(LINK, 4, b, 19.0);
    assert!(close(g.compress, dp.compress_s(b)));
    assert!(close(g.decompress, 4.0 * dp.decompress_s(b)));
    assert!(close(g.link, 3.0 * (2e-6 + b / 19.0 / 3.8e9)));
    assert!(close(g.h2d, 3.0 * dp.h2d_s(b / 19.0)));
    // the fused kernel falls back to the plain decompression when not calibrated
    let mut q = p0.clone();
    q.gpu_codecs[0].decompress_add = 0.0;
    assert_eq!(m(&q).decompress_add_s(b), m(&q).decompress_s(b));
    assert!(close(dp.decompress_add_s(b), 0.25e-3 + b / 400e9));
}

#[test]
fn bcast_uses_solo_root_one_way_link_and_late_decompression() {
    // 1.024 GB at ratio 16: the stream is 64 MB, a point of the shared curve (D2H 2.4 ms,
    // H2D 1.3 ms); the raw 1.024 GB extends the 1 GB point (39 ms per GB)
    let (b, r) = (1.024e9, 16.0);
    let compress = 0.1e-3 + 1.024e9 / 600e9; // solo line: 1.806667 ms
    let d2h_z = 2e-3 * 0.64; // solo curve at 64 MB: 1.28 ms
    let one_way_z = 16e-3 * 0.64; // 10.24 ms
    let dec_solo: f64 = 0.05e-3 + 1.024e9 / 1500e9; // 0.732667 ms
    let dec_shared = 0.2e-3 + 1.024e9 / 480e9; // 2.333333 ms
                                               // ranks sharing a GPU: the mean of the staggered and the concurrent case
    let mean = |st: f64| 0.5 * (st + st.max(dec_shared));
    for (p, hops) in [(2usize, 1.0), (4, 2.0)] {
        // two ranks per GPU, staggered: the first upload ends after 1.3 / 2 ms; the last
        // rank's call ends at max(1.3 + 0.732667, 0.65 + 2.333333) = 2.983333 ms;
        // concurrent: 2.333333 ms after the upload
        let (raw, cmp) = m(&solo_profile(2)).bcast_terms(LINK, p, b, r);
        let want = Terms {
            compress,
            d2h: d2h_z,
            link: hops * one_way_z,
            h2d: 1.3e-3,
            decompress: mean(0.65e-3 + dec_shared - 1.3e-3),
            device: 0.0,
        };
        assert!(close_terms(cmp, want), "p={p}: {cmp:?} vs {want:?}");
        assert!(close(
            cmp.decompress,
            0.5 * (1.683333333333333e-3 + dec_shared)
        ));
        let want_raw = Terms {
            d2h: 2e-3 * 10.24,
            link: hops * 16e-3 * 10.24,
            h2d: 39e-3 * 1.024,
            ..Terms::default()
        };
        assert!(close_terms(raw, want_raw), "p={p}: {raw:?} vs {want_raw:?}");
        // one rank per GPU: the root's stages and the link as above, every rank's
        // decompression at the shared rate (max(solo, shared) after its own upload)
        let (_, own) = m(&solo_profile(1)).bcast_terms(LINK, p, b, r);
        let want_own = Terms {
            decompress: dec_shared,
            ..want
        };
        assert!(close_terms(own, want_own), "p={p}: {own:?} vs {want_own:?}");
        // four ranks per GPU: the first upload after 1.3 / 4 ms
        let (_, four) = m(&solo_profile(4)).bcast_terms(LINK, p, b, r);
        assert!(close(
            four.decompress,
            mean(dec_solo.max(0.325e-3 + dec_shared - 1.3e-3))
        ));
    }
    // a slow upload: the last rank's call runs alone after it (H2D 13 ms at the stream's
    // size with the shared curve scaled up ten times)
    let mut slow = solo_profile(2);
    for q in &mut slow.staging_curve.points {
        q.h2d *= 10.0;
    }
    let (_, c) = m(&slow).bcast_terms(LINK, 2, b, r);
    assert!(close(c.h2d, 13e-3) && close(c.decompress, mean(dec_solo)));
    // one rank: no link step
    assert_eq!(m(&solo_profile(2)).bcast_terms(LINK, 1, b, r).1.link, 0.0);
}

#[test]
fn restore_decompresses_after_the_shared_upload() {
    let (b, r) = (1.024e9, 16.0);
    let dec_solo: f64 = 0.05e-3 + 1.024e9 / 1500e9;
    let dec_shared = 0.2e-3 + 1.024e9 / 480e9;
    // s > 1: the mean of the staggered and the concurrent case (module docs)
    let mean = |st: f64| 0.5 * (st + st.max(dec_shared));
    for (s, dec) in [
        (2usize, mean(dec_solo.max(0.65e-3 + dec_shared - 1.3e-3))),
        (1, dec_shared),
        (4, mean(dec_solo.max(0.325e-3 + dec_shared - 1.3e-3))),
    ] {
        let p0 = solo_profile(s);
        let dp = m(&p0);
        let (raw, cmp) = dp.restore_terms(b, r);
        assert!(close(raw.h2d, 39e-3 * 1.024) && raw.decompress == 0.0);
        assert!(close(cmp.h2d, 1.3e-3), "s={s}");
        assert!(
            close(cmp.decompress, dec),
            "s={s}: {} vs {dec}",
            cmp.decompress
        );
        assert!(cmp.decompress >= dec_solo);
        // stage_to_host: every rank compresses at once (shared); ranks sharing the GPU end
        // their calls one after another, so each copy runs alone (2 ms per 100 MB at the 64 MB
        // stream); with one rank per GPU the copies meet on the host link (shared curve)
        let (_, st) = dp.stage_terms(b, r);
        let d2h = if s > 1 { 2e-3 * 0.64 } else { 2.4e-3 };
        assert!(
            close(st.compress, dp.compress_s(b)) && close(st.d2h, d2h),
            "s={s}: {st:?}"
        );
    }
}

#[test]
fn collective_stages_keep_the_shared_rates_but_follow_the_placement() {
    // every rank works in every stage of sendrecv / allgather / the ring: compression, link
    // and upload keep the shared rates whatever the solo rates, the one-way link and the
    // placement; two ranks sharing a GPU copy their streams out alone (their compressions end
    // one after another) and decode after their uploads
    let (b, r) = (1e9, 19.0);
    let (a0, z0) = (profile(), solo_profile(2));
    let (a, z) = (m(&a0), m(&z0));
    let stream = b / r;
    let (ar, ac) = a.sendrecv_terms(LINK, b, r);
    let (zr, zc) = z.sendrecv_terms(LINK, b, r);
    assert_eq!(ar, zr, "raw exchanges copy the values, not a stream");
    assert!(close(ac.compress, zc.compress) && close(ac.link, zc.link) && close(ac.h2d, zc.h2d));
    assert!(close(ac.d2h, a.d2h_s(stream)) && close(zc.d2h, z.d2h_solo_s(stream)));
    assert!(close(zc.decompress, z.decompress_after_upload_s(b, zc.h2d)));
    let (ag_a, ag_z) = (
        a.allgather_terms(LINK, 4, b, r).1,
        z.allgather_terms(LINK, 4, b, r).1,
    );
    assert!(close(ag_a.h2d, ag_z.h2d) && close(ag_a.link, ag_z.link));
    assert!(close(ag_z.d2h, z.d2h_solo_s(stream)));
    assert!(close(
        ag_z.decompress,
        4.0 * z.decompress_after_upload_s(b, ag_z.h2d / 3.0)
    ));
    // one rank per GPU: the shared curve for the copy, max(solo, shared) for the decode
    let one0 = solo_profile(1);
    let one = m(&one0);
    assert!(close(
        one.sendrecv_terms(LINK, b, r).1.d2h,
        one.d2h_s(stream)
    ));
    let (ra, rz) = (
        a.reduce_terms(LINK, 4, b, r, Some(r), true),
        z.reduce_terms(LINK, 4, b, r, Some(r), true),
    );
    assert!(close(ra.compress, rz.compress) && close(ra.device, rz.device));
    assert!(
        rz.d2h < ra.d2h,
        "the ring's copies run alone: {rz:?} vs {ra:?}"
    );
}

#[test]
fn uncalibrated_solo_rates_fall_back_to_the_shared_ones() {
    // the device profile of the v5 records (before the solo fields)
    let p0 = v5_profile();
    let dp = m(&p0);
    assert_eq!(dp.ranks_per_gpu, 0);
    assert_eq!(dp.sharing(), 1);
    assert!(dp.staging_curve_solo.is_empty() && dp.link_one_way.is_empty());
    let (b, r) = (1073741824.0, 19.1);
    let z = b / r;
    assert_eq!(dp.compress_solo_s(b), dp.compress_s(b));
    assert_eq!(dp.decompress_solo_s(b), dp.decompress_s(b));
    assert_eq!(dp.d2h_solo_s(z), dp.d2h_s(z));
    assert_eq!(dp.h2d_solo_s(z), dp.h2d_s(z));
    let v5 = Link {
        bandwidth: 3477443380.212728,
        latency: 1.37079e-6,
    };
    assert_eq!(dp.one_way_s(v5, z), v5.latency + z / v5.bandwidth);
    // the v5 predictions: bcast 26.0 ms, restore 3.53 ms
    let (_, bc) = dp.bcast_terms(v5, 2, b, r);
    assert!((bc.total() - 26.0e-3).abs() < 0.1e-3, "{}", bc.total());
    assert!(close(bc.decompress, dp.decompress_s(b)));
    let (_, rs) = dp.restore_terms(b, 19.09);
    assert!((rs.total() - 3.53e-3).abs() < 0.01e-3, "{}", rs.total());
    // and the solo fields round-trip through the profile's JSON
    let mut q = p0.clone();
    q.ranks_per_gpu = 2;
    q.gpu_codecs[0].compress_solo = 5.6e11;
    q.link_one_way = Curve::from_points(vec![(1e8, 0.017)], &Curve::default());
    assert_eq!(Profile::from_json(&q.to_json()).unwrap(), q);
}

#[test]
fn v5_with_solo_rates_predicts_the_measured_ops() {
    // the v5 profile plus solo values as its measured stages suggest (two ranks sharing one
    // H100): a 1 GiB compression alone ≈ 1.9 ms, decompression alone ≈ 0.75 ms, copies
    // alone at twice the shared rate, one-way link ≈ 5.9 GB/s
    let mut p0 = v5_profile();
    let b = 1073741824.0;
    p0.ranks_per_gpu = 2;
    let c = &mut p0.gpu_codecs[0];
    c.compress_solo = b / 1.6e-3;
    c.compress_solo_overhead = 0.3e-3;
    c.decompress_solo = b / 0.6e-3;
    c.decompress_solo_overhead = 0.15e-3;
    for q in p0.staging_curve.points.clone() {
        p0.staging_curve_solo.insert(StagingPoint {
            d2h: q.d2h / 2.0,
            h2d: q.h2d / 2.0,
            ..q
        });
    }
    let pts = [1.0, 16.0, 64.0, 256.0].map(|mib: f64| {
        let x = mib * 1048576.0;
        (x, x / 5.9e9)
    });
    p0.link_one_way = Curve::from_points(pts.to_vec(), &Curve::default());
    let dp = m(&p0);
    let v5 = Link {
        bandwidth: 3477443380.212728,
        latency: 1.37079e-6,
    };
    let within = |pred: f64, meas: f64| ((meas - pred) / pred).abs() < 0.2;
    // measured: bcast_device 15.38 ms (raw 222.9 ms), restore_to_device 2.81 ms
    let (raw, bc) = dp.bcast_terms(v5, 2, b, 19.109);
    assert!(
        within(bc.total(), 15.38e-3),
        "bcast {:?} {}",
        bc,
        bc.total()
    );
    assert!(within(raw.total(), 222.9e-3), "raw bcast {}", raw.total());
    let (_, rs) = dp.restore_terms(b, 19.092);
    assert!(within(rs.total(), 2.81e-3), "restore {:?}", rs);
    // unchanged: stage_to_host 6.15 ms, sendrecv 25.8 ms
    assert!(within(dp.stage_terms(b, 19.092).1.total(), 6.15e-3));
    assert!(within(dp.sendrecv_terms(v5, b, 19.092).1.total(), 25.8e-3));
}

#[test]
fn predict_reduce_structure() {
    let p0 = profile();
    let dp = m(&p0);
    let b = 1e9;
    // one rank: nothing to do
    assert_eq!(dp.predict_reduce(LINK, 1, b, 10.0, false), 0.0);
    // p-1 steps of compress + D2H + link + H2D + fused decompress-add on a segment, the
    // range pass (the input is never copied; the own segment accumulates in the output)
    let (p, r) = (4usize, 8.0);
    let (seg, z) = (b / 4.0, b / 4.0 / r);
    let step = dp.compress_s(seg)
        + dp.d2h_s(z)
        + 2.0 * LINK.latency
        + z / LINK.bandwidth
        + dp.h2d_s(z)
        + dp.decompress_add_s(seg);
    let range = b / dp.range_pass;
    let rs = dp.reduce_terms(LINK, p, b, r, None, false);
    assert!(close(rs.total(), 3.0 * step + range));
    assert!(close(rs.device, range));
    assert!(close(dp.predict_reduce(LINK, p, b, r, false), rs.total()));
    // the allreduce: no copy at all, then the compressed allgather of one segment at the
    // final streams' own ratio; no range pass (a sample, the exact range measured by the
    // ring's kernels: one small call)
    let rf = 5.0;
    let ar = dp.reduce_terms(LINK, p, b, r, Some(rf), false);
    assert!(close(ar.device, dp.range_fixed));
    // (less the decode of this rank's own stream, reconstructed by its compression)
    let ag = dp.allgather_terms(LINK, p, seg, rf).1.total() - dp.decompress_s(seg);
    let ring = 3.0 * step + dp.range_fixed;
    assert!(
        close(ar.total(), ring + ag),
        "{} vs {}",
        ar.total(),
        ring + ag
    );
    // the mean adds the division of this rank's segment
    let am = dp.reduce_terms(LINK, p, b, r, Some(rf), true);
    assert!(close(am.total() - ar.total(), seg / dp.scale_pass));
    // predict_reduce: the final streams at the ring's ratio
    let same = dp.reduce_terms(LINK, p, b, r, Some(r), false).total();
    assert!(close(dp.predict_reduce(LINK, p, b, r, true), same));
    // a worse final ratio is slower; a better ratio is never slower
    assert!(ar.total() > same);
    assert!(dp.predict_reduce(LINK, p, b, 20.0, true) <= same);
    // uncalibrated device passes are not charged
    let g = Profile::staged_guess();
    assert_eq!(m(&g).reduce_terms(LINK, p, b, r, Some(r), true).device, 0.0);
}

#[test]
fn an_uneven_exchange_shares_the_link_but_is_never_faster_than_one_way() {
    let p0 = solo_profile(2);
    let dp = m(&p0);
    let (big, small) = (4e8, 2e8);
    // equal messages: the two-way calibration itself
    let even = dp.exchange_s(LINK, big, big);
    assert!(close(even, LINK.latency + big / LINK.bandwidth));
    // one direction light: the heavy one gets most of the shared capacity...
    let uneven = dp.exchange_s(LINK, big, small);
    assert!(close(
        uneven,
        LINK.latency + 0.5 * (big + small) / LINK.bandwidth
    ));
    assert_eq!(uneven, dp.exchange_s(LINK, small, big));
    // ...but never arrives sooner than it would alone (6.25 GB/s one way)
    let alone = dp.exchange_s(LINK, big, 0.0);
    assert!(close(alone, dp.one_way_s(LINK, big)) && alone > 0.5 * big / LINK.bandwidth);
    // the stages follow the sizes: the copy out of the sent, the copy in of the received
    let t = dp.exchange_terms(LINK, 1e9, big, small, (true, false));
    assert!(close(t.d2h, dp.d2h_after_compress_s(big)) && close(t.h2d, dp.h2d_s(small)));
    assert!(t.compress > 0.0 && t.decompress == 0.0);
    let t = dp.exchange_terms(LINK, 1e9, big, small, (false, false));
    assert!(close(t.d2h, dp.d2h_s(big)));
}

/// GPU-like speeds of two codecs on top of [`profile`]: aatrox the faster, pfpl the denser
/// codec (as in the model's tests of the choice), 0.1 ms per call.
fn two_codec_profile() -> Profile {
    profile().with_test_codecs()
}

/// The test codecs replace [`profile`]'s aatrox lines (the model reads one record per codec),
/// and the staged choice follows the link: pfpl on a slow one, aatrox on a fast one, for a
/// 16 MiB message at the ratios the ignored GPU test samples (aatrox 390, pfpl 810).
#[test]
fn two_codec_profile_has_one_record_per_codec_and_chooses_by_link() {
    let p = two_codec_profile();
    assert_eq!(p.gpu_codecs.len(), 2);
    assert_eq!(p.staged(CodecKind::Aatrox).c.compress, 1300e9);
    let bytes = 16.0 * 1048576.0;
    let cands = [(CodecKind::Aatrox, 390.0), (CodecKind::Pfpl, 810.0)];
    for (bandwidth, want) in [(1e8, CodecKind::Pfpl), (400e9, CodecKind::Aatrox)] {
        let link = Link {
            bandwidth,
            latency: 2e-6,
        };
        let serial = |d: &StagedModel<'_>, r: f64| model::predict(&d.scenario(link, bytes, r, 1));
        let raw = serial(&p.staged(CodecKind::Aatrox), 1.0).raw_serial;
        let ch = p.choose_staged(raw, &cands, |d, _, r| serial(d, r).compressed_serial);
        assert_eq!(ch.codec, Some(want), "{bandwidth:e} B/s: {ch:?}");
    }
}

/// A rank of a loopback group with `cfg` (the host compressor on the CPU) and a stager on GPU 0
/// with its own stream.
fn loopback_rank(
    t: crate::comm::transport::LoopbackTransport,
    cfg: &crate::comm::Config,
) -> (Communicator, DeviceStager) {
    let c = Communicator::with_transport(
        Box::new(t),
        Box::new(crate::comm::CpuCompressor),
        cfg.clone(),
    )
    .expect("communicator");
    let gpu = GpuCodec::new(0)
        .and_then(|g| g.with_own_stream())
        .expect("GPU codec");
    (c, DeviceStager::new(gpu))
}

/// What each staged device operation reported (`OpStats::codec`) on every rank of a
/// two-rank loopback group whose host link runs at `bandwidth`, under `Auto(aatrox)` at
/// `noa:1e-2` on the log-normal field (pfpl's ratio about twice aatrox's).
fn device_choices(bandwidth: f64) -> Vec<Vec<(&'static str, Option<CodecKind>, f64)>> {
    use crate::comm::transport::{run_ranks, LoopbackTransport};
    use crate::comm::{Calibration, Config};
    let data = crate::model::choice::log_normal_field(1 << 22);
    let cfg = Config::new(ErrorBound::Noa(1e-2))
        .with_policy(Policy::Auto(CodecKind::Aatrox))
        .with_calibration(Calibration::Fixed(crate::model::Profile::new(Link {
            bandwidth,
            latency: 2e-6,
        })));
    run_ranks(LoopbackTransport::group(2), |t| {
        let (mut c, mut dev) = loopback_rank(t, &cfg);
        dev.set_profile(two_codec_profile());
        let s = dev.gpu().stream().clone();
        let x = s.clone_htod(&data).expect("upload");
        let mut y = s.alloc_zeros::<f32>(data.len()).expect("alloc");
        let mut g = s.alloc_zeros::<f32>(2 * data.len()).expect("alloc");
        let peer = 1 - c.rank();
        let (xv, mut yv) = (x.as_view(), y.as_view_mut());
        let sr = c
            .sendrecv_device(&mut dev, &xv, peer, &mut yv, peer, 0)
            .expect("sendrecv_device");
        let ar = c
            .allreduce_device(&mut dev, &xv, &mut y.as_view_mut())
            .expect("allreduce_device");
        let ag = c
            .allgather_device(&mut dev, &xv, &mut g.as_view_mut())
            .expect("allgather_device");
        let mut b = s.clone_htod(&data).expect("upload");
        let bc = c
            .bcast_device(&mut dev, &mut b.as_view_mut(), 0)
            .expect("bcast_device");
        vec![
            ("sendrecv", sr.codec, sr.ratio),
            ("allreduce", ar.codec, ar.ratio),
            ("allgather", ag.codec, ag.ratio),
            ("bcast", bc.codec, bc.ratio),
        ]
    })
    .into_iter()
    .map(|r| r.expect("rank"))
    .collect()
}

/// `Policy::Auto` on the staged device operations chooses the codec per message: over a slow
/// link (100 MB/s) the denser pfpl, over a fast one (400 GB/s) the faster aatrox, the same on
/// both ranks, and reports it in `OpStats::codec`. (This 16 MiB field is smoother than a 512³
/// one: the samples give aatrox about 390 and pfpl about 810, so the link that makes the ratio
/// count is slower than for ratios 70 and 149.) Needs a CUDA device (reported ignored
/// otherwise; run with `--include-ignored` on a GPU).
#[test]
#[ignore = "skipped: no CUDA device assumed (a GPU test: run it with --include-ignored on a GPU machine)"]
fn auto_chooses_the_device_codec_by_link_speed() {
    assert!(crate::gpu::device_available(), "no CUDA device");
    for (bandwidth, want) in [(1e8, CodecKind::Pfpl), (400e9, CodecKind::Aatrox)] {
        for (rank, ops) in device_choices(bandwidth).into_iter().enumerate() {
            for (op, got, ratio) in ops {
                assert_eq!(
                    got,
                    Some(want),
                    "{op} on rank {rank}, link {bandwidth:e} B/s (ratio {ratio:.1})"
                );
            }
        }
    }
}

/// The device calibration measures every GPU codec that works (at least aatrox and pfpl, with
/// usable rates), the requested codec first, and gives every rank the same codec lines and
/// staging curve. Needs a CUDA device (reported ignored otherwise).
#[test]
#[ignore = "skipped: no CUDA device assumed (a GPU test: run it with --include-ignored on a GPU machine)"]
fn calibration_measures_every_gpu_codec() {
    use crate::comm::transport::{run_ranks, LoopbackTransport};
    use crate::comm::{Config, CpuCompressor};
    assert!(crate::gpu::device_available(), "no CUDA device");
    let profiles = run_ranks(LoopbackTransport::group(2), |t| {
        let c = Communicator::with_transport(
            Box::new(t),
            Box::new(CpuCompressor),
            Config::new(ErrorBound::Noa(1e-3)),
        )
        .expect("communicator");
        let gpu = GpuCodec::new(0)
            .and_then(|g| g.with_own_stream())
            .expect("GPU codec");
        let mut dev = DeviceStager::new(gpu);
        dev.calibrate(&c, CALIBRATION_MIN_VALUES, CodecKind::Pfpl)
            .expect("calibration")
    });
    let p: Vec<Profile> = profiles.into_iter().map(|r| r.expect("rank")).collect();
    assert_eq!(p[0].gpu_codecs, p[1].gpu_codecs);
    assert_eq!(p[0].staging_curve, p[1].staging_curve);
    let dp = &p[0];
    assert_eq!(dp.gpu_codecs[0].codec, CodecKind::Pfpl);
    assert_eq!(dp.calibrated_codec(), CodecKind::Pfpl);
    for codec in [CodecKind::Aatrox, CodecKind::Pfpl] {
        let s = dp.gpu_record(codec, 1).expect("calibrated");
        for rate in [s.compress, s.decompress, s.decompress_add, s.compress_solo] {
            assert!(rate > 1e9 && rate < 1e15, "{codec}: {s:?}");
        }
    }
}

/// A chunk-pipelined `sendrecv_device` (forced: 1 MiB chunks of a 4 MiB message, both ways) counts the
/// chunks this rank sent and received (`pipeline_chunks`: 4 + 4), reports the ratio of what it
/// sent, and delivers the partner's values within the bound. Needs a CUDA device (reported
/// ignored otherwise).
#[test]
#[ignore = "skipped: no CUDA device assumed (a GPU test: run it with --include-ignored on a GPU machine)"]
fn a_pipelined_device_exchange_counts_its_chunks_both_ways() {
    use crate::comm::transport::{run_ranks, LoopbackTransport};
    use crate::comm::Config;
    assert!(crate::gpu::device_available(), "no CUDA device");
    let n = 1 << 20;
    let field = |r: usize| -> Vec<f32> {
        (0..n)
            .map(|i| ((i as f32) * 1e-4 + r as f32).sin() * 10.0)
            .collect()
    };
    let eb = 1e-3;
    let cfg = Config::new(ErrorBound::Abs(eb))
        .with_policy(Policy::Always(CodecKind::Aatrox))
        .with_pipeline(1 << 20, 2 << 20)
        .with_device_pipeline(Some(true));
    let got = run_ranks(LoopbackTransport::group(2), |t| {
        let (mut c, mut dev) = loopback_rank(t, &cfg);
        let s = dev.gpu().stream().clone();
        let x = s.clone_htod(&field(c.rank())).expect("upload");
        let mut y = s.alloc_zeros::<f32>(n).expect("alloc");
        let peer = 1 - c.rank();
        let st = c
            .sendrecv_device(&mut dev, &x.as_view(), peer, &mut y.as_view_mut(), peer, 0)
            .expect("sendrecv_device");
        let back = s.clone_dtoh(&y).expect("download");
        (c.rank(), c.pipeline_chunks(), st.ratio, back)
    });
    for r in got {
        let (rank, chunks, ratio, back) = r.expect("rank");
        assert_eq!(chunks, 8, "rank {rank}: chunks sent and received");
        assert!(ratio > 1.0, "rank {rank}: ratio {ratio}");
        let want = field(1 - rank);
        let worst = want
            .iter()
            .zip(&back)
            .map(|(a, b)| (a - b).abs() as f64)
            .fold(0.0, f64::max);
        assert!(worst <= eb, "rank {rank}: error {worst:e} above {eb:e}");
    }
}
