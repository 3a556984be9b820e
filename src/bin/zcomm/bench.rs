//! `zcomm bench`: ratio, error and throughput of one or all codecs on a raw array.
//!
//! Throughput is `1e9` bytes of *uncompressed* data per second (GB/s), from the median of `--runs`
//! timed runs after one untimed warm-up run, for compression and decompression separately.

use std::path::PathBuf;
use std::time::Instant;

use serde::Serialize;
use zcomm::format::BoundMode;
use zcomm::{CodecKind, Dims, Dtype, Element, Error, ErrorBound, Result};

use crate::array::{dtype_warning, fill_warning, read_file, values_from_bytes, with_dtype};
use crate::device::{self, Device};
use crate::out::outln;
use crate::progress::Progress;

/// Arguments of `zcomm bench`.
#[derive(clap::Args, Debug)]
#[command(after_help = "\
Examples:
  zcomm bench -i field.f32 --dtype f32 --error-bound noa:1e-3
  zcomm bench -i field.f64 --dtype f64 --error-bound rel:1e-4 --codec aatrox,pfpl --runs 5
  zcomm bench -i field.f32 --dtype f32 --error-bound abs:1e-2 --threads 1 --json > bench.json
  zcomm bench -i ocean.f32 --dtype f32 --error-bound noa:1e-4 --fill-value -1e10
  zcomm bench -i cube.f32 --dtype f32 --error-bound noa:1e-3 --dims 128x128x128")]
pub struct Args {
    /// Raw little-endian array.
    #[arg(long, short = 'i')]
    pub input: PathBuf,
    /// Element type of the input: f32 or f64.
    #[arg(long, value_parser = crate::parse::dtype)]
    pub dtype: Dtype,
    /// Error bound: abs:E, noa:E or rel:E.
    #[arg(long, value_parser = crate::parse::bound)]
    pub error_bound: ErrorBound,
    /// `all` or codec names separated by commas (`all` with `--device gpu`: the codecs with
    /// GPU kernels).
    #[arg(long, default_value = "all")]
    pub codec: String,
    /// Timed runs per direction (the median is reported).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    pub runs: u32,
    /// Worker threads for the CPU codecs (default: all cores; at most 4 per core).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub threads: Option<u32>,
    /// Print JSON records (an array, one object per codec) instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Run the codecs on the CPU or the GPU.
    #[arg(long, value_enum, default_value_t = Device::Cpu)]
    pub device: Device,
    /// A fill value marking missing points (as `zcomm compress --fill-value`): every codec keeps
    /// them exactly (checked) and leaves them out of the value range and the error statistics.
    /// CPU only.
    #[arg(long, allow_negative_numbers = true, value_name = "V")]
    pub fill_value: Option<f64>,
    /// The array's shape, slowest dimension first (as `zcomm compress --dims`); used by cuszi.
    #[arg(long, value_parser = crate::parse::dims, value_name = "NxMx...")]
    pub dims: Option<Dims>,
}

/// One benchmark result.
#[derive(Debug, Clone, Serialize)]
pub struct Record {
    /// Codec name.
    pub codec: String,
    /// `f32` / `f64`.
    pub dtype: Dtype,
    /// The bound as given (`noa:1e-3`).
    pub error_bound: String,
    /// The absolute bound the stream guarantees (abs/noa), or the relative bound (rel).
    pub abs_bound: f64,
    /// Input path.
    pub input: String,
    /// Uncompressed bytes.
    pub bytes: usize,
    /// Number of values.
    pub count: usize,
    /// Compressed stream bytes (header included).
    pub compressed_bytes: usize,
    /// `bytes / compressed_bytes`.
    pub ratio: f64,
    /// Largest `|x - x'|` over finite values.
    pub max_error: f64,
    /// Largest `|x - x'| / |x|` over finite non-zero values.
    pub max_rel_error: f64,
    /// PSNR in dB over finite values (value range / RMSE); `null` when lossless.
    pub psnr_db: f64,
    /// Every finite value within the bound, every non-finite value and every fill point
    /// bit-exact.
    pub bound_ok: bool,
    /// The `--fill-value`, when given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fill_value: Option<f64>,
    /// With `--fill-value`: how many values are fill points (left out of the error statistics).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fill_count: Option<usize>,
    /// With `--fill-value`: every fill point came back bit-exact (also part of `bound_ok`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fill_exact: Option<bool>,
    /// Median compression time in seconds.
    pub compress_s: f64,
    /// Median decompression time in seconds.
    pub decompress_s: f64,
    /// Compression throughput, GB/s of uncompressed data.
    pub compress_gbps: f64,
    /// Decompression throughput, GB/s of uncompressed data.
    pub decompress_gbps: f64,
    /// Timed runs per direction.
    pub runs: u32,
    /// Worker threads.
    pub threads: usize,
    /// `cpu` / `gpu`.
    pub device_kind: String,
    /// The hardware (CPU model or GPU name).
    pub device: String,
    /// GPU only: compression throughput of the kernels alone (CUDA events), GB/s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_compress_gbps: Option<f64>,
    /// GPU only: decompression throughput of the kernels alone (CUDA events), GB/s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_decompress_gbps: Option<f64>,
    /// GPU only: the GPU stream is byte-identical to the CPU twin's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bit_identical_to_cpu: Option<bool>,
    /// GPU, `noa` only: compression throughput, GB/s, with the value range given by the caller
    /// (computed once before timing; no value-range kernel per call).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compress_given_range_gbps: Option<f64>,
    /// GPU, `noa` only: kernel-only throughput of those compressions (CUDA events), GB/s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_compress_given_range_gbps: Option<f64>,
    /// GPU, `noa` only: the stream compressed with the given range is byte-identical to the
    /// measured-range one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub given_range_identical: Option<bool>,
}

/// Error statistics of a reconstruction.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stats {
    /// Values equal to the fill value (not in the other statistics).
    pub fill_count: usize,
    /// Every fill point bit-exact.
    pub fill_exact: bool,
    /// Largest absolute error over finite values.
    pub max_error: f64,
    /// Largest relative error over finite non-zero values.
    pub max_rel_error: f64,
    /// PSNR in dB (infinite when exact).
    pub psnr_db: f64,
    /// Bound held everywhere.
    pub bound_ok: bool,
}

/// Compare `orig` with its reconstruction `back` under a stream's bound (`abs_bound` and
/// `fill_value` from the header).
///
/// Fill points (values bitwise equal to the fill value in `T`, as the codecs match them) must
/// come back bit-exact, and are left out of the error statistics and the PSNR's value range:
/// the bound the stream promises is over the other values only (a `noa` bound is a fraction of
/// their range).
pub fn error_stats<T: Element>(
    orig: &[T],
    back: &[T],
    mode: BoundMode,
    abs_bound: f64,
    fill_value: Option<f64>,
) -> Stats {
    let (mut max_err, mut max_rel, mut sse, mut n) = (0f64, 0f64, 0f64, 0usize);
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    let fill = fill_value.map(|f| T::from_f64(f).to_bits_u64());
    let (mut fill_count, mut fill_exact) = (0usize, true);
    let mut ok = orig.len() == back.len();
    for (&x, &y) in orig.iter().zip(back) {
        if Some(x.to_bits_u64()) == fill {
            fill_count += 1;
            fill_exact &= x.to_bits_u64() == y.to_bits_u64();
            continue;
        }
        if !x.finite() {
            ok &= x.to_bits_u64() == y.to_bits_u64();
            continue;
        }
        let (xv, yv) = (x.to_f64(), y.to_f64());
        let d = (xv - yv).abs();
        if d.is_nan() {
            ok = false;
            continue;
        }
        let limit = match mode {
            BoundMode::Abs | BoundMode::Noa => abs_bound,
            BoundMode::Rel => abs_bound * xv.abs(),
        };
        ok &= d <= limit;
        max_err = max_err.max(d);
        if xv != 0.0 {
            max_rel = max_rel.max(d / xv.abs());
        }
        sse += d * d;
        n += 1;
        lo = lo.min(xv);
        hi = hi.max(xv);
    }
    let psnr = if n == 0 || sse == 0.0 {
        f64::INFINITY
    } else {
        20.0 * (hi - lo).log10() - 10.0 * (sse / n as f64).log10()
    };
    Stats {
        fill_count,
        fill_exact,
        max_error: max_err,
        max_rel_error: max_rel,
        psnr_db: psnr,
        bound_ok: ok && fill_exact,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

/// The codecs of `--codec` (`all`: every codec the device has). `all` leaves out gpz where it
/// cannot run this benchmark (a rel bound, a fill value, or a shape that is not particles of 1 to
/// 4 coordinates), with a note; naming it explicitly gets its error instead.
fn codecs(spec: &str, a: &Args) -> Result<Vec<CodecKind>> {
    if spec == "all" {
        let mut v = match a.device {
            Device::Cpu => CodecKind::ALL.to_vec(),
            Device::Gpu => CodecKind::WITH_GPU.to_vec(),
        };
        let why = if !CodecKind::Gpz.supports_bound(a.error_bound) {
            Some("it does not support rel bounds")
        } else if a.fill_value.is_some() {
            Some("it does not take a fill value")
        } else if a
            .dims
            .is_some_and(|d| zcomm::format::gpz_coords(&d).is_err())
        {
            Some("the shape's last extent is not 1 to 4 coordinates")
        } else {
            None
        };
        if let (Some(why), true) = (why, v.contains(&CodecKind::Gpz)) {
            v.retain(|&c| c != CodecKind::Gpz);
            crate::out::warn(format_args!("gpz left out: {why}"));
        }
        Ok(v)
    } else {
        spec.split(',').map(|s| s.trim().parse()).collect()
    }
}

fn bench_one<T: Element>(
    a: &Args,
    data: &[T],
    codec: CodecKind,
    progress: &mut Progress,
) -> Result<Record> {
    let bytes = std::mem::size_of_val(data);
    // warm-up: also the stream the statistics are computed from
    progress.step(&format!("{codec}: compress (warm-up)"));
    let options = crate::compress::options(a.fill_value, a.dims);
    let stream = device::compress(a.device, data, a.error_bound, codec, &options)?;
    let mut ct = Vec::with_capacity(a.runs as usize);
    for i in 0..a.runs {
        progress.step(&format!("{codec}: compress {}/{}", i + 1, a.runs));
        let t = Instant::now();
        let s = device::compress(a.device, data, a.error_bound, codec, &options)?;
        ct.push(t.elapsed().as_secs_f64());
        if s != stream {
            return Err(Error::invalid(format!(
                "{codec}: compression is not deterministic"
            )));
        }
    }
    let mut back = vec![T::default(); data.len()];
    progress.step(&format!("{codec}: decompress (warm-up)"));
    device::decompress_into(a.device, &stream, &mut back)?;
    let mut dt = Vec::with_capacity(a.runs as usize);
    for i in 0..a.runs {
        progress.step(&format!("{codec}: decompress {}/{}", i + 1, a.runs));
        let t = Instant::now();
        device::decompress_into(a.device, &stream, &mut back)?;
        dt.push(t.elapsed().as_secs_f64());
    }
    let h = zcomm::inspect(&stream)?;
    // the fill value asked for, not the header's: the check is that the codec honoured it
    let st = error_stats(data, &back, h.mode, h.abs_bound, a.fill_value);
    let (cs, ds) = (median(ct), median(dt));
    #[cfg_attr(not(feature = "cuda"), allow(unused_mut))]
    let mut record = Record {
        codec: codec.name().into(),
        dtype: T::DTYPE,
        error_bound: a.error_bound.to_string(),
        abs_bound: h.abs_bound,
        input: a.input.display().to_string(),
        bytes,
        count: data.len(),
        compressed_bytes: stream.len(),
        ratio: bytes as f64 / stream.len() as f64,
        max_error: st.max_error,
        max_rel_error: st.max_rel_error,
        psnr_db: st.psnr_db,
        bound_ok: st.bound_ok,
        fill_value: a.fill_value,
        fill_count: a.fill_value.map(|_| st.fill_count),
        fill_exact: a.fill_value.map(|_| st.fill_exact),
        compress_s: cs,
        decompress_s: ds,
        compress_gbps: bytes as f64 / cs / 1e9,
        decompress_gbps: bytes as f64 / ds / 1e9,
        runs: a.runs,
        threads: rayon::current_num_threads(),
        device_kind: a.device.name().into(),
        device: device::describe(a.device),
        kernel_compress_gbps: None,
        kernel_decompress_gbps: None,
        bit_identical_to_cpu: None,
        compress_given_range_gbps: None,
        kernel_compress_given_range_gbps: None,
        given_range_identical: None,
    };
    #[cfg(feature = "cuda")]
    if a.device == Device::Gpu {
        // device input to device output, CUDA-event timed (the host timings above include the
        // host<->device copies of the generic path)
        let input = a.input.display().to_string();
        let g = device::bench_gpu(data, &input, a.error_bound, codec, a.runs as usize)?;
        record.compress_s = g.compress_ms / 1e3;
        record.decompress_s = g.decompress_ms / 1e3;
        record.compress_gbps = g.compress_gbps;
        record.decompress_gbps = g.decompress_gbps;
        record.kernel_compress_gbps = Some(g.kernel_compress_gbps);
        record.kernel_decompress_gbps = Some(g.kernel_decompress_gbps);
        record.bit_identical_to_cpu = Some(g.bit_identical_to_cpu);
        record.compress_given_range_gbps = g.compress_given_range_gbps;
        record.kernel_compress_given_range_gbps = g.kernel_compress_given_range_gbps;
        record.given_range_identical = g.given_range_identical;
        record.device = g.device;
    }
    Ok(record)
}

fn bench_all<T: Element>(bytes: &[u8], a: &Args, list: &[CodecKind]) -> Result<Vec<Record>> {
    let data: Vec<T> = values_from_bytes(bytes, &a.input)?;
    if let Some(w) = dtype_warning(&data) {
        crate::out::warn(format_args!("`{}` as {}: {w}", a.input.display(), T::DTYPE));
    }
    if let Some(w) = fill_warning(&data, a.error_bound, a.fill_value) {
        crate::out::warn(format_args!("`{}`: {w}", a.input.display()));
    }
    // a progress line only where a run takes a while: inputs of 64 MiB and more
    let quiet = a.json || bytes.len() < 64 << 20;
    let steps = list.len() as u64 * 2 * (1 + u64::from(a.runs));
    let mut progress = Progress::new("bench", steps, quiet);
    let recs = list
        .iter()
        .map(|&c| bench_one(a, &data, c, &mut progress))
        .collect();
    progress.finish();
    recs
}

fn fmt_psnr(p: f64) -> String {
    if p.is_finite() {
        format!("{p:.2}")
    } else {
        "inf".into()
    }
}

/// Print records as a Markdown table (pasteable into BENCHMARKS.md).
///
/// Under a `rel` bound the error column is the largest point-wise relative error (what the bound
/// limits); under `abs`/`noa` it is the largest absolute error.
pub fn print_table(recs: &[Record]) -> Result<()> {
    let rel = recs
        .first()
        .is_some_and(|r| r.error_bound.starts_with("rel"));
    if let Some(r) = recs.first() {
        let bound = if rel {
            format!("{} (point-wise relative)", r.error_bound)
        } else {
            format!("{} (abs {:.4e})", r.error_bound, r.abs_bound)
        };
        let fill = match (r.fill_value, r.fill_count) {
            (Some(v), Some(n)) => {
                format!(", fill value {v:e} ({n} points, kept exactly, not in the errors)")
            }
            _ => String::new(),
        };
        outln!(
            "input {} ({} {} values, {} bytes), bound {bound}{fill}, device {} ({}), {} threads, median of {} runs",
            r.input, r.count, r.dtype, r.bytes, r.device_kind, r.device, r.threads, r.runs
        )?;
        outln!()?;
    }
    // GPU noa runs also measure compression with the value range given by the caller
    let given = recs.iter().any(|r| r.compress_given_range_gbps.is_some());
    let (gh, gs) = if given {
        (" compress GB/s (range given) |", "---:|")
    } else {
        ("", "")
    };
    let err_name = if rel { "max rel error" } else { "max error" };
    outln!(
        "| codec | ratio | {err_name} | PSNR (dB) | compress GB/s |{gh} decompress GB/s | bound |"
    )?;
    outln!("|---|---:|---:|---:|---:|{gs}---:|---|")?;
    for r in recs {
        let gc = match (given, r.compress_given_range_gbps) {
            (false, _) => String::new(),
            (true, Some(g)) => format!(" {g:.3} |"),
            (true, None) => " - |".into(),
        };
        outln!(
            "| {} | {:.3} | {:.3e} | {} | {:.3} |{gc} {:.3} | {} |",
            r.codec,
            r.ratio,
            if rel { r.max_rel_error } else { r.max_error },
            fmt_psnr(r.psnr_db),
            r.compress_gbps,
            r.decompress_gbps,
            match (r.bound_ok, r.fill_exact) {
                (true, _) => "ok",
                (false, Some(false)) => "VIOLATED (fill points changed)",
                (false, _) => "VIOLATED",
            }
        )?;
    }
    Ok(())
}

/// The most `--threads` accepted: more threads than a few per core only measure the scheduler
/// (and 100000 of them take minutes to start).
fn max_threads() -> usize {
    4 * std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Run `zcomm bench`.
pub fn run(a: Args) -> Result<()> {
    let list = codecs(&a.codec, &a)?;
    if let Some(n) = a.threads {
        let max = max_threads();
        if n as usize > max {
            return Err(Error::invalid(format!(
                "--threads {n}: at most {max} (4 per core on this machine's {} cores)",
                max / 4
            )));
        }
    }
    let bytes = read_file(&a.input)?;
    if bytes.is_empty() {
        // no values: no ratio, error or throughput to report
        if a.json {
            return outln!("[]");
        }
        return outln!(
            "input {}: empty input (0 values), nothing to measure",
            a.input.display()
        );
    }
    let work = || with_dtype!(a.dtype, bench_all::<T>(&bytes, &a, &list));
    let recs = match a.threads {
        Some(n) => rayon::ThreadPoolBuilder::new()
            .num_threads(n as usize)
            .build()
            .map_err(|e| Error::invalid(format!("cannot start {n} threads: {e}")))?
            .install(work)?,
        None => work()?,
    };
    if a.json {
        let json = serde_json::to_string_pretty(&recs)
            .map_err(|e| Error::invalid(format!("cannot print JSON: {e}")))?;
        outln!("{json}")?;
    } else {
        print_table(&recs)?;
    }
    let bad: Vec<&str> = recs
        .iter()
        .filter(|r| !r.bound_ok)
        .map(|r| r.codec.as_str())
        .collect();
    if !bad.is_empty() {
        let fill_bad = recs.iter().any(|r| r.fill_exact == Some(false));
        return Err(Error::invalid(format!(
            "error bound violated by {}{}",
            bad.join(", "),
            if fill_bad {
                " (fill points not kept exactly)"
            } else {
                ""
            }
        )));
    }
    Ok(())
}
