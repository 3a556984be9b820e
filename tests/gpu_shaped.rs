//! `cuszi` and `gpz` behind `zcomm::gpu::GpuCodec` (the codec object of every device
//! communication path) vs the CPU twin: `compress_device` and the host-slice `compress` write
//! the bytes of `zcomm::compress` (1-D: cuszi `[n]`, gpz `n × 1`), `decompress_device` gives
//! the values of `zcomm::decompress` bit for bit (shaped streams of the CPU's `compress_nd`
//! too), the decompress-and-add calls add the CPU's values with one rounding, corrupted streams
//! are rejected exactly where the CPU rejects them, and what the codecs refuse (gpz: `rel`
//! bounds, a given range) is refused with the CPU's error.
//!
//! Custom harness (`harness = false`, libtest-mimic), as `tests/gpu.rs`: without a CUDA device
//! (or libnvrtc) the trials are reported *ignored* with the reason, never passed.

#[path = "common/gpu_harness.rs"]
mod gpu_harness;

use gpu_harness::Rng;
use libtest_mimic::{Arguments, Trial};
use zcomm::gpu::{testing, GpuCodec, GpuElement};
use zcomm::{CodecKind, Element, ErrorBound};

fn gpu_trial(name: &str, test: fn(&mut GpuCodec)) -> Trial {
    gpu_harness::gpu_trial_of(name, "the codec", GpuCodec::new, test)
}

fn main() {
    let args = Arguments::from_args();
    let trials = vec![
        gpu_trial("shaped_gpu_codec_matches_cpu_f32", matches_cpu::<f32>),
        gpu_trial("shaped_gpu_codec_matches_cpu_f64", matches_cpu::<f64>),
        gpu_trial(
            "shaped_gpu_codec_decodes_shaped_cpu_streams",
            decodes_shaped_streams,
        ),
        gpu_trial("shaped_gpu_codec_decompress_add_matches_cpu", add_matches),
        gpu_trial(
            "shaped_gpu_codec_rejects_what_cpu_rejects",
            rejects_what_cpu_rejects,
        ),
        gpu_trial("shaped_gpu_codec_refuses_what_cpu_refuses", refuses),
    ];
    libtest_mimic::run(&args, trials).exit();
}

const SHAPED: [CodecKind; 2] = [CodecKind::Cuszi, CodecKind::Gpz];

/// Tiny, odd and chunk-straddling sizes (a cuszi chunk holds 32,768 residuals, a gpz block 32
/// particles).
const SIZES: [usize; 9] = [0, 1, 2, 31, 33, 1000, 4097, 32_769, 100_003];

/// Named inputs of `n` values (as f64, narrowed per dtype).
fn inputs(n: usize, seed: u64) -> Vec<(&'static str, Vec<f64>)> {
    let mut r = Rng(seed | 1);
    let noise: Vec<f64> = (0..n).map(|_| r.unit() * 2.0 - 1.0).collect();
    vec![
        (
            "smooth",
            (0..n)
                .map(|i| (i as f64 * 1e-3).sin() * 100.0 + (i as f64 * 0.037).cos())
                .collect(),
        ),
        ("noise", noise),
        ("constant", vec![3.25; n]),
        ("zeros", vec![0.0; n]),
        (
            "specials",
            (0..n)
                .map(|i| match i % 11 {
                    0 => f64::NAN,
                    1 => f64::INFINITY,
                    2 => f64::NEG_INFINITY,
                    3 => -0.0,
                    4 => 1e-45,
                    _ => (i as f64 * 1e-2).sin(),
                })
                .collect(),
        ),
    ]
}

fn narrow<T: Element>(v: &[f64]) -> Vec<T> {
    v.iter().map(|&x| T::from_f64(x)).collect()
}

fn bounds() -> [ErrorBound; 6] {
    [
        ErrorBound::Abs(1e-3),
        ErrorBound::Abs(0.5),
        ErrorBound::Abs(1e-40),
        ErrorBound::Noa(1e-2),
        ErrorBound::Noa(1e-4),
        ErrorBound::Rel(1e-3),
    ]
}

fn same_bits<T: Element>(a: &[T], b: &[T]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x.to_bits_u64() == y.to_bits_u64())
}

/// `data` compressed on the device (`compress_device`, into a buffer of `compress_bound`
/// bytes) and decoded there, and the host-slice forms: every stream the CPU's, every decode the
/// CPU's values. Returns the CPU stream.
fn check_one<T: GpuElement>(
    gpu: &mut GpuCodec,
    data: &[T],
    bound: ErrorBound,
    codec: CodecKind,
    label: &str,
) -> Vec<u8> {
    let s = gpu.stream().clone();
    let cpu = zcomm::compress(data, bound, codec).unwrap_or_else(|e| panic!("{label}: cpu {e}"));
    // (device buffers of at least one element: no zero-sized allocations)
    let mut padded = data.to_vec();
    padded.resize(data.len().max(1), T::default());
    let d_in = s.clone_htod(&padded).unwrap();
    let mut d_out = s
        .alloc_zeros::<u8>(zcomm::compress_bound(data.len(), T::DTYPE))
        .unwrap();
    gpu.set_kernel_timing(true).unwrap();
    let len = gpu
        .compress_device(
            &d_in.slice(0..data.len()),
            bound,
            codec,
            &mut d_out.as_view_mut(),
        )
        .unwrap_or_else(|e| panic!("{label}: gpu compress_device: {e}"));
    let t = gpu.last_kernel_times();
    gpu.set_kernel_timing(false).unwrap();
    let g = s.clone_dtoh(&d_out.slice(0..len)).unwrap();
    if g != cpu {
        let first = g.iter().zip(&cpu).position(|(a, b)| a != b);
        panic!(
            "{label}: GPU stream ({} bytes) differs from the CPU's ({} bytes), first at {first:?}",
            g.len(),
            cpu.len()
        );
    }
    assert!(
        data.is_empty() || t.main_ms > 0.0,
        "{label}: no device time recorded"
    );
    let host = gpu
        .compress(data, bound, codec)
        .unwrap_or_else(|e| panic!("{label}: gpu compress: {e}"));
    assert!(host == cpu, "{label}: host-slice compress differs");
    let want: Vec<T> = zcomm::decompress(&cpu).unwrap();
    let mut d_back = s.alloc_zeros::<T>(data.len().max(1)).unwrap();
    gpu.decompress_device(&d_out.slice(0..len), &mut d_back.slice_mut(0..data.len()))
        .unwrap_or_else(|e| panic!("{label}: gpu decompress_device: {e}"));
    let back = s.clone_dtoh(&d_back.slice(0..data.len())).unwrap();
    assert!(same_bits(&back, &want), "{label}: device decode differs");
    let back: Vec<T> = gpu
        .decompress(&cpu)
        .unwrap_or_else(|e| panic!("{label}: gpu decompress: {e}"));
    assert!(
        same_bits(&back, &want),
        "{label}: host-slice decode differs"
    );
    cpu
}

fn matches_cpu<T: GpuElement>(gpu: &mut GpuCodec) {
    for n in SIZES {
        for (name, vals) in inputs(n, n as u64 * 3 + 7) {
            let data: Vec<T> = narrow(&vals);
            for bound in bounds() {
                for codec in SHAPED {
                    let label = format!("{name} {} n={n} {codec} {bound}", T::DTYPE);
                    if !codec.supports_bound(bound) {
                        continue; // (`refuses` checks the error)
                    }
                    check_one(gpu, &data, bound, codec, &label);
                }
            }
        }
    }
}

/// Streams of the CPU's `compress_nd` (cuszi 3-D and 2-D, gpz of 3 coordinates in both particle
/// orders) decoded by `GpuCodec::decompress_device`: the CPU's values.
fn decodes_shaped_streams(gpu: &mut GpuCodec) {
    let s = gpu.stream().clone();
    let field: Vec<f32> = (0..24 * 20 * 16)
        .map(|i| ((i / 320) as f32 * 0.2).sin() * ((i / 16 % 20) as f32 * 0.15).cos())
        .collect();
    let mut streams = Vec::new();
    for dims in [&[24usize, 20, 16][..], &[480, 16]] {
        for b in [ErrorBound::Noa(1e-3), ErrorBound::Abs(1e-4)] {
            streams.push(zcomm::compress_nd(&field, dims, b, CodecKind::Cuszi).unwrap());
        }
    }
    let pos: Vec<f32> = (0..3 * 5000)
        .map(|i| ((i * 7919) % 1000) as f32 * 0.01 + (i % 3) as f32)
        .collect();
    for order in [
        zcomm::codec::gpz::Order::Preserve,
        zcomm::codec::gpz::Order::Reorder,
    ] {
        let (st, _) =
            zcomm::codec::compress_particles_nd(&pos, &[5000, 3], ErrorBound::Abs(1e-3), order)
                .unwrap();
        streams.push(st);
    }
    for (k, st) in streams.iter().enumerate() {
        let want: Vec<f32> = zcomm::decompress(st).unwrap();
        let d_st = s.clone_htod(st).unwrap();
        let mut d_out = s.alloc_zeros::<f32>(want.len()).unwrap();
        gpu.decompress_device(&d_st.as_view(), &mut d_out.as_view_mut())
            .unwrap_or_else(|e| panic!("stream {k}: {e}"));
        let got = s.clone_dtoh(&d_out).unwrap();
        assert!(same_bits(&got, &want), "stream {k}: differs from the CPU");
    }
}

fn add_matches(gpu: &mut GpuCodec) {
    for n in [1usize, 33, 100_003] {
        for (name, vals) in inputs(n, 91) {
            let d32: Vec<f32> = narrow(&vals);
            let d64: Vec<f64> = narrow(&vals);
            for b in [ErrorBound::Noa(1e-3), ErrorBound::Abs(1e-2)] {
                for c in SHAPED {
                    let r = testing::check_decompress_add(gpu, &d32, b, c, |a, x| a + x).and_then(
                        |()| testing::check_decompress_add(gpu, &d64, b, c, |a, x| a + x),
                    );
                    if let Err(e) = r {
                        panic!("{name} n={n}: {e}");
                    }
                }
            }
        }
    }
}

/// One-bit flips at random bytes and truncations of compressed and stored streams: the device
/// decoder fails exactly where the CPU's fails, and otherwise gives its values.
fn rejects_what_cpu_rejects(gpu: &mut GpuCodec) {
    let s = gpu.stream().clone();
    let mut r = Rng(0x5eed);
    let n = 40_000;
    let smooth: Vec<f32> = (0..n).map(|i| (i as f32 * 1e-3).sin() * 10.0).collect();
    let noise: Vec<f32> = (0..n).map(|_| r.unit() as f32).collect();
    for codec in SHAPED {
        for (name, data, b) in [
            ("compressed", &smooth, ErrorBound::Noa(1e-3)),
            ("stored", &noise, ErrorBound::Abs(1e-30)),
        ] {
            let st = zcomm::compress(data, b, codec).unwrap();
            let mut bad: Vec<Vec<u8>> = Vec::new();
            for _ in 0..150 {
                let mut c = st.clone();
                let at = (r.next() % st.len() as u64) as usize;
                c[at] ^= 1 << (r.next() % 8);
                bad.push(c);
            }
            for cut in [0, 50, 96, 100, 135, 136, 200, st.len() / 2, st.len() - 1] {
                bad.push(st[..cut.min(st.len())].to_vec());
            }
            for (k, c) in bad.iter().enumerate() {
                let label = format!("{codec} {name} case {k}");
                let mut want = vec![0f32; n];
                let cpu = zcomm::decompress_into(c, &mut want);
                // (an empty stream still needs a device buffer to point at)
                let mut padded = c.clone();
                padded.resize(c.len().max(1), 0);
                let d_st = s.clone_htod(&padded).unwrap();
                let mut d_out = s.alloc_zeros::<f32>(n).unwrap();
                let gpu_r =
                    gpu.decompress_device(&d_st.slice(0..c.len()), &mut d_out.as_view_mut());
                match (cpu, gpu_r) {
                    (Ok(()), Ok(())) => {
                        let got = s.clone_dtoh(&d_out).unwrap();
                        assert!(same_bits(&got, &want), "{label}: values differ");
                    }
                    (Err(_), Err(_)) => {}
                    (c, g) => panic!("{label}: cpu {c:?}, gpu {g:?}"),
                }
            }
        }
    }
}

/// gpz under a `rel` bound and with a given range, and cuszi with a given range (no kernels:
/// the CPU twin on a host copy): the CPU's error, or its bytes.
fn refuses(gpu: &mut GpuCodec) {
    let s = gpu.stream().clone();
    let data: Vec<f32> = (0..5000).map(|i| (i as f32 * 1e-2).sin()).collect();
    let d_in = s.clone_htod(&data).unwrap();
    let mut d_out = s
        .alloc_zeros::<u8>(zcomm::compress_bound(data.len(), zcomm::Dtype::F32))
        .unwrap();
    let b = ErrorBound::Rel(1e-3);
    let e = gpu
        .compress_device(&d_in.as_view(), b, CodecKind::Gpz, &mut d_out.as_view_mut())
        .unwrap_err();
    let c = zcomm::compress(&data, b, CodecKind::Gpz).unwrap_err();
    assert_eq!(e.to_string(), c.to_string());
    assert!(matches!(e, zcomm::Error::InvalidArgument(_)), "{e}");
    let (b, r) = (ErrorBound::Noa(1e-3), (-2.0, 2.0));
    for codec in SHAPED {
        let g =
            gpu.compress_device_with_range(&d_in.as_view(), b, codec, r, &mut d_out.as_view_mut());
        match (zcomm::compress_with_range(&data, b, codec, r), g) {
            (Ok(cpu), Ok(len)) => {
                assert!(
                    s.clone_dtoh(&d_out.slice(0..len)).unwrap() == cpu,
                    "{codec}"
                )
            }
            (Err(c), Err(g)) => assert_eq!(c.to_string(), g.to_string(), "{codec}"),
            (c, g) => panic!("{codec}: cpu {c:?}, gpu {g:?}"),
        }
    }
    // an output of the version 2 bound is too small for a version 3 stream: an error
    let mut small = s.alloc_zeros::<u8>(96 + data.len() * 4).unwrap();
    for codec in SHAPED {
        let e = gpu.compress_device(
            &d_in.as_view(),
            ErrorBound::Abs(1e-3),
            codec,
            &mut small.as_view_mut(),
        );
        assert!(
            matches!(e, Err(zcomm::Error::InvalidArgument(_))),
            "{codec}: {e:?}"
        );
    }
}
