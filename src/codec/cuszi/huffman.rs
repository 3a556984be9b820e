//! Canonical Huffman coding: length-limited code lengths from a histogram, the codebook's
//! serialized form, and MSB-first bit writing and table-driven decoding.
//!
//! The codebook is built once per stream from the histogram of all chunks (on the host, as in
//! cuSZ-i); chunks are then coded independently with it.

use crate::error::{Error, Result};

/// Longest code length (bits): a decoder needs at most this many bits of look-ahead.
pub(crate) const MAX_LEN: u32 = 20;
/// Bits of the decoder's direct lookup table (longer codes take the canonical walk).
const FAST_BITS: u32 = 11;

/// Code lengths (0 = unused) for a histogram, each at most [`MAX_LEN`]: Huffman's algorithm with
/// ties broken by node number (leaves `0..n` by symbol, inner nodes numbered on creation, the
/// smaller of equal weights first), repeated on halved counts (`(f + 1) / 2`, so no used symbol
/// drops out) until the longest code fits. A single used symbol gets length 1.
#[cfg(test)]
pub(crate) fn code_lengths(freq: &[u64]) -> Vec<u8> {
    let n = freq.len();
    let mut f: Vec<u64> = freq.to_vec();
    loop {
        let used: Vec<usize> = (0..n).filter(|&i| f[i] > 0).collect();
        let mut len = vec![0u8; n];
        match used.len() {
            0 => return len,
            1 => {
                len[used[0]] = 1;
                return len;
            }
            _ => {}
        }
        // min-heap of (weight, node); parents of nodes
        let mut heap = std::collections::BinaryHeap::new();
        for &i in &used {
            heap.push(std::cmp::Reverse((f[i], i)));
        }
        let mut parent = vec![usize::MAX; n + used.len()];
        let mut next = n;
        while heap.len() > 1 {
            let std::cmp::Reverse((wa, a)) = heap.pop().expect("two nodes");
            let std::cmp::Reverse((wb, b)) = heap.pop().expect("two nodes");
            parent[a] = next;
            parent[b] = next;
            heap.push(std::cmp::Reverse((wa.saturating_add(wb), next)));
            next += 1;
        }
        let mut depth = vec![0u32; next];
        for node in (0..next).rev() {
            if parent[node] != usize::MAX {
                depth[node] = depth[parent[node]] + 1;
            }
        }
        let max = used.iter().map(|&i| depth[i]).max().unwrap_or(0);
        if max <= MAX_LEN {
            for &i in &used {
                len[i] = depth[i] as u8;
            }
            return len;
        }
        for x in f.iter_mut().filter(|x| **x > 0) {
            *x = x.div_ceil(2);
        }
    }
}

/// Canonical codes for `lens`: symbols sorted by (length, symbol) get consecutive codes,
/// shifted left whenever the length grows. Returns `(code, length)` per symbol.
pub(crate) fn canonical_codes(lens: &[u8]) -> Vec<(u32, u8)> {
    let mut order: Vec<usize> = (0..lens.len()).filter(|&i| lens[i] > 0).collect();
    order.sort_by_key(|&i| (lens[i], i));
    let mut out = vec![(0u32, 0u8); lens.len()];
    let mut code = 0u32;
    let mut prev = 0u8;
    for &i in &order {
        code <<= lens[i] - prev;
        prev = lens[i];
        out[i] = (code, lens[i]);
        code += 1;
    }
    out
}

/// Serialize code lengths: one byte per symbol, `1..=20` a length, `0x80 | (k - 1)` a run of
/// `k` (1 to 128) unused symbols (runs as long as possible).
#[cfg(test)]
pub(crate) fn write_lengths(lens: &[u8], out: &mut Vec<u8>) {
    let mut i = 0;
    while i < lens.len() {
        if lens[i] == 0 {
            let mut k = 1;
            while k < 128 && i + k < lens.len() && lens[i + k] == 0 {
                k += 1;
            }
            out.push(0x80 | (k - 1) as u8);
            i += k;
        } else {
            out.push(lens[i]);
            i += 1;
        }
    }
}

/// Parse `n` code lengths from `b` (all of it), checking each length and that they form a
/// prefix code (Kraft sum at most 1) with at least one symbol.
pub(crate) fn read_lengths(b: &[u8], n: usize) -> Result<Vec<u8>> {
    let mut lens = Vec::with_capacity(n);
    for &x in b {
        if x & 0x80 != 0 {
            let k = (x & 0x7F) as usize + 1;
            lens.resize(lens.len() + k, 0);
        } else if (1..=MAX_LEN as u8).contains(&x) {
            lens.push(x);
        } else {
            return Err(Error::corrupt(format!("invalid Huffman code length {x}")));
        }
        if lens.len() > n {
            break;
        }
    }
    if lens.len() != n {
        return Err(Error::corrupt(
            "Huffman codebook has the wrong number of symbols",
        ));
    }
    let kraft: u64 = lens
        .iter()
        .filter(|&&l| l > 0)
        .map(|&l| 1u64 << (MAX_LEN - l as u32))
        .sum();
    if kraft == 0 || kraft > 1 << MAX_LEN {
        return Err(Error::corrupt(
            "Huffman code lengths do not form a prefix code",
        ));
    }
    Ok(lens)
}

/// MSB-first bit writer.
#[cfg(test)]
#[derive(Default)]
pub(crate) struct BitWriter {
    /// The bytes written so far (whole bytes only).
    pub bytes: Vec<u8>,
    acc: u64,
    n: u32,
    /// Bits written in all.
    pub bits: u64,
}

#[cfg(test)]
impl BitWriter {
    /// Append the low `len` bits of `code`, most significant first (`len <= 32`).
    #[inline(always)]
    pub fn put(&mut self, code: u32, len: u8) {
        self.acc = (self.acc << len) | code as u64;
        self.n += len as u32;
        self.bits += len as u64;
        while self.n >= 8 {
            self.n -= 8;
            self.bytes.push((self.acc >> self.n) as u8);
        }
    }

    /// Flush the last partial byte (zero bits after the code).
    pub fn finish(mut self) -> (Vec<u8>, u64) {
        if self.n > 0 {
            self.bytes.push((self.acc << (8 - self.n)) as u8);
        }
        (self.bytes, self.bits)
    }
}

/// A canonical-code decoder: a direct table for codes of up to [`FAST_BITS`] bits, the
/// canonical first-code walk for longer ones.
pub(crate) struct Decoder {
    /// `(symbol, length)` per `FAST_BITS`-bit prefix; length 0: a longer code (or none).
    fast: Vec<(u16, u8)>,
    /// Per length `l`: the first code, the number of codes, and the index of the first symbol of
    /// that length in `sorted`.
    first: [u32; MAX_LEN as usize + 1],
    count: [u32; MAX_LEN as usize + 1],
    index: [u32; MAX_LEN as usize + 1],
    sorted: Vec<u16>,
}

impl Decoder {
    /// The decoder of code lengths `lens` (checked by [`read_lengths`]).
    pub fn new(lens: &[u8]) -> Self {
        let codes = canonical_codes(lens);
        let mut sorted: Vec<u16> = (0..lens.len() as u16)
            .filter(|&i| lens[i as usize] > 0)
            .collect();
        sorted.sort_by_key(|&i| (lens[i as usize], i));
        let mut first = [0u32; MAX_LEN as usize + 1];
        let mut count = [0u32; MAX_LEN as usize + 1];
        let mut index = [0u32; MAX_LEN as usize + 1];
        for (k, &sym) in sorted.iter().enumerate().rev() {
            let l = lens[sym as usize] as usize;
            first[l] = codes[sym as usize].0;
            index[l] = k as u32;
            count[l] += 1;
        }
        let mut fast = vec![(0u16, 0u8); 1 << FAST_BITS];
        for &sym in &sorted {
            let (code, l) = codes[sym as usize];
            if l as u32 <= FAST_BITS {
                let shift = FAST_BITS - l as u32;
                let base = (code << shift) as usize;
                for e in &mut fast[base..base + (1 << shift)] {
                    *e = (sym, l);
                }
            }
        }
        Decoder {
            fast,
            first,
            count,
            index,
            sorted,
        }
    }

    /// Decode one symbol from the next [`MAX_LEN`] bits `w` (MSB-aligned in the low
    /// `MAX_LEN` bits): `(symbol, length)`, or `None` for a bit pattern that is no code.
    #[inline(always)]
    pub fn decode(&self, w: u32) -> Option<(u16, u8)> {
        let e = self.fast[(w >> (MAX_LEN - FAST_BITS)) as usize];
        if e.1 != 0 {
            return Some(e);
        }
        for l in FAST_BITS + 1..=MAX_LEN {
            let code = w >> (MAX_LEN - l);
            let i = l as usize;
            let off = code.wrapping_sub(self.first[i]);
            if self.count[i] > 0 && code >= self.first[i] && off < self.count[i] {
                return Some((self.sorted[(self.index[i] + off) as usize], l as u8));
            }
        }
        None
    }
}

/// MSB-first bit reader over a byte slice of `bits` valid bits.
pub(crate) struct BitReader<'a> {
    data: &'a [u8],
    pos: u64,
    bits: u64,
}

impl<'a> BitReader<'a> {
    /// A reader of the first `bits` bits of `data` (`data` holds at least that many).
    pub fn new(data: &'a [u8], bits: u64) -> Self {
        BitReader { data, pos: 0, bits }
    }

    /// The next [`MAX_LEN`] bits (zeros past the end), in the low bits.
    #[inline(always)]
    pub fn peek(&self) -> u32 {
        let byte = (self.pos >> 3) as usize;
        let w = match self.data.get(byte..byte + 4) {
            Some(b) => u32::from_be_bytes(b.try_into().expect("4 bytes")),
            None => {
                let mut a = [0u8; 4];
                for (i, x) in a.iter_mut().enumerate() {
                    *x = self.data.get(byte + i).copied().unwrap_or(0);
                }
                u32::from_be_bytes(a)
            }
        };
        // 32 bits from the byte; drop the bits already read (at most 7)
        (w << (self.pos & 7)) >> (32 - MAX_LEN)
    }

    /// Skip `n` bits; fails when that passes the last valid bit.
    #[inline(always)]
    pub fn consume(&mut self, n: u8) -> Result<()> {
        self.pos += n as u64;
        if self.pos > self.bits {
            return Err(Error::corrupt("Huffman bitstream truncated"));
        }
        Ok(())
    }

    /// Bits read so far.
    pub fn position(&self) -> u64 {
        self.pos
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_are_limited_and_decodable() {
        // Fibonacci counts make the deepest plain Huffman tree
        let mut freq = vec![0u64; 40];
        let (mut a, mut b) = (1u64, 1u64);
        for f in freq.iter_mut() {
            *f = a;
            (a, b) = (b, a + b);
        }
        let lens = code_lengths(&freq);
        assert!(lens.iter().all(|&l| (1..=MAX_LEN as u8).contains(&l)));
        let mut ser = Vec::new();
        write_lengths(&lens, &mut ser);
        assert_eq!(read_lengths(&ser, 40).unwrap(), lens);
        let codes = canonical_codes(&lens);
        let mut w = BitWriter::default();
        for &(c, l) in &codes {
            w.put(c, l);
        }
        let (bytes, bits) = w.finish();
        let dec = Decoder::new(&lens);
        let mut r = BitReader::new(&bytes, bits);
        for s in 0..40u16 {
            let (sym, l) = dec.decode(r.peek()).unwrap();
            assert_eq!(sym, s);
            r.consume(l).unwrap();
        }
        assert_eq!(r.position(), bits);
    }

    #[test]
    fn single_symbol_and_bad_codebooks() {
        let lens = code_lengths(&[0, 0, 5, 0]);
        assert_eq!(lens, [0, 0, 1, 0]);
        assert!(read_lengths(&[0x83], 4).is_err()); // no symbol
        assert!(read_lengths(&[1, 1, 1, 0x80], 4).is_err()); // Kraft sum above 1
        assert!(read_lengths(&[21, 0x82], 4).is_err()); // too long
        assert!(read_lengths(&[1, 0x81], 4).is_err()); // too few symbols
        assert!(read_lengths(&[1, 0x83], 4).is_err()); // too many
        let dec = Decoder::new(&[0, 0, 1, 0]);
        assert_eq!(dec.decode(0), Some((2, 1)));
        assert_eq!(dec.decode(1 << (MAX_LEN - 1)), None);
    }
}
