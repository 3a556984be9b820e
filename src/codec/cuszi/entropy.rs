//! Coder 0 (the first version 3 encoder's Huffman coding) of the residual sequence: the symbol
//! alphabet (small residuals, zero runs, escapes), and each chunk's payload (Huffman bits,
//! lossless values, large residuals). The encoder writes coder 3 (module `rans`); coder 0's
//! encoding side is kept for the tests that older streams still decode.

use crate::element::Element;
use crate::error::{Error, Result};

#[cfg(test)]
use super::huffman::BitWriter;
use super::huffman::{BitReader, Decoder};

/// Residuals `-RADIUS..=RADIUS` are symbols `r + RADIUS`.
pub(crate) const RADIUS: i64 = 511;
/// Symbol of a value stored losslessly (its bits follow in the chunk's raw section).
pub(crate) const SYM_LOSSLESS: u16 = 2 * RADIUS as u16 + 1;
/// Symbol of a residual outside `±RADIUS` (zigzag LEB128 in the chunk's big section).
pub(crate) const SYM_BIG: u16 = SYM_LOSSLESS + 1;
/// Symbol of a run of `2^1` zero residuals; `SYM_RUN + k - 1` is a run of `2^k` (`k = 1..=15`).
pub(crate) const SYM_RUN: u16 = SYM_BIG + 1;
/// Longest run symbol's `k` (a run of 32,768: a whole chunk).
pub(crate) const MAX_RUN_LOG2: u32 = 15;
/// Alphabet size.
pub(crate) const NSYM: usize = SYM_RUN as usize + MAX_RUN_LOG2 as usize;
/// The residual marking a value stored losslessly in the residual sequence (no encoded value
/// has it: a residual that would be `i64::MIN` makes the value lossless instead).
pub(crate) const LOSSLESS: i64 = i64::MIN;

/// One chunk's tokens: symbols and the zigzag LEB128 bytes of its large residuals.
#[cfg(test)]
#[derive(Default)]
pub(crate) struct Tokens {
    /// Symbols in order.
    pub syms: Vec<u16>,
    /// Varint bytes of the [`SYM_BIG`] residuals, in order.
    pub big: Vec<u8>,
}

pub(super) fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(z: u64) -> i64 {
    ((z >> 1) as i64) ^ -((z & 1) as i64)
}

/// Tokenize one chunk of residuals and count its symbols into `hist`: a run of `L` zeros
/// becomes the run symbols of `L`'s set bits `k >= 1`, highest first, then symbol `RADIUS`
/// (one zero) if `L` is odd; [`LOSSLESS`] becomes [`SYM_LOSSLESS`]; a residual beyond
/// `±RADIUS` becomes [`SYM_BIG`] plus its varint.
#[cfg(test)]
pub(crate) fn tokenize(res: &[i64], hist: &mut [u64]) -> Tokens {
    let mut t = Tokens::default();
    let mut run = 0usize;
    let flush = |run: &mut usize, t: &mut Tokens, hist: &mut [u64]| {
        for k in (1..=MAX_RUN_LOG2).rev() {
            if *run >> k & 1 == 1 {
                let s = SYM_RUN + (k - 1) as u16;
                t.syms.push(s);
                hist[s as usize] += 1;
            }
        }
        if *run & 1 == 1 {
            t.syms.push(RADIUS as u16);
            hist[RADIUS as usize] += 1;
        }
        *run = 0;
    };
    for &r in res {
        if r == 0 {
            run += 1;
            continue;
        }
        if run > 0 {
            flush(&mut run, &mut t, hist);
        }
        let s = if r == LOSSLESS {
            SYM_LOSSLESS
        } else if (-RADIUS..=RADIUS).contains(&r) {
            (r + RADIUS) as u16
        } else {
            let mut z = zigzag(r);
            while z >= 0x80 {
                t.big.push(z as u8 | 0x80);
                z >>= 7;
            }
            t.big.push(z as u8);
            SYM_BIG
        };
        t.syms.push(s);
        hist[s as usize] += 1;
    }
    flush(&mut run, &mut t, hist);
    t
}

/// The chunk payload of `tokens` (FORMAT.md, "cuszi chunks"): the Huffman bit count (u32), the
/// bits, the lossless values `raw` (little-endian), the big residuals' varints, zero padding to
/// a multiple of 4 bytes.
#[cfg(test)]
pub(crate) fn write_chunk<T: Element>(tokens: &Tokens, codes: &[(u32, u8)], raw: &[T]) -> Vec<u8> {
    let mut w = BitWriter::default();
    w.bytes.reserve(tokens.syms.len() / 4 + 8);
    for &s in &tokens.syms {
        let (c, l) = codes[s as usize];
        w.put(c, l);
    }
    let (bits, nbits) = w.finish();
    let mut out = Vec::with_capacity(4 + bits.len() + raw.len() * T::SIZE + tokens.big.len() + 3);
    out.extend_from_slice(&(nbits as u32).to_le_bytes());
    out.extend_from_slice(&bits);
    for &x in raw {
        x.write_le(&mut out);
    }
    out.extend_from_slice(&tokens.big);
    out.resize(out.len().next_multiple_of(4), 0);
    out
}

/// Decode a chunk of `res.len()` residuals written by [`write_chunk`] into `res` (lossless
/// values as [`LOSSLESS`]); the lossless values are appended to `raw`. Every byte is checked:
/// the bit count against the chunk, the bits after the last code and the padding are zero, a
/// big residual is beyond `±RADIUS` and its varint is minimal.
pub(crate) fn read_chunk<T: Element>(
    c: &[u8],
    dec: &Decoder,
    res: &mut [i64],
    raw: &mut Vec<T>,
) -> Result<()> {
    if c.len() < 4 {
        return Err(Error::corrupt("chunk shorter than its bit count"));
    }
    let nbits = u32::from_le_bytes(c[0..4].try_into().expect("4 bytes")) as u64;
    let nbytes = nbits.div_ceil(8) as usize;
    let bits = c
        .get(4..4 + nbytes)
        .ok_or_else(|| Error::corrupt("Huffman bitstream runs past the chunk"))?;
    let mut r = BitReader::new(bits, nbits);
    let n = res.len();
    let mut i = 0;
    let mut n_raw = 0usize;
    let mut bigs = Vec::new();
    while i < n {
        let (s, l) = dec
            .decode(r.peek())
            .ok_or_else(|| Error::corrupt("invalid Huffman code"))?;
        r.consume(l)?;
        if s < SYM_LOSSLESS {
            res[i] = s as i64 - RADIUS;
            i += 1;
        } else if s == SYM_LOSSLESS {
            res[i] = LOSSLESS;
            n_raw += 1;
            i += 1;
        } else if s == SYM_BIG {
            bigs.push(i);
            i += 1;
        } else {
            let len = 1usize << (s - SYM_RUN + 1);
            let dst = res
                .get_mut(i..i + len)
                .ok_or_else(|| Error::corrupt("zero run past the end of the chunk"))?;
            dst.fill(0);
            i += len;
        }
    }
    if r.position() != nbits {
        return Err(Error::corrupt("Huffman bitstream longer than its values"));
    }
    if nbits % 8 != 0 && bits[nbytes - 1] << (nbits % 8) != 0 {
        return Err(Error::corrupt("non-zero bits after the last Huffman code"));
    }
    read_chunk_tail(c, 4 + nbytes, n_raw, &bigs, res, raw)
}

/// The end of a chunk after its entropy-coded part, which ends at byte `pos` (both coders):
/// `n_raw` lossless values appended to `raw`, then the big residuals (zigzag LEB128, minimal,
/// beyond `±RADIUS`) stored at the positions `bigs` of `res`, then zero padding of fewer than 4
/// bytes.
pub(super) fn read_chunk_tail<T: Element>(
    c: &[u8],
    mut pos: usize,
    n_raw: usize,
    bigs: &[usize],
    res: &mut [i64],
    raw: &mut Vec<T>,
) -> Result<()> {
    let raw_bytes = c
        .get(pos..pos + n_raw * T::SIZE)
        .ok_or_else(|| Error::corrupt("lossless values run past the chunk"))?;
    raw.extend(raw_bytes.chunks_exact(T::SIZE).map(T::read_le));
    pos += n_raw * T::SIZE;
    for &at in bigs {
        let mut z = 0u64;
        let mut shift = 0;
        loop {
            let b = *c
                .get(pos)
                .ok_or_else(|| Error::corrupt("big residual runs past the chunk"))?;
            pos += 1;
            if shift == 63 && b > 1 || (shift > 0 && b == 0) {
                return Err(Error::corrupt("invalid big residual"));
            }
            z |= ((b & 0x7F) as u64) << shift;
            if b & 0x80 == 0 {
                break;
            }
            shift += 7;
        }
        let v = unzigzag(z);
        if (-RADIUS..=RADIUS).contains(&v) || v == LOSSLESS {
            return Err(Error::corrupt("big residual within the symbol range"));
        }
        res[at] = v;
    }
    if c.len() - pos >= 4 || c[pos..].iter().any(|&b| b != 0) {
        return Err(Error::corrupt("chunk longer than its contents"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::huffman::{canonical_codes, code_lengths};
    use super::*;

    #[test]
    fn chunks_round_trip_and_reject_changes() {
        let mut res: Vec<i64> = (0..5000)
            .map(|i| match i % 13 {
                0 => 3,
                1 => -700,
                2 => i64::MAX,
                3 => LOSSLESS,
                4 => i64::MIN + 1,
                _ => 0,
            })
            .collect();
        res.extend(std::iter::repeat(0).take(40_000 - 5000 - 3));
        res.extend([0, 0, 1]);
        let raw: Vec<f64> = (0..res.iter().filter(|&&r| r == LOSSLESS).count())
            .map(|i| f64::NAN + i as f64)
            .collect();
        let mut hist = vec![0u64; NSYM];
        let t = tokenize(&res, &mut hist);
        let lens = code_lengths(&hist);
        let codes = canonical_codes(&lens);
        let c = write_chunk::<f64>(&t, &codes, &raw);
        let dec = Decoder::new(&lens);
        let mut back = vec![7i64; res.len()];
        let mut raw_back = Vec::new();
        read_chunk::<f64>(&c, &dec, &mut back, &mut raw_back).unwrap();
        assert_eq!(back, res);
        assert_eq!(raw_back.len(), raw.len());
        // truncations and single-bit changes: an error or (where the change is a different valid
        // code) a different result, never a panic
        // (chunk sizes are multiples of 4, checked with the chunk table)
        for n in (0..c.len()).step_by(4) {
            let mut b2 = vec![0; res.len()];
            assert!(read_chunk::<f64>(&c[..n], &dec, &mut b2, &mut Vec::new()).is_err());
        }
        for i in (0..c.len()).step_by(7) {
            let mut m = c.clone();
            m[i] ^= 0x10;
            let mut b2 = vec![0; res.len()];
            let _ = read_chunk::<f64>(&m, &dec, &mut b2, &mut Vec::new());
        }
        let mut longer = c.clone();
        longer.extend([0, 0, 0, 0]);
        assert!(read_chunk::<f64>(&longer, &dec, &mut back, &mut Vec::new()).is_err());
    }
}
