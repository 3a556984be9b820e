//! `zcomm decompress`: stream -> raw array of the stream's dtype.

use std::path::PathBuf;

use zcomm::{Element, Result};

use crate::array::{read_file, values_to_bytes, with_dtype, write_file};
use crate::device::{self, Device};

/// Arguments of `zcomm decompress`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Compressed stream (written by `zcomm compress` or the library).
    #[arg(long, short = 'i')]
    pub input: PathBuf,
    /// Where to write the raw little-endian array (same dtype as compressed).
    #[arg(long, short = 'o')]
    pub output: PathBuf,
    /// Run the codec on the CPU or the GPU.
    #[arg(long, value_enum, default_value_t = Device::Cpu)]
    pub device: Device,
}

/// Run `zcomm decompress`.
pub fn run(a: Args) -> Result<()> {
    let stream = read_file(&a.input)?;
    let h = zcomm::inspect(&stream)?;
    let raw = with_dtype!(h.dtype, decode::<T>(&stream, h.count, a.device))?;
    write_file(&a.output, &raw)?;
    println!(
        "{}: {} values of {} ({} bytes)",
        a.output.display(),
        h.count,
        h.dtype,
        raw.len()
    );
    Ok(())
}

fn decode<T: Element>(stream: &[u8], count: u64, device: Device) -> Result<Vec<u8>> {
    // `inspect` has checked that the stream's length matches its header; refuse counts the
    // default decoder limits would refuse before allocating.
    let limits = zcomm::DecodeLimits::default();
    if count > limits.max_count {
        return Err(zcomm::Error::corrupt(format!(
            "stream claims {count} values, limit is {}",
            limits.max_count
        )));
    }
    let n = count as usize;
    let mut out: Vec<T> = Vec::new();
    out.try_reserve_exact(n).map_err(|_| {
        zcomm::Error::OutOfMemory(format!("cannot allocate {n} values of {}", T::DTYPE))
    })?;
    out.resize(n, T::default());
    device::decompress_into(device, stream, &mut out)?;
    Ok(values_to_bytes(&out))
}
