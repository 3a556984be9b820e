//! `zcomm compress`: raw array -> stream.

use std::path::PathBuf;

use zcomm::{CodecKind, CompressOptions, Dims, Dtype, Element, ErrorBound, Result};

use crate::array::{dtype_warning, fill_warning, read_file, values_from_bytes, with_dtype};
use crate::device::{self, Device};
use crate::out::outln;
use crate::output::OutputFile;

/// Arguments of `zcomm compress`.
#[derive(clap::Args, Debug)]
#[command(after_help = "\
Examples:
  zcomm compress -i field.f32 -o field.zc --dtype f32 --error-bound abs:1e-3
  zcomm compress -i field.f64 -o field.zc --dtype f64 --error-bound noa:1e-4 --codec cuszp-outlier
  zcomm compress -i grad.f32 -o grad.zc --dtype f32 --error-bound rel:1e-2 --device gpu
  zcomm compress -i ocean.f32 -o ocean.zc --dtype f32 --error-bound noa:1e-4 --fill-value -1e10
  zcomm compress -i cube.f32 -o cube.zc --dtype f32 --error-bound noa:1e-3 --codec cuszi --dims 512x512x512")]
pub struct Args {
    /// Raw little-endian array to compress (a regular file).
    #[arg(long, short = 'i')]
    pub input: PathBuf,
    /// Where to write the compressed stream (written atomically; must differ from the input).
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
    /// A fill value marking missing points (e.g. -1e10 on land): values equal to it (in the
    /// input's dtype) are kept exactly and left out of the value range of noa bounds. Recorded in
    /// the stream's header. CPU only.
    #[arg(long, allow_negative_numbers = true, value_name = "V")]
    pub fill_value: Option<f64>,
    /// The array's shape, slowest dimension first (numpy's order), e.g. 512x512x512: 1 to 4
    /// extents whose product is the input's value count. Default: 1-D. Used by cuszi (and
    /// recorded in its stream); the other codecs compress every array as 1-D.
    #[arg(long, value_parser = crate::parse::dims, value_name = "NxMx...")]
    pub dims: Option<Dims>,
}

/// Run `zcomm compress`.
pub fn run(a: Args) -> Result<()> {
    let bytes = read_file(&a.input)?;
    // opened first: an output that is the input is refused before any work
    let mut out = OutputFile::create(&a.output, &[&a.input])?;
    let stream = with_dtype!(a.dtype, compress_bytes::<T>(&bytes, &a))?;
    out.write(&stream)?;
    out.commit()?;
    let count = bytes.len() / a.dtype.size();
    if count == 0 {
        // a ratio of an empty input is meaningless (0 / header bytes)
        return outln!(
            "{}: empty input (0 values) -> {} bytes (header only; {} {}, {})",
            a.output.display(),
            stream.len(),
            a.codec,
            a.dtype,
            a.error_bound
        );
    }
    let fill = a
        .fill_value
        .map_or(String::new(), |v| format!(", fill value {v:e}"));
    outln!(
        "{}: {count} {} values, {} bytes -> {} bytes (ratio {:.3}, {}, {}{fill})",
        a.output.display(),
        a.dtype,
        bytes.len(),
        stream.len(),
        bytes.len() as f64 / stream.len() as f64,
        a.codec,
        a.error_bound
    )
}

fn compress_bytes<T: Element>(bytes: &[u8], a: &Args) -> Result<Vec<u8>> {
    let data: Vec<T> = values_from_bytes(bytes, &a.input)?;
    if let Some(w) = dtype_warning(&data) {
        crate::out::warn(format_args!("`{}` as {}: {w}", a.input.display(), T::DTYPE));
    }
    if let Some(w) = fill_warning(&data, a.error_bound, a.fill_value) {
        crate::out::warn(format_args!("`{}`: {w}", a.input.display()));
    }
    device::compress(
        a.device,
        &data,
        a.error_bound,
        a.codec,
        &options(a.fill_value, a.dims),
    )
}

/// The library options of `--fill-value` and `--dims`.
pub fn options(fill_value: Option<f64>, dims: Option<Dims>) -> CompressOptions {
    let mut o = CompressOptions::default();
    if let Some(v) = fill_value {
        o = o.with_fill_value(v);
    }
    if let Some(d) = dims {
        o = o.with_dims(d);
    }
    o
}
