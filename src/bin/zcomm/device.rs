//! The one place that maps `--device cpu|gpu` onto an implementation.
//!
//! Every subcommand calls [`compress`] / [`decompress_into`] here instead of the library directly,
//! so wiring the GPU codecs in means editing only this file.

use zcomm::{CodecKind, CompressOptions, Element, Error, ErrorBound, Result};

/// Where a codec runs.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Device {
    /// The CPU twin (Rust, all rayon threads).
    #[default]
    Cpu,
    /// The CUDA kernels.
    Gpu,
}

impl Device {
    /// Name for reports.
    pub fn name(self) -> &'static str {
        match self {
            Device::Cpu => "cpu",
            Device::Gpu => "gpu",
        }
    }
}

/// Runs `f` on the process-wide GPU codec (device 0), created at first use.
#[cfg(feature = "cuda")]
fn with_gpu<R>(f: impl FnOnce(&mut zcomm::gpu::GpuCodec) -> Result<R>) -> Result<R> {
    static GPU: std::sync::Mutex<Option<zcomm::gpu::GpuCodec>> = std::sync::Mutex::new(None);
    let mut g = GPU
        .lock()
        .map_err(|_| Error::Gpu("GPU codec lock poisoned".into()))?;
    if g.is_none() {
        *g = Some(zcomm::gpu::GpuCodec::new(0)?);
    }
    f(g.as_mut().expect("initialized above"))
}

#[cfg(not(feature = "cuda"))]
fn with_gpu<R>(_f: impl FnOnce(&mut NoGpu) -> Result<R>) -> Result<R> {
    Err(gpu_unavailable())
}

/// Stand-in when the crate is built without the `cuda` feature.
#[cfg(not(feature = "cuda"))]
#[allow(dead_code)]
struct NoGpu;
#[cfg(not(feature = "cuda"))]
#[allow(dead_code)]
impl NoGpu {
    fn compress_any<T: Element>(
        &mut self,
        _: &[T],
        _: ErrorBound,
        _: CodecKind,
    ) -> Result<Vec<u8>> {
        Err(gpu_unavailable())
    }
    fn decompress_into_any<T: Element>(&mut self, _: &[u8], _: &mut [T]) -> Result<()> {
        Err(gpu_unavailable())
    }
    fn device_name(&self) -> &str {
        "gpu (unavailable)"
    }
}

#[allow(dead_code)]
fn gpu_unavailable() -> Error {
    Error::Unavailable(
        "GPU codecs not available: zcomm was built without the `cuda` feature (use --device cpu)"
            .into(),
    )
}

/// Compress `data` on `device` with `options` (a fill value: `--fill-value`).
///
/// The GPU kernels do not implement fill values; `zcomm::gpu::GpuCodec::compress_with_options`
/// refuses one with an invalid-argument error, and so does this function, before the device is
/// even opened: a fill value must never be dropped silently (the fill points would then be
/// quantized, and the noa bound taken over the fill value's range), nor the work quietly moved
/// to the CPU.
pub fn compress<T: Element>(
    device: Device,
    data: &[T],
    bound: ErrorBound,
    codec: CodecKind,
    options: &CompressOptions,
) -> Result<Vec<u8>> {
    match device {
        Device::Cpu => zcomm::compress_with_options(data, bound, codec, options),
        Device::Gpu => {
            no_gpu_kernels(codec)?;
            // the GPU codec compresses the values as 1-D, in input order: a shape or particle
            // order the stream would have to record is refused, never dropped
            let shaped = options.dims.is_some_and(|d| d.ndims() > 1);
            let reorder = options.particle_order != zcomm::codec::gpz::Order::Preserve;
            if codec.uses_dims() && (shaped || reorder) {
                return Err(Error::Unavailable(format!(
                    "{codec} with --dims of more than one extent or --particle-order reorder is \
                     not supported on the GPU yet (it compresses 1-D values in input order; \
                     use --device cpu)"
                )));
            }
            if let Some(f) = options.fill_value {
                return Err(Error::invalid(format!(
                    "--fill-value {f:e}: fill values are not supported by the GPU codecs \
                     (compress on the CPU: --device cpu)"
                )));
            }
            with_gpu(|g| g.compress_any(data, bound, codec))
        }
    }
}

/// Decompress `stream` into `out` (whose length is the stream's count) on `device`.
pub fn decompress_into<T: Element>(device: Device, stream: &[u8], out: &mut [T]) -> Result<()> {
    match device {
        Device::Cpu => zcomm::decompress_into(stream, out),
        Device::Gpu => {
            if let Ok(c) = zcomm::inspect(stream).and_then(|h| CodecKind::from_tag(h.codec)) {
                no_gpu_kernels(c)?;
            }
            with_gpu(|g| g.decompress_into_any(stream, out))
        }
    }
}

/// The error for a codec without GPU kernels (outside `CodecKind::WITH_GPU`), before any
/// device is opened.
fn no_gpu_kernels(codec: CodecKind) -> Result<()> {
    if codec.has_gpu() {
        return Ok(());
    }
    Err(Error::Unavailable(format!(
        "{codec} is not supported on the GPU yet (use --device cpu)"
    )))
}

/// GPU benchmark as the issue defines it (device input -> device output, CUDA events, 3 warm-up
/// runs, median of `runs`, kernel-only times too, bit identity with the CPU twin checked) for
/// `zcomm bench --device gpu`.
#[cfg(feature = "cuda")]
pub fn bench_gpu<T: Element>(
    data: &[T],
    input: &str,
    bound: ErrorBound,
    codec: CodecKind,
    runs: usize,
) -> Result<zcomm::gpu::bench::GpuBenchRecord> {
    let opts = zcomm::gpu::bench::BenchOptions {
        runs,
        warmup: 3,
        check_cpu: true,
    };
    with_gpu(|g| zcomm::gpu::bench::bench_any(g, data, input, bound, codec, opts))
}

/// A human-readable name of the hardware behind `device` (for benchmark records).
pub fn describe(device: Device) -> String {
    match device {
        Device::Cpu => cpu_model(),
        Device::Gpu => with_gpu(|g| Ok(g.device_name().to_string()))
            .unwrap_or_else(|_| "gpu (unavailable)".into()),
    }
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}
