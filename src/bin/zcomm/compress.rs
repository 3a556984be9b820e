//! `zcomm compress`: raw array -> stream.

use std::path::PathBuf;

use zcomm::codec::gpz::Order;
use zcomm::{CodecKind, CompressOptions, Dims, Dtype, Element, Error, ErrorBound, Result};

use crate::array::{dtype_warning, fill_warning, read_file, values_from_bytes, with_dtype};
use crate::device::{self, Device};
use crate::out::outln;
use crate::output::OutputFile;

/// The permutation of a `--particle-order reorder` stream, `perm[i]` the original index of output
/// particle `i`.
type Permutation = Option<Vec<u64>>;

/// Arguments of `zcomm compress`.
#[derive(clap::Args, Debug)]
#[command(after_help = "\
Examples:
  zcomm compress -i field.f32 -o field.zc --dtype f32 --error-bound abs:1e-3
  zcomm compress -i field.f64 -o field.zc --dtype f64 --error-bound noa:1e-4 --codec cuszp-outlier
  zcomm compress -i grad.f32 -o grad.zc --dtype f32 --error-bound rel:1e-2 --device gpu
  zcomm compress -i ocean.f32 -o ocean.zc --dtype f32 --error-bound noa:1e-4 --fill-value -1e10
  zcomm compress -i cube.f32 -o cube.zc --dtype f32 --error-bound noa:1e-3 --codec cuszi --dims 512x512x512
  zcomm compress -i pos.f32 -o pos.zc --dtype f32 --error-bound abs:1e-3 --codec gpz --dims 1000000x3
  zcomm compress -i pos.f32 -o pos.zc --dtype f32 --error-bound abs:1e-3 --codec gpz --dims 1000000x3 \
      --particle-order reorder --permutation pos.perm")]
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
    /// extents whose product is the input's value count. Default: 1-D. Used by cuszi and gpz
    /// (and recorded in their streams); the other codecs compress every array as 1-D. For gpz:
    /// Nxd, N particles of d = 1..4 coordinates stored particle by particle (1-D: Nx1).
    #[arg(long, value_parser = crate::parse::dims, value_name = "NxMx...")]
    pub dims: Option<Dims>,
    /// gpz only: `preserve` (default) decodes the particles in their original order;
    /// `reorder` stores no permutation and decodes them in stored order (sorted within each
    /// block of 32), which is smaller. Reorder only when the order means nothing or every other
    /// per-particle array is permuted alike (--permutation).
    #[arg(long, value_parser = parse_order, value_name = "ORDER")]
    pub particle_order: Option<Order>,
    /// gpz with --particle-order reorder: also write the permutation to this file (written
    /// atomically): for each decoded particle, its index in the input, as u32 little-endian
    /// (u64 when there are 2^32 particles or more). The stream does not record it.
    #[arg(long, value_name = "FILE")]
    pub permutation: Option<PathBuf>,
}

fn parse_order(s: &str) -> std::result::Result<Order, String> {
    s.parse().map_err(|e: Error| e.to_string())
}

/// Refuse the gpz options with other codecs, `--permutation` without reorder, and a gpz shape
/// whose last extent is not a coordinate count (before any file is touched).
fn check_gpz_args(a: &Args) -> Result<()> {
    if a.codec != CodecKind::Gpz {
        if a.particle_order.is_some() {
            return Err(Error::invalid(format!(
                "--particle-order applies to --codec gpz only (not {})",
                a.codec
            )));
        }
        if a.permutation.is_some() {
            return Err(Error::invalid(format!(
                "--permutation applies to --codec gpz --particle-order reorder only (not {})",
                a.codec
            )));
        }
        return Ok(());
    }
    if a.permutation.is_some() && a.particle_order != Some(Order::Reorder) {
        return Err(Error::invalid(
            "--permutation needs --particle-order reorder (a preserve stream decodes in the \
             original order: its permutation is the identity)",
        ));
    }
    if let Some(d) = a.dims {
        zcomm::format::gpz_coords(&d).map_err(|e| Error::invalid(format!("--dims {d}: {e}")))?;
    }
    Ok(())
}

/// Run `zcomm compress`.
pub fn run(a: Args) -> Result<()> {
    check_gpz_args(&a)?;
    let bytes = read_file(&a.input)?;
    // opened first: an output that is the input is refused before any work
    let mut out = OutputFile::create(&a.output, &[&a.input])?;
    let mut perm_out = match &a.permutation {
        Some(p) => Some(OutputFile::create(p, &[&a.input, &a.output])?),
        None => None,
    };
    let (stream, perm) = with_dtype!(a.dtype, compress_bytes::<T>(&bytes, &a))?;
    out.write(&stream)?;
    if let (Some(po), Some(perm)) = (perm_out.as_mut(), &perm) {
        po.write(&permutation_bytes(perm))?;
    }
    out.commit()?;
    if let Some(po) = perm_out {
        po.commit()?;
    }
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
    let particles = if a.codec == CodecKind::Gpz {
        let d = a.dims.map_or(Ok(1), |d| zcomm::format::gpz_coords(&d))?;
        format!(
            ", {} particles x {d}, {}",
            count / d,
            a.particle_order.unwrap_or_default()
        )
    } else {
        String::new()
    };
    outln!(
        "{}: {count} {} values, {} bytes -> {} bytes (ratio {:.3}, {}, {}{fill}{particles})",
        a.output.display(),
        a.dtype,
        bytes.len(),
        stream.len(),
        bytes.len() as f64 / stream.len() as f64,
        a.codec,
        a.error_bound
    )
}

/// The `--permutation` file: u32 little-endian indices, u64 from 2^32 particles on.
fn permutation_bytes(perm: &[u64]) -> Vec<u8> {
    if perm.len() < 1 << 32 {
        perm.iter()
            .flat_map(|&i| (i as u32).to_le_bytes())
            .collect()
    } else {
        perm.iter().flat_map(|&i| i.to_le_bytes()).collect()
    }
}

fn compress_bytes<T: Element>(bytes: &[u8], a: &Args) -> Result<(Vec<u8>, Permutation)> {
    let data: Vec<T> = values_from_bytes(bytes, &a.input)?;
    if let Some(w) = dtype_warning(&data) {
        crate::out::warn(format_args!("`{}` as {}: {w}", a.input.display(), T::DTYPE));
    }
    if let Some(w) = fill_warning(&data, a.error_bound, a.fill_value) {
        crate::out::warn(format_args!("`{}`: {w}", a.input.display()));
    }
    let mut opts = options(a.fill_value, a.dims);
    if a.codec == CodecKind::Gpz {
        // (the GPU path refuses an order it does not write)
        opts = opts.with_particle_order(a.particle_order.unwrap_or_default());
    }
    if a.codec == CodecKind::Gpz && a.device == Device::Cpu {
        // (the library call that also returns the permutation)
        return zcomm::codec::compress_particles_with_options(&data, a.error_bound, &opts);
    }
    Ok((
        device::compress(a.device, &data, a.error_bound, a.codec, &opts)?,
        None,
    ))
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
