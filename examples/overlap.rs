//! Overlap a compute loop with a compressed allreduce under a tokio runtime.
//!
//! Every non-blocking reduction returns an `OpRequest`, a `std::future::Future` that the
//! progress thread wakes when the operation ends. This example runs `--ranks` ranks in one
//! process over the loopback transport with an emulated link (`--link-gbps`), and on every rank
//! times (1) the compute loop alone, (2) the allreduce alone, (3) both at once: the allreduce
//! awaited while the compute loop runs on a blocking task. Overlap shows as (3) well below
//! (1) + (2).
//!
//! ```text
//! cargo run --release --example overlap
//! cargo run --release --example overlap -- --n 4000000 --link-gbps 0.5 --ranks 4
//! ```

use std::time::Instant;

use clap::Parser;
use zcomm::comm::transport::{run_ranks, LinkEmulation, LoopbackTransport};
use zcomm::comm::{Calibration, Communicator, Config, CpuCompressor};
use zcomm::model::{Link, Policy, Profile};
use zcomm::{CodecKind, Error, ErrorBound, Result};

/// Compute/communication overlap with awaited compressed allreduces.
#[derive(Parser, Debug, Clone)]
#[command(
    after_help = "Examples:\n  overlap\n  overlap --n 4000000 --link-gbps 0.5 --ranks 4\n  overlap --policy never"
)]
struct Args {
    /// f32 values per rank (the gradient being reduced).
    #[arg(long, default_value_t = 2_000_000)]
    n: usize,
    /// Ranks (threads of this process, over the loopback transport).
    #[arg(long, default_value_t = 2)]
    ranks: usize,
    /// Emulated link speed per direction, GB/s.
    #[arg(long, default_value_t = 0.25)]
    link_gbps: f64,
    /// Error bound of the reduced result.
    #[arg(long, default_value = "noa:1e-3")]
    error_bound: String,
    /// always | never | auto (with the codec aatrox).
    #[arg(long, default_value = "always")]
    policy: String,
    /// Size of the compute loop (units of 20 dense 512 x 512 matrix-vector products).
    #[arg(long, default_value_t = 6)]
    work: usize,
}

/// The compute loop: `work` products of a 512 x 512 matrix with a vector.
fn compute(work: usize) -> f32 {
    let m: Vec<f32> = (0..512 * 512).map(|i| ((i % 97) as f32) * 1e-3).collect();
    let mut v: Vec<f32> = (0..512).map(|i| i as f32 * 1e-2).collect();
    for _ in 0..work * 20 {
        let w: Vec<f32> = m
            .chunks_exact(512)
            .map(|row| row.iter().zip(&v).map(|(a, b)| a * b).sum())
            .collect();
        let norm = w.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-30);
        v = w.into_iter().map(|x| x / norm).collect();
    }
    v[0]
}

struct Timing {
    compute_s: f64,
    allreduce_s: f64,
    both_s: f64,
    ratio: f64,
}

fn rank_main(t: LoopbackTransport, a: &Args, cfg: Config) -> Result<Timing> {
    let mut comm = Communicator::with_transport(Box::new(t), Box::new(CpuCompressor), cfg)?;
    let r = comm.rank();
    let grad: Vec<f32> = (0..a.n)
        .map(|i| ((i as f32) * 1e-4 + r as f32).sin())
        .collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Comm(format!("tokio runtime: {e}")))?;
    rt.block_on(async {
        // warm-up (first-call allocations, ratio estimate)
        comm.iallreduce_mean(&grad)?.await?;
        comm.barrier()?;
        let t0 = Instant::now();
        let c = compute(a.work);
        let compute_s = t0.elapsed().as_secs_f64();
        comm.barrier()?;
        let t0 = Instant::now();
        let (_, st) = comm.iallreduce_mean(&grad)?.await?;
        let allreduce_s = t0.elapsed().as_secs_f64();
        comm.barrier()?;
        let t0 = Instant::now();
        let req = comm.iallreduce_mean(&grad)?;
        let work = a.work;
        let busy = tokio::task::spawn_blocking(move || compute(work));
        let (reduced, c2) = tokio::join!(req, busy);
        reduced?;
        let c2 = c2.map_err(|e| Error::Comm(format!("compute task: {e}")))?;
        let both_s = t0.elapsed().as_secs_f64();
        if c2.to_bits() != c.to_bits() {
            return Err(Error::Comm(
                "the compute loop gave a different result".into(),
            ));
        }
        Ok(Timing {
            compute_s,
            allreduce_s,
            both_s,
            ratio: st.ratio,
        })
    })
}

fn main() -> std::process::ExitCode {
    let a = Args::parse();
    match run(&a) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("overlap: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(a: &Args) -> Result<()> {
    if a.ranks == 0 || a.n == 0 {
        return Err(Error::invalid("--ranks and --n must be positive"));
    }
    let bound: ErrorBound = a.error_bound.parse()?;
    let policy = match a.policy.as_str() {
        "always" => Policy::Always(CodecKind::Aatrox),
        "never" => Policy::Never,
        "auto" => Policy::Auto(CodecKind::Aatrox),
        p => {
            return Err(Error::invalid(format!(
                "unknown policy `{p}` (always, never, auto)"
            )))
        }
    };
    let link = LinkEmulation::new(a.link_gbps * 1e9, 5e-6)?;
    let prof = Profile::new(Link {
        bandwidth: a.link_gbps * 1e9,
        latency: 5e-6,
    });
    let cfg = Config::new(bound)
        .with_policy(policy)
        .with_calibration(Calibration::Fixed(prof));
    let group = LoopbackTransport::group_with_link(a.ranks, link);
    let results = run_ranks(group, |t| rank_main(t, a, cfg.clone()))
        .into_iter()
        .map(|r| r?)
        .collect::<Result<Vec<_>>>()?;
    let max = |f: fn(&Timing) -> f64| results.iter().map(f).fold(0.0, f64::max);
    let (c, ar, both) = (
        max(|t| t.compute_s),
        max(|t| t.allreduce_s),
        max(|t| t.both_s),
    );
    let hidden = ((c + ar - both) / c.min(ar)).clamp(0.0, 1.0);
    println!(
        "| ranks | values/rank | link GB/s | policy | ratio | compute ms | allreduce ms | both ms | hidden |"
    );
    println!("|---:|---:|---:|---|---:|---:|---:|---:|---:|");
    println!(
        "| {} | {} | {} | {} | {:.2} | {:.1} | {:.1} | {:.1} | {:.0} % |",
        a.ranks,
        a.n,
        a.link_gbps,
        a.policy,
        results[0].ratio,
        c * 1e3,
        ar * 1e3,
        both * 1e3,
        hidden * 100.0
    );
    println!("hidden = (compute + allreduce - both) / min(compute, allreduce): the share of the shorter task that overlapped");
    Ok(())
}
