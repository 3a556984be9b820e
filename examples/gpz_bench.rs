//! GPU benchmark of the GPZ particle codec (`zcomm::gpu::gpz::GpzGpu`): end-to-end compression
//! of a device buffer of clustered particles into a device stream (range pass, code range,
//! encoding, checksums and the final size read included) and decompression of that stream back
//! into a device buffer; warm-up, then `--iters` timed runs (synchronised wall clock), median.
//! Checks that the stream equals the CPU twin's (on a `--check-mib` slice, or all of it) and the
//! bound on every decoded value; prints a table and, with `--json FILE`, appends JSON lines with
//! the fields op, codec, dtype, bytes, error_bound, ratio, time_ms, gbps, device, max_error,
//! identical_to_cpu (and d, order, iters, bound_ok).
//!
//! ```text
//! gpz_bench                                   # 256 MiB of f32 d=3 particles, noa:1e-3, preserve
//! gpz_bench --mib 1024 --order reorder --iters 20 --json bench/results/gpz.jsonl
//! gpz_bench --dtype f64 --d 4 --error-bound abs:1e-4 --check-mib 0   # full-size CPU check
//! ```

use std::io::Write;
use std::time::Instant;

use clap::Parser;
use rayon::prelude::*;
use zcomm::codec::gpz::{compress_particles, Order};
use zcomm::gpu::gpz::GpzGpu;
use zcomm::gpu::GpuElement;
use zcomm::{Element, ErrorBound, Result};

/// GPZ compression and decompression of device-resident particles on GPU 0.
#[derive(Parser, Debug)]
#[command(
    after_help = "Examples:\n  gpz_bench\n  gpz_bench --mib 1024 --order reorder --iters 20 --json bench/results/gpz.jsonl\n  gpz_bench --dtype f64 --d 4 --error-bound abs:1e-4 --check-mib 0"
)]
struct Args {
    /// MiB of particle coordinates (at least 256 for the issue's measurement).
    #[arg(long, default_value_t = 256)]
    mib: usize,
    /// Element type: f32 or f64.
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// Coordinates per particle (1..=4).
    #[arg(long, default_value_t = 3)]
    d: usize,
    /// Error bound: abs:E or noa:E.
    #[arg(long, default_value = "noa:1e-3")]
    error_bound: String,
    /// Particle order of the stream: preserve or reorder.
    #[arg(long, default_value = "preserve")]
    order: String,
    /// Timed iterations of each operation (after the warm-up).
    #[arg(long, default_value_t = 10)]
    iters: usize,
    /// Untimed warm-up iterations.
    #[arg(long, default_value_t = 2)]
    warmup: usize,
    /// MiB of the leading particles whose GPU stream is compared with the CPU twin's (0: all of
    /// them, the full CPU compression).
    #[arg(long, default_value_t = 64)]
    check_mib: usize,
    /// Skip the comparison with the CPU twin.
    #[arg(long)]
    no_check_cpu: bool,
    /// Print the time of each kernel (CUDA events, median of `--iters` extra runs).
    #[arg(long)]
    breakdown: bool,
    /// Append JSON lines (one per operation) to this file.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
fn unit(h: u64) -> f64 {
    (h >> 11) as f64 / (1u64 << 53) as f64
}

/// Clustered particles in a 100^d box: 4096 halo-like clusters of radius ~0.5, storage order
/// hopping between clusters every 48 particles (as domain-decomposed N-body output does).
fn clustered<T: Element + Send>(n: usize, d: usize) -> Vec<T> {
    let mut v = vec![T::default(); n * d];
    v.par_chunks_mut(d).enumerate().for_each(|(i, p)| {
        let c = splitmix((i / 48) as u64) % 4096;
        let h = splitmix(i as u64 ^ 0xABCD_EF01);
        for (a, x) in p.iter_mut().enumerate() {
            let centre = unit(splitmix(c * 8 + a as u64)) * 100.0;
            let r = unit(splitmix(h.wrapping_add(a as u64))) - 0.5;
            // denser towards the centre
            *x = T::from_f64(centre + r * r * r * 4.0);
        }
    });
    v
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

struct Record {
    op: &'static str,
    time_ms: f64,
    gbps: f64,
}

fn run<T: GpuElement + Send + Sync>(args: &Args, bound: ErrorBound, order: Order) -> Result<()> {
    let d = args.d;
    let n = args.mib * (1 << 20) / (d * T::SIZE);
    let bytes = n * d * T::SIZE;
    eprintln!("generating {n} particles ({bytes} bytes) ...");
    let host = clustered::<T>(n, d);
    let mut gpu = GpzGpu::new(0)?;
    let device = gpu.device_name().to_string();
    let s = gpu.stream().clone();
    let gerr = |e: cudarc::driver::DriverError| zcomm::Error::Gpu(format!("{e:?}"));
    let x = s.clone_htod(&host).map_err(gerr)?;
    let cap = GpzGpu::compress_bound::<T>(n, d);
    let mut out = s.alloc_zeros::<u8>(cap).map_err(gerr)?;
    let mut y = s.alloc_zeros::<T>(n * d).map_err(gerr)?;

    let mut len = 0;
    let mut ct = Vec::new();
    for i in 0..args.warmup + args.iters {
        let t = Instant::now();
        len = gpu.compress_device(&x.slice(..), d, bound, order, &mut out.slice_mut(..))?;
        let dt = t.elapsed().as_secs_f64();
        if i >= args.warmup {
            ct.push(dt);
        }
    }
    let mut dtimes = Vec::new();
    let mut header = None;
    for i in 0..args.warmup + args.iters {
        let t = Instant::now();
        header = Some(gpu.decompress_device(&out.slice(..len), &mut y.slice_mut(..))?);
        s.synchronize().map_err(gerr)?;
        let dt = t.elapsed().as_secs_f64();
        if i >= args.warmup {
            dtimes.push(dt);
        }
    }
    let header = header.expect("decoded at least once");
    if args.breakdown {
        for op in ["compress", "decompress"] {
            let mut steps: Vec<(&'static str, Vec<f64>)> = Vec::new();
            gpu.set_profile(true);
            for _ in 0..args.iters.max(1) {
                if op == "compress" {
                    gpu.compress_device(&x.slice(..), d, bound, order, &mut out.slice_mut(..))?;
                } else {
                    gpu.decompress_device(&out.slice(..len), &mut y.slice_mut(..))?;
                }
                for (i, (name, ms)) in gpu.take_profile()?.into_iter().enumerate() {
                    if steps.len() <= i {
                        steps.push((name, Vec::new()));
                    }
                    steps[i].1.push(ms as f64);
                }
            }
            gpu.set_profile(false);
            let parts: Vec<String> = steps
                .into_iter()
                .map(|(name, v)| format!("{name} {:.4}", median(v)))
                .collect();
            println!("breakdown {op} (ms): {}", parts.join(", "));
        }
    }
    // the bound on every decoded value, against the particle it came from: a `reorder` stream
    // returns particles in stored order, whose permutation the CPU twin gives
    let back = s.clone_dtoh(&y).map_err(gerr)?;
    let reference: Vec<T> = match order {
        Order::Preserve => host.clone(),
        Order::Reorder => {
            let (_, perm) = compress_particles(&host, d, bound, order)?;
            let perm = perm.ok_or_else(|| {
                zcomm::Error::Corrupt("a reorder stream without its permutation".into())
            })?;
            perm.iter()
                .flat_map(|&i| host[i as usize * d..(i as usize + 1) * d].iter().copied())
                .collect()
        }
    };
    let (max_error, bound_ok) = reference
        .par_chunks(d)
        .zip(back.par_chunks(d))
        .map(|(a, b)| {
            let mut m = 0f64;
            let mut ok = true;
            for c in 0..d {
                let e = (a[c].to_f64() - b[c].to_f64()).abs();
                ok &= e <= header.axes[c].abs_bound
                    || (!a[c].finite() && a[c].to_bits_u64() == b[c].to_bits_u64());
                m = m.max(e);
            }
            (m, ok)
        })
        .reduce(|| (0.0, true), |x, y| (x.0.max(y.0), x.1 && y.1));
    // the CPU twin on a slice (or everything)
    let identical = if args.no_check_cpu {
        None
    } else {
        let m = if args.check_mib == 0 {
            n
        } else {
            (args.check_mib * (1 << 20) / (d * T::SIZE)).min(n)
        };
        let t = Instant::now();
        let (cpu, _) = compress_particles(&host[..m * d], d, bound, order)?;
        eprintln!(
            "CPU twin: {m} particles in {:.2} s",
            t.elapsed().as_secs_f64()
        );
        let gpu_stream = if m == n {
            let mut v = vec![0u8; len];
            s.memcpy_dtoh(&out.slice(..len), &mut v[..]).map_err(gerr)?;
            s.synchronize().map_err(gerr)?;
            v
        } else {
            gpu.compress(&host[..m * d], d, bound, order)?
        };
        Some(gpu_stream == cpu)
    };
    let ratio = bytes as f64 / len as f64;
    let recs = [
        Record {
            op: "compress",
            time_ms: median(ct) * 1e3,
            gbps: 0.0,
        },
        Record {
            op: "decompress",
            time_ms: median(dtimes) * 1e3,
            gbps: 0.0,
        },
    ]
    .map(|mut r| {
        r.gbps = bytes as f64 / (r.time_ms * 1e-3) / 1e9;
        r
    });
    println!(
        "{:<11} {:<5} {:>2} {:<9} {:<10} {:>12} {:>8} {:>10} {:>9} {:>11} {:>9} {:>9}",
        "op",
        "dtype",
        "d",
        "order",
        "bound",
        "bytes",
        "ratio",
        "time_ms",
        "GB/s",
        "max_error",
        "bound_ok",
        "cpu_same"
    );
    for r in &recs {
        println!(
            "{:<11} {:<5} {:>2} {:<9} {:<10} {:>12} {:>8.3} {:>10.3} {:>9.1} {:>11.3e} {:>9} {:>9}",
            r.op,
            T::DTYPE.to_string(),
            d,
            order.to_string(),
            args.error_bound,
            bytes,
            ratio,
            r.time_ms,
            r.gbps,
            max_error,
            bound_ok,
            identical.map_or("-".to_string(), |b| b.to_string())
        );
    }
    println!("device: {device}");
    if let Some(path) = &args.json {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        for r in &recs {
            let j = serde_json::json!({
                "op": r.op,
                "codec": "gpz",
                "dtype": T::DTYPE.to_string(),
                "d": d,
                "order": order.to_string(),
                "bytes": bytes,
                "error_bound": args.error_bound,
                "ratio": ratio,
                "time_ms": r.time_ms,
                "gbps": r.gbps,
                "iters": args.iters,
                "device": device,
                "max_error": max_error,
                "bound_ok": bound_ok,
                "identical_to_cpu": identical,
            });
            writeln!(f, "{j}")?;
        }
    }
    if !bound_ok || identical == Some(false) {
        return Err(zcomm::Error::Corrupt(format!(
            "check failed: bound_ok={bound_ok} identical_to_cpu={identical:?}"
        )));
    }
    Ok(())
}

fn main() -> Result<()> {
    let args = Args::parse();
    let bound: ErrorBound = args.error_bound.parse()?;
    let order: Order = args.order.parse()?;
    if !(1..=4).contains(&args.d) {
        return Err(zcomm::Error::invalid("--d must be 1..=4"));
    }
    match args.dtype.as_str() {
        "f32" => run::<f32>(&args, bound, order),
        "f64" => run::<f64>(&args, bound, order),
        other => Err(zcomm::Error::invalid(format!("unknown --dtype {other}"))),
    }
}
