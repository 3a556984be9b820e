//! Stage 1: spatial quantisation and segmentation.
//!
//! Every coordinate axis `c` gets its own [`QuantParams`], derived exactly as the other codecs
//! derive theirs from a flat array: `abs:E` bounds every axis by `E`; `noa:E` bounds axis `c` by
//! `E * (max_c - min_c)` over that axis's finite values ([`crate::quant::noa_abs_bound`], so no
//! overflow). A coordinate's code is `q = rint(x / step)`, accepted only when the decoder's
//! reconstruction `q * step` is within the bound ([`Quantizer::encode`]); a particle with any
//! coordinate refused (a miss, NaN, ±Inf) is an *exception* and kept verbatim.
//!
//! Within a block, axis `c` of particle `j` becomes the unsigned offset
//! `u = q - min_block(q)` of `w_c` bits. At *level* `L` the top `k_c = min(L, w_c)` bits of
//! `u` are the axis's segment coordinate and the low `s_c = w_c - k_c` bits its in-segment
//! offset: the segments are the cells of a `2^L`-per-axis grid over the block's bounding box
//! (rounded to powers of two of the step), so their size follows the block's extent. The
//! segment id concatenates the axes' segment coordinates, axis 0 most significant
//! (`K = sum k_c <= 32` bits: `L <= min(10, 32 / d)`).

use rayon::prelude::*;

use crate::element::Element;
use crate::error::{Error, Result};
use crate::quant::{ErrorBound, QuantParams, Quantizer};

/// Largest segmentation level for `d` axes (segment ids fit 32 bits).
pub(crate) fn max_level(d: usize) -> u32 {
    (32 / d as u32).min(10)
}

/// The quantization parameters of every axis of the `d`-dimensional AoS particles `coords`.
///
/// Errors ([`Error::InvalidArgument`]): an invalid bound, or a `rel` bound (particle positions
/// are bounded absolutely; a point-wise relative bound would make the cells depend on the
/// distance from the origin).
pub(crate) fn axis_params<T: Element>(
    coords: &[T],
    d: usize,
    bound: ErrorBound,
) -> Result<Vec<QuantParams>> {
    bound.validate()?;
    if matches!(bound, ErrorBound::Rel(_)) {
        return Err(Error::invalid(format!(
            "gpz supports abs and noa bounds, not {bound}"
        )));
    }
    // per axis: finite min, finite max
    let init = || vec![(f64::INFINITY, f64::NEG_INFINITY); d];
    let ranges = coords
        .par_chunks(d << 16)
        .map(|c| {
            let mut r = init();
            for p in c.chunks_exact(d) {
                for (x, (lo, hi)) in p.iter().zip(r.iter_mut()) {
                    if x.finite() {
                        let v = x.to_f64();
                        *lo = lo.min(v);
                        *hi = hi.max(v);
                    }
                }
            }
            r
        })
        .reduce(init, |a, b| {
            a.iter()
                .zip(&b)
                .map(|(x, y)| (x.0.min(y.0), x.1.max(y.1)))
                .collect()
        });
    (0..d)
        .map(|c| {
            let (lo, hi) = ranges[c];
            // `+ 0.0`: -0.0 is recorded as +0.0, as `quant::finite_range` does
            let range = (lo <= hi).then_some((lo + 0.0, hi + 0.0));
            let first_nonzero = || {
                coords
                    .iter()
                    .skip(c)
                    .step_by(d)
                    .find(|x| x.finite() && x.to_f64() != 0.0)
                    .map(|x| x.to_f64())
            };
            QuantParams::derive_from_stats::<T>(bound, || range, first_nonzero)
        })
        .collect()
}

/// The smallest and largest code of every axis over the particles that are not exceptions
/// (`None` when every particle is one).
pub(crate) fn code_range<T: Element>(
    coords: &[T],
    d: usize,
    qz: &[Quantizer<T>],
) -> Option<Vec<(i64, i64)>> {
    let init = || vec![(i64::MAX, i64::MIN); d];
    let r = coords
        .par_chunks(d << 16)
        .map(|c| {
            let mut r = init();
            let mut q = [0i64; 4];
            for p in c.chunks_exact(d) {
                if quantize_particle(p, qz, &mut q) {
                    for (v, (lo, hi)) in q.iter().zip(r.iter_mut()) {
                        *lo = (*lo).min(*v);
                        *hi = (*hi).max(*v);
                    }
                }
            }
            r
        })
        .reduce(init, |a, b| {
            a.iter()
                .zip(&b)
                .map(|(x, y)| (x.0.min(y.0), x.1.max(y.1)))
                .collect()
        });
    (r[0].0 <= r[0].1).then_some(r)
}

/// The codes of one particle's coordinates into `q`; false when any coordinate is refused.
#[inline]
pub(crate) fn quantize_particle<T: Element>(
    p: &[T],
    qz: &[Quantizer<T>],
    q: &mut [i64; 4],
) -> bool {
    let mut ok = true;
    for (c, (&x, z)) in p.iter().zip(qz).enumerate() {
        match z.encode(x) {
            Some(v) => q[c] = v,
            None => ok = false,
        }
    }
    ok
}

/// One block's particles after quantization.
pub(crate) struct BlockCodes {
    /// Particles in the block.
    pub n: usize,
    /// Bit `j`: particle `j` is an exception.
    pub exc: u32,
    /// Particles that are not exceptions.
    pub m: usize,
    /// Codes of the `m` non-exception particles, in block order.
    pub codes: [[i64; 4]; 32],
}

/// Quantize the `n = xs.len() / d <= 32` particles of one block.
pub(crate) fn quantize_block<T: Element>(xs: &[T], d: usize, qz: &[Quantizer<T>]) -> BlockCodes {
    let mut b = BlockCodes {
        n: xs.len() / d,
        exc: 0,
        m: 0,
        codes: [[0; 4]; 32],
    };
    for (j, p) in xs.chunks_exact(d).enumerate() {
        if quantize_particle(p, qz, &mut b.codes[b.m]) {
            b.m += 1;
        } else {
            b.exc |= 1 << j;
        }
    }
    b
}

/// Segment-coordinate widths `k_c`, offset widths `s_c` and the id width `K` at `level`.
pub(crate) fn split(w: &[u32], level: u32) -> ([u32; 4], [u32; 4], u32) {
    let mut k = [0; 4];
    let mut s = [0; 4];
    for (c, &wc) in w.iter().enumerate() {
        k[c] = wc.min(level);
        s[c] = wc - k[c];
    }
    (k, s, k.iter().sum())
}

/// The segment id of each of the `u.len()` particles at the split `(k, s)`.
pub(crate) fn segment_ids(u: &[[u64; 4]], d: usize, k: &[u32; 4], s: &[u32; 4], ids: &mut [u64]) {
    for (id, p) in ids.iter_mut().zip(u) {
        let mut key = 0u64;
        for c in 0..d {
            key = key << k[c] | p[c] >> s[c];
        }
        *id = key;
    }
}
