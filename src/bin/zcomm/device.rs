//! The one place that maps `--device cpu|gpu` onto an implementation.
//!
//! Every subcommand calls [`compress`] / [`decompress_into`] here instead of the library directly,
//! so wiring the GPU codecs in means editing only this file.

use zcomm::{CodecKind, Element, Error, ErrorBound, Result};

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

fn gpu_unavailable() -> Error {
    Error::Unavailable(
        "GPU codecs not available: this build of zcomm has no CUDA codec yet (use --device cpu)"
            .into(),
    )
}

/// Compress `data` on `device`.
pub fn compress<T: Element>(
    device: Device,
    data: &[T],
    bound: ErrorBound,
    codec: CodecKind,
) -> Result<Vec<u8>> {
    match device {
        Device::Cpu => zcomm::compress(data, bound, codec),
        Device::Gpu => Err(gpu_unavailable()),
    }
}

/// Decompress `stream` into `out` (whose length is the stream's count) on `device`.
pub fn decompress_into<T: Element>(device: Device, stream: &[u8], out: &mut [T]) -> Result<()> {
    match device {
        Device::Cpu => zcomm::decompress_into(stream, out),
        Device::Gpu => Err(gpu_unavailable()),
    }
}

/// A human-readable name of the hardware behind `device` (for benchmark records).
pub fn describe(device: Device) -> String {
    match device {
        Device::Cpu => cpu_model(),
        Device::Gpu => "gpu (unavailable)".into(),
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
