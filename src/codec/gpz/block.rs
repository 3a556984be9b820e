//! One 32-particle block: the encoder picks the segmentation level and writes the block's bit
//! string; the decoder validates every field while reading it back (GPZ-FORMAT.md, "Block").
//!
//! The level is chosen by exact size: every level `0..=min(max_level(d), max_c w_c)` is tried
//! and the smallest block wins, ties going to the lower level. The choice is integer-only (no
//! floating point beyond the quantizer), so a GPU encoder that evaluates the same candidates
//! writes the same bytes. A block whose coded form would not be smaller than its raw values is
//! stored raw.

use super::bitplane::{bit_width, get_planes, put_planes, BitReader, BitWriter};
use super::quantize::{quantize_block, segment_ids, split};
use super::runs::{get_runs, put_runs, runs_bits, runs_of, Runs};
use super::sort::{
    get_lehmer, get_run_indices, lehmer_bits, put_lehmer, put_run_indices, run_index_bits,
    sort_block,
};
use crate::element::Element;
use crate::error::{Error, Result};
use crate::quant::Quantizer;

/// Bits of a block's width field `w_c`.
pub(crate) const WIDTH_BITS: u32 = 6;
/// Bits of a block's level field.
pub(crate) const LEVEL_BITS: u32 = 4;

/// What every block of a stream shares.
pub(crate) struct Ctx<'a, T: Element> {
    /// Coordinates per particle.
    pub d: usize,
    /// Per-axis quantizers.
    pub qz: &'a [Quantizer<T>],
    /// Per-axis smallest code of the stream (the block bases are relative to it).
    pub gmin: [i64; 4],
    /// Per-axis bit width of the block bases.
    pub gw: [u32; 4],
    /// Whether blocks store their permutation (`preserve` order).
    pub preserve: bool,
    /// Largest segmentation level.
    pub lmax: u32,
}

/// The chosen coding of a block.
struct Choice {
    bits: u64,
    level: u32,
    identity: bool,
    perm: [u8; 32],
    runs: Runs,
}

/// Write the raw form of `xs` (flag bit 1, padding, the values).
fn put_raw<T: Element>(xs: &[T], out: &mut Vec<u8>) {
    out.push(1);
    for &x in xs {
        x.write_le(out);
    }
}

/// Encode one block of `xs.len() / d <= 32` particles onto `out`. `slots[i]` receives the block
/// index of the particle the decoder of a `reorder` stream returns at position `i` (the identity
/// for `preserve` streams and raw blocks).
pub(crate) fn encode_block<T: Element>(
    ctx: &Ctx<T>,
    xs: &[T],
    out: &mut Vec<u8>,
    slots: &mut [u8],
) {
    let d = ctx.d;
    let b = quantize_block(xs, d, ctx.qz);
    let (n, m) = (b.n, b.m);
    for (i, s) in slots.iter_mut().enumerate() {
        *s = i as u8;
    }
    if m == 0 {
        put_raw(xs, out);
        return;
    }
    let codes = &b.codes[..m];
    let mut lo = [0i64; 4];
    let mut w = [0u32; 4];
    // axes whose block span needs as many bits as the stream's use the stream's frame (base
    // `G_c`, width `gw_c`): same width, and the base costs nothing (blocks of particles stored
    // in random order span the whole domain)
    let mut global = [false; 4];
    for c in 0..d {
        let l = codes.iter().map(|q| q[c]).min().unwrap_or(0);
        let h = codes.iter().map(|q| q[c]).max().unwrap_or(0);
        // codes are below 2^61 in magnitude, so the span fits 62 bits
        w[c] = bit_width(h.wrapping_sub(l) as u64);
        global[c] = w[c] == ctx.gw[c];
        lo[c] = if global[c] { ctx.gmin[c] } else { l };
    }
    let mut u = [[0u64; 4]; 32];
    for (uj, q) in u.iter_mut().zip(codes) {
        for c in 0..d {
            uj[c] = q[c].wrapping_sub(lo[c]) as u64;
        }
    }
    let u = &u[..m];
    let n_exc = n - m;
    let fixed: u64 = 2
        + if n_exc > 0 { n as u64 } else { 0 }
        + (0..d)
            .map(|c| {
                1 + if global[c] {
                    0
                } else {
                    (ctx.gw[c] + WIDTH_BITS) as u64
                }
            })
            .sum::<u64>()
        + LEVEL_BITS as u64
        + ctx.preserve as u64;
    let max_w = w[..d].iter().copied().max().unwrap_or(0);
    let mut best: Option<Choice> = None;
    let mut ids = [0u64; 32];
    for level in 0..=ctx.lmax.min(max_w) {
        let (k, s, kk) = split(&w[..d], level);
        segment_ids(u, d, &k, &s, &mut ids[..m]);
        let mut sorted = [0u64; 32];
        let mut perm = [0u8; 32];
        let identity = sort_block(&ids[..m], &mut sorted[..m], &mut perm[..m]);
        let runs = runs_of(&sorted[..m]);
        let bits = fixed
            + runs_bits(&runs, kk)
            + if ctx.preserve && !identity {
                1 + lehmer_bits(m).min(run_index_bits(m, runs.r))
            } else {
                0
            }
            + m as u64 * s[..d].iter().map(|&x| x as u64).sum::<u64>();
        let better = match &best {
            None => true,
            Some(b) => bits < b.bits,
        };
        if better {
            best = Some(Choice {
                bits,
                level,
                identity,
                perm,
                runs,
            });
        }
    }
    let best = best.expect("level 0 is always tried");
    let coded = best.bits.div_ceil(8) as usize + n_exc * d * T::SIZE;
    // a raw block costs one flag byte plus the values: keep the coded form only if smaller
    if coded > xs.len() * T::SIZE {
        put_raw(xs, out);
        return;
    }
    let mut wr = BitWriter::new(out);
    wr.put(0, 1);
    wr.put((n_exc > 0) as u64, 1);
    if n_exc > 0 {
        wr.put(b.exc as u64, n as u32);
    }
    for c in 0..d {
        wr.put(global[c] as u64, 1);
        if !global[c] {
            wr.put(lo[c].wrapping_sub(ctx.gmin[c]) as u64, ctx.gw[c]);
            wr.put(w[c] as u64, WIDTH_BITS);
        }
    }
    wr.put(best.level as u64, LEVEL_BITS);
    let (k, s, kk) = split(&w[..d], best.level);
    debug_assert!(k.iter().sum::<u32>() == kk);
    put_runs(&mut wr, &best.runs, kk);
    let perm = &best.perm[..m];
    if ctx.preserve {
        wr.put(!best.identity as u64, 1);
        if !best.identity {
            // the cheaper form; the Lehmer code on a tie
            let by_runs = run_index_bits(m, best.runs.r) < lehmer_bits(m);
            wr.put(by_runs as u64, 1);
            if by_runs {
                put_run_indices(&mut wr, perm, &best.runs);
            } else {
                put_lehmer(&mut wr, perm);
            }
        }
    }
    let mut offs = [0u64; 32];
    for c in 0..d {
        let mask = (1u64 << s[c]) - 1;
        for (o, &p) in offs.iter_mut().zip(perm) {
            *o = u[p as usize][c] & mask;
        }
        put_planes(&mut wr, &offs[..m], s[c]);
    }
    wr.align();
    // exceptions verbatim, in block order
    let mut raw = Vec::with_capacity(n_exc * d * T::SIZE);
    for j in (0..n).filter(|j| b.exc >> j & 1 == 1) {
        for &x in &xs[j * d..(j + 1) * d] {
            x.write_le(&mut raw);
        }
    }
    wr.bytes(&raw);
    let written = wr.finish();
    debug_assert_eq!(written, coded);
    if !ctx.preserve {
        // block positions of the non-exception particles, then of the exceptions
        let mut pos = [0u8; 32];
        let mut e = m;
        let mut k = 0;
        for j in 0..n {
            if b.exc >> j & 1 == 0 {
                pos[k] = j as u8;
                k += 1;
            } else {
                slots[e] = j as u8;
                e += 1;
            }
        }
        for i in 0..m {
            slots[i] = pos[perm[i] as usize];
        }
    }
}

/// Decode one block of `n = out.len() / d` particles from exactly `bytes`.
pub(crate) fn decode_block<T: Element>(ctx: &Ctx<T>, bytes: &[u8], out: &mut [T]) -> Result<()> {
    let d = ctx.d;
    let n = out.len() / d;
    let mut r = BitReader::new(bytes);
    if r.get(1)? == 1 {
        r.align()?;
        let raw = r.bytes(out.len() * T::SIZE)?;
        for (o, b) in out.iter_mut().zip(raw.chunks_exact(T::SIZE)) {
            *o = T::read_le(b);
        }
        return r.finish();
    }
    let exc = if r.get(1)? == 1 {
        let e = r.get(n as u32)? as u32;
        if e == 0 {
            return Err(Error::corrupt("gpz block flags exceptions but lists none"));
        }
        e
    } else {
        0
    };
    let m = n - exc.count_ones() as usize;
    if m == 0 {
        return Err(Error::corrupt(
            "gpz coded block holds only exceptions (such blocks are raw)",
        ));
    }
    let mut lo = [0i64; 4];
    let mut w = [0u32; 4];
    for c in 0..d {
        if r.get(1)? == 1 {
            // the stream's frame (gw_c was checked against MAX_RATE with the header)
            lo[c] = ctx.gmin[c];
            w[c] = ctx.gw[c];
            continue;
        }
        lo[c] = ctx.gmin[c].wrapping_add(r.get(ctx.gw[c])? as i64);
        w[c] = r.get(WIDTH_BITS)? as u32;
        if w[c] > T::MAX_RATE {
            return Err(Error::corrupt(format!(
                "gpz block width {} exceeds {}",
                w[c],
                T::MAX_RATE
            )));
        }
    }
    let level = r.get(LEVEL_BITS)? as u32;
    if level > ctx.lmax {
        return Err(Error::corrupt(format!(
            "gpz block level {level} exceeds {}",
            ctx.lmax
        )));
    }
    let (k, s, kk) = split(&w[..d], level);
    let mut sorted = [0u64; 32];
    get_runs(&mut r, kk, &mut sorted[..m])?;
    let mut perm = [0u8; 32];
    for (i, p) in perm.iter_mut().enumerate() {
        *p = i as u8;
    }
    if ctx.preserve && r.get(1)? == 1 {
        if r.get(1)? == 1 {
            get_run_indices(&mut r, &runs_of(&sorted[..m]), &mut perm[..m])?;
        } else {
            get_lehmer(&mut r, &mut perm[..m])?;
        }
    }
    let mut offs = [[0u64; 32]; 4];
    for c in 0..d {
        get_planes(&mut r, &mut offs[c][..m], s[c])?;
    }
    r.align()?;
    // block positions of the non-exception particles (preserve) or output slots (reorder)
    let mut pos = [0usize; 32];
    let mut k_at = 0;
    let mut e_at = m;
    let mut exc_pos = [0usize; 32];
    for j in 0..n {
        if exc >> j & 1 == 0 {
            pos[k_at] = if ctx.preserve { j } else { k_at };
            k_at += 1;
        } else {
            exc_pos[e_at - m] = if ctx.preserve { j } else { e_at };
            e_at += 1;
        }
    }
    for i in 0..m {
        let at = pos[perm[i] as usize] * d;
        let mut shift = kk;
        for c in 0..d {
            shift -= k[c];
            let seg = (sorted[i] >> shift) & ((1u64 << k[c]) - 1);
            let u = seg << s[c] | offs[c][i];
            out[at + c] = ctx.qz[c].decode(lo[c].wrapping_add(u as i64));
        }
    }
    let raw = r.bytes((n - m) * d * T::SIZE)?;
    for (p, vals) in exc_pos[..n - m].iter().zip(raw.chunks_exact(d * T::SIZE)) {
        for (c, b) in vals.chunks_exact(T::SIZE).enumerate() {
            out[p * d + c] = T::read_le(b);
        }
    }
    r.finish()
}
