//! `zcomm decompress`: stream -> raw array of the stream's dtype.
//!
//! A small stream can claim a huge array (a 393 KB stream of constant data decodes to 3 GiB), so
//! the size the header claims is checked against `--max-output-bytes` before anything is
//! allocated. On the CPU the stream is then decoded batch by batch
//! ([`zcomm::codec::decompress_chunked`]) and each batch written out as it comes, so memory holds
//! the stream and one batch (at most 2^24 values), never the whole decoded array. The GPU decodes
//! the whole array at once (its kernels take the full output buffer).

use std::path::PathBuf;

use zcomm::{DecodeLimits, Element, Error, Result};

use crate::array::{read_file, with_dtype, write_values};
use crate::device::{self, Device};
use crate::out::outln;
use crate::output::OutputFile;

/// Arguments of `zcomm decompress`.
#[derive(clap::Args, Debug)]
#[command(after_help = "\
Examples:
  zcomm decompress -i field.zc -o field.out.f32
  zcomm decompress -i big.zc -o big.f64 --max-output-bytes 200GiB
  zcomm decompress -i field.zc -o /dev/null --device gpu
  zcomm decompress -i pos.zc -o pos.out.f32   (gpz: particles x coordinates, AoS)")]
pub struct Args {
    /// Compressed stream (written by `zcomm compress` or the library).
    #[arg(long, short = 'i')]
    pub input: PathBuf,
    /// Where to write the raw little-endian array (same dtype as compressed; written atomically,
    /// must differ from the input).
    #[arg(long, short = 'o')]
    pub output: PathBuf,
    /// Run the codec on the CPU or the GPU.
    #[arg(long, value_enum, default_value_t = Device::Cpu)]
    pub device: Device,
    /// Refuse streams that decode to more than this many bytes (e.g. `8GiB`, `500MB`, `1000`).
    /// Default: the lesser of half the memory and 64 GiB.
    #[arg(long, value_parser = crate::parse::bytes)]
    pub max_output_bytes: Option<u64>,
}

/// Run `zcomm decompress`.
pub fn run(a: Args) -> Result<()> {
    let stream = read_file(&a.input)?;
    let h = zcomm::inspect(&stream)?;
    let size = h.count.saturating_mul(h.dtype.size() as u64);
    let max = a
        .max_output_bytes
        .unwrap_or_else(DecodeLimits::default_max_bytes);
    // checked here too (the decoder's limits check it again) for an error that names the file and
    // the option, before the output file is created
    if size > max {
        return Err(Error::invalid(format!(
            "`{}` decodes to {} values of {} ({size} bytes), more than the limit of {max} bytes \
             (--max-output-bytes{})",
            a.input.display(),
            h.count,
            h.dtype,
            if a.max_output_bytes.is_some() {
                ""
            } else {
                "; default: half the memory, at most 64 GiB"
            }
        )));
    }
    let limits = DecodeLimits::default().with_max_bytes(max);
    let mut out = OutputFile::create(&a.output, &[&a.input])?;
    with_dtype!(
        h.dtype,
        decode::<T>(&stream, h.count, limits, a.device, &mut out)
    )?;
    out.commit()?;
    outln!(
        "{}: {} values of {} ({size} bytes){}",
        a.output.display(),
        h.count,
        h.dtype,
        particle_note(&stream, &h)
    )
}

/// For a compressed gpz stream: its particles, and for a reorder stream that they come in
/// stored order (the stream does not record the permutation: `zcomm compress --permutation`
/// writes it when compressing).
fn particle_note(stream: &[u8], h: &zcomm::format::Header) -> String {
    if h.codec != zcomm::CodecKind::Gpz.tag() || h.is_stored() {
        return String::new();
    }
    match zcomm::codec::gpz_payload_header(stream, h) {
        Ok(g) if g.order == zcomm::codec::gpz::Order::Reorder => {
            format!(", {} particles x {}, reorder: in stored order", g.n, g.d)
        }
        Ok(g) => format!(", {} particles x {}, preserve: in input order", g.n, g.d),
        Err(_) => String::new(),
    }
}

/// Decode `stream` (of `count` values of `T`) under `limits` and write the values to `out`.
fn decode<T: Element>(
    stream: &[u8],
    count: u64,
    limits: DecodeLimits,
    device: Device,
    out: &mut OutputFile,
) -> Result<()> {
    if device == Device::Cpu {
        // (not decompress_to_writer: its io errors would not name the output file)
        zcomm::codec::decompress_chunked::<T, _>(stream, limits, |batch| {
            write_values(batch, |b| out.write(b))
        })?;
        return Ok(());
    }
    // the GPU decoder takes the whole output buffer: refuse counts the limits refuse, then
    // allocate fallibly (an error, not an abort, when memory runs out)
    if count > limits.max_count {
        return Err(Error::corrupt(format!(
            "stream claims {count} values, limit is {}",
            limits.max_count
        )));
    }
    let n = usize::try_from(count)
        .map_err(|_| Error::OutOfMemory(format!("{count} values do not fit in memory")))?;
    let mut values: Vec<T> = Vec::new();
    values
        .try_reserve_exact(n)
        .map_err(|_| Error::OutOfMemory(format!("cannot allocate {n} values of {}", T::DTYPE)))?;
    values.resize(n, T::default());
    device::decompress_into(device, stream, &mut values)?;
    write_values(&values, |b| out.write(b))
}
