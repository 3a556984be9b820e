//! `zcomm decompress`: stream -> raw array of the stream's dtype.
//!
//! A small stream can claim a huge array (a 393 KB stream of constant data decodes to 3 GiB), so
//! the size the header claims is checked against `--max-output-bytes` before anything is
//! allocated, and the decoded values are written out in blocks ([`write_values`]) rather than
//! converted into a second full-size byte buffer.

use std::path::PathBuf;

use zcomm::{Element, Error, Result};

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
  zcomm decompress -i field.zc -o /dev/null --device gpu")]
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

/// The default `--max-output-bytes`: half of the physical memory (the decoded array must fit in
/// memory), at most 64 GiB; 64 GiB where the memory size is unknown.
pub fn default_max_output_bytes() -> u64 {
    const CAP: u64 = 64 << 30;
    let mem = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        let line = m.lines().find(|l| l.starts_with("MemTotal:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib.saturating_mul(1024))
    });
    mem.map_or(CAP, |m| (m / 2).min(CAP))
}

/// Run `zcomm decompress`.
pub fn run(a: Args) -> Result<()> {
    let stream = read_file(&a.input)?;
    let h = zcomm::inspect(&stream)?;
    let size = h.count.saturating_mul(h.dtype.size() as u64);
    let max = a.max_output_bytes.unwrap_or_else(default_max_output_bytes);
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
    let mut out = OutputFile::create(&a.output, &[&a.input])?;
    with_dtype!(h.dtype, decode::<T>(&stream, h.count, a.device, &mut out))?;
    out.commit()?;
    outln!(
        "{}: {} values of {} ({size} bytes)",
        a.output.display(),
        h.count,
        h.dtype,
    )
}

/// Decode `stream` (of `count` values of `T`) and write the values to `out`.
///
/// Today the whole array is decoded into one buffer, then written in blocks; a chunked decoder
/// only has to replace the body of this function (decode a block, write it, repeat).
fn decode<T: Element>(
    stream: &[u8],
    count: u64,
    device: Device,
    out: &mut OutputFile,
) -> Result<()> {
    // `inspect` has checked that the stream's length matches its header; refuse counts the
    // default decoder limits would refuse before allocating.
    let limits = zcomm::DecodeLimits::default();
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
