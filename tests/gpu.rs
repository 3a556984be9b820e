//! GPU codecs (blocked codecs and pfpl) vs the CPU twin: identical streams, identical
//! reconstructions, identical rejection of corrupted streams; the NVRTC test compiles every
//! kernel whenever libnvrtc can be loaded (CI installs it without a GPU).
//!
//! A custom harness (`harness = false`, libtest-mimic) with the usual command line: a test that
//! needs what this machine lacks (a CUDA device, libnvrtc) is reported *ignored* with the reason
//! ("ignored (skipped: no CUDA device)"), so that cargo's summary counts it as ignored rather than passed;
//! with the device present every test runs in full.

#[path = "common/gpu_harness.rs"]
mod gpu_harness;

use gpu_harness::{nvrtc_trial, Rng};
use libtest_mimic::{Arguments, Trial};
use zcomm::gpu::{compile, testing, GpuCodec, GpuElement};
use zcomm::{CodecKind, Element, ErrorBound};

/// A test that needs a CUDA device (ignored without one), run on a [`GpuCodec`].
fn gpu_trial(name: &str, test: fn(&mut GpuCodec)) -> Trial {
    gpu_harness::gpu_trial_of(name, "the codec", GpuCodec::new, test)
}

fn main() {
    let args = Arguments::from_args();
    let mut trials = vec![
        gpu_trial("gpu_matches_cpu_f32", gpu_matches_cpu_f32),
        gpu_trial("gpu_matches_cpu_f64", gpu_matches_cpu_f64),
        gpu_trial("gpu_matches_cpu_large", gpu_matches_cpu_large),
        gpu_trial("gpu_rejects_what_cpu_rejects", gpu_rejects_what_cpu_rejects),
        gpu_trial(
            "gpu_back_to_back_decodes_match_cpu",
            gpu_back_to_back_decodes_match_cpu,
        ),
        gpu_trial("device_api_round_trip", device_api_round_trip),
        gpu_trial("gpu_given_range_matches_cpu", gpu_given_range_matches_cpu),
        gpu_trial(
            "gpu_decompress_add_matches_cpu",
            gpu_decompress_add_matches_cpu,
        ),
        gpu_trial("gpu_group_widths_match_cpu", gpu_group_widths_match_cpu),
        gpu_trial(
            "gpu_queued_decodes_match_waiting",
            gpu_queued_decodes_match_waiting,
        ),
        gpu_trial(
            "gpu_reduce_step_matches_separate_calls",
            gpu_reduce_step_matches_separate_calls,
        ),
        gpu_trial(
            "gpu_tracked_compress_range_matches_cpu",
            range::gpu_tracked_compress_range_matches_cpu,
        ),
        gpu_trial(
            "gpu_tracked_decompress_add_range_matches_cpu",
            range::gpu_tracked_decompress_add_range_matches_cpu,
        ),
        gpu_trial(
            "gpu_device_range_accumulates",
            range::gpu_device_range_accumulates,
        ),
        gpu_trial(
            "gpu_sampled_range_matches_cpu",
            range::gpu_sampled_range_matches_cpu,
        ),
        gpu_trial(
            "gpu_compress_reconstruct_matches_reduce_step",
            range::gpu_compress_reconstruct_matches_reduce_step,
        ),
        nvrtc_trial(
            "range_tracking_kernels_compile",
            range::range_tracking_kernels_compile,
        ),
        nvrtc_trial("nvrtc_compiles_every_kernel", nvrtc_compiles_every_kernel),
        nvrtc_trial("util_source_compiles", util_source_compiles),
        nvrtc_trial("nccl_util_source_compiles", nccl_util_source_compiles),
        gpu_trial("gpu_pfpl_matches_cpu_f32", pfpl::gpu_pfpl_matches_cpu_f32),
        gpu_trial("gpu_pfpl_matches_cpu_f64", pfpl::gpu_pfpl_matches_cpu_f64),
        gpu_trial(
            "gpu_pfpl_rejects_what_cpu_rejects",
            pfpl::gpu_pfpl_rejects_what_cpu_rejects,
        ),
        gpu_trial(
            "gpu_pfpl_decompress_add_matches_cpu",
            pfpl::gpu_pfpl_decompress_add_matches_cpu,
        ),
        // tools for the GPU machine, run only when asked for (`--ignored NAME`)
        gpu_trial("gpu_pfpl_bench", pfpl::gpu_pfpl_bench).with_ignored_flag(true),
        gpu_trial("gpu_range_tracking_times", range::gpu_range_tracking_times)
            .with_ignored_flag(true),
        nvrtc_trial("pfpl_kernel_resources", pfpl::pfpl_kernel_resources).with_ignored_flag(true),
    ];
    // the file benchmark exists only with its input: `--include-ignored` without the files
    // would otherwise fail on the missing variable
    if std::env::var_os("ZCOMM_BENCH_FILES").is_some() {
        trials.push(gpu_trial("bench_files", bench_files).with_ignored_flag(true));
    }
    libtest_mimic::run(&args, trials).exit();
}

const CODECS: [CodecKind; 3] = [
    CodecKind::Aatrox,
    CodecKind::CuszpPlain,
    CodecKind::CuszpOutlier,
];

fn bounds() -> Vec<ErrorBound> {
    vec![
        ErrorBound::Abs(1e-3),
        ErrorBound::Abs(0.5),
        ErrorBound::Abs(1e-40),
        ErrorBound::Noa(1e-2),
        ErrorBound::Noa(1e-4),
        ErrorBound::Rel(1e-3),
        ErrorBound::Rel(0.25),
    ]
}

/// Named inputs of `n` values (as f64; narrowed per dtype).
fn inputs(n: usize, seed: u64) -> Vec<(String, Vec<f64>)> {
    let mut r = Rng(seed | 1);
    let mut v: Vec<(String, Vec<f64>)> = Vec::new();
    v.push((
        "smooth".into(),
        (0..n)
            .map(|i| (i as f64 * 1e-3).sin() * 100.0 + (i as f64 * 0.37e-1).cos())
            .collect(),
    ));
    v.push((
        "noise".into(),
        (0..n).map(|_| r.unit() * 2.0 - 1.0).collect(),
    ));
    v.push((
        "sparse".into(),
        (0..n)
            .map(|_| {
                if r.unit() < 0.84 {
                    0.0
                } else {
                    r.unit() * 10.0
                }
            })
            .collect(),
    ));
    v.push(("constant".into(), vec![3.25; n]));
    v.push(("zeros".into(), vec![0.0; n]));
    v.push((
        "neg-zeros".into(),
        (0..n)
            .map(|i| if i % 3 == 0 { -0.0 } else { 0.0 })
            .collect(),
    ));
    v.push((
        "huge".into(),
        (0..n)
            .map(|i| {
                if i % 2 == 0 {
                    3e38
                } else {
                    -3e38 + r.unit() * 1e37
                }
            })
            .collect(),
    ));
    v.push((
        "denormal".into(),
        (0..n)
            .map(|i| (i % 7) as f64 * 1e-310 + (i % 3) as f64 * 1e-40)
            .collect(),
    ));
    v.push((
        "specials".into(),
        (0..n)
            .map(|i| match r.next() % 11 {
                0 => f64::NAN,
                1 => f64::INFINITY,
                2 => f64::NEG_INFINITY,
                3 => -0.0,
                4 => 1e-45,
                _ => (i as f64 * 1e-2).sin(),
            })
            .collect(),
    ));
    v
}

/// Random bit patterns (NaN payloads included) straight in the dtype.
fn bit_patterns<T: Element>(n: usize, seed: u64) -> Vec<T> {
    let mut r = Rng(seed | 1);
    (0..n).map(|_| T::from_bits_u64(r.next())).collect()
}

fn check<T: GpuElement>(
    gpu: &mut GpuCodec,
    data: &[T],
    bound: ErrorBound,
    codec: CodecKind,
    label: &str,
) {
    let cpu = zcomm::compress(data, bound, codec).expect("cpu compress");
    let g = gpu
        .compress(data, bound, codec)
        .unwrap_or_else(|e| panic!("{label}: gpu compress: {e}"));
    if g != cpu {
        let first = g.iter().zip(&cpu).position(|(a, b)| a != b);
        panic!(
            "{label} {codec} {bound} {} n={}: GPU stream differs (len {} vs cpu {}, first diff at {first:?})",
            T::DTYPE,
            data.len(),
            g.len(),
            cpu.len()
        );
    }
    let back_cpu: Vec<T> = zcomm::decompress(&cpu).expect("cpu decompress");
    let back_gpu: Vec<T> = gpu
        .decompress(&cpu)
        .unwrap_or_else(|e| panic!("{label}: gpu decompress: {e}"));
    assert_eq!(back_cpu.len(), back_gpu.len());
    for (i, (a, b)) in back_cpu.iter().zip(&back_gpu).enumerate() {
        assert_eq!(
            a.to_bits_u64(),
            b.to_bits_u64(),
            "{label} {codec} {bound} {} n={}: value {i} decodes differently",
            T::DTYPE,
            data.len()
        );
    }
}

fn narrow<T: Element>(v: &[f64]) -> Vec<T> {
    v.iter().map(|&x| T::from_f64(x)).collect()
}

fn identity_sizes<T: GpuElement>(gpu: &mut GpuCodec, sizes: &[usize]) {
    for &n in sizes {
        for (name, vals) in inputs(n, n as u64 * 7 + 3) {
            let data: Vec<T> = narrow(&vals);
            for b in bounds() {
                for c in CODECS {
                    check(gpu, &data, b, c, &name);
                }
            }
        }
        let bits: Vec<T> = bit_patterns(n, n as u64 + 11);
        for b in bounds() {
            for c in CODECS {
                check(gpu, &bits, b, c, "bit-patterns");
            }
        }
    }
}

const SIZES: &[usize] = &[
    0,
    1,
    2,
    31,
    32,
    33,
    1000,
    1024,
    1025,
    32767,
    32768,
    32769,
    100_003,
    1 << 20,
];

fn gpu_matches_cpu_f32(gpu: &mut GpuCodec) {
    identity_sizes::<f32>(gpu, SIZES);
}

fn gpu_matches_cpu_f64(gpu: &mut GpuCodec) {
    identity_sizes::<f64>(gpu, SIZES);
}

fn gpu_matches_cpu_large(gpu: &mut GpuCodec) {
    // 2^28 f32 values (1 GiB) and a size that is not a multiple of 32 / 32768
    for n in [1usize << 28, (1 << 24) + 12_345] {
        let data: Vec<f32> = (0..n)
            .map(|i| ((i as f64 * 1e-5).sin() * 50.0 + (i % 1000) as f64 * 1e-3) as f32)
            .collect();
        check(
            gpu,
            &data,
            ErrorBound::Noa(1e-3),
            CodecKind::Aatrox,
            "large",
        );
        if n < 1 << 28 {
            for c in CODECS {
                check(gpu, &data, ErrorBound::Abs(1e-2), c, "large");
            }
        }
    }
}

/// Corrupted copies of the stream `s` for the rejection tests: 400 with one bit flipped at a
/// random byte (drawn from `r`), the truncations around the 96-byte header and further in, and
/// one with 4 bytes too many.
fn corrupted_copies(s: &[u8], r: &mut Rng) -> Vec<Vec<u8>> {
    let mut cases: Vec<Vec<u8>> = Vec::new();
    for _ in 0..400 {
        let mut t = s.to_vec();
        let i = (r.next() % t.len() as u64) as usize;
        t[i] ^= 1 << (r.next() % 8);
        cases.push(t);
    }
    for cut in [0, 1, 95, 96, 97, 100, s.len() / 2, s.len() - 4, s.len() - 1] {
        cases.push(s[..cut].to_vec());
    }
    let mut longer = s.to_vec();
    longer.extend_from_slice(&[0; 4]);
    cases.push(longer);
    cases
}

/// Every stream of `cases` (f32 values) is rejected by the GPU decoder exactly when the CPU
/// decoder rejects it, and decodes to the same bits when both accept; `label` (the codec or
/// bound under test) starts each failure message.
fn assert_gpu_judges_like_cpu(gpu: &mut GpuCodec, cases: &[Vec<u8>], label: &str) {
    for (k, t) in cases.iter().enumerate() {
        let cpu = zcomm::decompress::<f32>(t);
        let g = gpu.decompress::<f32>(t);
        match (&cpu, &g) {
            (Ok(a), Ok(b)) => assert!(
                a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
                "{label} case {k}: both accept, outputs differ"
            ),
            (Err(_), Err(_)) => {}
            _ => panic!(
                "{label} case {k}: cpu {:?} vs gpu {:?}",
                cpu.as_ref().err(),
                g.as_ref().err()
            ),
        }
    }
}

fn gpu_rejects_what_cpu_rejects(gpu: &mut GpuCodec) {
    let mut r = Rng(99);
    for c in CODECS {
        let data: Vec<f32> = (0..70_000)
            .map(|i| (i as f32 * 1e-3).sin() + if i % 5000 == 0 { f32::NAN } else { 0.0 })
            .collect();
        let s = zcomm::compress(&data, ErrorBound::Noa(1e-3), c).unwrap();
        let cases = corrupted_copies(&s, &mut r);
        // a good stream of this codec and mode first: every case below then takes the launch
        // that reads its parameters from the header on the device before the host has checked
        // that header (decompress_device's guess), and must still be judged like the CPU's
        let good: Vec<f32> = gpu.decompress(&s).expect("the intact stream decodes");
        assert_eq!(good.len(), data.len());
        assert_gpu_judges_like_cpu(gpu, &cases, &c.to_string());
        // and the accumulating decoder, launched the same way (a ring's accumulation)
        assert_gpu_add_judges_like_cpu(gpu, &cases, data.len(), &c.to_string());
    }
}

/// [`assert_gpu_judges_like_cpu`] for `decompress_add_to_device` onto a base of `n` values: it
/// rejects every stream the CPU rejects or decodes to another count, and otherwise adds the
/// CPU's values with one rounding each, leaving the base as it was.
fn assert_gpu_add_judges_like_cpu(gpu: &mut GpuCodec, cases: &[Vec<u8>], n: usize, label: &str) {
    let base: Vec<f32> = (0..n).map(|i| (i % 13) as f32 * 0.5 - 2.0).collect();
    let s = gpu.stream().clone();
    let d_base = s.clone_htod(&base).unwrap();
    let mut d_out = s.alloc_zeros::<f32>(n).unwrap();
    for (k, t) in cases.iter().enumerate() {
        let cpu = zcomm::decompress::<f32>(t).ok().filter(|v| v.len() == n);
        let d_t = s.clone_htod(t).unwrap();
        let g = gpu.decompress_add_to_device(
            &d_t.as_view(),
            &d_base.as_view(),
            &mut d_out.as_view_mut(),
        );
        match (&cpu, &g) {
            (Some(x), Ok(())) => {
                let got = s.clone_dtoh(&d_out).unwrap();
                let same = x
                    .iter()
                    .zip(&base)
                    .zip(&got)
                    .all(|((&v, &a), g)| (a + v).to_bits() == g.to_bits());
                assert!(same, "{label} case {k}: both accept, sums differ");
            }
            (None, Err(_)) => {}
            _ => panic!("{label} case {k}: cpu {} vs gpu {g:?}", cpu.is_some()),
        }
    }
    assert_eq!(
        s.clone_dtoh(&d_base).unwrap(),
        base,
        "{label}: the base changed"
    );
}

/// Decompressions back to back, with no other launch between them, reuse the workspace their
/// kernels leave clean (no memset): streams of other chunk counts, codecs, modes and dtypes,
/// corrupted ones among them, and decompress-accumulate calls, in a fixed shuffled order twice.
/// Every output must still equal the CPU's, every rejection the CPU's.
fn gpu_back_to_back_decodes_match_cpu(gpu: &mut GpuCodec) {
    let mut r = Rng(7);
    let mut streams: Vec<(String, Vec<u8>)> = Vec::new();
    for (k, n) in [1usize << 20, 70_000, 1000, 5 * 32768 + 7, 32768]
        .into_iter()
        .enumerate()
    {
        let data: Vec<f32> = (0..n)
            .map(|i| (i as f32 * 1e-3).sin() * (1.0 + k as f32))
            .collect();
        for c in CODECS {
            for b in [
                ErrorBound::Noa(1e-3),
                ErrorBound::Abs(1e-2),
                ErrorBound::Rel(1e-3),
            ] {
                let s = zcomm::compress(&data, b, c).unwrap();
                let mut bad = s.clone();
                let i = 96 + (r.next() % (bad.len() as u64 - 96)) as usize;
                bad[i] ^= 0x10;
                streams.push((format!("{c} {b} n={n}"), s));
                streams.push((format!("{c} {b} n={n} corrupted at {i}"), bad));
            }
        }
    }
    let f64s: Vec<f64> = (0..100_000).map(|i| (i as f64 * 1e-4).cos()).collect();
    let f64_stream = zcomm::compress(&f64s, ErrorBound::Noa(1e-4), CodecKind::Aatrox).unwrap();
    let mut order: Vec<usize> = (0..streams.len()).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, (r.next() % (i as u64 + 1)) as usize);
    }
    for round in 0..2 {
        for (j, &k) in order.iter().enumerate() {
            let (label, s) = &streams[k];
            let cpu = zcomm::decompress::<f32>(s);
            match (&cpu, gpu.decompress::<f32>(s)) {
                (Ok(a), Ok(b)) => assert!(
                    a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
                    "round {round}, {label}: outputs differ"
                ),
                (Err(_), Err(_)) => {}
                (_, g) => panic!("round {round}, {label}: cpu {cpu:?} vs gpu {g:?}"),
            }
            if j % 7 == 3 {
                // another dtype between two f32 decodes
                let back: Vec<f64> = gpu.decompress(&f64_stream).unwrap();
                assert_eq!(back, zcomm::decompress::<f64>(&f64_stream).unwrap());
            }
            if j % 11 == 5 {
                if let Ok(a) = &cpu {
                    check_add(gpu, a, ErrorBound::Noa(1e-3), CodecKind::Aatrox);
                }
            }
        }
    }
}

fn device_api_round_trip(gpu: &mut GpuCodec) {
    let data: Vec<f64> = (0..200_000)
        .map(|i| (i as f64 * 1e-4).cos() * 1e3)
        .collect();
    let s = gpu.stream().clone();
    let d_in = s.clone_htod(&data).unwrap();
    let mut d_out = s
        .alloc_zeros::<u8>(zcomm::compress_bound(data.len(), zcomm::Dtype::F64))
        .unwrap();
    let len = gpu
        .compress_device(
            &d_in.as_view(),
            ErrorBound::Abs(1e-6),
            CodecKind::Aatrox,
            &mut d_out.as_view_mut(),
        )
        .unwrap();
    let mut d_back = s.alloc_zeros::<f64>(data.len()).unwrap();
    gpu.decompress_device(&d_out.slice(0..len), &mut d_back.as_view_mut())
        .unwrap();
    let back = s.clone_dtoh(&d_back).unwrap();
    assert!(data.iter().zip(&back).all(|(a, b)| (a - b).abs() <= 1e-6));
    let host = s.clone_dtoh(&d_out.slice(0..len)).unwrap();
    assert_eq!(
        host,
        zcomm::compress(&data, ErrorBound::Abs(1e-6), CodecKind::Aatrox).unwrap()
    );
}

/// `value_range_device` equals the CPU's `quant::finite_range`, and `compress_device_with_range`
/// writes the bytes of `zcomm::compress_with_range` (own, wider, narrower and degenerate ranges;
/// every codec), which for the data's own range are `compress_device`'s.
fn given_range_matches_cpu<T: GpuElement>(gpu: &mut GpuCodec) {
    let s = gpu.stream().clone();
    for n in [0usize, 1, 33, 32769, 100_003] {
        let mut cases = inputs(n, n as u64 * 5 + 1);
        cases.push(("bit-patterns".into(), bit_patterns::<f64>(n, n as u64 + 17)));
        for (name, vals) in cases {
            let data: Vec<T> = narrow(&vals);
            // device buffers of at least one element (no zero-sized allocations), viewed as n
            let mut padded = data.clone();
            padded.resize(n.max(1), T::default());
            let d_in = s.clone_htod(&padded).unwrap();
            let view = d_in.slice(0..n);
            let mut d_out = s
                .alloc_zeros::<u8>(zcomm::compress_bound(n, T::DTYPE))
                .unwrap();
            let range = gpu.value_range_device(&view).unwrap();
            let cpu_range = zcomm::quant::finite_range(&data);
            assert_eq!(
                range.map(|(a, b)| (a.to_bits(), b.to_bits())),
                cpu_range.map(|(a, b)| (a.to_bits(), b.to_bits())),
                "{name} {} n={n}: value range",
                T::DTYPE
            );
            let own = range.unwrap_or((0.0, 0.0));
            let w = own.1 - own.0;
            let ranges = [
                own,
                (own.0 - 1.0 - w, own.1 + 2.0),
                (own.0, own.0 + w / 4.0),
                (own.1, own.1),
            ];
            for bound in [ErrorBound::Noa(1e-2), ErrorBound::Noa(1e-4)] {
                for &codec in CodecKind::WITH_GPU {
                    for (k, &r) in ranges.iter().enumerate() {
                        let label = format!("{name} {} n={n} {codec} {bound} range {k}", T::DTYPE);
                        if codec == CodecKind::Gpz {
                            // gpz measures each axis's range itself: both sides refuse one
                            let mut ov = d_out.as_view_mut();
                            let e = gpu
                                .compress_device_with_range(&view, bound, codec, r, &mut ov)
                                .unwrap_err();
                            let c = zcomm::compress_with_range(&data, bound, codec, r);
                            assert!(
                                matches!(e, zcomm::Error::InvalidArgument(_))
                                    && c.is_err_and(|c| c.to_string() == e.to_string()),
                                "{label}: {e}"
                            );
                            continue;
                        }
                        let Ok(cpu) = zcomm::compress_with_range(&data, bound, codec, r) else {
                            // (a wider range of huge values can overflow to Inf)
                            assert!(!(r.0.is_finite() && r.1.is_finite()), "{label}");
                            continue;
                        };
                        let len = gpu
                            .compress_device_with_range(
                                &view,
                                bound,
                                codec,
                                r,
                                &mut d_out.as_view_mut(),
                            )
                            .unwrap_or_else(|e| panic!("{label}: {e}"));
                        let g = s.clone_dtoh(&d_out.slice(0..len)).unwrap();
                        assert!(g == cpu, "{label}: GPU stream differs from the CPU twin");
                        if k == 0 {
                            assert_eq!(
                                cpu,
                                zcomm::compress(&data, bound, codec).unwrap(),
                                "{label}: own range differs from compress"
                            );
                            // no value-range kernel (the step of these inputs is not
                            // degenerate: no first non-zero value is needed)
                            gpu.set_kernel_timing(true).unwrap();
                            gpu.compress_device_with_range(
                                &view,
                                bound,
                                codec,
                                r,
                                &mut d_out.as_view_mut(),
                            )
                            .unwrap();
                            let t = gpu.last_kernel_times();
                            gpu.set_kernel_timing(false).unwrap();
                            if n > 1 && matches!(name.as_str(), "smooth" | "noise") {
                                assert_eq!(t.stats_ms, 0.0, "{label}: stats kernel launched");
                                assert!(t.main_ms > 0.0, "{label}: no compress kernel time");
                            }
                        }
                    }
                }
            }
            // invalid arguments are errors, not panics
            for (b, r) in [
                (ErrorBound::Abs(1e-3), own),
                (ErrorBound::Rel(1e-3), own),
                (ErrorBound::Noa(1e-3), (f64::NAN, 1.0)),
                (ErrorBound::Noa(1e-3), (0.0, f64::INFINITY)),
                (ErrorBound::Noa(1e-3), (1.0, 0.0)),
            ] {
                assert!(gpu
                    .compress_device_with_range(
                        &view,
                        b,
                        CodecKind::Aatrox,
                        r,
                        &mut d_out.as_view_mut()
                    )
                    .is_err());
            }
        }
    }
}

fn gpu_given_range_matches_cpu(gpu: &mut GpuCodec) {
    given_range_matches_cpu::<f32>(gpu);
    given_range_matches_cpu::<f64>(gpu);
}

/// `decompress_add_device` of `data`'s CPU stream onto a fixed accumulator equals the CPU twin's
/// reconstruction added with one IEEE rounding per value.
fn check_add(gpu: &mut GpuCodec, data: &[f32], b: ErrorBound, c: CodecKind) {
    if let Err(e) = testing::check_decompress_add(gpu, data, b, c, |a: f32, x: f32| a + x) {
        panic!("{e}");
    }
}

/// `decompress_add_device` (the fused decompress-and-accumulate of the NCCL reductions) adds the
/// CPU twin's reconstruction to the accumulator with one IEEE rounding per value, for every
/// blocked codec (pfpl has its own test in the library).
fn gpu_decompress_add_matches_cpu(gpu: &mut GpuCodec) {
    for (_, vals) in inputs(100_003, 91) {
        let data: Vec<f32> = narrow(&vals);
        for c in CODECS {
            for b in [
                ErrorBound::Noa(1e-3),
                ErrorBound::Abs(1e-2),
                ErrorBound::Rel(1e-3),
            ] {
                check_add(gpu, &data, b, c);
            }
        }
    }
}

/// Decodes queued without waiting (the device ring's accumulations and final decodes) give the
/// waiting calls' results, for every codec with a guessing decoder, at two bounds; stored and
/// corrupted streams among them are reported as such.
fn gpu_queued_decodes_match_waiting(gpu: &mut GpuCodec) {
    let data: Vec<f32> = (0..200_003)
        .map(|i| (i as f32 * 2e-4).sin() * 10.0)
        .collect();
    for c in [
        CodecKind::Aatrox,
        CodecKind::CuszpPlain,
        CodecKind::CuszpOutlier,
    ] {
        for b in [ErrorBound::Noa(1e-3), ErrorBound::Abs(1e-4)] {
            if let Err(e) = testing::check_queued_decodes(gpu, &data, b, c) {
                panic!("{c} {b}: {e}");
            }
        }
    }
}

/// Every layer width 0 ..= 17 through the f32 decoders (kernels/blocked.cu "Group decoding": groups
/// of four layers up to 7 bits, three up to 9, two up to 15, the per-layer loop beyond), with
/// uniform widths per chunk and with widths that vary from layer to layer and iteration to
/// iteration: integer codes (abs 0.5, step 1) drawn below 2^w. Three full chunks and a partial one.
/// The ring's reduce step on the GPU (decode onto the input, divide, compress with the
/// reconstructing kernel) writes the CPU twin's stream of the sum and leaves the CPU's decode of
/// it behind, for every blocked codec and dtype, with a partial last chunk, a divisor, an
/// incompressible sum (stored stream: the accumulator must hold the exact sum), stored incoming
/// streams and infinities; it declines (`None`) a step without reconstruction and pfpl.
fn reduce_step_cases<T: GpuElement + std::ops::Add<Output = T> + std::ops::Div<Output = T>>(
    gpu: &mut GpuCodec,
) {
    let ops = || (|a: T, b: T| a + b, |a: T, b: T| a / b);
    let n = 100_003;
    for (name, vals) in inputs(n, 17) {
        if name == "specials" {
            continue; // NaN payloads of a sum are not unique; infinities come from "huge"
        }
        let x: Vec<T> = narrow(&vals);
        let base: Vec<T> = (0..n)
            .map(|i| T::from_f64(((i % 89) as f64 - 44.0) * 0.125))
            .collect();
        for codec in CODECS {
            let incoming = zcomm::compress(&x, ErrorBound::Abs(1e-3), codec).unwrap();
            for (abs_bound, divisor, reconstruct) in [
                (1e-3, 1.0, true),
                (1e-3, 3.0, true),
                (0.25, 1.0, false),
                (1e-12, 2.0, true),
            ] {
                let fused = testing::check_reduce_step(
                    gpu,
                    &incoming,
                    &base,
                    codec,
                    abs_bound,
                    divisor,
                    reconstruct,
                    ops(),
                )
                .unwrap_or_else(|e| panic!("{name}: {e}"));
                assert_eq!(
                    fused, reconstruct,
                    "{name} {codec}: taken when it reconstructs"
                );
            }
        }
        // no reconstructing kernel: pfpl
        let incoming = zcomm::compress(&x, ErrorBound::Abs(1e-3), CodecKind::Pfpl).unwrap();
        let fused = testing::check_reduce_step(
            gpu,
            &incoming,
            &base,
            CodecKind::Pfpl,
            1e-3,
            1.0,
            true,
            ops(),
        )
        .unwrap();
        assert!(!fused, "pfpl has no reconstructing kernel");
    }
}

fn gpu_reduce_step_matches_separate_calls(gpu: &mut GpuCodec) {
    reduce_step_cases::<f32>(gpu);
    reduce_step_cases::<f64>(gpu);
}

fn gpu_group_widths_match_cpu(gpu: &mut GpuCodec) {
    let n = 3 * 32768 + 4321;
    let mut r = Rng(77);
    for top in 0..=17u32 {
        for varied in [false, true] {
            let data: Vec<f32> = (0..n)
                .map(|i| {
                    let (layer, iter) = (i / 32, i / 1024);
                    let w = if varied {
                        top.saturating_sub(((layer % 5) as u32 + iter as u32) % 4)
                    } else {
                        top
                    };
                    ((r.unit() * (1u64 << w) as f64).floor() - ((1u64 << w) / 2) as f64) as f32
                })
                .collect();
            let label = format!("widths top={top} varied={varied}");
            for c in [CodecKind::Aatrox, CodecKind::CuszpPlain] {
                check(gpu, &data, ErrorBound::Abs(0.5), c, &label);
                check_add(gpu, &data, ErrorBound::Abs(0.5), c);
            }
        }
    }
}

/// `module` compiles with NVRTC for sm_90 (uncached) and its CUBIN has every kernel it names.
fn compiles_with_every_kernel(module: compile::Module) {
    let cubin = compile::compile_cubin_with(&module.source(), "sm_90", &module.defines())
        .unwrap_or_else(|e| panic!("NVRTC compile of {}: {e}", module.name()));
    for name in module.kernel_names() {
        let needle = name.as_bytes();
        assert!(
            cubin.windows(needle.len()).any(|w| w == needle),
            "kernel {name} missing from the {} CUBIN",
            module.name()
        );
    }
}

fn nvrtc_compiles_every_kernel() {
    compiles_with_every_kernel(compile::Module::Codecs);
}

fn util_source_compiles() {
    compiles_with_every_kernel(compile::Module::Util);
}

fn nccl_util_source_compiles() {
    compiles_with_every_kernel(compile::Module::NcclUtil);
}

/// Benchmark driver for the GPU machine (no Rust there, so it ships as this test binary):
/// `ZCOMM_BENCH_FILES=path:dtype:name,... ZCOMM_BENCH_BOUNDS=noa:1e-2,... ZCOMM_BENCH_JSON=out.json
///  ./gpu --ignored bench_files --nocapture`
fn bench_files(gpu: &mut GpuCodec) {
    let files = std::env::var("ZCOMM_BENCH_FILES").expect("ZCOMM_BENCH_FILES");
    let bounds: Vec<ErrorBound> = std::env::var("ZCOMM_BENCH_BOUNDS")
        .unwrap_or_else(|_| "noa:1e-2,noa:1e-3,noa:1e-4".into())
        .split(',')
        .map(|b| b.parse().unwrap())
        .collect();
    let codecs: Vec<CodecKind> = std::env::var("ZCOMM_BENCH_CODECS")
        .unwrap_or_else(|_| "aatrox,cuszp-plain,cuszp-outlier".into())
        .split(',')
        .map(|c| c.parse().unwrap())
        .collect();
    let runs: usize = std::env::var("ZCOMM_BENCH_RUNS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(20);
    let out = std::env::var("ZCOMM_BENCH_JSON").unwrap_or_else(|_| "bench-gpu.json".into());
    let opts = zcomm::gpu::bench::BenchOptions {
        runs,
        warmup: 3,
        check_cpu: true,
    };
    let mut recs = Vec::new();
    for spec in files.split(',') {
        let mut p = spec.split(':');
        let (path, dtype, name) = (
            p.next().unwrap(),
            p.next().unwrap_or("f32"),
            p.next().unwrap_or(spec),
        );
        let bytes = std::fs::read(path).expect("read input");
        let d32: Vec<f32> = if dtype == "f64" {
            Vec::new()
        } else {
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect()
        };
        let d64: Vec<f64> = if dtype == "f64" {
            bytes
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
                .collect()
        } else {
            Vec::new()
        };
        drop(bytes);
        for &b in &bounds {
            for &c in &codecs {
                let r = if dtype == "f64" {
                    zcomm::gpu::bench::bench_device(gpu, &d64, name, b, c, opts)
                } else {
                    zcomm::gpu::bench::bench_device(gpu, &d32, name, b, c, opts)
                }
                .expect("bench");
                // noa: compression with the value range given (computed once before timing)
                let given = match (
                    r.compress_given_range_gbps,
                    r.kernel_compress_given_range_gbps,
                ) {
                    (Some(e2e), Some(k)) => format!(
                        " comp(range given) {e2e:>7.1} GB/s (kernel {k:>7.1}) identical {}",
                        r.given_range_identical == Some(true)
                    ),
                    _ => String::new(),
                };
                println!(
                    "{:<10} {:<14} {:<9} ratio {:>8.2} maxerr {:.3e} comp {:>7.1} GB/s (kernel {:>7.1}) decomp {:>7.1} GB/s (kernel {:>7.1}) identical {} {}{given}",
                    r.input, r.codec, r.error_bound, r.ratio, r.max_error, r.compress_gbps, r.kernel_compress_gbps,
                    r.decompress_gbps, r.kernel_decompress_gbps, r.bit_identical_to_cpu, r.decode_identical_to_cpu
                );
                recs.push(r);
                std::fs::write(&out, serde_json::to_string_pretty(&recs).unwrap()).unwrap();
            }
        }
    }
}

/// pfpl's GPU kernels (`kernels/pfpl.cu`) against its CPU twin: identical streams, identical
/// reconstructions, identical rejection of corrupted streams (moved here from the library's unit
/// tests so that they are counted as ignored without a device).
mod pfpl {
    use super::Rng;
    use zcomm::gpu::{GpuCodec, GpuElement};
    use zcomm::{compress, decompress, inspect, CodecKind, Element, ErrorBound};

    fn inputs<T: Element>(n: usize, seed: u64) -> Vec<(&'static str, Vec<T>)> {
        let mut r = Rng(seed | 1);
        let f = T::from_f64;
        let w = T::SIZE * 8;
        let mut adv: Vec<T> = (0..n).map(|i| f((i as f64 * 0.01).sin() * 5.0)).collect();
        let specials = [
            f(f64::INFINITY),
            f(f64::NEG_INFINITY),
            f(-0.0),
            f(3e38),
            T::from_bits_u64(1),
            T::from_bits_u64((u64::MAX >> (64 - w)) & !7), // negative NaN
            T::from_bits_u64(0x7FF << (w - 12) | 5),       // positive NaN
            f(1e-40),
        ];
        for (k, &s) in specials.iter().enumerate() {
            if n > 0 {
                adv[(k * 7919) % n] = s;
            }
        }
        vec![
            (
                "smooth",
                (0..n).map(|i| f((i as f64 * 1e-3).sin() * 10.0)).collect(),
            ),
            (
                "sparse",
                (0..n)
                    .map(|_| {
                        let u = r.unit();
                        if u < 1e-4 {
                            f(r.unit() * 2.0 - 1.0)
                        } else if u < 0.03 {
                            f((r.unit() - 0.5) * 1e-2)
                        } else {
                            f(0.0)
                        }
                    })
                    .collect(),
            ),
            ("noise", (0..n).map(|_| f((r.unit() - 0.5) * 1e4)).collect()),
            ("zeros", vec![f(0.0); n]),
            ("const", vec![f(2.5); n]),
            ("adversarial", adv),
            (
                "bits",
                (0..n)
                    .map(|_| T::from_bits_u64(r.next() >> (64 - w)))
                    .collect(),
            ),
        ]
    }

    fn bounds() -> [ErrorBound; 6] {
        [
            ErrorBound::Abs(1e-3),
            ErrorBound::Abs(1e-45),
            ErrorBound::Noa(1e-2),
            ErrorBound::Noa(1e-5),
            ErrorBound::Rel(1e-3),
            ErrorBound::Rel(1e-6),
        ]
    }

    /// The pfpl case of the top-level [`super::check`]: the same stream and reconstruction as
    /// the CPU's.
    fn check<T: GpuElement>(gpu: &mut GpuCodec, data: &[T], b: ErrorBound, label: &str) {
        super::check(gpu, data, b, CodecKind::Pfpl, label);
    }

    fn identity<T: GpuElement>(gpu: &mut GpuCodec) {
        for n in [
            0usize, 1, 2, 31, 33, 63, 65, 1000, 2047, 2048, 2049, 4095, 4096, 4097, 100_003,
        ] {
            for (name, data) in inputs::<T>(n, n as u64 * 31 + 7) {
                for b in bounds() {
                    check(gpu, &data, b, name);
                }
            }
        }
        for (name, data) in inputs::<T>(3 << 20, 5) {
            check(gpu, &data, ErrorBound::Noa(1e-3), name);
        }
    }

    pub fn gpu_pfpl_matches_cpu_f32(gpu: &mut GpuCodec) {
        identity::<f32>(gpu);
    }

    pub fn gpu_pfpl_matches_cpu_f64(gpu: &mut GpuCodec) {
        identity::<f64>(gpu);
    }

    pub fn gpu_pfpl_rejects_what_cpu_rejects(gpu: &mut GpuCodec) {
        let mut r = Rng(99);
        let data: Vec<f32> = (0..70_000)
            .map(|i| {
                if i % 5000 == 0 {
                    f32::NAN
                } else if i % 3 == 0 {
                    0.0
                } else {
                    (i as f32 * 1e-3).sin()
                }
            })
            .collect();
        for b in [ErrorBound::Noa(1e-3), ErrorBound::Rel(1e-2)] {
            let s = compress(&data, b, CodecKind::Pfpl).unwrap();
            let mut cases = super::corrupted_copies(&s, &mut r);
            // the data checksum (header offset 80) altered, header checksum recomputed: the GPU
            // decodes, then reports the mismatch
            let h = inspect(&s).unwrap();
            for delta in [1u32, 0x8000_0000] {
                let mut h2 = h;
                h2.data_checksum ^= delta;
                let mut t = s.clone();
                t[..zcomm::format::HEADER_LEN].copy_from_slice(&h2.to_bytes());
                assert!(decompress::<f32>(&t).is_err());
                cases.push(t);
            }
            super::assert_gpu_judges_like_cpu(gpu, &cases, &b.to_string());
        }
    }

    /// Fused decompress-and-accumulate (`zc_decompress_add_*_pfpl_*`, NCCL reductions): equals
    /// the CPU reconstruction added to the accumulator with one rounding, raw/empty chunks too.
    pub fn gpu_pfpl_decompress_add_matches_cpu(gpu: &mut GpuCodec) {
        fn one<T: GpuElement>(
            gpu: &mut GpuCodec,
            data: &[T],
            b: ErrorBound,
            add: impl Fn(T, T) -> T,
        ) {
            let r = zcomm::gpu::testing::check_decompress_add(gpu, data, b, CodecKind::Pfpl, add);
            if let Err(e) = r {
                panic!("{e}");
            }
        }
        for (name, data) in inputs::<f32>(100_003, 77) {
            if name == "bits" {
                continue; // NaN + x has no unique payload
            }
            for b in [ErrorBound::Noa(1e-3), ErrorBound::Rel(1e-3)] {
                one(gpu, &data, b, |a: f32, x: f32| a + x);
            }
        }
        for (name, data) in inputs::<f64>(50_001, 78) {
            if name == "bits" {
                continue;
            }
            one(gpu, &data, ErrorBound::Abs(1e-6), |a: f64, x: f64| a + x);
        }
    }

    /// ptxas resource usage of the pfpl kernels (registers, spills, shared memory), from NVRTC's
    /// verbose log; needs libnvrtc only (`cargo test --release --test gpu
    /// -- --ignored pfpl_kernel_resources`).
    pub fn pfpl_kernel_resources() {
        use cudarc::nvrtc::result as nvrtc;
        let src = std::ffi::CString::new(zcomm::gpu::compile::blocked_source()).unwrap();
        let prog = nvrtc::create_program(&src, None).unwrap();
        let mut opts: Vec<String> = zcomm::gpu::compile::NVRTC_OPTIONS
            .iter()
            .map(|s| s.to_string())
            .collect();
        opts.push("--gpu-architecture=sm_90".into());
        opts.push("--ptxas-options=-v".into());
        // SAFETY: live program, destroyed below.
        unsafe { nvrtc::compile_program(prog, &opts) }.unwrap();
        // SAFETY: live program.
        let log = unsafe { nvrtc::get_program_log(prog) }.unwrap();
        let log: String = log.iter().map(|&c| c as u8 as char).collect();
        let mut cur = String::new();
        for line in log.lines() {
            if line.contains("Compiling entry function") {
                cur = line.to_string();
            }
            if cur.contains("pfpl") && (line.contains("registers") || line.contains("spill")) {
                println!("{cur}\n  {line}");
            }
        }
        // SAFETY: created above, destroyed once.
        unsafe { nvrtc::destroy_program(prog) }.unwrap();
    }

    /// 512 MiB f32 inputs, end-to-end and kernel-only GB/s (`./gpu --ignored gpu_pfpl_bench` on the GPU
    /// machine, `gpu` being this test binary). Prints one JSON record per line.
    pub fn gpu_pfpl_bench(gpu: &mut GpuCodec) {
        let n = 1usize << 27;
        let mut r = Rng(2024);
        let smooth: Vec<f32> = (0..n)
            .map(|i| {
                let (x, y) = ((i % 4096) as f32 * 2e-3, (i / 4096) as f32 * 3e-4);
                (x * 3.1).sin() * (y * 1.7).cos() * 10.0 + (x * 0.3 + y * 0.2).cos() * 3.0
            })
            .collect();
        let gradient: Vec<f32> = (0..n)
            .map(|_| {
                let u = r.unit();
                if u < 1e-5 {
                    (r.unit() * 2.0 - 1.0) as f32
                } else if u < 0.02 {
                    ((r.unit() - 0.5) * 2e-3) as f32
                } else {
                    0.0
                }
            })
            .collect();
        let opts = zcomm::gpu::bench::BenchOptions {
            runs: 20,
            warmup: 3,
            check_cpu: true,
        };
        for (name, data) in [
            ("smooth2d_512MiB", &smooth),
            ("gradient98_512MiB", &gradient),
        ] {
            for b in [
                ErrorBound::Noa(1e-2),
                ErrorBound::Noa(1e-3),
                ErrorBound::Abs(1e-3),
            ] {
                for codec in [CodecKind::Pfpl, CodecKind::Aatrox, CodecKind::CuszpPlain] {
                    // optional filter (profiling runs): PFPL_BENCH_ONLY=substring of "input bound codec"
                    let only = std::env::var("PFPL_BENCH_ONLY").unwrap_or_default();
                    if !format!("{name} {b} {codec}").contains(&only) {
                        continue;
                    }
                    let rec =
                        zcomm::gpu::bench::bench_device(gpu, data, name, b, codec, opts).unwrap();
                    println!("{}", serde_json::to_string(&rec).unwrap());
                }
            }
        }
    }
}

/// Value ranges without a pass of their own (issue 16): the range-tracking compression and
/// decompress-and-add, the device accumulator, the sampled range, and the reconstructing
/// compression split out of the ring's reduce step.
mod range {
    use super::{inputs, narrow, Rng, CODECS};
    use zcomm::gpu::{testing, DeviceRange, GpuCodec, GpuElement};
    use zcomm::quant::{finite_range, RANGE_SAMPLES};
    use zcomm::{CodecKind, Element, ErrorBound};

    /// Values with every kind the range must get right: NaN (two payloads), +-Inf, -0.0,
    /// subnormals of f32 and f64, and finite values whose extremes sit at random positions.
    fn specials<T: Element>(n: usize, seed: u64) -> Vec<T> {
        let mut r = Rng(seed | 1);
        (0..n)
            .map(|i| {
                let v = match r.next() % 13 {
                    0 => f64::NAN,
                    1 => f64::INFINITY,
                    2 => f64::NEG_INFINITY,
                    3 => -0.0,
                    4 => 1e-45,
                    5 => -3e-310,
                    6 => (r.unit() - 0.5) * 2e3,
                    _ => (i as f64 * 1e-2).sin(),
                };
                let x = T::from_f64(v);
                // a second NaN payload
                if v.is_nan() && i % 2 == 1 {
                    T::from_bits_u64(x.to_bits_u64() | 1)
                } else {
                    x
                }
            })
            .collect()
    }

    /// The named inputs of a range check for `n` values: specials, no finite value, only zeros
    /// of both signs, one finite value among NaNs, smooth data, and random bits (NaNs and a
    /// stored stream when compressed).
    fn range_inputs<T: Element>(n: usize, seed: u64) -> Vec<(String, Vec<T>)> {
        let mut v = vec![
            ("specials".to_string(), specials::<T>(n, seed)),
            ("all-nan".into(), vec![T::from_f64(f64::NAN); n]),
            (
                "signed-zeros".into(),
                (0..n)
                    .map(|i| T::from_f64(if i % 3 == 0 { -0.0 } else { 0.0 }))
                    .collect(),
            ),
            ("neg-zeros".into(), vec![T::from_f64(-0.0); n]),
        ];
        let mut lone = vec![T::from_f64(f64::INFINITY); n];
        lone[n / 2] = T::from_f64(-2.5);
        v.push(("one-finite".into(), lone));
        let (_, smooth) = inputs(n, seed).swap_remove(0);
        v.push(("smooth".into(), narrow(&smooth)));
        let mut r = Rng(seed.wrapping_mul(31) | 1);
        v.push((
            "bits".into(),
            (0..n).map(|_| T::from_bits_u64(r.next())).collect(),
        ));
        v
    }

    const SIZES: [usize; 4] = [1, 1000, 32768 * 3 + 17, (1 << 22) + 3];

    fn tracked_compress_cases<T: GpuElement>(gpu: &mut GpuCodec) {
        for &n in &SIZES {
            for (name, data) in range_inputs::<T>(n, n as u64 + 5) {
                // the big size with its most telling inputs only (time)
                if n > 1 << 20 && !matches!(name.as_str(), "specials" | "smooth" | "all-nan") {
                    continue;
                }
                for c in CODECS {
                    for eb in [1e-3, 0.5] {
                        let tracked = testing::check_tracked_compress(gpu, &data, eb, c)
                            .unwrap_or_else(|e| panic!("{name}: {e}"));
                        assert!(tracked, "{name}: {c} {} n={n} not tracked", T::DTYPE);
                    }
                }
                if n == 1000 {
                    // not tracked: pfpl, a degenerate bound (the range stays empty)
                    let t = testing::check_tracked_compress(gpu, &data, 1e-3, CodecKind::Pfpl)
                        .unwrap_or_else(|e| panic!("{name}: {e}"));
                    assert!(!t, "{name}: pfpl tracked");
                    for c in CODECS {
                        let t = testing::check_tracked_compress(gpu, &data, 1e-320, c)
                            .unwrap_or_else(|e| panic!("{name}: {e}"));
                        assert!(!t, "{name}: {c} degenerate bound tracked");
                    }
                }
            }
        }
    }

    /// [`GpuCodec::compress_device_tracking`] writes the bytes of `compress_device` and folds
    /// the range `quant::finite_range` gives, for every blocked codec and dtype (one-pass and
    /// two-pass kernels, partial last chunks, stored streams of random bits), and declines pfpl
    /// and degenerate bounds.
    pub fn gpu_tracked_compress_range_matches_cpu(gpu: &mut GpuCodec) {
        tracked_compress_cases::<f32>(gpu);
        tracked_compress_cases::<f64>(gpu);
    }

    fn tracked_decompress_add_cases<T: GpuElement>(gpu: &mut GpuCodec) {
        for &n in &SIZES {
            let incoming: Vec<T> = {
                let (_, v) = inputs(n, 3).swap_remove(1); // noise
                narrow(&v)
            };
            let mut streams = Vec::new();
            for c in CODECS.into_iter().chain([CodecKind::Pfpl]) {
                for b in [
                    ErrorBound::Abs(1e-3),
                    ErrorBound::Noa(1e-4),
                    ErrorBound::Rel(1e-3),
                ] {
                    streams.push((
                        c,
                        b,
                        zcomm::compress(&incoming, b, c).expect("cpu compress"),
                    ));
                }
            }
            for (name, base) in range_inputs::<T>(n, n as u64 + 11) {
                if n > 1 << 20 && !matches!(name.as_str(), "specials" | "all-nan") {
                    continue;
                }
                for (c, b, stream) in &streams {
                    let tracked = testing::check_tracked_decompress_add(gpu, stream, &base)
                        .unwrap_or_else(|e| panic!("{name} {b}: {e}"));
                    // (one value compresses to a stored stream)
                    let stored = zcomm::inspect(stream).unwrap().is_stored();
                    let want = *c != CodecKind::Pfpl && !matches!(b, ErrorBound::Rel(_)) && !stored;
                    assert_eq!(tracked, want, "{name}: {c} {b} n={n} stored {stored}");
                }
                if n == 1000 {
                    // a stored stream (random bits do not compress): not tracked
                    let bits: Vec<T> = range_inputs::<T>(n, 9).pop().unwrap().1;
                    let stream = zcomm::compress(&bits, ErrorBound::Abs(1e-30), CodecKind::Aatrox)
                        .expect("cpu compress");
                    assert!(zcomm::inspect(&stream).unwrap().is_stored());
                    let t = testing::check_tracked_decompress_add(gpu, &stream, &base)
                        .unwrap_or_else(|e| panic!("{name} stored: {e}"));
                    assert!(!t, "{name}: stored stream tracked");
                }
            }
        }
    }

    /// [`GpuCodec::decompress_add_to_device_tracking`] adds exactly as
    /// `decompress_add_to_device` and folds the base's `quant::finite_range`, for the blocked
    /// codecs' abs and noa streams of both dtypes; rel, pfpl and stored streams are not tracked.
    pub fn gpu_tracked_decompress_add_range_matches_cpu(gpu: &mut GpuCodec) {
        tracked_decompress_add_cases::<f32>(gpu);
        tracked_decompress_add_cases::<f64>(gpu);
    }

    /// One accumulator over several folds (a tracked compression, a tracked decompress-and-add,
    /// add_range_device) holds the range of all their values; clear empties it; a fold of the
    /// other dtype is refused.
    pub fn gpu_device_range_accumulates(gpu: &mut GpuCodec) {
        let s = gpu.stream().clone();
        let n = 70_001;
        let a: Vec<f32> = specials(n, 1);
        let mut b: Vec<f32> = (0..n).map(|i| (i as f32 * 1e-3).cos()).collect();
        b[17] = -1e30;
        let mut c: Vec<f32> = (0..n).map(|i| i as f32).collect();
        c[n - 1] = 3e35;
        let (da, db, dc) = (
            s.clone_htod(&a).unwrap(),
            s.clone_htod(&b).unwrap(),
            s.clone_htod(&c).unwrap(),
        );
        let mut acc = DeviceRange::new(&s).unwrap();
        assert_eq!(acc.read(&s).unwrap(), None);
        let mut out = s.alloc_zeros::<u8>(96 + n * 4).unwrap();
        let (_, t) = gpu
            .compress_device_tracking(
                &da.as_view(),
                1e-2,
                CodecKind::Aatrox,
                &mut out.as_view_mut(),
                &mut acc,
            )
            .unwrap();
        assert!(t);
        assert_eq!(acc.read(&s).unwrap(), finite_range(&a));
        // (a compressed stream: a's NaNs and infinities would make it a stored one)
        let stream = zcomm::compress(&b, ErrorBound::Abs(1e-2), CodecKind::CuszpPlain).unwrap();
        assert!(!zcomm::inspect(&stream).unwrap().is_stored());
        let ds = s.clone_htod(&stream).unwrap();
        let mut dout = s.alloc_zeros::<f32>(n).unwrap();
        let t = gpu
            .decompress_add_to_device_tracking(
                &ds.as_view(),
                &db.as_view(),
                &mut dout.as_view_mut(),
                &mut acc,
            )
            .unwrap();
        assert!(t);
        gpu.add_range_device(&dc.as_view(), &mut acc).unwrap();
        let all: Vec<f32> = a.iter().chain(&b).chain(&c).copied().collect();
        assert!(testing::same_range(
            acc.read(&s).unwrap(),
            finite_range(&all)
        ));
        assert_eq!(
            acc.read(&s).unwrap(),
            Some((-1e30f32 as f64, 3e35f32 as f64))
        );
        // add_range_device alone equals finite_range, including -0.0 as +0.0
        for (name, data) in range_inputs::<f32>(n, 4) {
            acc.clear(&s).unwrap();
            let d = s.clone_htod(&data).unwrap();
            gpu.add_range_device(&d.as_view(), &mut acc).unwrap();
            let got = acc.read(&s).unwrap();
            assert!(
                testing::same_range(got, finite_range(&data)),
                "{name}: {got:?} vs {:?}",
                finite_range(&data)
            );
        }
        for (name, data) in range_inputs::<f64>(n, 4) {
            acc.clear(&s).unwrap();
            let d = s.clone_htod(&data).unwrap();
            gpu.add_range_device(&d.as_view(), &mut acc).unwrap();
            let got = acc.read(&s).unwrap();
            assert!(
                testing::same_range(got, finite_range(&data)),
                "f64 {name}: {got:?} vs {:?}",
                finite_range(&data)
            );
        }
        // the accumulator holds f64 keys now: an f32 fold is refused
        assert!(gpu.add_range_device(&da.as_view(), &mut acc).is_err());
        acc.clear(&s).unwrap();
        assert_eq!(acc.read(&s).unwrap(), None);
        gpu.add_range_device(&da.as_view(), &mut acc).unwrap();
        assert_eq!(acc.read(&s).unwrap(), finite_range(&a));
    }

    fn sampled_cases<T: GpuElement>(gpu: &mut GpuCodec) {
        let s_max = RANGE_SAMPLES;
        for n in [
            1,
            1000,
            s_max - 1,
            s_max,
            s_max + 1,
            3 * s_max + 5,
            (1 << 22) + 3,
        ] {
            for (name, mut data) in range_inputs::<T>(n, n as u64 + 21) {
                testing::check_sampled_range(gpu, &data).unwrap_or_else(|e| panic!("{name}: {e}"));
                if n >= 2 * s_max && name == "smooth" {
                    // NaN and Inf at sampled positions (the first, one inside, the last), and
                    // extremes off the sample, which the sampled range must not see
                    let stride = n / s_max;
                    data[0] = T::from_f64(f64::NAN);
                    data[stride * 7] = T::from_f64(f64::INFINITY);
                    data[n - 1] = T::from_f64(f64::NAN);
                    data[1] = T::from_f64(-1e30);
                    data[stride * 5 + 1] = T::from_f64(1e30);
                    data[stride * 3] = T::from_f64(-1000.0);
                    testing::check_sampled_range(gpu, &data)
                        .unwrap_or_else(|e| panic!("{name} with NaNs: {e}"));
                    let d = gpu.stream().clone_htod(&data).unwrap();
                    let got = gpu.sampled_range_device(&d.as_view()).unwrap().unwrap();
                    assert_eq!(got.0, -1000.0, "n={n}");
                    assert!(got.1 < 1e30, "n={n}");
                }
            }
        }
    }

    /// [`GpuCodec::sampled_range_device`] equals `quant::sampled_range` below, at and above
    /// `RANGE_SAMPLES` values, with NaNs and infinities at sampled positions and no finite one.
    pub fn gpu_sampled_range_matches_cpu(gpu: &mut GpuCodec) {
        sampled_cases::<f32>(gpu);
        sampled_cases::<f64>(gpu);
    }

    fn reconstruct_cases<T: GpuElement>(gpu: &mut GpuCodec) {
        for n in [1, 1000, 32768 * 3 + 17] {
            let (_, base) = inputs(n, 5).swap_remove(1);
            let base: Vec<T> = narrow(&base);
            for (name, x) in range_inputs::<T>(n, n as u64 + 2) {
                for c in CODECS.into_iter().chain([CodecKind::Pfpl]) {
                    for eb in [1e-3, 0.5, 1e-320] {
                        let incoming = zcomm::compress(&x, ErrorBound::Abs(1e-3), c).unwrap();
                        let r = testing::check_compress_reconstruct(gpu, &incoming, &base, c, eb)
                            .unwrap_or_else(|e| panic!("{name}: {e}"));
                        // sums that compress (NaN, Inf and random bits make raw layers and
                        // incompressible sums, which both calls store or decline; one value is
                        // always stored)
                        let compressible = n > 1
                            && matches!(name.as_str(), "smooth" | "signed-zeros" | "neg-zeros");
                        if compressible && c != CodecKind::Pfpl && eb != 1e-320 {
                            assert!(r.is_some(), "{name}: {c} {} abs:{eb} declined", T::DTYPE);
                        }
                        if c == CodecKind::Pfpl || eb == 1e-320 {
                            assert!(r.is_none(), "{name}: {c} abs:{eb} not declined");
                        }
                    }
                }
            }
        }
    }

    /// [`GpuCodec::compress_reconstruct_device`] on a sum formed by the caller writes the
    /// stream and leaves the reconstruction of `reduce_step_device`, and declines what it does
    /// (pfpl, degenerate bounds) and incompressible sums.
    pub fn gpu_compress_reconstruct_matches_reduce_step(gpu: &mut GpuCodec) {
        reconstruct_cases::<f32>(gpu);
        reconstruct_cases::<f64>(gpu);
    }

    /// The range kernels compile (NVRTC, sm_90) and are in their modules' CUBINs (the
    /// `compile::Module` name lists do not name them).
    pub fn range_tracking_kernels_compile() {
        use zcomm::gpu::compile::{self, Module};
        let has = |m: Module, names: Vec<String>| {
            let cubin = compile::compile_cubin_with(&m.source(), "sm_90", &m.defines())
                .unwrap_or_else(|e| panic!("NVRTC compile of {}: {e}", m.name()));
            for name in names {
                assert!(
                    cubin.windows(name.len()).any(|w| w == name.as_bytes()),
                    "{name} missing from the {} CUBIN",
                    m.name()
                );
            }
        };
        let mut blocked = Vec::new();
        for t in ["f32", "f64"] {
            for c in ["aatrox", "plain", "outlier"] {
                blocked.push(format!("zc_compress_track_{t}_{c}_abs"));
                blocked.push(format!("zc_decompress_add_track_{t}_{c}_abs"));
            }
        }
        has(Module::Codecs, blocked);
        let util = vec!["zu_range_sampled_f32".into(), "zu_range_sampled_f64".into()];
        has(Module::Util, util.clone());
        has(Module::NcclUtil, util);
    }

    /// Kernel times (CUDA events, median of 20) of 1 GiB of f32 (2^28 values) under abs:1e-3 with
    /// aatrox: the range pass, compression with and without tracking, decompress-and-add with and
    /// without tracking, and the sampled range. `--ignored gpu_range_tracking_times --nocapture`.
    pub fn gpu_range_tracking_times(gpu: &mut GpuCodec) {
        let n = 1usize << 28;
        let s = gpu.stream().clone();
        let x: Vec<f32> = (0..n)
            .map(|i| (i as f32 * 1e-4).sin() * 10.0 + ((i * 2_654_435_761) % 1000) as f32 * 1e-3)
            .collect();
        let dx = s.clone_htod(&x).unwrap();
        let mut dy = s.alloc_zeros::<f32>(n).unwrap();
        let mut out = s.alloc_zeros::<u8>(96 + n * 4).unwrap();
        let mut acc = DeviceRange::new(&s).unwrap();
        gpu.set_kernel_timing(true).unwrap();
        let runs = 20;
        let med = |mut v: Vec<f64>| {
            v.sort_by(|a, b| a.partial_cmp(b).unwrap());
            v[v.len() / 2]
        };
        let mut wall = |f: &mut dyn FnMut(&mut GpuCodec)| {
            let mut t = Vec::new();
            for _ in 0..runs {
                s.synchronize().unwrap();
                let t0 = std::time::Instant::now();
                f(gpu);
                s.synchronize().unwrap();
                t.push(t0.elapsed().as_secs_f64() * 1e3);
            }
            med(t)
        };
        let mut kt = Vec::new();
        let range_ms = wall(&mut |g| {
            g.value_range_device(&dx.as_view()).unwrap();
        });
        let mut main = Vec::new();
        let c_ms = wall(&mut |g| {
            g.compress_device(
                &dx.as_view(),
                ErrorBound::Abs(1e-3),
                CodecKind::Aatrox,
                &mut out.as_view_mut(),
            )
            .unwrap();
            main.push(g.last_kernel_times().main_ms as f64);
        });
        kt.push(("compress", c_ms, med(std::mem::take(&mut main))));
        let mut len = 0;
        let ct_ms = wall(&mut |g| {
            let (l, t) = g
                .compress_device_tracking(
                    &dx.as_view(),
                    1e-3,
                    CodecKind::Aatrox,
                    &mut out.as_view_mut(),
                    &mut acc,
                )
                .unwrap();
            assert!(t);
            len = l;
            main.push(g.last_kernel_times().main_ms as f64);
        });
        kt.push(("compress_tracking", ct_ms, med(std::mem::take(&mut main))));
        assert_eq!(acc.read(&s).unwrap(), finite_range(&x));
        let stream = out.slice(..len);
        let d_ms = wall(&mut |g| {
            g.decompress_add_to_device(&stream, &dx.as_view(), &mut dy.as_view_mut())
                .unwrap();
            main.push(g.last_kernel_times().main_ms as f64);
        });
        kt.push(("decompress_add_to", d_ms, med(std::mem::take(&mut main))));
        let dt_ms = wall(&mut |g| {
            assert!(g
                .decompress_add_to_device_tracking(
                    &stream,
                    &dx.as_view(),
                    &mut dy.as_view_mut(),
                    &mut acc
                )
                .unwrap());
            main.push(g.last_kernel_times().main_ms as f64);
        });
        kt.push((
            "decompress_add_to_tracking",
            dt_ms,
            med(std::mem::take(&mut main)),
        ));
        let a_ms = wall(&mut |g| {
            g.add_range_device(&dx.as_view(), &mut acc).unwrap();
        });
        let s_ms = wall(&mut |g| {
            g.sampled_range_device(&dx.as_view()).unwrap();
        });
        println!(
            "{} f32 n=2^28 aatrox abs:1e-3, ratio {:.2}",
            gpu.device_name(),
            (n * 4) as f64 / len as f64
        );
        println!("value_range_device: wall {range_ms:.3} ms");
        for (name, w, k) in kt {
            println!("{name}: wall {w:.3} ms, main kernel {k:.3} ms");
        }
        println!("add_range_device: wall {a_ms:.3} ms; sampled_range_device: wall {s_ms:.3} ms");
    }
}
