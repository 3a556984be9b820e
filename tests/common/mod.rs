//! Helpers shared by the integration tests: a seeded generator, data generators, an exact
//! error-bound checker, and stream re-sealing for mutation tests.
#![allow(dead_code, unused_imports)]

pub mod fuzz_body;

use zcomm::format::BoundMode;
use zcomm::{compress_bound, decompress, inspect, CodecKind, Element, ErrorBound};

/// SplitMix64: small, seeded, good enough for test data.
#[derive(Clone)]
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Uniform in [lo, hi).
    pub fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }
    /// Uniform integer in [0, n).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
    /// Roughly normal (sum of uniforms).
    pub fn normal(&mut self) -> f64 {
        (0..4).map(|_| self.unit()).sum::<f64>() * 1.732 - 3.464
    }
}

/// Special values of a dtype: NaNs with payloads, infinities, denormals, extremes, zeros.
pub fn specials<T: Element>() -> Vec<T> {
    if T::SIZE == 4 {
        [
            0x7fc0_0000u64, // quiet NaN
            0x7fc0_0001,    // quiet NaN with payload
            0xffc1_2345,    // negative NaN with payload
            0x7f80_0001,    // signalling NaN
            0x7f80_0000,    // +inf
            0xff80_0000,    // -inf
            0x0000_0001,    // smallest denormal
            0x8000_0001,    // negative smallest denormal
            0x007f_ffff,    // largest denormal
            0x0080_0000,    // smallest normal
            0x7f7f_ffff,    // f32::MAX
            0xff7f_ffff,    // -f32::MAX
            0x8000_0000,    // -0
            0x0000_0000,    // +0
        ]
        .iter()
        .map(|&b| T::from_bits_u64(b))
        .chain([3e38, -3e38, 1e-40, -1e-44].iter().map(|&v| T::from_f64(v)))
        .collect()
    } else {
        [
            0x7ff8_0000_0000_0000u64,
            0x7ff8_0000_0000_0001,
            0xfff8_dead_beef_0001,
            0x7ff0_0000_0000_0001,
            0x7ff0_0000_0000_0000,
            0xfff0_0000_0000_0000,
            0x0000_0000_0000_0001,
            0x8000_0000_0000_0001,
            0x000f_ffff_ffff_ffff,
            0x0010_0000_0000_0000,
            0x7fef_ffff_ffff_ffff,
            0xffef_ffff_ffff_ffff,
            0x8000_0000_0000_0000,
            0,
        ]
        .iter()
        .map(|&b| T::from_bits_u64(b))
        .chain(
            [1e308, -1e308, 3e38, -3e38, 1e-310, -1e-320]
                .iter()
                .map(|&v| T::from_f64(v)),
        )
        .collect()
    }
}

/// Number of data kinds [`gen`] knows.
pub const KINDS: u64 = 10;

/// Deterministic test data of kind `kind` (0..KINDS), `n` values, from `seed`.
pub fn gen<T: Element>(kind: u64, n: usize, seed: u64) -> Vec<T> {
    let mut r = Rng(seed ^ kind.wrapping_mul(0x1234_5678_9abc_def1));
    let amp = 10f64.powf(r.range(-6.0, 6.0));
    let off = r.range(-2.0, 2.0) * amp;
    let f1 = r.range(1e-4, 0.05);
    let f2 = r.range(1e-3, 0.3);
    let p = r.range(0.0, std::f64::consts::TAU);
    let sp = specials::<T>();
    let big = if T::SIZE == 4 { 38.0 } else { 307.0 };
    (0..n)
        .map(|i| {
            let t = i as f64;
            let smooth = off + amp * ((f1 * t + p).sin() + 0.3 * (f2 * t).cos());
            match kind {
                0 => T::from_f64(smooth),
                1 => T::from_f64(smooth + amp * 1e-3 * r.normal()),
                2 => T::from_f64(r.range(-amp, amp)),
                3 => T::from_bits_u64(r.next_u64()),
                4 => {
                    if r.below(20) == 0 {
                        T::from_f64(amp * r.normal())
                    } else {
                        T::from_f64(0.0)
                    }
                }
                5 => T::from_f64(off),
                6 => {
                    let e = r.range(-big, big);
                    let s = if r.below(2) == 0 { -1.0 } else { 1.0 };
                    T::from_f64(s * 10f64.powf(e))
                }
                7 => {
                    if r.below(50) == 0 {
                        sp[r.below(sp.len() as u64) as usize]
                    } else {
                        T::from_f64(smooth)
                    }
                }
                8 => T::from_f64(((t * f1 * 10.0).floor() * amp).round()),
                _ => {
                    // piecewise: runs of zeros, smooth stretches and noise
                    match (i / 5000) % 3 {
                        0 => T::from_f64(0.0),
                        1 => T::from_f64(smooth),
                        _ => T::from_f64(amp * r.normal()),
                    }
                }
            }
        })
        .collect()
}

/// A 3-D smooth field (sum of a few low-frequency waves with decaying amplitudes), `n^3` values.
pub fn smooth_field<T: Element>(n: usize, seed: u64) -> Vec<T> {
    smooth_field_dims([n, n, n], seed)
}

/// A smooth field of `nx * ny * nz` values, x fastest.
pub fn smooth_field_dims<T: Element>(dims: [usize; 3], seed: u64) -> Vec<T> {
    let [nx, ny, nz] = dims;
    let mut r = Rng(seed);
    let waves: Vec<[f64; 5]> = (0..12)
        .map(|k| {
            let s = 1.0 + k as f64 * 0.5;
            [
                r.range(-s, s),
                r.range(-s, s),
                r.range(-s, s),
                r.range(0.0, std::f64::consts::TAU),
                1.0 / (s * s),
            ]
        })
        .collect();
    let tau = std::f64::consts::TAU;
    let mut out = Vec::with_capacity(nx * ny * nz);
    for z in 0..nz {
        for y in 0..ny {
            for x in 0..nx {
                let (fx, fy, fz) = (
                    x as f64 / nx as f64,
                    y as f64 / ny as f64,
                    z as f64 / nz as f64,
                );
                let v: f64 = waves
                    .iter()
                    .map(|w| w[4] * (tau * (w[0] * fx + w[1] * fy + w[2] * fz) + w[3]).sin())
                    .sum();
                out.push(T::from_f64(280.0 + 20.0 * v));
            }
        }
    }
    out
}

fn two_sum(a: f64, b: f64) -> (f64, f64) {
    let s = a + b;
    let bb = s - a;
    (s, (a - (s - bb)) + (b - bb))
}

fn split(a: f64) -> (f64, f64) {
    let c = 134_217_729.0 * a;
    let hi = c - (c - a);
    (hi, a - hi)
}

/// `a * b` exactly as `hi + lo` (Dekker; no FMA; needs no overflow/underflow).
fn two_prod(a: f64, b: f64) -> (f64, f64) {
    let p = a * b;
    let (ah, al) = split(a);
    let (bh, bl) = split(b);
    (p, ((ah * bh - p) + ah * bl + al * bh) + al * bl)
}

/// Exactly: `|x - y| <= lim.0 + lim.1` (a normalized double-double).
pub fn abs_diff_le(x: f64, y: f64, lim: (f64, f64)) -> bool {
    let (mut s, mut e) = two_sum(x, -y);
    if !s.is_finite() || !e.is_finite() {
        return false;
    }
    if s < 0.0 {
        s = -s;
        e = -e;
    }
    if s != lim.0 {
        return s < lim.0;
    }
    e <= lim.1
}

/// Exactly: `|x - y| <= e * |x|` (finite `x`, `0 < e < 1`).
pub fn rel_within(x: f64, y: f64, e: f64) -> bool {
    if !y.is_finite() {
        return false;
    }
    // the condition is scale invariant: move tiny/huge values to where Dekker's product is exact
    let scale = if x.abs() < 2f64.powi(-900) {
        2f64.powi(600)
    } else if x.abs() > 2f64.powi(900) {
        2f64.powi(-600)
    } else {
        1.0
    };
    let (x, y) = (x * scale, y * scale);
    abs_diff_le(x, y, two_prod(e, x.abs()))
}

/// Smallest and largest finite values.
pub fn finite_range<T: Element>(data: &[T]) -> Option<(f64, f64)> {
    let mut it = data.iter().filter(|x| x.finite()).map(|x| x.to_f64());
    let first = it.next()?;
    Some(it.fold((first, first), |(lo, hi), v| (lo.min(v), hi.max(v))))
}

/// Check that `back` reconstructs `data` under `bound` as stored in the stream header `h`:
/// every finite value within the bound (exactly), every non-finite value bit-exact.
/// Returns the first violating index.
pub fn check_bound<T: Element>(
    data: &[T],
    back: &[T],
    bound: ErrorBound,
    abs_bound: f64,
) -> Result<(), String> {
    if data.len() != back.len() {
        return Err(format!("length {} != {}", back.len(), data.len()));
    }
    for (i, (&x, &y)) in data.iter().zip(back).enumerate() {
        let ok = if !x.finite() {
            x.to_bits_u64() == y.to_bits_u64()
        } else {
            let (xv, yv) = (x.to_f64(), y.to_f64());
            match bound {
                ErrorBound::Abs(_) | ErrorBound::Noa(_) => abs_diff_le(xv, yv, (abs_bound, 0.0)),
                ErrorBound::Rel(e) => rel_within(xv, yv, e),
            }
        };
        if !ok {
            return Err(format!(
                "value {i}: {x:?} (bits {:#x}) decoded as {y:?} (bits {:#x}), bound {bound}, abs bound {abs_bound:e}",
                x.to_bits_u64(),
                y.to_bits_u64()
            ));
        }
    }
    Ok(())
}

/// Compress, decompress and verify everything the format promises. Returns the stream.
pub fn round_trip<T: Element>(
    data: &[T],
    bound: ErrorBound,
    codec: CodecKind,
) -> Result<Vec<u8>, String> {
    let ctx = |m: String| format!("{codec} {} {bound} n={}: {m}", T::DTYPE, data.len());
    let stream = zcomm::compress(data, bound, codec).map_err(|e| ctx(format!("compress: {e}")))?;
    if stream.len() > compress_bound(data.len(), T::DTYPE) {
        return Err(ctx(format!(
            "stream of {} bytes exceeds compress_bound",
            stream.len()
        )));
    }
    let h = inspect(&stream).map_err(|e| ctx(format!("inspect: {e}")))?;
    if h.count != data.len() as u64 || h.dtype != T::DTYPE || h.mode != bound.mode() {
        return Err(ctx(format!("header disagrees: {h:?}")));
    }
    if h.bound_value != bound.value() {
        return Err(ctx(format!(
            "header bound value {} != {}",
            h.bound_value,
            bound.value()
        )));
    }
    if !h.is_stored() && h.codec != codec.tag() {
        return Err(ctx(format!(
            "header codec tag {} != {}",
            h.codec,
            codec.tag()
        )));
    }
    match bound {
        ErrorBound::Abs(e) => {
            if h.abs_bound != e {
                return Err(ctx(format!(
                    "abs stream with abs_bound {} != E",
                    h.abs_bound
                )));
            }
        }
        ErrorBound::Noa(e) => {
            if let Some((lo, hi)) = finite_range(data) {
                if (h.range_min, h.range_max) != (lo, hi) {
                    return Err(ctx(format!(
                        "header range [{}, {}] != data range [{lo}, {hi}]",
                        h.range_min, h.range_max
                    )));
                }
                let w = hi - lo;
                if !(h.abs_bound >= 0.0 && (!w.is_finite() || h.abs_bound <= e * w)) {
                    return Err(ctx(format!("abs_bound {:e} > E*(max-min)", h.abs_bound)));
                }
            }
        }
        ErrorBound::Rel(_) => {}
    }
    debug_assert!(h.mode != BoundMode::Rel || h.abs_bound == bound.value());
    let back: Vec<T> = decompress(&stream).map_err(|e| ctx(format!("decompress: {e}")))?;
    check_bound(data, &back, bound, h.abs_bound).map_err(ctx)?;
    let mut into = vec![T::default(); data.len()];
    zcomm::decompress_into(&stream, &mut into).map_err(|e| ctx(format!("decompress_into: {e}")))?;
    if !into
        .iter()
        .zip(&back)
        .all(|(a, b)| a.to_bits_u64() == b.to_bits_u64())
    {
        return Err(ctx("decompress_into differs from decompress".into()));
    }
    Ok(stream)
}

pub use fuzz_body::reseal;

/// Exactly (up to a double-double's ~2^-100 relative remainder): `eb <= e * (hi - lo)`, also
/// when `hi - lo` overflows (both sides are scaled by 1/4, exact for ends that large).
pub fn noa_bound_le_exact(eb: f64, e: f64, (lo, hi): (f64, f64)) -> bool {
    let scale = if (hi - lo).is_finite() { 1.0 } else { 0.25 };
    let (w, wl) = two_sum(hi * scale, -lo * scale);
    let (p, pl) = two_prod(e, w);
    let rest = pl + e * wl;
    let a = eb * scale;
    a < p || (a == p && rest >= 0.0)
}
