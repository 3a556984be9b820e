//! State-vector halves swapped with a compressed `sendrecv`.
//!
//! Ranks are paired (`r ^ 1`; with an odd count the last rank pairs with itself). Each holds one
//! half of a state vector (generated, or its slice/copy of `--input`); every step the partners
//! swap halves — raw (`Policy::Never`) and compressed (`Policy::Always`) — and apply a
//! Hadamard-like butterfly on the top qubit with the compressed data. The compressed halves are
//! checked against the raw ones (the bound holds for the real and imaginary parts separately).
//! Exits non-zero if the bound is violated.
//!
//! ```text
//! mpirun -n 2 --oversubscribe target/release/examples/statevector --dtype c64 --error-bound noa:1e-4
//! ```

mod common;

use std::process::ExitCode;

use clap::Parser;
use common::*;
use zcomm::comm::{CommElement, Communicator, Config};
use zcomm::model::Policy;
use zcomm::{Element, ErrorBound, Result};

#[derive(Parser, Debug)]
#[command(about = "State-vector half swaps with compressed sendrecv (run under mpirun)")]
struct Args {
    #[command(flatten)]
    c: Common,
    /// Swap steps.
    #[arg(long, default_value_t = 3)]
    steps: usize,
}

fn main() -> ExitCode {
    init_tracing();
    let a: Args = parse_args("1048576 (2^20)");
    let cfg = Config::new(a.c.error_bound).with_policy(Policy::Always(a.c.codec));
    progress("statevector: starting MPI and calibrating the link and codec...");
    let mut c = match Communicator::init(cfg) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("statevector: {e}");
            return ExitCode::from(2);
        }
    };
    clear_progress();
    let r = match a.c.dtype.as_str() {
        "f32" => run::<f32>(&mut c, &a),
        "f64" => run::<f64>(&mut c, &a),
        "c64" => run::<[f32; 2]>(&mut c, &a),
        "c128" => run::<[f64; 2]>(&mut c, &a),
        d => Err(zcomm::Error::invalid(format!(
            "--dtype {d}: expected f32, f64, c64 or c128"
        ))),
    };
    if let Ok(ok) = r {
        verdict(&c, ok);
    }
    let code = match r {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            if c.rank() == 0 {
                eprintln!("statevector: ERROR BOUND VIOLATED");
            }
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("statevector (rank {}): {e}", c.rank());
            ExitCode::from(2)
        }
    };
    exit_code(code)
}

/// Amplitudes: a normalised superposition with a smooth phase.
fn amplitudes<E: CommElement>(rank: usize, n: usize) -> Vec<E> {
    let total = (n * 2) as f64;
    let mut v = vec![E::default(); n];
    for (i, o) in E::scalars_mut(&mut v).chunks_mut(E::LANES).enumerate() {
        let k = (rank * n + i) as f64;
        let env = (-(k / total - 0.5).powi(2) * 8.0).exp() / total.sqrt();
        let ph = k * 1e-4 + (k * 3e-6).sin() * 4.0;
        o[0] = <E::Scalar as Element>::from_f64(env * ph.cos());
        if E::LANES == 2 {
            o[1] = <E::Scalar as Element>::from_f64(env * ph.sin());
        }
    }
    v
}

fn run<E: CommElement>(c: &mut Communicator, a: &Args) -> Result<bool> {
    let (p, rank) = (c.size(), c.rank());
    let mut mine = load::<E>(&a.c, rank, p, 1 << 20, amplitudes::<E>)?;
    let partner = if (rank ^ 1) < p { rank ^ 1 } else { rank };
    // partners must hold the same count: use the smallest over all ranks
    let n = (-global_max(c, -(mine.len() as f64))) as usize;
    mine.truncate(n);
    header(c, "statevector (sendrecv of halves)", n, E::NAME, &a.c);
    let s = std::f64::consts::FRAC_1_SQRT_2;
    let mut all_ok = true;
    for step in 0..a.steps {
        progress(&format!("statevector: step {}/{}...", step + 1, a.steps));
        let mut raw = vec![E::default(); n];
        c.set_policy(Policy::Never);
        let (t_raw, st) = timed(c, |c| c.sendrecv(&mine, partner, &mut raw, partner, 1));
        st?;
        let mut got = vec![E::default(); n];
        c.set_policy(Policy::Always(a.c.codec));
        let (t_cmp, st) = timed(c, |c| c.sendrecv(&mine, partner, &mut got, partner, 2));
        let st = st?;
        // the bound, for the sender's values (= the raw copy)
        let rs = E::scalars(&raw);
        let (lo, hi) = zcomm::quant::finite_range(rs).unwrap_or((0.0, 0.0));
        let b = a.c.error_bound;
        let lim = move |x: f64| match b {
            ErrorBound::Abs(e) => e,
            ErrorBound::Noa(e) => e * (hi - lo),
            ErrorBound::Rel(e) => e * x.abs(),
        };
        let (_, ok) = max_err(rs, E::scalars(&got), lim);
        let err = global_max(c, reported_err(b, rs, E::scalars(&got)));
        let ok = global_max(c, f64::from(u8::from(!ok))) == 0.0;
        all_ok &= ok;
        let shown = match b {
            ErrorBound::Rel(e) => e,
            _ => global_max(c, lim(0.0)),
        };
        print_row(
            c,
            &Row {
                op: format!("sendrecv #{step}"),
                raw_s: t_raw,
                cmp_s: t_cmp,
                stats: st,
                max_err: err,
                bound: shown,
                ok,
            },
        );
        // Auto decision for the same exchange
        let mut got_auto = vec![E::default(); n];
        c.set_policy(Policy::Auto(a.c.codec));
        let (t_auto, st_auto) = timed(c, |c| c.sendrecv(&mine, partner, &mut got_auto, partner, 3));
        let st_auto = st_auto?;
        let (_, ok) = max_err(rs, E::scalars(&got_auto), lim);
        let err = global_max(c, reported_err(b, rs, E::scalars(&got_auto)));
        let ok = global_max(c, f64::from(u8::from(!ok))) == 0.0;
        all_ok &= ok;
        print_row(
            c,
            &Row {
                op: format!("  auto #{step}"),
                raw_s: t_raw,
                cmp_s: t_auto,
                stats: st_auto,
                max_err: err,
                bound: shown,
                ok,
            },
        );
        // butterfly on the top qubit with the compressed partner half
        let lower = rank <= partner;
        for (m, t) in E::scalars_mut(&mut mine).iter_mut().zip(E::scalars(&got)) {
            let (x, y) = (m.to_f64(), t.to_f64());
            let v = if partner == rank {
                x
            } else if lower {
                (x + y) * s
            } else {
                (y - x) * s
            };
            *m = <E::Scalar as Element>::from_f64(v);
        }
    }
    Ok(all_ok)
}
