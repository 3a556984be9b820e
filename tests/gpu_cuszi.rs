//! The cuszi decoder on the GPU (`zcomm::gpu::cuszi::CusziGpu`) vs its CPU twin
//! (`zcomm::decompress`): identical reconstructions bit for bit over shapes (3-D, 2-D, 1-D,
//! batches, edge tiles), dtypes, bound modes and adversarial values, and the same rejection of
//! corrupted streams; the NVRTC test compiles the kernels whenever libnvrtc can be loaded, with
//! or without a GPU.
//!
//! Custom harness (`harness = false`, libtest-mimic), as `tests/gpu_gpz.rs`: a test that needs
//! what this machine lacks (a CUDA device, libnvrtc) is reported *ignored* with the reason,
//! never passed. `cuszi_gpu_throughput` (512^3 f32) and `cuszi_gpu_throughput_1d` (2^27 f32
//! as a 1-D array, the shape the comm layer passes, and 2^27 + 100,003) time the device codec
//! (`--ignored`).

#[path = "common/gpu_harness.rs"]
mod gpu_harness;

use gpu_harness::{nvrtc_trial, Rng};
use libtest_mimic::{Arguments, Trial};
use zcomm::format::zhash_bytes;
use zcomm::gpu::cuszi::CusziGpu;
use zcomm::gpu::GpuElement;
use zcomm::{compress_nd, decompress, inspect, CodecKind, Element, ErrorBound};

fn gpu_trial(name: &str, test: fn(&mut CusziGpu)) -> Trial {
    gpu_harness::gpu_trial_of(name, "cuszi", CusziGpu::new, test)
}

fn main() {
    let args = Arguments::from_args();
    let trials = vec![
        nvrtc_trial("cuszi_kernels_compile", cuszi_kernels_compile),
        gpu_trial("cuszi_gpu_decodes_like_cpu_f32", decodes_like_cpu::<f32>),
        gpu_trial("cuszi_gpu_decodes_like_cpu_f64", decodes_like_cpu::<f64>),
        gpu_trial(
            "cuszi_gpu_rejects_what_cpu_rejects",
            rejects_what_cpu_rejects,
        ),
        gpu_trial(
            "cuszi_gpu_compresses_like_cpu_f32",
            compresses_like_cpu::<f32>,
        ),
        gpu_trial(
            "cuszi_gpu_compresses_like_cpu_f64",
            compresses_like_cpu::<f64>,
        ),
        gpu_trial("cuszi_gpu_throughput", throughput).with_ignored_flag(true),
        gpu_trial("cuszi_gpu_throughput_1d", throughput_1d).with_ignored_flag(true),
    ];
    libtest_mimic::run(&args, trials).exit();
}

fn cuszi_kernels_compile() {
    let cubin = zcomm::gpu::cuszi::compile_check("sm_90")
        .unwrap_or_else(|e| panic!("NVRTC compile of cuszi.cu: {e}"));
    for k in zcomm::gpu::cuszi::kernel_names() {
        assert!(
            cubin.windows(k.len()).any(|w| w == k.as_bytes()),
            "{k} missing from the cuszi CUBIN"
        );
    }
}

/// A smooth field of `n` values (a sum of plane waves over the shape `dims`).
fn smooth<T: Element>(dims: &[usize]) -> Vec<T> {
    let n: usize = dims.iter().product();
    let mut st = vec![1usize; dims.len()];
    for d in (0..dims.len().saturating_sub(1)).rev() {
        st[d] = st[d + 1] * dims[d + 1];
    }
    (0..n)
        .map(|i| {
            let mut v = 7.0;
            for (d, &s) in st.iter().enumerate() {
                let x = ((i / s) % dims[d]) as f64;
                v += (x * (0.05 + 0.02 * d as f64)).sin() * 40.0 / (d + 1) as f64;
            }
            T::from_f64(v)
        })
        .collect()
}

/// `smooth` with NaNs, infinities, huge and tiny values mixed in.
fn adversarial<T: Element>(dims: &[usize], seed: u64) -> Vec<T> {
    let mut r = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let big = if T::SIZE == 4 {
        f32::MAX as f64
    } else {
        f64::MAX
    };
    smooth::<T>(dims)
        .into_iter()
        .map(|x| match r.next() % 29 {
            0 => T::from_f64(f64::NAN),
            1 => T::from_f64(f64::INFINITY),
            2 => T::from_f64(-big * 0.999),
            3 => T::from_f64(1e-30),
            4 => T::from_f64(-0.0),
            5 => T::from_f64(x.to_f64() + 1e6),
            _ => x,
        })
        .collect()
}

fn bits<T: Element>(v: &[T]) -> Vec<u64> {
    v.iter().map(|x| x.to_bits_u64()).collect()
}

/// Decode `s` on the GPU and the CPU: the same values bit for bit, or both an error.
fn same<T: GpuElement>(g: &mut CusziGpu, s: &[u8], what: &str) -> bool {
    let cpu = decompress::<T>(s);
    let gpu = g.decompress::<T>(s);
    match (cpu, gpu) {
        (Ok(c), Ok(d)) => {
            let (c, d) = (bits(&c), bits(&d));
            if let Some(i) = (0..c.len()).find(|&i| c[i] != d[i]) {
                panic!(
                    "{what}: value {i} of {}: cpu {:x} gpu {:x}",
                    c.len(),
                    c[i],
                    d[i]
                );
            }
            true
        }
        (Err(_), Err(_)) => false,
        (Ok(_), Err(e)) => panic!("{what}: the CPU decodes, the GPU fails: {e}"),
        (Err(e), Ok(_)) => panic!("{what}: the CPU rejects ({e}), the GPU decodes"),
    }
}

const SHAPES: &[&[usize]] = &[
    &[64, 64, 64],
    &[33, 17, 20],
    &[9, 17, 8],
    &[8, 8, 8],
    &[1, 9, 40],
    &[5, 3, 7],
    &[2, 3, 9, 17],
    &[3, 1, 9, 10],
    &[100, 300],
    &[17, 33],
    &[1, 77],
    &[70_000],
    &[1030],
    &[1],
    &[2, 1, 1],
    &[40, 40, 50],
    // 1-D lengths around the tile (512 values) and the chunk (32,768), primes, and long enough
    // for the decoder to split the line of anchors into segments (more than 64 tiles)
    &[511],
    &[513],
    &[65_537],
    &[100_003],
    &[1_000_003],
    // one column of tiles with a short last tile (2-D, 3-D), and long lines of tiles along the
    // fastest and the slowest dimension
    &[37, 16],
    &[1003, 5, 3],
    &[40, 5000],
    &[17, 9, 1000],
    &[1000, 9, 3],
];

/// Every case the comparisons run: each shape of `SHAPES`, a smooth and an adversarial field
/// (seeded `dims.len() + seed`), each bound mode; `f` gets the values, the shape, the bound and
/// the case's name for messages.
fn for_each_case<T: GpuElement>(seed: u64, mut f: impl FnMut(&[T], &[usize], ErrorBound, &str)) {
    for dims in SHAPES {
        for (name, data) in [
            ("smooth", smooth::<T>(dims)),
            (
                "adversarial",
                adversarial::<T>(dims, dims.len() as u64 + seed),
            ),
        ] {
            for b in [
                ErrorBound::Abs(1e-2),
                ErrorBound::Noa(1e-3),
                ErrorBound::Noa(1e-6),
                ErrorBound::Abs(1e-300),
                ErrorBound::Rel(1e-3),
            ] {
                let what = format!("{} {name} {dims:?} {b}", T::DTYPE);
                f(&data, dims, b, &what);
            }
        }
    }
}

fn decodes_like_cpu<T: GpuElement>(g: &mut CusziGpu) {
    for_each_case::<T>(3, |data, dims, b, what| {
        let s = compress_nd(data, dims, b, CodecKind::Cuszi).unwrap();
        assert!(
            same::<T>(g, &s, what),
            "{what}: the CPU rejects its own stream"
        );
    });
}

/// The GPU encoder writes the CPU twin's bytes (and the GPU decoder decodes them as the CPU).
fn compresses_like_cpu<T: GpuElement>(g: &mut CusziGpu) {
    for_each_case::<T>(5, |data, dims, b, what| {
        let want = compress_nd(data, dims, b, CodecKind::Cuszi).unwrap();
        let got = g
            .compress(data, dims, b)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        if got != want {
            let i = (0..got.len().min(want.len()))
                .find(|&i| got[i] != want[i])
                .unwrap_or(got.len().min(want.len()));
            panic!(
                "{what}: GPU stream of {} bytes differs from the CPU's {} at byte {i}",
                got.len(),
                want.len()
            );
        }
        assert!(same::<T>(g, &got, what));
    });
    // argument errors as the CPU's
    let d = smooth::<T>(&[10, 10]);
    assert!(g.compress(&d, &[10, 11], ErrorBound::Abs(1e-3)).is_err());
    assert!(g.compress(&d, &[10, 10], ErrorBound::Abs(-1.0)).is_err());
}

/// Rewrite the chunk table entry of the chunk holding byte `at` of `s` (its checksum) and the
/// header's table checksum, so that a change inside a chunk reaches the chunk decoder.
fn reseal(s: &mut [u8], at: usize) {
    let h = inspect(s).unwrap();
    let hl = h.header_len();
    let nc = h.n_chunks as usize;
    let mut off = hl + h.table_len();
    for i in 0..nc {
        let e = hl + 8 * i;
        let size = u32::from_le_bytes(s[e..e + 4].try_into().unwrap()) as usize;
        if (off..off + size).contains(&at) {
            let sum = zhash_bytes(&s[off..off + size]);
            s[e + 4..e + 8].copy_from_slice(&sum.to_le_bytes());
        }
        off += size;
    }
    let mut h2 = h;
    h2.payload_checksum = zhash_bytes(&s[hl..hl + h.table_len()]);
    let head = h2.to_vec();
    s[..hl].copy_from_slice(&head);
}

/// Corrupted streams of three shapes: one with edge tiles, one of whole tiles only and a 1-D one
/// with a short last tile (both of which the device decodes with its whole-tile chunk kernel).
fn rejects_what_cpu_rejects(g: &mut CusziGpu) {
    for dims in [&[40usize, 40, 50][..], &[48, 40, 64], &[100_003]] {
        rejects_like_cpu(g, dims);
    }
}

fn rejects_like_cpu(g: &mut CusziGpu, dims: &[usize]) {
    let mut r = Rng(0x5eed);
    for b in [ErrorBound::Noa(1e-3), ErrorBound::Abs(1e-300)] {
        let data = adversarial::<f32>(dims, 11);
        let s = compress_nd(&data, dims, b, CodecKind::Cuszi).unwrap();
        assert!(same::<f32>(g, &s, "intact"));
        let h = inspect(&s).unwrap();
        let body = h.header_len() + h.table_len();
        let (mut rejected, mut decoded) = (0, 0);
        for k in 0..300 {
            let mut m = s.clone();
            let at = match k % 3 {
                // anywhere (header, table, metadata, chunks): checksums catch most
                0 => (r.next() % s.len() as u64) as usize,
                // inside a chunk, resealed: the chunk decoder's own checks
                _ => body + (r.next() % (s.len() - body) as u64) as usize,
            };
            m[at] ^= 1 << (r.next() % 8);
            if k % 3 != 0 {
                reseal(&mut m, at);
            }
            if same::<f32>(g, &m, &format!("flip {k} at {at} ({b})")) {
                decoded += 1;
            } else {
                rejected += 1;
            }
        }
        // truncations and extensions
        for cut in [1usize, 4, 8, 100] {
            assert!(!same::<f32>(g, &s[..s.len() - cut], "truncated"));
        }
        let mut longer = s.clone();
        longer.extend([0, 0, 0, 0]);
        assert!(!same::<f32>(g, &longer, "extended"));
        eprintln!("{dims:?} {b}: {rejected} corruptions rejected by both, {decoded} decoded alike");
        assert!(rejected > 0);
    }
}

/// Median of `xs` (sorted in place).
fn median(xs: &mut [f64]) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// Wall times of 7 calls of `f` after 2 warm-ups, each synchronized, and the steps of one more
/// call, profiled.
fn timed(
    g: &mut CusziGpu,
    mut f: impl FnMut(&mut CusziGpu),
) -> (Vec<f64>, Vec<(&'static str, f32)>) {
    let st = g.stream().clone();
    let mut times = Vec::new();
    for k in 0..9 {
        st.synchronize().unwrap();
        let t0 = std::time::Instant::now();
        f(g);
        st.synchronize().unwrap();
        if k >= 2 {
            times.push(t0.elapsed().as_secs_f64());
        }
    }
    g.set_profile(true);
    f(g);
    let prof = g.take_profile().unwrap();
    g.set_profile(false);
    (times, prof)
}

/// 512^3 f32 smooth field: see [`throughput_of`].
fn throughput(g: &mut CusziGpu) {
    throughput_of(g, &[512, 512, 512], "512^3");
}

/// The same number of values (2^27 f32) as one 1-D array, the shape the comm layer passes
/// (`GpuCodec`), and a 1-D array of an awkward length (2^27 + 100,003: a partial last tile).
fn throughput_1d(g: &mut CusziGpu) {
    throughput_of(g, &[1 << 27], "1-D 2^27");
    throughput_of(g, &[(1 << 27) + 100_003], "1-D 2^27+100003");
}

/// Append `record` as one JSON line to the file `ZCOMM_BENCH_JSON` names, if it is set (the
/// throughput tests' records for `bench/results/`).
fn record_json(record: serde_json::Value) {
    let Ok(path) = std::env::var("ZCOMM_BENCH_JSON") else {
        return;
    };
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    writeln!(f, "{record}").unwrap_or_else(|e| panic!("{path}: {e}"));
}

/// A smooth f32 field of shape `dims`: the CPU twin's stream decoded on the device (device
/// stream in, device values out), bit-identical to the CPU's decoding, and the device's
/// compression of the field, byte-identical to the CPU's stream; median wall time of 7 calls
/// after 2 warm-ups, each synchronized. Each direction is printed and, with
/// `ZCOMM_BENCH_JSON`, recorded as a JSON line.
fn throughput_of(g: &mut CusziGpu, dims: &[usize], label: &str) {
    let data = smooth::<f32>(dims);
    let raw = (data.len() * 4) as f64;
    let g_name = g.device_name().to_string();
    let mut identical = true;
    for b in [ErrorBound::Noa(1e-3), ErrorBound::Noa(1e-4)] {
        let t0 = std::time::Instant::now();
        let s = compress_nd(&data, dims, b, CodecKind::Cuszi).unwrap();
        let cpu_c = t0.elapsed().as_secs_f64();
        let t0 = std::time::Instant::now();
        let want: Vec<f32> = decompress(&s).unwrap();
        let cpu_d = t0.elapsed().as_secs_f64();
        let st = g.stream().clone();
        let d_in = st.clone_htod(&s).unwrap();
        let mut d_out = st.alloc_zeros::<f32>(data.len()).unwrap();
        let decode = |g: &mut CusziGpu| {
            g.decompress_device(&d_in.slice(..), &mut d_out.slice_mut(..))
                .unwrap();
        };
        let (mut times, prof) = timed(g, decode);
        println!("cuszi {label} f32 {b}: decompress steps (ms): {prof:?}");
        let got = st.clone_dtoh(&d_out).unwrap();
        assert!(
            bits(&got) == bits(&want),
            "{b}: GPU decode differs from CPU"
        );
        let t = median(&mut times);
        let json = |op: &str, t: f64, times: &[f64], prof: &[(&str, f32)], same: bool| {
            serde_json::json!({
                "op": op, "codec": "cuszi", "dtype": "f32", "shape": label, "dims": dims,
                "bytes": raw, "error_bound": b.to_string(), "ratio": raw / s.len() as f64,
                "time_ms": t * 1e3, "input_gbps": raw / t / 1e9,
                "min_ms": times.iter().cloned().fold(f64::MAX, f64::min) * 1e3,
                "max_ms": times.iter().cloned().fold(0.0, f64::max) * 1e3,
                "runs": times.len(), "steps_ms": prof.iter().map(|(k, v)| (k.to_string(), *v)).collect::<std::collections::BTreeMap<_, _>>(),
                "device": g_name.clone(), "same_as_cpu": same,
            })
        };
        record_json(json("decompress", t, &times, &prof, true));
        println!(
            "cuszi {label} f32 {b}: ratio {:.2} | gpu decompress median {:.3} ms = {:.1} GB/s \
             (min {:.3} ms, max {:.3} ms, 7 runs) | bit-identical to CPU decompress | cpu \
             compress {:.2} s, cpu decompress {:.2} s",
            raw / s.len() as f64,
            t * 1e3,
            raw / t / 1e9,
            times.iter().cloned().fold(f64::MAX, f64::min) * 1e3,
            times.iter().cloned().fold(0.0, f64::max) * 1e3,
            cpu_c,
            cpu_d,
        );
        let d_data = st.clone_htod(&data).unwrap();
        let mut d_cs = st
            .alloc_zeros::<u8>(CusziGpu::compress_bound::<f32>(data.len()))
            .unwrap();
        let mut len = 0;
        let encode = |g: &mut CusziGpu| {
            len = g
                .compress_device(&d_data.slice(..), dims, b, &mut d_cs.slice_mut(..))
                .unwrap();
        };
        let (mut ctimes, prof) = timed(g, encode);
        let got = st.clone_dtoh(&d_cs.slice(0..len)).unwrap();
        identical &= got == s;
        let tc = median(&mut ctimes);
        record_json(json("compress", tc, &ctimes, &prof, got == s));
        println!(
            "cuszi {label} f32 {b}: gpu compress median {:.3} ms = {:.1} GB/s (min {:.3} ms, max \
             {:.3} ms, 7 runs) | byte-identical to CPU compress_nd: {} | steps (ms): {prof:?}",
            tc * 1e3,
            raw / tc / 1e9,
            ctimes.iter().cloned().fold(f64::MAX, f64::min) * 1e3,
            ctimes.iter().cloned().fold(0.0, f64::max) * 1e3,
            got == s,
        );
    }
    assert!(identical, "{label}: a GPU stream differs from the CPU's");
}
