//! Gradient averaging with a compressed allreduce.
//!
//! Every rank holds a gradient (generated, or its slice/copy of `--input`); each iteration
//! averages it over the ranks three ways — raw (`Policy::Never`, native MPI allreduce),
//! compressed (`Policy::Always`, ring reduce-scatter + allgather with the end-to-end bound) and
//! `Policy::Auto` — prints the times, the model's prediction, the ratio and the max error against
//! the exact (f64) mean, then takes a gradient step. Exits non-zero if the bound is violated.
//!
//! ```text
//! mpirun -n 2 --oversubscribe target/release/examples/allreduce --n 4000000 --error-bound noa:1e-3
//! ```

mod common;

use std::process::ExitCode;

use clap::Parser;
use common::*;
use zcomm::comm::{CommElement, Communicator, Config, Decision};
use zcomm::model::Policy;
use zcomm::{Element, ErrorBound, Result};

#[derive(Parser, Debug)]
#[command(about = "Gradient averaging with a compressed allreduce (run under mpirun)")]
struct Args {
    #[command(flatten)]
    c: Common,
    /// Iterations of the averaging loop.
    #[arg(long, default_value_t = 3)]
    iters: usize,
    /// Learning rate of the gradient step.
    #[arg(long, default_value_t = 0.1)]
    lr: f64,
    /// Compress with the GPU codec (host buffers; needs feature `cuda` and a device).
    #[arg(long)]
    gpu: bool,
}

fn main() -> ExitCode {
    init_tracing();
    let a: Args = parse_args("2097152 (2^21)");
    let cfg = Config::new(a.c.error_bound).with_policy(Policy::Always(a.c.codec));
    progress("allreduce: starting MPI and calibrating the link and codec...");
    let mut c = match make_comm(cfg, a.gpu) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("allreduce: {e}");
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
                eprintln!("allreduce: ERROR BOUND VIOLATED");
            }
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("allreduce (rank {}): {e}", c.rank());
            ExitCode::from(2)
        }
    };
    exit_code(code)
}

fn run<E: CommElement>(c: &mut Communicator, a: &Args) -> Result<bool> {
    let (p, rank) = (c.size(), c.rank());
    let mut grad0 = load::<E>(&a.c, rank, p, 1 << 21, field::<E>)?;
    // slices of a file can differ by one element: every rank uses the smallest count
    let n = (-global_max(c, -(grad0.len() as f64))) as usize;
    grad0.truncate(n);
    header(c, "allreduce (gradient averaging)", n, E::NAME, &a.c);
    let mut params = vec![0.0f64; n * E::LANES];
    let mut all_ok = true;
    let codec = a.c.codec;
    for it in 0..a.iters {
        progress(&format!("allreduce: iteration {}/{}...", it + 1, a.iters));
        // this iteration's gradient: the base field, damped, plus a parameter-dependent term
        let mut grad = grad0.clone();
        for (g, w) in E::scalars_mut(&mut grad).iter_mut().zip(&params) {
            let v = g.to_f64() * (1.0 - 0.05 * it as f64) + 0.01 * w;
            *g = <E::Scalar as Element>::from_f64(v);
        }
        let gs = E::scalars(&grad);
        // exact mean (f64 sum of the values the ranks hold)
        let g64: Vec<f64> = gs.iter().map(|x| x.to_f64()).collect();
        let mut exact = vec![0.0f64; g64.len()];
        c.transport().allreduce_sum_f64(&g64, &mut exact)?;
        exact.iter_mut().for_each(|x| *x /= p as f64);
        let (lo, hi) = global_range(c, gs);
        let m = lo.abs().max(hi.abs());
        let e = match a.c.error_bound {
            ErrorBound::Abs(e) => e,
            ErrorBound::Noa(e) => e * (hi - lo).max(0.0),
            ErrorBound::Rel(_) => {
                return Err(zcomm::Error::invalid(
                    "rel bounds are not supported for reductions (use abs or noa)",
                ))
            }
        };
        let slack = 1.2e-16 * (p as f64) * (p as f64) * m;

        let mut out_raw = vec![E::default(); n];
        c.set_policy(Policy::Never);
        let (t_raw, st_raw) = timed(c, |c| c.allreduce_mean(&grad, &mut out_raw));
        st_raw?;
        let mut out = vec![E::default(); n];
        c.set_policy(Policy::Always(codec));
        let (t_cmp, st) = timed(c, |c| c.allreduce_mean(&grad, &mut out));
        let st = st?;
        let lim = if st.decision == Decision::Compressed {
            e + slack
        } else {
            f64::INFINITY
        };
        let (err, ok) = max_err(&exact, &to64::<E>(&out), |_| lim);
        let err = global_max(c, err);
        let ok = global_max(c, f64::from(u8::from(!ok))) == 0.0;
        all_ok &= ok;
        print_row(
            c,
            &Row {
                op: format!("allreduce_mean #{it}"),
                raw_s: t_raw,
                cmp_s: t_cmp,
                stats: st,
                max_err: err,
                bound: e,
                ok,
            },
        );
        // Auto: the model decides
        let mut out_auto = vec![E::default(); n];
        c.set_policy(Policy::Auto(codec));
        let (t_auto, st_auto) = timed(c, |c| c.allreduce_mean(&grad, &mut out_auto));
        let st_auto = st_auto?;
        let lim = if st_auto.decision == Decision::Compressed {
            e + slack
        } else {
            (p as f64 + 1.0) * <E::Scalar as zcomm::comm::Real>::UNIT_ROUNDOFF * p as f64 * m
                + slack
        };
        let (err, ok) = max_err(&exact, &to64::<E>(&out_auto), |_| lim);
        let err = global_max(c, err);
        let ok = global_max(c, f64::from(u8::from(!ok))) == 0.0;
        all_ok &= ok;
        print_row(
            c,
            &Row {
                op: format!("  auto #{it}"),
                raw_s: t_raw,
                cmp_s: t_auto,
                stats: st_auto,
                max_err: err,
                bound: lim,
                ok,
            },
        );
        // gradient step with the compressed average
        for (w, g) in params.iter_mut().zip(E::scalars(&out)) {
            *w -= a.lr * g.to_f64();
        }
    }
    Ok(all_ok)
}

fn make_comm(cfg: Config, gpu: bool) -> Result<Communicator> {
    if gpu {
        #[cfg(feature = "cuda")]
        {
            let g = zcomm::gpu::GpuCodec::new(0)?;
            return Communicator::init_with(cfg, Box::new(zcomm::comm::GpuCompressor::new(g)));
        }
        #[cfg(not(feature = "cuda"))]
        return Err(zcomm::Error::Unavailable(
            "built without feature `cuda`".into(),
        ));
    }
    Communicator::init(cfg)
}

fn to64<E: CommElement>(v: &[E]) -> Vec<f64> {
    E::scalars(v).iter().map(|x| x.to_f64()).collect()
}
