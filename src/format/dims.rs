//! Array shapes (`--dims 512x512x512`): at most four dimensions, slowest first (numpy's C order).

use crate::error::{Error, Result};

/// Most dimensions a shape may have (4-D arrays are compressed as batches of 3-D volumes).
pub const MAX_DIMS: usize = 4;

/// The shape of an array: 1 to [`MAX_DIMS`] extents, **slowest-varying first** (numpy/C order:
/// element `(i, j, k)` of a `[a, b, c]` array is at index `(i * b + j) * c + k`).
///
/// Every extent is at least 1, except the 1-D shape `[0]` of an empty array. Built with
/// [`Dims::new`] (which checks this) or parsed from `"512x512x512"`.
///
/// ```
/// use zcomm::format::Dims;
/// let d: Dims = "64x32x16".parse().unwrap();
/// assert_eq!((d.as_slice(), d.count()), (&[64u64, 32, 16][..], 32_768));
/// assert_eq!(d.to_string(), "64x32x16");
/// assert!("64x0".parse::<Dims>().is_err());
/// assert!("1x2x3x4x5".parse::<Dims>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Dims {
    len: u8,
    d: [u64; MAX_DIMS],
}

impl Dims {
    /// A shape from its extents (slowest first). Errors ([`Error::InvalidArgument`]): no
    /// extent or more than [`MAX_DIMS`], a zero extent (other than the 1-D `[0]`), or a product
    /// that overflows `u64`.
    pub fn new(dims: &[u64]) -> Result<Self> {
        Self::check(dims).map_err(Error::invalid)
    }

    /// The 1-D shape of `n` values.
    pub fn linear(n: u64) -> Self {
        let mut d = [0; MAX_DIMS];
        d[0] = n;
        Dims { len: 1, d }
    }

    /// The checks of [`Dims::new`], with the reason as a message.
    pub(crate) fn check(dims: &[u64]) -> std::result::Result<Self, String> {
        if dims.is_empty() || dims.len() > MAX_DIMS {
            return Err(format!(
                "a shape has 1 to {MAX_DIMS} dimensions, got {}",
                dims.len()
            ));
        }
        if dims.len() > 1 && dims.contains(&0) {
            return Err(format!("shape {dims:?} has a zero dimension"));
        }
        let mut count = 1u64;
        for &x in dims {
            count = count
                .checked_mul(x)
                .ok_or_else(|| format!("shape {dims:?}: the value count overflows u64"))?;
        }
        let mut d = [0; MAX_DIMS];
        d[..dims.len()].copy_from_slice(dims);
        Ok(Dims {
            len: dims.len() as u8,
            d,
        })
    }

    /// The extents, slowest first.
    pub fn as_slice(&self) -> &[u64] {
        &self.d[..self.len as usize]
    }

    /// Number of dimensions (1 to 4).
    pub fn ndims(&self) -> usize {
        self.len as usize
    }

    /// Number of values (the product of the extents).
    pub fn count(&self) -> u64 {
        self.as_slice().iter().product()
    }

    /// The extents padded with zeros to [`MAX_DIMS`] (the header's layout).
    pub fn padded(&self) -> [u64; MAX_DIMS] {
        self.d
    }
}

impl std::fmt::Display for Dims {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, x) in self.as_slice().iter().enumerate() {
            if i > 0 {
                f.write_str("x")?;
            }
            write!(f, "{x}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for Dims {
    type Err = Error;
    /// Parses `NxMx...` (slowest first), e.g. `512x512x512`; `,` is accepted as a separator.
    fn from_str(s: &str) -> Result<Self> {
        let parts: Vec<&str> = s.split(['x', 'X', ',']).map(str::trim).collect();
        let mut dims = Vec::with_capacity(parts.len());
        for p in &parts {
            let v: u64 = p.parse().map_err(|_| {
                Error::invalid(format!(
                    "dims `{s}`: `{p}` is not a whole number (expected e.g. 512x512x512)"
                ))
            })?;
            dims.push(v);
        }
        if dims == [0] {
            return Err(Error::invalid(format!("dims `{s}`: a zero dimension")));
        }
        Dims::new(&dims).map_err(|e| Error::invalid(format!("dims `{s}`: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_parse_and_check() {
        assert_eq!("7".parse::<Dims>().unwrap().as_slice(), &[7]);
        assert_eq!("2, 3".parse::<Dims>().unwrap().as_slice(), &[2, 3]);
        for bad in [
            "",
            "x",
            "0",
            "3x0",
            "1x2x3x4x5",
            "-1x2",
            "2xy",
            "4294967296x4294967296",
        ] {
            assert!(bad.parse::<Dims>().is_err(), "{bad}");
        }
        assert_eq!(Dims::new(&[0]).unwrap().count(), 0);
        assert_eq!(Dims::linear(5), Dims::new(&[5]).unwrap());
        assert!(Dims::new(&[]).is_err());
    }
}
