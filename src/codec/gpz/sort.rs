//! Stage 2: the per-block sort by segment id, and the compact permutation of `preserve` order.
//!
//! The sort is stable (ties keep the original order), so it is a function of the keys alone;
//! a warp radix sort (CUB `WarpMergeSort`/`BlockRadixSort` over `(key, lane)`) gives the same
//! order. `preserve` streams store the permutation as its Lehmer code: output position `i` of
//! `m` holds particle `perm[i]`, and digit `i` is the number of later positions holding a
//! smaller index, in `ceil(log2(m - i))` bits (129 bits for a full block, against 160 for five
//! bits per particle). On a GPU, lane `i` counts its digit with 32 shuffles and writes it at a
//! position that depends on `i` only.

use super::bitplane::{ceil_log2, BitReader, BitWriter};
use crate::error::{Error, Result};

/// Sort the `keys.len() <= 32` keys (each `< 2^32`) stably: writes the sorted keys to `sorted`
/// and the original index of each sorted position to `perm`. Returns whether the order is the
/// identity.
pub(crate) fn sort_block(keys: &[u64], sorted: &mut [u64], perm: &mut [u8]) -> bool {
    let m = keys.len();
    debug_assert!(m <= 32 && keys.iter().all(|&k| k >> 32 == 0));
    // (key, index) packed in one word: an unstable sort of distinct words is the stable sort
    let mut packed = [0u64; 32];
    for (j, (&k, p)) in keys.iter().zip(packed.iter_mut()).enumerate() {
        *p = k << 5 | j as u64;
    }
    let packed = &mut packed[..m];
    packed.sort_unstable();
    let mut identity = true;
    for (i, &p) in packed.iter().enumerate() {
        sorted[i] = p >> 5;
        perm[i] = (p & 31) as u8;
        identity &= perm[i] as usize == i;
    }
    identity
}

/// Bits of the Lehmer code of a permutation of `m` elements.
pub(crate) fn lehmer_bits(m: usize) -> u64 {
    (1..=m as u32).map(|k| ceil_log2(k) as u64).sum()
}

/// Write the Lehmer code of `perm` (a permutation of `0..perm.len()`).
pub(crate) fn put_lehmer(w: &mut BitWriter, perm: &[u8]) {
    let m = perm.len();
    for i in 0..m {
        let digit = perm[i + 1..].iter().filter(|&&p| p < perm[i]).count();
        w.put(digit as u64, ceil_log2((m - i) as u32));
    }
}

/// Read the Lehmer code of a permutation of `perm.len()` elements into `perm`.
pub(crate) fn get_lehmer(r: &mut BitReader, perm: &mut [u8]) -> Result<()> {
    let m = perm.len();
    // bit k set: index k not yet placed
    let mut free: u64 = (1u64 << m) - 1;
    for (i, p) in perm.iter_mut().enumerate() {
        let digit = r.get(ceil_log2((m - i) as u32))? as u32;
        if digit >= (m - i) as u32 {
            return Err(Error::corrupt(format!(
                "gpz permutation digit {digit} at position {i} of {m} is out of range"
            )));
        }
        // the `digit`-th free index, counting from the smallest
        let mut f = free;
        for _ in 0..digit {
            f &= f - 1;
        }
        let k = f.trailing_zeros();
        *p = k as u8;
        free &= !(1u64 << k);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sort_is_stable_and_lehmer_round_trips() {
        let keys: Vec<u64> = (0..32u64).map(|j| (j * 7919) % 5).collect();
        let mut sorted = [0u64; 32];
        let mut perm = [0u8; 32];
        assert!(!sort_block(&keys, &mut sorted, &mut perm));
        for i in 1..32 {
            assert!(sorted[i - 1] <= sorted[i]);
            if sorted[i - 1] == sorted[i] {
                assert!(perm[i - 1] < perm[i]);
            }
        }
        assert_eq!(lehmer_bits(32), 129);
        for m in [0usize, 1, 2, 7, 32] {
            let mut out = Vec::new();
            let mut w = BitWriter::new(&mut out);
            let p: Vec<u8> = (0..m as u8).rev().collect();
            put_lehmer(&mut w, &p);
            w.finish();
            let mut back = vec![0u8; m];
            get_lehmer(&mut BitReader::new(&out), &mut back).unwrap();
            assert_eq!(back, p);
        }
        let ident: Vec<u64> = (0..32).collect();
        assert!(sort_block(&ident, &mut sorted, &mut perm));
    }
}
