//! The device-resident ring (`comm::device_ring`) on ranks sharing one GPU through the device
//! loopback transport: results bit-identical to the host ring's (CPU codec, host loopback) for
//! every reduction, dtype, codec and bound mode tried, and a count mismatch is an error on every
//! rank. The staged device reductions of the communicator (`allreduce_device` & co., the same
//! ring over a staged link through pinned host memory and a host transport) give the same bits,
//! call after call. The device allgather (`comm::device_gather`) gives every rank what the CPU
//! twin decodes from each rank's stream, its own segment included. Without a CUDA device the
//! trials are reported *ignored*.

use cudarc::driver::CudaSlice;
use libtest_mimic::{Arguments, Completion, Failed, Trial};
use zcomm::comm::transport::{run_ranks, DeviceLoopback, LinkEmulation, LoopbackTransport};
use zcomm::comm::{
    device_gather, device_ring, partition, Calibration, CommElement, Communicator, Config,
    CpuCompressor, DeviceStager, Real,
};
use zcomm::gpu::{GpuCodec, GpuElement};
use zcomm::model::{Link, Policy, Profile};
use zcomm::{CodecKind, ErrorBound};

fn gpu_trial(name: &str, test: fn() -> Result<(), String>) -> Trial {
    Trial::ignorable_test(name, move || {
        if !zcomm::gpu::device_available() {
            return Ok(Completion::ignored_with("skipped: no CUDA device"));
        }
        test().map_err(Failed::from)?;
        Ok(Completion::Completed)
    })
}

fn main() {
    let args = Arguments::from_args();
    let trials = vec![
        gpu_trial("device_ring_matches_host_ring_f32", matches_host::<f32>),
        gpu_trial("device_ring_matches_host_ring_f64", matches_host::<f64>),
        gpu_trial("device_ring_count_mismatch_fails_everywhere", mismatch),
        gpu_trial(
            "device_ring_in_pieces_matches_whole_segments_f32",
            pieces_match_whole::<f32>,
        ),
        gpu_trial(
            "device_ring_in_pieces_matches_whole_segments_f64",
            pieces_match_whole::<f64>,
        ),
        gpu_trial(
            "device_ring_queued_stored_pieces_match_waiting",
            stored_pieces_match_waiting,
        ),
        gpu_trial(
            "staged_device_reductions_match_host_ring_f32",
            staged_matches_host::<f32>,
        ),
        gpu_trial(
            "staged_device_reductions_match_host_ring_f64",
            staged_matches_host::<f64>,
        ),
        gpu_trial("device_ring_one_rank_copies_whatever_the_bound", one_rank),
        gpu_trial(
            "device_allgather_decodes_as_the_cpu_twin_f32",
            gather_matches_cpu::<f32>,
        ),
        gpu_trial(
            "device_allgather_decodes_as_the_cpu_twin_f64",
            gather_matches_cpu::<f64>,
        ),
        gpu_trial(
            "device_allgather_in_pieces_matches_one_stream_f32",
            gather_in_pieces_matches_whole::<f32>,
        ),
    ];
    libtest_mimic::run(&args, trials).exit();
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Op {
    Sum,
    Mean,
    ReduceScatter,
}

fn input<T: Real>(rank: usize, n: usize) -> Vec<T> {
    (0..n)
        .map(|i| T::from_f64(((i as f64) * 3e-3 + rank as f64).sin() * 50.0 + rank as f64))
        .collect()
}

/// A communicator configuration compressing every message with `codec` under `bound` (a fixed
/// profile: no calibration).
fn always(bound: ErrorBound, codec: CodecKind) -> Config {
    Config::new(bound)
        .with_policy(Policy::Always(codec))
        .with_calibration(Calibration::Fixed(Profile::new(Link {
            bandwidth: 1e9,
            latency: 1e-6,
        })))
}

fn host<T: Real + CommElement>(
    inputs: &[Vec<T>],
    op: Op,
    bound: ErrorBound,
    codec: CodecKind,
) -> Vec<Vec<T>> {
    on_ranks(inputs, always(bound, codec), |c, x| {
        let (p, r) = (inputs.len(), c.rank());
        match op {
            Op::Sum | Op::Mean => {
                let mut out = vec![T::default(); x.len()];
                if op == Op::Sum {
                    c.allreduce(x, &mut out).unwrap();
                } else {
                    c.allreduce_mean(x, &mut out).unwrap();
                }
                out
            }
            Op::ReduceScatter => {
                let mut out = vec![T::default(); partition(x.len(), p)[r].len()];
                c.reduce_scatter(x, &mut out).unwrap();
                out
            }
        }
    })
}

/// Run `f` with a CPU-codec communicator of `cfg` on every rank of a loopback group of
/// `inputs.len()` ranks, rank `r` with `inputs[r]`; the results in rank order.
fn on_ranks<T: Sync, R: Send>(
    inputs: &[Vec<T>],
    cfg: Config,
    f: impl Fn(&mut Communicator, &[T]) -> R + Sync,
) -> Vec<R> {
    run_ranks(LoopbackTransport::group(inputs.len()), |t| {
        let r = zcomm::comm::transport::Transport::rank(&t);
        let mut c = Communicator::with_transport(Box::new(t), Box::new(CpuCompressor), cfg.clone())
            .expect("communicator over loopback");
        f(&mut c, &inputs[r])
    })
    .into_iter()
    .map(|r| r.expect("rank thread"))
    .collect()
}

fn device<T: Real + GpuElement>(
    inputs: &[Vec<T>],
    op: Op,
    bound: ErrorBound,
    codec: CodecKind,
    counts: &[usize],
) -> Vec<Result<Vec<T>, String>> {
    device_in_pieces(inputs, op, bound, codec, counts, usize::MAX)
}

/// [`device`] over links that cut the ring's segments into pieces of `piece_bytes`.
fn device_in_pieces<T: Real + GpuElement>(
    inputs: &[Vec<T>],
    op: Op,
    bound: ErrorBound,
    codec: CodecKind,
    counts: &[usize],
    piece_bytes: usize,
) -> Vec<Result<Vec<T>, String>> {
    device_over(inputs, op, bound, codec, counts, |t| {
        t.with_piece_bytes(piece_bytes)
    })
}

/// [`device`] over loopback ranks set up by `link`.
fn device_over<T: Real + GpuElement>(
    inputs: &[Vec<T>],
    op: Op,
    bound: ErrorBound,
    codec: CodecKind,
    counts: &[usize],
    link: impl Fn(DeviceLoopback) -> DeviceLoopback,
) -> Vec<Result<Vec<T>, String>> {
    let group: Vec<DeviceLoopback> = DeviceLoopback::group(inputs.len(), LinkEmulation::default())
        .into_iter()
        .map(link)
        .collect();
    run_ranks(group, |t| -> Result<Vec<T>, String> {
        let r = t_rank(&t);
        let (x, n) = (&inputs[r], counts[r]);
        let e = |e: cudarc::driver::DriverError| format!("{e:?}");
        let mut gpu = GpuCodec::new(0)
            .and_then(|g| g.with_own_stream())
            .map_err(|e| e.to_string())?;
        let st = gpu.stream().clone();
        let xd: CudaSlice<T> = st.clone_htod(&x[..n]).map_err(e)?;
        let len = match op {
            Op::ReduceScatter => partition(n, inputs.len())[r].len(),
            _ => n,
        };
        let mut out = st.alloc_zeros::<T>(len).map_err(e)?;
        let res = match op {
            Op::Sum => device_ring::allreduce(&t, &mut gpu, &xd, &mut out, bound, codec, false),
            Op::Mean => device_ring::allreduce(&t, &mut gpu, &xd, &mut out, bound, codec, true),
            Op::ReduceScatter => {
                device_ring::reduce_scatter(&t, &mut gpu, &xd, &mut out, bound, codec)
            }
        };
        res.map_err(|e| e.to_string())?;
        st.clone_dtoh(&out).map_err(e)
    })
    .into_iter()
    .map(|r| r.expect("rank thread"))
    .collect()
}

/// The communicator's staged device reductions on every rank (host loopback transport, one
/// stager per rank on GPU 0), each run `calls` times on the same buffers; the last results.
fn staged<T: Real + GpuElement + CommElement>(
    inputs: &[Vec<T>],
    op: Op,
    bound: ErrorBound,
    codec: CodecKind,
    calls: usize,
) -> Vec<Result<Vec<T>, String>> {
    on_ranks(
        inputs,
        always(bound, codec),
        |c, x| -> Result<Vec<T>, String> {
            let e = |e: cudarc::driver::DriverError| format!("{e:?}");
            let s = |e: zcomm::Error| e.to_string();
            let gpu = GpuCodec::new(0)
                .and_then(|g| g.with_own_stream())
                .map_err(s)?;
            let mut dev = DeviceStager::new(gpu);
            let st = dev.gpu().stream().clone();
            let xd: CudaSlice<T> = st.clone_htod(x).map_err(e)?;
            let len = match op {
                Op::ReduceScatter => partition(x.len(), inputs.len())[c.rank()].len(),
                _ => x.len(),
            };
            let mut out = st.alloc_zeros::<T>(len).map_err(e)?;
            for _ in 0..calls {
                let (xv, mut ov) = (xd.as_view(), out.as_view_mut());
                match op {
                    Op::Sum => c.allreduce_device(&mut dev, &xv, &mut ov),
                    Op::Mean => c.allreduce_mean_device(&mut dev, &xv, &mut ov),
                    Op::ReduceScatter => c.reduce_scatter_device(&mut dev, &xv, &mut ov),
                }
                .map_err(s)?;
            }
            st.clone_dtoh(&out).map_err(e)
        },
    )
}

fn staged_matches_host<T: Real + GpuElement + CommElement>() -> Result<(), String> {
    for p in [2, 3] {
        let n = 100_003;
        let inputs: Vec<Vec<T>> = (0..p).map(|r| input(r, n)).collect();
        for codec in [
            CodecKind::Aatrox,
            CodecKind::Pfpl,
            CodecKind::Cuszi,
            CodecKind::Gpz,
        ] {
            for bound in [ErrorBound::Abs(1e-2), ErrorBound::Noa(1e-4)] {
                for op in [Op::Sum, Op::Mean, Op::ReduceScatter] {
                    let want = host(&inputs, op, bound, codec);
                    let got = staged(&inputs, op, bound, codec, 2);
                    for (r, (g, w)) in got.into_iter().zip(want).enumerate() {
                        let g = g.map_err(|e| format!("p={p} {codec} {bound:?} {op:?}: {e}"))?;
                        if g.len() != w.len()
                            || g.iter()
                                .zip(&w)
                                .any(|(a, b)| a.to_bits_u64() != b.to_bits_u64())
                        {
                            return Err(format!(
                                "p={p} {codec} {bound:?} {op:?} rank {r}: staged device ring \
                                 differs from the host ring"
                            ));
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

fn t_rank(t: &DeviceLoopback) -> usize {
    zcomm::comm::transport::Transport::rank(t)
}

fn matches_host<T: Real + GpuElement + CommElement>() -> Result<(), String> {
    for p in [1, 2, 3] {
        let n = 100_003;
        let inputs: Vec<Vec<T>> = (0..p).map(|r| input(r, n)).collect();
        for codec in [
            CodecKind::Aatrox,
            CodecKind::CuszpOutlier,
            CodecKind::Pfpl,
            CodecKind::Cuszi,
            CodecKind::Gpz,
        ] {
            for bound in [ErrorBound::Abs(1e-2), ErrorBound::Noa(1e-4)] {
                for op in [Op::Sum, Op::Mean, Op::ReduceScatter] {
                    let want = host(&inputs, op, bound, codec);
                    let got = device(&inputs, op, bound, codec, &vec![n; p]);
                    for (r, (g, w)) in got.into_iter().zip(want).enumerate() {
                        let g = g.map_err(|e| format!("p={p} {codec} {bound:?} {op:?}: {e}"))?;
                        within_bound(&inputs, op, bound, r, &g)
                            .map_err(|e| format!("p={p} {codec} {bound:?} {op:?} rank {r}: {e}"))?;
                        if g.iter()
                            .zip(&w)
                            .any(|(a, b)| a.to_bits_u64() != b.to_bits_u64())
                            || g.len() != w.len()
                        {
                            return Err(format!(
                                "p={p} {codec} {bound:?} {op:?} rank {r}: device ring differs from the host ring"
                            ));
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

/// Segments cut into pieces (what an NCCL link asks for; here over the loopback) give the
/// values of whole segments, bit for bit, for the codecs that decode value by value.
fn pieces_match_whole<T: Real + GpuElement>() -> Result<(), String> {
    for p in [2, 3] {
        // three segments of about 3.3 pieces of 2^16 values each
        let n = 3 * 215_000 + 7;
        let inputs: Vec<Vec<T>> = (0..p).map(|r| input(r, n)).collect();
        for codec in [CodecKind::Aatrox, CodecKind::CuszpOutlier, CodecKind::Pfpl] {
            for bound in [ErrorBound::Abs(1e-2), ErrorBound::Noa(1e-4)] {
                for op in [Op::Sum, Op::Mean, Op::ReduceScatter] {
                    let what = format!("p={p} {codec} {bound:?} {op:?}");
                    let whole = device(&inputs, op, bound, codec, &vec![n; p]);
                    let cut =
                        device_in_pieces(&inputs, op, bound, codec, &vec![n; p], 65_536 * T::SIZE);
                    for (r, (w, c)) in whole.into_iter().zip(cut).enumerate() {
                        let w = w.map_err(|e| format!("{what} whole: {e}"))?;
                        let c = c.map_err(|e| format!("{what} in pieces: {e}"))?;
                        within_bound(&inputs, op, bound, r, &c)
                            .map_err(|e| format!("{what} rank {r}: {e}"))?;
                        if c.len() != w.len()
                            || c.iter()
                                .zip(&w)
                                .any(|(a, b)| a.to_bits_u64() != b.to_bits_u64())
                        {
                            return Err(format!(
                                "{what} rank {r}: pieces differ from whole segments"
                            ));
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

/// Pieces whose streams are stored among compressed ones: a NaN in every 32 values of a
/// stretch (the same positions on every rank) makes every layer of those pieces raw, so their
/// streams store the values. The ring queues each accumulation and decode for the codec it
/// compresses with, finds the stored pieces only when it settles them, and must then
/// accumulate (divide) and compress them again; the results equal those of the ring that waits
/// for every kernel, bit for bit, and are within the bound (NaN where the sum is).
fn stored_pieces_match_waiting() -> Result<(), String> {
    for p in [2, 3] {
        let n = 3 * 215_000 + 7;
        let stretch = n / 3..n / 3 + n / 5;
        let inputs: Vec<Vec<f32>> = (0..p)
            .map(|r| {
                let mut x = input::<f32>(r, n);
                for i in stretch.clone().step_by(7) {
                    x[i] = f32::NAN;
                }
                x
            })
            .collect();
        let finite = inputs.iter().flatten().filter(|v| v.is_finite());
        let (lo, hi) = finite.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &v| {
            (lo.min(f64::from(v)), hi.max(f64::from(v)))
        });
        // abs: the final bound known at the start; noa: agreed after the last accumulation
        for (bound, eb) in [
            (ErrorBound::Abs(1e-2), 1e-2),
            (ErrorBound::Noa(1e-4), 1e-4 * (hi - lo)),
        ] {
            for codec in [CodecKind::Aatrox, CodecKind::CuszpOutlier] {
                let piece = &inputs[0][stretch.start..stretch.start + 65_536];
                let h = zcomm::inspect(
                    &zcomm::compress(piece, bound, codec).map_err(|e| e.to_string())?,
                )
                .map_err(|e| e.to_string())?;
                if !h.is_stored() {
                    return Err(format!("{codec}: a piece of the stretch is not stored"));
                }
                for op in [Op::Sum, Op::Mean, Op::ReduceScatter] {
                    let what = format!("p={p} {codec} {bound:?} {op:?}");
                    let pieces = |queue: bool| {
                        device_over(&inputs, op, bound, codec, &vec![n; p], |t| {
                            t.with_piece_bytes(65_536 * 4).with_queued_decodes(queue)
                        })
                    };
                    let (got, want) = (pieces(true), pieces(false));
                    for (r, (g, w)) in got.into_iter().zip(want).enumerate() {
                        let g = g.map_err(|e| format!("{what}: {e}"))?;
                        let w = w.map_err(|e| format!("{what}, waiting: {e}"))?;
                        if g.len() != w.len()
                            || g.iter().zip(&w).any(|(a, b)| a.to_bits() != b.to_bits())
                        {
                            return Err(format!("{what} rank {r}: queued differs from waiting"));
                        }
                        let range = match op {
                            Op::ReduceScatter => partition(n, p)[r].clone(),
                            _ => 0..n,
                        };
                        let div = if op == Op::Mean { p as f64 } else { 1.0 };
                        for (k, i) in range.enumerate() {
                            let exact = inputs.iter().map(|x| f64::from(x[i])).sum::<f64>() / div;
                            let v = f64::from(g[k]);
                            let ok = if exact.is_nan() {
                                v.is_nan()
                            } else {
                                (v - exact).abs() <= eb
                            };
                            if !ok {
                                return Err(format!("{what} rank {r} value {i}: {v} for {exact}"));
                            }
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

fn mismatch() -> Result<(), String> {
    let inputs: Vec<Vec<f32>> = (0..2).map(|r| input(r, 1000)).collect();
    let got = device(
        &inputs,
        Op::Sum,
        ErrorBound::Abs(1e-3),
        CodecKind::Aatrox,
        &[1000, 999],
    );
    for (r, g) in got.into_iter().enumerate() {
        match g {
            Err(e) if e.contains("mismatch") => {}
            other => {
                return Err(format!(
                    "rank {r}: expected a mismatch error, got {other:?}"
                ))
            }
        }
    }
    Ok(())
}

/// One rank sends nothing, so (as the host path) it returns its input even when the bound is too
/// small to quantise anything.
fn one_rank() -> Result<(), String> {
    let inputs: Vec<Vec<f32>> = vec![input(0, 1000)];
    for op in [Op::Sum, Op::Mean, Op::ReduceScatter] {
        let got = device(
            &inputs,
            op,
            ErrorBound::Abs(1e-30),
            CodecKind::Aatrox,
            &[1000],
        );
        let want = host(&inputs, op, ErrorBound::Abs(1e-30), CodecKind::Aatrox);
        let g = got
            .into_iter()
            .next()
            .unwrap()
            .map_err(|e| format!("{op:?}: {e}"))?;
        if g != inputs[0] || g != want[0] {
            return Err(format!("{op:?}: one rank did not return its input"));
        }
    }
    Ok(())
}

/// The device allgather over the device loopback on 1 to 3 ranks: every rank's output is, bit
/// for bit, the CPU twin's decoding of every rank's CPU-compressed input.
fn gather_matches_cpu<T: Real + GpuElement + CommElement>() -> Result<(), String> {
    for p in [1, 2, 3] {
        let n = 100_003;
        let inputs: Vec<Vec<T>> = (0..p).map(|r| input(r, n)).collect();
        for codec in [
            CodecKind::Aatrox,
            CodecKind::CuszpPlain,
            CodecKind::Pfpl,
            CodecKind::Cuszi,
            CodecKind::Gpz,
        ] {
            for bound in [
                ErrorBound::Abs(1e-2),
                ErrorBound::Noa(1e-4),
                ErrorBound::Rel(1e-3),
            ] {
                let what = format!("p={p} {codec} {bound:?}");
                if !codec.supports_bound(bound) {
                    gather_refused::<T>(&inputs, bound, codec)
                        .map_err(|e| format!("{what}: {e}"))?;
                    continue;
                }
                let mut want = Vec::with_capacity(n * p);
                for x in &inputs {
                    let s = zcomm::compress(x, bound, codec).map_err(|e| format!("{what}: {e}"))?;
                    want.extend(zcomm::decompress::<T>(&s).map_err(|e| format!("{what}: {e}"))?);
                }
                let group = DeviceLoopback::group(p, LinkEmulation::default());
                // twice: the second call reuses the stream buffer and the received ones
                let got = run_ranks(group, |t| {
                    gather_on_rank(&t, &inputs[t_rank(&t)], p, bound, codec, 2)?
                        .map_err(|e| e.to_string())
                });
                for (r, g) in got.into_iter().enumerate() {
                    let g = g
                        .expect("rank thread")
                        .map_err(|e| format!("{what}: {e}"))?;
                    if g.len() != want.len()
                        || g.iter()
                            .zip(&want)
                            .any(|(a, b)| a.to_bits_u64() != b.to_bits_u64())
                    {
                        return Err(format!("{what} rank {r}: differs from the CPU twin"));
                    }
                }
            }
        }
    }
    Ok(())
}

/// The device allgather in pieces (links that ask for 2^16-value pieces) gives every rank the
/// values of one stream per rank, bit for bit, under abs and rel bounds.
fn gather_in_pieces_matches_whole<T: Real + GpuElement>() -> Result<(), String> {
    for p in [2, 3] {
        let n = 3 * 65_536 + 777;
        let inputs: Vec<Vec<T>> = (0..p).map(|r| input(r, n)).collect();
        for codec in [CodecKind::Aatrox, CodecKind::CuszpOutlier, CodecKind::Pfpl] {
            for bound in [ErrorBound::Abs(1e-2), ErrorBound::Rel(1e-3)] {
                if !codec.supports_bound(bound) {
                    continue;
                }
                let what = format!("p={p} {codec} {bound:?}");
                let gather = |piece_bytes: usize| {
                    let group: Vec<DeviceLoopback> =
                        DeviceLoopback::group(p, LinkEmulation::default())
                            .into_iter()
                            .map(|t| t.with_piece_bytes(piece_bytes))
                            .collect();
                    run_ranks(group, |t| {
                        gather_on_rank(&t, &inputs[t_rank(&t)], p, bound, codec, 2)?
                            .map_err(|e| e.to_string())
                    })
                };
                let (whole, cut) = (gather(usize::MAX), gather(65_536 * T::SIZE));
                for (r, (w, c)) in whole.into_iter().zip(cut).enumerate() {
                    let w = w
                        .expect("rank thread")
                        .map_err(|e| format!("{what}: {e}"))?;
                    let c = c
                        .expect("rank thread")
                        .map_err(|e| format!("{what} in pieces: {e}"))?;
                    if c.len() != w.len()
                        || c.iter()
                            .zip(&w)
                            .any(|(a, b)| a.to_bits_u64() != b.to_bits_u64())
                    {
                        return Err(format!("{what} rank {r}: pieces differ from one stream"));
                    }
                }
            }
        }
    }
    Ok(())
}

/// The device allgather under a bound its codec refuses (gpz under rel): an error on every
/// rank, none left waiting.
fn gather_refused<T: Real + GpuElement>(
    inputs: &[Vec<T>],
    bound: ErrorBound,
    codec: CodecKind,
) -> Result<(), String> {
    let p = inputs.len();
    let group = DeviceLoopback::group(p, LinkEmulation::default());
    let got = run_ranks(group, |t| {
        match gather_on_rank(&t, &inputs[t_rank(&t)], p, bound, codec, 1)? {
            Ok(_) => Err("succeeded".to_string()),
            Err(_) => Ok(()),
        }
    });
    for (r, g) in got.into_iter().enumerate() {
        g.expect("rank thread")
            .map_err(|e| format!("rank {r}: expected an error: {e}"))?;
    }
    Ok(())
}

/// One rank of a device allgather over the loopback: its `input` uploaded, `calls` gathers of
/// it into one output of `p` segments, the output read back. The outer error is a setup failure
/// (device, upload, read-back), the inner one what the gather returned.
fn gather_on_rank<T: Real + GpuElement>(
    t: &DeviceLoopback,
    input: &[T],
    p: usize,
    bound: ErrorBound,
    codec: CodecKind,
    calls: usize,
) -> Result<zcomm::Result<Vec<T>>, String> {
    let e = |e: cudarc::driver::DriverError| format!("{e:?}");
    let mut gpu = GpuCodec::new(0)
        .and_then(|g| g.with_own_stream())
        .map_err(|e| e.to_string())?;
    let st = gpu.stream().clone();
    let xd: CudaSlice<T> = st.clone_htod(input).map_err(e)?;
    let mut out = st.alloc_zeros::<T>(input.len() * p).map_err(e)?;
    for _ in 0..calls {
        let (xv, mut ov) = (xd.as_view(), out.as_view_mut());
        if let Err(err) = device_gather::allgather(t, &mut gpu, &xv, &mut ov, bound, codec) {
            return Ok(Err(err));
        }
    }
    Ok(Ok(st.clone_dtoh(&out).map_err(e)?))
}

/// Every value of rank `r`'s device-ring result within the guaranteed bound of the exact
/// reduction (in f64) of `inputs`: `bound` itself for abs, `E * (max - min)` over all inputs for
/// noa (the ring splits it over its requantisations and roundings).
fn within_bound<T: Real>(
    inputs: &[Vec<T>],
    op: Op,
    bound: ErrorBound,
    r: usize,
    got: &[T],
) -> Result<(), String> {
    let p = inputs.len();
    let n = inputs[0].len();
    let eb = match bound {
        ErrorBound::Abs(e) => e,
        ErrorBound::Noa(e) => {
            let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
            for x in inputs.iter().flatten() {
                lo = lo.min(x.to_f64());
                hi = hi.max(x.to_f64());
            }
            e * (hi - lo)
        }
        ErrorBound::Rel(_) => return Err("no rel bound for reductions".into()),
    };
    let range = match op {
        Op::ReduceScatter => partition(n, p)[r].clone(),
        _ => 0..n,
    };
    let div = if op == Op::Mean { p as f64 } else { 1.0 };
    for (k, i) in range.enumerate() {
        let exact: f64 = inputs.iter().map(|x| x[i].to_f64()).sum::<f64>() / div;
        let err = (got[k].to_f64() - exact).abs();
        if err.is_nan() || err > eb {
            return Err(format!("value {i}: error {err:e} above the bound {eb:e}"));
        }
    }
    Ok(())
}
