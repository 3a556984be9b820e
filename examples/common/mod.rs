//! Helpers shared by the MPI examples: arguments, input loading, reports, bound checks.
#![allow(dead_code)]

use std::path::PathBuf;

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
    /// Elements per rank when generating data.
    #[arg(long)]
    pub n: Option<usize>,
    /// With --input: `slice` (each rank takes its part of the file) or `copy` (each rank takes
    /// the whole file).
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
        "copy" => 0..total,
        "slice" => partition(total, size)[rank].clone(),
        s => {
            return Err(Error::invalid(format!(
                "--share {s}: expected slice or copy"
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
        println!(
            "{what}: {} ranks, {n} {dtype} elements per rank ({:.1} MiB), bound {}, codec {}",
            c.size(),
            n as f64 * dtype_bytes(dtype) / 1048576.0,
            a.error_bound,
            a.codec
        );
        let sp = prof.codecs.first();
        println!(
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
            println!("(rel bound: `max err` and `bound` are point-wise relative errors)");
        }
    }
}

/// Print the header line of the report: [`describe`], then the column names.
pub fn header(c: &Communicator, what: &str, n: usize, dtype: &str, a: &Common) {
    describe(c, what, n, dtype, a);
    if c.rank() == 0 {
        println!(
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
}

/// Print one report row on rank 0.
pub fn print_row(c: &Communicator, r: &Row) {
    if c.rank() == 0 {
        let pred = r.stats.predicted_s;
        println!(
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
