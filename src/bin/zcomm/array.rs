//! Raw little-endian arrays on disk (no header), and the dtype dispatch the subcommands share.

use std::path::Path;

use zcomm::{Element, Error, Result};

/// Read a whole regular file, naming it in the error.
///
/// Anything else (`/dev/zero`, a FIFO, a terminal) is refused: such an input has no size to check
/// up front and may never end, and reading it whole would grow memory without bound.
pub fn read_file(path: &Path) -> Result<Vec<u8>> {
    let cannot = |e: &dyn std::fmt::Display| {
        Error::invalid(format!("cannot read input `{}`: {e}", path.display()))
    };
    let meta = std::fs::metadata(path).map_err(|e| cannot(&e))?;
    if !meta.is_file() {
        return Err(cannot(&"not a regular file (devices, pipes and directories are refused; copy the data to a file)"));
    }
    std::fs::read(path).map_err(|e| cannot(&e))
}

/// Interpret `bytes` (read from `path`) as little-endian values of `T`.
pub fn values_from_bytes<T: Element>(bytes: &[u8], path: &Path) -> Result<Vec<T>> {
    if bytes.len() % T::SIZE != 0 {
        return Err(Error::invalid(format!(
            "input `{}` has {} bytes, which is not a whole number of {} values ({} bytes each)",
            path.display(),
            bytes.len(),
            T::DTYPE,
            T::SIZE
        )));
    }
    Ok(bytes.chunks_exact(T::SIZE).map(T::read_le).collect())
}

/// Values converted to little-endian bytes per block: the writer of a decoded array holds one
/// block of bytes at a time, never a second copy of the whole array.
pub const BLOCK_BYTES: usize = 1 << 20;

/// Feed the little-endian bytes of `values` to `sink`, [`BLOCK_BYTES`] at a time.
pub fn write_values<T: Element>(
    values: &[T],
    mut sink: impl FnMut(&[u8]) -> Result<()>,
) -> Result<()> {
    let mut buf = Vec::with_capacity(BLOCK_BYTES.min(std::mem::size_of_val(values)));
    for block in values.chunks((BLOCK_BYTES / T::SIZE).max(1)) {
        buf.clear();
        for &v in block {
            v.write_le(&mut buf);
        }
        sink(&buf)?;
    }
    Ok(())
}

/// Whether `values` look like data of another dtype read as `T` (an f32 file passed as
/// `--dtype f64`, or the reverse); returns the warning to print.
///
/// * f32 data read as f64: each f64 holds two neighbouring f32 values, and neighbours in real data
///   mostly share sign and exponent, so the top 9 bits of an f64's two 32-bit halves agree far
///   more often than the 1 in 512 of genuine f64 values (whose low half is mantissa bits).
/// * f64 data read as f32: every other f32 is the low half of an f64's mantissa, i.e. bits with
///   an arbitrary exponent, so a large share of values has a magnitude beyond 2^±64, where real
///   f32 data hardly ever is.
pub fn dtype_warning<T: Element>(values: &[T]) -> Option<String> {
    const MIN_VALUES: usize = 64;
    if values.len() < MIN_VALUES {
        return None;
    }
    // a sample of at most 64 Ki values, spread over the whole array
    let stride = (values.len() / 65_536).max(1);
    let sample = values.iter().step_by(stride);
    let n = values.len().div_ceil(stride) as f64;
    match T::DTYPE {
        zcomm::Dtype::F64 => {
            let (mut same, mut zero) = (0usize, 0usize);
            for v in sample {
                let bits = v.to_bits_u64();
                let (hi, lo) = ((bits >> 32) as u32, bits as u32);
                if hi == 0 && lo == 0 {
                    zero += 1;
                } else if hi >> 23 == lo >> 23 {
                    same += 1;
                }
            }
            let nonzero = n - zero as f64;
            (nonzero >= MIN_VALUES as f64 && same as f64 > 0.3 * nonzero).then(|| {
                format!(
                    "{:.0}% of the values' two 32-bit halves share sign and exponent, as pairs of f32 \
                     values do: is the input f32 data (--dtype f32)?",
                    100.0 * same as f64 / nonzero
                )
            })
        }
        zcomm::Dtype::F32 => {
            let (mut wild, mut zero) = (0usize, 0usize);
            for v in sample {
                let x = v.to_f64();
                if x == 0.0 {
                    zero += 1;
                } else if !x.is_finite() || !(5.4e-20..=1.9e19).contains(&x.abs()) {
                    wild += 1;
                }
            }
            let nonzero = n - zero as f64;
            (nonzero >= MIN_VALUES as f64 && wild as f64 > 0.15 * nonzero).then(|| {
                format!(
                    "{:.0}% of the values are non-finite or beyond 2^±64 in magnitude, as the low halves \
                     of f64 values read as f32 are: is the input f64 data (--dtype f64)?",
                    100.0 * wild as f64 / nonzero
                )
            })
        }
    }
}

/// `v` (a value of `T`) written as briefly as `T` allows: an f32 fill value of `-1e10` is the
/// f64 `-9999998976`, and `--fill-value -1e10` is what the user typed and should type again.
pub fn short_value<T: Element>(v: f64) -> String {
    match T::DTYPE {
        zcomm::Dtype::F32 => format!("{:e}", v as f32),
        zcomm::Dtype::F64 => format!("{v:e}"),
    }
}

/// Whether one value of `data` accounts for most of its range, as a fill value marking missing
/// points does (`-1e10` on land in ocean data); returns the warning to print. `None` when the
/// user gave `--fill-value` (`fill`): then the range is theirs to choose.
///
/// Under a `noa` bound such a value makes the bound on every other value ~100 times looser than
/// the user expects (the bound is a fraction of a range the fill value stretches), silently; under
/// abs and rel bounds it only costs ratio, but keeping it exact is still what a fill value wants.
pub fn fill_warning<T: Element>(
    data: &[T],
    bound: zcomm::ErrorBound,
    fill: Option<f64>,
) -> Option<String> {
    if fill.is_some() {
        return None;
    }
    let v = zcomm::quant::likely_fill_value(data)?;
    let vb = T::from_f64(v).to_bits_u64();
    let n = data.iter().filter(|x| x.to_bits_u64() == vb).count();
    let shown = short_value::<T>(v);
    let effect = if matches!(bound, zcomm::ErrorBound::Noa(_)) {
        format!(
            "the {bound} bound is a fraction of a value range it stretches, so the other values \
             get a bound ~100 times looser than their own range suggests"
        )
    } else {
        "it is quantized like any other value".to_string()
    };
    Some(format!(
        "{n} of {} values are {shown}, which accounts for more than 99% of the value range: \
         likely a fill value (missing data); {effect}. Pass --fill-value {shown} to keep these \
         points exactly and leave them out of the range",
        data.len()
    ))
}

/// Call a generic function with the element type named by a [`zcomm::Dtype`] value:
/// `with_dtype!(dtype, f::<T>(args))` expands to a match over f32/f64.
macro_rules! with_dtype {
    ($dtype:expr, $f:ident :: <T> ($($arg:expr),* $(,)?)) => {
        match $dtype {
            zcomm::Dtype::F32 => $f::<f32>($($arg),*),
            zcomm::Dtype::F64 => $f::<f64>($($arg),*),
        }
    };
}
pub(crate) use with_dtype;
