//! Round trips with exact bound checks, adversarial inputs, shapes, corrupted streams.

use proptest::prelude::*;

use crate::codec::{compress_nd, compress_with_options, decompress, inspect, CodecKind};
use crate::element::Element;
use crate::format::{Dims, HEADER_LEN_V3};
use crate::quant::{pred, ErrorBound};
use crate::CompressOptions;

/// Compress `data` of shape `dims` with cuszi under `bound`, decode it, and check every value
/// with the rule of the other codecs' tests: finite values within the header's absolute bound
/// (abs/noa) or `pred(E |x|)` (rel), computed in f64; anything else bit-exact. Returns the
/// stream.
fn check<T: Element>(data: &[T], dims: &[usize], bound: ErrorBound) -> Vec<u8> {
    let s = compress_nd(data, dims, bound, CodecKind::Cuszi).unwrap();
    let h = inspect(&s).unwrap();
    assert_eq!(h.count, data.len() as u64);
    let want: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
    assert_eq!(h.dims.unwrap().as_slice(), &want[..]);
    let back: Vec<T> = decompress(&s).unwrap();
    assert_eq!(back.len(), data.len());
    for (i, (x, y)) in data.iter().zip(&back).enumerate() {
        let (xv, yv) = (x.to_f64(), y.to_f64());
        if x.finite() {
            let lim = match bound {
                ErrorBound::Rel(e) => pred(e * xv.abs()),
                _ => h.abs_bound,
            };
            let d = (xv - yv).abs();
            assert!(
                d <= lim,
                "{bound} {dims:?} value {i}: |{xv:e} - {yv:e}| = {d:e} > {lim:e}"
            );
        } else {
            assert_eq!(x.to_bits_u64(), y.to_bits_u64(), "{dims:?} value {i}");
        }
    }
    s
}

/// A smooth 3-D field of shape `n`.
fn field<T: Element>(n: [usize; 3]) -> Vec<T> {
    let mut v = Vec::with_capacity(n.iter().product());
    for i in 0..n[0] {
        for j in 0..n[1] {
            for k in 0..n[2] {
                let (x, y, z) = (i as f64 * 0.07, j as f64 * 0.05, k as f64 * 0.09);
                v.push(T::from_f64(
                    x.sin() * y.cos() * 100.0 + (z + x).cos() * 30.0 + 7.0,
                ));
            }
        }
    }
    v
}

#[test]
fn smooth_fields_round_trip_every_mode() {
    for dims in [[33usize, 17, 20], [8, 8, 8], [1, 9, 40], [2, 1, 1]] {
        let d32 = field::<f32>(dims);
        let d64 = field::<f64>(dims);
        for b in [
            ErrorBound::Abs(1e-2),
            ErrorBound::Noa(1e-3),
            ErrorBound::Noa(1e-6),
            ErrorBound::Rel(1e-3),
        ] {
            check(&d32, &dims, b);
            check(&d64, &dims, b);
            // the same values as 1-D and 2-D
            let n = d32.len();
            check(&d32, &[n], b);
            check(&d64, &[dims[0] * dims[1], dims[2]], b);
        }
    }
}
