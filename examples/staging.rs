//! Every compressed communication operation on device buffers (GPU staging through pinned host
//! memory), raw vs compressed vs `Policy::Auto`, with the model's predictions.
//!
//! With a CUDA device (feature `cuda`): every rank puts its field (generated, or its slice/copy of
//! `--input`) on the GPU, calibrates the device profile (GPU codec and pinned staging, both ranks
//! at once, median of 9; the same with rank 0 alone; the one-way link between ranks 0 and 1;
//! the ranks per GPU) and measures
//!
//! * `sendrecv_device` with its partner (`r ^ 1`), whole message and chunk-pipelined,
//! * `allgather_device`, `bcast_device` (root 0; timed through `ibcast_device` +
//!   `wait_bcast_device` so the root's source stays intact),
//! * `allreduce_device`, `allreduce_mean_device`, `reduce_scatter_device` (not for `rel` bounds),
//! * `stage_to_host` and `restore_to_device`,
//!
//! each under `Policy::Never` (raw), `Policy::Always` (compressed) and `Policy::Auto`, best of
//! `--iters` after one warm-up, slowest rank. Every compressed result is checked against the exact
//! values (the partner's / root's / every rank's data, or the exact f64 sum) under the guaranteed
//! bound; the non-blocking forms (`iallgather_device`, `ibcast_device`, `iallreduce_device`,
//! `iallreduce_mean_device`, `ireduce_scatter_device`, `isendrecv_device`) are run once and
//! compared with the blocking results. The table (Markdown) has raw, compressed and Auto times,
//! the model's prediction of both paths and its error, the ratio, the max error and the bound; the
//! process exits 1 on any bound violation. `--json FILE` writes one JSON record per operation.
//!
//! Without a GPU (or with `--cpu`) the same operations run on host buffers with the CPU codec
//! (`stage`/`restore` = compress/decompress in host memory) and the device operations are
//! reported as skipped.
//!
//! ```text
//! mpirun -n 2 target/release/examples/staging --n 268435456 --error-bound noa:1e-3   # 1 GiB f32
//! ```

mod common;

use std::process::ExitCode;

use clap::Parser;
use common::*;
use zcomm::comm::{partition, CommElement, Communicator, Config, Decision, OpStats};
use zcomm::model::Policy;
use zcomm::{Element, ErrorBound, Result};

#[derive(Parser, Debug)]
#[command(
    about = "Compressed MPI operations on device buffers through GPU staging (run under mpirun)"
)]
struct Args {
    #[command(flatten)]
    c: Common,
    /// Timed repetitions of each measurement (the best is reported, after one warm-up).
    #[arg(long, default_value_t = 3)]
    iters: usize,
    /// Use the host path even when a GPU is present.
    #[arg(long)]
    cpu: bool,
    /// Ping-pong message size for the link calibration, MiB.
    #[arg(long, default_value_t = 16)]
    pingpong_mib: usize,
    /// Compressor of the communicator (the wire of the reductions and non-blocking exchange,
    /// which stage the raw values and run the host algorithm): `gpu` or `cpu` (device runs only).
    #[arg(long, default_value = "gpu")]
    wire: String,
    /// Write one JSON record per operation to this file (rank 0).
    #[arg(long)]
    json: Option<std::path::PathBuf>,
    /// Run only these operations (comma list; default all). Device runs: stage,
    /// sendrecv_device, sendrecv_device_pipelined, allgather_device, bcast_device,
    /// allreduce_device, allreduce_mean_device, reduce_scatter_device, nonblocking (the
    /// i*_device consistency checks of the selected operations). Host runs: stage, sendrecv,
    /// allgather, bcast, allreduce, allreduce_mean, reduce_scatter.
    #[arg(long, value_delimiter = ',')]
    ops: Vec<String>,
    /// Abort the whole job (exit 3, naming the step) when one step (one policy of one
    /// operation: warm-up + --iters) runs longer than this many seconds; 0 = never.
    #[arg(long, default_value_t = 600.0)]
    step_timeout_s: f64,
}

impl Args {
    /// Whether operation `op` is selected by `--ops`.
    fn wants(&self, op: &str) -> bool {
        self.ops.is_empty() || self.ops.iter().any(|o| o.trim() == op)
    }
}

/// The step in progress (for the progress lines and the watchdog).
struct Step {
    t0: std::time::Instant,
    since: std::time::Instant,
    what: String,
}

static STEP: std::sync::Mutex<Option<Step>> = std::sync::Mutex::new(None);

/// Start a step: rank 0 prints `[t] what` before it runs; the watchdog restarts its clock.
fn step(c: &Communicator, what: &str) {
    let mut g = STEP.lock().unwrap_or_else(|e| e.into_inner());
    let now = std::time::Instant::now();
    let t0 = g.as_ref().map_or(now, |s| s.t0);
    if c.rank() == 0 {
        // on a terminal one line redrawn in place (erased before stdout's next line); in a log,
        // one line per step (what the watchdog's message refers to)
        let line = format!("[{:7.1} s] {what}...", (now - t0).as_secs_f64());
        if progress_enabled() {
            progress(&line);
        } else {
            eprintln!("{line}");
        }
    }
    *g = Some(Step {
        t0,
        since: now,
        what: what.to_string(),
    });
}

/// Abort the process when one step runs longer than `limit_s` (mpirun then ends every rank),
/// so a hung collective never waits forever.
fn watchdog(rank: usize, limit_s: f64) {
    if !(limit_s > 0.0 && limit_s.is_finite()) {
        return;
    }
    std::thread::spawn(move || loop {
        std::thread::sleep(std::time::Duration::from_millis(500));
        let g = STEP.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = g.as_ref() {
            if s.since.elapsed().as_secs_f64() > limit_s {
                eprintln!(
                    "staging (rank {rank}): step '{}' still running after {limit_s} s (--step-timeout-s): aborting",
                    s.what
                );
                std::process::exit(3);
            }
        }
    });
}

fn main() -> ExitCode {
    init_tracing();
    let a: Args = parse_args("4194304 (2^22) host values; on a GPU 2^26 f32, 2^25 complex values");
    let cfg = Config::new(a.c.error_bound)
        .with_policy(Policy::Always(a.c.codec))
        .with_pingpong_bytes(a.pingpong_mib << 20);
    let gpu = !a.cpu && gpu_present();
    let c = match init(cfg, gpu && a.wire == "gpu") {
        Ok(c) => c,
        Err(e) => {
            eprintln!("staging: {e}");
            return ExitCode::from(2);
        }
    };
    let mut c = c;
    step(&c, "start");
    watchdog(c.rank(), a.step_timeout_s);
    if !gpu && c.rank() == 0 {
        outln!(
            "staging: no CUDA device{}: device operations SKIPPED; running the host-buffer operations with the CPU codec",
            if a.cpu { " (--cpu)" } else { "" }
        );
    }
    let mut t = Table {
        all_ok: true,
        progress: (c.rank() == 0).then(std::time::Instant::now),
        ..Default::default()
    };
    let r = match (a.c.dtype.as_str(), gpu) {
        ("f32", false) => host::<f32>(&mut c, &a, &mut t),
        ("f64", false) => host::<f64>(&mut c, &a, &mut t),
        ("c64", false) => host::<[f32; 2]>(&mut c, &a, &mut t),
        ("c128", false) => host::<[f64; 2]>(&mut c, &a, &mut t),
        #[cfg(feature = "cuda")]
        ("f32" | "c64", true) => device::run::<f32>(&mut c, &a, &mut t),
        #[cfg(feature = "cuda")]
        ("f64" | "c128", true) => device::run::<f64>(&mut c, &a, &mut t),
        (d, _) => Err(zcomm::Error::invalid(format!(
            "--dtype {d}: expected f32, f64, c64 or c128"
        ))),
    };
    step(&c, "report");
    let r = r.and_then(|()| t.finish(&c, &a));
    if c.rank() == 0 {
        if let Ok(ok) = r {
            verdict(&c, ok);
        }
    }
    let code = match r {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            if c.rank() == 0 {
                eprintln!("staging: ERROR BOUND VIOLATED (or a non-blocking result differs)");
            }
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("staging (rank {}): {e}", c.rank());
            ExitCode::from(2)
        }
    };
    exit_code(code)
}

fn init(cfg: Config, gpu_wire: bool) -> Result<Communicator> {
    #[cfg(feature = "cuda")]
    if gpu_wire {
        let g = zcomm::gpu::GpuCodec::new(0)?;
        return Communicator::init_with(cfg, Box::new(zcomm::comm::GpuCompressor::new(g)));
    }
    let _ = gpu_wire;
    Communicator::init(cfg)
}

fn gpu_present() -> bool {
    #[cfg(feature = "cuda")]
    {
        zcomm::gpu::device_available()
    }
    #[cfg(not(feature = "cuda"))]
    {
        false
    }
}

fn bound_limit(b: ErrorBound, lo: f64, hi: f64) -> impl Fn(f64) -> f64 {
    move |x: f64| match b {
        ErrorBound::Abs(e) => e,
        ErrorBound::Noa(e) => e * (hi - lo),
        ErrorBound::Rel(e) => e * x.abs(),
    }
}

/// The times of `--iters` timed calls (slowest rank each): the best (the report's time) and the
/// median (the statistic of the calibrations behind the model).
#[derive(Clone, Copy, Debug)]
struct Timing {
    best: f64,
    median: f64,
}

/// One warm-up, then the best of `iters` (slowest rank each time) and the last result.
fn best<T>(
    c: &mut Communicator,
    iters: usize,
    f: impl FnMut(&mut Communicator) -> Result<T>,
) -> Result<(f64, T)> {
    best_setup(c, iters, |_| Ok(()), f).map(|(t, r)| (t.best, r))
}

/// [`best`] with both statistics and an untimed `setup` before every call (e.g. restoring an
/// in-place operation's input).
fn best_setup<T>(
    c: &mut Communicator,
    iters: usize,
    mut setup: impl FnMut(&mut Communicator) -> Result<()>,
    mut f: impl FnMut(&mut Communicator) -> Result<T>,
) -> Result<(Timing, T)> {
    setup(c)?;
    let (_, first) = timed(c, &mut f);
    let mut out = first?;
    let mut times = Vec::with_capacity(iters.max(1));
    for _ in 0..iters.max(1) {
        setup(c)?;
        let (t, r) = timed(c, &mut f);
        out = r?;
        times.push(t);
    }
    let best = times.iter().copied().fold(f64::INFINITY, f64::min);
    Ok((
        Timing {
            best,
            median: zcomm::model::median(&times),
        },
        out,
    ))
}

/// Raw (`Never`), `Auto` and compressed (`Always`) runs of one operation, in that order (so the
/// output buffers hold the compressed result afterwards).
struct Triple {
    raw: (Timing, OpStats),
    auto: (Timing, OpStats),
    cmp: (Timing, OpStats),
}

fn triple(
    c: &mut Communicator,
    a: &Args,
    op: &str,
    f: impl FnMut(&mut Communicator) -> Result<OpStats>,
) -> Result<Triple> {
    triple_setup(c, a, op, |_| Ok(()), f)
}

/// [`triple`] with an untimed `setup` before every call.
fn triple_setup(
    c: &mut Communicator,
    a: &Args,
    op: &str,
    mut setup: impl FnMut(&mut Communicator) -> Result<()>,
    mut f: impl FnMut(&mut Communicator) -> Result<OpStats>,
) -> Result<Triple> {
    step(c, &format!("{op}: Never"));
    c.set_policy(Policy::Never);
    let raw = best_setup(c, a.iters, &mut setup, &mut f)?;
    step(c, &format!("{op}: Auto"));
    c.set_policy(Policy::Auto(a.c.codec));
    let auto = best_setup(c, a.iters, &mut setup, &mut f)?;
    step(c, &format!("{op}: Always"));
    c.set_policy(Policy::Always(a.c.codec));
    let cmp = best_setup(c, a.iters, &mut setup, &mut f)?;
    Ok(Triple { raw, auto, cmp })
}

/// Result of the bound check of one operation (already reduced over ranks).
#[derive(Clone, Copy)]
struct Check {
    max_err: f64,
    bound: f64,
    ok: bool,
}

/// Check `got` against `want` slice by slice (`parts` ranges, each with its own value range for
/// noa), reduced over ranks.
fn check_parts<S: Element>(
    c: &Communicator,
    b: ErrorBound,
    want: &[S],
    got: &[S],
    parts: &[std::ops::Range<usize>],
) -> Check {
    let (mut err, mut ok, mut bound) = (0.0f64, want.len() == got.len(), 0.0f64);
    if ok {
        for r in parts {
            let (lo, hi) = zcomm::quant::finite_range(&want[r.clone()]).unwrap_or((0.0, 0.0));
            let lim = bound_limit(b, lo, hi);
            let (_, o) = max_err(&want[r.clone()], &got[r.clone()], &lim);
            ok &= o;
            err = err.max(reported_err(b, &want[r.clone()], &got[r.clone()]));
            bound = bound.max(lim(1.0));
        }
    }
    Check {
        max_err: global_max(c, err),
        bound: global_max(c, bound),
        ok: global_max(c, f64::from(u8::from(!ok))) == 0.0,
    }
}

/// Check a reduction result against the exact values `exact` (f64) with the end-to-end bound
/// `e` (absolute), reduced over ranks.
fn check_exact<S: Element>(c: &Communicator, got: &[S], exact: &[f64], e: f64) -> Check {
    let mut err = 0.0f64;
    let mut ok = got.len() == exact.len();
    for (g, x) in got.iter().zip(exact) {
        let d = (g.to_f64() - x).abs();
        if x.is_finite() {
            if matches!(d.partial_cmp(&e), None | Some(std::cmp::Ordering::Greater)) {
                ok = false;
            }
            err = err.max(d);
        }
    }
    Check {
        max_err: global_max(c, err),
        bound: e,
        ok: global_max(c, f64::from(u8::from(!ok))) == 0.0,
    }
}

/// One row of the report.
struct Rec {
    op: String,
    bytes: f64,
    raw_s: f64,
    cmp_s: f64,
    /// Medians of the timed calls (NaN where not taken).
    raw_med: f64,
    cmp_med: f64,
    auto_s: f64,
    /// `Policy::Auto`'s decision and codec (its per-message choice).
    auto: Option<(Decision, Option<zcomm::CodecKind>)>,
    pred_raw: f64,
    pred_cmp: f64,
    ratio: f64,
    check: Check,
    /// More fields of the JSON record (device runs: the measured stages and the model's terms
    /// of the last compressed call).
    extra: serde_json::Map<String, serde_json::Value>,
}

#[derive(Default)]
struct Table {
    rows: Vec<Rec>,
    /// JSON records written before the rows (device runs: the calibration profile).
    meta: Vec<serde_json::Value>,
    notes: Vec<String>,
    all_ok: bool,
    /// Rank 0 prints a progress line per finished row (long runs at 1 GiB per rank).
    progress: Option<std::time::Instant>,
}

fn rel_err(m: f64, p: f64) -> f64 {
    (m - p) / p
}

fn fmt_ms(s: f64) -> String {
    if s.is_finite() {
        format!("{:.3}", s * 1e3)
    } else {
        "-".into()
    }
}

fn fmt_pct(e: f64) -> String {
    if e.is_finite() {
        format!("{:+.1} %", e * 100.0)
    } else {
        "-".into()
    }
}

impl Table {
    fn add_triple(&mut self, c: &Communicator, op: &str, t: &Triple, check: Check) {
        self.add_triple_with(c, op, t, check, Default::default());
    }
    fn add_triple_with(
        &mut self,
        c: &Communicator,
        op: &str,
        t: &Triple,
        check: Check,
        extra: serde_json::Map<String, serde_json::Value>,
    ) {
        let g = |v: f64| global_max(c, v);
        self.push(Rec {
            op: op.into(),
            bytes: t.cmp.1.bytes as f64,
            raw_s: t.raw.0.best,
            cmp_s: t.cmp.0.best,
            raw_med: t.raw.0.median,
            cmp_med: t.cmp.0.median,
            extra,
            auto_s: t.auto.0.best,
            auto: Some((t.auto.1.decision, t.auto.1.codec)),
            pred_raw: g(t.raw.1.predicted_raw_s),
            pred_cmp: g(t.cmp.1.predicted_compressed_s),
            ratio: -g(-t.cmp.1.ratio),
            check,
        });
    }
    fn push(&mut self, r: Rec) {
        if let Some(t0) = self.progress {
            let line = format!(
                "[{:7.1} s] {}: raw {} ms, zcomm {} ms, auto {} ms, model {} / {} ms, ratio {:.2}, max error {:.3e} (bound {:.3e}) {}",
                t0.elapsed().as_secs_f64(),
                r.op,
                fmt_ms(r.raw_s),
                fmt_ms(r.cmp_s),
                fmt_ms(r.auto_s),
                fmt_ms(r.pred_raw),
                fmt_ms(r.pred_cmp),
                r.ratio,
                r.check.max_err,
                r.check.bound,
                if r.check.ok { "ok" } else { "VIOLATED" }
            );
            // on a terminal: the progress line (the table follows on stdout at the end)
            if progress_enabled() {
                progress(&line);
            } else {
                eprintln!("{line}");
            }
        }
        self.rows.push(r);
    }
    fn note(&mut self, c: &Communicator, s: String) {
        if c.rank() == 0 {
            outln!("{s}");
        }
        self.notes.push(s);
    }
    fn finish(&self, c: &Communicator, a: &Args) -> Result<bool> {
        let ok = self.rows.iter().all(|r| r.check.ok) && self.all_ok;
        if c.rank() != 0 {
            return Ok(ok);
        }
        outln!();
        outln!("| operation | raw ms | zcomm ms | speedup | auto ms (decision) | model raw ms | model zcomm ms | pred err raw | pred err zcomm | zcomm median ms (pred err) | ratio | max error | bound | ok |");
        outln!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|");
        for r in &self.rows {
            outln!(
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} ({}) | {:.2} | {:.3e} | {:.3e} | {} |",
                r.op,
                fmt_ms(r.raw_s),
                fmt_ms(r.cmp_s),
                if r.raw_s.is_finite() {
                    format!("{:.2}x", r.raw_s / r.cmp_s)
                } else {
                    "-".into()
                },
                match r.auto {
                    Some((d, Some(c))) => format!("{} ({d:?} {c})", fmt_ms(r.auto_s)),
                    Some((d, None)) => format!("{} ({d:?})", fmt_ms(r.auto_s)),
                    None => "-".into(),
                },
                fmt_ms(r.pred_raw),
                fmt_ms(r.pred_cmp),
                fmt_pct(rel_err(r.raw_s, r.pred_raw)),
                fmt_pct(rel_err(r.cmp_s, r.pred_cmp)),
                fmt_ms(r.cmp_med),
                fmt_pct(rel_err(r.cmp_med, r.pred_cmp)),
                r.ratio,
                r.check.max_err,
                r.check.bound,
                if r.check.ok { "ok" } else { "BOUND VIOLATED" }
            );
        }
        if let Some(path) = &a.json {
            use std::io::Write as _;
            let mut f = std::fs::File::create(path)?;
            let num = |v: f64| {
                if v.is_finite() {
                    serde_json::json!(v)
                } else {
                    serde_json::Value::Null
                }
            };
            for m in &self.meta {
                writeln!(f, "{m}")?;
            }
            for r in &self.rows {
                let mut rec = serde_json::json!({
                    "op": r.op,
                    "ranks": c.size(),
                    "dtype": a.c.dtype,
                    "error_bound": a.c.error_bound.to_string(),
                    "codec": a.c.codec.to_string(),
                    "bytes": r.bytes,
                    "raw_s": num(r.raw_s),
                    "zcomm_s": num(r.cmp_s),
                    "auto_s": num(r.auto_s),
                    "auto_decision": r.auto.map(|(d, _)| format!("{d:?}")),
                    "auto_codec": r.auto.and_then(|(_, c)| c).map(|c| c.to_string()),
                    "pred_raw_s": num(r.pred_raw),
                    "pred_zcomm_s": num(r.pred_cmp),
                    "pred_err_raw": num(rel_err(r.raw_s, r.pred_raw)),
                    "pred_err_zcomm": num(rel_err(r.cmp_s, r.pred_cmp)),
                    "raw_median_s": num(r.raw_med),
                    "zcomm_median_s": num(r.cmp_med),
                    "pred_err_raw_median": num(rel_err(r.raw_med, r.pred_raw)),
                    "pred_err_zcomm_median": num(rel_err(r.cmp_med, r.pred_cmp)),
                    "iters": a.iters,
                    "ratio": num(r.ratio),
                    "max_err": r.check.max_err,
                    "bound": r.check.bound,
                    "ok": r.check.ok,
                });
                if let Some(o) = rec.as_object_mut() {
                    o.extend(r.extra.clone());
                }
                writeln!(f, "{rec}")?;
            }
        }
        Ok(ok)
    }
}

/// Host buffers with the communicator's (CPU) codec: the same operations on host memory.
fn host<E: CommElement>(c: &mut Communicator, a: &Args, t: &mut Table) -> Result<()> {
    let (p, rank) = (c.size(), c.rank());
    let gen = |r: usize| load::<E>(&a.c, r, p, 1 << 22, field::<E>);
    let data = gen(rank)?;
    let n = (-global_max(c, -(data.len() as f64))) as usize;
    let all: Vec<Vec<E>> = (0..p)
        .map(|r| {
            gen(r).map(|mut v| {
                v.truncate(n);
                v
            })
        })
        .collect::<Result<_>>()?;
    let data = &all[rank];
    info(
        c,
        "staging (host buffers, CPU codec: no GPU)",
        n,
        E::NAME,
        &a.c,
    );
    let b = a.c.error_bound;
    let sc = E::scalars(data);
    let ns = sc.len();
    let bytes = (ns * <E::Scalar as Element>::SIZE) as f64;
    #[allow(clippy::single_range_in_vec_init)]
    let whole = [0..ns];
    // stage = compress into host memory, restore = decompress
    if a.wants("stage") {
        step(c, "stage/restore (host)");
        let (t_raw, _) = best(c, a.iters, |_| Ok(sc.to_vec()))?;
        let (t_c, stream) = best(c, a.iters, |_| zcomm::compress(sc, b, a.c.codec))?;
        let mut back = vec![<E::Scalar as Element>::from_f64(0.0); ns];
        let (t_d, _) = best(c, a.iters, |_| zcomm::decompress_into(&stream, &mut back))?;
        let ck = check_parts(c, b, sc, &back, &whole);
        let ratio = -global_max(c, -(bytes / stream.len() as f64));
        let sp = c
            .profile()
            .codec_speed(a.c.codec, <E::Scalar as Element>::DTYPE);
        let (pc, pd) = sp.map_or((f64::NAN, f64::NAN), |s| {
            (bytes / s.compress, bytes / s.decompress)
        });
        for (op, tc, pred) in [
            ("stage (compress, host)", t_c, pc),
            ("restore (decompress, host)", t_d, pd),
        ] {
            t.push(Rec {
                op: op.into(),
                bytes,
                raw_s: t_raw,
                cmp_s: tc,
                auto_s: f64::NAN,
                auto: None,
                pred_raw: f64::NAN,
                pred_cmp: pred,
                ratio,
                check: ck,
                raw_med: f64::NAN,
                cmp_med: f64::NAN,
                extra: Default::default(),
            });
        }
    }
    // sendrecv with the partner
    let partner = if (rank ^ 1) < p { rank ^ 1 } else { rank };
    if a.wants("sendrecv") {
        let mut got = vec![E::default(); n];
        let tr = triple(c, a, "sendrecv (host)", |c| {
            c.sendrecv(data, partner, &mut got, partner, 1)
        })?;
        let ck = check_parts(c, b, E::scalars(&all[partner]), E::scalars(&got), &whole);
        t.add_triple(c, "sendrecv (host)", &tr, ck);
    }
    // allgather
    if a.wants("allgather") {
        let mut out = vec![E::default(); n * p];
        let tr = triple(c, a, "allgather (host)", |c| c.allgather(data, &mut out))?;
        let want: Vec<E> = all.concat();
        let parts: Vec<_> = (0..p).map(|k| k * ns..(k + 1) * ns).collect();
        let ck = check_parts(c, b, E::scalars(&want), E::scalars(&out), &parts);
        t.add_triple(c, "allgather (host)", &tr, ck);
    }
    // bcast from 0 (a fresh copy every call so the root's source stays exact)
    if a.wants("bcast") {
        let mut buf = data.to_vec();
        let tr = triple(c, a, "bcast (host)", |c| {
            buf.copy_from_slice(data);
            c.bcast(&mut buf, 0)
        })?;
        let ck = check_parts(c, b, E::scalars(&all[0]), E::scalars(&buf), &whole);
        t.add_triple(c, "bcast (host)", &tr, ck);
    }
    if matches!(b, ErrorBound::Rel(_)) {
        t.note(
            c,
            "reductions skipped: rel bounds are not supported for reductions".into(),
        );
        return Ok(());
    }
    let exact = exact_sum(
        &all.iter()
            .map(|v| E::scalars(v).to_vec())
            .collect::<Vec<_>>(),
    );
    let e_res = result_bound(b, &all.iter().map(|v| E::scalars(v)).collect::<Vec<_>>());
    let mut out = vec![E::default(); n];
    if a.wants("allreduce") {
        let tr = triple(c, a, "allreduce (host)", |c| c.allreduce(data, &mut out))?;
        let ck = check_exact(c, E::scalars(&out), &exact, e_res);
        t.add_triple(c, "allreduce (host)", &tr, ck);
    }
    if a.wants("allreduce_mean") {
        let tr = triple(c, a, "allreduce_mean (host)", |c| {
            c.allreduce_mean(data, &mut out)
        })?;
        let mean: Vec<f64> = exact.iter().map(|x| x / p as f64).collect();
        let ck = check_exact(c, E::scalars(&out), &mean, e_res);
        t.add_triple(c, "allreduce_mean (host)", &tr, ck);
    }
    if a.wants("reduce_scatter") {
        let seg = partition(n, p)[rank].clone();
        let mut out = vec![E::default(); seg.len()];
        let tr = triple(c, a, "reduce_scatter (host)", |c| {
            c.reduce_scatter(data, &mut out)
        })?;
        let l = E::LANES;
        let ck = check_exact(
            c,
            E::scalars(&out),
            &exact[seg.start * l..seg.end * l],
            e_res,
        );
        t.add_triple(c, "reduce_scatter (host)", &tr, ck);
    }
    Ok(())
}

/// The report's first lines (rank 0): what runs, the communicator's calibration profile, and how
/// times are taken.
fn info(c: &Communicator, what: &str, n: usize, dtype: &str, a: &Common) {
    describe(c, what, n, dtype, a);
    if c.rank() == 0 {
        outln!("times: slowest rank, best (and median) of --iters after one warm-up; pred err = (measured - model) / model");
    }
}

/// The exact (f64) element-wise sum of every rank's scalars.
fn exact_sum<S: Element>(all: &[Vec<S>]) -> Vec<f64> {
    let mut s = vec![0.0f64; all.first().map_or(0, |v| v.len())];
    for v in all {
        for (o, x) in s.iter_mut().zip(v) {
            *o += x.to_f64();
        }
    }
    s
}

/// The guaranteed absolute bound of a reduction result: `abs:E`, or `noa:E` times the global
/// value range of all inputs.
fn result_bound<S: Element>(b: ErrorBound, all: &[&[S]]) -> f64 {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in all {
        if let Some((l, h)) = zcomm::quant::finite_range(v) {
            lo = lo.min(l);
            hi = hi.max(h);
        }
    }
    match b {
        ErrorBound::Abs(e) => e,
        ErrorBound::Noa(e) => e * (hi - lo).max(0.0),
        ErrorBound::Rel(_) => f64::NAN,
    }
}

#[cfg(feature = "cuda")]
mod device {
    use super::*;
    use zcomm::comm::device::CALIBRATION_MIN_VALUES;
    use zcomm::comm::{DeviceStager, Real};
    use zcomm::gpu::{GpuCodec, GpuElement};

    fn gerr(e: cudarc::driver::DriverError) -> zcomm::Error {
        zcomm::Error::Gpu(format!("{e:?}"))
    }

    /// JSON fields of the last call on `dev`: its measured stages (`dev.last`, each the slowest
    /// rank's) and the model's terms of the path it took (`dev.last_predicted`, at the ratios it
    /// achieved; the largest over ranks), so a record shows which term misses.
    fn stages(c: &Communicator, dev: &DeviceStager) -> serde_json::Map<String, serde_json::Value> {
        let g = |v: f64| global_max(c, v);
        let (m, p) = (dev.last, dev.last_predicted);
        let v = serde_json::json!({
            "measured_stages": {
                "compress": g(m.compress),
                "d2h": g(m.d2h),
                "network": g(m.network),
                "h2d": g(m.h2d),
                "decompress": g(m.decompress),
            },
            "predicted_terms": {
                "compress": g(p.compress),
                "d2h": g(p.d2h),
                "link": g(p.link),
                "h2d": g(p.h2d),
                "decompress": g(p.decompress),
                "device": g(p.device),
                "total": g(p.total()),
            },
        });
        match v {
            serde_json::Value::Object(o) => o,
            _ => Default::default(),
        }
    }

    pub fn run<S>(c: &mut Communicator, a: &Args, t: &mut Table) -> Result<()>
    where
        S: GpuElement + Real + CommElement<Scalar = S>,
        [S; 2]: CommElement<Scalar = S>,
    {
        let (p, rank) = (c.size(), c.rank());
        // complex dtypes: the interleaved scalars
        let lanes = if a.c.dtype.starts_with('c') { 2 } else { 1 };
        let gen = |r: usize| -> Result<Vec<S>> {
            Ok(match lanes {
                1 => load::<S>(&a.c, r, p, 1 << 26, field::<S>)?,
                _ => {
                    let v = load::<[S; 2]>(&a.c, r, p, 1 << 25, field::<[S; 2]>)?;
                    <[S; 2] as CommElement>::scalars(&v).to_vec()
                }
            })
        };
        let mine = gen(rank)?;
        let n = (-global_max(c, -(mine.len() as f64))) as usize;
        drop(mine);
        let all: Vec<Vec<S>> = (0..p)
            .map(|r| {
                gen(r).map(|mut v| {
                    v.truncate(n);
                    v
                })
            })
            .collect::<Result<_>>()?;
        let data = &all[rank];
        let bytes = (n * S::SIZE) as f64;
        let b = a.c.error_bound;
        #[allow(clippy::single_range_in_vec_init)]
        let whole = [0..n];
        let gpu = GpuCodec::new(0)?;
        let dev_name = gpu.device_name().to_string();
        let mut dev = DeviceStager::new(gpu);
        // the codec and staging calibrated at the operations' size (at least 64 MiB, at most
        // 1 GiB of f32), every rank at once
        let cal = (n * S::SIZE / 4).clamp(CALIBRATION_MIN_VALUES, 1 << 28);
        let profile = dev.calibrate(c, cal, a.c.codec)?;
        // the calibrated codec's model (its GPU lines with the profile's curves)
        let prof = profile.staged(a.c.codec);
        info(
            c,
            &format!("staging (device buffers on {dev_name}, GPU codec)"),
            n,
            S::NAME,
            &a.c,
        );
        if rank == 0 {
            outln!(
                "device profile ({} ranks at once, {} MiB field): GPU compress {} decompress {}; pinned staging (d2h/h2d):",
                p,
                (cal * 4) >> 20,
                zcomm::model::fmt_rate(prof.c.compress),
                zcomm::model::fmt_rate(prof.c.decompress),
            );
            // one line per calibrated point: d2h / h2d rate
            let print_curve = |curve: &zcomm::model::StagingCurve, label: &str| {
                for q in &curve.points {
                    outln!(
                        "    {:>10.1} MiB{label}: {} / {}",
                        q.bytes / 1048576.0,
                        zcomm::model::fmt_rate(q.bytes / q.d2h),
                        zcomm::model::fmt_rate(q.bytes / q.h2d)
                    );
                }
            };
            print_curve(&prof.staging_curve, "");
            outln!(
                "  per call: compress +{:.1} us, decompress +{:.1} us, decompress-add {} +{:.1} us; device copy {}, range pass {}, scale {}",
                prof.c.compress_overhead * 1e6,
                prof.c.decompress_overhead * 1e6,
                zcomm::model::fmt_rate(prof.c.decompress_add),
                prof.c.decompress_add_overhead * 1e6,
                zcomm::model::fmt_rate(prof.device_copy),
                zcomm::model::fmt_rate(prof.range_pass),
                zcomm::model::fmt_rate(prof.scale_pass),
            );
            // one rank alone (rank 0 while the others wait), the one-way link, the placement
            outln!(
                "  one rank alone: compress {} +{:.1} us, decompress {} +{:.1} us; {} rank(s) per GPU",
                zcomm::model::fmt_rate(prof.c.compress_solo),
                prof.c.compress_solo_overhead * 1e6,
                zcomm::model::fmt_rate(prof.c.decompress_solo),
                prof.c.decompress_solo_overhead * 1e6,
                prof.ranks_per_gpu,
            );
            print_curve(&prof.staging_curve_solo, " alone");
            for &(bytes, seconds) in &prof.link_one_way.points {
                // the pinned exchange at the same size (both ranks sending), per direction
                let x = prof
                    .link_exchange
                    .seconds(bytes)
                    .map_or_else(|| "-".into(), |s| zcomm::model::fmt_rate(bytes / s));
                outln!(
                    "  one-way link {:>8.1} MiB: {} (exchange {x}, host ping-pong {} per direction)",
                    bytes / 1048576.0,
                    zcomm::model::fmt_rate(bytes / seconds),
                    zcomm::model::fmt_rate(c.profile().link.bandwidth),
                );
            }
            outln!(
                "  host addition of the raw reduce-scatter: {}",
                zcomm::model::fmt_rate(c.profile().host_add)
            );
        }
        // the calibration behind every prediction, first in the JSON file
        t.meta.push(serde_json::json!({
            "op": "profile",
            "ranks": p,
            "device": dev_name,
            "calibration_bytes": cal * 4,
            "link": {
                "bandwidth": c.profile().link.bandwidth,
                "latency": c.profile().link.latency,
            },
            "host_add": c.profile().host_add,
            // every field, the solo rates (`*_solo`, `staging_curve_solo`), the one-way link
            // (`link_one_way`), the pinned exchange (`link_exchange`) and `ranks_per_gpu`
            // included
            "device_profile": &profile,
        }));
        let s = dev.gpu().stream().clone();
        let d_in = s.clone_htod(data).map_err(gerr)?;
        let mut d_out = s.alloc_zeros::<S>(n).map_err(gerr)?;
        let fetch = |d: &cudarc::driver::CudaSlice<S>| s.clone_dtoh(d).map_err(gerr);

        // 1. stage_to_host / restore_to_device vs raw copies
        if a.wants("stage") {
            step(c, "stage_to_host / restore_to_device");
            let mut host_raw = dev.alloc_pinned(n * S::SIZE)?;
            let nb = n * S::SIZE;
            let (t_d2h, _) = best(c, a.iters, |_| {
                dev.copy_to_host(
                    &d_in.slice(..),
                    &mut host_raw.as_mut_slice().map_err(gerr)?[..nb],
                )
            })?;
            let mut staged = dev.stage_to_host(&d_in.slice(..), b, a.c.codec)?;
            let (t_stage, _) = best_setup(
                c,
                a.iters,
                |_| Ok(()),
                |_| dev.restage(&d_in.slice(..), b, a.c.codec, &mut staged),
            )?;
            let x_stage = stages(c, &dev);
            let (t_h2d, _) = best(c, a.iters, |_| {
                dev.copy_to_device(
                    &host_raw.as_slice().map_err(gerr)?[..nb],
                    &mut d_out.slice_mut(..),
                )
            })?;
            let (t_restore, _) = best_setup(
                c,
                a.iters,
                |_| Ok(()),
                |_| dev.restore_to_device(&staged, &mut d_out.slice_mut(..)),
            )?;
            let x_restore = stages(c, &dev);
            let ck = check_parts(c, b, data, &fetch(&d_out)?, &whole);
            let ratio = -global_max(c, -staged.ratio());
            let (pr_s, pc_s) = prof.predict_stage_to_host(bytes, ratio);
            let (pr_r, pc_r) = prof.predict_restore_to_device(bytes, ratio);
            for (op, tr, tc, pr, pc, x) in [
                ("stage_to_host", t_d2h, t_stage, pr_s, pc_s, x_stage),
                ("restore_to_device", t_h2d, t_restore, pr_r, pc_r, x_restore),
            ] {
                t.push(Rec {
                    op: op.into(),
                    bytes,
                    raw_s: tr,
                    cmp_s: tc.best,
                    raw_med: f64::NAN,
                    cmp_med: tc.median,
                    auto_s: f64::NAN,
                    auto: None,
                    pred_raw: pr,
                    pred_cmp: pc,
                    ratio,
                    check: ck,
                    extra: x,
                });
            }
            drop(staged);
            drop(host_raw);
        }

        // 2. sendrecv_device: whole message, then chunk-pipelined (16 MiB chunks above 32 MiB)
        let partner = if (rank ^ 1) < p { rank ^ 1 } else { rank };
        let mut d_recv = s.alloc_zeros::<S>(n).map_err(gerr)?;
        for (name, key, chunk, min, tag) in [
            (
                "sendrecv_device",
                "sendrecv_device",
                1usize << 40,
                usize::MAX,
                1,
            ),
            (
                "sendrecv_device pipelined",
                "sendrecv_device_pipelined",
                16 << 20,
                32 << 20,
                2,
            ),
        ] {
            if !a.wants(key) {
                continue;
            }
            c.set_pipeline(chunk, min);
            let chunks0 = c.pipeline_chunks();
            let tr = triple(c, a, name, |c| {
                c.sendrecv_device(
                    &mut dev,
                    &d_in.slice(..),
                    partner,
                    &mut d_recv.slice_mut(..),
                    partner,
                    tag,
                )
            })?;
            let moved = c.pipeline_chunks() - chunks0;
            let ck = check_parts(c, b, &all[partner], &fetch(&d_recv)?, &whole);
            let label = if moved > 0 {
                format!("{name} (16 MiB chunks, {moved} moved)")
            } else {
                name.to_string()
            };
            let x = stages(c, &dev);
            t.add_triple_with(c, &label, &tr, ck, x);
            if rank == 0 {
                outln!("stages of the last {name} call (rank 0): {:?}", dev.last);
            }
        }
        c.set_pipeline(32 << 20, 64 << 20);

        // 3. allgather_device
        let mut d_all = s.alloc_zeros::<S>(n * p).map_err(gerr)?;
        let mut ag_cmp = None;
        if a.wants("allgather_device") {
            let tr = triple(c, a, "allgather_device", |c| {
                c.allgather_device(&mut dev, &d_in.slice(..), &mut d_all.slice_mut(..))
            })?;
            let want = all.concat();
            let parts: Vec<_> = (0..p).map(|k| k * n..(k + 1) * n).collect();
            let x = stages(c, &dev);
            let ck = check_parts(c, b, &want, &fetch(&d_all)?, &parts);
            t.add_triple_with(c, "allgather_device", &tr, ck, x);
            ag_cmp = Some(fetch(&d_all)?);
        }

        // 4. bcast_device from root 0: the blocking form (pinned staging buffers, the form the
        // model describes), in place on a device copy of the input restored before every call
        // (untimed), then the non-blocking form (lent pinned staging buffers) once, compared
        if a.wants("bcast_device") {
            let d_bc = std::cell::RefCell::new(s.alloc_zeros::<S>(n).map_err(gerr)?);
            let tr = triple_setup(
                c,
                a,
                "bcast_device",
                |_| {
                    s.memcpy_dtod(&d_in, &mut *d_bc.borrow_mut())
                        .map_err(gerr)?;
                    s.synchronize().map_err(gerr)
                },
                |c| c.bcast_device(&mut dev, &mut d_bc.borrow_mut().slice_mut(..), 0),
            )?;
            let x = stages(c, &dev);
            let bc_cmp = fetch(&d_bc.borrow())?;
            let ck = check_parts(c, b, &all[0], &bc_cmp, &whole);
            t.add_triple_with(c, "bcast_device", &tr, ck, x);
            drop(d_bc);
            step(c, "ibcast_device + wait_bcast_device");
            c.set_policy(Policy::Always(a.c.codec));
            let (tn, _) = best_setup(
                c,
                a.iters,
                |_| Ok(()),
                |c| {
                    let req = c.ibcast_device(&mut dev, &d_in.slice(..), 0)?;
                    c.wait_bcast_device(&mut dev, req, &mut d_out.slice_mut(..))
                },
            )?;
            let same = fetch(&d_out)? == bc_cmp;
            nb_check(c, t, "ibcast_device = bcast_device", same);
            t.note(
                c,
                format!(
                    "ibcast_device + wait_bcast_device (compressed, pinned staging buffers): best {} ms, median {} ms (blocking bcast_device {} ms)",
                    fmt_ms(tn.best),
                    fmt_ms(tn.median),
                    fmt_ms(tr.cmp.0.best)
                ),
            );
        }

        // 5. reductions
        if matches!(b, ErrorBound::Rel(_)) {
            t.note(
                c,
                "reductions skipped: rel bounds are not supported for reductions".into(),
            );
        } else {
            let exact = exact_sum(&all);
            let e_res = result_bound(b, &all.iter().map(|v| v.as_slice()).collect::<Vec<_>>());
            let nb = a.wants("nonblocking") && c.has_progress_thread();
            if a.wants("allreduce_device") {
                let tr = triple(c, a, "allreduce_device", |c| {
                    c.allreduce_device(&mut dev, &d_in.slice(..), &mut d_out.slice_mut(..))
                })?;
                let x = stages(c, &dev);
                let sum = fetch(&d_out)?;
                let ck = check_exact(c, &sum, &exact, e_res);
                t.add_triple_with(c, "allreduce_device", &tr, ck, x);
                // non-blocking form (compressed): identical to the blocking result
                if nb {
                    step(c, "iallreduce_device");
                    let req = c.iallreduce_device(&mut dev, &d_in.slice(..))?;
                    c.wait_device(&mut dev, req, &mut d_out.slice_mut(..))?;
                    let same = fetch(&d_out)? == sum;
                    nb_check(c, t, "iallreduce_device = allreduce_device", same);
                }
            }
            if a.wants("allreduce_mean_device") {
                let tr = triple(c, a, "allreduce_mean_device", |c| {
                    c.allreduce_mean_device(&mut dev, &d_in.slice(..), &mut d_out.slice_mut(..))
                })?;
                let x = stages(c, &dev);
                let mean_v = fetch(&d_out)?;
                let mean: Vec<f64> = exact.iter().map(|x| x / p as f64).collect();
                let ck = check_exact(c, &mean_v, &mean, e_res);
                t.add_triple_with(c, "allreduce_mean_device", &tr, ck, x);
                if nb {
                    step(c, "iallreduce_mean_device");
                    let req = c.iallreduce_mean_device(&mut dev, &d_in.slice(..))?;
                    c.wait_device(&mut dev, req, &mut d_out.slice_mut(..))?;
                    let same = fetch(&d_out)? == mean_v;
                    nb_check(c, t, "iallreduce_mean_device = allreduce_mean_device", same);
                }
            }
            if a.wants("reduce_scatter_device") {
                let seg = partition(n, p)[rank].clone();
                let mut d_seg = s.alloc_zeros::<S>(seg.len().max(1)).map_err(gerr)?;
                let tr = triple(c, a, "reduce_scatter_device", |c| {
                    c.reduce_scatter_device(
                        &mut dev,
                        &d_in.slice(..),
                        &mut d_seg.slice_mut(..seg.len()),
                    )
                })?;
                let x = stages(c, &dev);
                let rs = fetch(&d_seg)?;
                let rs = &rs[..seg.len()];
                let ck = check_exact(c, rs, &exact[seg.clone()], e_res);
                t.add_triple_with(c, "reduce_scatter_device", &tr, ck, x);
                if nb {
                    step(c, "ireduce_scatter_device");
                    let req = c.ireduce_scatter_device(&mut dev, &d_in.slice(..))?;
                    c.wait_device(&mut dev, req, &mut d_seg.slice_mut(..seg.len()))?;
                    let same = fetch(&d_seg)?[..seg.len()] == *rs;
                    nb_check(c, t, "ireduce_scatter_device = reduce_scatter_device", same);
                }
            }
        }
        if a.wants("nonblocking") {
            if c.has_progress_thread() {
                step(c, "isendrecv_device");
                let req = c.isendrecv_device(&mut dev, &d_in.slice(..), partner, n, partner, 3)?;
                c.wait_device(&mut dev, req, &mut d_recv.slice_mut(..))?;
                let ck = check_parts(c, b, &all[partner], &fetch(&d_recv)?, &whole);
                nb_check(c, t, "isendrecv_device within the bound", ck.ok);
            } else {
                t.note(
                    c,
                    "non-blocking reductions / isendrecv_device skipped: no progress thread (MPI_THREAD_MULTIPLE)"
                        .into(),
                );
            }
        }
        if let (true, Some(ag_cmp)) = (a.wants("nonblocking"), ag_cmp) {
            step(c, "iallgather_device");
            let req = c.iallgather_device(&mut dev, &d_in.slice(..))?;
            c.wait_allgather_device(&mut dev, req, &mut d_all.slice_mut(..))?;
            let same = fetch(&d_all)? == ag_cmp;
            nb_check(c, t, "iallgather_device = allgather_device", same);
        }
        Ok(())
    }

    /// Record a non-blocking / alternative-form consistency check (all ranks).
    fn nb_check(c: &Communicator, t: &mut Table, what: &str, ok: bool) {
        let ok = global_max(c, f64::from(u8::from(!ok))) == 0.0;
        t.all_ok &= ok;
        t.note(
            c,
            format!("check: {what}: {}", if ok { "ok" } else { "FAILED" }),
        );
    }
}
