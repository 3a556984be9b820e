//! Bit-level I/O of a block (LSB-first within each byte) and the bit-plane coding of the
//! in-segment offsets.
//!
//! Every block is one bit string written least significant bit first: field `v` of `w` bits
//! occupies stream bits `p .. p + w`, bit `i` of `v` at stream bit `p + i`, and stream bit `b`
//! is bit `b % 8` of byte `b / 8`. Blocks end on a byte boundary with zero padding.
//!
//! Offsets are written plane by plane: for each axis, for each bit plane from the most
//! significant down, one `m`-bit word whose bit `j` is that bit of particle `j`'s offset (in
//! stored order). On a GPU the word is one `__ballot_sync` of the warp.

use crate::error::{Error, Result};

/// Bits needed to write `v` (0 for 0).
#[inline]
pub(crate) fn bit_width(v: u64) -> u32 {
    64 - v.leading_zeros()
}

/// `ceil(log2(k))` for `k >= 1`: the width of a value in `0..k`.
#[inline]
pub(crate) fn ceil_log2(k: u32) -> u32 {
    if k <= 1 {
        0
    } else {
        32 - (k - 1).leading_zeros()
    }
}

/// Appends fields of up to 64 bits to a byte vector.
pub(crate) struct BitWriter<'a> {
    out: &'a mut Vec<u8>,
    acc: u64,
    nacc: u32,
    start: usize,
}

impl<'a> BitWriter<'a> {
    /// A writer appending to `out` (the block starts at `out.len()`).
    pub(crate) fn new(out: &'a mut Vec<u8>) -> Self {
        let start = out.len();
        BitWriter {
            out,
            acc: 0,
            nacc: 0,
            start,
        }
    }

    /// Write the low `bits` bits of `v` (`bits <= 64`, `v < 2^bits`).
    #[inline]
    pub(crate) fn put(&mut self, v: u64, bits: u32) {
        debug_assert!(bits <= 64 && (bits == 64 || v >> bits == 0));
        if bits > 32 {
            self.put(v & 0xffff_ffff, 32);
            self.put(v >> 32, bits - 32);
            return;
        }
        if bits == 0 {
            return;
        }
        // fewer than 8 bits are pending, so 32 more fit the accumulator
        self.acc |= v << self.nacc;
        self.nacc += bits;
        while self.nacc >= 8 {
            self.out.push(self.acc as u8);
            self.acc >>= 8;
            self.nacc -= 8;
        }
    }

    /// Pad with zero bits to the next byte boundary.
    pub(crate) fn align(&mut self) {
        if self.nacc > 0 {
            self.out.push(self.acc as u8);
            self.acc = 0;
            self.nacc = 0;
        }
    }

    /// Append whole bytes (after [`BitWriter::align`]).
    pub(crate) fn bytes(&mut self, b: &[u8]) {
        debug_assert_eq!(self.nacc, 0);
        self.out.extend_from_slice(b);
    }

    /// Pad and return the number of bytes written since [`BitWriter::new`].
    pub(crate) fn finish(mut self) -> usize {
        self.align();
        self.out.len() - self.start
    }
}

/// Reads fields from one block's bytes; every read is bounds-checked.
pub(crate) struct BitReader<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> BitReader<'a> {
    /// A reader over one block.
    pub(crate) fn new(b: &'a [u8]) -> Self {
        BitReader { b, pos: 0 }
    }

    /// Read a field of `bits <= 64` bits.
    #[inline]
    pub(crate) fn get(&mut self, bits: u32) -> Result<u64> {
        if bits > 32 {
            let lo = self.get(32)?;
            let hi = self.get(bits - 32)?;
            return Ok(lo | hi << 32);
        }
        if bits == 0 {
            return Ok(0);
        }
        let end = self.pos + bits as usize;
        if end > self.b.len() * 8 {
            return Err(Error::corrupt("gpz block truncated"));
        }
        let first = self.pos / 8;
        let last = (end - 1) / 8;
        let mut w = 0u64;
        for (k, &byte) in self.b[first..=last].iter().enumerate() {
            w |= (byte as u64) << (8 * k);
        }
        let v = (w >> (self.pos % 8)) & ((1u64 << bits) - 1);
        self.pos = end;
        Ok(v)
    }

    /// Skip to the next byte boundary; the skipped bits must be zero.
    pub(crate) fn align(&mut self) -> Result<()> {
        let pad = (8 - self.pos % 8) % 8;
        if self.get(pad as u32)? != 0 {
            return Err(Error::corrupt("gpz block padding bits are not zero"));
        }
        Ok(())
    }

    /// `n` whole bytes (after [`BitReader::align`]).
    pub(crate) fn bytes(&mut self, n: usize) -> Result<&'a [u8]> {
        debug_assert_eq!(self.pos % 8, 0);
        let at = self.pos / 8;
        let end = at
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or_else(|| Error::corrupt("gpz block truncated"))?;
        self.pos = end * 8;
        Ok(&self.b[at..end])
    }

    /// Align and check that the block was consumed exactly.
    pub(crate) fn finish(mut self) -> Result<()> {
        self.align()?;
        if self.pos != self.b.len() * 8 {
            return Err(Error::corrupt(format!(
                "gpz block has {} trailing bytes",
                self.b.len() - self.pos / 8
            )));
        }
        Ok(())
    }
}

/// Write the low `s` bits of each of the `m <= 32` offsets as `s` planes of `m` bits, most
/// significant plane first.
pub(crate) fn put_planes(w: &mut BitWriter, offsets: &[u64], s: u32) {
    let m = offsets.len() as u32;
    for b in (0..s).rev() {
        let mut word = 0u64;
        for (j, &o) in offsets.iter().enumerate() {
            word |= ((o >> b) & 1) << j;
        }
        w.put(word, m);
    }
}

/// Read `s` planes of `m = offsets.len() <= 32` bits into `offsets` (overwritten).
pub(crate) fn get_planes(r: &mut BitReader, offsets: &mut [u64], s: u32) -> Result<()> {
    offsets.fill(0);
    let m = offsets.len() as u32;
    for b in (0..s).rev() {
        let word = r.get(m)?;
        for (j, o) in offsets.iter_mut().enumerate() {
            *o |= ((word >> j) & 1) << b;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_and_planes_round_trip() {
        let mut out = vec![0xAA];
        let mut w = BitWriter::new(&mut out);
        w.put(5, 3);
        w.put(u64::MAX >> 2, 62);
        w.put(0, 0);
        w.put(1, 1);
        let offs: Vec<u64> = (0..32).map(|j| (j * 2654435761u64) & 0x3ff).collect();
        put_planes(&mut w, &offs, 10);
        w.align();
        w.bytes(&[1, 2, 3]);
        let n = w.finish();
        assert_eq!(n, out.len() - 1);
        let mut r = BitReader::new(&out[1..]);
        assert_eq!(r.get(3).unwrap(), 5);
        assert_eq!(r.get(62).unwrap(), u64::MAX >> 2);
        assert_eq!(r.get(1).unwrap(), 1);
        let mut back = vec![0; 32];
        get_planes(&mut r, &mut back, 10).unwrap();
        assert_eq!(back, offs);
        r.align().unwrap();
        assert_eq!(r.bytes(3).unwrap(), &[1, 2, 3]);
        r.finish().unwrap();
        // one byte short: an error, not a panic
        let mut r = BitReader::new(&out[1..out.len() - 1]);
        assert!(r.bytes(usize::MAX).is_err());
        let mut r = BitReader::new(&out[1..3]);
        assert!(r.get(17).is_err());
    }

    #[test]
    fn widths() {
        assert_eq!(bit_width(0), 0);
        assert_eq!(bit_width(1), 1);
        assert_eq!(bit_width(u64::MAX), 64);
        assert_eq!(ceil_log2(1), 0);
        assert_eq!(ceil_log2(2), 1);
        assert_eq!(ceil_log2(3), 2);
        assert_eq!(ceil_log2(32), 5);
        assert_eq!(ceil_log2(33), 6);
    }
}
