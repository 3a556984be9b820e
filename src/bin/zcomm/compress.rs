//! `zcomm compress`: raw array -> stream.

use std::path::PathBuf;

use zcomm::{CodecKind, Dtype, Element, ErrorBound, Result};

use crate::array::{read_file, values_from_bytes, with_dtype, write_file};
use crate::device::{self, Device};

/// Arguments of `zcomm compress`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Raw little-endian array to compress.
    #[arg(long, short = 'i')]
    pub input: PathBuf,
    /// Where to write the compressed stream.
    #[arg(long, short = 'o')]
    pub output: PathBuf,
    /// Element type of the input: f32 or f64.
    #[arg(long, value_parser = crate::parse::dtype)]
    pub dtype: Dtype,
    /// Error bound: abs:E (absolute), noa:E (relative to the value range) or rel:E (point-wise).
    #[arg(long, value_parser = crate::parse::bound)]
    pub error_bound: ErrorBound,
    /// Codec.
    #[arg(long, default_value = "aatrox", value_parser = crate::parse::codec())]
    pub codec: CodecKind,
    /// Run the codec on the CPU or the GPU.
    #[arg(long, value_enum, default_value_t = Device::Cpu)]
    pub device: Device,
}

/// Run `zcomm compress`.
pub fn run(a: Args) -> Result<()> {
    let bytes = read_file(&a.input)?;
    let stream = with_dtype!(a.dtype, compress_bytes::<T>(&bytes, &a))?;
    write_file(&a.output, &stream)?;
    let ratio = if stream.is_empty() {
        0.0
    } else {
        bytes.len() as f64 / stream.len() as f64
    };
    println!(
        "{}: {} bytes -> {} bytes (ratio {ratio:.3}, {} {}, {})",
        a.output.display(),
        bytes.len(),
        stream.len(),
        a.codec,
        a.dtype,
        a.error_bound
    );
    Ok(())
}

fn compress_bytes<T: Element>(bytes: &[u8], a: &Args) -> Result<Vec<u8>> {
    let data: Vec<T> = values_from_bytes(bytes, &a.input)?;
    device::compress(a.device, &data, a.error_bound, a.codec)
}
