//! A distributed state-vector simulator of OpenQASM 2 circuits whose index-bit swaps go through
//! zcomm's compressed `sendrecv`.
//!
//! `2^k` ranks hold `2^(n-k)` amplitudes each (c64 or c128). Gates on local qubits, and
//! diagonal gates on any qubit, run on each rank's sub-vector (rayon, on the CPU); a
//! non-diagonal gate on a global qubit first swaps that qubit's index bit with a local one,
//! pairs of ranks exchanging half of their sub-vectors ([`sim`] explains the layout and the
//! plan). Only those exchanges are compressed, under `--error-bound` or under the bound that
//! `--fidelity F` derives so that the final state keeps fidelity ≥ F ([`fidelity`] has the
//! argument).
//!
//! The circuit runs twice in one process: uncompressed (`Policy::Never`, the reference) and
//! under `--policy`; the report has one row per exchange (bytes, ratio, times of both runs and
//! the model's predictions, the decision), the total times, and the fidelity of the compressed
//! final state against the reference, `|<ψ_raw|ψ_zc>|²` (normalised), next to the fidelity the
//! bounds certify. Exits 1 if the measured fidelity falls below the certified or the requested
//! one, 2 on bad input (a bad QASM file is reported with its line by every rank before any
//! communication).
//!
//! CPU only: the local gates run on the host and the exchanges are host `sendrecv`s over MPI
//! (CUDA kernels and NCCL exchanges are not implemented for this example).
//!
//! ```text
//! mpirun -n 4 target/release/examples/statevector --qasm circuit.qasm --fidelity 0.9999 \
//!     --dump-state psi.bin --json report.json
//! ```

mod builtin;
#[path = "../common/mod.rs"]
mod common;
mod fidelity;
mod gates;
mod gpu;
mod qasm;
mod sim;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use common::{clear_progress, exit_code, init_tracing, outln, progress};
use zcomm::comm::{Communicator, Config, Decision, OpStats, ReduceOp, StageTimes};
use zcomm::model::Policy;
use zcomm::model::Terms;
use zcomm::{ErrorBound, Result};

use gates::C;
use gpu::{DeviceAmp, DeviceState};
use sim::{Amp, Plan, Step};

#[derive(Parser, Debug, Clone)]
#[command(
    about = "Distributed state-vector simulation of an OpenQASM 2 circuit with \
                   compressed index-bit swaps (run under mpirun with 2^k ranks)"
)]
struct Args {
    /// OpenQASM 2.0 circuit (measurement-free).
    #[arg(long, required_unless_present = "circuit")]
    qasm: Option<PathBuf>,
    /// A built-in circuit instead of --qasm: qft:N (on a product state), ghz:N,
    /// random:N[:LAYERS] (default 8 layers of u and cx) or qaoa:N[:LAYERS] (ring MaxCut, default
    /// 12 layers), N qubits (benchmarks without a QASM file).
    #[arg(long, conflicts_with = "qasm")]
    circuit: Option<String>,
    /// Amplitude type: c64 (complex of f32) or c128 (complex of f64).
    #[arg(long, default_value = "c128")]
    dtype: String,
    /// Fidelity the compressed final state must keep (against the exact state): the abs bound
    /// of every exchange is derived from it. Default 0.9999 when --error-bound is not given.
    #[arg(long, conflicts_with = "error_bound")]
    fidelity: Option<f64>,
    /// Error bound of every exchanged value instead of --fidelity: abs:E, noa:E or rel:E.
    #[arg(long, value_parser = parse_bound)]
    error_bound: Option<ErrorBound>,
    /// never, auto[:CODEC] or always[:CODEC].
    #[arg(long, default_value = "always:aatrox", value_parser = parse_policy)]
    policy: Policy,
    /// Write the report as JSON to this file (rank 0).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the final state of the compressed run, gathered on rank 0, as raw little-endian
    /// interleaved (re, im) in the storage precision, qubit 0 = least significant index bit
    /// (Qiskit's order).
    #[arg(long)]
    dump_state: Option<PathBuf>,
    /// Skip the uncompressed reference run (no measured fidelity; half the time and memory).
    #[arg(long)]
    no_reference: bool,
    /// Measure the max error of every compressed exchange (one extra decompression each).
    #[arg(long)]
    verify: bool,
    /// Where the state lives: cpu (rayon kernels, host exchanges) or gpu (CUDA kernels on GPU
    /// `local rank % devices`, exchanges staged from device memory with the GPU codec)
    #[arg(long, default_value = "cpu", value_parser = ["cpu", "gpu"])]
    device: String,
    /// With --device gpu: also run the compressed simulation on the CPU and require the two final
    /// states to be bit-identical (the GPU kernels and codec write the CPU's values)
    #[arg(long)]
    compare_cpu: bool,
}

fn parse_bound(s: &str) -> std::result::Result<ErrorBound, String> {
    s.parse().map_err(|e: zcomm::Error| e.to_string())
}
fn parse_policy(s: &str) -> std::result::Result<Policy, String> {
    s.parse().map_err(|e: zcomm::Error| e.to_string())
}

fn main() -> ExitCode {
    init_tracing();
    let a = Args::parse();
    // Everything that can be wrong with the input is found here, by every rank on its own,
    // before MPI starts: a bad circuit costs no communication and every rank says why.
    let (name, text) = match (&a.qasm, &a.circuit) {
        (Some(p), _) => (
            p.display().to_string(),
            std::fs::read_to_string(p).map_err(|e| format!("cannot read: {e}")),
        ),
        (None, Some(c)) => (format!("--circuit {c}"), builtin::qasm(c)),
        (None, None) => (
            "statevector".into(),
            Err("--qasm or --circuit is needed".into()),
        ),
    };
    let circ = match text.and_then(|s| qasm::parse(&s).map_err(|e| e.to_string())) {
        Ok(c) => c,
        Err(e) => {
            report_error(&format!("{name}: {e}"));
            return ExitCode::from(2);
        }
    };
    let r = match a.dtype.as_str() {
        "c64" => main_typed::<[f32; 2]>(&a, &name, &circ),
        "c128" => main_typed::<[f64; 2]>(&a, &name, &circ),
        d => Err(format!("--dtype {d}: expected c64 or c128")),
    };
    let code = match r {
        Ok(code) => code,
        Err(e) => {
            report_error(&e);
            ExitCode::from(2)
        }
    };
    exit_code(code)
}

/// Prints one error line with a single write: `eprintln!` writes the pieces of its format
/// separately, and under `mpirun` the lines of several ranks then interleave mid-line.
fn report_error(msg: &str) {
    use std::io::Write;
    let line = format!("statevector: {msg}\n");
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// What the bound of the exchanges is and where it came from.
#[derive(Debug, Clone, Copy)]
enum BoundSource {
    Fidelity { f: f64, eps_c: f64 },
    User,
}

fn main_typed<E: DeviceAmp>(
    a: &Args,
    name: &str,
    circ: &qasm::Circuit,
) -> std::result::Result<ExitCode, String> {
    let fid_target = match (a.fidelity, a.error_bound) {
        _ if a.policy == Policy::Never => None,
        (Some(f), _) => Some(f),
        (None, None) => Some(0.9999),
        (None, Some(_)) => None,
    };
    // the bound is set after planning (it depends on the number of exchanges); any valid
    // placeholder will do for the calibration
    let placeholder = a.error_bound.unwrap_or(ErrorBound::Abs(1e-6));
    progress("statevector: starting MPI and calibrating the link and codec...");
    let cfg = Config::new(placeholder)
        .with_policy(a.policy)
        .with_verify(a.verify);
    let mut c = Communicator::init(cfg).map_err(|e| e.to_string())?;
    clear_progress();
    let p = c.size();
    let rank = c.rank();
    // identical on every rank, so every rank fails (or not) together, before any exchange
    if !p.is_power_of_two() {
        return Err(format!(
            "{p} ranks: the state is split over a power of two of ranks"
        ));
    }
    let k = p.trailing_zeros() as usize;
    let plan = sim::plan(circ, k)?;
    let src = match fid_target {
        Some(f) => {
            let eps_c = fidelity::budget(f, plan.gate_passes(), E::UNIT_ROUNDOFF)?;
            if let Some(d) = fidelity::abs_bound(
                f,
                plan.qubits,
                plan.swaps(),
                plan.gate_passes(),
                E::UNIT_ROUNDOFF,
            )? {
                c.set_bound(ErrorBound::Abs(d)).map_err(|e| e.to_string())?;
            }
            BoundSource::Fidelity { f, eps_c }
        }
        None => BoundSource::User,
    };
    let r = simulate::<E>(&mut c, a, name, circ, &plan, src);
    match r {
        Ok(ok) => Ok(if ok {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        }),
        Err(e) => Err(format!("(rank {rank}) {e}")),
    }
}

/// Allocate `n` zeroed amplitudes without aborting on failure.
fn alloc<E: Amp>(n: usize) -> Option<Vec<E>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).ok()?;
    v.resize(n, E::default());
    Some(v)
}

/// Whether `ok` holds on every rank.
fn all_ranks(c: &Communicator, ok: bool) -> Result<bool> {
    let mut x = [f64::from(u8::from(!ok))];
    c.transport().allreduce_f64(&mut x, ReduceOp::Max)?;
    Ok(x[0] == 0.0)
}

/// One exchange as this rank saw it.
#[derive(Debug, Clone)]
struct SwapRec {
    stats: OpStats,
    /// Wall time of the `sendrecv` on this rank (s).
    time: f64,
    /// This rank's contribution to `‖e_k‖²` (see [`fidelity::certified_eps`]).
    err_sq: f64,
    /// GPU runs: the staged exchange's measured stages and the model's terms for them (s).
    stages: Option<(StageTimes, Terms)>,
}

/// One run of the plan on this rank's sub-vector `v`.
struct RunOut {
    swaps: Vec<SwapRec>,
    /// Slowest rank's wall time of the whole run, and of its exchanges alone (s).
    wall: f64,
    exchange: f64,
}

/// Buffers of one run: the sub-vector and the two halves of an exchange.
struct Bufs<E> {
    v: Vec<E>,
    send: Vec<E>,
    recv: Vec<E>,
}

impl<E: Amp> Bufs<E> {
    fn new(local: usize) -> Option<Self> {
        Some(Bufs {
            v: alloc(1 << local)?,
            send: alloc(1 << (local - 1))?,
            recv: alloc(1 << (local - 1))?,
        })
    }
}

/// Run `plan` from |0…0⟩ under the communicator's current policy and bound.
fn run<E: DeviceAmp>(
    c: &mut Communicator,
    plan: &Plan,
    b: &mut Bufs<E>,
    mut dev: Option<&mut DeviceState<E>>,
    what: &str,
) -> Result<RunOut> {
    let (rank, l) = (c.rank(), plan.local);
    b.v.fill(E::default());
    if rank == 0 {
        b.v[0] = E::put(C::ONE);
    }
    if let Some(d) = dev.as_deref_mut() {
        d.reset(rank)?;
        d.synchronize()?;
    }
    let rel = matches!(c.config().bound, ErrorBound::Rel(_));
    let nswaps = plan.swaps();
    let mut swaps = Vec::with_capacity(nswaps);
    let mut t_ex = 0.0;
    c.barrier()?;
    let t0 = c.wtime();
    for st in &plan.steps {
        match st {
            Step::Gate(k) => match dev.as_deref_mut() {
                Some(d) => d.apply(k, rank, l)?,
                None => sim::apply(&mut b.v, k, rank, l),
            },
            Step::Swap { global, local, .. } => {
                progress(&format!(
                    "statevector: {what} run, exchange {}/{nswaps}...",
                    swaps.len() + 1
                ));
                let (partner, s) = sim::swap_partner(rank, *global, l);
                // tags cycle through the user range; one pair's messages arrive in order anyway
                let tag = (swaps.len() % 4000) as i32 + 1;
                let (stats, time, sent_norm, stages) = match dev.as_deref_mut() {
                    Some(d) => {
                        // the gates queued before the exchange finish first: the exchange's
                        // time (and the model's prediction of it) is the exchange's alone
                        d.synchronize()?;
                        let t = c.wtime();
                        let stats = d.swap(c, *local, s, partner, tag)?;
                        let time = c.wtime() - t;
                        let stages = Some((d.stager.last, d.stager.last_predicted));
                        let norm = if rel && stats.decision != Decision::Raw {
                            d.sent_norm_sqr()?
                        } else {
                            0.0
                        };
                        (stats, time, norm, stages)
                    }
                    None => {
                        sim::pack(&b.v, *local, s, &mut b.send);
                        let t = c.wtime();
                        let stats = c.sendrecv(&b.send, partner, &mut b.recv, partner, tag)?;
                        let time = c.wtime() - t;
                        sim::unpack(&mut b.v, *local, s, &b.recv);
                        let norm = if rel {
                            b.send.iter().map(|x| x.get().norm_sqr()).sum()
                        } else {
                            0.0
                        };
                        (stats, time, norm, None)
                    }
                };
                t_ex += time;
                let err_sq = if stats.decision == Decision::Raw {
                    0.0
                } else if rel {
                    stats.bound * stats.bound * sent_norm
                } else {
                    (b.send.len() * 2) as f64 * stats.bound * stats.bound
                };
                swaps.push(SwapRec {
                    stats,
                    time,
                    err_sq,
                    stages,
                });
            }
        }
    }
    if let Some(d) = dev.as_deref_mut() {
        d.synchronize()?;
    }
    let wall = c.wtime() - t0;
    if let Some(d) = dev {
        d.download(&mut b.v)?;
    }
    let mut m = [wall, t_ex];
    c.transport().allreduce_f64(&mut m, ReduceOp::Max)?;
    clear_progress();
    Ok(RunOut {
        swaps,
        wall: m[0],
        exchange: m[1],
    })
}

/// The state on this rank's GPU (`local rank % devices`), with the stager's device profile
/// calibrated for exchanges of this size; an error on every rank if any rank has no GPU.
fn device_state<E: DeviceAmp>(
    c: &mut Communicator,
    local: usize,
    policy: Policy,
) -> Result<DeviceState<E>> {
    progress("statevector: compiling the GPU kernels and calibrating the GPU codec...");
    let ordinal = std::env::var("OMPI_COMM_WORLD_LOCAL_RANK")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(c.rank());
    let devices = if zcomm::gpu::device_available() {
        cudarc::driver::CudaContext::device_count()
            .unwrap_or(1)
            .max(1) as usize
    } else {
        1
    };
    let d = if zcomm::gpu::device_available() {
        DeviceState::<E>::new(ordinal % devices, local)
    } else {
        Err(zcomm::Error::Unavailable("no CUDA device".into()))
    };
    let ok = all_ranks(c, d.is_ok())?;
    let mut d = match (d, ok) {
        (Ok(d), true) => d,
        (Err(e), _) => return Err(zcomm::Error::Unavailable(format!("--device gpu: {e}"))),
        (Ok(_), false) => {
            return Err(zcomm::Error::Unavailable(
                "--device gpu: another rank has no usable GPU".into(),
            ))
        }
    };
    let codec = policy.codec().unwrap_or_default();
    let values = (2usize << local) / 2;
    let prof = d.stager.calibrate(c, values, codec)?;
    d.stager.set_profile(prof);
    clear_progress();
    Ok(d)
}

/// The compressed run's exchanges stage by stage, measured against the model's terms (GPU runs):
/// where a prediction misses, this shows which stage it misses.
fn stage_table(rows: &[Row]) {
    if rows.iter().all(|r| r.stages_s.is_none()) {
        return;
    }
    const NAMES: [&str; 5] = ["compress", "d2h", "network", "h2d", "decompress"];
    let mut head = format!("{:>5}", "swap");
    for n in NAMES {
        head.push_str(&format!(" {:>21}", format!("{n} ms (pred)")));
    }
    outln!("stages of the zcomm run's exchanges (slowest rank per stage; model in parentheses):");
    outln!("{head}");
    for r in rows {
        let (Some(m), Some(p)) = (r.stages_s, r.predicted_stages_s) else {
            continue;
        };
        let mut line = format!("{:>5}", r.swap);
        for k in 0..5 {
            line.push_str(&format!(
                " {:>21}",
                format!("{:.3} ({:.3})", m[k] * 1e3, p[k] * 1e3)
            ));
        }
        outln!("{line}");
    }
}

/// One row of the report, over all ranks.
#[derive(Debug, Clone, serde::Serialize)]
struct Row {
    swap: usize,
    /// QASM line and name of the gate that needed the exchange.
    line: usize,
    gate: String,
    qubit: usize,
    global_bit: usize,
    local_bit: usize,
    bytes_per_rank: u64,
    /// Total uncompressed bytes / total bytes on the wire, over all ranks.
    ratio: f64,
    raw_s: Option<f64>,
    zcomm_s: f64,
    predicted_raw_s: f64,
    predicted_compressed_s: f64,
    /// Ranks that compressed (of all ranks).
    compressed_ranks: usize,
    decision: String,
    /// Largest per-value bound over the ranks (abs; rel: E).
    bound: f64,
    /// ‖e_k‖ certified by the bounds.
    err_norm_bound: f64,
    /// Measured max error of what was sent (with --verify).
    max_error: Option<f64>,
    /// GPU runs: the compressed run's stages of the exchange (slowest rank per stage, s):
    /// compress, d2h, network, h2d, decompress.
    stages_s: Option<[f64; 5]>,
    /// The model's terms for the same stages (largest over the ranks, s).
    predicted_stages_s: Option<[f64; 5]>,
}

/// A stage record as the five stages of the report (the model's `device` term, zero for an
/// exchange, is not a stage of it).
fn stage_array(m: &StageTimes, p: &Terms) -> [f64; 10] {
    [
        m.compress,
        m.d2h,
        m.network,
        m.h2d,
        m.decompress,
        p.compress,
        p.d2h,
        p.link,
        p.h2d,
        p.decompress,
    ]
}

fn rows(c: &Communicator, plan: &Plan, raw: Option<&RunOut>, zc: &RunOut) -> Result<Vec<Row>> {
    let s = zc.swaps.len();
    const W: usize = 16;
    let mut mx = Vec::with_capacity(W * s);
    let mut sum = Vec::with_capacity(4 * s);
    for (i, z) in zc.swaps.iter().enumerate() {
        mx.extend([
            raw.map_or(0.0, |r| r.swaps[i].time),
            z.time,
            z.stats.predicted_raw_s,
            z.stats.predicted_compressed_s,
            z.stats.bound,
            z.stats.max_error.unwrap_or(-1.0),
        ]);
        mx.extend(z.stages.map_or([-1.0; 10], |(m, p)| stage_array(&m, &p)));
        sum.extend([
            z.stats.bytes as f64,
            z.stats.wire_bytes as f64,
            f64::from(u8::from(z.stats.decision == Decision::Compressed)),
            z.err_sq,
        ]);
    }
    c.transport().allreduce_f64(&mut mx, ReduceOp::Max)?;
    c.transport().allreduce_f64(&mut sum, ReduceOp::Sum)?;
    let p = c.size();
    let swaps = plan.steps.iter().filter_map(|st| match st {
        Step::Swap {
            global,
            local,
            qubit,
            line,
            gate,
        } => Some((*global, *local, *qubit, *line, gate.clone())),
        Step::Gate(_) => None,
    });
    Ok(swaps
        .enumerate()
        .map(|(i, (g, l, q, line, gate))| {
            let (m, su) = (&mx[W * i..W * i + W], &sum[4 * i..4 * i + 4]);
            let five = |k: usize| -> Option<[f64; 5]> {
                (m[k] >= 0.0).then(|| m[k..k + 5].try_into().expect("five stages"))
            };
            let nc = su[2].round() as usize;
            Row {
                swap: i,
                line,
                gate,
                qubit: q,
                global_bit: g,
                local_bit: l,
                bytes_per_rank: zc.swaps[i].stats.bytes,
                ratio: if su[1] > 0.0 { su[0] / su[1] } else { 1.0 },
                raw_s: raw.map(|_| m[0]),
                zcomm_s: m[1],
                predicted_raw_s: m[2],
                predicted_compressed_s: m[3],
                compressed_ranks: nc,
                decision: if nc == p {
                    "Compressed".into()
                } else if nc == 0 {
                    "Raw".into()
                } else {
                    format!("mixed {nc}/{p}")
                },
                bound: m[4],
                err_norm_bound: su[3].sqrt(),
                max_error: (m[5] >= 0.0).then_some(m[5]),
                stages_s: five(6),
                predicted_stages_s: five(11),
            }
        })
        .collect())
}

/// Fidelity of `b` against `a` over all ranks.
fn fidelity_all<E: Amp>(c: &Communicator, a: &[E], b: &[E]) -> Result<f64> {
    let (ov, na, nb) = sim::overlap(a, b);
    let mut x = [ov.re, ov.im, na, nb];
    c.transport().allreduce_f64(&mut x, ReduceOp::Sum)?;
    Ok(sim::fidelity_of(C::new(x[0], x[1]), x[2], x[3]))
}

fn simulate<E: DeviceAmp>(
    c: &mut Communicator,
    a: &Args,
    name: &str,
    circ: &qasm::Circuit,
    plan: &Plan,
    src: BoundSource,
) -> Result<bool> {
    let (rank, p, l) = (c.rank(), c.size(), plan.local);
    let policy = a.policy;
    let reference = !a.no_reference && policy != Policy::Never;
    let es = std::mem::size_of::<E>();
    let zc_b = Bufs::<E>::new(l);
    let raw_b = if reference { Bufs::<E>::new(l) } else { None };
    let have = zc_b.is_some() && (raw_b.is_some() || !reference);
    if !all_ranks(c, have)? {
        return Err(zcomm::Error::invalid(format!(
            "cannot allocate {} MiB per rank for 2^{l} amplitudes (--no-reference halves it)",
            ((if reference { 2 } else { 1 }) * 2 * es) << l >> 20
        )));
    }
    // (cannot fail: every rank just checked it has its buffers)
    let mut zc_b = zc_b.ok_or_else(|| zcomm::Error::invalid("allocation"))?;
    let mut raw_b = raw_b;
    let mut dev = match a.device.as_str() {
        "gpu" => Some(device_state::<E>(c, l, policy)?),
        _ => None,
    };
    if rank == 0 {
        for s in &circ.ignored {
            outln!("note: ignored {s}");
        }
        let prof = c.profile();
        let sp = prof.codecs.first();
        outln!(
            "statevector: {}: {} qubits, {} gates ({} passes), {p} ranks x 2^{l} {} amplitudes \
             ({:.1} MiB per rank), {} exchanges of {:.1} MiB per rank",
            name,
            plan.qubits,
            circ.gates.len(),
            plan.gate_passes(),
            E::NAME,
            (es << l) as f64 / 1048576.0,
            plan.swaps(),
            (es << (l - 1)) as f64 / 1048576.0,
        );
        match src {
            _ if plan.swaps() == 0 => outln!("bound: none needed (no exchanges)"),
            BoundSource::Fidelity { f, eps_c } => outln!(
                "bound: {} per exchanged value, from --fidelity {f} (budget ||dpsi|| <= {eps_c:.3e} \
                 over {} exchanges of 2^{} scalars)",
                c.config().bound,
                plan.swaps(),
                plan.qubits
            ),
            BoundSource::User if policy == Policy::Never => {
                outln!("bound: none (--policy never: every exchange is sent raw)")
            }
            BoundSource::User => outln!("bound: {} (--error-bound)", c.config().bound),
        }
        outln!(
            "policy: {policy}; host profile: link {} latency {:.1} us; codec compress {} decompress {} ({})",
            zcomm::model::fmt_rate(prof.link.bandwidth),
            prof.link.latency * 1e6,
            sp.map(|s| zcomm::model::fmt_rate(s.compress))
                .unwrap_or_default(),
            sp.map(|s| zcomm::model::fmt_rate(s.decompress))
                .unwrap_or_default(),
            prof.compressor
        );
        match &dev {
            Some(d) => outln!(
                "compute: GPU ({}; exchanges staged through pinned memory, GPU codec: compress {} \
                 decompress {} with both ranks at once, as calibrated)",
                d.name,
                d.stager
                    .profile()
                    .map(|p| zcomm::model::fmt_rate(p.staged(p.calibrated_codec()).c.compress))
                    .unwrap_or_default(),
                d.stager
                    .profile()
                    .map(|p| zcomm::model::fmt_rate(p.staged(p.calibrated_codec()).c.decompress))
                    .unwrap_or_default(),
            ),
            None => outln!(
                "compute: CPU (rayon, {} threads)",
                rayon::current_num_threads()
            ),
        }
    }
    let raw_out = match raw_b.as_mut() {
        Some(rb) => {
            c.set_policy(Policy::Never);
            let r = run(c, plan, rb, dev.as_mut(), "raw")?;
            c.set_policy(policy);
            Some(r)
        }
        None => None,
    };
    let zc_out = run(c, plan, &mut zc_b, dev.as_mut(), "zcomm")?;
    if a.compare_cpu && dev.is_some() {
        // the same compressed run on the CPU: the GPU kernels and codec must give its values
        let mut cpu_b = Bufs::<E>::new(l)
            .ok_or_else(|| zcomm::Error::invalid("cannot allocate the CPU comparison run"))?;
        run(c, plan, &mut cpu_b, None, "cpu comparison")?;
        let same = zc_b.v.len() == cpu_b.v.len()
            && E::scalars(&zc_b.v)
                .iter()
                .zip(E::scalars(&cpu_b.v))
                .all(|(x, y)| zcomm::Element::to_bits_u64(*x) == zcomm::Element::to_bits_u64(*y));
        let all_same = all_ranks(c, same)?;
        if rank == 0 {
            outln!(
                "compare-cpu: GPU final state {} the CPU's{}",
                if all_same { "equals" } else { "DIFFERS FROM" },
                if all_same {
                    " bit for bit, on every rank"
                } else {
                    ""
                }
            );
        }
        if !all_same {
            return Err(zcomm::Error::invalid(
                "--compare-cpu: the GPU and CPU final states differ",
            ));
        }
    }
    let rows = rows(c, plan, raw_out.as_ref(), &zc_out)?;
    let eps_total = fidelity::certified_eps(
        &rows
            .iter()
            .map(|r| r.err_norm_bound.powi(2))
            .collect::<Vec<_>>(),
    );
    let certified = fidelity::certified_fidelity(eps_total, plan.gate_passes(), E::UNIT_ROUNDOFF);
    let measured = match raw_b.as_ref() {
        Some(rb) => Some(fidelity_all(c, &rb.v, &zc_b.v)?),
        None => None,
    };
    let ms = |x: f64| format!("{:.3}", x * 1e3);
    if rank == 0 && !rows.is_empty() {
        outln!(
            "{:>5} {:>12} {:>5} {:>7} {:>10} {:>7} {:>9} {:>9} {:>11} {:>10} {:>11} {:>10} {:>10}",
            "swap",
            "line gate",
            "qubit",
            "bits",
            "MiB/rank",
            "ratio",
            "raw ms",
            "zcomm ms",
            "pred raw ms",
            "pred zc ms",
            "decision",
            "bound",
            "||e|| <="
        );
        for r in &rows {
            outln!(
                "{:>5} {:>12} {:>5} {:>7} {:>10.2} {:>7.2} {:>9} {:>9} {:>11} {:>10} {:>11} {:>10.3e} {:>10.3e}{}",
                r.swap,
                format!("{} {}", r.line, r.gate),
                r.qubit,
                format!("{}<>{}", r.global_bit, r.local_bit),
                r.bytes_per_rank as f64 / 1048576.0,
                r.ratio,
                r.raw_s.map_or("-".into(), ms),
                ms(r.zcomm_s),
                ms(r.predicted_raw_s),
                ms(r.predicted_compressed_s),
                r.decision,
                r.bound,
                r.err_norm_bound,
                r.max_error
                    .map_or(String::new(), |e| format!("  max err {e:.3e}"))
            );
        }
        outln!(
            "legend: bits = global<>local physical index bits swapped; raw = the same exchange in \
             the uncompressed run; pred = the model's times; ||e|| <= = the bound's limit on the \
             exchange's error norm (0 when sent raw)"
        );
        stage_table(&rows);
    }
    let requested = match src {
        BoundSource::Fidelity { f, .. } => Some(f),
        BoundSource::User => None,
    };
    let mut ok = true;
    if rank == 0 {
        let sp = |r: &RunOut| format!("{:.3} s (exchanges {:.3} s)", r.wall, r.exchange);
        match &raw_out {
            Some(r) => outln!(
                "total: raw run {}, zcomm run {}; speedup {:.2}",
                sp(r),
                sp(&zc_out),
                r.wall / zc_out.wall
            ),
            None if policy == Policy::Never => outln!("total: {} (uncompressed)", sp(&zc_out)),
            None => outln!("total: zcomm run {} (no reference run)", sp(&zc_out)),
        }
        match measured {
            Some(m) => outln!(
                "fidelity |<psi_raw|psi_zc>|^2 = {m:.12} (1-F = {:.3e}); certified by the bounds >= \
                 {certified:.12}{}",
                1.0 - m,
                requested.map_or(String::new(), |f| format!("; requested >= {f}"))
            ),
            None => outln!(
                "fidelity: not measured ({}); certified by the bounds >= {certified:.12}",
                if policy == Policy::Never {
                    "--policy never: nothing was compressed"
                } else {
                    "--no-reference"
                }
            ),
        }
    }
    if let Some(m) = measured {
        // the measured fidelity is a check of the theory in `fidelity`: it can never be below
        // what the bounds certify, nor below what was asked (the certified value is ≥ it)
        if m < certified {
            ok = false;
            if rank == 0 {
                outln!("verdict: FIDELITY BELOW THE CERTIFIED BOUND ({m} < {certified})");
            }
        }
    }
    if let Some(f) = requested {
        if certified < f || measured.is_some_and(|m| m < f) {
            ok = false;
            if rank == 0 {
                outln!("verdict: FIDELITY BELOW THE REQUESTED {f}");
            }
        }
    }
    if ok && rank == 0 {
        if policy == Policy::Never {
            outln!("verdict: ok (uncompressed run)");
        } else {
            outln!("verdict: fidelity guarantee held");
        }
    }
    if let Some(path) = &a.json {
        if rank == 0 {
            let j = serde_json::json!({
                "circuit": name,
                "qubits": plan.qubits,
                "gates": circ.gates.len(),
                "gate_passes": plan.gate_passes(),
                "ranks": p,
                "dtype": E::NAME,
                "policy": policy.to_string(),
                "bound": (policy != Policy::Never).then(|| c.config().bound.to_string()),
                "requested_fidelity": requested,
                "swaps": rows,
                "raw_total_s": raw_out.as_ref().map(|r| r.wall),
                "raw_exchange_s": raw_out.as_ref().map(|r| r.exchange),
                "zcomm_total_s": zc_out.wall,
                "zcomm_exchange_s": zc_out.exchange,
                "fidelity": measured,
                "certified_fidelity": certified,
                "ok": ok,
            });
            let text = serde_json::to_string_pretty(&j).unwrap_or_default();
            if let Err(e) = std::fs::write(path, text + "\n") {
                eprintln!("statevector: cannot write {}: {e}", path.display());
                ok = false;
            }
        }
    }
    if let Some(path) = &a.dump_state {
        c.set_policy(Policy::Never);
        if let Err(e) = dump(c, plan, &zc_b.v, path) {
            eprintln!("statevector: --dump-state {}: {e}", path.display());
            ok = false;
        }
    }
    all_ranks(c, ok)
}

/// Gather the final state on rank 0 (uncompressed) and write it in logical qubit order.
fn dump<E: Amp>(c: &mut Communicator, plan: &Plan, v: &[E], path: &std::path::Path) -> Result<()> {
    let (rank, p, l) = (c.rank(), c.size(), plan.local);
    let n = 1usize << plan.qubits;
    let mut full = if rank == 0 {
        alloc::<E>(n)
    } else {
        Some(Vec::new())
    };
    if !all_ranks(c, full.is_some())? {
        return Err(zcomm::Error::invalid(format!(
            "rank 0 cannot hold the 2^{} amplitudes",
            plan.qubits
        )));
    }
    // (cannot fail: every rank just checked that rank 0 has its buffer)
    let full = full
        .as_mut()
        .ok_or_else(|| zcomm::Error::invalid("allocation"))?;
    if rank == 0 {
        full[..1 << l].copy_from_slice(v);
        for r in 1..p {
            c.recv(&mut full[r << l..(r + 1) << l], r, 4001)?;
        }
    } else {
        c.send(v, 0, 4001)?;
    }
    if rank != 0 {
        return Ok(());
    }
    // logical index → physical index, from two tables of the low and high index bits
    let lo_bits = plan.qubits / 2;
    let table = |shift: usize, bits: usize| -> Vec<usize> {
        (0..1usize << bits)
            .map(|i| plan.physical(i << shift))
            .collect()
    };
    let lo = table(0, lo_bits);
    let hi = table(lo_bits, plan.qubits - lo_bits);
    let mut w = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut buf = Vec::with_capacity(1 << 16);
    for i in 0..n {
        full[lo[i & ((1 << lo_bits) - 1)] | hi[i >> lo_bits]].write_le(&mut buf);
        if buf.len() >= 1 << 16 {
            std::io::Write::write_all(&mut w, &buf)?;
            buf.clear();
        }
    }
    std::io::Write::write_all(&mut w, &buf)?;
    std::io::Write::flush(&mut w)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use zcomm::comm::transport::{run_ranks, LoopbackTransport};
    use zcomm::comm::{Calibration, CpuCompressor};
    use zcomm::model::{Link, Profile};
    use zcomm::CodecKind;

    /// The whole path of an MPI run, on 4 in-process ranks (loopback transport, CPU codec):
    /// plan, runs with real compressed `sendrecv`s under the bound `--fidelity` derives, the
    /// fidelity measured across ranks, and the gathered, un-permuted `--dump-state` file,
    /// against the independent dense simulator.
    #[test]
    fn compressed_run_and_dump_over_loopback_keep_the_fidelity() {
        let circ = qasm::parse(&builtin::qasm("random:10").unwrap()).unwrap();
        let exact = sim::tests::dense(&circ);
        let f = 0.999;
        let plan = sim::plan(&circ, 2).unwrap();
        assert!(plan.swaps() >= 8, "{} swaps", plan.swaps());
        let u = <[f64; 2]>::UNIT_ROUNDOFF;
        let d = fidelity::abs_bound(f, 10, plan.swaps(), plan.gate_passes(), u)
            .unwrap()
            .unwrap();
        let cfg = Config::new(ErrorBound::Abs(d))
            .with_policy(Policy::Always(CodecKind::Aatrox))
            .with_calibration(Calibration::Fixed(Profile::new(Link {
                bandwidth: 1e9,
                latency: 1e-6,
            })));
        let dir = std::env::temp_dir().join(format!("zcomm-qsim-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("psi.bin");
        let out = run_ranks(LoopbackTransport::group(4), |t| {
            let (plan, path) = (&plan, &path);
            let mut c =
                Communicator::with_transport(Box::new(t), Box::new(CpuCompressor), cfg.clone())
                    .unwrap();
            let mut zc = Bufs::<[f64; 2]>::new(plan.local).unwrap();
            let z = run(&mut c, plan, &mut zc, None, "zcomm").unwrap();
            c.set_policy(Policy::Never);
            let mut raw = Bufs::<[f64; 2]>::new(plan.local).unwrap();
            run(&mut c, plan, &mut raw, None, "raw").unwrap();
            let fid = fidelity_all(&c, &raw.v, &zc.v).unwrap();
            let r = rows(&c, plan, None, &z).unwrap();
            let eps: Vec<f64> = r.iter().map(|r| r.err_norm_bound.powi(2)).collect();
            let cert = fidelity::certified_fidelity(
                fidelity::certified_eps(&eps),
                plan.gate_passes(),
                <[f64; 2]>::UNIT_ROUNDOFF,
            );
            dump(&mut c, plan, &zc.v, path).unwrap();
            let compressed = r.iter().filter(|r| r.decision == "Compressed").count();
            (fid, cert, compressed)
        });
        let out: Vec<(f64, f64, usize)> = out.into_iter().map(|r| r.unwrap()).collect();
        let (fid, cert, compressed) = out[0];
        assert!(out.iter().all(|o| o.0 == fid), "ranks disagree: {out:?}");
        assert_eq!(compressed, plan.swaps());
        assert!(cert >= f, "certified {cert} < {f}");
        assert!(fid >= cert, "measured {fid} < certified {cert}");
        assert!(fid < 1.0 - 1e-9, "compression changed nothing? {fid}");
        let bytes = std::fs::read(&path).unwrap();
        std::fs::remove_dir_all(&dir).ok();
        assert_eq!(bytes.len(), 16 << 10);
        let dumped: Vec<C> = bytes
            .chunks_exact(16)
            .map(|b| {
                let g = |s: &[u8]| f64::from_le_bytes(s.try_into().unwrap());
                C::new(g(&b[..8]), g(&b[8..]))
            })
            .collect();
        let vs_exact = sim::tests::fid(&exact, &dumped);
        assert!(vs_exact >= f, "dumped state vs exact: {vs_exact} < {f}");
    }
}
