//! Helpers shared by the MPI examples: arguments, input loading, reports, bound checks, checked
//! stdout ([`outln!`]) and a progress line ([`progress`]).
#![allow(dead_code, unused_macros, unused_imports)]

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use zcomm::comm::{partition, CommElement, Communicator, OpStats, ReduceOp};
use zcomm::{CodecKind, Element, Error, ErrorBound, Result};

/// Arguments every example accepts.
#[derive(clap::Args, Debug, Clone)]
pub struct Common {
    /// Raw little-endian array to use instead of generated data (c64/c128: interleaved re, im).
    #[arg(long)]
    pub input: Option<PathBuf>,
    /// Element type: f32, f64, c64 (complex of f32), c128 (complex of f64).
    #[arg(long, default_value = "f32")]
    pub dtype: String,
    /// Error bound: abs:E, noa:E (value-range relative) or rel:E (point-wise).
    #[arg(long, default_value = "noa:1e-3", value_parser = parse_bound)]
    pub error_bound: ErrorBound,
    /// Codec.
    #[arg(long, default_value = "aatrox", value_parser = parse_codec)]
    pub codec: CodecKind,
    /// Elements per rank when generating data (each example's [`parse_args`] names its default).
    #[arg(long)]
    pub n: Option<usize>,
    /// With --input: `slice` (each rank takes its part of the file), `copy` (each rank takes
    /// the whole file) or `tile` (each rank takes `--n` elements: the file repeated, starting at
    /// element `rank * len / size`, so that a small real field fills a large message and the
    /// ranks hold different data).
    #[arg(long, default_value = "slice")]
    pub share: String,
}

fn parse_bound(s: &str) -> std::result::Result<ErrorBound, String> {
    s.parse().map_err(|e: Error| e.to_string())
}
fn parse_codec(s: &str) -> std::result::Result<CodecKind, String> {
    s.parse().map_err(|e: Error| e.to_string())
}

/// This rank's data: the file's slice/copy, or `gen(rank, n)`.
pub fn load<E: CommElement>(
    a: &Common,
    rank: usize,
    size: usize,
    default_n: usize,
    gen: impl Fn(usize, usize) -> Vec<E>,
) -> Result<Vec<E>> {
    let Some(path) = &a.input else {
        return Ok(gen(rank, a.n.unwrap_or(default_n)));
    };
    let bytes = std::fs::read(path)
        .map_err(|e| Error::invalid(format!("cannot read `{}`: {e}", path.display())))?;
    let es = E::LANES * <E::Scalar as Element>::SIZE;
    if bytes.len() % es != 0 {
        return Err(Error::invalid(format!(
            "`{}` has {} bytes, not a whole number of {} elements",
            path.display(),
            bytes.len(),
            E::NAME
        )));
    }
    let total = bytes.len() / es;
    let range = match a.share.as_str() {
        "copy" | "tile" => 0..total,
        "slice" => partition(total, size)[rank].clone(),
        s => {
            return Err(Error::invalid(format!(
                "--share {s}: expected slice, copy or tile"
            )))
        }
    };
    let mut v = vec![E::default(); range.len()];
    for (o, c) in E::scalars_mut(&mut v)
        .iter_mut()
        .zip(bytes[range.start * es..range.end * es].chunks_exact(<E::Scalar as Element>::SIZE))
    {
        *o = <E::Scalar as Element>::read_le(c);
    }
    if a.share == "tile" {
        if v.is_empty() {
            return Err(Error::invalid(format!(
                "`{}` is empty: nothing to tile",
                path.display()
            )));
        }
        let n = a.n.unwrap_or(default_n);
        let start = rank * v.len() / size.max(1);
        return Ok(v.iter().cycle().skip(start).take(n).copied().collect());
    }
    Ok(v)
}

/// A smooth field with a little noise, different per rank (phase and offset).
pub fn field<E: CommElement>(rank: usize, n: usize) -> Vec<E> {
    let mut v = vec![E::default(); n];
    let mut s = (rank as u64 + 7).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    for (i, o) in E::scalars_mut(&mut v).iter_mut().enumerate() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        let noise = (s >> 11) as f64 / (1u64 << 53) as f64 - 0.5;
        let x = i as f64 * 2e-4;
        let val = (x + rank as f64).sin() * 2.0 + (x * 3.1).cos() * 0.5 + 1e-3 * noise;
        *o = <E::Scalar as Element>::from_f64(val);
    }
    v
}

/// Max over ranks.
pub fn global_max(c: &Communicator, v: f64) -> f64 {
    let mut x = [v];
    c.transport()
        .allreduce_f64(&mut x, ReduceOp::Max)
        .expect("allreduce");
    x[0]
}

/// Min and max of the finite scalars over all ranks.
pub fn global_range<S: Element>(c: &Communicator, v: &[S]) -> (f64, f64) {
    let (lo, hi) = zcomm::quant::finite_range(v).unwrap_or((f64::INFINITY, f64::NEG_INFINITY));
    let mut x = [-lo, hi];
    c.transport()
        .allreduce_f64(&mut x, ReduceOp::Max)
        .expect("allreduce");
    (-x[0], x[1])
}

/// Max |a - b| over the scalars, and whether each pair is within `limit(a)`.
pub fn max_err<S: Element>(a: &[S], b: &[S], limit: impl Fn(f64) -> f64) -> (f64, bool) {
    let mut worst: f64 = 0.0;
    let mut ok = a.len() == b.len();
    for (x, y) in a.iter().zip(b) {
        let (x, y) = (x.to_f64(), y.to_f64());
        if !x.is_finite() && x.to_bits() == y.to_bits() {
            continue;
        }
        let e = (x - y).abs();
        worst = worst.max(e);
        if matches!(
            e.partial_cmp(&limit(x)),
            None | Some(std::cmp::Ordering::Greater)
        ) {
            ok = false;
        }
    }
    (worst, ok)
}

/// The error to report under bound `b`: max |a-b| (abs, noa) or max |a-b|/|a| (rel).
pub fn reported_err<S: Element>(bound: ErrorBound, a: &[S], b: &[S]) -> f64 {
    let rel = matches!(bound, ErrorBound::Rel(_));
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            let (x, y) = (x.to_f64(), y.to_f64());
            if !x.is_finite() {
                0.0
            } else if rel {
                if x == 0.0 {
                    y.abs()
                } else {
                    (x - y).abs() / x.abs()
                }
            } else {
                (x - y).abs()
            }
        })
        .fold(0.0, f64::max)
}

/// One row of the report.
pub struct Row {
    /// Operation.
    pub op: String,
    /// Slowest rank's wall time, raw path (s).
    pub raw_s: f64,
    /// Slowest rank's wall time, compressed path (s).
    pub cmp_s: f64,
    /// Stats of the compressed call (rank 0).
    pub stats: OpStats,
    /// Max error over ranks.
    pub max_err: f64,
    /// The bound it was checked against.
    pub bound: f64,
    /// Whether the bound held on every rank.
    pub ok: bool,
}

/// Print what runs (ranks, size, bound, codec) and the communicator's calibration profile (rank 0).
pub fn describe(c: &Communicator, what: &str, n: usize, dtype: &str, a: &Common) {
    if c.rank() == 0 {
        let prof = c.profile();
        outln!(
            "{what}: {} ranks, {n} {dtype} elements per rank ({:.1} MiB), bound {}, codec {}",
            c.size(),
            n as f64 * dtype_bytes(dtype) / 1048576.0,
            a.error_bound,
            a.codec
        );
        let sp = prof.codecs.first();
        outln!(
            "profile: link {} latency {:.1} us; codec compress {} decompress {} ({})",
            zcomm::model::fmt_rate(prof.link.bandwidth),
            prof.link.latency * 1e6,
            sp.map(|s| zcomm::model::fmt_rate(s.compress))
                .unwrap_or_default(),
            sp.map(|s| zcomm::model::fmt_rate(s.decompress))
                .unwrap_or_default(),
            prof.compressor
        );
        if matches!(a.error_bound, ErrorBound::Rel(_)) {
            outln!("(rel bound: `max err` and `bound` are point-wise relative errors)");
        }
    }
}

/// Print the header line of the report: [`describe`], then the column names.
pub fn header(c: &Communicator, what: &str, n: usize, dtype: &str, a: &Common) {
    describe(c, what, n, dtype, a);
    if c.rank() == 0 {
        outln!(
            "{:<30} {:>10} {:>10} {:>8} {:>12} {:>12} {:>8} {:>7} {:>11} {:>11}",
            "operation",
            "raw ms",
            "zcomm ms",
            "speedup",
            "pred raw ms",
            "pred zc ms",
            "pred err",
            "ratio",
            "max err",
            "bound"
        );
    }
    legend(c);
}

/// Print one report row on rank 0.
pub fn print_row(c: &Communicator, r: &Row) {
    if c.rank() == 0 {
        let pred = r.stats.predicted_s;
        outln!(
            "{:<30} {:>10.3} {:>10.3} {:>8.2} {:>12.3} {:>12.3} {:>7.1}% {:>7.2} {:>11.3e} {:>11.3e}{}",
            format!("{} [{:?}]", r.op, r.stats.decision),
            r.raw_s * 1e3,
            r.cmp_s * 1e3,
            r.raw_s / r.cmp_s,
            r.stats.predicted_raw_s * 1e3,
            pred * 1e3,
            (r.cmp_s - pred) / pred * 100.0,
            r.stats.ratio,
            r.max_err,
            r.bound,
            if r.ok { "" } else { "  BOUND VIOLATED" }
        );
    }
}

/// Bytes per element of a dtype name.
pub fn dtype_bytes(d: &str) -> f64 {
    match d {
        "f32" => 4.0,
        "f64" | "c64" => 8.0,
        "c128" => 16.0,
        _ => 0.0,
    }
}

/// Time `f` on every rank after a barrier; returns (slowest rank's seconds, result).
pub fn timed<T>(c: &mut Communicator, f: impl FnOnce(&mut Communicator) -> T) -> (f64, T) {
    c.barrier().expect("barrier");
    let t0 = c.wtime();
    let r = f(c);
    let dt = c.wtime() - t0;
    (global_max(c, dt), r)
}

/// Set up tracing (`ZCOMM_LOG=debug` shows every operation's stats).
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("ZCOMM_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .try_init();
}

/// Parse the example's arguments; `n_default` is what `--help` shows as `--n`'s default (the
/// examples pick different sizes, so [`Common`] cannot name one).
pub fn parse_args<A: clap::Parser>(n_default: &str) -> A {
    let cmd = A::command().mut_arg("n", |a| {
        a.help(format!(
            "Elements per rank when generating data [default: {n_default}]"
        ))
    });
    let m = cmd.get_matches();
    A::from_arg_matches(&m).unwrap_or_else(|e| e.exit())
}

/// What went wrong on stdout: 0 nothing, 1 the reader closed the pipe, 2 another error.
static STDOUT_STATE: AtomicU8 = AtomicU8::new(0);

/// Write a line to stdout without panicking (what [`outln!`] calls).
///
/// `println!` panics when stdout is a closed pipe (`statevector | head -1`) or a full disk. Here
/// the first error stops all further output instead: a closed pipe silently (the reader has what
/// it wanted), any other error with one message on stderr and a failing exit code
/// ([`exit_code`]). The example keeps running to the end rather than exiting on the spot: the
/// other ranks wait for this one in collectives, and MPI must be finalized.
pub fn emit(args: std::fmt::Arguments<'_>) {
    if STDOUT_STATE.load(Ordering::Relaxed) != 0 {
        return;
    }
    clear_progress();
    let mut o = std::io::stdout().lock();
    if let Err(e) = o.write_fmt(args).and_then(|()| o.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            STDOUT_STATE.store(1, Ordering::Relaxed);
        } else {
            STDOUT_STATE.store(2, Ordering::Relaxed);
            let _ = writeln!(std::io::stderr(), "cannot write to stdout: {e}");
        }
    }
}

/// `println!` through [`emit`]: never panics.
macro_rules! outln {
    () => {
        $crate::common::emit(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::common::emit(format_args!("{}\n", format_args!($($arg)*)))
    };
}
pub(crate) use outln;

/// `code`, or a failure when stdout could not be written (other than a closed pipe).
pub fn exit_code(code: ExitCode) -> ExitCode {
    clear_progress();
    if STDOUT_STATE.load(Ordering::Relaxed) == 2 {
        ExitCode::FAILURE
    } else {
        code
    }
}

/// Whether a progress line is on the terminal now.
static PROGRESS_SHOWN: AtomicBool = AtomicBool::new(false);

/// Whether this process shows progress: stderr is a terminal and this is rank 0 (from the
/// launcher's environment, so that it works before MPI is initialized).
pub fn progress_enabled() -> bool {
    let rank0 = ["OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"]
        .iter()
        .find_map(|v| std::env::var(v).ok())
        .map_or(true, |r| r.trim() == "0");
    rank0 && std::io::stderr().is_terminal()
}

/// Show `what` as the progress line on stderr (redrawn in place; erased before the next line
/// of stdout, so the progress never ends up inside the report).
pub fn progress(what: &str) {
    if progress_enabled() {
        let _ = write!(std::io::stderr().lock(), "\r\x1b[2K{what}");
        PROGRESS_SHOWN.store(true, Ordering::Relaxed);
    }
}

/// Erase the progress line, if one is shown.
pub fn clear_progress() {
    if PROGRESS_SHOWN.swap(false, Ordering::Relaxed) {
        let _ = write!(std::io::stderr().lock(), "\r\x1b[2K");
    }
}

/// The one-line legend under the report's column names (rank 0).
pub fn legend(c: &Communicator) {
    if c.rank() == 0 {
        outln!(
            "legend: speedup = raw ms / zcomm ms (below 1: compression cost more than it saved, usual for a \
             CPU codec); pred = the model's time, pred err = (zcomm - pred) / pred; [Compressed]/[Raw] = the \
             path taken; `auto #N` = Policy::Auto, the model chose the path"
        );
    }
}

/// The closing line (rank 0): whether every bound held.
pub fn verdict(c: &Communicator, all_ok: bool) {
    if c.rank() == 0 {
        if all_ok {
            outln!("verdict: every error bound held");
        } else {
            outln!("verdict: ERROR BOUND VIOLATED (see the rows marked BOUND VIOLATED)");
        }
    }
}
