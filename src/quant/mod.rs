//! Verified quantization: abs/noa (uniform step) and rel (log2 domain) codes, built only from
//! IEEE-exact operations so that CUDA kernels reproduce every code bit for bit.
//!
//! The encoder calls [`Quantizer::encode`], which returns `None` for any value the decoder would
//! not reconstruct within the bound; such values are stored losslessly by the codec.

use crate::element::Element;
use crate::error::{Error, Result};
use crate::format::BoundMode;

/// A user's error bound.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "mode", content = "value", rename_all = "lowercase")]
pub enum ErrorBound {
    /// `|x - x'| <= E`.
    Abs(f64),
    /// `|x - x'| <= E * (max - min)` over the finite values (value-range relative).
    Noa(f64),
    /// `|x - x'| <= E * |x|` (point-wise relative).
    Rel(f64),
}

impl ErrorBound {
    /// The mode tag.
    pub fn mode(&self) -> BoundMode {
        match self {
            ErrorBound::Abs(_) => BoundMode::Abs,
            ErrorBound::Noa(_) => BoundMode::Noa,
            ErrorBound::Rel(_) => BoundMode::Rel,
        }
    }
    /// The bound's value `E`.
    pub fn value(&self) -> f64 {
        match *self {
            ErrorBound::Abs(e) | ErrorBound::Noa(e) | ErrorBound::Rel(e) => e,
        }
    }
    /// Checks that the bound is usable: finite and positive (and below 1 for `rel`).
    pub fn validate(&self) -> Result<()> {
        let e = self.value();
        if !(e.is_finite() && e > 0.0) {
            return Err(Error::invalid(format!(
                "error bound must be finite and > 0, got {e}"
            )));
        }
        if matches!(self, ErrorBound::Rel(_)) && e >= 1.0 {
            return Err(Error::invalid(format!("rel bound must be < 1, got {e}")));
        }
        Ok(())
    }
}

impl std::fmt::Display for ErrorBound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ErrorBound::Abs(e) => write!(f, "abs:{e:e}"),
            ErrorBound::Noa(e) => write!(f, "noa:{e:e}"),
            ErrorBound::Rel(e) => write!(f, "rel:{e:e}"),
        }
    }
}

impl std::str::FromStr for ErrorBound {
    type Err = Error;
    /// Parses `abs:E`, `noa:E` or `rel:E`.
    fn from_str(s: &str) -> Result<Self> {
        let (mode, v) = s
            .split_once(':')
            .ok_or_else(|| Error::invalid(format!("error bound `{s}`: expected MODE:VALUE")))?;
        let e: f64 = v
            .trim()
            .parse()
            .map_err(|_| Error::invalid(format!("error bound `{s}`: `{v}` is not a number")))?;
        let b = match mode.trim() {
            "abs" => ErrorBound::Abs(e),
            "noa" => ErrorBound::Noa(e),
            "rel" => ErrorBound::Rel(e),
            m => {
                return Err(Error::invalid(format!(
                    "error bound `{s}`: unknown mode `{m}` (expected abs, noa or rel)"
                )))
            }
        };
        b.validate()?;
        Ok(b)
    }
}

/// Largest f64 strictly below a positive finite `v` (one ulp down), or `v` if it is 0.
pub fn pred(v: f64) -> f64 {
    if v > 0.0 && v.is_finite() {
        f64::from_bits(v.to_bits() - 1)
    } else {
        v
    }
}

/// `b - a` rounded down, for finite `a <= b` whose difference does not overflow: the rounded
/// difference, one ulp lower when the rounding went up (the error term of Knuth's TwoSum, exact
/// in IEEE arithmetic, says which way it went).
fn sub_down(b: f64, a: f64) -> f64 {
    let s = b - a;
    let bb = s - b;
    let err = (b - (s - bb)) + (-a - bb);
    if err < 0.0 {
        f64::from_bits(s.to_bits() - 1) // s > 0 here: a tie or a rounding up needs s > |err|
    } else {
        s
    }
}

/// The guaranteed absolute bound of `noa:E` over the finite value range `(lo, hi)`: a finite f64
/// that never exceeds the exact `E * (hi - lo)`, and is within a few ulps of it.
///
/// `hi - lo` overflows when the range spans more than `f64::MAX` (f64 data from below
/// `-8.9e307` to above `8.9e307`); the width is then taken of the halved ends (exact: both ends
/// are far from the subnormals) and the bound doubled back, saturating at `f64::MAX`, which is
/// still below the exact product. Rounding: the width is rounded down (`sub_down`) and the
/// product one ulp down ([`pred`] of a round-to-nearest result never exceeds the exact value).
pub fn noa_abs_bound(e: f64, (lo, hi): (f64, f64)) -> f64 {
    if !(e >= 0.0 && lo <= hi && lo.is_finite() && hi.is_finite()) {
        return 0.0;
    }
    let eb = if (hi - lo).is_finite() {
        pred(e * sub_down(hi, lo))
    } else {
        // `pred` of an infinite half-product stays infinite and saturates below
        2.0 * pred(e * sub_down(hi * 0.5, lo * 0.5))
    };
    if eb <= f64::MAX {
        eb.max(0.0)
    } else {
        f64::MAX
    }
}

/// Smallest and largest finite values of `data` (None if it has none). Parallel.
pub fn finite_range<T: Element>(data: &[T]) -> Option<(f64, f64)> {
    use rayon::prelude::*;
    let inf = T::from_f64(f64::INFINITY);
    let ninf = T::from_f64(f64::NEG_INFINITY);
    // branch-free min/max over 8 lanes so the compiler vectorizes it; non-finite values are
    // replaced by the neutral element
    #[inline(always)]
    fn lanes<T: Element>(c: &[T], inf: T, ninf: T) -> (T, T) {
        let mut lo = [inf; 8];
        let mut hi = [ninf; 8];
        let mut it = c.chunks_exact(8);
        for v in &mut it {
            for k in 0..8 {
                let x = v[k];
                let f = x.finite();
                let a = if f { x } else { inf };
                let b = if f { x } else { ninf };
                lo[k] = if a < lo[k] { a } else { lo[k] };
                hi[k] = if b > hi[k] { b } else { hi[k] };
            }
        }
        for &x in it.remainder() {
            if x.finite() {
                lo[0] = if x < lo[0] { x } else { lo[0] };
                hi[0] = if x > hi[0] { x } else { hi[0] };
            }
        }
        let mut l = lo[0];
        let mut h = hi[0];
        for k in 1..8 {
            l = if lo[k] < l { lo[k] } else { l };
            h = if hi[k] > h { hi[k] } else { h };
        }
        (l, h)
    }
    let (lo, hi) = data
        .par_chunks(1 << 16)
        .map(|c| {
            let (l, h) = crate::simd::simd(
                #[inline(always)]
                || lanes(c, inf, ninf),
            );
            (l.to_f64(), h.to_f64())
        })
        .reduce(
            || (f64::INFINITY, f64::NEG_INFINITY),
            |a, b| (a.0.min(b.0), a.1.max(b.1)),
        );
    // `+ 0.0` turns -0 into +0: which zero a min/max keeps depends on the scan order, and the
    // header must not (the GPU twin reduces in another order)
    (lo <= hi).then_some((lo + 0.0, hi + 0.0))
}

/// Values [`sampled_range`] reads at most (plus the last value).
pub const RANGE_SAMPLES: usize = 65_536;

/// The finite range of a deterministic sample of `data`: every value when there are at most
/// [`RANGE_SAMPLES`], else the values at `k * (n / RANGE_SAMPLES)` for `k` in
/// `0..RANGE_SAMPLES` and the last one. The result lies inside [`finite_range`] (`None` when
/// no sampled value is finite), with the same canonical zero. A compressed reduction bounds its
/// first quantisations with it, before any pass over the whole input has run; the GPU twin
/// (`GpuCodec::sampled_range_device`) reads the same positions.
pub fn sampled_range<T: Element>(data: &[T]) -> Option<(f64, f64)> {
    let n = data.len();
    if n <= RANGE_SAMPLES {
        return finite_range(data);
    }
    let stride = n / RANGE_SAMPLES;
    let (lo, hi) = (0..RANGE_SAMPLES)
        .map(|k| k * stride)
        .chain(std::iter::once(n - 1))
        .map(|i| data[i])
        .filter(|x| x.finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), x| {
            (l.min(x.to_f64()), h.max(x.to_f64()))
        });
    (lo <= hi).then_some((lo + 0.0, hi + 0.0))
}

/// The first finite non-zero value of `data` (the step of a degenerate `abs`/`noa` bound, see
/// [`QuantParams::derive_from_stats`]), or `None` when there is none.
pub fn first_nonzero<T: Element>(data: &[T]) -> Option<f64> {
    data.iter()
        .find(|x| x.finite() && x.to_f64() != 0.0)
        .map(|x| x.to_f64())
}

/// `fill` converted to `T` (round to nearest, as `as` does), checked: the value whose bit
/// pattern marks a fill point in `T` data. Errors ([`Error::InvalidArgument`]) when the value is
/// not finite in `T` (non-finite values are always kept exactly: a fill value is not needed for
/// them).
pub fn fill_in_dtype<T: Element>(fill: f64) -> Result<T> {
    let f = T::from_f64(fill);
    if !f.finite() {
        return Err(Error::invalid(format!(
            "fill value {fill:e} is not a finite {} value (NaN and infinities are always kept \
             exactly)",
            T::DTYPE
        )));
    }
    Ok(f)
}

/// [`finite_range`] of the values that are not bitwise equal to `fill` (the `noa` range of data
/// with a fill value).
pub fn finite_range_except<T: Element>(data: &[T], fill: Option<T>) -> Option<(f64, f64)> {
    use rayon::prelude::*;
    let Some(fill) = fill else {
        return finite_range(data);
    };
    let fb = fill.to_bits_u64();
    let (lo, hi) = data
        .par_chunks(1 << 16)
        .map(|c| {
            c.iter()
                .filter(|x| x.finite() && x.to_bits_u64() != fb)
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), x| {
                    (l.min(x.to_f64()), h.max(x.to_f64()))
                })
        })
        .reduce(
            || (f64::INFINITY, f64::NEG_INFINITY),
            |a, b| (a.0.min(b.0), a.1.max(b.1)),
        );
    (lo <= hi).then_some((lo + 0.0, hi + 0.0))
}

/// [`first_nonzero`] of the values that are not bitwise equal to `fill`.
pub fn first_nonzero_except<T: Element>(data: &[T], fill: Option<T>) -> Option<f64> {
    let fb = fill.map(|f| f.to_bits_u64());
    data.iter()
        .find(|x| x.finite() && x.to_f64() != 0.0 && Some(x.to_bits_u64()) != fb)
        .map(|x| x.to_f64())
}

/// A likely fill value of `data` (a "missing data" marker such as `-1e10` on land in ocean
/// fields): one of the two ends of the finite range that
///
/// * occurs at least `max(2, n / 1000)` times (bitwise equal), and
/// * accounts for at least 99% of the `noa` value range: the other values span at most 1% of the
///   full range.
///
/// Such a value makes a `noa` bound 100 times looser than the real values' range suggests; pass
/// it as the fill value (`CompressOptions::with_fill_value`) to exclude it. Returns `None` when
/// no end qualifies, or the one that leaves the narrower rest when both do.
///
/// ```
/// let mut data: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.01).sin()).collect();
/// assert_eq!(zcomm::quant::likely_fill_value(&data), None);
/// for x in data.iter_mut().step_by(3) {
///     *x = -1e10;
/// }
/// assert_eq!(zcomm::quant::likely_fill_value(&data), Some(-1e10));
/// ```
pub fn likely_fill_value<T: Element>(data: &[T]) -> Option<f64> {
    let (lo, hi) = finite_range(data)?;
    // widths of halved ends: no overflow for any finite range
    let half_width = |(a, b): (f64, f64)| b * 0.5 - a * 0.5;
    let full = half_width((lo, hi));
    if full <= 0.0 {
        return None;
    }
    let min_count = (data.len() / 1000).max(2);
    [lo, hi]
        .into_iter()
        .filter_map(|c| {
            let cb = T::from_f64(c).to_bits_u64();
            let count = data.iter().filter(|x| x.to_bits_u64() == cb).count();
            if count < min_count {
                return None;
            }
            let rest = finite_range_except(data, Some(T::from_f64(c)))?;
            let w = half_width(rest);
            (w <= full * 0.01).then_some((c, w))
        })
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(c, _)| c)
}

/// Checks a caller-given value range for `bound` (valid, `noa` only, finite, `min <= max`) and
/// returns it with `finite_range`'s canonical zero (`+ 0.0` turns `-0.0` into `+0.0`).
fn given_range(bound: ErrorBound, (lo, hi): (f64, f64)) -> Result<(f64, f64)> {
    bound.validate()?;
    if !matches!(bound, ErrorBound::Noa(_)) {
        return Err(Error::invalid(format!(
            "a given value range applies to noa bounds only, not {bound} (abs and rel bounds do \
             not depend on the value range)"
        )));
    }
    if !(lo.is_finite() && hi.is_finite()) {
        return Err(Error::invalid(format!(
            "given value range must be finite, got ({lo}, {hi})"
        )));
    }
    if lo > hi {
        return Err(Error::invalid(format!(
            "given value range has min > max: ({lo}, {hi})"
        )));
    }
    Ok((lo + 0.0, hi + 0.0))
}

/// Parameters shared by encoder and decoder, as stored in the header.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QuantParams {
    /// Mode.
    pub mode: BoundMode,
    /// The user's bound value.
    pub bound_value: f64,
    /// Guaranteed absolute bound (abs/noa), or `E` (rel).
    pub abs_bound: f64,
    /// Step (dtype-rounded for abs/noa; f64 log2 step for rel).
    pub step: f64,
    /// Value range (noa) or zeros.
    pub range: (f64, f64),
    /// The fill value (a finite value of the dtype, widened to f64): values bitwise equal to it
    /// are left out of the range and kept exactly (the quantizer refuses them).
    pub fill: Option<f64>,
}

impl QuantParams {
    /// Derive the parameters for `data` under `bound` (scans the data for noa and the
    /// constant-array case).
    pub fn derive<T: Element>(data: &[T], bound: ErrorBound) -> Result<Self> {
        Self::derive_from_stats::<T>(bound, || finite_range(data), || first_nonzero(data))
    }

    /// [`QuantParams::derive`] for data with a fill value `fill` (see [`fill_in_dtype`]): the
    /// range and the degenerate step ignore the values bitwise equal to it, and the quantizer
    /// refuses them, so the codecs keep them exactly. `range` replaces the measured range as in
    /// `QuantParams::derive_with_range` (noa only).
    pub fn derive_with_fill<T: Element>(
        data: &[T],
        bound: ErrorBound,
        fill: Option<f64>,
        range: Option<(f64, f64)>,
    ) -> Result<Self> {
        bound.validate()?;
        let fill = fill.map(fill_in_dtype::<T>).transpose()?;
        let nz = || first_nonzero_except(data, fill);
        let mut p = match range {
            Some(r) => Self::derive_with_range::<T>(bound, r, nz)?,
            None => Self::derive_from_stats::<T>(bound, || finite_range_except(data, fill), nz)?,
        };
        p.fill = fill.map(T::to_f64);
        Ok(p)
    }

    /// [`QuantParams::derive_from_stats`] for a `noa` bound with a value range given by the
    /// caller instead of measured (`zcomm::compress_with_range` and its GPU twin). Checks that
    /// `bound` is `noa` and that `range` is finite with `min <= max`, and records the range with
    /// the canonical zero of [`finite_range`] (`-0.0` becomes `+0.0`), so a range equal to the
    /// data's own gives the same parameters as [`QuantParams::derive`].
    pub(crate) fn derive_with_range<T: Element>(
        bound: ErrorBound,
        range: (f64, f64),
        first_nonzero: impl FnOnce() -> Option<f64>,
    ) -> Result<Self> {
        let range = given_range(bound, range)?;
        Self::derive_from_stats::<T>(bound, || Some(range), first_nonzero)
    }

    /// [`QuantParams::derive`] from statistics computed elsewhere (e.g. on a GPU): `range` gives
    /// the finite value range (called for noa only), `first_nonzero` the first finite non-zero
    /// value (called only for a degenerate step). Same arithmetic, so the same bits.
    pub fn derive_from_stats<T: Element>(
        bound: ErrorBound,
        range: impl FnOnce() -> Option<(f64, f64)>,
        first_nonzero: impl FnOnce() -> Option<f64>,
    ) -> Result<Self> {
        bound.validate()?;
        let e = bound.value();
        match bound {
            ErrorBound::Rel(_) => {
                let step = pred(2.0 * zlog2(1.0 + e));
                Ok(QuantParams {
                    mode: BoundMode::Rel,
                    bound_value: e,
                    abs_bound: e,
                    step,
                    range: (0.0, 0.0),
                    fill: None,
                })
            }
            ErrorBound::Abs(_) | ErrorBound::Noa(_) => {
                let (abs_bound, range) = if let ErrorBound::Noa(_) = bound {
                    let r = range().unwrap_or((0.0, 0.0));
                    (noa_abs_bound(e, r), r)
                } else {
                    (e, (0.0, 0.0))
                };
                // the largest dtype value <= 2 eb; `2 eb` may exceed f64::MAX (eb > MAX / 2),
                // and then that value is the dtype's MAX, not the 0 an infinity would give
                let mut step = T::round_down_from_f64((2.0 * abs_bound).min(f64::MAX)).to_f64();
                if !(step.is_normal() && T::from_f64(1.0 / step).finite()) {
                    // Degenerate bound (constant array under noa, or an underflowing bound):
                    // keep the data exactly, with a step that represents the first value.
                    step = first_nonzero().map(f64::abs).unwrap_or(1.0);
                    if !T::from_f64(1.0 / step).finite() {
                        step = 1.0;
                    }
                }
                Ok(QuantParams {
                    mode: bound.mode(),
                    bound_value: e,
                    abs_bound,
                    step,
                    range,
                    fill: None,
                })
            }
        }
    }

    /// The parameters of an absolute bound `eb`, which need no statistics of the data, or
    /// `None` when its quantisation step is degenerate (then [`QuantParams::derive_from_stats`]
    /// needs the data's first finite non-zero value).
    pub fn derive_abs<T: Element>(eb: f64) -> Result<Option<Self>> {
        let mut degenerate = false;
        let params = Self::derive_from_stats::<T>(
            ErrorBound::Abs(eb),
            || None,
            || {
                degenerate = true;
                None
            },
        )?;
        Ok((!degenerate).then_some(params))
    }

    /// Build the per-value quantizer.
    pub fn quantizer<T: Element>(&self) -> Quantizer<T> {
        let step = T::from_f64(self.step);
        Quantizer {
            rel: self.mode == BoundMode::Rel,
            step,
            inv: T::from_f64(1.0 / step.to_f64()),
            step64: self.step,
            // an infinite or NaN bound (impossible from `derive`) would let an infinite
            // reconstruction pass the check; such a bound accepts nothing instead
            eb: if self.abs_bound <= f64::MAX {
                self.abs_bound
            } else {
                0.0
            },
            fill: self.fill.map(|f| T::from_f64(f).to_bits_u64()),
        }
    }
}

/// Per-value encoder/decoder for one set of [`QuantParams`].
#[derive(Debug, Clone, Copy)]
pub struct Quantizer<T: Element> {
    rel: bool,
    step: T,
    inv: T,
    step64: f64,
    eb: f64,
    /// Bit pattern of the fill value: refused, so kept exactly.
    fill: Option<u64>,
}

/// Half of the rel code offset: codes are `sign * (l + QHALF)`, `QHALF = QMAX / 2` (2^28 for
/// f32, 2^60 for f64). An integer: the offset is added and removed in integer arithmetic, since
/// `l + 2^60` in f64 would round `l` to a multiple of 256.
#[inline]
fn qhalf<T: Element>() -> i64 {
    (T::QMAX / 2.0) as i64
}

impl<T: Element> Quantizer<T> {
    /// The code of `x`, or `None` when `x` must be stored losslessly.
    #[inline(always)]
    pub fn encode(&self, x: T) -> Option<i64> {
        if !x.finite() || Some(x.to_bits_u64()) == self.fill {
            return None;
        }
        let q = if self.rel {
            let v = x.to_f64();
            if v == 0.0 {
                return if x.to_bits_u64() == 0 { Some(0) } else { None };
            }
            let l = (zlog2(v.abs()) / self.step64).round_ties_even();
            // `|l| < QHALF` (false for NaN; QHALF is a power of two, so the comparison is
            // exact): `l` is then an integer that converts to i64 exactly, and the code's
            // magnitude `l + QHALF` is in [1, 2 QHALF)
            let in_range = l.abs() < qhalf::<T>() as f64;
            if !in_range {
                return None;
            }
            let m = l as i64 + qhalf::<T>();
            if v < 0.0 {
                -m
            } else {
                m
            }
        } else {
            let p = x.mul(self.inv);
            let in_range = p.abs_val().to_f64() < T::QMAX; // false for NaN
            if !in_range {
                return None;
            }
            p.rint().to_code()
        };
        let r = self.decode(q);
        self.within(x, r).then_some(q)
    }

    /// Encode one thread layer: writes every value's code (0 where it is not representable) and
    /// returns whether all values are representable. Same results as [`Quantizer::encode`] per
    /// value; written branch-free for the abs/noa case so the compiler vectorizes it.
    #[inline(always)]
    pub fn encode_layer(&self, xs: &[T], codes: &mut [i64]) -> bool {
        if let Some(fb) = self.fill {
            // (rare) fill values: a separate pass keeps the common loop below branch-free
            if xs.iter().any(|x| x.to_bits_u64() == fb) {
                for (c, &x) in codes.iter_mut().zip(xs) {
                    *c = self.encode(x).unwrap_or(0);
                }
                return false;
            }
        }
        let mut ok = true;
        if self.rel {
            for (c, &x) in codes.iter_mut().zip(xs) {
                let e = self.encode(x);
                ok &= e.is_some();
                *c = e.unwrap_or(0);
            }
            return ok;
        }
        #[inline(always)]
        fn one<T: Element>(s: &Quantizer<T>, x: T, c: &mut i64) -> bool {
            let p = x.mul(s.inv);
            let in_range = p.abs_val().to_f64() < T::QMAX;
            let q = if in_range { p.rint().to_code() } else { 0 };
            let r = T::from_code(q).mul(s.step);
            *c = q;
            in_range & s.within(x, r)
        }
        if xs.len() == 32 && codes.len() == 32 {
            let xs: &[T; 32] = xs.try_into().expect("32 values");
            let codes: &mut [i64; 32] = codes.try_into().expect("32 codes");
            // fixed trip count: fully vectorized
            let mut oks = [true; 32];
            for k in 0..32 {
                oks[k] = one(self, xs[k], &mut codes[k]);
            }
            return oks.iter().all(|&o| o);
        }
        for (c, &x) in codes.iter_mut().zip(xs) {
            ok &= one(self, x, c);
        }
        ok
    }

    /// The reconstruction of code `q`.
    #[inline(always)]
    pub fn decode(&self, q: i64) -> T {
        if self.rel {
            if q == 0 {
                return T::from_f64(0.0);
            }
            // `|q| - QHALF` in integers (wrapping only on corrupt codes), then one rounding
            // conversion (exact for every code the encoder writes: it is `l`)
            let l = (q.unsigned_abs() as i64).wrapping_sub(qhalf::<T>());
            let m = l as f64 * self.step64;
            let mag = zexp2(m);
            T::from_f64(if q < 0 { -mag } else { mag })
        } else {
            T::from_code(q).mul(self.step)
        }
    }

    /// Exact check that `r` reconstructs `x` within the bound.
    #[inline(always)]
    fn within(&self, x: T, r: T) -> bool {
        let xv = x.to_f64();
        let rv = r.to_f64();
        // an infinite or NaN reconstruction makes `d` Inf/NaN and fails the comparison
        let d = (xv - rv).abs();
        let limit = if self.rel {
            pred(self.eb * xv.abs())
        } else {
            self.eb
        };
        if T::SIZE == 4 {
            // the difference of two f32 values is exact in f64
            return d <= limit;
        }
        // f64: accept only when the subtraction was exact (Sterbenz) or trivially so
        let (a, b) = (xv.abs(), rv.abs());
        let exact = rv == 0.0 || ((xv < 0.0) == (rv < 0.0) && b * 0.5 <= a && a <= b * 2.0);
        exact && d <= limit
    }
}

/// `log2(x)` for finite `x > 0` from IEEE `+ - * /` only (bit-identical on CPU and GPU).
pub fn zlog2(x: f64) -> f64 {
    // split x = m * 2^e with m in [sqrt(1/2), sqrt(2))
    let mut bits = x.to_bits();
    let mut e: i64 = ((bits >> 52) & 0x7ff) as i64;
    if e == 0 {
        // subnormal: scale up by 2^64 (exact)
        let y = x * 18_446_744_073_709_551_616.0;
        bits = y.to_bits();
        e = ((bits >> 52) & 0x7ff) as i64 - 64;
    }
    e -= 1023;
    let mut m = f64::from_bits((bits & 0x000f_ffff_ffff_ffff) | 0x3ff0_0000_0000_0000);
    if m > std::f64::consts::SQRT_2 {
        m *= 0.5;
        e += 1;
    }
    // ln(m) = 2 atanh(s), s = (m-1)/(m+1), |s| <= 0.1716
    let s = (m - 1.0) / (m + 1.0);
    let s2 = s * s;
    let mut acc = 1.0 / 25.0;
    let mut k = 23.0;
    while k >= 1.0 {
        acc = acc * s2 + 1.0 / k;
        k -= 2.0;
    }
    let ln_m = 2.0 * s * acc;
    ln_m * std::f64::consts::LOG2_E + e as f64
}

/// `2^y` from IEEE `+ - * /` only (bit-identical on CPU and GPU); saturates to 0 / +Inf.
pub fn zexp2(y: f64) -> f64 {
    if y.is_nan() {
        return f64::NAN;
    }
    if y > 1100.0 {
        return f64::INFINITY;
    }
    if y < -1100.0 {
        return 0.0;
    }
    let k = y.round_ties_even();
    let f = (y - k) * std::f64::consts::LN_2; // |f| <= 0.3466
                                              // e^f, Taylor degree 14 in Horner form
    let mut p = 1.0;
    let mut i = 14.0;
    while i >= 1.0 {
        p = p * f / i + 1.0;
        i -= 1.0;
    }
    // scale by 2^k in two exact steps (k may be outside the normal exponent range)
    let k = k as i64;
    let k1 = k / 2;
    let k2 = k - k1;
    p * pow2i(k1) * pow2i(k2)
}

#[inline]
fn pow2i(k: i64) -> f64 {
    // k in [-550, 550]: 2^k is a normal f64 for |k| <= 1022
    f64::from_bits(((k + 1023) as u64) << 52)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zlog2_zexp2_are_accurate() {
        for &x in &[1e-300, 1e-10, 0.3, 1.0, 1.5, 2.0, 3.0, 1e10, 1e300, 5e-324] {
            let l = zlog2(x);
            assert!(
                (l - x.log2()).abs() < 1e-12 * x.log2().abs().max(1.0),
                "log2 {x}"
            );
            let back = zexp2(l);
            assert!(
                ((back - x) / x).abs() < 1e-12 || x < 1e-307,
                "exp2 {x} {back}"
            );
        }
    }

    #[test]
    fn sampled_range_reads_its_positions_and_lies_inside_the_range() {
        // small inputs: the exact range
        let small = [3.0f32, -0.0, f32::NAN, 7.5];
        assert_eq!(sampled_range(&small), finite_range(&small));
        let n = RANGE_SAMPLES * 3 + 5;
        let stride = n / RANGE_SAMPLES;
        let mut x: Vec<f32> = (0..n).map(|i| (i % 1000) as f32 * 0.5).collect();
        // a value off the sample changes the exact range only; the last value is sampled
        x[1] = -100.0;
        x[n - 1] = 900.0;
        x[stride] = f32::NAN;
        let (lo, hi) = sampled_range(&x).unwrap();
        let (elo, ehi) = finite_range(&x).unwrap();
        assert!(elo <= lo && hi <= ehi);
        assert_eq!(elo, -100.0);
        assert_eq!(hi, 900.0);
        let want = (0..RANGE_SAMPLES)
            .map(|k| k * stride)
            .filter(|&i| i != stride)
            .map(|i| x[i] as f64)
            .fold(f64::INFINITY, f64::min);
        assert_eq!(lo, want);
        // no finite sampled value
        let nan = vec![f64::NAN; n];
        assert_eq!(sampled_range(&nan), None);
    }

    #[test]
    fn bound_parsing() {
        assert_eq!(
            "abs:1e-3".parse::<ErrorBound>().unwrap(),
            ErrorBound::Abs(1e-3)
        );
        assert!("abs:0".parse::<ErrorBound>().is_err());
        assert!("abs:-1".parse::<ErrorBound>().is_err());
        assert!("abs:nan".parse::<ErrorBound>().is_err());
        assert!("foo:1".parse::<ErrorBound>().is_err());
        assert!("rel:1.5".parse::<ErrorBound>().is_err());
        assert!("1e-3".parse::<ErrorBound>().is_err());
    }

    #[test]
    fn quantizer_guarantees_bound_or_refuses() {
        let data: Vec<f32> = (0..10000).map(|i| (i as f32 * 0.37).sin() * 1e3).collect();
        for b in [
            ErrorBound::Abs(1e-2),
            ErrorBound::Noa(1e-5),
            ErrorBound::Rel(1e-3),
        ] {
            let p = QuantParams::derive(&data, b).unwrap();
            let q = p.quantizer::<f32>();
            let mut ok = 0;
            for &x in &data {
                if let Some(c) = q.encode(x) {
                    ok += 1;
                    let r = q.decode(c) as f64;
                    let lim = match b {
                        ErrorBound::Rel(e) => e * (x as f64).abs(),
                        _ => p.abs_bound,
                    };
                    assert!((r - x as f64).abs() <= lim);
                }
            }
            assert!(ok > 9900, "{b}: only {ok} representable");
        }
    }

    #[test]
    fn constant_noa_keeps_data_exactly() {
        for c in [0.0f32, 3.7, -1e30] {
            let data = vec![c; 100];
            let p = QuantParams::derive(&data, ErrorBound::Noa(1e-3)).unwrap();
            let q = p.quantizer::<f32>();
            let code = q.encode(c).expect("constant is representable");
            assert_eq!(q.decode(code), c);
        }
    }
}
