//! How an end-to-end bound of a reduction is split over its quantizations (see the
//! [module docs](super)), and the ring's partition of a buffer into segments.

use super::*;

/// Split `n` elements into `p` contiguous segments (the first `n % p` get one more).
pub fn partition(n: usize, p: usize) -> Vec<Range<usize>> {
    let (q, rem) = (n / p, n % p);
    let mut out = Vec::with_capacity(p);
    let mut lo = 0;
    for k in 0..p {
        let len = q + usize::from(k < rem);
        out.push(lo..lo + len);
        lo += len;
    }
    out
}

/// The absolute bound on a reduction's result for the configured `bound`: `abs:E` → `E`,
/// `noa:E` → `E` × the global value range `[lo, hi]` (0 without finite values), `rel` → NaN
/// (not supported for reductions).
pub(crate) fn reduction_result_bound(bound: ErrorBound, lo: f64, hi: f64) -> f64 {
    match bound {
        ErrorBound::Abs(e) => e,
        ErrorBound::Noa(e) if hi >= lo => e * (hi - lo),
        ErrorBound::Noa(_) => 0.0,
        ErrorBound::Rel(_) => f64::NAN,
    }
}

/// The per-quantization absolute bound of a compressed reduction (the rule of the MPI path, see
/// the [module docs](super)): `e` is the absolute bound on the result, `max_abs` the largest
/// finite `|x|` over all inputs, `p` the ranks, `unit_roundoff` of the dtype, `divisor` 1 (sum)
/// or `p` (mean), `quantizations` `p` (allreduce) or `p-1` (reduce-scatter). Partial sums are
/// quantized with `eb·divisor`, the final value with `eb`. `None` when no positive bound is left.
pub fn reduction_step_bound(
    e: f64,
    max_abs: f64,
    p: usize,
    unit_roundoff: f64,
    divisor: f64,
    quantizations: usize,
) -> Option<f64> {
    let r = reduction_rounding(e, max_abs, p, unit_roundoff, divisor)?;
    let eb = (e - r) / quantizations.max(1) as f64;
    (eb.is_finite() && eb > 0.0).then_some(eb)
}

/// The part of a reduction's result bound `e` that the float rounding of its `p - 1` additions
/// can take (see [`reduction_step_bound`]): every partial sum is at most `p · max_abs` plus the
/// quantisation errors it carries (at most `e · divisor`), and each addition rounds once.
/// `None` when `max_abs` is not finite.
pub(crate) fn reduction_rounding(
    e: f64,
    max_abs: f64,
    p: usize,
    unit_roundoff: f64,
    divisor: f64,
) -> Option<f64> {
    let pf = p as f64;
    if !max_abs.is_finite() {
        return None;
    }
    let b = pf * max_abs + e * divisor;
    Some(pf * unit_roundoff * b / divisor)
}

pub(super) fn max_abs_diff<S: Real>(a: &[S], b: &[S]) -> f64 {
    use rayon::prelude::*;
    a.par_iter()
        .zip(b.par_iter())
        .map(|(x, y)| {
            let (x, y) = (x.to_f64(), y.to_f64());
            if x.is_finite() || y.is_finite() {
                (x - y).abs()
            } else {
                0.0
            }
        })
        .reduce(|| 0.0, f64::max)
}
