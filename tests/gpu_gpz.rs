//! The GPZ particle codec on the GPU (`zcomm::gpu::gpz::GpzGpu`) vs its CPU twin
//! (`zcomm::codec::gpz`): identical streams byte for byte and identical reorder permutations,
//! identical reconstructions bit for bit,
//! GPU decoding of CPU streams, and the same rejection of corrupted streams; the NVRTC test
//! compiles the kernels whenever libnvrtc can be loaded, with or without a GPU.
//!
//! Custom harness (`harness = false`, libtest-mimic), as `tests/gpu.rs`: a test that needs what
//! this machine lacks (a CUDA device, libnvrtc) is reported *ignored* with the reason, never
//! passed.

#[path = "common/gpu_harness.rs"]
mod gpu_harness;

use gpu_harness::{nvrtc_trial, Rng};
use libtest_mimic::{Arguments, Trial};
use zcomm::codec::gpz::{compress_particles, decompress_particles, Order};
use zcomm::gpu::gpz::GpzGpu;
use zcomm::gpu::GpuElement;
use zcomm::{Element, ErrorBound};

/// A test that needs a CUDA device (ignored without one), run on a [`GpzGpu`].
fn gpu_trial(name: &str, test: fn(&mut GpzGpu)) -> Trial {
    gpu_harness::gpu_trial_of(name, "gpz", GpzGpu::new, test)
}

fn main() {
    let args = Arguments::from_args();
    let trials = vec![
        nvrtc_trial("gpz_kernels_compile", gpz_kernels_compile),
        gpu_trial("gpz_gpu_matches_cpu_f32", |g| matches_cpu::<f32>(g, false)),
        gpu_trial("gpz_gpu_matches_cpu_f64", |g| matches_cpu::<f64>(g, false)),
        gpu_trial("gpz_gpu_matches_cpu_large", gpz_gpu_matches_cpu_large),
        gpu_trial(
            "gpz_gpu_rejects_what_cpu_rejects",
            gpz_gpu_rejects_what_cpu_rejects,
        ),
        gpu_trial(
            "gpz_gpu_rejects_what_cpu_rejects_resealed",
            gpz_gpu_rejects_what_cpu_rejects_resealed,
        ),
        gpu_trial("gpz_device_api", gpz_device_api),
        // every data set at every size (slow): `--ignored gpz_gpu_matches_cpu_full`
        gpu_trial("gpz_gpu_matches_cpu_full", |g| {
            matches_cpu::<f32>(g, true);
            matches_cpu::<f64>(g, true);
        })
        .with_ignored_flag(true),
    ];
    libtest_mimic::run(&args, trials).exit();
}

fn gpz_kernels_compile() {
    let cubin = zcomm::gpu::gpz::compile_check("sm_90")
        .unwrap_or_else(|e| panic!("NVRTC compile of gpz.cu: {e}"));
    for k in zcomm::gpu::gpz::kernel_names() {
        assert!(
            cubin.windows(k.len()).any(|w| w == k.as_bytes()),
            "{k} missing from the gpz CUBIN"
        );
    }
}

/// Named particle sets of `n` particles with `d` coordinates (AoS, as f64).
fn particle_sets(n: usize, d: usize, seed: u64) -> Vec<(&'static str, Vec<f64>)> {
    let mut r = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut sets = Vec::new();
    // clustered: a few hundred clusters, particles in storage order hopping between them
    let centers: Vec<f64> = (0..256 * d).map(|_| r.unit() * 100.0).collect();
    let mut v = Vec::with_capacity(n * d);
    for i in 0..n {
        let c = if i % 7 == 0 {
            (r.next() % 256) as usize
        } else {
            (i / 64) % 256
        };
        for a in 0..d {
            v.push(centers[c * d + a] + r.normal() * 0.3);
        }
    }
    sets.push(("clustered", v));
    sets.push((
        "uniform",
        (0..n * d).map(|_| r.unit() * 1000.0 - 500.0).collect(),
    ));
    sets.push((
        "one_cell",
        (0..n * d).map(|i| 42.0 + (i % 3) as f64 * 1e-9).collect(),
    ));
    // exactly between two codes of the abs 1e-3 grid (step 2e-3) and on it
    sets.push((
        "cell_boundaries",
        (0..n * d)
            .map(|i| ((r.next() % 2000) as f64 + if i % 2 == 0 { 0.5 } else { 0.0 }) * 2e-3)
            .collect(),
    ));
    sets.push((
        "huge",
        (0..n * d)
            .map(|i| match i % 5 {
                0 => 3.0e38 * (r.unit() - 0.5),
                1 => 1.0e30 + r.unit(),
                2 => -1.0e25 * r.unit(),
                _ => r.unit(),
            })
            .collect(),
    ));
    let base: Vec<f64> = (0..8 * d).map(|_| r.unit() * 10.0).collect();
    sets.push((
        "duplicates",
        (0..n)
            .flat_map(|i| {
                let k = (r.next() % 8) as usize;
                let _ = i;
                base[k * d..(k + 1) * d].to_vec()
            })
            .collect(),
    ));
    let mut nan = sets[0].1.clone();
    for (i, x) in nan.iter_mut().enumerate() {
        match r.next() % 53 {
            0 => *x = f64::NAN,
            1 => *x = f64::INFINITY,
            2 => *x = f64::NEG_INFINITY,
            3 if i % 2 == 0 => *x = -0.0,
            _ => {}
        }
    }
    sets.push(("nan_inf", nan));
    sets.push(("all_nan", vec![f64::NAN; n * d]));
    sets.push((
        "zeros_then_values",
        (0..n * d)
            .map(|i| if i < n * d / 2 { 0.0 } else { 5.0 })
            .collect(),
    ));
    sets
}

fn bounds() -> Vec<ErrorBound> {
    vec![
        ErrorBound::Abs(1e-3),
        ErrorBound::Abs(0.5),
        ErrorBound::Noa(1e-3),
        ErrorBound::Noa(1e-2),
        ErrorBound::Noa(1e-5),
        // a step that underflows in f32: the degenerate step of the first non-zero value
        ErrorBound::Abs(1e-300),
    ]
}

fn same_bits<T: Element>(a: &[T], b: &[T]) -> Option<usize> {
    if a.len() != b.len() {
        return Some(usize::MAX);
    }
    a.iter()
        .zip(b)
        .position(|(x, y)| x.to_bits_u64() != y.to_bits_u64())
}

/// GPU stream == CPU stream, GPU decode == CPU decode, for one input.
fn check_one<T: GpuElement>(
    gpu: &mut GpzGpu,
    data: &[T],
    d: usize,
    bound: ErrorBound,
    order: Order,
    label: &str,
) {
    let what = format!(
        "{label} {} d={d} n={} {bound} {order}",
        T::DTYPE,
        data.len() / d
    );
    let (cpu, cpu_perm) =
        compress_particles(data, d, bound, order).unwrap_or_else(|e| panic!("{what}: cpu: {e}"));
    let (g, g_perm) = gpu
        .compress_particles(data, d, bound, order)
        .unwrap_or_else(|e| panic!("{what}: gpu compress: {e}"));
    // reorder: the GPU's permutation is the CPU's (preserve: none on either side)
    if g_perm != cpu_perm {
        let first = g_perm
            .iter()
            .flatten()
            .zip(cpu_perm.iter().flatten())
            .position(|(a, b)| a != b);
        panic!("{what}: GPU permutation differs from the CPU's (first difference at {first:?})");
    }
    if g != cpu {
        let first = g.iter().zip(&cpu).position(|(a, b)| a != b);
        panic!(
            "{what}: GPU stream differs from the CPU's: {} vs {} bytes, first difference at {first:?}",
            g.len(),
            cpu.len()
        );
    }
    let (want, dw) =
        decompress_particles::<T>(&cpu).unwrap_or_else(|e| panic!("{what}: cpu decode: {e}"));
    let (got, dg) = gpu
        .decompress::<T>(&cpu)
        .unwrap_or_else(|e| panic!("{what}: gpu decode: {e}"));
    assert_eq!(dw, dg, "{what}: d");
    if let Some(i) = same_bits(&want, &got) {
        panic!("{what}: GPU decode differs at value {i}");
    }
}

fn matches_cpu<T: GpuElement>(gpu: &mut GpzGpu, full: bool) {
    let sizes: &[usize] = if full {
        &[0, 1, 2, 31, 32, 33, 257, 1000, 4099, 20_000]
    } else {
        &[0, 1, 33, 1000, 4099]
    };
    for &n in sizes {
        for d in 1..=4 {
            for (name, set) in particle_sets(n, d, (n * 10 + d) as u64) {
                let data: Vec<T> = set.iter().map(|&x| T::from_f64(x)).collect();
                for bound in bounds() {
                    for order in [Order::Preserve, Order::Reorder] {
                        check_one(gpu, &data, d, bound, order, name);
                    }
                }
            }
        }
    }
}

/// Many look-back chunks, f32 d=3 and f64 d=2, every bound.
fn gpz_gpu_matches_cpu_large(gpu: &mut GpzGpu) {
    let n = 1 << 20;
    let set = particle_sets(n, 3, 7).swap_remove(0).1;
    let f: Vec<f32> = set.iter().map(|&x| x as f32).collect();
    for bound in [ErrorBound::Noa(1e-3), ErrorBound::Abs(1e-2)] {
        for order in [Order::Preserve, Order::Reorder] {
            check_one(gpu, &f, 3, bound, order, "large clustered");
        }
    }
    let set = particle_sets(n / 2, 2, 9).swap_remove(0).1;
    check_one(
        gpu,
        &set,
        2,
        ErrorBound::Noa(1e-4),
        Order::Preserve,
        "large clustered",
    );
}

/// Corrupted streams: the GPU decoder errs exactly when the CPU decoder does, and decodes to the
/// same bits when both accept.
fn gpz_gpu_rejects_what_cpu_rejects(gpu: &mut GpzGpu) {
    let mut r = Rng(12345);
    for d in [1usize, 3, 4] {
        for order in [Order::Preserve, Order::Reorder] {
            let set = particle_sets(700, d, 3).swap_remove(0).1;
            let data: Vec<f32> = set.iter().map(|&x| x as f32).collect();
            let (s, _) = compress_particles(&data, d, ErrorBound::Noa(1e-3), order).unwrap();
            let mut cases: Vec<Vec<u8>> = Vec::new();
            for _ in 0..300 {
                let mut c = s.clone();
                let i = (r.next() as usize) % c.len();
                c[i] ^= 1 << (r.next() % 8);
                cases.push(c);
            }
            for cut in [1usize, 2, 7, s.len() / 2] {
                cases.push(s[..s.len() - cut].to_vec());
            }
            for c in cases {
                let cpu = decompress_particles::<f32>(&c);
                let g = gpu.decompress::<f32>(&c);
                match (cpu, g) {
                    (Ok((a, _)), Ok((b, _))) => {
                        assert_eq!(
                            same_bits(&a, &b),
                            None,
                            "accepted corruption decodes differently"
                        )
                    }
                    (Err(_), Err(_)) => {}
                    (a, b) => panic!(
                        "d={d} {order}: CPU {:?} vs GPU {:?}",
                        a.map(|_| ()),
                        b.map(|_| ())
                    ),
                }
            }
        }
    }
}

/// Recompute the table, data and header checksums of a compressed (not stored) stream, so that a
/// corruption of its table or blocks reaches the block decoders instead of a checksum test.
fn reseal(s: &mut [u8], d: usize) {
    let hl = 56 + 48 * d;
    let n = u64::from_le_bytes(s[16..24].try_into().unwrap()) as usize;
    let data_at = (hl + 2 * n.div_ceil(32)).min(s.len());
    let t = zcomm::format::zhash_bytes(&s[hl..data_at]);
    let dsum = zcomm::format::zhash_bytes(&s[data_at..]);
    s[40..44].copy_from_slice(&t.to_le_bytes());
    s[44..48].copy_from_slice(&dsum.to_le_bytes());
    let o = 48 + 48 * d;
    let h = zcomm::format::zhash_bytes(&s[..o]);
    s[o..o + 4].copy_from_slice(&h.to_le_bytes());
}

/// Corrupted blocks and tables behind valid checksums: every field check of the block decoders
/// (runs, permutations, planes, padding, sizes, exceptions) must agree with the CPU's.
fn resealed_cases<T: GpuElement>(gpu: &mut GpzGpu, r: &mut Rng) {
    for d in [1usize, 2, 3, 4] {
        for order in [Order::Preserve, Order::Reorder] {
            for (name, set) in particle_sets(700, d, 5 + d as u64) {
                if !matches!(name, "clustered" | "nan_inf" | "uniform" | "duplicates") {
                    continue;
                }
                let data: Vec<T> = set.iter().map(|&x| T::from_f64(x)).collect();
                for bound in [ErrorBound::Noa(1e-3), ErrorBound::Abs(1e-2)] {
                    let (s, _) = compress_particles(&data, d, bound, order).unwrap();
                    if s[10] & 1 != 0 {
                        continue;
                    }
                    let hl = 56 + 48 * d;
                    let data_at = hl + 2 * 700usize.div_ceil(32);
                    let mut cases: Vec<Vec<u8>> = Vec::new();
                    for k in 0..160 {
                        let mut c = s.clone();
                        if k % 16 == 15 {
                            // a table entry one byte off (the block sizes no longer tile the data)
                            let e = hl + 2 * ((r.next() as usize) % 700usize.div_ceil(32));
                            let v = u16::from_le_bytes([c[e], c[e + 1]]);
                            let v = if r.next() % 2 == 0 {
                                v.wrapping_add(1)
                            } else {
                                v.wrapping_sub(1)
                            };
                            c[e..e + 2].copy_from_slice(&v.to_le_bytes());
                        } else {
                            for _ in 0..1 + k % 3 {
                                let i = data_at + (r.next() as usize) % (c.len() - data_at);
                                c[i] ^= 1 << (r.next() % 8);
                            }
                        }
                        reseal(&mut c, d);
                        cases.push(c);
                    }
                    for c in cases {
                        let cpu = decompress_particles::<T>(&c);
                        let g = gpu.decompress::<T>(&c);
                        match (cpu, g) {
                            (Ok((a, _)), Ok((b, _))) => assert_eq!(
                                same_bits(&a, &b),
                                None,
                                "{name} d={d} {order}: accepted corruption decodes differently"
                            ),
                            (Err(_), Err(_)) => {}
                            (a, b) => panic!(
                                "{name} d={d} {order} {}: CPU {:?} vs GPU {:?}",
                                std::any::type_name::<T>(),
                                a.map(|_| ()),
                                b.map(|_| ())
                            ),
                        }
                    }
                }
            }
        }
    }
}

fn gpz_gpu_rejects_what_cpu_rejects_resealed(gpu: &mut GpzGpu) {
    let mut r = Rng(777);
    resealed_cases::<f32>(gpu, &mut r);
    resealed_cases::<f64>(gpu, &mut r);
}

/// Device buffers in and out, a view at an odd offset of a larger stream buffer.
fn gpz_device_api(gpu: &mut GpzGpu) {
    let n = 5000;
    let set = particle_sets(n, 3, 11).swap_remove(0).1;
    let data: Vec<f64> = set;
    let s = gpu.stream().clone();
    let x = s.clone_htod(&data).unwrap();
    let cap = GpzGpu::compress_bound::<f64>(n, 3);
    let mut out = s.alloc_zeros::<u8>(cap + 3).unwrap();
    let len = gpu
        .compress_device(
            &x.slice(..),
            3,
            ErrorBound::Noa(1e-3),
            Order::Preserve,
            &mut out.slice_mut(..cap),
        )
        .unwrap();
    let (cpu, _) = compress_particles(&data, 3, ErrorBound::Noa(1e-3), Order::Preserve).unwrap();
    let mut host = vec![0u8; len];
    s.memcpy_dtoh(&out.slice(..len), &mut host[..]).unwrap();
    s.synchronize().unwrap();
    assert_eq!(host, cpu);
    // the stream at an odd offset of another buffer
    let mut shifted = vec![0xAAu8; 3];
    shifted.extend_from_slice(&cpu);
    let dev = s.clone_htod(&shifted).unwrap();
    let mut y = s.alloc_zeros::<f64>(n * 3).unwrap();
    let h = gpu
        .decompress_device(&dev.slice(3..), &mut y.slice_mut(..))
        .unwrap();
    assert_eq!(h.n as usize, n);
    let back = s.clone_dtoh(&y).unwrap();
    let (want, _) = decompress_particles::<f64>(&cpu).unwrap();
    assert_eq!(same_bits(&want, &back), None);
    // reorder with the permutation on the device: a permutation of the wrong length is an error
    let mut short = s.alloc_zeros::<u64>(n - 1).unwrap();
    let e = gpu.compress_device_reorder(
        &x.slice(..),
        3,
        ErrorBound::Noa(1e-3),
        &mut out.slice_mut(..cap),
        &mut short.slice_mut(..),
    );
    assert!(matches!(e, Err(zcomm::Error::InvalidArgument(_))), "{e:?}");
    // incompressible particles (noise at a bound far below it): the stream falls back to
    // storing them verbatim, and the permutation is the identity, as on the CPU
    let mut r = Rng(99);
    let noise: Vec<f64> = (0..3 * 777).map(|_| r.unit() * 1e6).collect();
    let b = ErrorBound::Abs(1e-300);
    let (cpu, cpu_perm) = compress_particles(&noise, 3, b, Order::Reorder).unwrap();
    let (g, g_perm) = gpu
        .compress_particles(&noise, 3, b, Order::Reorder)
        .unwrap();
    assert_eq!(g, cpu);
    assert_eq!(g_perm, cpu_perm);
    assert_eq!(g_perm.unwrap(), (0..777u64).collect::<Vec<_>>());
}
