//! Buffer element types the communicator moves: real f32/f64 and complex pairs.

use super::compressor::Compressor;
use super::transport::Transport;
use crate::codec::CodecKind;
use crate::element::Element;
use crate::error::Result;
use crate::quant::ErrorBound;

/// A real scalar the codecs and reductions work on (`f32` or `f64`).
pub trait Real:
    Element + std::ops::Add<Output = Self> + std::ops::Sub<Output = Self> + std::ops::Div<Output = Self>
{
    /// Unit roundoff of the type (`2^-24` for f32, `2^-53` for f64).
    const UNIT_ROUNDOFF: f64;
    /// Compress with the matching typed method of `c`.
    fn compress_with(
        c: &dyn Compressor,
        d: &[Self],
        b: ErrorBound,
        k: CodecKind,
    ) -> Result<Vec<u8>>;
    /// Decompress with the matching typed method of `c`.
    fn decompress_with(c: &dyn Compressor, s: &[u8], out: &mut [Self]) -> Result<()>;
    /// Native (uncompressed) sum over all ranks.
    fn native_sum(t: &dyn Transport, input: &[Self], out: &mut [Self]) -> Result<()>;
}

macro_rules! impl_real {
    ($t:ty, $u:expr, $c:ident, $d:ident, $s:ident) => {
        impl Real for $t {
            const UNIT_ROUNDOFF: f64 = $u;
            fn compress_with(
                c: &dyn Compressor,
                d: &[Self],
                b: ErrorBound,
                k: CodecKind,
            ) -> Result<Vec<u8>> {
                c.$c(d, b, k)
            }
            fn decompress_with(c: &dyn Compressor, s: &[u8], out: &mut [Self]) -> Result<()> {
                c.$d(s, out)
            }
            fn native_sum(t: &dyn Transport, input: &[Self], out: &mut [Self]) -> Result<()> {
                t.$s(input, out)
            }
        }
    };
}

impl_real!(
    f32,
    5.960_464_477_539_063e-8,
    compress_f32,
    decompress_f32,
    allreduce_sum_f32
);
impl_real!(
    f64,
    1.110_223_024_625_156_5e-16,
    compress_f64,
    decompress_f64,
    allreduce_sum_f64
);

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
    impl Sealed for [f32; 2] {}
    impl Sealed for [f64; 2] {}
}

/// An element of a communicated buffer: `f32`, `f64`, or a complex number as an interleaved
/// `[re, im]` pair (`[f32; 2]` = complex64, `[f64; 2]` = complex128). Complex buffers are
/// compressed as their interleaved real scalars, so an error bound holds for the real and the
/// imaginary part separately (and a `noa` range is taken over both parts together). Sealed.
pub trait CommElement: sealed::Sealed + Copy + Default + Send + Sync + 'static {
    /// The real scalar type.
    type Scalar: Real;
    /// Scalars per element (1 real, 2 complex).
    const LANES: usize;
    /// Tag used in cross-rank descriptors: 1 f32, 2 f64, 3 complex64, 4 complex128.
    const TAG: u8;
    /// Name for messages (`f32`, `f64`, `c64`, `c128`).
    const NAME: &'static str;
    /// View a buffer as its scalars.
    fn scalars(s: &[Self]) -> &[Self::Scalar];
    /// View a buffer as its scalars, mutably.
    fn scalars_mut(s: &mut [Self]) -> &mut [Self::Scalar];
}

/// The [`CommElement`] impls: a real scalar type is its own scalars (one lane); a complex
/// `[re, im]` pair of one is viewed as its interleaved scalars (two lanes).
macro_rules! comm_element {
    (real $t:ty, tag $tag:literal, $name:literal) => {
        comm_element!(@impl $t, $t, 1, $tag, $name, |s| s, |s| s);
    };
    (complex $t:ty, tag $tag:literal, $name:literal) => {
        comm_element!(@impl [$t; 2], $t, 2, $tag, $name,
            |s| s.as_flattened(), |s| s.as_flattened_mut());
    };
    (@impl $t:ty, $scalar:ty, $lanes:literal, $tag:literal, $name:literal,
        |$s:ident| $view:expr, |$m:ident| $view_mut:expr) => {
        impl CommElement for $t {
            type Scalar = $scalar;
            const LANES: usize = $lanes;
            const TAG: u8 = $tag;
            const NAME: &'static str = $name;
            fn scalars($s: &[Self]) -> &[$scalar] {
                $view
            }
            fn scalars_mut($m: &mut [Self]) -> &mut [$scalar] {
                $view_mut
            }
        }
    };
}

comm_element!(real f32, tag 1, "f32");
comm_element!(real f64, tag 2, "f64");
comm_element!(complex f32, tag 3, "c64");
comm_element!(complex f64, tag 4, "c128");

/// Name of a descriptor dtype tag.
pub(crate) fn dtype_name(tag: u8) -> &'static str {
    match tag {
        1 => "f32",
        2 => "f64",
        3 => "c64",
        4 => "c128",
        _ => "?",
    }
}

/// The little-endian bytes of a scalar slice (zero-copy on little-endian targets).
pub(crate) fn scalar_bytes<S: Real>(s: &[S]) -> std::borrow::Cow<'_, [u8]> {
    if cfg!(target_endian = "little") {
        // SAFETY: f32/f64 have no padding and every byte pattern is a valid u8; the length is
        // the slice's size in bytes and the lifetime is tied to `s`.
        std::borrow::Cow::Borrowed(unsafe {
            std::slice::from_raw_parts(s.as_ptr() as *const u8, std::mem::size_of_val(s))
        })
    } else {
        let mut v = Vec::with_capacity(s.len() * S::SIZE);
        for &x in s {
            x.write_le(&mut v);
        }
        std::borrow::Cow::Owned(v)
    }
}

/// Mutable byte view of a scalar slice (little-endian targets only; `None` elsewhere).
pub(crate) fn scalar_bytes_mut<S: Real>(s: &mut [S]) -> Option<&mut [u8]> {
    if cfg!(target_endian = "little") {
        // SAFETY: as in `scalar_bytes`; any byte pattern written is a valid f32/f64.
        Some(unsafe {
            std::slice::from_raw_parts_mut(s.as_mut_ptr() as *mut u8, std::mem::size_of_val(s))
        })
    } else {
        None
    }
}

/// Fill `out` from little-endian bytes (`bytes.len()` must be `out.len() * SIZE`).
pub(crate) fn scalars_from_bytes<S: Real>(bytes: &[u8], out: &mut [S]) -> crate::Result<()> {
    if bytes.len() != out.len() * S::SIZE {
        return Err(crate::Error::Mismatch {
            what: "raw payload bytes",
            expected: (out.len() * S::SIZE).to_string(),
            found: bytes.len().to_string(),
        });
    }
    if let Some(b) = scalar_bytes_mut(out) {
        b.copy_from_slice(bytes);
    } else {
        for (o, c) in out.iter_mut().zip(bytes.chunks_exact(S::SIZE)) {
            *o = S::read_le(c);
        }
    }
    Ok(())
}
