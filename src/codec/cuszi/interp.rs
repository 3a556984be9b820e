//! The interpolation predictor: anchors (Lorenzo over the anchor grid, on quantization codes),
//! the level-by-level spline passes inside a tile's box, and the sampling that chooses each
//! level's dimension order and splines.
//!
//! The passes run on reconstructed values (f64, abs/noa bounds) or on quantization codes (`i64`,
//! rel bounds), the two implementations of [`Domain`]. Values: a fixed sequence of IEEE
//! binary64 operations (no fused multiply-add). Codes: wrapping integer arithmetic with
//! divisions by powers of two as arithmetic shifts (and the natural spline's 40 as a Euclidean
//! division), so `code = prediction + residual` inverts `residual = code - prediction` exactly.
//! Either way encoder, decoder and a GPU kernel compute bit-identical predictions.

use crate::error::{Error, Result};

use super::grid::{Grid, D};

/// A 1-D spline along one dimension (FORMAT.md, "cuszi", predictions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Spline {
    /// `(b + c + 1) >> 1`.
    Linear = 0,
    /// Not-a-knot cubic `(-a + 9b + 9c - d + 8) >> 4`.
    Cubic = 1,
    /// Natural cubic `(-3a + 23b + 23c - 3d + 20) div 40`.
    Natural = 2,
}

impl Spline {
    pub(crate) const ALL: [Spline; 3] = [Spline::Linear, Spline::Cubic, Spline::Natural];

    fn from_bits(v: u8) -> Option<Self> {
        Self::ALL.get(v as usize).copied()
    }
}

/// One level's configuration: the order of the passes (a permutation of the dimensions) and
/// each dimension's spline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Level {
    /// Dimensions in pass order (the first pass interpolates along `order[0]`).
    pub order: [usize; D],
    /// Spline per dimension (indexed by dimension, not by pass).
    pub spline: [Spline; D],
    /// Multi-dimensional mode: instead of one pass per dimension, the level's points are
    /// predicted in stages by their number of odd coordinates (multiples of `s`, not of `2s`),
    /// each as the mean of the splines along its odd dimensions (HPEZ's multi-dimensional
    /// interpolation: a point between known neighbours in several directions uses them all).
    pub multi: bool,
}

impl Level {
    /// The two configuration bytes: `order[0] | order[1] << 2 | order[2] << 4 | multi << 6`,
    /// then `spline[0] | spline[1] << 2 | spline[2] << 4`.
    pub fn to_bytes(self) -> [u8; 2] {
        let o = self.order;
        let s = self.spline.map(|x| x as u8);
        [
            (o[0] | o[1] << 2 | o[2] << 4 | (self.multi as usize) << 6) as u8,
            s[0] | s[1] << 2 | s[2] << 4,
        ]
    }

    /// Parse and check two configuration bytes.
    pub fn from_bytes(b: [u8; 2]) -> Result<Self> {
        let bad = || Error::corrupt(format!("invalid predictor configuration {b:02x?}"));
        if b[0] >> 7 != 0 || b[1] >> 6 != 0 {
            return Err(bad());
        }
        let order: [usize; D] = std::array::from_fn(|i| ((b[0] >> (2 * i)) & 3) as usize);
        let mut seen = [false; D];
        for &d in &order {
            if d >= D || seen[d] {
                return Err(bad());
            }
            seen[d] = true;
        }
        let mut spline = [Spline::Linear; D];
        for (i, s) in spline.iter_mut().enumerate() {
            *s = Spline::from_bits((b[1] >> (2 * i)) & 3).ok_or_else(bad)?;
        }
        Ok(Level {
            order,
            spline,
            multi: b[0] >> 6 & 1 == 1,
        })
    }
}

#[inline(always)]
fn linear(b: i64, c: i64) -> i64 {
    b.wrapping_add(c).wrapping_add(1) >> 1
}

/// The domain the passes run in (FORMAT.md, "cuszi", interpolation): reconstructed values
/// (`f64`, abs/noa bounds) or quantization codes (`i64`, rel bounds). It supplies the
/// arithmetic of each spline case and of the multi-dimensional mean; [`predict`] picks the case,
/// so both domains share one neighbour and edge logic. The passes are generic over it (not
/// handed a function pointer) so that the predictions inline into the per-point loops.
///
/// Values: `(b + c) * 0.5`, `((b + c) * 9 - (a + d)) * 0.0625`, `((b + c) * 23 - (a + d) * 3) /
/// 40`, `((b * 6 + c * 3) - a) * 0.125` and `((b * 3 + c * 6) - d) * 0.125`, evaluated in that
/// order (no fused multiply-add). Codes: wrapping integer arithmetic, divisions by powers of two
/// as arithmetic shifts with a rounding offset, the natural spline's 40 as a Euclidean division.
pub(crate) trait Domain: Copy {
    /// Linear spline of the neighbours `b`, `c` (also the fallback without outer neighbours).
    fn linear(b: Self, c: Self) -> Self;
    /// Not-a-knot cubic spline of `a, b, c, d` (the point lies between `b` and `c`).
    fn cubic(a: Self, b: Self, c: Self, d: Self) -> Self;
    /// Natural cubic spline of `a, b, c, d`.
    fn natural(a: Self, b: Self, c: Self, d: Self) -> Self;
    /// Quadratic through `a, b, c` (no outer right neighbour `d`).
    fn quad_left(a: Self, b: Self, c: Self) -> Self;
    /// Quadratic through `b, c, d` (no outer left neighbour `a`).
    fn quad_right(b: Self, c: Self, d: Self) -> Self;
    /// The mean of one to three predictions of a multi-dimensional level, in dimension order:
    /// values `(p0 + p1) * 0.5`, `(p0 + p1 + p2) / 3`; codes `(p0 + p1 + 1) >> 1`,
    /// `div3(p0 + p1 + p2 + 1)` (floor), wrapping.
    fn mean(p: &[Self]) -> Self;
}

impl Domain for f64 {
    #[inline(always)]
    fn linear(b: f64, c: f64) -> f64 {
        (b + c) * 0.5
    }
    #[inline(always)]
    fn cubic(a: f64, b: f64, c: f64, d: f64) -> f64 {
        ((b + c) * 9.0 - (a + d)) * 0.0625
    }
    #[inline(always)]
    fn natural(a: f64, b: f64, c: f64, d: f64) -> f64 {
        ((b + c) * 23.0 - (a + d) * 3.0) / 40.0
    }
    #[inline(always)]
    fn quad_left(a: f64, b: f64, c: f64) -> f64 {
        ((b * 6.0 + c * 3.0) - a) * 0.125
    }
    #[inline(always)]
    fn quad_right(b: f64, c: f64, d: f64) -> f64 {
        ((b * 3.0 + c * 6.0) - d) * 0.125
    }
    #[inline(always)]
    fn mean(p: &[f64]) -> f64 {
        match p.len() {
            1 => p[0],
            2 => (p[0] + p[1]) * 0.5,
            _ => (p[0] + p[1] + p[2]) / 3.0,
        }
    }
}

/// `x * k`, wrapping.
#[inline(always)]
fn w(x: i64, k: i64) -> i64 {
    x.wrapping_mul(k)
}

impl Domain for i64 {
    #[inline(always)]
    fn linear(b: i64, c: i64) -> i64 {
        linear(b, c)
    }
    #[inline(always)]
    fn cubic(a: i64, b: i64, c: i64, d: i64) -> i64 {
        let v = w(b.wrapping_add(c), 9).wrapping_sub(a).wrapping_sub(d);
        v.wrapping_add(8) >> 4
    }
    #[inline(always)]
    fn natural(a: i64, b: i64, c: i64, d: i64) -> i64 {
        let v = w(b.wrapping_add(c), 23).wrapping_sub(w(a.wrapping_add(d), 3));
        v.wrapping_add(20).div_euclid(40)
    }
    #[inline(always)]
    fn quad_left(a: i64, b: i64, c: i64) -> i64 {
        let v = w(b, 6).wrapping_add(w(c, 3)).wrapping_sub(a);
        v.wrapping_add(4) >> 3
    }
    #[inline(always)]
    fn quad_right(b: i64, c: i64, d: i64) -> i64 {
        let v = w(b, 3).wrapping_add(w(c, 6)).wrapping_sub(d);
        v.wrapping_add(4) >> 3
    }
    #[inline(always)]
    fn mean(p: &[i64]) -> i64 {
        match p.len() {
            1 => p[0],
            2 => linear(p[0], p[1]),
            _ => p[0]
                .wrapping_add(p[1])
                .wrapping_add(p[2])
                .wrapping_add(1)
                .div_euclid(3),
        }
    }
}

/// The neighbours that a point's splines along one dimension use (`b`, `c` the nearest, `a`,
/// `d` the outer ones), as far as they lie inside the box.
enum Neighbours<V> {
    /// No right neighbour: only `b`.
    Left1(V),
    /// `b`, `c` (no outer neighbour).
    Two(V, V),
    /// `a`, `b`, `c` (no `d`).
    NoRight(V, V, V),
    /// `b`, `c`, `d` (no `a`).
    NoLeft(V, V, V),
    /// `a`, `b`, `c`, `d`.
    Four(V, V, V, V),
}

/// The neighbours of the point at `idx` of `buf` (a box of values or codes), whose coordinate
/// along the pass's dimension is `c` (an odd multiple of `s`) in a box of extent `len` there;
/// `st` is the index distance of one step along that dimension.
#[inline(always)]
fn neighbours<V: Domain>(
    buf: &[V],
    idx: usize,
    c: usize,
    len: usize,
    s: usize,
    st: usize,
) -> Neighbours<V> {
    let b = buf[idx - s * st];
    if c + s >= len {
        return Neighbours::Left1(b);
    }
    let cc = buf[idx + s * st];
    match (c >= 3 * s, c + 3 * s < len) {
        (true, true) => Neighbours::Four(buf[idx - 3 * s * st], b, cc, buf[idx + 3 * s * st]),
        (true, false) => Neighbours::NoRight(buf[idx - 3 * s * st], b, cc),
        (false, true) => Neighbours::NoLeft(b, cc, buf[idx + 3 * s * st]),
        (false, false) => Neighbours::Two(b, cc),
    }
}

/// The prediction of the point at `idx` of `buf` by spline `sp` ([`neighbours`] for the
/// arguments). Without a right neighbour the left one is copied; a cubic spline missing an
/// outer neighbour falls back to the quadratic through the other three points, or to the
/// linear one when both are missing.
#[inline(always)]
pub(crate) fn predict<V: Domain>(
    buf: &[V],
    idx: usize,
    c: usize,
    len: usize,
    s: usize,
    st: usize,
    sp: Spline,
) -> V {
    match (neighbours(buf, idx, c, len, s, st), sp) {
        (Neighbours::Left1(b), _) => b,
        (Neighbours::Two(b, cc), _)
        | (Neighbours::NoRight(_, b, cc), Spline::Linear)
        | (Neighbours::NoLeft(b, cc, _), Spline::Linear)
        | (Neighbours::Four(_, b, cc, _), Spline::Linear) => V::linear(b, cc),
        (Neighbours::NoRight(a, b, cc), _) => V::quad_left(a, b, cc),
        (Neighbours::NoLeft(b, cc, d), _) => V::quad_right(b, cc, d),
        (Neighbours::Four(a, b, cc, d), Spline::Cubic) => V::cubic(a, b, cc, d),
        (Neighbours::Four(a, b, cc, d), Spline::Natural) => V::natural(a, b, cc, d),
    }
}

/// The predictions of every spline ([`Spline::ALL`] order) at one point, as [`predict`] gives
/// them one by one, from one fetch of the neighbours (the sampling compares all three).
#[inline(always)]
fn predict_all<V: Domain>(
    buf: &[V],
    idx: usize,
    c: usize,
    len: usize,
    s: usize,
    st: usize,
) -> [V; 3] {
    match neighbours(buf, idx, c, len, s, st) {
        Neighbours::Left1(b) => [b; 3],
        Neighbours::Two(b, cc) => [V::linear(b, cc); 3],
        Neighbours::NoRight(a, b, cc) => {
            let q = V::quad_left(a, b, cc);
            [V::linear(b, cc), q, q]
        }
        Neighbours::NoLeft(b, cc, d) => {
            let q = V::quad_right(b, cc, d);
            [V::linear(b, cc), q, q]
        }
        Neighbours::Four(a, b, cc, d) => [
            V::linear(b, cc),
            V::cubic(a, b, cc, d),
            V::natural(a, b, cc, d),
        ],
    }
}

/// Index strides of a box of extents `e` (row-major).
#[inline]
pub(crate) fn box_strides(e: [usize; D]) -> [usize; D] {
    [e[1] * e[2], e[2], 1]
}

/// Call `f(x, idx)` for the points `x = start + k * step` (per dimension, below `e`) of a box
/// of extents `e` and index strides `st`, in raster order: the walk of one pass or stage.
#[inline(always)]
fn lattice(
    e: [usize; D],
    st: [usize; D],
    start: [usize; D],
    step: [usize; D],
    mut f: impl FnMut([usize; D], usize),
) {
    let mut x = [0usize; D];
    x[0] = start[0];
    while x[0] < e[0] {
        x[1] = start[1];
        while x[1] < e[1] {
            x[2] = start[2];
            while x[2] < e[2] {
                f(x, x[0] * st[0] + x[1] * st[1] + x[2] * st[2]);
                x[2] += step[2];
            }
            x[1] += step[1];
        }
        x[0] += step[0];
    }
}

/// How the points of one walk over a box are predicted.
#[derive(Clone, Copy)]
pub(crate) enum Walk {
    /// One pass of a level: the spline along dimension `.0`.
    Pass(usize, Spline),
    /// One odd-dimension set (the bits of `.0`) of a multi-dimensional level, with the level's
    /// splines ([`multi_prediction`]).
    Multi(usize, [Spline; D]),
}

/// The walks of the passes in their order, coarsest level first: `(s, start, step, walk)` for
/// the points `start + k * step` of stride `s`. A level by passes: one walk per dimension in
/// pass order (along `a`: odd multiples of `s`; dimensions of earlier passes: multiples of `s`;
/// later passes: multiples of `2s`). A multi-dimensional level: stages of 1, 2, 3 odd
/// coordinates; within a stage, the odd-dimension sets in increasing bit order (no point of a
/// stage depends on another of the same stage).
pub(crate) fn walks(stride: usize, levels: &[Level]) -> Vec<(usize, [usize; D], [usize; D], Walk)> {
    let mut out = Vec::with_capacity(levels.len() * 7);
    let mut s = stride / 2;
    for lv in levels {
        if lv.multi {
            for stage in 1..=D as u32 {
                for mask in (1usize..1 << D).filter(|m| m.count_ones() == stage) {
                    let start: [usize; D] = std::array::from_fn(|d| (mask >> d & 1) * s);
                    out.push((s, start, [2 * s; D], Walk::Multi(mask, lv.spline)));
                }
            }
        } else {
            for (j, &a) in lv.order.iter().enumerate() {
                let mut start = [0usize; D];
                let mut step = [2 * s; D];
                for &d in &lv.order[..j] {
                    step[d] = s;
                }
                start[a] = s;
                out.push((s, start, step, Walk::Pass(a, lv.spline[a])));
            }
        }
        s /= 2;
    }
    out
}

/// Run the interpolation passes over a box of extents `e` whose anchors (corners at multiples
/// of `stride`) are already in `buf`: for every other point, in the order of [`walks`], call
/// `code(idx, local coordinates, prediction)` and store what it returns (the point's
/// reconstruction or code) at `idx`. (`code` has one call site, so that it inlines into the
/// walk.)
#[inline(always)]
pub(crate) fn run_passes<V: Domain>(
    buf: &mut [V],
    e: [usize; D],
    stride: usize,
    levels: &[Level],
    code: impl FnMut(usize, [usize; D], V) -> V,
) {
    run_walks(buf, e, &walks(stride, levels), code);
}

/// [`run_passes`] over the walks `list` (of [`walks`], in the order given).
#[inline(always)]
fn run_walks<V: Domain>(
    buf: &mut [V],
    e: [usize; D],
    list: &[(usize, [usize; D], [usize; D], Walk)],
    mut code: impl FnMut(usize, [usize; D], V) -> V,
) {
    let st = box_strides(e);
    for &(s, start, step, walk) in list {
        lattice(e, st, start, step, |x, idx| {
            let p = match walk {
                Walk::Pass(a, sp) => predict(buf, idx, x[a], e[a], s, st[a], sp),
                Walk::Multi(mask, spline) => multi_prediction(buf, idx, x, e, st, s, mask, spline),
            };
            buf[idx] = code(idx, x, p);
        });
    }
}

/// The prediction of the point at `idx` (box coordinates `x`, extents `e`, index strides `st`)
/// of a multi-dimensional level `lv` (stride `s`) whose odd dimensions are the bits of `mask`:
/// the mean of the splines along the odd dimensions with a right neighbour inside the box, in
/// dimension order; with none, the spline along the first odd dimension (a copy of the left
/// neighbour).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn multi_prediction<V: Domain>(
    buf: &[V],
    idx: usize,
    x: [usize; D],
    e: [usize; D],
    st: [usize; D],
    s: usize,
    mask: usize,
    spline: [Spline; D],
) -> V {
    let mut ps = [buf[idx]; D];
    let mut n = 0;
    for a in 0..D {
        if mask >> a & 1 == 1 && x[a] + s < e[a] {
            ps[n] = predict(buf, idx, x[a], e[a], s, st[a], spline[a]);
            n += 1;
        }
    }
    if n == 0 {
        let a = mask.trailing_zeros() as usize;
        return predict(buf, idx, x[a], e[a], s, st[a], spline[a]);
    }
    V::mean(&ps[..n])
}

/// Copy the anchors of tile `c` of volume `b` into its box `buf` (extents `e`) from the
/// anchor codes `anchors` (one per tile, indexed by tile number).
pub(crate) fn place_anchors<V: Copy>(
    g: &Grid,
    b: usize,
    c: [usize; D],
    e: [usize; D],
    anchors: &[V],
    buf: &mut [V],
) {
    let st = box_strides(e);
    let s = g.stride;
    for k in 0..(1 << D) {
        let mut idx = 0;
        let mut t = c;
        let mut inside = true;
        for d in 0..D {
            if k >> d & 1 == 1 {
                if e[d] <= s {
                    inside = false;
                    break;
                }
                idx += s * st[d];
                t[d] += 1;
            }
        }
        if inside {
            buf[idx] = anchors[g.tile_index(b, t)];
        }
    }
}

/// Lorenzo prediction of the anchor of tile `c` in volume `b` from the anchors of the tiles
/// before it (`anchors[i]` for tile numbers below `c`'s): the inclusion-exclusion sum over the
/// up to 7 neighbours at `c - m`, `m` a non-zero 0/1 vector; tiles outside the volume count 0.
pub(crate) fn anchor_prediction(g: &Grid, b: usize, c: [usize; D], anchors: &[i64]) -> i64 {
    let mut p = 0i64;
    for m in 1usize..(1 << D) {
        if (0..D).any(|d| m >> d & 1 == 1 && c[d] == 0) {
            continue;
        }
        let t: [usize; D] = std::array::from_fn(|d| c[d] - (m >> d & 1));
        let v = anchors[g.tile_index(b, t)];
        p = if m.count_ones() % 2 == 1 {
            p.wrapping_add(v)
        } else {
            p.wrapping_sub(v)
        };
    }
    p
}

/// Number of point classes of a grid with `n_levels` levels: the anchor, then one class per
/// level and pass.
pub(crate) fn n_classes(n_levels: usize) -> usize {
    1 + D * n_levels
}

/// The class of the point at local coordinates `l` of a tile (stride `2^log2s`): 0 for the
/// anchor, else `1 + D k + j` for the point predicted at level `k` (stride `s = S / 2^(k+1)`) in
/// pass `j`: `s` is the largest power of two dividing every coordinate, and `j` the last pass
/// whose dimension `order[j]` has an odd multiple of `s` there (multi-dimensional levels: `j` is
/// the number of odd coordinates minus one, the stage).
#[inline]
pub(crate) fn point_class(l: [usize; D], log2s: u32, levels: &[Level]) -> u8 {
    let tz = l
        .iter()
        .map(|&v| if v == 0 { log2s } else { v.trailing_zeros() })
        .min()
        .unwrap_or(log2s);
    if tz >= log2s {
        return 0;
    }
    let k = (log2s - 1 - tz) as usize;
    if levels[k].multi {
        let odd = l.iter().filter(|&&v| (v >> tz) & 1 == 1).count();
        return (D * k + odd) as u8;
    }
    let order = levels[k].order;
    let j = (0..D)
        .rev()
        .find(|&j| (l[order[j]] >> tz) & 1 == 1)
        .unwrap_or(0);
    (1 + D * k + j) as u8
}

/// Most tiles the configuration sampling visits (evenly spaced over the tile numbers).
pub(crate) const SAMPLE_TILES: usize = 256;

/// Sampled errors are counted in units of `1 / ERR_RES` of the quantization step, so that
/// splines whose errors are all below one step are still told apart.
const ERR_RES: f64 = 16.0;

/// A sampled error in integer units: `min(|v - p| * scale * 16, 2^40)`, truncated.
#[inline(always)]
fn err_units(v: f64, p: f64, scale: f64) -> u64 {
    ((v - p).abs() * scale * ERR_RES).min(1_099_511_627_776.0) as u64
}

/// Choose every level's configuration by sampling (cuSZ-i's profiling), on the boxes of up to
/// [`SAMPLE_TILES`] tiles (numbers `0, k, 2k, ...` with `k = max(1, n_tiles / SAMPLE_TILES)`)
/// filled with the sampled values. Errors are integers ([`err_units`] of the value and a
/// prediction by [`predict`] on the box, so with the edge cases the passes use), summed
/// over the points whose value and predictions are known; integer sums do not depend on the
/// order of the additions. Per level `s`:
///
/// 1. for each dimension `a`, at the points whose coordinate along `a` is an odd multiple of
///    `s` and every other coordinate a multiple of `s`, each spline's error sum; each dimension
///    takes the spline with the smallest sum (the first on ties), and the passes run from the
///    dimension with the largest smallest-sum to the smallest (ties by dimension number;
///    cuSZ-i's "least smooth first");
/// 2. at every point of the level, the error of its prediction by those passes (along the last
///    of its odd dimensions in pass order) and by the multi-dimensional mean
///    ([`multi_prediction`]); the level is multi-dimensional when that sum is smaller.
///
/// `value(b, x)` is the sampled value of point `x` of volume `b` (the data value, or the code as
/// f64), `None` when it is stored losslessly.
pub(crate) fn choose_levels(
    g: &Grid,
    scale: f64,
    value: impl Fn(usize, [usize; D]) -> Option<f64>,
) -> Vec<Level> {
    let n_tiles = g.n_tiles();
    let k = (n_tiles / SAMPLE_TILES).max(1);
    let boxes: Vec<([usize; D], Vec<f64>)> = (0..n_tiles)
        .step_by(k)
        .map(|t| {
            let (b, c) = g.tile_coords(t);
            let e = g.boxed(c);
            let o: [usize; D] = std::array::from_fn(|d| c[d] * g.stride);
            let mut buf = Vec::with_capacity(e.iter().product());
            for x0 in 0..e[0] {
                for x1 in 0..e[1] {
                    for x2 in 0..e[2] {
                        let v = value(b, [o[0] + x0, o[1] + x1, o[2] + x2]);
                        buf.push(v.unwrap_or(f64::NAN));
                    }
                }
            }
            (e, buf)
        })
        .collect();
    // visit the points of level `s` of a box whose odd dimensions are `mask`'s bits
    fn visit(e: [usize; D], s: usize, mask: usize, f: impl FnMut([usize; D], usize)) {
        let start: [usize; D] = std::array::from_fn(|d| (mask >> d & 1) * s);
        lattice(e, box_strides(e), start, [2 * s; D], f);
    }
    let mut out = Vec::with_capacity(g.levels());
    let mut s = g.stride / 2;
    while s >= 1 {
        // 1. splines and pass order
        let mut err = [[0u64; 3]; D];
        for (e, buf) in &boxes {
            let st = box_strides(*e);
            for mask in 1usize..1 << D {
                visit(*e, s, mask, |x, idx| {
                    let v = buf[idx];
                    for a in (0..D).filter(|a| mask >> a & 1 == 1) {
                        let p = predict_all(buf, idx, x[a], e[a], s, st[a]);
                        if v.is_finite() && p.iter().all(|p| p.is_finite()) {
                            for (ei, p) in err[a].iter_mut().zip(p) {
                                *ei = ei.saturating_add(err_units(v, p, scale));
                            }
                        }
                    }
                });
            }
        }
        let best: [(u64, Spline); D] = std::array::from_fn(|d| {
            let mut bi = 0;
            for i in 1..3 {
                if err[d][i] < err[d][bi] {
                    bi = i;
                }
            }
            (err[d][bi], Spline::ALL[bi])
        });
        let mut order = [0usize, 1, 2];
        order.sort_by(|&x, &y| best[y].0.cmp(&best[x].0).then(x.cmp(&y)));
        let spline = best.map(|b| b.1);
        // 2. passes or multi-dimensional means
        let (mut by_pass, mut by_mean) = (0u64, 0u64);
        for (e, buf) in &boxes {
            let st = box_strides(*e);
            for mask in 1usize..1 << D {
                let last = *order
                    .iter()
                    .rev()
                    .find(|&&a| mask >> a & 1 == 1)
                    .expect("odd");
                visit(*e, s, mask, |x, idx| {
                    let v = buf[idx];
                    let a = last;
                    let p = predict(buf, idx, x[a], e[a], s, st[a], spline[a]);
                    let m = multi_prediction(buf, idx, x, *e, st, s, mask, spline);
                    if v.is_finite() && p.is_finite() && m.is_finite() {
                        by_pass = by_pass.saturating_add(err_units(v, p, scale));
                        by_mean = by_mean.saturating_add(err_units(v, m, scale));
                    }
                });
            }
        }
        out.push(Level {
            order,
            spline,
            multi: by_mean < by_pass,
        });
        s /= 2;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every box shape of a grid with the anchor stride `stride` whose extents are at most
    /// `stride + 1` along the dimensions `dims` (the others 1), from a single point to a whole
    /// tile's box with its halo, with every level configuration kind (passes in each order,
    /// multi-dimensional) and the natural spline (the widest reads).
    fn each_box_and_levels(mut f: impl FnMut([usize; D], usize, &[Level])) {
        for (stride, dims) in [(8usize, 3usize), (16, 2), (512, 1)] {
            let levels = stride.trailing_zeros() as usize;
            let extents: Vec<usize> = if stride == 512 {
                vec![1, 2, 3, 5, 9, 100, 257, 512, 513]
            } else {
                (1..=stride + 1).collect()
            };
            let orders = [[0, 1, 2], [2, 1, 0], [1, 2, 0], [0, 2, 1]];
            for (k, &order) in orders.iter().enumerate() {
                for multi in [false, true] {
                    let lv: Vec<Level> = (0..levels)
                        .map(|l| Level {
                            order,
                            spline: [Spline::Natural, Spline::Cubic, Spline::Natural],
                            multi: multi != (l % 2 == 1),
                        })
                        .collect();
                    for &a in &extents {
                        for &b in if dims >= 2 { &extents[..] } else { &[1][..] } {
                            for &c in if dims >= 3 { &extents[..] } else { &[1][..] } {
                                // (every shape once for the first order, corner cases after)
                                if k > 0 && [a, b, c].iter().any(|&x| x > 3 && x < stride) {
                                    continue;
                                }
                                let e = match dims {
                                    1 => [1, 1, a],
                                    2 => [1, a, b],
                                    _ => [a, b, c],
                                };
                                f(e, stride, &lv);
                            }
                        }
                    }
                }
            }
        }
    }

    /// The anchors of a box of extents `e` (corners at multiples of `stride`) set to `anchor`,
    /// every other point to `rest`.
    fn boxed(e: [usize; D], stride: usize, anchor: f64, rest: f64) -> Vec<f64> {
        let st = box_strides(e);
        let mut buf = vec![rest; e.iter().product()];
        for x0 in (0..e[0]).step_by(stride) {
            for x1 in (0..e[1]).step_by(stride) {
                for x2 in (0..e[2]).step_by(stride) {
                    buf[x0 * st[0] + x1 * st[1] + x2] = anchor + (x0 + 2 * x1 + 3 * x2) as f64;
                }
            }
        }
        buf
    }

    /// A prediction reads only points that the anchors or earlier walks have written: with
    /// every other point NaN, no prediction is NaN. The GPU tile kernels rely on it (their
    /// boxes are not cleared between tiles, and the encoder's holds the input values there).
    #[test]
    fn predictions_read_only_coded_points() {
        each_box_and_levels(|e, stride, levels| {
            let mut buf = boxed(e, stride, 1.0, f64::NAN);
            let mut coded = 0usize;
            run_passes(&mut buf, e, stride, levels, |idx, x, p: f64| {
                assert!(
                    p.is_finite(),
                    "box {e:?}, point {x:?} reads an uncoded point"
                );
                coded += 1;
                p + (idx % 7) as f64 - 3.0
            });
            assert!(
                buf.iter().all(|v| v.is_finite()),
                "box {e:?}: a point not coded"
            );
            let anchors: usize = e.iter().map(|&n| n.div_ceil(stride)).product();
            assert_eq!(coded + anchors, buf.len(), "box {e:?}: points coded twice");
        });
    }

    /// The walks of one stage of a multi-dimensional level read none of each other's points:
    /// coding each stage's walks in reverse order gives the same box, bit for bit. The GPU tile
    /// kernels code a stage's walks in one loop, in any order.
    #[test]
    fn stage_walks_are_independent() {
        each_box_and_levels(|e, stride, levels| {
            let list = walks(stride, levels);
            let mut reordered = list.clone();
            let mut i = 0;
            while i < reordered.len() {
                let stage = |w: &(usize, [usize; D], [usize; D], Walk)| match w.3 {
                    Walk::Multi(mask, _) => Some((w.0, mask.count_ones())),
                    Walk::Pass(..) => None,
                };
                let mut j = i + 1;
                while j < reordered.len()
                    && stage(&reordered[i]).is_some()
                    && stage(&reordered[j]) == stage(&reordered[i])
                {
                    j += 1;
                }
                reordered[i..j].reverse();
                i = j;
            }
            let code = |idx: usize, _: [usize; D], p: f64| p * 0.75 + (idx % 11) as f64;
            let mut a = boxed(e, stride, 2.5, 0.0);
            let mut b = a.clone();
            run_walks(&mut a, e, &list, code);
            run_walks(&mut b, e, &reordered, code);
            let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&a), bits(&b), "box {e:?}");
        });
    }

    #[test]
    fn level_bytes_round_trip_and_are_checked() {
        let lv = Level {
            order: [2, 0, 1],
            spline: [Spline::Natural, Spline::Linear, Spline::Cubic],
            multi: false,
        };
        assert_eq!(
            Level::from_bytes(Level { multi: true, ..lv }.to_bytes()).unwrap(),
            Level { multi: true, ..lv }
        );
        assert_eq!(Level::from_bytes(lv.to_bytes()).unwrap(), lv);
        for bad in [
            [0u8, 0],
            [0b11_10_01, 0],
            [0b10_01_00, 3],
            [0b0110_0100 | 0x80, 0],
            [0b0110_0100 | 0xC0, 0],
        ] {
            assert!(Level::from_bytes(bad).is_err(), "{bad:?}");
        }
    }

    /// Splines reproduce polynomials of their degree exactly (away from rounding).
    #[test]
    fn splines_reproduce_polynomials() {
        // one row of 13 values at step 1 (s = 1, st = 1); the point at 6
        let cubic: Vec<i64> = (0..13)
            .map(|i: i64| 16 * i * i * i - 48 * i * i + 5)
            .collect();
        let lin: Vec<i64> = (0..13).map(|i: i64| 7 * i - 3).collect();
        // the prediction at point `i` of a row of 13
        let at = |v: &[i64], i: usize, sp| predict::<i64>(v, i, i, 13, 1, 1, sp);
        assert_eq!(at(&lin, 6, Spline::Linear), lin[6]);
        assert_eq!(at(&cubic, 6, Spline::Cubic), cubic[6]);
        // copy at the right edge, quadratic near the left edge
        assert_eq!(at(&lin, 12, Spline::Cubic), lin[11]);
        let quad: Vec<i64> = (0..13).map(|i: i64| 8 * i * i).collect();
        assert_eq!(at(&quad, 1, Spline::Cubic), quad[1]);
        assert_eq!(at(&quad, 11, Spline::Cubic), quad[11]);
        // the value domain agrees where the integer rounding does not matter
        let f = |v: &[i64]| v.iter().map(|&x| x as f64).collect::<Vec<f64>>();
        let atf = |v: &[i64], i: usize, sp| predict::<f64>(&f(v), i, i, 13, 1, 1, sp);
        assert_eq!(atf(&cubic, 6, Spline::Cubic), cubic[6] as f64);
        assert_eq!(atf(&quad, 1, Spline::Natural), quad[1] as f64);
        assert_eq!(atf(&lin, 12, Spline::Linear), lin[11] as f64);
        // extreme codes wrap instead of overflowing
        let big = [
            i64::MAX,
            0,
            0,
            i64::MAX,
            0,
            0,
            0,
            0,
            0,
            i64::MIN,
            0,
            0,
            i64::MAX,
        ];
        for sp in Spline::ALL {
            predict::<i64>(&big, 6, 6, 13, 1, 1, sp);
        }
    }

    /// The sampling's all-splines prediction equals each spline's own, at every edge case.
    #[test]
    fn predict_all_matches_predict() {
        let v: Vec<f64> = (0..17).map(|i| ((i * 7 % 11) as f64).sin() * 3.0).collect();
        let c: Vec<i64> = (0..17).map(|i: i64| (i * 37 % 23) - 11).collect();
        for s in [1, 2, 4] {
            for at in (s..17).step_by(2 * s) {
                let want = Spline::ALL.map(|sp| predict::<f64>(&v, at, at, 17, s, 1, sp));
                assert_eq!(predict_all(&v, at, at, 17, s, 1), want, "{s} {at}");
                let want = Spline::ALL.map(|sp| predict::<i64>(&c, at, at, 17, s, 1, sp));
                assert_eq!(predict_all(&c, at, at, 17, s, 1), want, "{s} {at}");
            }
        }
    }
}
