//! Single-GPU benchmark of the device-resident compressed allreduce: `--ranks` ranks of one
//! process share GPU 0 and exchange their compressed segments through device memory (the
//! [`DeviceLoopback`] transport, unthrottled or at `--link` GB/s). Reports time, ratio, max error
//! against the exact sum and `input_gbps` = (all ranks' input bytes) / time, as a table and, with
//! `--json FILE`, as JSON lines appended to FILE. The time of a call is the median of calls
//! each between two barriers; the table's next line gives the mean of the same number of calls
//! back to back (one barrier before and after, as a training loop calls it).
//!
//! ```text
//! engine_bench                                  # 2 ranks, 1 GiB f32 per rank, noa:1e-3, aatrox
//! engine_bench --mib 256 --error-bound noa:1e-2 --codec pfpl --iters 20
//! engine_bench --mib 64 --check-cpu             # also run the host ring: results must be bit-identical
//! engine_bench --breakdown --pairs              # each step alone, and pairs of steps side by side
//! ```

use std::io::Write;
use std::time::Instant;

use clap::Parser;
use rayon::prelude::*;
use zcomm::comm::transport::{
    run_ranks, DeviceLoopback, LinkEmulation, LoopbackTransport, Transport,
};
use zcomm::comm::{device_ring, Calibration, Communicator, Config, CpuCompressor};
use zcomm::gpu::{DeviceRange, GpuCodec};
use zcomm::model::{Link, Policy, Profile};
use zcomm::{CodecKind, Error, ErrorBound, Result};

/// Compressed allreduce of device buffers, ranks sharing one GPU.
#[derive(Parser, Debug)]
#[command(
    after_help = "Examples:\n  engine_bench\n  engine_bench --mib 256 --codec pfpl --iters 20\n  engine_bench --mib 64 --check-cpu --json bench/results/engine.jsonl\n  engine_bench --breakdown --pairs"
)]
struct Args {
    /// Ranks (threads sharing GPU 0).
    #[arg(long, default_value_t = 2)]
    ranks: usize,
    /// MiB of f32 input per rank.
    #[arg(long, default_value_t = 1024)]
    mib: usize,
    /// Error bound of the result: abs:E or noa:E.
    #[arg(long, default_value = "noa:1e-3")]
    error_bound: String,
    /// Codec.
    #[arg(long, default_value = "aatrox")]
    codec: String,
    /// Timed iterations (after one warm-up).
    #[arg(long, default_value_t = 10)]
    iters: usize,
    /// Emulated link speed in GB/s (default: unthrottled device copies).
    #[arg(long)]
    link: Option<f64>,
    /// Also run the host ring (CPU codec, loopback transport) and require bit-identical results.
    #[arg(long)]
    check_cpu: bool,
    /// Append one JSON record to this file.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
    /// Also time each step of the ring alone on one rank's data (one stream, nothing else on
    /// the GPU): where a call's time goes.
    #[arg(long)]
    breakdown: bool,
    /// Also time pairs of ring steps running at once on two streams (what two ranks sharing
    /// the GPU do side by side), against each step alone: which kernels share the GPU well.
    #[arg(long)]
    pairs: bool,
}

/// A smooth, non-sparse field with structure at every scale: plane waves with amplitudes
/// falling as k^-2 on a 3-D grid of `n` points (as a Gaussian random field with a steep
/// spectrum), different on every rank.
fn field(rank: usize, n: usize) -> Vec<f32> {
    let side = (n as f64).cbrt().ceil() as usize;
    let waves: Vec<([f64; 3], f64, f64)> = (0..24)
        .map(|j| {
            let h = |s: u64| {
                let mut z = (s + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (rank as u64 * 7919);
                z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
            };
            let k = 1.0 + j as f64 * 1.7;
            let dir = [h(3 * j) - 0.5, h(3 * j + 1) - 0.5, h(3 * j + 2) - 0.5];
            let norm = (dir.iter().map(|d| d * d).sum::<f64>()).sqrt().max(1e-9);
            let kv = dir.map(|d| std::f64::consts::TAU * k * d / norm / side as f64);
            (kv, 1.0 / (k * k), std::f64::consts::TAU * h(100 + j))
        })
        .collect();
    // sin(kx·x + (ky·y + kz·z + φ)) = sin(kx·x)·cos(B) + cos(kx·x)·sin(B): per row one sin/cos
    // per wave, per point two multiply-adds per wave
    let tables: Vec<(Vec<f64>, Vec<f64>)> = waves
        .iter()
        .map(|(k, _, _)| {
            (0..side)
                .map(|x| ((k[0] * x as f64).sin(), (k[0] * x as f64).cos()))
                .unzip()
        })
        .collect();
    let mut v = vec![0.0f32; n];
    v.par_chunks_mut(side).enumerate().for_each(|(row, out)| {
        let (y, z) = (row % side, row / side);
        let rowc: Vec<(f64, f64, f64)> = waves
            .iter()
            .map(|(k, a, ph)| {
                let b = k[1] * y as f64 + k[2] * z as f64 + ph;
                (*a, b.sin(), b.cos())
            })
            .collect();
        for (x, o) in out.iter_mut().enumerate() {
            let s: f64 = rowc
                .iter()
                .zip(&tables)
                .map(|(&(a, sb, cb), (sa, ca))| a * (sa[x] * cb + ca[x] * sb))
                .sum();
            *o = s as f32;
        }
    });
    v
}

/// Median seconds of `f` over `reps` calls (after one warm-up), synchronized.
fn time_it(
    s: &std::sync::Arc<cudarc::driver::CudaStream>,
    reps: usize,
    mut f: impl FnMut() -> Result<()>,
) -> Result<f64> {
    f()?;
    let mut v = Vec::with_capacity(reps);
    for _ in 0..reps {
        s.synchronize().map_err(gpu_err)?;
        let t0 = Instant::now();
        f()?;
        s.synchronize().map_err(gpu_err)?;
        v.push(t0.elapsed().as_secs_f64());
    }
    v.sort_by(f64::total_cmp);
    Ok(v[v.len() / 2])
}

/// Each step of a 2-rank ring call timed alone on `x` (one rank's input), in ms, with the
/// number of times a rank runs it per call (0: shown for comparison, not part of a call).
fn breakdown(x: &[f32], codec: CodecKind) -> Result<Vec<(&'static str, usize, f64)>> {
    let mut r = StepRunner::new(x, codec)?;
    let s = r.gpu.stream().clone();
    let mut rows = Vec::new();
    // an allreduce's ring samples the range before its first compression and measures the
    // exact one in the kernels that read the input (`comm::ring::FinalBound::Deferred`)
    rows.push((
        "sampled value range",
        1,
        time_it(&s, 5, || {
            r.gpu.sampled_range_device(&r.x.as_view()).map(drop)
        })?,
    ));
    rows.push((
        "value range pass, whole input (what the sample replaces)",
        0,
        time_it(&s, 5, || r.gpu.value_range_device(&r.x.as_view()).map(drop))?,
    ));
    let mut fused = true;
    rows.push((
        "compress half, measuring its range",
        1,
        time_it(&s, 5, || r.run(Step::Compress).map(|k| fused &= k))?,
    ));
    let len = r.compressed.len();
    let mut landing = s.alloc_zeros::<u8>(len.max(1)).map_err(gpu_err)?;
    rows.push((
        "device copy of the stream (driver memcpy into a reused buffer)",
        2,
        time_it(&s, 5, || {
            s.memcpy_dtod(&r.compressed.as_view(), &mut landing.slice_mut(..len))
                .map_err(gpu_err)
        })?,
    ));
    rows.push((
        "decompress-add half onto the input, measuring the input's range",
        1,
        time_it(&s, 5, || r.run(Step::DecompressAdd).map(|k| fused &= k))?,
    ));
    let mut recon = true;
    rows.push((
        "compress the sum leaving its reconstruction",
        1,
        time_it(&s, 5, || {
            r.run(Step::CompressReconstruct).map(|k| recon = k)
        })?,
    ));
    let parts = usize::from(!recon);
    if !recon {
        rows.pop(); // no reconstructing kernel: the ring compresses, then decodes its own
        let eb = ErrorBound::Abs(r.abs);
        rows.push((
            "compress the sum",
            1,
            time_it(&s, 5, || {
                r.gpu
                    .compress_device(&r.acc.as_view(), eb, codec, &mut r.scratch.as_view_mut())
                    .map(drop)
            })?,
        ));
    }
    if !fused {
        // a range pass per segment where the codec's kernels do not measure it
        rows.push((
            "range pass, whole input (codec without range-measuring kernels)",
            1,
            time_it(&s, 5, || r.gpu.value_range_device(&r.x.as_view()).map(drop))?,
        ));
    }
    rows.push((
        "decompress half",
        1 + parts,
        time_it(&s, 5, || r.run(Step::Decompress).map(drop))?,
    ));
    for k in [
        "zc_compress_recon_f32_aatrox_abs",
        "zc_compress_track_f32_aatrox_abs",
        "zc_decompress_add_track_f32_aatrox_abs",
    ] {
        let (regs, local, shared) = r.gpu.kernel_resources(k)?;
        eprintln!("{k}: {regs} registers, {local} B local (spills), {shared} B static shared");
    }
    Ok(rows.into_iter().map(|(n, k, t)| (n, k, t * 1e3)).collect())
}

/// One step of a 2-rank ring call on one rank's data.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Step {
    Compress,
    DecompressAdd,
    CompressReconstruct,
    Decompress,
}

/// One rank's buffers for running [`Step`]s on its own stream.
struct StepRunner {
    gpu: GpuCodec,
    x: cudarc::driver::CudaSlice<f32>,
    acc: cudarc::driver::CudaSlice<f32>,
    scratch: cudarc::driver::CudaSlice<u8>,
    compressed: cudarc::driver::CudaSlice<u8>,
    tracked: DeviceRange,
    abs: f64,
    codec: CodecKind,
}

impl StepRunner {
    fn new(x: &[f32], codec: CodecKind) -> Result<Self> {
        let mut gpu = GpuCodec::new(0)?.with_own_stream()?;
        let s = gpu.stream().clone();
        let xd = s.clone_htod(x).map_err(gpu_err)?;
        let half = x.len() / 2;
        let acc = s.alloc_zeros::<f32>(half).map_err(gpu_err)?;
        let mut scratch = s
            .alloc_zeros::<u8>(zcomm::compress_bound(half, zcomm::Dtype::F32))
            .map_err(gpu_err)?;
        let range = gpu.value_range_device(&xd.as_view())?.unwrap_or((0.0, 0.0));
        let abs = 1e-3 * (range.1 - range.0) / 2.0;
        let mut tracked = DeviceRange::new(&s)?;
        let (len, _) = gpu.compress_device_tracking(
            &xd.slice(..half),
            abs,
            codec,
            &mut scratch.as_view_mut(),
            &mut tracked,
        )?;
        let compressed = s.clone_dtod(&scratch.slice(..len)).map_err(gpu_err)?;
        Ok(StepRunner {
            gpu,
            x: xd,
            acc,
            scratch,
            compressed,
            tracked,
            abs,
            codec,
        })
    }

    /// Run `step` and wait for it; whether its fused kernel applied (the range measured by the
    /// compression or the decompress-add, the reconstruction left by the final compression).
    fn run(&mut self, step: Step) -> Result<bool> {
        let half = self.acc.len();
        let fused = match step {
            Step::Compress => {
                self.gpu
                    .compress_device_tracking(
                        &self.x.slice(..half),
                        self.abs,
                        self.codec,
                        &mut self.scratch.as_view_mut(),
                        &mut self.tracked,
                    )?
                    .1
            }
            Step::DecompressAdd => self.gpu.decompress_add_to_device_tracking(
                &self.compressed.as_view(),
                &self.x.slice(half..2 * half),
                &mut self.acc.as_view_mut(),
                &mut self.tracked,
            )?,
            Step::CompressReconstruct => self
                .gpu
                .compress_reconstruct_device(
                    &mut self.acc.as_view_mut(),
                    self.codec,
                    self.abs,
                    &mut self.scratch.as_view_mut(),
                )?
                .is_some(),
            Step::Decompress => {
                self.gpu
                    .decompress_device(&self.compressed.as_view(), &mut self.acc.as_view_mut())?;
                true
            }
        };
        self.gpu.stream().synchronize().map_err(gpu_err)?;
        Ok(fused)
    }
}

/// Median ms of step `a` on one stream and `b` (if any) on another, started together.
fn pair_ms(runners: &mut [StepRunner; 2], a: Step, b: Option<Step>, reps: usize) -> Result<f64> {
    let barrier = std::sync::Barrier::new(2);
    let [r0, r1] = runners;
    let mut times = Vec::with_capacity(reps);
    std::thread::scope(|sc| -> Result<()> {
        let other = sc.spawn(|| -> Result<()> {
            for _ in 0..=reps {
                barrier.wait();
                let res = b.map_or(Ok(()), |b| r1.run(b).map(drop));
                barrier.wait();
                res?;
            }
            Ok(())
        });
        let mut res = Ok(());
        for i in 0..=reps {
            barrier.wait();
            let t0 = Instant::now();
            let r = r0.run(a).map(drop);
            barrier.wait();
            if i > 0 {
                times.push(t0.elapsed().as_secs_f64() * 1e3);
            }
            if res.is_ok() {
                res = r;
            }
        }
        other
            .join()
            .map_err(|_| Error::Gpu("pair thread panicked".into()))??;
        res
    })?;
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// Every pair of ring steps side by side on two streams: (a, b, ms together, ms a alone +
/// ms b alone).
fn pairs(x: &[f32], codec: CodecKind) -> Result<Vec<(Step, Step, f64, f64)>> {
    let mut runners = [StepRunner::new(x, codec)?, StepRunner::new(x, codec)?];
    let steps = [
        Step::Compress,
        Step::DecompressAdd,
        Step::CompressReconstruct,
        Step::Decompress,
    ];
    let mut solo = Vec::new();
    for s in steps {
        solo.push(pair_ms(&mut runners, s, None, 5)?);
    }
    let mut rows = Vec::new();
    for (i, &a) in steps.iter().enumerate() {
        for (j, &b) in steps.iter().enumerate().skip(i) {
            let together = pair_ms(&mut runners, a, Some(b), 5)?;
            rows.push((a, b, together, solo[i] + solo[j]));
        }
    }
    Ok(rows)
}

fn gpu_err(e: cudarc::driver::DriverError) -> Error {
    Error::Gpu(format!("{e:?}"))
}

struct RankResult {
    times: Vec<f64>,
    /// Mean seconds per call of `iters` calls back to back.
    back_to_back: f64,
    out: Vec<f32>,
    ratio: f64,
    bound: f64,
    device: String,
}

fn run_rank(
    t: DeviceLoopback,
    x: &[f32],
    bound: ErrorBound,
    codec: CodecKind,
    iters: usize,
) -> Result<RankResult> {
    let mut gpu = GpuCodec::new(0)?.with_own_stream()?;
    let s = gpu.stream().clone();
    let xd = s.clone_htod(x).map_err(gpu_err)?;
    let mut out = s.alloc_zeros::<f32>(x.len()).map_err(gpu_err)?;
    let mut times = Vec::with_capacity(iters);
    let mut st = device_ring::allreduce(&t, &mut gpu, &xd, &mut out, bound, codec, false)?;
    for _ in 0..iters {
        t.barrier()?;
        let t0 = Instant::now();
        st = device_ring::allreduce(&t, &mut gpu, &xd, &mut out, bound, codec, false)?;
        t.barrier()?;
        times.push(t0.elapsed().as_secs_f64());
    }
    // back to back, as a training loop calls it (and as nccl-tests time a collective): one
    // barrier before and after `iters` calls
    t.barrier()?;
    let t0 = Instant::now();
    for _ in 0..iters {
        st = device_ring::allreduce(&t, &mut gpu, &xd, &mut out, bound, codec, false)?;
    }
    t.barrier()?;
    let back_to_back = t0.elapsed().as_secs_f64() / iters as f64;
    let out = s.clone_dtoh(&out).map_err(gpu_err)?;
    Ok(RankResult {
        back_to_back,
        times,
        out,
        ratio: st.ratio,
        bound: st.bound,
        device: gpu.device_name().to_string(),
    })
}

/// The host ring on the same inputs (CPU codec over the host loopback transport).
fn host_ring(inputs: &[Vec<f32>], bound: ErrorBound, codec: CodecKind) -> Result<Vec<Vec<f32>>> {
    let prof = Profile::new(Link {
        bandwidth: 1e9,
        latency: 1e-6,
    });
    let cfg = Config::new(bound)
        .with_policy(Policy::Always(codec))
        .with_calibration(Calibration::Fixed(prof));
    run_ranks(LoopbackTransport::group(inputs.len()), |t| {
        let x = &inputs[t.rank()];
        let mut c =
            Communicator::with_transport(Box::new(t), Box::new(CpuCompressor), cfg.clone())?;
        let mut out = vec![0.0f32; x.len()];
        c.allreduce(x, &mut out)?;
        Ok(out)
    })
    .into_iter()
    .map(|r| r?)
    .collect()
}

fn main() -> std::process::ExitCode {
    match run(Args::parse()) {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::FAILURE,
        Err(e) => {
            eprintln!("engine_bench: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(a: Args) -> Result<bool> {
    let bound: ErrorBound = a.error_bound.parse()?;
    let codec: CodecKind = a.codec.parse()?;
    if a.ranks == 0 || a.mib == 0 || a.iters == 0 {
        return Err(Error::invalid(
            "--ranks, --mib and --iters must be positive",
        ));
    }
    if !zcomm::gpu::device_available() {
        return Err(Error::Unavailable("no CUDA device".into()));
    }
    let n = a.mib << 18;
    eprintln!("generating {} x {} MiB of f32 ...", a.ranks, a.mib);
    let inputs: Vec<Vec<f32>> = (0..a.ranks).map(|r| field(r, n)).collect();
    let link = match a.link {
        Some(g) => LinkEmulation::new(g * 1e9, 0.0)?,
        None => LinkEmulation::default(),
    };
    let results = run_ranks(DeviceLoopback::group(a.ranks, link), |t| {
        let x = &inputs[t.rank()];
        run_rank(t, x, bound, codec, a.iters)
    })
    .into_iter()
    .map(|r| r?)
    .collect::<Result<Vec<_>>>()?;
    // exact sum in f64, max error of every rank's result, bit-identity across ranks
    let exact: Vec<f64> = (0..n)
        .into_par_iter()
        .map(|i| inputs.iter().map(|x| x[i] as f64).sum())
        .collect();
    let max_error = results
        .iter()
        .map(|r| {
            r.out
                .par_iter()
                .zip(&exact)
                .map(|(a, b)| (*a as f64 - b).abs())
                .reduce(|| 0.0, f64::max)
        })
        .fold(0.0, f64::max);
    let identical = results.iter().all(|r| r.out == results[0].out);
    let r0 = &results[0];
    let mut times: Vec<f64> = (0..a.iters)
        .map(|i| results.iter().map(|r| r.times[i]).fold(0.0, f64::max))
        .collect();
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    let bytes = (n * 4) as f64;
    let input_gbps = a.ranks as f64 * bytes / median / 1e9;
    let mut ok = max_error <= r0.bound && identical;
    let mut cpu_identical = None;
    if a.check_cpu {
        eprintln!("running the host ring on the same inputs ...");
        let host = host_ring(&inputs, bound, codec)?;
        let same = host.iter().all(|h| h == &r0.out);
        cpu_identical = Some(same);
        ok &= same;
    }
    let mut out = std::io::stdout().lock();
    let w = |out: &mut std::io::StdoutLock<'_>, s: String| writeln!(out, "{s}").map_err(Error::Io);
    w(&mut out, "| op | transport | ranks | codec | bound | MiB/rank | ratio | median ms | input GB/s | max error | guaranteed | identical on ranks | = host ring |".into())?;
    w(
        &mut out,
        "|---|---|---:|---|---|---:|---:|---:|---:|---:|---:|---|---|".into(),
    )?;
    w(
        &mut out,
        format!(
            "| allreduce | device-loopback{} | {} | {codec} | {} | {} | {:.2} | {:.3} | {:.1} | {:.3e} | {:.3e} | {} | {} |",
            a.link.map(|g| format!(" @{g} GB/s")).unwrap_or_default(),
            a.ranks,
            a.error_bound,
            a.mib,
            r0.ratio,
            median * 1e3,
            input_gbps,
            max_error,
            r0.bound,
            if identical { "yes" } else { "NO" },
            cpu_identical.map_or("not run", |s| if s { "yes" } else { "NO" }),
        ),
    )?;
    w(
        &mut out,
        format!(
            "{}: device {}, times (ms) min {:.3} median {:.3} max {:.3}",
            if ok { "ok" } else { "FAILED" },
            r0.device,
            times[0] * 1e3,
            median * 1e3,
            times[times.len() - 1] * 1e3
        ),
    )?;
    let b2b = results.iter().map(|r| r.back_to_back).fold(0.0, f64::max);
    w(
        &mut out,
        format!(
            "back to back ({} calls, one barrier before and after): {:.3} ms per call = {:.1} GB/s",
            a.iters,
            b2b * 1e3,
            a.ranks as f64 * bytes / b2b / 1e9
        ),
    )?;
    if a.breakdown {
        let rows = breakdown(&inputs[0], codec)?;
        w(&mut out, String::new())?;
        w(
            &mut out,
            "| step (one rank's data, alone on the GPU) | per call | ms each | ms per call |"
                .into(),
        )?;
        w(&mut out, "|---|---:|---:|---:|".into())?;
        let mut total = 0.0;
        for (name, k, ms) in &rows {
            total += *k as f64 * ms;
            w(
                &mut out,
                format!("| {name} | {k} | {ms:.3} | {:.3} |", *k as f64 * ms),
            )?;
        }
        w(
            &mut out,
            format!(
                "| sum for one rank | | | {total:.3} |\n\n{} ranks run these on one GPU: {:.3} ms if nothing overlapped, measured {:.3} ms",
                a.ranks,
                total * a.ranks as f64,
                median * 1e3
            ),
        )?;
    }
    if a.pairs {
        w(&mut out, String::new())?;
        w(
            &mut out,
            "| step A | step B (other stream) | ms together | ms alone, summed | together / summed |"
                .into(),
        )?;
        w(&mut out, "|---|---|---:|---:|---:|".into())?;
        for (sa, sb, both, sum) in pairs(&inputs[0], codec)? {
            w(
                &mut out,
                format!(
                    "| {sa:?} | {sb:?} | {both:.3} | {sum:.3} | {:.3} |",
                    both / sum
                ),
            )?;
        }
    }
    if let Some(path) = &a.json {
        let rec = serde_json::json!({
            "op": "allreduce",
            "transport": if a.link.is_some() { "device-loopback-throttled" } else { "device-loopback" },
            "link_gbps": a.link,
            "ranks": a.ranks,
            "codec": codec.name(),
            "dtype": "f32",
            "bytes": n * 4,
            "error_bound": a.error_bound,
            "ratio": r0.ratio,
            "time_ms": median * 1e3,
            "input_gbps": input_gbps,
            "time_ms_back_to_back": b2b * 1e3,
            "input_gbps_back_to_back": a.ranks as f64 * bytes / b2b / 1e9,
            "device": r0.device,
            "max_error": max_error,
            "guaranteed_error": r0.bound,
            "identical_on_ranks": identical,
            "identical_to_host_ring": cpu_identical,
            "iters": a.iters,
        });
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        writeln!(f, "{rec}")?;
    }
    Ok(ok)
}
