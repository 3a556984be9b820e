//! Stage 2: the per-block sort by segment id, and the compact permutation of `preserve` order.
//!
//! The sort is stable (ties keep the original order), so it is a function of the keys alone;
//! a warp radix sort (CUB `WarpMergeSort`/`BlockRadixSort` over `(key, lane)`) gives the same
//! order. `preserve` streams store the permutation in the cheaper of two forms:
//!
//! * its **Lehmer code**: output position `i` of `m` holds particle `perm[i]`, and digit `i` is
//!   the number of later positions holding a smaller index, in `ceil(log2(m - i))` bits (129
//!   bits for a full block, against 160 for five bits per particle);
//! * its **run indices**: since the sort is stable, the permutation follows from the run (of
//!   `R` distinct segment ids) each particle belongs to, in `ceil(log2 R)` bits per particle in
//!   block order; cheaper than the Lehmer code when few segments are occupied.
//!
//! On a GPU, lane `i` counts its Lehmer digit with 32 shuffles, or looks up its run index, and
//! writes it at a position that depends on `i` only.

use super::bitplane::{ceil_log2, BitReader, BitWriter};
use super::runs::Runs;
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

/// Bits of the run-index form of a permutation of `m` particles in `r` runs.
pub(crate) fn run_index_bits(m: usize, r: usize) -> u64 {
    m as u64 * ceil_log2(r as u32) as u64
}

/// Write the run index of each particle, in block order (`perm` from [`sort_block`], `runs` of
/// the sorted ids).
pub(crate) fn put_run_indices(w: &mut BitWriter, perm: &[u8], runs: &Runs) {
    let mut run_of = [0u8; 32];
    let mut at = 0;
    for (ri, &c) in runs.counts[..runs.r].iter().enumerate() {
        for &p in &perm[at..at + c as usize] {
            run_of[p as usize] = ri as u8;
        }
        at += c as usize;
    }
    let width = ceil_log2(runs.r as u32);
    for &ri in &run_of[..perm.len()] {
        w.put(ri as u64, width);
    }
}

/// Read the run-index form of the permutation of `perm.len()` particles whose sorted ids form
/// `runs`, into `perm` (sorted position -> block index). Every run must receive exactly its
/// count of particles.
pub(crate) fn get_run_indices(rd: &mut BitReader, runs: &Runs, perm: &mut [u8]) -> Result<()> {
    let r = runs.r;
    let mut next = [0usize; 32];
    let mut end = [0usize; 32];
    let mut at = 0;
    for i in 0..r {
        next[i] = at;
        at += runs.counts[i] as usize;
        end[i] = at;
    }
    let width = ceil_log2(r as u32);
    for j in 0..perm.len() {
        let ri = rd.get(width)? as usize;
        if ri >= r || next[ri] >= end[ri] {
            return Err(Error::corrupt(format!(
                "gpz run index {ri} of particle {j} is out of range or overfills its run"
            )));
        }
        perm[next[ri]] = j as u8;
        next[ri] += 1;
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
        // run-index form
        let runs = crate::codec::gpz::runs::runs_of(&sorted);
        let mut out = Vec::new();
        let mut w = BitWriter::new(&mut out);
        put_run_indices(&mut w, &perm, &runs);
        assert_eq!(w.finish() as u64, run_index_bits(32, runs.r).div_ceil(8));
        let mut back = [0u8; 32];
        get_run_indices(&mut BitReader::new(&out), &runs, &mut back).unwrap();
        assert_eq!(back, perm);
        let ident: Vec<u64> = (0..32).collect();
        assert!(sort_block(&ident, &mut sorted, &mut perm));
    }
}
