//! Coders 1 to 3 (FORMAT.md, "cuszi", "Coders 1 to 3: rANS"): static-model range asymmetric
//! numeral systems over the residual sequence, with one frequency table per group of point
//! classes.
//!
//! A point's class (its level and pass, [`super::interp::point_class`]) follows from its
//! position, so encoder and decoder know which table codes each residual without side
//! information. Residuals of different classes have very different spreads (coarse levels and
//! passes along a rough dimension are wide, the finest passes of a smooth field almost always
//! 0); a table per class codes each with its own order-0 statistics, and rANS codes a symbol of
//! probability close to 1 in a small fraction of a bit, where a Huffman code needs at least one.
//!
//! Each chunk is one rANS stream (32-bit states, byte-wise renormalization), independent of the
//! others: a GPU codes chunks in parallel, with the tables built on the host from a histogram
//! kernel's counts, as for the Huffman codebook of coder 0. Coder 3 (what the encoder writes)
//! interleaves [`WAYS`] states in each chunk's stream, residual `i` coded with state `i mod
//! WAYS`: a state update waits on the state before it, so a chunk of one state is one serial
//! chain of 32,768 dependent steps; with one state per lane of a warp, a GPU decodes (and
//! encodes) a chunk a warp step at a time, WAYS residuals per step, the lanes' renormalization
//! bytes placed by a prefix count over the warp. The bytes stay in residual order, so this
//! module's serial coder writes the same stream. Each state costs 4 bytes per chunk. Coders 1
//! (one state) and 2 ([`WAYS_CODER_2`] states, for one thread's overlapped steps) still
//! decode.

use rayon::prelude::*;

use crate::element::Element;
use crate::error::{Error, Result};

use super::entropy::{zigzag, LOSSLESS, RADIUS};

/// log2 of the frequency total of every table.
pub(crate) const PROB_BITS: u32 = 14;
/// The frequency total of every table.
pub(crate) const PROB_SCALE: u32 = 1 << PROB_BITS;
/// Lower end of the normalized state interval `[L, 256 L)`.
const RANS_L: u32 = 1 << 23;
/// Interleaved rANS states per chunk of coder 3 (kernels/cuszi.cu `CZ_RANS_WAYS`: the lanes
/// that decode one chunk); coder 1 has one.
pub(crate) const WAYS: usize = 32;
/// Interleaved rANS states per chunk of coder 2 (kernels/cuszi.cu `CZ_RANS_WAYS2`).
pub(crate) const WAYS_CODER_2: usize = 4;
// (the coders' state arrays hold WAYS states: no coder has more)
const _: () = assert!(WAYS >= WAYS_CODER_2);

/// Whether `ways` is a coder's state count (1, [`WAYS_CODER_2`] or [`WAYS`]).
fn known_ways(ways: usize) -> bool {
    ways == 1 || ways == WAYS_CODER_2 || ways == WAYS
}
/// Symbol of a value stored losslessly (its bits follow in the chunk's raw section).
pub(crate) const SYM_LOSSLESS: u16 = 2 * RADIUS as u16 + 1;
/// Symbol of a residual outside `±RADIUS` (zigzag LEB128 in the chunk's big section).
pub(crate) const SYM_BIG: u16 = SYM_LOSSLESS + 1;
/// Alphabet size: residuals `-RADIUS..=RADIUS`, lossless, big.
pub(crate) const NSYM: usize = SYM_BIG as usize + 1;

/// The symbol of residual `r`.
#[inline(always)]
pub(crate) fn symbol(r: i64) -> u16 {
    if r == LOSSLESS {
        SYM_LOSSLESS
    } else if (-RADIUS..=RADIUS).contains(&r) {
        (r + RADIUS) as u16
    } else {
        SYM_BIG
    }
}

/// One static frequency table: per symbol its frequency and cumulative frequency (summing to
/// [`PROB_SCALE`]) and the encoder's division-free form of them, and the decoder's
/// slot-to-symbol map.
pub(crate) struct Table {
    /// Per symbol: the encoder's step ([`EncSym`]).
    enc: Vec<EncSym>,
    /// Per slot `0..PROB_SCALE`: the symbol whose range holds it.
    slot: Vec<u16>,
    /// Per slot: `freq << 16 | (slot - cum)` of that symbol, so that the decoder's state update
    /// (its serial dependency chain) waits on one load.
    step: Vec<u32>,
}

/// A symbol's encoder step with the division by its frequency `f` replaced by a multiplication
/// with a rounded-up reciprocal (exact for states below 2^31, which the renormalization
/// guarantees: a state is below `x_max <= 2^31` when it is coded): `x' = x + bias + q (M - f)`
/// with `q = floor(x / f)` equals `(x / f) M + x mod f + cum`. `f = 1` uses the reciprocal
/// `2^32 - 1` (giving `q = x - 1`) and folds the missing `M - 1` into the bias.
#[derive(Clone, Copy, Default)]
struct EncSym {
    /// Renormalize (emit bytes) while the state is at or above this.
    x_max: u32,
    /// `ceil(2^(shift + 31) / f)`.
    rcp: u32,
    /// `shift - 1`, `shift = ceil(log2 f)`.
    rcp_shift: u32,
    /// `cum` (or `cum + M - 1` for `f = 1`).
    bias: u32,
    /// `M - f`.
    cmpl: u32,
}

impl EncSym {
    fn new(f: u32, cum: u32) -> Self {
        let x_max = ((RANS_L >> PROB_BITS) << 8) * f;
        let cmpl = PROB_SCALE - f;
        if f < 2 {
            return EncSym {
                x_max,
                rcp: u32::MAX,
                rcp_shift: 0,
                bias: cum + PROB_SCALE - 1,
                cmpl,
            };
        }
        let shift = 32 - (f - 1).leading_zeros();
        EncSym {
            x_max,
            rcp: (1u64 << (shift + 31)).div_ceil(f as u64) as u32,
            rcp_shift: shift - 1,
            bias: cum,
            cmpl,
        }
    }

    /// The state after coding this symbol in state `x` (already renormalized: `x < x_max`).
    #[inline(always)]
    fn put(&self, x: u32) -> u32 {
        let q = ((x as u64 * self.rcp as u64) >> 32) as u32 >> self.rcp_shift;
        x.wrapping_add(self.bias)
            .wrapping_add(q.wrapping_mul(self.cmpl))
    }
}

impl Table {
    /// The table of normalized frequencies `freq` (checked: summing to [`PROB_SCALE`]).
    fn new(freq: &[u32]) -> Self {
        let enc = enc_syms(freq);
        let mut slot = vec![0u16; PROB_SCALE as usize];
        let mut step = vec![0u32; PROB_SCALE as usize];
        let mut c = 0u32;
        for (s, &f) in freq.iter().enumerate() {
            slot[c as usize..(c + f) as usize].fill(s as u16);
            for (k, st) in step[c as usize..(c + f) as usize].iter_mut().enumerate() {
                *st = f << 16 | k as u32;
            }
            c += f;
        }
        Table { enc, slot, step }
    }
}

/// The encoder's step of every symbol of the normalized frequencies `freq` (unused symbols: all
/// zero).
fn enc_syms(freq: &[u32]) -> Vec<EncSym> {
    let mut enc = vec![EncSym::default(); NSYM];
    let mut c = 0u32;
    for (s, &f) in freq.iter().enumerate() {
        if f > 0 {
            enc[s] = EncSym::new(f, c);
        }
        c += f;
    }
    enc
}

/// The encoder's words per symbol (`EncSym`) of the normalized frequencies `freq`: `x_max`, the
/// reciprocal, its shift, the bias and `M - f` (all 0 for an unused symbol), without building a
/// [`Table`]'s decoder arrays (an encoder on a device needs only these).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn encoder_words(freq: &[u32]) -> Vec<[u32; 5]> {
    enc_syms(freq)
        .iter()
        .map(|e| [e.x_max, e.rcp, e.rcp_shift, e.bias, e.cmpl])
        .collect()
}

/// A histogram by its used symbols: `sym` ascending, `count[k] > 0` the count of `sym[k]`. The
/// class histograms of smooth data use a few dozen of the 1,025 symbols, and pricing the
/// groupings of [`group_classes`] walks each merged histogram several times.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Hist {
    sym: Vec<u16>,
    count: Vec<u64>,
}

impl Hist {
    /// The used symbols of the dense histogram `h` (a count per symbol).
    pub(crate) fn from_dense(h: &[u64]) -> Hist {
        let (sym, count) = h
            .iter()
            .enumerate()
            .filter(|(_, &c)| c > 0)
            .map(|(s, &c)| (s as u16, c))
            .unzip();
        Hist { sym, count }
    }

    /// The histogram of `self` and `o` together (the union of their symbols, in order).
    fn merged(&self, o: &Hist) -> Hist {
        let n = self.sym.len() + o.sym.len();
        let (mut sym, mut count) = (Vec::with_capacity(n), Vec::with_capacity(n));
        let (mut a, mut b) = (0, 0);
        while a < self.sym.len() || b < o.sym.len() {
            let sa = self.sym.get(a).copied().unwrap_or(u16::MAX);
            let sb = o.sym.get(b).copied().unwrap_or(u16::MAX);
            if sa < sb {
                sym.push(sa);
                count.push(self.count[a]);
                a += 1;
            } else if sb < sa {
                sym.push(sb);
                count.push(o.count[b]);
                b += 1;
            } else {
                sym.push(sa);
                count.push(self.count[a] + o.count[b]);
                a += 1;
                b += 1;
            }
        }
        Hist { sym, count }
    }

    /// [`normalize`]'s frequencies of the used symbols (one per entry; an empty histogram has
    /// none).
    fn normalized(&self) -> Vec<u32> {
        let total: u128 = self.count.iter().map(|&x| x as u128).sum();
        if total == 0 {
            return Vec::new();
        }
        // the rounded share in 64 bits where `hi * 2^14 + total / 2` cannot overflow (any real
        // histogram; the same value as in 128 bits), else in 128
        let inv = 1.0 / total as f64;
        let share = |hi: u64| -> u32 {
            let v = if total < 1 << 49 {
                // the quotient (at most 2^14 + 1) from its floating-point estimate, corrected
                // to the exact floor by integer products (the estimate is off by at most one)
                let t = total as u64;
                let n = hi * PROB_SCALE as u64 + t / 2;
                let mut q = (n as f64 * inv) as u64;
                if q * t > n {
                    q -= 1;
                } else if (q + 1) * t <= n {
                    q += 1;
                }
                q
            } else {
                ((hi as u128 * PROB_SCALE as u128 + total / 2) / total) as u64
            };
            (v as u32).max(1)
        };
        let mut f: Vec<u32> = self.count.iter().map(|&c| share(c)).collect();
        let sum: i64 = f.iter().map(|&x| x as i64).sum();
        settle(&mut f, PROB_SCALE as i64 - sum);
        f
    }

    /// Estimated bits of a group of classes with this (non-empty) histogram: its codes with its
    /// normalized frequencies and its table (as [`write_table`] would write it).
    fn group_bits(&self) -> f64 {
        debug_assert!(!self.sym.is_empty(), "a group without symbols");
        let f = self.normalized();
        let len = code_lengths();
        let coded: f64 = self
            .count
            .iter()
            .zip(&f)
            .map(|(&c, &fi)| c as f64 * len[fi as usize])
            .sum();
        let used = self.sym.iter().map(|&s| s as usize).zip(f.iter().copied());
        coded + 8.0 * table_len_of(used) as f64
    }

    /// The normalized frequency of every symbol ([`normalize`]).
    fn dense_normalized(&self) -> Vec<u32> {
        let mut d = vec![0u32; NSYM];
        let f = self.normalized();
        if f.is_empty() {
            d[RADIUS as usize] = PROB_SCALE;
        }
        for (&s, fi) in self.sym.iter().zip(f) {
            d[s as usize] = fi;
        }
        d
    }
}

/// The surplus (`diff > 0`) or deficit of the rounded frequencies `f` of the used symbols (in
/// symbol order) settled as [`normalize`] does: the surplus to the largest frequency, the
/// deficit from the largest ones, largest first (lower symbol on ties), none below 1.
fn settle(f: &mut [u32], mut diff: i64) {
    // the largest frequency, the lowest symbol among equals: the first of the order below
    let top = (0..f.len()).fold(0, |b, i| if f[i] > f[b] { i } else { b });
    if diff > 0 {
        f[top] += diff as u32;
    } else if f[top] as i64 > -diff {
        // the first symbol of the order covers the deficit alone (the usual case)
        f[top] -= (-diff) as u32;
    } else {
        let mut order: Vec<usize> = (0..f.len()).collect();
        order.sort_by(|&a, &b| f[b].cmp(&f[a]).then(a.cmp(&b)));
        // (at most one unit per used symbol, and at most 1,025 symbols in 16,384 slots)
        for &i in &order {
            if diff == 0 {
                break;
            }
            let take = (f[i] as i64 - 1).min(-diff);
            f[i] -= take as u32;
            diff += take;
        }
    }
}

/// Normalize histogram `h` to frequencies summing to [`PROB_SCALE`]: every used symbol gets
/// `max(1, round(h * 2^14 / total))` (ties up); the surplus or deficit goes to (comes from) the
/// symbols with the largest frequencies, largest first (lower symbol on ties), none below 1.
/// An empty histogram gives all of the total to residual 0.
pub(crate) fn normalize(h: &[u64]) -> Vec<u32> {
    Hist::from_dense(h).dense_normalized()
}

fn put_varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Read a minimal LEB128 varint of at most 32 bits from `b` at `*pos`.
fn get_varint(b: &[u8], pos: &mut usize) -> Result<u64> {
    let mut v = 0u64;
    let mut shift = 0;
    loop {
        let x = *b
            .get(*pos)
            .ok_or_else(|| Error::corrupt("rANS table runs past the metadata"))?;
        *pos += 1;
        if shift > 0 && x == 0 || shift > 28 {
            return Err(Error::corrupt("invalid varint in a rANS table"));
        }
        v |= ((x & 0x7F) as u64) << shift;
        if x & 0x80 == 0 {
            return Ok(v);
        }
        shift += 7;
    }
}

/// Serialize normalized frequencies: the number of used symbols, then per used symbol (in
/// order) the gap to the previous one (the first: its symbol) and `freq - 1`, all LEB128.
pub(crate) fn write_table(f: &[u32], out: &mut Vec<u8>) {
    let used: Vec<usize> = (0..f.len()).filter(|&i| f[i] > 0).collect();
    put_varint(used.len() as u64, out);
    let mut prev = 0usize;
    for (k, &i) in used.iter().enumerate() {
        put_varint((if k == 0 { i } else { i - prev - 1 }) as u64, out);
        put_varint(f[i] as u64 - 1, out);
        prev = i;
    }
}

/// Parse one table written by [`write_table`] from `b` at `*pos`, checking that its symbols
/// exist and its frequencies sum to [`PROB_SCALE`]: its frequency per symbol (a decoder builds
/// its arrays from them: [`tables`] on the CPU).
pub(crate) fn read_table(b: &[u8], pos: &mut usize) -> Result<Vec<u32>> {
    let bad = || Error::corrupt("invalid rANS frequency table");
    let n = get_varint(b, pos)? as usize;
    if n == 0 || n > NSYM {
        return Err(bad());
    }
    let mut f = vec![0u32; NSYM];
    let mut next = 0usize;
    let mut sum = 0u64;
    for _ in 0..n {
        let s = next + get_varint(b, pos)? as usize;
        let v = get_varint(b, pos)? + 1;
        if s >= NSYM || v > PROB_SCALE as u64 {
            return Err(bad());
        }
        f[s] = v as u32;
        sum += v;
        next = s + 1;
    }
    if sum != PROB_SCALE as u64 {
        return Err(bad());
    }
    Ok(f)
}

/// The tables of normalized frequencies `freqs` (each as [`normalize`] returns them).
pub(crate) fn tables(freqs: &[Vec<u32>]) -> Vec<Table> {
    freqs.iter().map(|f| Table::new(f)).collect()
}

/// `PROB_BITS - log2(f)` for every frequency `f` of a normalized table (index 0 unused): the
/// values `f64::log2` gives, computed once instead of once per symbol of every priced group.
fn code_lengths() -> &'static [f64] {
    static LEN: std::sync::OnceLock<Vec<f64>> = std::sync::OnceLock::new();
    LEN.get_or_init(|| {
        (0..=PROB_SCALE)
            .map(|f| PROB_BITS as f64 - (f as f64).log2())
            .collect()
    })
}

/// Bytes of a LEB128 varint of `v`.
fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

/// Bytes [`write_table`] writes for `f`, without writing them.
#[cfg(test)]
fn table_len(f: &[u32]) -> usize {
    table_len_of(f.iter().copied().enumerate().filter(|&(_, fi)| fi > 0))
}

/// Bytes [`write_table`] writes for a table whose used symbols and frequencies are `used`
/// (symbols ascending).
fn table_len_of(used: impl Iterator<Item = (usize, u32)>) -> usize {
    let mut n = 0usize;
    let mut len = 0usize;
    let mut prev = 0usize;
    for (i, fi) in used {
        len += varint_len((if n == 0 { i } else { i - prev - 1 }) as u64);
        len += varint_len(fi as u64 - 1);
        prev = i;
        n += 1;
    }
    len + varint_len(n as u64)
}

/// Groups times used symbols of a grouping above which [`group_classes`] prices its pairs on
/// the thread pool (each pricing walks its merged histogram's symbols a few times).
const PARALLEL_PRICING: usize = 1 << 14;

/// Group the classes by their histograms `hist` (one per class) into tables: every used class
/// starts as a group of its own, then the pair of groups whose merging saves the most estimated
/// bits (codes and table) merges (the first pair in order on ties), while one saves any.
/// Returns the class-to-table map (unused classes: table 0) and each table's normalized
/// frequencies (at least one table).
///
/// The estimate of every pair's merged group is kept from one round to the next: a merge
/// changes only the pairs of the merged group, so each round prices `groups` pairs instead of
/// all of them (with 28 classes, nine 3-D levels: 27 instead of up to 378).
///
/// The pricing of a large grouping runs in parallel (each price is computed alone, so the
/// choice does not depend on the number of threads): with 28 classes (a 1-D array) the first
/// round prices 378 pairs.
pub(crate) fn group_classes(hist: &[Vec<u64>]) -> (Vec<u8>, Vec<Vec<u32>>) {
    let mut groups = single_groups(hist);
    // (the pricing goes parallel only when there is enough of it: a 3-D array's ten classes of
    // a few dozen symbols each take microseconds, less than waking the thread pool)
    let symbols: usize = groups.iter().map(|g| g.1.sym.len()).sum();
    let parallel = groups.len() * symbols >= PARALLEL_PRICING;
    let price = |a: &Hist, b: &Hist| a.merged(b).group_bits();
    // pair[i][j] (i < j): the estimated bits of groups i and j merged
    let n = groups.len();
    let row = |i: usize| -> Vec<f64> {
        (0..n)
            .map(|j| {
                if j > i {
                    price(&groups[i].1, &groups[j].1)
                } else {
                    0.0
                }
            })
            .collect()
    };
    let mut pair: Vec<Vec<f64>> = if parallel {
        (0..n).into_par_iter().map(row).collect()
    } else {
        (0..n).map(row).collect()
    };
    loop {
        let mut best: Option<(f64, usize, usize)> = None;
        for i in 0..groups.len() {
            for j in i + 1..groups.len() {
                let save = groups[i].2 + groups[j].2 - pair[i][j];
                if save > 0.0 && best.map_or(true, |b| save > b.0) {
                    best = Some((save, i, j));
                }
            }
        }
        let Some((_, i, j)) = best else {
            break;
        };
        let h = groups[i].1.merged(&groups[j].1);
        let (cj, _, _) = groups.remove(j);
        groups[i].0.extend(cj);
        groups[i].1 = h;
        groups[i].2 = pair[i][j];
        pair.remove(j);
        for row in &mut pair {
            row.remove(j);
        }
        let others = (0..groups.len()).filter(|&k| k != i);
        let fresh: Vec<(usize, f64)> = if parallel {
            let others: Vec<usize> = others.collect();
            others
                .into_par_iter()
                .map(|k| (k, price(&groups[k].1, &groups[i].1)))
                .collect()
        } else {
            others
                .map(|k| (k, price(&groups[k].1, &groups[i].1)))
                .collect()
        };
        for (k, bits) in fresh {
            pair[k.min(i)][k.max(i)] = bits;
        }
    }
    group_tables(&groups, hist.len())
}

/// Every used class of `hist` as a group of its own: `(classes, histogram, estimated bits)`.
fn single_groups(hist: &[Vec<u64>]) -> Vec<(Vec<usize>, Hist, f64)> {
    hist.iter()
        .enumerate()
        .map(|(k, h)| (k, Hist::from_dense(h)))
        .filter(|(_, h)| !h.sym.is_empty())
        .map(|(k, h)| {
            let bits = h.group_bits();
            (vec![k], h, bits)
        })
        .collect()
}

/// A grouping of `n` classes (`(classes, histogram, bits)` per group) as the class-to-table map
/// (unused classes: table 0) and each table's normalized frequencies (at least one table).
fn group_tables(groups: &[(Vec<usize>, Hist, f64)], n: usize) -> (Vec<u8>, Vec<Vec<u32>>) {
    let mut map = vec![0u8; n];
    let mut freqs = Vec::with_capacity(groups.len().max(1));
    for (t, (classes, h, _)) in groups.iter().enumerate() {
        for &k in classes {
            map[k] = t as u8;
        }
        freqs.push(h.dense_normalized());
    }
    if freqs.is_empty() {
        freqs.push(normalize(&[]));
    }
    (map, freqs)
}

/// The chunk payload of residuals `res` with classes `cls` (FORMAT.md, "Coders 1 to 3: rANS",
/// with `ways` interleaved states: 1 for coder 1, [`WAYS_CODER_2`] for coder 2, [`WAYS`] for
/// coder 3): the rANS byte count
/// (u32), the rANS bytes, the lossless values `raw` (little-endian), the big residuals' varints
/// (zigzag LEB128), zero padding to a multiple of 4 bytes.
pub(crate) fn write_chunk<T: Element>(
    res: &[i64],
    cls: &[u8],
    map: &[u8],
    tables: &[Table],
    raw: &[T],
    ways: usize,
) -> Vec<u8> {
    debug_assert!(known_ways(ways), "{ways} interleaved rANS states");
    // rANS codes backwards: bytes are produced last symbol first, then reversed
    let by_class: Vec<&Table> = map.iter().map(|&t| &tables[t as usize]).collect();
    let mut rev = Vec::with_capacity(res.len() / 2 + 4 * ways + 4);
    let mut x = [RANS_L; WAYS];
    for (i, (&r, &k)) in res.iter().zip(cls).enumerate().rev() {
        let e = &by_class[k as usize].enc[symbol(r) as usize];
        debug_assert!(e.x_max > 0, "symbol of class {k} without frequency");
        let x = &mut x[i & (ways - 1)];
        while *x >= e.x_max {
            rev.push(*x as u8);
            *x >>= 8;
        }
        *x = e.put(*x);
    }
    // (reversed below: state 0 first, each big-endian)
    for x in x[..ways].iter().rev() {
        rev.extend_from_slice(&x.to_le_bytes());
    }
    rev.reverse();
    let mut big = Vec::new();
    for &r in res {
        if symbol(r) == SYM_BIG {
            put_varint(zigzag(r), &mut big);
        }
    }
    let mut out = Vec::with_capacity(4 + rev.len() + raw.len() * T::SIZE + big.len() + 3);
    out.extend_from_slice(&(rev.len() as u32).to_le_bytes());
    out.extend_from_slice(&rev);
    for &v in raw {
        v.write_le(&mut out);
    }
    out.extend_from_slice(&big);
    out.resize(out.len().next_multiple_of(4), 0);
    out
}

/// Decode a chunk written by [`write_chunk`] with `ways` interleaved states into `res` (classes
/// `cls`; lossless values as [`LOSSLESS`], appended to `raw`). Every byte is checked: the rANS
/// bytes are consumed exactly and every final state is the encoder's initial one, a big residual
/// is beyond `±RADIUS` and its varint minimal, the padding is zero.
pub(crate) fn read_chunk<T: Element>(
    c: &[u8],
    cls: &[u8],
    map: &[u8],
    tables: &[Table],
    res: &mut [i64],
    raw: &mut Vec<T>,
    ways: usize,
) -> Result<()> {
    debug_assert!(known_ways(ways), "{ways} interleaved rANS states");
    let n_bytes = c
        .get(0..4)
        .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize)
        .ok_or_else(|| Error::corrupt("chunk shorter than its rANS byte count"))?;
    let bytes = c
        .get(4..4 + n_bytes)
        .filter(|b| b.len() >= 4 * ways)
        .ok_or_else(|| Error::corrupt("rANS bytes run past the chunk"))?;
    let mut x = [RANS_L; WAYS];
    for (w, x) in x[..ways].iter_mut().enumerate() {
        *x = u32::from_be_bytes(bytes[4 * w..4 * w + 4].try_into().expect("4 bytes"));
    }
    let mut pos = 4 * ways;
    let mask = PROB_SCALE - 1;
    let by_class: Vec<&Table> = map.iter().map(|&t| &tables[t as usize]).collect();
    let mut n_raw = 0usize;
    let mut bigs = Vec::new();
    for (i, (dst, &k)) in res.iter_mut().zip(cls).enumerate() {
        let t = by_class[k as usize];
        let x = &mut x[i & (ways - 1)];
        let sl = *x & mask;
        let s = t.slot[sl as usize];
        let st = t.step[sl as usize];
        // (x = f (x >> 14) + sl - cum < 2^32: no overflow)
        *x = (st >> 16) * (*x >> PROB_BITS) + (st & 0xFFFF);
        while *x < RANS_L {
            let b = *bytes
                .get(pos)
                .ok_or_else(|| Error::corrupt("rANS bytes end before the values"))?;
            *x = (*x << 8) | b as u32;
            pos += 1;
        }
        *dst = if s == SYM_LOSSLESS {
            n_raw += 1;
            LOSSLESS
        } else if s == SYM_BIG {
            bigs.push(i);
            0
        } else {
            s as i64 - RADIUS
        };
    }
    if x[..ways].iter().any(|&x| x != RANS_L) || pos != bytes.len() {
        return Err(Error::corrupt("rANS stream longer than its values"));
    }
    super::entropy::read_chunk_tail(c, 4 + n_bytes, n_raw, &bigs, res, raw)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalized_tables_sum_to_the_scale() {
        let mut h = vec![0u64; NSYM];
        assert_eq!(normalize(&h).iter().sum::<u32>(), PROB_SCALE);
        h[3] = 1;
        assert_eq!(normalize(&h)[3], PROB_SCALE);
        // many rare symbols beside a dominant one: every used symbol keeps a slot
        for (i, x) in h.iter_mut().enumerate() {
            *x = if i == RADIUS as usize { 1 << 40 } else { 1 };
        }
        let f = normalize(&h);
        assert_eq!(f.iter().sum::<u32>(), PROB_SCALE);
        assert!(f.iter().all(|&v| v >= 1));
        let mut b = Vec::new();
        write_table(&f, &mut b);
        let mut pos = 0;
        let back = read_table(&b, &mut pos).unwrap();
        assert_eq!((back, pos), (f.clone(), b.len()));
        let t = Table::new(&f);
        let back: Vec<u32> = t.enc.iter().map(|e| e.x_max >> 17).collect();
        assert_eq!(back, f);
        // a device encoder's words are the table's
        let words: Vec<[u32; 5]> = t
            .enc
            .iter()
            .map(|e| [e.x_max, e.rcp, e.rcp_shift, e.bias, e.cmpl])
            .collect();
        assert_eq!(encoder_words(&f), words);
    }

    /// The normalization and the pricing of a group as first written, over every symbol of a
    /// dense histogram (128-bit shares, every symbol's cost summed): the reference of
    /// [`Hist`]'s, which visit only the used symbols.
    fn dense_reference(h: &[u64]) -> (Vec<u32>, f64) {
        let total: u128 = h.iter().map(|&x| x as u128).sum();
        let mut f = vec![0u32; NSYM];
        if total == 0 {
            f[RADIUS as usize] = PROB_SCALE;
            return (f, f64::NAN);
        }
        for (fi, &hi) in f.iter_mut().zip(h) {
            if hi > 0 {
                let q = (hi as u128 * PROB_SCALE as u128 + total / 2) / total;
                *fi = (q as u32).max(1);
            }
        }
        // (the settling of the rounding, shared: the same on the used symbols' frequencies in
        // symbol order whether or not the unused ones sit between them)
        let diff = PROB_SCALE as i64 - f.iter().map(|&x| x as i64).sum::<i64>();
        let used: Vec<usize> = (0..NSYM).filter(|&i| f[i] > 0).collect();
        let mut fu: Vec<u32> = used.iter().map(|&i| f[i]).collect();
        settle(&mut fu, diff);
        for (&i, &v) in used.iter().zip(&fu) {
            f[i] = v;
        }
        let len = code_lengths();
        let coded: f64 = h
            .iter()
            .zip(&f)
            .filter(|(&c, _)| c > 0)
            .map(|(&c, &fi)| c as f64 * len[fi as usize])
            .sum();
        let mut b = Vec::new();
        write_table(&f, &mut b);
        (f, coded + 8.0 * b.len() as f64)
    }

    /// The sparse normalization and pricing equal the dense reference bit for bit, merged
    /// histograms included: on level-like histograms, on a dominant symbol among many rare ones
    /// (the deficit spread over several symbols), on counts past 2^49 (the 128-bit share), on
    /// single symbols and on random sparse ones.
    #[test]
    fn sparse_pricing_equals_the_dense_reference() {
        let mut cases: Vec<Vec<u64>> = level_histograms(28, 7);
        let mut rare = vec![1u64; NSYM];
        rare[RADIUS as usize] = 1 << 40;
        cases.push(rare);
        let mut huge = vec![0u64; NSYM];
        (huge[0], huge[500], huge[1024]) = (1 << 60, 3 << 50, 12_345);
        cases.push(huge);
        for s in [0usize, 511, 1023, 1024] {
            let mut one = vec![0u64; NSYM];
            one[s] = 9;
            cases.push(one);
        }
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        for _ in 0..40 {
            let h: Vec<u64> = (0..NSYM)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    if x % 11 == 0 {
                        x >> (20 + x % 44)
                    } else {
                        0
                    }
                })
                .collect();
            cases.push(h);
        }
        let used: Vec<Vec<u64>> = cases
            .into_iter()
            .filter(|h| h.iter().any(|&c| c > 0))
            .collect();
        for (k, h) in used.iter().enumerate() {
            let sparse = Hist::from_dense(h);
            let (f, bits) = dense_reference(h);
            assert_eq!(normalize(h), f, "case {k}");
            assert_eq!(sparse.group_bits().to_bits(), bits.to_bits(), "case {k}");
            let other = &used[(k * 7 + 3) % used.len()];
            let both: Vec<u64> = h.iter().zip(other).map(|(a, b)| a + b).collect();
            let merged = sparse.merged(&Hist::from_dense(other));
            assert_eq!(merged, Hist::from_dense(&both), "case {k}");
            assert_eq!(
                merged.group_bits().to_bits(),
                dense_reference(&both).1.to_bits()
            );
        }
        assert_eq!(normalize(&[])[RADIUS as usize], PROB_SCALE);
    }

    /// The encoder's multiplication by a reciprocal gives the state of the division form for
    /// every frequency and for states across the whole range a symbol is coded at.
    #[test]
    fn reciprocal_step_equals_division() {
        for f in 1..=PROB_SCALE {
            let cum = (f * 7919) % (PROB_SCALE - f + 1);
            let e = EncSym::new(f, cum);
            let x_max = ((RANS_L >> PROB_BITS) << 8) * f;
            assert_eq!(e.x_max, x_max);
            let lo = (x_max >> 8).max(1);
            let span = (x_max - lo) as u64;
            for k in 0..64u64 {
                let x = lo + (span * k / 64) as u32;
                for x in [x, x_max - 1 - (k as u32 % (x_max - lo))] {
                    let want = ((x / f) << PROB_BITS) + x % f + cum;
                    assert_eq!(e.put(x), want, "f {f} x {x}");
                }
            }
        }
    }

    #[test]
    fn bad_tables_are_errors() {
        for b in [
            &[0u8][..],
            &[1, 0, 0x80],
            &[1, 0, 0xff, 0x7e],       // 16,383 of 16,384
            &[2, 0, 0xff, 0x7f, 0, 0], // 16,385
            &[1, 0x81, 0x08, 0xff, 0x7f],
            &[1],
        ] {
            assert!(read_table(b, &mut 0).is_err(), "{b:?}");
        }
    }

    /// The grouping's table size is the length [`write_table`] writes, for tables with one
    /// symbol, every symbol, wide gaps and frequencies around the varint byte boundaries.
    #[test]
    fn table_len_is_the_written_length() {
        let mut cases: Vec<Vec<u32>> = vec![normalize(&[])];
        let mut one = vec![0u64; NSYM];
        one[NSYM - 1] = 5;
        cases.push(normalize(&one));
        cases.push(normalize(&vec![1u64; NSYM]));
        for seed in 1..20u64 {
            for h in level_histograms(1 + seed as usize % 28, seed) {
                cases.push(normalize(&h));
            }
        }
        let mut f = vec![0u32; NSYM];
        (f[0], f[127], f[128], f[1024]) = (1, 128, 129, PROB_SCALE - 258);
        cases.push(f);
        for f in cases {
            let mut b = Vec::new();
            write_table(&f, &mut b);
            assert_eq!(table_len(&f), b.len(), "{f:?}");
        }
    }

    /// The count of symbol `s` in `h`.
    fn dense_count(h: &Hist, s: usize) -> u64 {
        h.sym
            .iter()
            .position(|&x| x as usize == s)
            .map_or(0, |k| h.count[k])
    }

    /// The grouping as first written (every pair priced again in every round): the reference
    /// of [`group_classes`], which must choose exactly the same groups.
    fn group_classes_reference(hist: &[Vec<u64>]) -> (Vec<u8>, Vec<Vec<u32>>) {
        let mut groups = single_groups(hist);
        loop {
            let mut best: Option<(f64, usize, usize, Hist, f64)> = None;
            for i in 0..groups.len() {
                for j in i + 1..groups.len() {
                    // (merged through dense histograms: the reference of `Hist::merged` too)
                    let dense: Vec<u64> = (0..NSYM)
                        .map(|s| dense_count(&groups[i].1, s) + dense_count(&groups[j].1, s))
                        .collect();
                    let h = Hist::from_dense(&dense);
                    let bits = h.group_bits();
                    let save = groups[i].2 + groups[j].2 - bits;
                    if save > 0.0 && best.as_ref().map_or(true, |b| save > b.0) {
                        best = Some((save, i, j, h, bits));
                    }
                }
            }
            let Some((_, i, j, h, bits)) = best else {
                break;
            };
            let (cj, _, _) = groups.remove(j);
            groups[i].0.extend(cj);
            groups[i].1 = h;
            groups[i].2 = bits;
        }
        group_tables(&groups, hist.len())
    }

    /// `n` class histograms shaped like a 3-D array's interpolation levels: two-sided
    /// geometric residuals whose width falls from the coarse classes to the fine ones, some
    /// classes unused, some lossless and big symbols, from `seed`.
    fn level_histograms(n: usize, seed: u64) -> Vec<Vec<u64>> {
        let mut x = seed | 1;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        (0..n)
            .map(|k| {
                let mut h = vec![0u64; NSYM];
                if rnd() % 9 == 0 {
                    return h;
                }
                let width = 1.0 + 200.0 / (1.0 + k as f64) * (1.0 + (rnd() % 100) as f64 / 50.0);
                let count = 1u64 << (6 + k % 18);
                for s in -(RADIUS)..=RADIUS {
                    let p = (-(s.abs() as f64) / width).exp();
                    h[(s + RADIUS) as usize] = (count as f64 * p) as u64;
                }
                h[SYM_LOSSLESS as usize] = rnd() % 4;
                h[SYM_BIG as usize] = rnd() % 50;
                h
            })
            .collect()
    }

    /// The kept pair estimates choose exactly the groups (and tables) of pricing every pair
    /// in every round, on 3-D-like class histograms and on random ones.
    #[test]
    fn grouping_with_kept_pair_estimates_equals_the_reference() {
        for seed in 1..40u64 {
            let n = 1 + (seed as usize * 7) % 28;
            let h = level_histograms(n, seed);
            assert_eq!(
                group_classes(&h),
                group_classes_reference(&h),
                "seed {seed}, {n} classes"
            );
        }
        for seed in 1..20u64 {
            let mut x = seed;
            let h: Vec<Vec<u64>> = (0..12)
                .map(|_| {
                    (0..NSYM)
                        .map(|_| {
                            x = x
                                .wrapping_mul(6364136223846793005)
                                .wrapping_add(1442695040888963407);
                            if (x >> 60) < 3 {
                                x >> 50
                            } else {
                                0
                            }
                        })
                        .collect()
                })
                .collect();
            assert_eq!(
                group_classes(&h),
                group_classes_reference(&h),
                "random seed {seed}"
            );
        }
    }

    #[test]
    fn chunks_round_trip_and_reject_changes() {
        let res: Vec<i64> = (0..40_000i64)
            .map(|i| match i % 17 {
                0 => 3,
                1 => -700,
                2 => i64::MAX,
                3 => LOSSLESS,
                4 => i64::MIN + 1,
                5..=8 => (i % 5) - 2,
                _ => 0,
            })
            .collect();
        let cls: Vec<u8> = (0..res.len()).map(|i| (i % 3 == 0) as u8).collect();
        let mut hist = vec![vec![0u64; NSYM]; 2];
        for (&r, &k) in res.iter().zip(&cls) {
            hist[k as usize][symbol(r) as usize] += 1;
        }
        let (map, freqs) = group_classes(&hist);
        let tabs = tables(&freqs);
        let raw: Vec<f64> = (0..res.iter().filter(|&&r| r == LOSSLESS).count())
            .map(|i| f64::NAN + i as f64)
            .collect();
        for ways in [1, WAYS_CODER_2, WAYS] {
            let c = write_chunk::<f64>(&res, &cls, &map, &tabs, &raw, ways);
            let read = |c: &[u8], back: &mut [i64], raw: &mut Vec<f64>, ways| {
                read_chunk::<f64>(c, &cls, &map, &tabs, back, raw, ways)
            };
            let mut back = vec![7i64; res.len()];
            let mut raw_back = Vec::new();
            read(&c, &mut back, &mut raw_back, ways).unwrap();
            assert_eq!(back, res);
            assert_eq!(raw_back.len(), raw.len());
            for n in (0..c.len()).step_by(4) {
                let mut b2 = vec![0; res.len()];
                assert!(read(&c[..n], &mut b2, &mut Vec::new(), ways).is_err());
            }
            for i in (0..c.len()).step_by(7) {
                let mut m = c.clone();
                m[i] ^= 0x10;
                let mut b2 = vec![0; res.len()];
                let _ = read(&m, &mut b2, &mut Vec::new(), ways);
            }
            let mut longer = c.clone();
            longer.extend([0, 0, 0, 0]);
            assert!(read(&longer, &mut back, &mut Vec::new(), ways).is_err());
            // a stream read with another number of states is rejected
            for other in [1, WAYS_CODER_2, WAYS].into_iter().filter(|&o| o != ways) {
                assert!(
                    read(&c, &mut back, &mut Vec::new(), other).is_err(),
                    "{ways} {other}"
                );
            }
        }
        // an all-zero chunk of one class costs almost nothing: the count and the states
        let zeros = vec![0i64; 32_768];
        let zc = vec![0u8; zeros.len()];
        let mut h = vec![vec![0u64; NSYM]];
        h[0][RADIUS as usize] = zeros.len() as u64;
        let (map, freqs) = group_classes(&h);
        for ways in [1, WAYS_CODER_2, WAYS] {
            let c = write_chunk::<f32>(&zeros, &zc, &map, &tables(&freqs), &[], ways);
            assert!(c.len() <= 4 + 4 * ways, "{}", c.len());
        }
    }

    #[test]
    fn short_chunks_use_the_first_states_only() {
        // fewer residuals than states: the unused states stay at L and are checked as such
        let mut h = vec![vec![0u64; NSYM]];
        h[0][RADIUS as usize] = 3;
        h[0][RADIUS as usize + 1] = 1;
        let (map, freqs) = group_classes(&h);
        let tabs = tables(&freqs);
        for ways in [WAYS_CODER_2, WAYS] {
            for n in 0..=2 * ways + 1 {
                let res: Vec<i64> = (0..n as i64).map(|i| i % 2).collect();
                let cls = vec![0u8; n];
                let c = write_chunk::<f32>(&res, &cls, &map, &tabs, &[], ways);
                let mut back = vec![9i64; n];
                read_chunk::<f32>(&c, &cls, &map, &tabs, &mut back, &mut Vec::new(), ways).unwrap();
                assert_eq!(back, res);
            }
        }
    }
}
