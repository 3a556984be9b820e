//! The one call shape ([`Collectives`]) on device buffers: the staged device communicator and
//! NCCL give, through the trait, the values the host communicator gives on the same inputs
//! (bit for bit: the same codec, the same ring, the same bound split). Without a CUDA device
//! (or NCCL) the trials are reported *ignored*.

use cudarc::driver::CudaSlice;
use libtest_mimic::{Arguments, Completion, Failed, Trial};
use zcomm::comm::transport::{run_ranks, LoopbackTransport};
use zcomm::comm::{
    partition, Calibration, Collectives, Communicator, Config, CpuCompressor, DeviceStager,
};
use zcomm::gpu::GpuCodec;
use zcomm::model::{Link, Policy, Profile};
use zcomm::{CodecKind, ErrorBound};

fn main() {
    let args = Arguments::from_args();
    let trials = vec![
        gpu_trial(
            "staged_device_through_the_trait_matches_host",
            staged_matches_host,
        ),
        #[cfg(feature = "nccl")]
        Trial::ignorable_test("nccl_through_the_trait_matches_host_one_rank", || {
            if !zcomm::gpu::device_available() || !zcomm::comm::nccl::nccl_available() {
                return Ok(Completion::ignored_with(
                    "skipped: no CUDA device or no NCCL",
                ));
            }
            nccl_one_rank().map_err(Failed::from)?;
            Ok(Completion::Completed)
        }),
    ];
    libtest_mimic::run(&args, trials).exit();
}

fn gpu_trial(name: &str, test: fn() -> Result<(), String>) -> Trial {
    Trial::ignorable_test(name, move || {
        if !zcomm::gpu::device_available() {
            return Ok(Completion::ignored_with("skipped: no CUDA device"));
        }
        test().map_err(Failed::from)?;
        Ok(Completion::Completed)
    })
}

const N: usize = 300_001;

fn config() -> Config {
    Config::new(ErrorBound::Noa(1e-3))
        .with_policy(Policy::Always(CodecKind::Aatrox))
        .with_calibration(Calibration::Fixed(Profile::new(Link {
            bandwidth: 1e9,
            latency: 1e-6,
        })))
}

fn input(rank: usize) -> Vec<f32> {
    (0..N)
        .map(|i| ((i as f32) * 1e-3 + rank as f32).sin() * 20.0 + rank as f32)
        .collect()
}

/// Sum, mean, this rank's reduce-scatter segment and the allgather, in that order.
type Four = Vec<Vec<f32>>;

/// The four collectives through the trait on any communicator and buffer type; `alloc` makes
/// a buffer of `n` zeros, `upload` one holding the values, `download` reads one back.
fn four<C, B>(
    c: &mut C,
    x: &B,
    p: usize,
    r: usize,
    alloc: &dyn Fn(usize) -> Box<B>,
    download: &dyn Fn(&B) -> Vec<f32>,
) -> Result<Four, String>
where
    C: Collectives<B>,
    B: ?Sized,
{
    let mut sum = alloc(N);
    let mut mean = alloc(N);
    let mut seg = alloc(partition(N, p)[r].len());
    let mut all = alloc(N * p);
    c.allreduce(x, &mut sum).map_err(|e| e.to_string())?;
    c.allreduce_mean(x, &mut mean).map_err(|e| e.to_string())?;
    c.reduce_scatter(x, &mut seg).map_err(|e| e.to_string())?;
    c.allgather(x, &mut all).map_err(|e| e.to_string())?;
    Ok([sum, mean, seg, all].iter().map(|b| download(b)).collect())
}

/// Every rank's four results on host slices (CPU codec, host loopback).
fn host(p: usize) -> Vec<Four> {
    run_ranks(LoopbackTransport::group(p), |t| {
        let mut c =
            Communicator::with_transport(Box::new(t), Box::new(CpuCompressor), config()).unwrap();
        let r = c.rank();
        let x = input(r);
        let alloc = |n: usize| -> Box<[f32]> { vec![0.0f32; n].into_boxed_slice() };
        four(&mut c, &x[..], p, r, &alloc, &|b: &[f32]| b.to_vec()).unwrap()
    })
    .into_iter()
    .map(|r| r.unwrap())
    .collect()
}

fn same(a: &[Four], b: &[Four], what: &str) -> Result<(), String> {
    for (r, (x, y)) in a.iter().zip(b).enumerate() {
        for (k, (u, v)) in x.iter().zip(y).enumerate() {
            if u.len() != v.len() || u.iter().zip(v).any(|(s, t)| s.to_bits() != t.to_bits()) {
                return Err(format!(
                    "{what}: rank {r}, result {k} differs from the host's"
                ));
            }
        }
    }
    Ok(())
}

fn staged_matches_host() -> Result<(), String> {
    let p = 2;
    let want = host(p);
    let got = run_ranks(LoopbackTransport::group(p), |t| -> Result<Four, String> {
        let gpu = GpuCodec::new(0).map_err(|e| e.to_string())?;
        let stream = gpu.stream().clone();
        let mut stager = DeviceStager::new(gpu);
        let mut c = Communicator::with_transport(Box::new(t), Box::new(CpuCompressor), config())
            .map_err(|e| e.to_string())?;
        let r = c.rank();
        let x = stream.clone_htod(&input(r)).map_err(|e| format!("{e:?}"))?;
        let alloc = |n: usize| -> Box<CudaSlice<f32>> { Box::new(stream.alloc_zeros(n).unwrap()) };
        let down = |b: &CudaSlice<f32>| stream.clone_dtoh(b).unwrap();
        let mut dev = c.staged(&mut stager);
        four(&mut dev, &x, p, r, &alloc, &down)
    });
    let got: Vec<Result<Four, String>> = got.into_iter().map(|r| r.unwrap()).collect();
    let got: Vec<Four> = got.into_iter().collect::<Result<_, _>>()?;
    same(&got, &want, "staged device")
}

#[cfg(feature = "nccl")]
fn nccl_one_rank() -> Result<(), String> {
    use zcomm::comm::nccl::{NcclComm, NcclConfig};
    let want = host(1);
    let boot = LoopbackTransport::group(1).pop().unwrap();
    let cfg = NcclConfig::new(ErrorBound::Noa(1e-3))
        .with_policy(Policy::Always(CodecKind::Aatrox))
        .with_calibration(false);
    let mut c = NcclComm::new(Box::new(boot), cfg).map_err(|e| e.to_string())?;
    let stream = c.stream().clone();
    let x = stream.clone_htod(&input(0)).map_err(|e| format!("{e:?}"))?;
    let alloc = |n: usize| -> Box<CudaSlice<f32>> { Box::new(stream.alloc_zeros(n).unwrap()) };
    let down = |b: &CudaSlice<f32>| stream.clone_dtoh(b).unwrap();
    let got = four(&mut c, &x, 1, 0, &alloc, &down)?;
    same(&[got], &want, "nccl")
}
