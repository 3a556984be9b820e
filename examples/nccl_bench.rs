//! Raw vs compressed NCCL allreduce / allgather on device buffers (`comm::nccl`), one rank per
//! GPU, with the model's prediction beside each measurement.
//!
//! Data: a Gaussian random field generated on the device (`grf`), and/or a real gradient read
//! from raw f32 files (`grad`, one per rank, `{rank}` in `--grad-file` is replaced; the gradient
//! is tiled to fill larger buffers). Timing: every repetition starts after a barrier, ends when
//! the rank's streams are drained; the slowest rank counts; the median over `--reps` (after one
//! warm-up) is reported. `auto` rows of short operations (raw < 50 ms) are timed alternating
//! with raw NCCL (at least 10 pairs) and
//! also carry that paired raw median (`raw_ms_paired`, `speedup_paired`), the fair measure of
//! what `Auto` costs over raw. `max_error` is the largest difference to raw NCCL's result over all
//! ranks. Rank 0 writes the JSON records to `--out`.
//!
//! ```text
//! mpirun -n 2 -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE target/release/examples/nccl_bench \
//!     --sizes 64M,1G --bounds noa:1e-2,noa:1e-3,noa:1e-4 --out nvlink.json
//! NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 mpirun -n 2 -x ... nccl_bench --out socket.json
//! ```

use std::process::ExitCode;

mod common;
use common::outln;

use clap::Parser;
use cudarc::driver::CudaSlice;
use zcomm::comm::nccl::{nccl_version, NcclComm, NcclConfig};
use zcomm::comm::{Decision, OpStats, ReduceOp};
use zcomm::model::Policy;
use zcomm::{CodecKind, ErrorBound, Result};

#[derive(Parser, Debug)]
#[command(
    about = "Raw vs compressed NCCL collectives on device buffers (run under mpirun, one rank per GPU)"
)]
struct Args {
    /// Buffer sizes per rank (bytes; K/M/G suffixes are powers of 2).
    #[arg(long, value_delimiter = ',', default_value = "64M,256M,1G,4G")]
    sizes: Vec<String>,
    /// Error bounds.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "noa:1e-2,noa:1e-3,noa:1e-4"
    )]
    bounds: Vec<ErrorBound>,
    /// Data sets: grf, grad.
    #[arg(long, value_delimiter = ',', default_value = "grf")]
    data: Vec<String>,
    /// Raw f32 gradient file per rank (`{rank}` is replaced by the rank).
    #[arg(long, default_value = "grad_r{rank}.f32")]
    grad_file: String,
    /// Operations: allreduce, allgather.
    #[arg(long, value_delimiter = ',', default_value = "allreduce,allgather")]
    ops: Vec<String>,
    /// Policies besides raw: always, auto.
    #[arg(long, value_delimiter = ',', default_value = "always,auto")]
    policies: Vec<String>,
    /// Codec.
    #[arg(long, default_value = "aatrox")]
    codec: CodecKind,
    /// Timed repetitions (after one warm-up; at least 10 for buffers up to 256 MiB).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Pipeline piece size of point-to-point messages in MiB.
    #[arg(long, default_value_t = 64)]
    piece_mib: usize,
    /// Pieces per ring segment of the compressed reductions and per buffer of the compressed
    /// allgather (default: the model's choice).
    #[arg(long)]
    pieces: Option<usize>,
    /// Skip allgather when the gathered output would exceed this many GiB.
    #[arg(long, default_value_t = 16.0)]
    max_gather_gib: f64,
    /// Link label for the records (default: from NCCL_P2P_DISABLE/NCCL_SHM_DISABLE).
    #[arg(long)]
    label: Option<String>,
    /// JSON output (rank 0).
    #[arg(long, default_value = "nccl-bench.json")]
    out: String,
    /// Correlation length of the random field (cells).
    #[arg(long, default_value_t = 32.0)]
    corr: f64,
    /// White-noise amplitude added to the unit-variance field.
    #[arg(long, default_value_t = 1e-3)]
    noise: f32,
    /// Only compile the codec kernels for this architecture into the kernel cache (no MPI, no
    /// GPU needed; e.g. `sm_90`), so a GPU machine can reuse the CUBIN.
    #[arg(long)]
    precompile: Option<String>,
}

fn parse_size(s: &str) -> std::result::Result<usize, String> {
    let t = s.trim();
    let (num, mult) = match t.chars().last() {
        Some('K') | Some('k') => (&t[..t.len() - 1], 1usize << 10),
        Some('M') | Some('m') => (&t[..t.len() - 1], 1 << 20),
        Some('G') | Some('g') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    let v: f64 = num.parse().map_err(|_| format!("size `{s}`"))?;
    Ok((v * mult as f64) as usize)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

/// Median (over `reps`, after a warm-up) of the slowest rank's time of `f`, in ms, and the
/// stats of the last call.
fn timed(
    c: &mut NcclComm,
    reps: usize,
    mut f: impl FnMut(&mut NcclComm) -> Result<Option<OpStats>>,
) -> Result<(f64, Option<OpStats>)> {
    let mut ts = Vec::new();
    let mut last = None;
    for i in 0..=reps {
        c.barrier()?;
        let t0 = c.wtime();
        last = f(c)?;
        c.synchronize()?;
        let mut t = [c.wtime() - t0];
        c.bootstrap().allreduce_f64(&mut t, ReduceOp::Max)?;
        if i > 0 {
            ts.push(t[0] * 1e3);
        }
    }
    Ok((median(ts), last))
}

/// Like [`timed`] for two operations measured alternately (`a`, `b`, `a`, `b`, ...), so both
/// medians come from the same minutes of the run (clock and link drift cancel): the `auto` rows
/// are compared with raw NCCL this way.
fn timed_pair(
    c: &mut NcclComm,
    reps: usize,
    mut a: impl FnMut(&mut NcclComm) -> Result<Option<OpStats>>,
    mut b: impl FnMut(&mut NcclComm) -> Result<Option<OpStats>>,
) -> Result<(f64, f64, Option<OpStats>)> {
    let (mut ta, mut tb) = (Vec::new(), Vec::new());
    let mut last = None;
    for i in 0..=reps {
        for which in 0..2 {
            c.barrier()?;
            let t0 = c.wtime();
            if which == 0 {
                a(c)?;
            } else {
                last = b(c)?;
            }
            c.synchronize()?;
            let mut t = [c.wtime() - t0];
            c.bootstrap().allreduce_f64(&mut t, ReduceOp::Max)?;
            if i > 0 {
                if which == 0 { &mut ta } else { &mut tb }.push(t[0] * 1e3);
            }
        }
    }
    Ok((median(ta), median(tb), last))
}

fn max_over_ranks(c: &NcclComm, v: f64) -> Result<f64> {
    let mut m = [v];
    c.bootstrap().allreduce_f64(&mut m, ReduceOp::Max)?;
    Ok(m[0])
}

fn tile(c: &NcclComm, g: &CudaSlice<f32>, n: usize) -> Result<CudaSlice<f32>> {
    let s = c.stream();
    // SAFETY: every element is written by the copies below.
    let mut x =
        unsafe { s.alloc::<f32>(n) }.map_err(|e| zcomm::Error::OutOfMemory(format!("{e:?}")))?;
    let mut off = 0;
    while off < n {
        let k = (n - off).min(g.len());
        let src = g.slice(0..k);
        let mut dst = x.slice_mut(off..off + k);
        s.memcpy_dtod(&src, &mut dst)
            .map_err(|e| zcomm::Error::Gpu(format!("{e:?}")))?;
        off += k;
    }
    s.synchronize()
        .map_err(|e| zcomm::Error::Gpu(format!("{e:?}")))?;
    Ok(x)
}

fn policy_of(name: &str, codec: CodecKind) -> Policy {
    match name {
        "auto" => Policy::Auto(codec),
        "never" | "raw" => Policy::Never,
        _ => Policy::Always(codec),
    }
}

fn run(a: &Args) -> Result<()> {
    let mut cfg = NcclConfig::new(ErrorBound::Noa(1e-3)).with_piece_bytes(a.piece_mib << 20);
    if let Some(k) = a.pieces {
        cfg = cfg.with_pieces(k);
    }
    let mut cfg = cfg.with_policy(Policy::Always(a.codec));
    cfg.transport_label = a.label.clone();
    let mut c = NcclComm::init(cfg)?;
    let (p, r) = (c.size(), c.rank());
    let label = c.profile().transport.clone();
    let device = format!("{}x {}", p, c.device_name());
    let ver = nccl_version()
        .map(|(a, b, c)| format!("{a}.{b}.{c}"))
        .unwrap_or_default();
    if r == 0 {
        outln!("# NCCL {ver}, {p} ranks on {device}, link {label}");
        let prof = serde_json::to_string(c.profile()).unwrap_or_default();
        outln!("# profile: {prof}");
        // the calibration beside the records, so the predictions can be replayed offline
        if let Err(e) = std::fs::write(format!("{}.profile.json", a.out), &prof) {
            eprintln!("cannot write the profile: {e}");
        }
    }
    let date = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let mut records: Vec<serde_json::Value> = Vec::new();
    let save = |records: &Vec<serde_json::Value>| {
        if r == 0 {
            if let Err(e) = std::fs::write(
                &a.out,
                serde_json::to_string_pretty(records).unwrap_or_default(),
            ) {
                eprintln!("cannot write {}: {e}", a.out);
            }
        }
    };
    for data in &a.data {
        let grad: Option<CudaSlice<f32>> = if data == "grad" {
            let path = a.grad_file.replace("{rank}", &r.to_string());
            let bytes = std::fs::read(&path)?;
            let v: Vec<f32> = bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect();
            if r == 0 {
                outln!("# gradient {path}: {} values", v.len());
            }
            Some(
                c.stream()
                    .clone_htod(&v)
                    .map_err(|e| zcomm::Error::Gpu(format!("{e:?}")))?,
            )
        } else {
            None
        };
        for size in &a.sizes {
            let bytes = parse_size(size).map_err(zcomm::Error::invalid)?;
            let n = bytes / 4;
            // short operations: more repetitions for a stable median
            let reps = if bytes <= 256 << 20 {
                a.reps.max(10)
            } else {
                a.reps
            };
            let x = match &grad {
                Some(g) => tile(&c, g, n)?,
                None => c.gaussian_field::<f32>(n, a.corr, a.noise, 1000 + r as u64)?,
            };
            for op in &a.ops {
                let gather = op == "allgather";
                if gather && (n * 4 * p) as f64 > a.max_gather_gib * (1u64 << 30) as f64 {
                    continue;
                }
                let m = if gather { n * p } else { n };
                let mut raw_out = c
                    .stream()
                    .alloc_zeros::<f32>(m)
                    .map_err(|e| zcomm::Error::Gpu(format!("{e:?}")))?;
                let mut out = c
                    .stream()
                    .alloc_zeros::<f32>(m)
                    .map_err(|e| zcomm::Error::Gpu(format!("{e:?}")))?;
                let (raw_ms, _) = timed(&mut c, reps, |c| {
                    if gather {
                        c.raw_allgather(&x, &mut raw_out)?;
                    } else {
                        c.raw_allreduce(&x, &mut raw_out)?;
                    }
                    Ok(None)
                })?;
                if r == 0 {
                    outln!(
                        "{data} {op} {} MiB raw NCCL: {raw_ms:.3} ms ({:.1} GB/s algbw)",
                        bytes >> 20,
                        (if gather { bytes * p } else { bytes }) as f64 / raw_ms / 1e6
                    );
                }
                for &bound in &a.bounds {
                    c.set_bound(bound)?;
                    for pol in &a.policies {
                        c.set_policy(policy_of(pol, a.codec));
                        let run = |c: &mut NcclComm| -> Result<Option<OpStats>> {
                            Ok(Some(if gather {
                                c.allgather(&x, &mut out)?
                            } else {
                                c.allreduce(&x, &mut out)?
                            }))
                        };
                        // auto: alternate with raw NCCL (>= 10 pairs) so the overhead is
                        // measured against a raw run of the same minutes
                        // (only where raw NCCL is short: on the socket transport a raw 1 GiB
                        // allreduce takes ~0.3 s and Auto compresses anyway)
                        let (raw_paired, ms, st) = if pol == "auto" && raw_ms < 50.0 {
                            let (rp, ms, st) = timed_pair(
                                &mut c,
                                reps.max(10),
                                |c| {
                                    if gather {
                                        c.raw_allgather(&x, &mut raw_out)?;
                                    } else {
                                        c.raw_allreduce(&x, &mut raw_out)?;
                                    }
                                    Ok(None)
                                },
                                run,
                            )?;
                            (Some(rp), ms, st)
                        } else {
                            let (ms, st) = timed(&mut c, reps, run)?;
                            (None, ms, st)
                        };
                        let st = st.expect("stats");
                        let err = max_over_ranks(&c, c.max_abs_diff(&out, &raw_out)?)?;
                        let ratio = max_over_ranks(&c, -st.ratio)?.abs(); // worst rank's ratio
                                                                          // allgather: each rank's segment has its own (noa: own range) bound
                        let abs_bound = max_over_ranks(&c, st.bound)?;
                        // the ratios of both directions the prediction used (rank 0's; two ranks:
                        // identical on both) and this rank's own ratio on every rank
                        let wr = c
                            .last_ratios()
                            .filter(|_| st.decision == Decision::Compressed);
                        let own = c.bootstrap().allgather_fixed(&st.ratio.to_le_bytes())?;
                        let own: Vec<f64> = own
                            .chunks_exact(8)
                            .map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes")))
                            .collect();
                        let rec = serde_json::json!({
                            "op": op, "transport": label, "policy": pol, "codec": a.codec.name(), "data": data,
                            "bytes": bytes, "error_bound": bound.to_string(), "abs_bound": abs_bound,
                            "decision": if st.decision == Decision::Compressed { "compressed" } else { "raw" },
                            "ratio": ratio, "raw_ms": raw_ms, "compressed_ms": ms,
                            "predicted_ms": st.predicted_s * 1e3, "predicted_raw_ms": st.predicted_raw_s * 1e3,
                            "predicted_compressed_ms": st.predicted_compressed_s * 1e3,
                            "speedup": raw_ms / ms, "raw_ms_paired": raw_paired,
                            "speedup_paired": raw_paired.map(|r| r / ms), "max_error": err, "ranks": p, "device": device,
                            "nccl": ver, "piece_mib": a.piece_mib, "pieces": st.pieces, "date": date,
                            "ratio_major": wr.map(|w| w.major), "ratio_minor": wr.map(|w| w.minor.min(1e12)),
                            "ratio_ranks": own,
                        });
                        if r == 0 {
                            outln!(
                                "{data} {op} {} MiB {bound} {pol}: {:?}{} ratio {ratio:.2} {ms:.3} ms (raw {raw_ms:.3}, x{:.2}{}) predicted {:.3} ms, max error {err:.3e} (bound {:.3e})",
                                bytes >> 20,
                                st.decision,
                                if st.pieces > 1 { format!(" in {} pieces", st.pieces) } else { String::new() },
                                raw_ms / ms,
                                raw_paired
                                    .map(|r| format!("; alternating with raw {r:.3} ms: x{:.3}", r / ms))
                                    .unwrap_or_default(),
                                st.predicted_s * 1e3,
                                abs_bound
                            );
                        }
                        if st.decision == Decision::Compressed
                            && err > st.bound * 1.000001
                            && !gather
                        {
                            eprintln!("BOUND VIOLATION vs raw NCCL: {err} > {}", st.bound);
                        }
                        records.push(rec);
                    }
                }
                save(&records);
            }
        }
    }
    save(&records);
    c.barrier()?;
    Ok(())
}

fn main() -> ExitCode {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .try_init();
    let a = Args::parse();
    if let Some(arch) = &a.precompile {
        return common::exit_code(
            match zcomm::gpu::compile::blocked_cubin(arch, zcomm::gpu::compile::blocked_warps()) {
                Ok(c) => {
                    outln!("compiled blocked kernels for {arch}: {} bytes", c.len());
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("nccl_bench: {e}");
                    ExitCode::FAILURE
                }
            },
        );
    }
    common::exit_code(match run(&a) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nccl_bench: {e}");
            ExitCode::FAILURE
        }
    })
}
