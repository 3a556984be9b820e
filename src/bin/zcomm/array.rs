//! Raw little-endian arrays on disk (no header), and the dtype dispatch the subcommands share.

use std::path::Path;

use zcomm::{Element, Error, Result};

/// Read a whole file, naming it in the error.
pub fn read_file(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path)
        .map_err(|e| Error::invalid(format!("cannot read input `{}`: {e}", path.display())))
}

/// Write a whole file, naming it in the error.
pub fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes)
        .map_err(|e| Error::invalid(format!("cannot write output `{}`: {e}", path.display())))
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

/// The little-endian bytes of `values`.
pub fn values_to_bytes<T: Element>(values: &[T]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * T::SIZE);
    for &v in values {
        v.write_le(&mut out);
    }
    out
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
