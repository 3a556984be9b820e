//! GPU throughput measurement (`zcomm bench --device gpu`).
//!
//! End-to-end time is device input → device output of one [`GpuCodec::compress_device`] /
//! [`GpuCodec::decompress_device`] call, including every launch, small copy and host step the
//! call makes (the value-range kernel for `noa` and its read-back, a workspace memset where
//! one is needed, the status read-back; pfpl: the header upload).
//! Kernel-only time is the sum of the kernels' own CUDA-event times, taken in a second call
//! after each end-to-end one (the per-kernel events are off in the end-to-end calls, as in a
//! caller's), queued behind a short spin kernel so that the events time the kernel and not the
//! host's launch latency (a kernel launched after a synchronization inside the call, such as
//! the compression kernel after the value-range read-back, still waits for its launch). Both
//! are the median of `runs` timed runs after `warmup` untimed ones; GB/s = 1e9 bytes of
//! uncompressed data per second.
//!
//! `cuszi` and `gpz` calls are several kernels with host read-backs between them: their
//! "kernel-only" time is the span of the call's device work ([`super::KernelTimes::main_ms`]).
//!
//! For `noa` bounds a third phase times [`GpuCodec::compress_device_with_range`] the same way,
//! with the value range computed once by [`GpuCodec::value_range_device`] before timing (so
//! without the value-range kernel and its read-back), and checks that its stream equals the
//! [`GpuCodec::compress_device`] one (not for `gpz`, which refuses a given range).

use cudarc::driver::{sys as cu_sys, CudaEvent, CudaSlice};

use super::{same_elements, GpuCodec, GpuElement};
use crate::codec::CodecKind;
use crate::element::Element;
use crate::error::{Error, Result};
use crate::format::Dtype;
use crate::quant::ErrorBound;

/// Options of [`bench_device`].
#[derive(Debug, Clone, Copy)]
pub struct BenchOptions {
    /// Timed runs per direction (median reported; at least 20 for reported numbers).
    pub runs: usize,
    /// Untimed warm-up runs per direction.
    pub warmup: usize,
    /// Compare the stream and the reconstruction with the CPU twin.
    pub check_cpu: bool,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            runs: 20,
            warmup: 3,
            check_cpu: true,
        }
    }
}

/// One GPU benchmark result (one codec, dtype, bound and input).
#[derive(Debug, Clone, serde::Serialize)]
pub struct GpuBenchRecord {
    /// Codec name.
    pub codec: String,
    /// `f32` / `f64`.
    pub dtype: String,
    /// The bound as given (`noa:1e-3`).
    pub error_bound: String,
    /// Input name (path or generator).
    pub input: String,
    /// Uncompressed bytes.
    pub bytes: u64,
    /// Compressed stream bytes (header included).
    pub compressed_bytes: u64,
    /// `bytes / compressed_bytes`.
    pub ratio: f64,
    /// Largest `|x - x'|` over finite values (GPU reconstruction).
    pub max_error: f64,
    /// End-to-end compression throughput, GB/s of uncompressed data (median).
    pub compress_gbps: f64,
    /// End-to-end decompression throughput, GB/s (median).
    pub decompress_gbps: f64,
    /// Kernel-only compression throughput, GB/s (median).
    pub kernel_compress_gbps: f64,
    /// Kernel-only decompression throughput, GB/s (median).
    pub kernel_decompress_gbps: f64,
    /// Median end-to-end compression time, ms.
    pub compress_ms: f64,
    /// Median end-to-end decompression time, ms.
    pub decompress_ms: f64,
    /// Median kernel-only compression time, ms (value-range + compress kernel).
    pub kernel_compress_ms: f64,
    /// Median kernel-only decompression time, ms.
    pub kernel_decompress_ms: f64,
    /// Timed runs per direction.
    pub runs: usize,
    /// GPU name.
    pub device: String,
    /// The GPU stream equals `zcomm::compress`'s bytes (false when not checked).
    pub bit_identical_to_cpu: bool,
    /// The GPU reconstruction equals `zcomm::decompress`'s bit for bit (false when not checked).
    pub decode_identical_to_cpu: bool,
    /// `noa` only: end-to-end throughput, GB/s (median), of
    /// [`GpuCodec::compress_device_with_range`] given the data's own value range (computed once
    /// by [`GpuCodec::value_range_device`] before timing, so no value-range kernel or read-back
    /// per call). Absent for `abs` / `rel` bounds and for `gpz`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compress_given_range_gbps: Option<f64>,
    /// `noa` only: kernel-only throughput, GB/s (median), of those calls (the compress kernel's
    /// CUDA-event time, plus the value-range kernel's when a degenerate step needs it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_compress_given_range_gbps: Option<f64>,
    /// `noa` only: median end-to-end time of those calls, ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compress_given_range_ms: Option<f64>,
    /// `noa` only: median kernel-only time of those calls, ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_compress_given_range_ms: Option<f64>,
    /// `noa` only: the [`GpuCodec::compress_device_with_range`] stream equals the
    /// [`GpuCodec::compress_device`] stream byte for byte (it must: the given range is the data's
    /// own), and hence `zcomm::compress_with_range`'s when `bit_identical_to_cpu` holds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub given_range_identical: Option<bool>,
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    if v.is_empty() {
        0.0
    } else {
        v[v.len() / 2]
    }
}

fn ge<E: std::fmt::Debug>(what: &'static str) -> impl Fn(E) -> Error {
    move |e| Error::Gpu(format!("{what}: {e:?}"))
}

/// How long the kernel-timed call waits behind [`GpuCodec::hold_stream`]: ample time for the host
/// to queue the call's launches up to its first synchronization.
const HOLD_MICROS: u32 = 100;

/// Run `op` (one codec call on `gpu`'s stream) `opts.warmup + opts.runs` times between the CUDA
/// events `ev.0` and `ev.1` with kernel timing off (the end-to-end time a caller sees, without
/// the per-kernel events), each followed by one call with kernel timing on for the kernel-only
/// time (`stats_ms + main_ms` of [`GpuCodec::last_kernel_times`]), queued behind
/// [`GpuCodec::hold_stream`] so that its first kernel's events do not time the host's launch
/// latency. Returns the end-to-end and kernel-only milliseconds of the timed runs.
fn time_runs(
    gpu: &mut GpuCodec,
    ev: &(CudaEvent, CudaEvent),
    opts: &BenchOptions,
    mut op: impl FnMut(&mut GpuCodec) -> Result<()>,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let s = gpu.stream().clone();
    let (mut e2e, mut kernel) = (Vec::new(), Vec::new());
    for i in 0..opts.warmup + opts.runs {
        gpu.set_kernel_timing(false)?;
        ev.0.record(&s).map_err(ge("record"))?;
        op(gpu)?;
        ev.1.record(&s).map_err(ge("record"))?;
        let ms = ev.0.elapsed_ms(&ev.1).map_err(ge("elapsed"))? as f64;
        gpu.set_kernel_timing(true)?;
        gpu.hold_stream(HOLD_MICROS)?;
        op(gpu)?;
        let k = gpu.last_kernel_times();
        if i >= opts.warmup {
            e2e.push(ms);
            kernel.push((k.stats_ms + k.main_ms) as f64);
        }
    }
    Ok((e2e, kernel))
}

/// Benchmark `codec` on `data` (copied to the device once) under `bound`.
pub fn bench_device<T: GpuElement>(
    gpu: &mut GpuCodec,
    data: &[T],
    input: &str,
    bound: ErrorBound,
    codec: CodecKind,
    opts: BenchOptions,
) -> Result<GpuBenchRecord> {
    let s = gpu.stream().clone();
    let n = data.len();
    let bytes = std::mem::size_of_val(data);
    let oom = |e| Error::OutOfMemory(format!("benchmark buffers: {e:?}"));
    let d_in: CudaSlice<T> = s.clone_htod(data).map_err(oom)?;
    let mut d_out: CudaSlice<u8> = s
        .alloc_zeros(crate::format::compress_bound(n, T::DTYPE))
        .map_err(oom)?;
    let mut d_rec: CudaSlice<T> = s.alloc_zeros(n.max(1)).map_err(oom)?;
    let ctx = gpu.context().clone();
    let ev = |_| {
        ctx.new_event(Some(cu_sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(ge("event"))
    };
    let events = (ev(0)?, ev(1)?);
    gpu.set_kernel_timing(true)?;

    let mut len = 0usize;
    let (mut c_e2e, mut c_k) = {
        let iv = d_in.as_view();
        let mut ov = d_out.as_view_mut();
        time_runs(gpu, &events, &opts, |g| {
            len = g.compress_device(&iv, bound, codec, &mut ov)?;
            Ok(())
        })?
    };
    let (mut d_e2e, mut d_k) = {
        let sv = d_out.slice(0..len);
        let mut rv = d_rec.slice_mut(0..n);
        time_runs(gpu, &events, &opts, |g| g.decompress_device(&sv, &mut rv))?
    };
    let stream: Vec<u8> = s.clone_dtoh(&d_out.slice(0..len)).map_err(ge("dtoh"))?;

    // noa: the range computed once, then compression without the value-range kernel (into
    // d_out again: the stream above is on the host now); not for gpz, which measures each
    // axis's range itself and refuses a given one
    let given = if matches!(bound, ErrorBound::Noa(_)) && codec != CodecKind::Gpz {
        let range = gpu
            .value_range_device(&d_in.as_view())?
            .unwrap_or((0.0, 0.0));
        let mut glen = 0usize;
        let (e2e, k) = {
            let iv = d_in.as_view();
            let mut ov = d_out.as_view_mut();
            time_runs(gpu, &events, &opts, |g| {
                glen = g.compress_device_with_range(&iv, bound, codec, range, &mut ov)?;
                Ok(())
            })?
        };
        let gstream: Vec<u8> = s.clone_dtoh(&d_out.slice(0..glen)).map_err(ge("dtoh"))?;
        Some((e2e, k, gstream == stream))
    } else {
        None
    };
    gpu.set_kernel_timing(false)?;

    let rec: Vec<T> = if n > 0 {
        s.clone_dtoh(&d_rec.slice(0..n)).map_err(ge("dtoh"))?
    } else {
        Vec::new()
    };
    let mut max_error = 0f64;
    for (a, b) in data.iter().zip(&rec) {
        if a.finite() {
            max_error = max_error.max((a.to_f64() - b.to_f64()).abs());
        }
    }
    let (mut bit_identical, mut decode_identical) = (false, false);
    if opts.check_cpu {
        let cpu = crate::codec::compress(data, bound, codec)?;
        bit_identical = cpu == stream;
        let back: Vec<T> = crate::codec::decompress(&stream)?;
        decode_identical = back.len() == rec.len()
            && back
                .iter()
                .zip(&rec)
                .all(|(a, b)| a.to_bits_u64() == b.to_bits_u64());
    }
    let gbps = |ms: f64| {
        if ms > 0.0 {
            bytes as f64 / 1e9 / (ms / 1e3)
        } else {
            0.0
        }
    };
    let (gm, gkm, given_identical) = match given {
        Some((mut e2e, mut k, same)) => (Some(median(&mut e2e)), Some(median(&mut k)), Some(same)),
        None => (None, None, None),
    };
    let (cm, dm, kcm, kdm) = (
        median(&mut c_e2e),
        median(&mut d_e2e),
        median(&mut c_k),
        median(&mut d_k),
    );
    Ok(GpuBenchRecord {
        codec: codec.name().to_string(),
        dtype: T::DTYPE.to_string(),
        error_bound: bound.to_string(),
        input: input.to_string(),
        bytes: bytes as u64,
        compressed_bytes: len as u64,
        ratio: bytes as f64 / len.max(1) as f64,
        max_error,
        compress_gbps: gbps(cm),
        decompress_gbps: gbps(dm),
        kernel_compress_gbps: gbps(kcm),
        kernel_decompress_gbps: gbps(kdm),
        compress_ms: cm,
        decompress_ms: dm,
        kernel_compress_ms: kcm,
        kernel_decompress_ms: kdm,
        runs: opts.runs,
        device: gpu.device_name().to_string(),
        bit_identical_to_cpu: bit_identical,
        decode_identical_to_cpu: decode_identical,
        compress_given_range_gbps: gm.map(gbps),
        kernel_compress_given_range_gbps: gkm.map(gbps),
        compress_given_range_ms: gm,
        kernel_compress_given_range_ms: gkm,
        given_range_identical: given_identical,
    })
}

/// [`bench_device`] for any [`Element`] (dispatches on the dtype; for generic callers such as the
/// CLI).
pub fn bench_any<T: Element>(
    gpu: &mut GpuCodec,
    data: &[T],
    input: &str,
    bound: ErrorBound,
    codec: CodecKind,
    opts: BenchOptions,
) -> Result<GpuBenchRecord> {
    match T::DTYPE {
        Dtype::F32 => bench_device(
            gpu,
            same_elements::<T, f32>(data),
            input,
            bound,
            codec,
            opts,
        ),
        Dtype::F64 => bench_device(
            gpu,
            same_elements::<T, f64>(data),
            input,
            bound,
            codec,
            opts,
        ),
    }
}
