//! Quantization of prediction residuals (abs / noa bounds): the code of `x - prediction`, the
//! reconstruction the decoder will compute, and the exact check of the bound on it.
//!
//! The rules are those of every other codec (FORMAT.md, "Quantization (abs / noa)"): the encoder
//! reconstructs each value exactly as the decoder will and keeps it only when the reconstruction
//! is within the bound; anything else (NaN, ±Inf, the fill value, overflowing codes, a missed
//! bound) is stored losslessly. Only the reconstruction differs: `prediction + code * step`
//! instead of `code * step`.

use std::marker::PhantomData;

use crate::element::Element;
use crate::quant::QuantParams;

/// Residual quantizer for one set of [`QuantParams`] (abs or noa mode).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ResidualQuantizer<T: Element> {
    step: f64,
    inv: f64,
    eb: f64,
    fill: Option<u64>,
    _t: PhantomData<T>,
}

impl<T: Element> ResidualQuantizer<T> {
    /// The quantizer of `params` (whose step is already rounded to the dtype).
    pub fn new(params: &QuantParams) -> Self {
        ResidualQuantizer {
            step: params.step,
            inv: 1.0 / params.step,
            // (an infinite bound, impossible from `QuantParams`, would accept infinities)
            eb: if params.abs_bound <= f64::MAX {
                params.abs_bound
            } else {
                0.0
            },
            fill: params.fill.map(|f| T::from_f64(f).to_bits_u64()),
            _t: PhantomData,
        }
    }

    /// The reconstruction of code `q` at prediction `p`: `p + q * step` in f64 (the product,
    /// then the sum, each rounded to nearest), rounded to the dtype.
    #[inline(always)]
    pub fn decode(&self, q: i64, p: f64) -> T {
        T::from_f64(p + q as f64 * self.step)
    }

    /// The code of `x` at prediction `p` and its reconstruction (widened to f64), or `None` when
    /// `x` must be stored losslessly: `x` not finite or the fill value, `p` not finite,
    /// `|(x - p) * inv| >= QMAX` (codes stay below 2^29 / 2^61), or a reconstruction that is not
    /// finite or misses the bound. The code is `round_ties_even((x - p) * inv)` in f64.
    #[inline(always)]
    pub fn encode(&self, x: T, p: f64) -> Option<(i64, f64)> {
        if !x.finite() || Some(x.to_bits_u64()) == self.fill || !p.is_finite() {
            return None;
        }
        let xv = x.to_f64();
        let v = (xv - p) * self.inv;
        let in_range = v.abs() < T::QMAX; // false for NaN
        if !in_range {
            return None;
        }
        // round_ties_even, in the form baseline x86-64 vectorizes (no libm call)
        let q = <f64 as Element>::rint(v) as i64;
        let r = self.decode(q, p);
        let rv = r.to_f64();
        self.within(xv, rv).then_some((q, rv))
    }

    /// Exact check of `|x - r| <= eb` (`r` a value of the dtype). f32: the difference of two f32
    /// values is exact in f64. f64: the rounded difference strictly below `eb` implies the exact
    /// one is at most `eb` (rounding is monotonic and `eb` is a double); equal to `eb`, it is
    /// accepted only when the subtraction is exact (Sterbenz). An infinite or NaN `r` fails.
    #[inline(always)]
    fn within(&self, xv: f64, rv: f64) -> bool {
        let d = (xv - rv).abs();
        if T::SIZE == 4 {
            return d <= self.eb;
        }
        let (a, b) = (xv.abs(), rv.abs());
        let exact = rv == 0.0 || ((xv < 0.0) == (rv < 0.0) && b * 0.5 <= a && a <= b * 2.0);
        d < self.eb || (d == self.eb && exact)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::ErrorBound;

    /// Every accepted code reconstructs within the bound (checked exactly, in f64 / with a
    /// 128-bit style split for f64), whatever the prediction.
    #[test]
    fn accepted_codes_keep_the_bound() {
        let data: Vec<f64> = (0..2000).map(|i| (i as f64 * 0.37).sin() * 1e3).collect();
        for eb in [1e-3, 0.5, 1e-300] {
            let p = QuantParams::derive(&data, ErrorBound::Abs(eb)).unwrap();
            let q64 = ResidualQuantizer::<f64>::new(&p);
            let q32 = ResidualQuantizer::<f32>::new(&p);
            let mut kept = 0;
            for (i, &x) in data.iter().enumerate() {
                let pred = x + ((i % 7) as f64 - 3.0) * eb * 0.9 + 1e-9 * i as f64;
                if let Some((c, r)) = q64.encode(x, pred) {
                    kept += 1;
                    assert_eq!(q64.decode(c, pred).to_f64(), r);
                    // exact |x - r| <= eb: both sides doubles, difference checked in two parts
                    let (hi, lo) = two_diff(x, r);
                    assert!(
                        hi.abs() < eb || (hi.abs() == eb && lo == 0.0),
                        "{x} {r} {eb}"
                    );
                }
                let x32 = x as f32;
                if let Some((c, r)) = q32.encode(x32, pred) {
                    assert_eq!(q32.decode(c, pred).to_f64(), r);
                    assert!((x32 as f64 - r).abs() <= eb);
                }
            }
            if eb >= 1e-3 {
                assert!(kept > 1900, "{eb}: {kept}");
            }
        }
        let p = QuantParams::derive(&data, ErrorBound::Abs(1.0)).unwrap();
        let q = ResidualQuantizer::<f32>::new(&p);
        assert!(q.encode(f32::NAN, 0.0).is_none());
        assert!(q.encode(1.0, f64::INFINITY).is_none());
        assert!(q.encode(3e38, -3e38).is_none());
    }

    fn two_diff(a: f64, b: f64) -> (f64, f64) {
        let s = a - b;
        let bb = s - a;
        (s, (a - (s - bb)) + (-b - bb))
    }
}
