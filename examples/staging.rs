//! GPU→CPU staging and staged exchange of device buffers.
//!
//! With a CUDA device (feature `cuda`): every rank puts its field (generated, or its slice/copy of
//! `--input`) on the GPU and measures, raw vs compressed,
//! * `stage_to_host` (GPU compress + D2H of the stream) vs a raw D2H copy,
//! * `restore_to_device` (H2D + GPU decompress) vs a raw H2D copy,
//! * `sendrecv_device` with its partner (`r ^ 1`): D2H, MPI, H2D (raw) vs GPU compress, D2H,
//!   MPI, H2D, GPU decompress (compressed), and `Policy::Auto`,
//!
//! prints the model's prediction (calibrated at start-up), the ratio and the max error, and exits
//! non-zero if a bound is violated. Without a GPU it runs the same steps on host buffers with the
//! CPU codec (staging = compress into host memory).
//!
//! ```text
//! mpirun -n 2 target/release/examples/staging --n 268435456 --error-bound noa:1e-3   # 1 GiB f32
//! ```

mod common;

use std::process::ExitCode;

use clap::Parser;
use common::*;
use zcomm::comm::{CommElement, Communicator, Config};
use zcomm::model::Policy;
use zcomm::{Element, ErrorBound, Result};

#[derive(Parser, Debug)]
#[command(about = "GPU->CPU staging and staged device exchange (run under mpirun)")]
struct Args {
    #[command(flatten)]
    c: Common,
    /// Repetitions of each measurement (the best is reported after one warm-up).
    #[arg(long, default_value_t = 3)]
    iters: usize,
    /// Use the host path even when a GPU is present.
    #[arg(long)]
    cpu: bool,
    /// Ping-pong message size for the link calibration, MiB.
    #[arg(long, default_value_t = 16)]
    pingpong_mib: usize,
    /// Write the results as JSON lines to this file (rank 0).
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

fn main() -> ExitCode {
    init_tracing();
    let a = Args::parse();
    let cfg = Config::new(a.c.error_bound)
        .with_policy(Policy::Always(a.c.codec))
        .with_pingpong_bytes(a.pingpong_mib << 20);
    let mut c = match Communicator::init(cfg) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("staging: {e}");
            return ExitCode::from(2);
        }
    };
    let gpu = !a.cpu && gpu_present();
    let r = match (a.c.dtype.as_str(), gpu) {
        ("f32", false) => host::<f32>(&mut c, &a),
        ("f64", false) => host::<f64>(&mut c, &a),
        ("c64", false) => host::<[f32; 2]>(&mut c, &a),
        ("c128", false) => host::<[f64; 2]>(&mut c, &a),
        #[cfg(feature = "cuda")]
        ("f32" | "c64", true) => device::run::<f32>(&mut c, &a),
        #[cfg(feature = "cuda")]
        ("f64" | "c128", true) => device::run::<f64>(&mut c, &a),
        (d, _) => Err(zcomm::Error::invalid(format!(
            "--dtype {d}: expected f32, f64, c64 or c128"
        ))),
    };
    match r {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            if c.rank() == 0 {
                eprintln!("staging: ERROR BOUND VIOLATED");
            }
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("staging (rank {}): {e}", c.rank());
            ExitCode::from(2)
        }
    }
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

fn best<T>(
    c: &mut Communicator,
    iters: usize,
    mut f: impl FnMut(&mut Communicator) -> Result<T>,
) -> Result<(f64, T)> {
    let (_, first) = timed(c, &mut f);
    let mut out = first?;
    let mut t_best = f64::INFINITY;
    for _ in 0..iters.max(1) {
        let (t, r) = timed(c, &mut f);
        out = r?;
        t_best = t_best.min(t);
    }
    Ok((t_best, out))
}

/// Host buffers with the CPU codec (no GPU).
fn host<E: CommElement>(c: &mut Communicator, a: &Args) -> Result<bool> {
    let (p, rank) = (c.size(), c.rank());
    let data = load::<E>(&a.c, rank, p, 1 << 22, field::<E>)?;
    let n = (-global_max(c, -(data.len() as f64))) as usize;
    let data = &data[..n];
    header(
        c,
        "staging (host buffers, CPU codec: no GPU)",
        n,
        E::NAME,
        &a.c,
    );
    let sc = E::scalars(data);
    let (lo, hi) = zcomm::quant::finite_range(sc).unwrap_or((0.0, 0.0));
    let lim = bound_limit(a.c.error_bound, lo, hi);
    let mut all_ok = true;
    // stage = compress into host memory, restore = decompress
    let (t_c, stream) = best(c, a.iters, |_| {
        zcomm::compress(sc, a.c.error_bound, a.c.codec)
    })?;
    let (t_raw, _) = best(c, a.iters, |_| Ok(sc.to_vec()))?;
    let mut back = vec![<E::Scalar as Element>::from_f64(0.0); sc.len()];
    let (t_d, _) = best(c, a.iters, |_| zcomm::decompress_into(&stream, &mut back))?;
    let (_, ok) = max_err(sc, &back, &lim);
    let err = reported_err(a.c.error_bound, sc, &back);
    let ok = global_max(c, f64::from(u8::from(!ok))) == 0.0;
    all_ok &= ok;
    if rank == 0 {
        println!(
            "stage (compress to host): {:.3} ms, restore: {:.3} ms, raw copy: {:.3} ms, ratio {:.2}, max error {:.3e}{}",
            t_c * 1e3,
            t_d * 1e3,
            t_raw * 1e3,
            (sc.len() * <E::Scalar as Element>::SIZE) as f64 / stream.len() as f64,
            global_max(c, err),
            if ok { "" } else { "  BOUND VIOLATED" }
        );
    } else {
        global_max(c, err);
    }
    // exchange with the partner
    let partner = if (rank ^ 1) < p { rank ^ 1 } else { rank };
    let mut raw = vec![E::default(); n];
    c.set_policy(Policy::Never);
    let (t_raw, _) = best(c, a.iters, |c| {
        c.sendrecv(data, partner, &mut raw, partner, 1)
    })?;
    let mut got = vec![E::default(); n];
    c.set_policy(Policy::Always(a.c.codec));
    let (t_cmp, st) = best(c, a.iters, |c| {
        c.sendrecv(data, partner, &mut got, partner, 2)
    })?;
    let rs = E::scalars(&raw);
    let (plo, phi) = zcomm::quant::finite_range(rs).unwrap_or((0.0, 0.0));
    let plim = bound_limit(a.c.error_bound, plo, phi);
    let (_, ok) = max_err(rs, E::scalars(&got), &plim);
    let err = reported_err(a.c.error_bound, rs, E::scalars(&got));
    let err = global_max(c, err);
    let ok = global_max(c, f64::from(u8::from(!ok))) == 0.0;
    all_ok &= ok;
    let bound = global_max(c, plim(1.0));
    print_row(
        c,
        &Row {
            op: "sendrecv (host)".into(),
            raw_s: t_raw,
            cmp_s: t_cmp,
            stats: st,
            max_err: err,
            bound,
            ok,
        },
    );
    Ok(all_ok)
}

#[cfg(feature = "cuda")]
mod device {
    use super::*;
    use std::io::Write as _;
    use zcomm::comm::{DeviceStager, Real};
    use zcomm::gpu::{GpuCodec, GpuElement};

    pub fn run<S>(c: &mut Communicator, a: &Args) -> Result<bool>
    where
        S: GpuElement + Real + CommElement<Scalar = S>,
        [S; 2]: CommElement<Scalar = S>,
    {
        let (p, rank) = (c.size(), c.rank());
        // complex dtypes: the interleaved scalars
        let lanes = if a.c.dtype.starts_with('c') { 2 } else { 1 };
        let data: Vec<S> = match lanes {
            1 => load::<S>(&a.c, rank, p, 1 << 26, field::<S>)?,
            _ => {
                let v = load::<[S; 2]>(&a.c, rank, p, 1 << 25, field::<[S; 2]>)?;
                <[S; 2] as CommElement>::scalars(&v).to_vec()
            }
        };
        let n = (-global_max(c, -(data.len() as f64))) as usize;
        let data = &data[..n];
        let gpu = GpuCodec::new(0)?;
        let dev_name = gpu.device_name().to_string();
        let mut dev = DeviceStager::new(gpu);
        let prof = dev.calibrate(c, 1 << 26, a.c.codec)?;
        header(
            c,
            &format!("staging (device buffers on {dev_name}, GPU codec)"),
            n,
            S::NAME,
            &a.c,
        );
        if rank == 0 {
            println!(
                "device profile: GPU compress {} decompress {}, pinned staging {} (per rank, {} ranks sharing)",
                zcomm::model::fmt_rate(prof.compress),
                zcomm::model::fmt_rate(prof.decompress),
                zcomm::model::fmt_rate(prof.staging.bandwidth),
                p
            );
        }
        let s = dev.gpu().stream().clone();
        let d_in = s
            .clone_htod(data)
            .map_err(|e| zcomm::Error::Gpu(format!("{e:?}")))?;
        let mut d_out = s
            .alloc_zeros::<S>(n)
            .map_err(|e| zcomm::Error::Gpu(format!("{e:?}")))?;
        let (lo, hi) = zcomm::quant::finite_range(data).unwrap_or((0.0, 0.0));
        let lim = bound_limit(a.c.error_bound, lo, hi);
        let mut all_ok = true;
        let mut json = Vec::new();
        let bytes = n * S::SIZE;

        // 1. stage_to_host vs raw D2H
        let gerr = |e: cudarc::driver::DriverError| zcomm::Error::Gpu(format!("{e:?}"));
        let mut host_raw = dev.alloc_pinned(bytes)?;
        let (t_raw_d2h, _) = best(c, a.iters, |_| {
            dev.copy_to_host(
                &d_in.slice(..),
                &mut host_raw.as_mut_slice().map_err(gerr)?[..bytes],
            )
        })?;
        let mut staged = dev.stage_to_host(&d_in.slice(..), a.c.error_bound, a.c.codec)?;
        let (t_stage, _) = best(c, a.iters, |_| {
            dev.restage(&d_in.slice(..), a.c.error_bound, a.c.codec, &mut staged)
        })?;
        let (t_raw_h2d, _) = best(c, a.iters, |_| {
            dev.copy_to_device(
                &host_raw.as_slice().map_err(gerr)?[..bytes],
                &mut d_out.slice_mut(..),
            )
        })?;
        let (t_restore, _) = best(c, a.iters, |_| {
            dev.restore_to_device(&staged, &mut d_out.slice_mut(..))
        })?;
        let back = s
            .clone_dtoh(&d_out)
            .map_err(|e| zcomm::Error::Gpu(format!("{e:?}")))?;
        let (_, ok) = max_err(data, &back, &lim);
        let err = reported_err(a.c.error_bound, data, &back);
        let err = global_max(c, err);
        let ok = global_max(c, f64::from(u8::from(!ok))) == 0.0;
        all_ok &= ok;
        let ratio = staged.ratio();
        // model: raw = S/BW_s; compressed = S/T_c + S/(CR BW_s)  (and the reverse)
        let bs = prof.staging.bandwidth;
        let pred_stage = bytes as f64 / prof.compress + bytes as f64 / (ratio * bs);
        let pred_restore = bytes as f64 / (ratio * bs) + bytes as f64 / prof.decompress;
        if rank == 0 {
            println!(
                "{:<30} {:>10} {:>10} {:>8} {:>12} {:>12} {:>8} {:>7} {:>11}",
                "staging op",
                "raw ms",
                "zcomm ms",
                "speedup",
                "pred raw ms",
                "pred zc ms",
                "pred err",
                "ratio",
                "max err"
            );
            for (name, tr, tc, pr) in [
                ("stage_to_host", t_raw_d2h, t_stage, pred_stage),
                ("restore_to_device", t_raw_h2d, t_restore, pred_restore),
            ] {
                println!(
                    "{:<30} {:>10.3} {:>10.3} {:>8.2} {:>12.3} {:>12.3} {:>7.1}% {:>7.2} {:>11.3e}{}",
                    name,
                    tr * 1e3,
                    tc * 1e3,
                    tr / tc,
                    bytes as f64 / bs * 1e3,
                    pr * 1e3,
                    (tc - pr) / pr * 100.0,
                    ratio,
                    err,
                    if ok { "" } else { "  BOUND VIOLATED" }
                );
                json.push(format!(
                    r#"{{"op":"{name}","bytes":{bytes},"raw_s":{tr},"zcomm_s":{tc},"pred_raw_s":{},"pred_zcomm_s":{pr},"ratio":{ratio},"max_err":{err}}}"#,
                    bytes as f64 / bs
                ));
            }
        }

        // 2. sendrecv_device with the partner
        let partner = if (rank ^ 1) < p { rank ^ 1 } else { rank };
        let mut d_recv = s
            .alloc_zeros::<S>(n)
            .map_err(|e| zcomm::Error::Gpu(format!("{e:?}")))?;
        c.set_policy(Policy::Never);
        // whole-message exchanges first (comparable with earlier measurements); the chunk
        // pipeline gets its own row below
        c.set_pipeline(1 << 40, usize::MAX);
        let (t_raw, st_raw) = best(c, a.iters, |c| {
            c.sendrecv_device(
                &mut dev,
                &d_in.slice(..),
                partner,
                &mut d_recv.slice_mut(..),
                partner,
                1,
            )
        })?;
        let stages_raw = dev.last;
        let raw_back = s
            .clone_dtoh(&d_recv)
            .map_err(|e| zcomm::Error::Gpu(format!("{e:?}")))?;
        let (plo, phi) = zcomm::quant::finite_range(&raw_back).unwrap_or((0.0, 0.0));
        let plim = bound_limit(a.c.error_bound, plo, phi);
        let bound = global_max(c, plim(1.0));
        for (name, pol, tag) in [
            ("sendrecv_device", Policy::Always(a.c.codec), 2),
            ("  auto", Policy::Auto(a.c.codec), 3),
        ] {
            c.set_policy(pol);
            let (t, st) = best(c, a.iters, |c| {
                c.sendrecv_device(
                    &mut dev,
                    &d_in.slice(..),
                    partner,
                    &mut d_recv.slice_mut(..),
                    partner,
                    tag,
                )
            })?;
            let got = s
                .clone_dtoh(&d_recv)
                .map_err(|e| zcomm::Error::Gpu(format!("{e:?}")))?;
            let (_, ok) = max_err(&raw_back, &got, &plim);
            let err = reported_err(a.c.error_bound, &raw_back, &got);
            let err = global_max(c, err);
            let ok = global_max(c, f64::from(u8::from(!ok))) == 0.0;
            all_ok &= ok;
            if rank == 0 && name == "sendrecv_device" {
                println!("stages (rank 0): raw {:?}", stages_raw);
                println!("stages (rank 0): compressed {:?}", dev.last);
            }
            json.push(format!(
                r#"{{"op":"{name}","policy":"{pol}","decision":"{:?}","bytes":{bytes},"raw_s":{t_raw},"zcomm_s":{t},"pred_raw_s":{},"pred_zcomm_s":{},"ratio":{},"max_err":{err},"bound":{bound}}}"#,
                st.decision, st_raw.predicted_s, st.predicted_s, st.ratio
            ));
            if name == "sendrecv_device" {
                header(c, "staged device exchange", n, S::NAME, &a.c);
            }
            print_row(
                c,
                &Row {
                    op: format!("{name} [raw pred {:.1}ms]", st_raw.predicted_s * 1e3),
                    raw_s: t_raw,
                    cmp_s: t,
                    stats: st,
                    max_err: err,
                    bound,
                    ok,
                },
            );
        }
        // 3. the chunk-pipelined sendrecv_device (16 MiB chunks above 32 MiB), the device
        // allgather and allreduce: bounds checked (compositions not measured on a GPU before)
        c.set_policy(Policy::Always(a.c.codec));
        c.set_pipeline(16 << 20, 32 << 20);
        let chunks0 = c.pipeline_chunks();
        let (t_pipe, st_pipe) = best(c, a.iters, |c| {
            c.sendrecv_device(
                &mut dev,
                &d_in.slice(..),
                partner,
                &mut d_recv.slice_mut(..),
                partner,
                4,
            )
        })?;
        let got = s.clone_dtoh(&d_recv).map_err(gerr)?;
        let (_, ok) = max_err(&raw_back, &got, &plim);
        let err = global_max(c, reported_err(a.c.error_bound, &raw_back, &got));
        let ok = global_max(c, f64::from(u8::from(!ok))) == 0.0;
        all_ok &= ok;
        let chunks = c.pipeline_chunks() - chunks0;
        print_row(
            c,
            &Row {
                op: format!("sendrecv_device pipelined ({chunks} chunks)"),
                raw_s: t_raw,
                cmp_s: t_pipe,
                stats: st_pipe,
                max_err: err,
                bound,
                ok,
            },
        );
        c.set_pipeline(32 << 20, 64 << 20);
        let mut d_all = s.alloc_zeros::<S>(n * p).map_err(gerr)?;
        let st_ag = c.allgather_device(&mut dev, &d_in.slice(..), &mut d_all.slice_mut(..))?;
        let all = s.clone_dtoh(&d_all).map_err(gerr)?;
        let (_, ok_own) = max_err(data, &all[rank * n..(rank + 1) * n], &lim);
        let (_, ok_partner) = max_err(&raw_back, &all[partner * n..(partner + 1) * n], &plim);
        let ok = global_max(c, f64::from(u8::from(!(ok_own && ok_partner)))) == 0.0;
        all_ok &= ok;
        if rank == 0 {
            println!(
                "allgather_device: {st_ag}{}",
                if ok { "" } else { "  BOUND VIOLATED" }
            );
        }
        if !matches!(a.c.error_bound, ErrorBound::Rel(_)) {
            let st_ar = c.allreduce_device(&mut dev, &d_in.slice(..), &mut d_out.slice_mut(..))?;
            let got = s.clone_dtoh(&d_out).map_err(gerr)?;
            let mut want = vec![S::default(); n];
            c.allreduce(data, &mut want)?;
            // the same host algorithm on the same values: identical results
            let same = got
                .iter()
                .zip(&want)
                .all(|(x, y)| x.to_f64().to_bits() == y.to_f64().to_bits());
            let ok = global_max(c, f64::from(u8::from(!same))) == 0.0;
            all_ok &= ok;
            if rank == 0 {
                println!(
                    "allreduce_device: {st_ar}{}",
                    if ok {
                        ""
                    } else {
                        "  DIFFERS FROM HOST ALLREDUCE"
                    }
                );
            }
        }
        if let (Some(path), 0) = (&a.json, rank) {
            let mut f = std::fs::File::create(path)?;
            for l in &json {
                writeln!(f, "{l}")?;
            }
        }
        Ok(all_ok)
    }
}
