//! Multi-GPU test of the NCCL transport (`comm::nccl`), run with 2 (or more) ranks:
//!
//! ```text
//! cargo test --release --features nccl --test nccl --no-run
//! mpirun -n 2 -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE target/release/deps/nccl-* --nocapture
//! ```
//!
//! Every operation is checked against an exact (f64) reduction of all ranks' inputs, which each
//! rank regenerates from the seeds; results must be identical on all ranks; send/recv and
//! allgather must give identical bytes over the MPI and the NCCL transports. Without a CUDA
//! device or NCCL the test is reported *ignored* with the reason (a custom harness,
//! libtest-mimic, so that cargo's summary counts it as ignored rather than passed).

use cudarc::driver::CudaSlice;
use libtest_mimic::{Arguments, Completion, Trial};
use zcomm::comm::nccl::{nccl_available, NcclComm, NcclConfig, NcclReal};
use zcomm::comm::{
    partition, Calibration, Communicator, Config, CpuCompressor, Decision, MpiTransport,
};
use zcomm::model::{Link, Policy, Profile};
use zcomm::{CodecKind, Error, ErrorBound};

/// Deterministic smooth-plus-noise test data of rank `r`.
fn data(r: usize, n: usize) -> Vec<f64> {
    let mut s = 0x9E37_79B9_7F4A_7C15u64 ^ (r as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03);
    (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u = (s >> 11) as f64 / (1u64 << 53) as f64 - 0.5;
            let x = i as f64 * 1e-4;
            (x + r as f64).sin() * 3.0 + (x * 0.37).cos() + u * 0.01
        })
        .collect()
}

fn upload<T: NcclReal>(c: &NcclComm, v: &[f64]) -> CudaSlice<T> {
    let h: Vec<T> = v.iter().map(|&x| T::from_f64(x)).collect();
    c.stream().clone_htod(&h).expect("htod")
}

fn download<T: NcclReal>(c: &NcclComm, d: &CudaSlice<T>) -> Vec<f64> {
    let h: Vec<T> = c.stream().clone_dtoh(d).expect("dtoh");
    h.iter().map(|x| x.to_f64()).collect()
}

fn max_err(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

/// Every rank holds the same vector (checked through the bootstrap transport).
fn same_everywhere(c: &NcclComm, v: &[f64]) {
    let mut h = 0u64;
    for x in v {
        h = h.rotate_left(5) ^ x.to_bits();
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    let all = c.bootstrap().allgather_fixed(&h.to_le_bytes()).unwrap();
    assert!(
        all.chunks_exact(8).all(|x| x == &all[..8]),
        "results differ between ranks"
    );
}

fn exact_sum(p: usize, n: usize, cast: impl Fn(f64) -> f64) -> Vec<f64> {
    let mut s = vec![0.0; n];
    for r in 0..p {
        for (a, x) in s.iter_mut().zip(data(r, n)) {
            *a += cast(x);
        }
    }
    s
}

fn check_reductions<T: NcclReal>(
    c: &mut NcclComm,
    n: usize,
    cast: impl Fn(f64) -> f64 + Copy,
    name: &str,
) {
    let (p, r) = (c.size(), c.rank());
    let x = upload::<T>(c, &data(r, n));
    let exact = exact_sum(p, n, cast);
    // allreduce, abs bound
    let e = 1e-3;
    c.set_policy(Policy::Always(CodecKind::Aatrox));
    c.set_bound(ErrorBound::Abs(e)).unwrap();
    let mut out = c.stream().alloc_zeros::<T>(n).unwrap();
    let st = c.allreduce(&x, &mut out).unwrap();
    let got = download(c, &out);
    let err = max_err(&got, &exact);
    println!("[rank {r}] {name} allreduce abs:{e}: {st}; max error {err:.3e}");
    assert!(err <= e, "{name} allreduce error {err} > {e}");
    if p > 1 {
        assert_eq!(st.decision, Decision::Compressed);
        assert!(st.ratio > 1.0);
    }
    same_everywhere(c, &got);
    // mean, noa bound (relative to the global range of the inputs)
    let en = 1e-4;
    c.set_bound(ErrorBound::Noa(en)).unwrap();
    let st = c.allreduce_mean(&x, &mut out).unwrap();
    let got = download(c, &out);
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for q in 0..p {
        for v in data(q, n) {
            let v = cast(v);
            lo = lo.min(v);
            hi = hi.max(v);
        }
    }
    let mean: Vec<f64> = exact.iter().map(|s| s / p as f64).collect();
    let err = max_err(&got, &mean);
    println!("[rank {r}] {name} allreduce_mean noa:{en}: {st}; max error {err:.3e}");
    assert!(
        err <= en * (hi - lo),
        "{name} mean error {err} > {}",
        en * (hi - lo)
    );
    same_everywhere(c, &got);
    // reduce-scatter
    c.set_bound(ErrorBound::Abs(e)).unwrap();
    let seg = partition(n, p)[r].clone();
    let mut part = c.stream().alloc_zeros::<T>(seg.len()).unwrap();
    let st = c.reduce_scatter(&x, &mut part).unwrap();
    let got = download(c, &part);
    let err = max_err(&got, &exact[seg]);
    println!("[rank {r}] {name} reduce_scatter abs:{e}: {st}; max error {err:.3e}");
    assert!(err <= e);
    // raw (Never) equals NCCL's own allreduce bit for bit
    c.set_policy(Policy::Never);
    c.allreduce(&x, &mut out).unwrap();
    let mut raw = c.stream().alloc_zeros::<T>(n).unwrap();
    c.raw_allreduce(&x, &mut raw).unwrap();
    assert_eq!(download(c, &out), download(c, &raw));
    assert!(max_err(&download(c, &raw), &exact) <= 1e-5 * p as f64 * 5.0);
    // Auto: either path, bound holds
    c.set_policy(Policy::Auto(CodecKind::Aatrox));
    let st = c.allreduce(&x, &mut out).unwrap();
    let err = max_err(&download(c, &out), &exact);
    println!("[rank {r}] {name} allreduce auto: {st}; max error {err:.3e}");
    assert!(err <= e);
}

/// The compressed reductions with each segment cut into 3 pieces, and the allgather with each
/// buffer cut into 3, give the values of whole segments and buffers (aatrox decodes value by
/// value; pieces start at whole chunks), on every rank.
fn ring_pieces_match_whole_segments(c: &NcclComm) {
    let (p, r) = (c.size(), c.rank());
    let comm = |pieces: usize| {
        let cfg = NcclConfig::new(ErrorBound::Noa(1e-3))
            .with_policy(Policy::Always(CodecKind::Aatrox))
            .with_calibration(false)
            .with_pieces(pieces);
        NcclComm::init(cfg).expect("a second NCCL communicator")
    };
    let (mut whole, mut cut) = (comm(1), comm(3));
    // segments of about 4 pieces' alignment (2^16 values) and a ragged end
    let n = p * 4 * 65_536 + 12_345;
    let x = upload::<f32>(&whole, &data(r, n));
    let xc = upload::<f32>(&cut, &data(r, n));
    for mean in [false, true] {
        let mut a = whole.stream().alloc_zeros::<f32>(n).unwrap();
        let mut b = cut.stream().alloc_zeros::<f32>(n).unwrap();
        let (sa, sb) = if mean {
            (
                whole.allreduce_mean(&x, &mut a),
                cut.allreduce_mean(&xc, &mut b),
            )
        } else {
            (whole.allreduce(&x, &mut a), cut.allreduce(&xc, &mut b))
        };
        let (sa, sb) = (sa.unwrap(), sb.unwrap());
        println!("[rank {r}] ring in pieces (mean {mean}): {sb}");
        assert_eq!((sa.pieces, sb.pieces), (1, 3));
        let (ga, gb) = (download(&whole, &a), download(&cut, &b));
        assert!(
            ga == gb,
            "rank {r}: pieces differ from whole segments (mean {mean})"
        );
        same_everywhere(&cut, &gb);
    }
    // the allgather in 3 pieces per buffer
    let mut a = whole.stream().alloc_zeros::<f32>(n * p).unwrap();
    let mut b = cut.stream().alloc_zeros::<f32>(n * p).unwrap();
    let sa = whole.allgather(&x, &mut a).unwrap();
    let sb = cut.allgather(&xc, &mut b).unwrap();
    println!("[rank {r}] allgather in pieces: {sb}");
    assert_eq!((sa.pieces, sb.pieces), (1, 3));
    let gb = download(&cut, &b);
    assert!(download(&whole, &a) == gb, "rank {r}: allgather in pieces");
    same_everywhere(&cut, &gb);
    let seg = partition(n, p)[r].clone();
    let mut a = whole.stream().alloc_zeros::<f32>(seg.len()).unwrap();
    let mut b = cut.stream().alloc_zeros::<f32>(seg.len()).unwrap();
    let sb = cut.reduce_scatter(&xc, &mut b).unwrap();
    whole.reduce_scatter(&x, &mut a).unwrap();
    assert_eq!(sb.pieces, 3);
    assert!(
        download(&whole, &a) == download(&cut, &b),
        "rank {r}: reduce-scatter in pieces"
    );
}

fn main() {
    let mut args = Arguments::from_args();
    // one test, run on the main thread: MPI is initialized (and finalized) by the thread that
    // runs it
    args.test_threads = Some(1);
    let trials = vec![Trial::ignorable_test(
        "nccl_all_operations",
        nccl_all_operations,
    )];
    libtest_mimic::run(&args, trials).exit();
}

/// Every operation on every rank; `Ignored` (with the reason) without a device or NCCL.
fn nccl_all_operations() -> Result<Completion, libtest_mimic::Failed> {
    if !nccl_available() {
        return Ok(Completion::ignored_with(
            "skipped: no CUDA driver or NCCL library",
        ));
    }
    if !zcomm::gpu::device_available() {
        return Ok(Completion::ignored_with("skipped: no CUDA device"));
    }
    let cfg = NcclConfig::new(ErrorBound::Abs(1e-3))
        .with_policy(Policy::Always(CodecKind::Aatrox))
        .with_piece_bytes(1 << 20)
        .with_calibration(false);
    let mut c = match NcclComm::init(cfg) {
        Ok(c) => c,
        Err(Error::Unavailable(m)) => return Ok(Completion::ignored_with(format!("skipped: {m}"))),
        Err(e) => panic!("NcclComm::init: {e}"),
    };
    let (p, r) = (c.size(), c.rank());
    println!("[rank {r}] {c:?}, codec loaded: {}", c.has_codec());
    assert!(c.has_codec(), "GPU codec failed to load");

    // odd sizes: several pieces, a short last chunk, segments of unequal length
    let n = 3_000_001;
    check_reductions::<f32>(&mut c, n, |x| x as f32 as f64, "f32");
    check_reductions::<f64>(&mut c, 1_000_003, |x| x, "f64");

    // tiny and empty buffers
    c.set_policy(Policy::Always(CodecKind::CuszpOutlier));
    for m in [1usize, 5, 40_000] {
        let x = upload::<f32>(&c, &data(r, m));
        let mut out = c.stream().alloc_zeros::<f32>(m).unwrap();
        let st = c.allreduce(&x, &mut out).unwrap();
        let err = max_err(&download(&c, &out), &exact_sum(p, m, |v| v as f32 as f64));
        println!(
            "[rank {r}] allreduce n={m} cuszp-outlier: {:?} max error {err:.3e}",
            st.decision
        );
        assert!(err <= 1e-3);
    }

    // allgather: bound per value, own segment included, identical everywhere
    c.set_policy(Policy::Always(CodecKind::Aatrox));
    c.set_bound(ErrorBound::Abs(1e-3)).unwrap();
    let m = 2_500_007;
    let x = upload::<f32>(&c, &data(r, m));
    let mut out = c.stream().alloc_zeros::<f32>(m * p).unwrap();
    let st = c.allgather(&x, &mut out).unwrap();
    let got = download(&c, &out);
    let mut want = Vec::new();
    for q in 0..p {
        want.extend(data(q, m).into_iter().map(|v| v as f32 as f64));
    }
    let err = max_err(&got, &want);
    println!("[rank {r}] allgather: {st}; max error {err:.3e}");
    assert!(err <= 1e-3);
    same_everywhere(&c, &got);

    // send/recv ring (compressed, rel bound too)
    if p > 1 {
        for b in [
            ErrorBound::Abs(1e-3),
            ErrorBound::Noa(1e-3),
            ErrorBound::Rel(1e-2),
        ] {
            c.set_bound(b).unwrap();
            let to = (r + 1) % p;
            let from = (r + p - 1) % p;
            let x = upload::<f32>(&c, &data(r, m));
            let mut y = c.stream().alloc_zeros::<f32>(m).unwrap();
            // even ranks send first (no deadlock for any p)
            let (s1, s2) = if r % 2 == 0 {
                (c.send(&x, to, 3).unwrap(), c.recv(&mut y, from, 3).unwrap())
            } else {
                let s2 = c.recv(&mut y, from, 3).unwrap();
                (c.send(&x, to, 3).unwrap(), s2)
            };
            let got = download(&c, &y);
            let src: Vec<f64> = data(from, m).into_iter().map(|v| v as f32 as f64).collect();
            let (lo, hi) = src
                .iter()
                .fold((f64::INFINITY, f64::NEG_INFINITY), |a, &v| {
                    (a.0.min(v), a.1.max(v))
                });
            for (g, w) in got.iter().zip(&src) {
                let lim = match b {
                    ErrorBound::Abs(e) => e,
                    ErrorBound::Noa(e) => e * (hi - lo),
                    ErrorBound::Rel(e) => e * w.abs(),
                };
                assert!((g - w).abs() <= lim, "{b}: {g} vs {w}");
            }
            println!("[rank {r}] send {b}: {s1}; recv: {s2}");
            assert_eq!(s1.decision, Decision::Compressed);
            assert_eq!(s2.decision, Decision::Compressed);
        }
    }

    // mismatched counts: an error on every rank, no hang
    if p > 1 {
        c.set_bound(ErrorBound::Abs(1e-3)).unwrap();
        let k = 1000 + r;
        let x = upload::<f32>(&c, &data(r, k));
        let mut o = c.stream().alloc_zeros::<f32>(k).unwrap();
        let e = c.allreduce(&x, &mut o).unwrap_err();
        println!("[rank {r}] mismatch -> {e}");
        assert!(matches!(e, Error::Mismatch { .. }), "{e}");
    }

    // the ring in pieces (queued NCCL transfers): the values of whole segments, bit for bit
    if p > 1 {
        ring_pieces_match_whole_segments(&c);
    }

    // identical bytes over MPI and NCCL: the host Communicator over both transports
    if p > 1 {
        let world = mpi::topology::SimpleCommunicator::world();
        let prof = Profile::new(Link {
            bandwidth: 1e9,
            latency: 1e-5,
        });
        let cfg = || {
            Config::new(ErrorBound::Abs(1e-3))
                .with_policy(Policy::Always(CodecKind::Aatrox))
                .with_calibration(Calibration::Fixed(prof.clone()))
        };
        let mut over_mpi = Communicator::with_transport(
            Box::new(MpiTransport::new(&world)),
            Box::new(CpuCompressor),
            cfg(),
        )
        .unwrap();
        let mut over_nccl = Communicator::with_transport(
            Box::new(c.host_transport()),
            Box::new(CpuCompressor),
            cfg(),
        )
        .unwrap();
        let hx: Vec<f32> = data(r, 300_001).into_iter().map(|v| v as f32).collect();
        let mut g1 = vec![0f32; hx.len() * p];
        let mut g2 = vec![0f32; hx.len() * p];
        let a = over_mpi.allgather(&hx, &mut g1).unwrap();
        let b = over_nccl.allgather(&hx, &mut g2).unwrap();
        assert_eq!(a.wire_bytes, b.wire_bytes);
        assert!(
            g1.iter().zip(&g2).all(|(x, y)| x.to_bits() == y.to_bits()),
            "allgather differs MPI vs NCCL"
        );
        let to = (r + 1) % p;
        let from = (r + p - 1) % p;
        let mut y1 = vec![0f32; hx.len()];
        let mut y2 = vec![0f32; hx.len()];
        for (comm, y) in [(&mut over_mpi, &mut y1), (&mut over_nccl, &mut y2)] {
            if r % 2 == 0 {
                comm.send(&hx, to, 5).unwrap();
                comm.recv(y, from, 5).unwrap();
            } else {
                comm.recv(y, from, 5).unwrap();
                comm.send(&hx, to, 5).unwrap();
            }
        }
        assert!(
            y1.iter().zip(&y2).all(|(x, y)| x.to_bits() == y.to_bits()),
            "send/recv differs MPI vs NCCL"
        );
        // and the device allgather (GPU codec, pieces) decodes to the same values as the MPI
        // path with the CPU codec under the same absolute bound
        let dx = c.stream().clone_htod(&hx).unwrap();
        let mut dout = c.stream().alloc_zeros::<f32>(hx.len() * p).unwrap();
        c.set_policy(Policy::Always(CodecKind::Aatrox));
        c.allgather(&dx, &mut dout).unwrap();
        let dg: Vec<f32> = c.stream().clone_dtoh(&dout).unwrap();
        assert!(
            dg.iter().zip(&g1).all(|(x, y)| x.to_bits() == y.to_bits()),
            "device allgather differs from MPI path"
        );
        println!(
            "[rank {r}] MPI and NCCL transports: identical allgather ({} wire bytes) and send/recv",
            a.wire_bytes
        );
    }
    c.barrier().unwrap();
    println!("[rank {r}] all NCCL checks passed");
    Ok(Completion::Completed)
}
