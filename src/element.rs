//! The value types zcomm compresses, and the bit-level operations the codecs need from them.

use crate::format::Dtype;

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
}

/// A floating-point element type: `f32` or `f64`. Sealed.
///
/// `Code` is the signed integer holding a quantization code, `Bits` the unsigned integer with the
/// same width as the float.
pub trait Element:
    sealed::Sealed + Copy + Default + PartialOrd + Send + Sync + std::fmt::Debug + 'static
{
    /// The stream's dtype tag.
    const DTYPE: Dtype;
    /// Size in bytes.
    const SIZE: usize;
    /// Codes must satisfy `|x * inv| < QMAX` (2^29 for f32, 2^61 for f64).
    const QMAX: f64;
    /// Largest delta bit width a rate byte may carry (30 for f32, 62 for f64).
    const MAX_RATE: u32;
    /// Widen to f64 (exact).
    fn to_f64(self) -> f64;
    /// Narrow from f64 (round to nearest even).
    fn from_f64(v: f64) -> Self;
    /// The raw bits, zero-extended to 64.
    fn to_bits_u64(self) -> u64;
    /// From raw bits (the low `SIZE*8` bits).
    fn from_bits_u64(b: u64) -> Self;
    /// `round_ties_even(self * inv)` and the unrounded product, in the element's precision.
    fn mul(self, rhs: Self) -> Self;
    /// Round to nearest even integer.
    fn rint(self) -> Self;
    /// Convert an integer code to the element (round to nearest even).
    fn from_code(q: i64) -> Self;
    /// Convert an integral value with `|v| < QMAX` to its code (anything else gives 0).
    fn to_code(self) -> i64;
    /// Whether the value is finite.
    fn finite(self) -> bool;
    /// Absolute value.
    fn abs_val(self) -> Self;
    /// Write little-endian bytes.
    fn write_le(self, out: &mut Vec<u8>);
    /// Read from `SIZE` little-endian bytes.
    fn read_le(b: &[u8]) -> Self;
    /// The largest value of this type `<= v` (v finite and positive), or 0.
    fn round_down_from_f64(v: f64) -> Self;
}

macro_rules! impl_element {
    ($t:ty, $bits:ty, $dt:expr, $qmax:expr, $rate:expr, $magic:expr) => {
        impl Element for $t {
            const DTYPE: Dtype = $dt;
            const SIZE: usize = std::mem::size_of::<$t>();
            const QMAX: f64 = $qmax;
            const MAX_RATE: u32 = $rate;
            #[inline]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline]
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            #[inline]
            fn to_bits_u64(self) -> u64 {
                self.to_bits() as u64
            }
            #[inline]
            fn from_bits_u64(b: u64) -> Self {
                <$t>::from_bits(b as $bits)
            }
            #[inline]
            fn mul(self, rhs: Self) -> Self {
                self * rhs
            }
            #[inline]
            fn rint(self) -> Self {
                // Same result as `round_ties_even`, but vectorizable on baseline x86-64:
                // adding 2^(mantissa bits) rounds |x| to an integer, ties to even.
                let a = self.abs();
                if a < $magic {
                    ((a + $magic) - $magic).copysign(self)
                } else {
                    self
                }
            }
            #[inline]
            fn from_code(q: i64) -> Self {
                // codes of valid streams satisfy |q| < QMAX, so f32 codes fit an i32 (whose
                // conversion vectorizes); out-of-range codes only arise from corrupt input
                if Self::SIZE == 4 {
                    q as i32 as $t
                } else {
                    q as $t
                }
            }
            #[inline]
            fn to_code(self) -> i64 {
                let v = if self.abs() < $qmax { self } else { 0.0 };
                // SAFETY: `v` is finite and |v| < QMAX (2^29 / 2^61), so it fits the target type.
                unsafe {
                    if Self::SIZE == 4 {
                        v.to_int_unchecked::<i32>() as i64
                    } else {
                        v.to_int_unchecked::<i64>()
                    }
                }
            }
            #[inline]
            fn finite(self) -> bool {
                self.is_finite()
            }
            #[inline]
            fn abs_val(self) -> Self {
                self.abs()
            }
            #[inline]
            fn write_le(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            #[inline]
            fn read_le(b: &[u8]) -> Self {
                let mut a = [0u8; std::mem::size_of::<$t>()];
                a.copy_from_slice(&b[..std::mem::size_of::<$t>()]);
                <$t>::from_le_bytes(a)
            }
            fn round_down_from_f64(v: f64) -> Self {
                let mut r = v as $t;
                if (r as f64) > v {
                    r = <$t>::from_bits(r.to_bits() - 1);
                }
                if r.is_finite() && r > 0.0 {
                    r
                } else {
                    0.0
                }
            }
        }
    };
}

impl_element!(f32, u32, Dtype::F32, 536_870_912.0, 30, 8_388_608.0);
impl_element!(
    f64,
    u64,
    Dtype::F64,
    2_305_843_009_213_693_952.0,
    62,
    4_503_599_627_370_496.0
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rint_matches_round_ties_even() {
        let probes = [
            0.5f64,
            1.5,
            2.5,
            -0.5,
            -2.5,
            0.49999999999999994,
            4503599627370495.5,
            1e300,
            -0.0,
            3.0,
        ];
        for &p in &probes {
            assert_eq!(p.rint().to_bits(), p.round_ties_even().to_bits(), "{p}");
            let f = p as f32;
            assert_eq!(f.rint().to_bits(), f.round_ties_even().to_bits(), "{f}");
        }
        let mut x = 0x1234_5678u32;
        for _ in 0..200_000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let f = f32::from_bits(x);
            if f.is_finite() {
                assert_eq!(f.rint().to_bits(), f.round_ties_even().to_bits(), "{f}");
            }
            let d = f64::from_bits((x as u64) << 32 | x.rotate_left(7) as u64);
            if d.is_finite() {
                assert_eq!(d.rint().to_bits(), d.round_ties_even().to_bits(), "{d}");
            }
        }
    }
}
