//! The `pfpl` chunk layout (FORMAT.md, "pfpl chunks"): CPU encoder and decoder.
//!
//! A PFPL-style pipeline (IPDPS'25), fused per 16 KiB chunk:
//!
//! 1. **quantize in place**: each value becomes one *word* of the float's width. A value the
//!    verified quantizer ([`Quantizer::encode`]) accepts becomes a small bin word that lives in a
//!    range of bit patterns no lossless value can take (the positive denormals for abs/noa, the
//!    negative NaNs for rel); any other value keeps its own bits, so no outlier list is needed;
//! 2. **difference coding** of the words (wrapping), each difference written in **negabinary**;
//! 3. **bit shuffle** within groups of 32 (f32) / 64 (f64) words: plane `j` of a group holds bit
//!    `j` of every difference; the planes are stored plane-major over the chunk (plane 0 of every
//!    group, then plane 1, ...), so the all-zero high planes form one long zero run;
//! 4. **zero-byte elimination**: a bitmap of the non-zero bytes, itself compressed three more times
//!    by keeping only the bytes that differ from their predecessor.
//!
//! A chunk whose compressed form would not be smaller than its values is stored raw; a chunk whose
//! shuffled bytes are all zero costs nothing but its 2-byte table entry. Chunk payloads are
//! byte-aligned and unpadded; one data checksum in the header covers them all. Chunks are
//! independent, so both directions run in parallel over chunks (rayon).

use rayon::prelude::*;

use crate::codec::blocked::Body;
use crate::element::Element;
use crate::error::{Error, Result};
use crate::format::{data_checksum, pfpl_table, zhash_bytes, BoundMode, ChunkEntry, Dtype, Header};
use crate::quant::{QuantParams, Quantizer};
use crate::simd::simd;

/// Uncompressed bytes per chunk (both dtypes).
pub const CHUNK_BYTES: usize = 16 * 1024;
/// Bitmap levels of the zero-byte elimination (the first marks non-zero bytes, the other three
/// mark bytes that differ from their predecessor).
pub const LEVELS: usize = 4;

/// The header's `chunk_log2` for `pfpl` streams of `dtype`: 12 (4,096 f32) or 11 (2,048 f64), so
/// that every chunk holds 16 KiB of values.
pub fn chunk_log2(dtype: Dtype) -> u16 {
    match dtype {
        Dtype::F32 => 12,
        Dtype::F64 => 11,
    }
}

/// Values per chunk for `T`.
#[inline]
pub fn chunk_len<T: Element>() -> usize {
    CHUNK_BYTES / T::SIZE
}

/// Bits per word (32 / 64); also the number of words in a shuffle group.
#[inline(always)]
fn width<T: Element>() -> usize {
    T::SIZE * 8
}

/// Mantissa bits: bin words are exactly the words below `2^mant`.
#[inline(always)]
fn mant<T: Element>() -> u32 {
    if T::SIZE == 4 {
        23
    } else {
        52
    }
}

/// All-ones mask of the word width.
#[inline(always)]
fn wmask<T: Element>() -> u64 {
    if T::SIZE == 4 {
        0xFFFF_FFFF
    } else {
        u64::MAX
    }
}

/// The negabinary mask `0b1010…10` of the word width.
#[inline(always)]
fn nbmask<T: Element>() -> u64 {
    0xAAAA_AAAA_AAAA_AAAA & wmask::<T>()
}

/// Sign and exponent bits: rel words of lossless values are their bits XOR this.
#[inline(always)]
fn flip<T: Element>() -> u64 {
    if T::SIZE == 4 {
        0xFF80_0000
    } else {
        0xFFF0_0000_0000_0000
    }
}

#[inline(always)]
fn zigzag(d: i64) -> u64 {
    ((d << 1) ^ (d >> 63)) as u64
}

#[inline(always)]
fn unzigzag(z: u64) -> i64 {
    ((z >> 1) as i64) ^ -((z & 1) as i64)
}

/// Negabinary form of a `T`-width two's-complement difference.
#[inline(always)]
fn to_negabinary<T: Element>(d: u64) -> u64 {
    let m = nbmask::<T>();
    (d.wrapping_add(m) ^ m) & wmask::<T>()
}

/// Inverse of [`to_negabinary`].
#[inline(always)]
fn from_negabinary<T: Element>(v: u64) -> u64 {
    let m = nbmask::<T>();
    (v ^ m).wrapping_sub(m) & wmask::<T>()
}

/// Maps values to words and back (FORMAT.md, "pfpl words").
#[derive(Clone, Copy)]
struct Mapper<T: Element> {
    q: Quantizer<T>,
    rel: bool,
    qhalf: i64,
    /// The quantizer's step in the dtype (abs/noa reconstruction is `q * step`).
    step: T,
}

impl<T: Element> Mapper<T> {
    fn new(params: &QuantParams) -> Self {
        Mapper {
            q: params.quantizer::<T>(),
            rel: params.mode == BoundMode::Rel,
            qhalf: (T::QMAX / 2.0) as i64,
            step: T::from_f64(params.step),
        }
    }

    /// [`Mapper::value`] of every word; abs/noa groups of bin words take a vectorizable path
    /// (bins are below `2^(M-1)` in magnitude, so their conversion to the dtype is exact and
    /// `q * step` equals [`Quantizer::decode`] bit for bit; a test checks this).
    #[inline(always)]
    fn values(&self, words: &[u64], out: &mut [T]) {
        let lim = 1u64 << mant::<T>();
        for (ws, os) in words.chunks(32).zip(out.chunks_mut(32)) {
            if !self.rel && ws.iter().fold(0, |a, &w| a | w) < lim {
                for (o, &w) in os.iter_mut().zip(ws) {
                    let q = unzigzag(w);
                    let qf = if T::SIZE == 4 {
                        (q as i32) as f64
                    } else {
                        // |q| < 2^51: exact through the 1.5 * 2^52 bias
                        f64::from_bits(0x4338_0000_0000_0000u64.wrapping_add(q as u64))
                            - 6_755_399_441_055_744.0
                    };
                    *o = T::from_f64(qf).mul(self.step);
                }
            } else {
                for (o, &w) in os.iter_mut().zip(ws) {
                    *o = self.value(w);
                }
            }
        }
    }

    /// The word of `x`, or `None` when `x` must be kept losslessly but its bits fall in the bin
    /// range (the chunk is then stored raw).
    #[inline(always)]
    fn word(&self, x: T) -> Option<u64> {
        let lim = 1u64 << mant::<T>();
        if let Some(c) = self.q.encode(x) {
            if self.rel {
                if c == 0 {
                    return Some(0);
                }
                let z = zigzag(c.unsigned_abs() as i64 - self.qhalf);
                if z < (lim >> 1) - 1 {
                    return Some(1 + ((z << 1) | (c < 0) as u64));
                }
            } else {
                let z = zigzag(c);
                if z < lim {
                    return Some(z);
                }
            }
        }
        let b = x.to_bits_u64();
        let w = if self.rel { b ^ flip::<T>() } else { b };
        (w >= lim).then_some(w)
    }

    /// The value of word `w` (any `T`-width word decodes to something).
    #[inline(always)]
    fn value(&self, w: u64) -> T {
        let lim = 1u64 << mant::<T>();
        if w < lim {
            let c = if self.rel {
                if w == 0 {
                    0
                } else {
                    let v = w - 1;
                    let m = unzigzag(v >> 1) + self.qhalf;
                    if v & 1 != 0 {
                        -m
                    } else {
                        m
                    }
                }
            } else {
                unzigzag(w)
            };
            self.q.decode(c)
        } else {
            T::from_bits_u64(if self.rel { w ^ flip::<T>() } else { w })
        }
    }
}

/// Bit-matrix transpose of `a` (`a.len()` words of `a.len()` bits): afterwards bit `k` of word `j`
/// is bit `j` of the original word `k`. Its own inverse. (Reference for the fixed-size versions.)
#[cfg(test)]
fn transpose(a: &mut [u64]) {
    const MASKS: [u64; 6] = [
        0x5555_5555_5555_5555,
        0x3333_3333_3333_3333,
        0x0F0F_0F0F_0F0F_0F0F,
        0x00FF_00FF_00FF_00FF,
        0x0000_FFFF_0000_FFFF,
        0x0000_0000_FFFF_FFFF,
    ];
    let w = a.len();
    let mut s = w / 2;
    let mut lvl = w.trailing_zeros() as usize;
    while s >= 1 {
        lvl -= 1;
        let m = MASKS[lvl];
        let mut r = 0;
        while r < w {
            for i in r..r + s {
                let (x, y) = (a[i], a[i + s]);
                let t = ((x >> s) ^ y) & m;
                a[i + s] = y ^ t;
                a[i] = x ^ (t << s);
            }
            r += 2 * s;
        }
        s /= 2;
    }
}

macro_rules! fixed_transpose {
    ($name:ident, $t:ty, $w:expr, [$($s:expr => $m:expr),*]) => {
        /// [`transpose`] for one full group of this width (fixed trip counts, vectorizable).
        #[inline(always)]
        fn $name(a: &mut [$t; $w]) {
            $(
                let mut r = 0;
                while r < $w {
                    for i in r..r + $s {
                        let (x, y) = (a[i], a[i + $s]);
                        let t = ((x >> $s) ^ y) & $m;
                        a[i + $s] = y ^ t;
                        a[i] = x ^ (t << $s);
                    }
                    r += 2 * $s;
                }
            )*
        }
    };
}
fixed_transpose!(transpose32, u32, 32, [
    16 => 0x0000_FFFF, 8 => 0x00FF_00FF, 4 => 0x0F0F_0F0F, 2 => 0x3333_3333, 1 => 0x5555_5555
]);
fixed_transpose!(transpose64, u64, 64, [
    32 => 0x0000_0000_FFFF_FFFF, 16 => 0x0000_FFFF_0000_FFFF, 8 => 0x00FF_00FF_00FF_00FF,
    4 => 0x0F0F_0F0F_0F0F_0F0F, 2 => 0x3333_3333_3333_3333, 1 => 0x5555_5555_5555_5555
]);

/// Byte lengths of the shuffled data and of the four bitmaps.
#[inline]
fn level_lens(l0: usize) -> [usize; LEVELS + 1] {
    let mut l = [l0; LEVELS + 1];
    for i in 1..=LEVELS {
        l[i] = l[i - 1].div_ceil(8);
    }
    l
}

#[derive(Default)]
struct Scratch {
    words: Vec<u64>,
    bytes: Vec<u8>,
    maps: [Vec<u8>; LEVELS],
    kept: [Vec<u8>; LEVELS],
}

/// Encode `data` into a chunk table (u16 sizes) and byte-aligned chunk payloads (in parallel
/// over chunks). Returns them with the stream's data checksum (header offset 80).
pub fn encode<T: Element>(data: &[T], params: &QuantParams) -> (Body, u32) {
    let m = Mapper::<T>::new(params);
    let chunks: Vec<(Vec<u8>, u32)> = data
        .par_chunks(chunk_len::<T>())
        .map_init(Scratch::default, |s, c| {
            let chunk = simd(
                #[inline(always)]
                || encode_chunk(c, &m, s),
            );
            let hash = zhash_bytes(&chunk);
            (chunk, hash)
        })
        .collect();
    let mut payload = pfpl_table(chunks.iter().map(|c| c.0.len()));
    let table_checksum = zhash_bytes(&payload);
    payload.reserve_exact(chunks.iter().map(|c| c.0.len()).sum());
    for (c, _) in &chunks {
        payload.extend_from_slice(c);
    }
    let hashes: Vec<u32> = chunks.iter().map(|c| c.1).collect();
    let body = Body {
        payload,
        n_chunks: chunks.len() as u32,
        table_checksum,
    };
    (body, data_checksum(&hashes))
}

#[inline(always)]
fn raw_chunk<T: Element>(vals: &[T]) -> Vec<u8> {
    let mut out = Vec::with_capacity(vals.len() * T::SIZE);
    for &x in vals {
        x.write_le(&mut out);
    }
    out
}

#[inline(always)]
fn encode_chunk<T: Element>(vals: &[T], m: &Mapper<T>, s: &mut Scratch) -> Vec<u8> {
    let n = vals.len();
    let g = width::<T>();
    let padded = n.div_ceil(g) * g;
    // 1 + 2: words, differences, negabinary (padding differences are 0)
    s.words.clear();
    s.words.resize(padded, 0);
    if !map_words(vals, m, &mut s.words) {
        return raw_chunk(vals);
    }
    // 3: bit shuffle, planes written little-endian
    shuffle::<T>(&mut s.words, &mut s.bytes);
    // 4: zero-byte elimination
    let mut out = Vec::new();
    if !ze_encode(s, &mut out) {
        return out; // all zero: empty chunk
    }
    if out.len() >= n * T::SIZE {
        return raw_chunk(vals);
    }
    out
}

/// Words, differences and negabinary of `vals` into `out[..vals.len()]`; false on a collision.
#[inline(always)]
fn map_words<T: Element>(vals: &[T], m: &Mapper<T>, out: &mut [u64]) -> bool {
    let lim = 1u64 << mant::<T>();
    let mut prev = 0u64;
    let mut codes = [0i64; 32];
    let mut words = [0u64; 32];
    for (xs, os) in vals.chunks(32).zip(out.chunks_mut(32)) {
        let len = xs.len();
        // fast path (abs/noa): the quantizer's vectorized layer encoder, all codes in range
        let mut fast = !m.rel && m.q.encode_layer(xs, &mut codes[..len]);
        if fast {
            for (w, &c) in words.iter_mut().zip(&codes[..len]) {
                let z = zigzag(c);
                fast &= z < lim;
                *w = z;
            }
        }
        if !fast {
            for (w, &x) in words.iter_mut().zip(xs) {
                let Some(v) = m.word(x) else {
                    return false;
                };
                *w = v;
            }
        }
        for (o, &w) in os.iter_mut().zip(&words[..len]) {
            *o = to_negabinary::<T>(w.wrapping_sub(prev));
            prev = w;
        }
    }
    true
}

/// Bit shuffle of whole groups of `words` into little-endian plane bytes, plane-major: plane `p`
/// of group `g` is plane word `p * G + g` (`G` groups), so each plane of the chunk is contiguous.
/// The groups are transposed in place (`words[g W + p]` = plane `p` of group `g`), then written
/// out one plane at a time.
#[inline(always)]
fn shuffle<T: Element>(words: &mut [u64], bytes: &mut Vec<u8>) {
    bytes.clear();
    bytes.resize(words.len() * T::SIZE, 0);
    let groups = words.len() / width::<T>();
    if T::SIZE == 4 {
        for grp in words.chunks_exact_mut(32) {
            let mut a = [0u32; 32];
            for (x, &w) in a.iter_mut().zip(grp.iter()) {
                *x = w as u32;
            }
            transpose32(&mut a);
            for (w, x) in grp.iter_mut().zip(a) {
                *w = x as u64;
            }
        }
        for (p, row) in bytes.chunks_exact_mut(groups * 4).enumerate() {
            for (o, grp) in row.chunks_exact_mut(4).zip(words.chunks_exact(32)) {
                o.copy_from_slice(&(grp[p] as u32).to_le_bytes());
            }
        }
    } else {
        for grp in words.chunks_exact_mut(64) {
            let a: &mut [u64; 64] = grp.try_into().expect("64 words");
            transpose64(a);
        }
        for (p, row) in bytes.chunks_exact_mut(groups * 8).enumerate() {
            for (o, grp) in row.chunks_exact_mut(8).zip(words.chunks_exact(64)) {
                o.copy_from_slice(&grp[p].to_le_bytes());
            }
        }
    }
}

/// Inverse of [`shuffle`]: plane-major plane bytes of whole groups back into words (gathered
/// one plane at a time into `words[g W + p]`, then transposed in place).
#[inline(always)]
fn unshuffle<T: Element>(bytes: &[u8], words: &mut [u64]) {
    let groups = words.len() / width::<T>();
    if T::SIZE == 4 {
        for (p, row) in bytes.chunks_exact(groups * 4).enumerate() {
            for (c, grp) in row.chunks_exact(4).zip(words.chunks_exact_mut(32)) {
                grp[p] = u32::from_le_bytes(c.try_into().expect("4 bytes")) as u64;
            }
        }
        for grp in words.chunks_exact_mut(32) {
            let mut a = [0u32; 32];
            for (x, &w) in a.iter_mut().zip(grp.iter()) {
                *x = w as u32;
            }
            transpose32(&mut a);
            for (w, x) in grp.iter_mut().zip(a) {
                *w = x as u64;
            }
        }
    } else {
        for (p, row) in bytes.chunks_exact(groups * 8).enumerate() {
            for (c, grp) in row.chunks_exact(8).zip(words.chunks_exact_mut(64)) {
                grp[p] = u64::from_le_bytes(c.try_into().expect("8 bytes"));
            }
        }
        for grp in words.chunks_exact_mut(64) {
            let a: &mut [u64; 64] = grp.try_into().expect("64 words");
            transpose64(a);
        }
    }
}

/// Zero-byte elimination of `s.bytes` into `out`; returns false (writing nothing) when every
/// byte is zero.
#[inline(always)]
fn ze_encode(s: &mut Scratch, out: &mut Vec<u8>) -> bool {
    let lens = level_lens(s.bytes.len());
    // level 0: non-zero bytes
    let (maps, kept) = (&mut s.maps, &mut s.kept);
    select_bytes(&s.bytes, false, &mut maps[0], &mut kept[0]);
    if kept[0].is_empty() {
        return false;
    }
    // levels 1..3: bytes that differ from their predecessor (the one before byte 0 is 0)
    for i in 1..LEVELS {
        let (lo, hi) = maps.split_at_mut(i);
        select_bytes(&lo[i - 1], true, &mut hi[0], &mut kept[i]);
    }
    out.reserve(lens[LEVELS] + kept.iter().map(Vec::len).sum::<usize>());
    out.extend_from_slice(&maps[LEVELS - 1]);
    for i in (0..LEVELS).rev() {
        out.extend_from_slice(&kept[i]);
    }
    true
}

/// One bitmap level: bit `k` of `map` (resized to `ceil(src.len() / 8)` bytes) is set iff
/// `src[k]` is non-zero (`repeat == false`) or differs from `src[k-1]` (`repeat == true`, with
/// `src[-1] = 0`); those bytes are appended to `kept` (cleared first). Eight bytes per step.
#[inline(always)]
fn select_bytes(src: &[u8], repeat: bool, map: &mut Vec<u8>, kept: &mut Vec<u8>) {
    const HI: u64 = 0x8080_8080_8080_8080;
    const LO7: u64 = 0x7F7F_7F7F_7F7F_7F7F;
    map.clear();
    map.resize(src.len().div_ceil(8), 0);
    kept.clear();
    let mut prev = 0u64; // previous byte (repeat mode), in the low 8 bits
    let mut words = src.chunks_exact(8);
    for (m, c) in map.iter_mut().zip(&mut words) {
        let v = u64::from_le_bytes(c.try_into().expect("8 bytes"));
        let x = if repeat { v ^ ((v << 8) | prev) } else { v };
        prev = v >> 56;
        if x == 0 {
            continue;
        }
        // high bit of each byte of x set iff that byte is non-zero
        let nz = (((x & LO7) + LO7) | x) & HI;
        let bits = ((nz >> 7).wrapping_mul(0x0102_0408_1020_4080) >> 56) as u8;
        *m = bits;
        let mut b = bits;
        while b != 0 {
            kept.push(c[b.trailing_zeros() as usize]);
            b &= b - 1;
        }
    }
    let tail = words.remainder();
    let base = src.len() - tail.len();
    let mut p = prev as u8;
    for (j, &b) in tail.iter().enumerate() {
        let keep = if repeat { b != p } else { b != 0 };
        if keep {
            map[(base + j) >> 3] |= 1 << ((base + j) & 7);
            kept.push(b);
        }
        p = b;
    }
}

/// Decode a validated (header-parsed) pfpl stream into `out` (`out.len() == h.count`). The
/// chunk table and the data checksum are verified before any chunk is decoded.
pub fn decode<T: Element>(
    stream: &[u8],
    h: &Header,
    params: &QuantParams,
    out: &mut [T],
) -> Result<()> {
    let entries = h.chunk_table(stream)?;
    decode_entries(stream, &entries, 0, params, out)
}

/// Decode the chunks `entries` (from [`Header::chunk_table`], whose checks have passed; the first
/// is chunk `first` of the stream) into `out`, which holds exactly their values.
pub fn decode_entries<T: Element>(
    stream: &[u8],
    entries: &[ChunkEntry],
    first: usize,
    params: &QuantParams,
    out: &mut [T],
) -> Result<()> {
    let m = Mapper::<T>::new(params);
    let per = chunk_len::<T>();
    if out.len().div_ceil(per) != entries.len() {
        return Err(Error::corrupt("chunk count does not match the value count"));
    }
    out.par_chunks_mut(per)
        .zip(entries.par_iter())
        .enumerate()
        .map(|(i, x)| (first + i, x))
        .try_for_each_init(Scratch::default, |s, (ci, (dst, e))| {
            simd(
                #[inline(always)]
                || decode_chunk(&stream[e.offset..e.offset + e.size], &m, dst, s),
            )
            .map_err(|err| Error::corrupt(format!("chunk {ci}: {err}")))
        })
}

#[inline(always)]
fn decode_chunk<T: Element>(c: &[u8], m: &Mapper<T>, dst: &mut [T], s: &mut Scratch) -> Result<()> {
    let n = dst.len();
    let raw = n * T::SIZE;
    if c.len() == raw {
        for (d, b) in dst.iter_mut().zip(c.chunks_exact(T::SIZE)) {
            *d = T::read_le(b);
        }
        return Ok(());
    }
    if c.len() > raw {
        return Err(Error::corrupt(format!(
            "{} bytes exceed the raw size {raw}",
            c.len()
        )));
    }
    if c.is_empty() {
        dst.fill(m.value(0));
        return Ok(());
    }
    let g = width::<T>();
    let padded = n.div_ceil(g) * g;
    s.bytes.clear();
    s.bytes.resize(padded * T::SIZE, 0);
    ze_decode(c, s)?;
    // unshuffle
    s.words.clear();
    s.words.resize(padded, 0);
    unshuffle::<T>(&s.bytes, &mut s.words);
    if s.words[n..].iter().any(|&v| v != 0) {
        return Err(Error::corrupt("non-zero differences past the last value"));
    }
    let mut prev = 0u64;
    for v in s.words[..n].iter_mut() {
        prev = prev.wrapping_add(from_negabinary::<T>(*v)) & wmask::<T>();
        *v = prev;
    }
    m.values(&s.words[..n], dst);
    Ok(())
}

/// Reads `len` bytes at `*pos`.
#[inline]
fn take<'a>(c: &'a [u8], pos: &mut usize, len: usize) -> Result<&'a [u8]> {
    let r = c
        .get(*pos..*pos + len)
        .ok_or_else(|| Error::corrupt("truncated chunk"))?;
    *pos += len;
    Ok(r)
}

/// Checks that `map` has no bits set at or past bit `bits`.
#[inline]
fn check_tail(map: &[u8], bits: usize) -> Result<()> {
    let r = bits & 7;
    if r != 0 && map[bits >> 3] >> r != 0 {
        return Err(Error::corrupt("bitmap bits past the end"));
    }
    Ok(())
}

/// Inverse of [`ze_encode`] into `s.bytes` (whose length is the shuffled size); validates every
/// length (the metadata must account for exactly the chunk's bytes).
#[inline(always)]
fn ze_decode(c: &[u8], s: &mut Scratch) -> Result<()> {
    let lens = level_lens(s.bytes.len());
    let mut pos = 0usize;
    let top = take(c, &mut pos, lens[LEVELS])?;
    check_tail(top, lens[LEVELS - 1])?;
    if top.iter().all(|&b| b == 0) {
        // canonical streams keep every non-repeating byte, so a non-empty chunk has a set top bit
        return Err(Error::corrupt("an all-zero chunk must be empty"));
    }
    let maps = &mut s.maps;
    maps[LEVELS - 1].clear();
    maps[LEVELS - 1].extend_from_slice(top);
    // levels 3..1: rebuild the lower bitmap from the upper one and the kept bytes
    for i in (1..LEVELS).rev() {
        let (lo, hi) = maps.split_at_mut(i);
        let upper = &hi[0];
        let lower = &mut lo[i - 1];
        let len = lens[i];
        let n_kept = upper.iter().map(|b| b.count_ones() as usize).sum::<usize>();
        let kept = take(c, &mut pos, n_kept)?;
        lower.clear();
        lower.resize(len, 0);
        let mut it = kept.iter();
        let mut prev = 0u8;
        for (k, l8) in lower.chunks_mut(8).enumerate() {
            let bits = upper[k];
            if bits == 0 {
                l8.fill(prev); // eight repeats
                continue;
            }
            for (j, l) in l8.iter_mut().enumerate() {
                if bits >> j & 1 != 0 {
                    let b = *it.next().expect("counted");
                    if b == prev {
                        return Err(Error::corrupt("a kept bitmap byte repeats its predecessor"));
                    }
                    prev = b;
                }
                *l = prev;
            }
        }
        check_tail(lower, lens[i - 1])?;
    }
    // level 0: the non-zero bytes
    let map = &maps[0];
    let n_nz = map.iter().map(|b| b.count_ones() as usize).sum::<usize>();
    let nz = take(c, &mut pos, n_nz)?;
    if nz.contains(&0) {
        return Err(Error::corrupt("a kept data byte is zero"));
    }
    let mut it = nz.iter();
    for (k, &mb) in map.iter().enumerate() {
        let mut bits = mb;
        while bits != 0 {
            let j = bits.trailing_zeros() as usize;
            s.bytes[k * 8 + j] = *it.next().expect("counted");
            bits &= bits - 1;
        }
    }
    if pos != c.len() {
        return Err(Error::corrupt(format!(
            "chunk metadata implies {pos} bytes, table says {}",
            c.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{compress, decompress, inspect, CodecKind};
    use crate::quant::ErrorBound;

    /// xorshift64* generator (deterministic test data).
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn unit(&mut self) -> f64 {
            (self.next() >> 11) as f64 / (1u64 << 53) as f64
        }
        fn gauss(&mut self) -> f64 {
            let (u, v) = (self.unit().max(1e-300), self.unit());
            (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
        }
    }

    fn naive_transpose(a: &[u64]) -> Vec<u64> {
        let w = a.len();
        (0..w)
            .map(|j| (0..w).fold(0u64, |acc, k| acc | (((a[k] >> j) & 1) << k)))
            .collect()
    }

    #[test]
    fn transpose_matches_definition_and_is_an_involution() {
        let mut r = Rng(7);
        for w in [32usize, 64] {
            let mask = if w == 32 { 0xFFFF_FFFF } else { u64::MAX };
            let a: Vec<u64> = (0..w).map(|_| r.next() & mask).collect();
            let mut b = a.clone();
            transpose(&mut b);
            assert_eq!(b, naive_transpose(&a));
            if w == 32 {
                let mut f: [u32; 32] = std::array::from_fn(|i| a[i] as u32);
                transpose32(&mut f);
                assert!(f.iter().zip(&b).all(|(&x, &y)| x as u64 == y));
            } else {
                let mut f: [u64; 64] = a.clone().try_into().unwrap();
                transpose64(&mut f);
                assert_eq!(f.to_vec(), b);
            }
            assert!(b.iter().all(|&x| x & !mask == 0));
            transpose(&mut b);
            assert_eq!(b, a);
        }
    }

    /// The `count` plane words of `D` (G = 2), each `width` bytes little-endian: zero but for the
    /// `(plane, group, word)` entries, at plane word `plane * 2 + group` (the expected shuffle of
    /// a hand-made chunk, f32 and f64 alike).
    fn plane_words_le(count: usize, width: usize, set: &[(usize, usize, u64)]) -> Vec<u8> {
        let mut words = vec![0u64; count];
        for &(p, g, v) in set {
            words[p * 2 + g] = v;
        }
        words
            .iter()
            .flat_map(|w| w.to_le_bytes()[..width].to_vec())
            .collect()
    }

    /// The bit shuffle of `words` as `T`'s words (the input is left as it was), checked to
    /// unshuffle back to `words`.
    fn shuffled_and_back<T: Element>(words: &[u64]) -> Vec<u8> {
        let mut d = Vec::new();
        shuffle::<T>(&mut words.to_vec(), &mut d);
        let mut back = vec![0u64; words.len()];
        unshuffle::<T>(&d, &mut back);
        assert_eq!(back, words);
        d
    }

    /// FORMAT.md "Bit shuffle": plane `p` of group `g` is plane word `p * G + g` of `D`. A short
    /// chunk of 40 (f32) / 70 (f64) values with `u_k = k` (G = 2; padding 0) has hand-computed
    /// planes: group 0 holds the counting pattern, group 1 the values 32..39 / 64..69.
    #[test]
    fn shuffle_is_plane_major_on_a_hand_made_chunk() {
        // f32: G = 2, D = 64 plane words of 4 bytes
        let words: Vec<u64> = (0..64).map(|k| if k < 40 { k } else { 0 }).collect();
        let d = shuffled_and_back::<f32>(&words);
        // (plane, group, word)
        let want = plane_words_le(
            64,
            4,
            &[
                (0, 0, 0xAAAA_AAAA),
                (0, 1, 0xAA), // k' = 1, 3, 5, 7 of 32..39
                (1, 0, 0xCCCC_CCCC),
                (1, 1, 0xCC),
                (2, 0, 0xF0F0_F0F0),
                (2, 1, 0xF0),
                (3, 0, 0xFF00_FF00),
                (4, 0, 0xFFFF_0000),
                (5, 1, 0xFF), // bit 5 of 32..39
            ],
        );
        assert_eq!(d, want);
        // the leading bytes spelled out: plane 0 of groups 0 and 1, then plane 1 of group 0
        assert_eq!(
            d[..12],
            [0xAA, 0xAA, 0xAA, 0xAA, 0xAA, 0, 0, 0, 0xCC, 0xCC, 0xCC, 0xCC]
        );

        // f64: G = 2, D = 128 plane words of 8 bytes
        let words: Vec<u64> = (0..128).map(|k| if k < 70 { k } else { 0 }).collect();
        let d = shuffled_and_back::<f64>(&words);
        let want = plane_words_le(
            128,
            8,
            &[
                (0, 0, 0xAAAA_AAAA_AAAA_AAAA),
                (0, 1, 0x2A), // k' = 1, 3, 5 of 64..69
                (1, 0, 0xCCCC_CCCC_CCCC_CCCC),
                (1, 1, 0x0C),
                (2, 0, 0xF0F0_F0F0_F0F0_F0F0),
                (2, 1, 0x30),
                (3, 0, 0xFF00_FF00_FF00_FF00),
                (4, 0, 0xFFFF_0000_FFFF_0000),
                (5, 0, 0xFFFF_FFFF_0000_0000),
                (6, 1, 0x3F), // bit 6 of 64..69
            ],
        );
        assert_eq!(d, want);

        // an odd group count (G = 3): definition and inverse
        let mut r = Rng(5);
        let words: Vec<u64> = (0..96).map(|_| r.next() as u32 as u64).collect();
        let d = shuffled_and_back::<f32>(&words);
        for p in 0..32 {
            for g in 0..3 {
                let o = (p * 3 + g) * 4;
                let plane = u32::from_le_bytes(d[o..o + 4].try_into().unwrap());
                for k in 0..32 {
                    assert_eq!(plane >> k & 1, (words[g * 32 + k] >> p & 1) as u32);
                }
            }
        }
    }

    #[test]
    fn select_bytes_matches_definition() {
        let mut r = Rng(13);
        for len in [0usize, 1, 7, 8, 9, 15, 16, 17, 64, 100, 2048] {
            for density in [0.0, 0.1, 0.5, 1.0] {
                let src: Vec<u8> = (0..len)
                    .map(|_| {
                        if r.unit() < density {
                            (r.next() % 3) as u8
                        } else {
                            0
                        }
                    })
                    .collect();
                for repeat in [false, true] {
                    let (mut map, mut kept) = (Vec::new(), Vec::new());
                    select_bytes(&src, repeat, &mut map, &mut kept);
                    let mut emap = vec![0u8; len.div_ceil(8)];
                    let mut ekept = Vec::new();
                    let mut prev = 0u8;
                    for (k, &b) in src.iter().enumerate() {
                        if (repeat && b != prev) || (!repeat && b != 0) {
                            emap[k / 8] |= 1 << (k % 8);
                            ekept.push(b);
                        }
                        prev = b;
                    }
                    assert_eq!((map, kept), (emap, ekept), "len {len} repeat {repeat}");
                }
            }
        }
    }

    #[test]
    fn fast_bin_decoding_matches_the_quantizer() {
        fn check<T: Element>(steps: &[f64]) {
            let mut r = Rng(99);
            let lim = 1u64 << mant::<T>();
            for &st in steps {
                let p = QuantParams {
                    mode: BoundMode::Abs,
                    bound_value: st / 2.0,
                    abs_bound: st / 2.0,
                    step: st,
                    range: (0.0, 0.0),
                    fill: None,
                };
                let m = Mapper::<T>::new(&p);
                let mut words: Vec<u64> = vec![0, 1, 2, 3, lim - 1, lim - 2, lim - 3];
                words.extend((0..4000).map(|i| r.next() % if i % 2 == 0 { lim } else { 4096 }));
                words.resize(words.len().next_multiple_of(32), 5);
                let mut fast = vec![T::default(); words.len()];
                m.values(&words, &mut fast);
                for (&w, &f) in words.iter().zip(&fast) {
                    let slow = m.q.decode(unzigzag(w));
                    assert_eq!(f.to_bits_u64(), slow.to_bits_u64(), "word {w:#x} step {st}");
                }
            }
        }
        check::<f32>(&[2e-3, 1.0, 3.0e-38, 1.7e38, 0.1]);
        check::<f64>(&[2e-3, 1.0, 1e-300, 1e300, 0.1]);
    }

    #[test]
    fn negabinary_round_trip_and_small_values_stay_small() {
        for d in [
            0i64,
            1,
            -1,
            2,
            -2,
            5,
            -5,
            1000,
            -1000,
            i32::MAX as i64,
            i32::MIN as i64,
        ] {
            let u32d = (d as u64) & 0xFFFF_FFFF;
            let nb = to_negabinary::<f32>(u32d);
            assert_eq!(from_negabinary::<f32>(nb), u32d);
            let nb64 = to_negabinary::<f64>(d as u64);
            assert_eq!(from_negabinary::<f64>(nb64), d as u64);
            if d.abs() <= 5 {
                assert!(nb < 16 && nb64 < 16, "{d} -> {nb:#x}");
            }
        }
        // -1 in negabinary is 0b11, 2 is 0b110
        assert_eq!(to_negabinary::<f32>(0xFFFF_FFFF), 3);
        assert_eq!(to_negabinary::<f64>(2), 6);
    }

    /// Checks every value: finite ones within the bound (zeros exact under rel), others bit-exact.
    fn check_bound<T: Element>(data: &[T], back: &[T], stream: &[u8], bound: ErrorBound) {
        assert_eq!(data.len(), back.len());
        let h = inspect(stream).unwrap();
        for (i, (&x, &y)) in data.iter().zip(back).enumerate() {
            if !x.finite() {
                assert_eq!(
                    x.to_bits_u64(),
                    y.to_bits_u64(),
                    "value {i}: non-finite changed"
                );
                continue;
            }
            let (xv, yv) = (x.to_f64(), y.to_f64());
            let err = (xv - yv).abs();
            let ok = match bound {
                ErrorBound::Rel(e) => {
                    err <= e * xv.abs()
                        && (xv != 0.0 || yv == 0.0)
                        && (xv == 0.0 || (xv > 0.0) == (yv > 0.0))
                }
                _ => err <= h.abs_bound,
            };
            assert!(
                ok,
                "value {i}: {xv:e} -> {yv:e} breaks {bound} (eb {})",
                h.abs_bound
            );
        }
    }

    fn round_trip<T: Element>(data: &[T], bound: ErrorBound) -> Vec<u8> {
        let s = compress(data, bound, CodecKind::Pfpl).unwrap();
        let h = inspect(&s).unwrap();
        assert_eq!(h.codec, 4);
        assert_eq!(h.count, data.len() as u64);
        assert!(s.len() <= crate::format::compress_bound(data.len(), T::DTYPE));
        let back: Vec<T> = decompress(&s).unwrap();
        check_bound(data, &back, &s, bound);
        let mut into = vec![T::default(); data.len()];
        crate::codec::decompress_into(&s, &mut into).unwrap();
        assert!(into
            .iter()
            .zip(&back)
            .all(|(a, b)| a.to_bits_u64() == b.to_bits_u64()));
        s
    }

    fn bounds() -> [ErrorBound; 7] {
        [
            ErrorBound::Abs(1e-3),
            ErrorBound::Abs(1e-30),
            ErrorBound::Abs(1e-45),
            ErrorBound::Noa(1e-2),
            ErrorBound::Noa(1e-6),
            ErrorBound::Rel(1e-2),
            ErrorBound::Rel(1e-6),
        ]
    }

    fn datasets<T: Element>() -> Vec<(String, Vec<T>)> {
        let f = |v: f64| T::from_f64(v);
        let mut r = Rng(42);
        let mut sets: Vec<(String, Vec<T>)> = Vec::new();
        sets.push(("empty".into(), vec![]));
        for n in [
            1usize, 2, 31, 33, 63, 65, 4095, 4096, 4097, 2047, 2049, 10_001,
        ] {
            sets.push((
                format!("smooth{n}"),
                (0..n).map(|i| f((i as f64 * 0.01).sin() * 3.0)).collect(),
            ));
        }
        sets.push(("one_zero".into(), vec![f(0.0)]));
        sets.push(("one_nan".into(), vec![T::from_bits_u64(u64::MAX >> 1)]));
        sets.push(("const".into(), vec![f(3.7); 9000]));
        sets.push(("const_zero".into(), vec![f(0.0); 9000]));
        sets.push(("const_neg".into(), vec![f(-1e30); 5000]));
        sets.push((
            "noise".into(),
            (0..20_000).map(|_| f(r.gauss() * 1e3)).collect(),
        ));
        // adversarial specials scattered through smooth data
        let w = T::SIZE * 8;
        let top = |b: u64| b << (w - 12);
        let specials: Vec<T> = vec![
            f(f64::INFINITY),
            f(f64::NEG_INFINITY),
            f(-0.0),
            f(3e38),
            f(-3e38),
            f(f32::MAX as f64),
            f(-(f32::MAX as f64)),
            f(1e-40),
            f(-1e-40),
            T::from_bits_u64(1),
            T::from_bits_u64(1 << (w - 1) | 1),
            T::from_bits_u64(top(0x7FF) | 0x123), // +NaN payload
            T::from_bits_u64(top(0xFFF) | 0x456), // -NaN payload
            T::from_bits_u64((u64::MAX >> (64 - w)) & !1), // -NaN, all payload bits
            T::from_bits_u64(top(0x7F8)),         // +Inf-ish / NaN (f64) patterns
            T::from_bits_u64(top(0xFF8) | 1),
            f(1e-300),
            f(-1e300),
            f(5e-324),
        ];
        let mut adv: Vec<T> = (0..9000).map(|i| f((i as f64 * 0.003).cos())).collect();
        for (k, &sp) in specials.iter().enumerate() {
            adv[k * 331 + 7] = sp;
            adv[8999 - k] = sp;
        }
        sets.push(("adversarial".into(), adv));
        sets.push(("all_specials".into(), specials.clone()));
        // every value a denormal or tiny
        sets.push((
            "denormals".into(),
            (1..3000u64).map(|i| T::from_bits_u64(i * 97)).collect(),
        ));
        // sparse gradient-like
        sets.push(("sparse".into(), sparse(&mut r, 50_000, 0.03)));
        // random bit patterns (finite or not)
        sets.push((
            "random_bits".into(),
            (0..5000)
                .map(|_| T::from_bits_u64(r.next() & (u64::MAX >> (64 - w))))
                .collect(),
        ));
        sets
    }

    fn sparse<T: Element>(r: &mut Rng, n: usize, density: f64) -> Vec<T> {
        (0..n)
            .map(|_| {
                if r.unit() < density {
                    // heavy-tailed: Gaussian scaled by a log-uniform factor
                    T::from_f64(r.gauss() * 1e-4 * (r.unit() * 8.0).exp())
                } else {
                    T::from_f64(0.0)
                }
            })
            .collect()
    }

    fn all_round_trips<T: Element>() {
        for (name, data) in datasets::<T>() {
            for b in bounds() {
                let s =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| round_trip(&data, b)));
                assert!(s.is_ok(), "{name} {b} ({})", T::DTYPE);
            }
        }
    }

    tests_for_f32_and_f64!(all_round_trips => round_trip_and_bound_f32, round_trip_and_bound_f64);

    #[test]
    fn negative_nan_under_rel_keeps_payload_via_raw_chunk() {
        let mut data: Vec<f32> = (0..10_000).map(|i| 1.0 + i as f32 * 1e-4).collect();
        data[5000] = f32::from_bits(0xFFC0_1234);
        data[9000] = f32::NEG_INFINITY;
        let s = round_trip(&data, ErrorBound::Rel(1e-3));
        let back: Vec<f32> = decompress(&s).unwrap();
        assert_eq!(back[5000].to_bits(), 0xFFC0_1234);
        assert_eq!(back[9000], f32::NEG_INFINITY);
        // the other chunks still compress
        assert!(s.len() < data.len() * 4 * 2 / 3, "{}", s.len());
    }

    #[test]
    fn chunk_kinds_empty_raw_and_compressed() {
        // chunk 0 all zero (empty), chunk 1 noise (raw), chunk 2 smooth (compressed)
        let mut r = Rng(3);
        let n = chunk_len::<f32>();
        let mut data = vec![0f32; n];
        data.extend((0..n).map(|_| f32::from_bits(r.next() as u32 & 0x7F7F_FFFF)));
        data.extend((0..n).map(|i| (i as f32 * 1e-3).sin()));
        let s = round_trip(&data, ErrorBound::Abs(1e-4));
        let h = inspect(&s).unwrap();
        let t = h.chunk_table(&s).unwrap();
        assert_eq!(t[0].size, 0);
        assert_eq!(t[1].size, n * 4);
        assert!(t[2].size > 0 && t[2].size < n * 4 / 3, "{}", t[2].size);
        assert_eq!(h.chunk_log2, 12);
    }

    /// 98 % exact zeros, small Gaussian values, and rare large spikes that set the value range
    /// (as in real gradients, whose range is dominated by a few entries).
    fn gradient_like(r: &mut Rng, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| {
                let u = r.unit();
                if u < 1e-5 {
                    r.gauss() as f32
                } else if u < 0.02 {
                    (r.gauss() * 1e-3) as f32
                } else {
                    0.0
                }
            })
            .collect()
    }

    #[test]
    fn sparse_gradient_noa_1e2_ratio_beyond_1000() {
        let mut r = Rng(11);
        let data = gradient_like(&mut r, 1 << 22);
        let s = round_trip(&data, ErrorBound::Noa(1e-2));
        let ratio = (data.len() * 4) as f64 / s.len() as f64;
        assert!(ratio > 1000.0, "ratio {ratio}");
        // a denser, heavy-tailed variant still compresses far beyond 32:1
        let data: Vec<f32> = sparse(&mut r, 1 << 20, 0.02);
        let s = round_trip(&data, ErrorBound::Noa(1e-2));
        let ratio = (data.len() * 4) as f64 / s.len() as f64;
        assert!(ratio > 50.0, "ratio {ratio}");
        let zeros = vec![0f32; 1 << 20];
        let s0 = round_trip(&zeros, ErrorBound::Noa(1e-2));
        assert_eq!(
            s0.len(),
            96 + 2 * 256,
            "empty chunks cost their 2-byte entry only"
        );
    }

    /// Writes the synthetic inputs used for the PFPL section of BENCHMARKS.md into
    /// `target/pfpl-bench/` (`cargo test --release --lib pfpl::tests::write_bench_inputs --
    /// --ignored`).
    #[test]
    #[ignore]
    fn write_bench_inputs() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/pfpl-bench");
        std::fs::create_dir_all(&dir).unwrap();
        let write = |name: &str, v: &[f32]| {
            let b: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            std::fs::write(dir.join(name), b).unwrap();
        };
        let n = 1 << 24; // 64 MiB of f32
        let mut r = Rng(2024);
        write("gradient98_16M.f32", &gradient_like(&mut r, n));
        write("sparse_heavy2_16M.f32", &sparse::<f32>(&mut r, n, 0.02));
        let mut r = Rng(77);
        let s5: Vec<f32> = (0..n)
            .map(|_| {
                if r.unit() < 0.05 {
                    (r.gauss() * 1e-2) as f32
                } else {
                    0.0
                }
            })
            .collect();
        write("sparse_gauss5_16M.f32", &s5);
        let smooth: Vec<f32> = (0..n)
            .map(|i| {
                let (x, y) = ((i % 4096) as f32 * 2e-3, (i / 4096) as f32 * 3e-3);
                (x * 3.1).sin() * (y * 1.7).cos() * 10.0 + (x * 0.3 + y * 0.2).cos() * 3.0
            })
            .collect();
        write("smooth2d_16M.f32", &smooth);
    }

    /// Single-core throughput (`cargo test --release --lib pfpl::tests::single_core_throughput --
    /// --ignored --nocapture`).
    #[test]
    #[ignore]
    fn single_core_throughput() {
        let n = 1 << 24;
        let mut r = Rng(5);
        let smooth: Vec<f32> = (0..n).map(|i| (i as f32 * 1e-4).sin() * 10.0).collect();
        let sparse = sparse::<f32>(&mut r, n, 0.02);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        for (name, data) in [("smooth", &smooth), ("sparse", &sparse)] {
            let bounds = std::env::var("PFPL_BOUNDS").unwrap_or("noa:1e-3,rel:1e-3".into());
            for b in bounds.split(',').map(|b| b.parse::<ErrorBound>().unwrap()) {
                // best of 5 (the build machine is shared)
                let (mut tc, mut td) = (f64::MAX, f64::MAX);
                let mut s = Vec::new();
                for _ in 0..5 {
                    let t = std::time::Instant::now();
                    s = pool.install(|| compress(data, b, CodecKind::Pfpl).unwrap());
                    tc = tc.min(t.elapsed().as_secs_f64());
                    let t = std::time::Instant::now();
                    let back: Vec<f32> = pool.install(|| decompress(&s).unwrap());
                    td = td.min(t.elapsed().as_secs_f64());
                    assert_eq!(back.len(), n);
                }
                let gb = (n * 4) as f64 / 1e9;
                println!(
                    "{name} {b}: ratio {:.2} compress {:.3} GB/s decompress {:.3} GB/s",
                    (n * 4) as f64 / s.len() as f64,
                    gb / tc,
                    gb / td
                );
            }
        }
    }

    #[test]
    fn smooth_field_beats_cuszp_plain() {
        let n = 1 << 18;
        let data: Vec<f32> = (0..n)
            .map(|i| {
                let x = i as f32 * 1e-3;
                x.sin() * 10.0 + (x * 0.37).cos() * 3.0
            })
            .collect();
        for b in [ErrorBound::Noa(1e-3), ErrorBound::Noa(1e-4)] {
            let p = compress(&data, b, CodecKind::Pfpl).unwrap().len();
            let c = compress(&data, b, CodecKind::CuszpPlain).unwrap().len();
            assert!(p < c, "{b}: pfpl {p} bytes, cuszp-plain {c}");
        }
    }

    fn assert_rejects<T: Element>(s: &[u8]) {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| decompress::<T>(s)));
        assert!(
            matches!(r, Ok(Err(_))),
            "corrupted stream accepted or panicked"
        );
    }

    #[test]
    fn every_truncation_is_an_error() {
        let mut r = Rng(5);
        let mut data: Vec<f32> = sparse(&mut r, 9000, 0.2);
        data[17] = f32::NAN;
        for b in [ErrorBound::Noa(1e-3), ErrorBound::Rel(1e-3)] {
            let s = compress(&data, b, CodecKind::Pfpl).unwrap();
            assert!(inspect(&s).unwrap().n_chunks > 1);
            for n in 0..s.len() {
                assert_rejects::<f32>(&s[..n]);
            }
            let mut longer = s.clone();
            longer.extend_from_slice(&[0; 4]);
            assert_rejects::<f32>(&longer);
        }
    }

    #[test]
    fn random_bit_flips_are_errors() {
        let mut r = Rng(9);
        let data32: Vec<f32> = (0..12_000)
            .map(|i| (i as f32 * 0.01).sin() + r.gauss() as f32 * 1e-3)
            .collect();
        let data64: Vec<f64> = (0..7_000).map(|i| (i as f64 * 0.01).cos() * 1e5).collect();
        let s32 = compress(&data32, ErrorBound::Noa(1e-4), CodecKind::Pfpl).unwrap();
        let s64 = compress(&data64, ErrorBound::Rel(1e-5), CodecKind::Pfpl).unwrap();
        for _ in 0..3000 {
            let mut c = s32.clone();
            let bit = r.next() as usize % (c.len() * 8);
            c[bit / 8] ^= 1 << (bit % 8);
            assert_rejects::<f32>(&c);
            let mut c = s64.clone();
            let bit = r.next() as usize % (c.len() * 8);
            c[bit / 8] ^= 1 << (bit % 8);
            assert_rejects::<f64>(&c);
        }
        // every bit of a small stream
        let small: Vec<f32> = (0..300).map(|i| (i as f32 * 0.05).sin()).collect();
        let s = compress(&small, ErrorBound::Abs(1e-3), CodecKind::Pfpl).unwrap();
        assert!(!inspect(&s).unwrap().is_stored());
        for bit in 0..s.len() * 8 {
            let mut c = s.clone();
            c[bit / 8] ^= 1 << (bit % 8);
            assert_rejects::<f32>(&c);
        }
    }

    /// Re-checksum a hand-edited chunk so only the decoder's structural checks can catch it.
    fn with_chunk(s: &[u8], chunk: &[u8]) -> Vec<u8> {
        let h = inspect(s).unwrap();
        assert_eq!(h.n_chunks, 1);
        let mut h2 = h;
        let table = pfpl_table([chunk.len()]);
        h2.payload_checksum = zhash_bytes(&table);
        h2.data_checksum = data_checksum(&[zhash_bytes(chunk)]);
        h2.payload_len = (table.len() + chunk.len()) as u64;
        let mut out = h2.to_bytes().to_vec();
        out.extend_from_slice(&table);
        out.extend_from_slice(chunk);
        out
    }

    #[test]
    fn structurally_invalid_chunks_with_valid_checksums_are_errors() {
        let data: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.02).sin()).collect();
        let s = compress(&data, ErrorBound::Abs(1e-3), CodecKind::Pfpl).unwrap();
        let h = inspect(&s).unwrap();
        let e = h.chunk_table(&s).unwrap()[0];
        let chunk = s[e.offset..e.offset + e.size].to_vec();
        assert_eq!(
            decompress::<f32>(&with_chunk(&s, &chunk)).unwrap(),
            decompress::<f32>(&s).unwrap()
        );
        // non-canonical all-zero, too long (also by one zero byte, the old padding), too short,
        // bigger than raw, garbage
        for bad in [
            vec![0u8; 4],
            vec![0u8; 1],
            [chunk.clone(), vec![0; 4]].concat(),
            [chunk.clone(), vec![0; 1]].concat(),
            chunk[..chunk.len() - 4].to_vec(),
            chunk[..chunk.len() - 1].to_vec(),
            vec![0xFF; 4004],
            vec![0xFF; 4001],
            vec![0xFF; 400],
            vec![0x01, 0, 0, 0],
            vec![0x01],
        ] {
            assert_rejects::<f32>(&with_chunk(&s, &bad));
        }
        // random garbage chunks of every small size
        let mut r = Rng(1);
        for len in 1..1200 {
            let g: Vec<u8> = (0..len).map(|_| r.next() as u8).collect();
            let c = with_chunk(&s, &g);
            let res = std::panic::catch_unwind(|| decompress::<f32>(&c));
            assert!(res.is_ok(), "panic on garbage chunk of {len} bytes");
        }
    }

    /// The data checksum (header offset 80) covers every payload byte: a stream whose chunk
    /// bytes or data checksum changed, with the header checksum recomputed, is rejected.
    #[test]
    fn altered_data_checksum_is_rejected() {
        let mut r = Rng(21);
        let data: Vec<f32> = sparse(&mut r, 30_000, 0.05);
        let s = compress(&data, ErrorBound::Noa(1e-3), CodecKind::Pfpl).unwrap();
        let h = inspect(&s).unwrap();
        assert!(h.n_chunks > 1 && h.data_checksum != 0);
        decompress::<f32>(&s).unwrap();
        for delta in [1u32, 0x8000_0000, 0xDEAD_BEEF] {
            let mut h2 = h;
            h2.data_checksum ^= delta;
            let mut c = s.clone();
            c[..crate::format::HEADER_LEN].copy_from_slice(&h2.to_bytes());
            assert!(inspect(&c).is_ok(), "header and table still valid");
            assert_rejects::<f32>(&c);
        }
        // a changed payload byte with the table checksum intact: caught by the data checksum
        let t = h.chunk_table(&s).unwrap();
        let e = t.iter().find(|e| e.size > 0).unwrap();
        let mut c = s.clone();
        c[e.offset + e.size / 2] ^= 0x40;
        assert_rejects::<f32>(&c);
        // data checksum set in a stream of another codec, or a stored pfpl stream
        let a = compress(&data, ErrorBound::Noa(1e-3), CodecKind::Aatrox).unwrap();
        let mut ha = inspect(&a).unwrap();
        ha.data_checksum = 1;
        let mut c = a.clone();
        c[..crate::format::HEADER_LEN].copy_from_slice(&ha.to_bytes());
        assert_rejects::<f32>(&c);
        let noise: Vec<f32> = (0..500).map(|_| f32::from_bits(r.next() as u32)).collect();
        let st = compress(&noise, ErrorBound::Abs(1e-9), CodecKind::Pfpl).unwrap();
        let mut hs = inspect(&st).unwrap();
        assert!(hs.is_stored());
        hs.data_checksum = 1;
        let mut c = st.clone();
        c[..crate::format::HEADER_LEN].copy_from_slice(&hs.to_bytes());
        assert_rejects::<f32>(&c);
    }

    /// 2^22 zeros (1,024 empty f32 chunks) cost the header and 2 bytes per chunk, nothing else.
    #[test]
    fn all_zero_stream_is_header_plus_u16_table() {
        let zeros = vec![0f32; 1 << 22];
        let s = round_trip(&zeros, ErrorBound::Noa(1e-2));
        assert_eq!(s.len(), 96 + 2 * 1024);
        let h = inspect(&s).unwrap();
        assert_eq!(h.n_chunks, 1024);
        assert!(s[96..].iter().all(|&b| b == 0));
        // c_i = zhash of the empty string = 0 for every chunk
        assert_eq!(h.data_checksum, data_checksum(&[0; 1024]));
        let zeros64 = vec![0f64; 1 << 21];
        let s = round_trip(&zeros64, ErrorBound::Abs(1e-3));
        assert_eq!(s.len(), 96 + 2 * 1024);
    }

    /// Chunk payloads are byte-aligned and unpadded: sizes need not be multiples of 4.
    #[test]
    fn payloads_are_unpadded() {
        let mut r = Rng(8);
        let data: Vec<f32> = sparse(&mut r, 200_000, 0.01);
        let s = round_trip(&data, ErrorBound::Noa(1e-3));
        let h = inspect(&s).unwrap();
        let t = h.chunk_table(&s).unwrap();
        assert_eq!(t[0].offset, 96 + 2 * t.len());
        assert!(t.iter().any(|e| e.size % 4 != 0), "no odd-sized chunk");
        let sum: usize = t.iter().map(|e| e.size).sum();
        assert_eq!(s.len(), 96 + 2 * t.len() + sum);
    }

    #[test]
    fn inspect_checks_pfpl_chunk_log2() {
        let data = vec![1f64; 5000];
        let s = compress(&data, ErrorBound::Abs(1e-3), CodecKind::Pfpl).unwrap();
        let h = inspect(&s).unwrap();
        assert_eq!(h.chunk_log2, 11);
        let mut h2 = h;
        h2.chunk_log2 = 12;
        let mut c = h2.to_bytes().to_vec();
        c.extend_from_slice(&s[crate::format::HEADER_LEN..]);
        assert!(inspect(&c).is_err());
    }
}
