//! Stage 3a: run-length coding of the sorted segment ids, delta coding of the distinct ids.
//!
//! Sorted ids `k_0 <= ... <= k_{m-1}` of `K` bits become `R` runs `(key_r, count_r)`. Coded
//! (only when `K > 0`: with `K = 0` every id is 0 and nothing is written):
//!
//! | bits | field |
//! |---:|---|
//! | 5 | `R - 1` |
//! | K | `key_0` |
//! | 6 | `wd`: bit width of the largest `key_r - key_{r-1} - 1` (only when `R > 1`) |
//! | (R-1) wd | `key_r - key_{r-1} - 1` for `r = 1..R` |
//! | 3 | `wc`: bit width of the largest `count_r - 1` over the first `R - 1` runs (`R > 1`) |
//! | (R-1) wc | `count_r - 1` for `r = 0..R-1` (the last count is `m` minus the others) |
//!
//! On a GPU the runs come from one warp scan of "key differs from the previous lane" flags.

use super::bitplane::{bit_width, BitReader, BitWriter};
use crate::error::{Error, Result};

/// The runs of a sorted block of ids.
pub(crate) struct Runs {
    /// Distinct ids, increasing.
    pub keys: [u64; 32],
    /// Particles per distinct id.
    pub counts: [u8; 32],
    /// Number of runs.
    pub r: usize,
}

/// The runs of `sorted` (non-decreasing, at most 32 ids).
pub(crate) fn runs_of(sorted: &[u64]) -> Runs {
    let mut runs = Runs {
        keys: [0; 32],
        counts: [0; 32],
        r: 0,
    };
    for &k in sorted {
        if runs.r > 0 && runs.keys[runs.r - 1] == k {
            runs.counts[runs.r - 1] += 1;
        } else {
            runs.keys[runs.r] = k;
            runs.counts[runs.r] = 1;
            runs.r += 1;
        }
    }
    runs
}

/// Widths `(wd, wc)` of the delta and count fields.
fn widths(runs: &Runs) -> (u32, u32) {
    let r = runs.r;
    let wd = (1..r)
        .map(|i| bit_width(runs.keys[i] - runs.keys[i - 1] - 1))
        .max()
        .unwrap_or(0);
    let wc = (0..r.saturating_sub(1))
        .map(|i| bit_width(runs.counts[i] as u64 - 1))
        .max()
        .unwrap_or(0);
    (wd, wc)
}

/// Bits [`put_runs`] writes for ids of `k` bits.
pub(crate) fn runs_bits(runs: &Runs, k: u32) -> u64 {
    if k == 0 {
        return 0;
    }
    let mut bits = 5 + k as u64;
    if runs.r > 1 {
        let (wd, wc) = widths(runs);
        bits += 6 + 3 + (runs.r as u64 - 1) * (wd + wc) as u64;
    }
    bits
}

/// Write the runs of ids of `k` bits (nothing when `k == 0`).
pub(crate) fn put_runs(w: &mut BitWriter, runs: &Runs, k: u32) {
    if k == 0 {
        return;
    }
    let r = runs.r;
    w.put(r as u64 - 1, 5);
    w.put(runs.keys[0], k);
    if r > 1 {
        let (wd, wc) = widths(runs);
        w.put(wd as u64, 6);
        for i in 1..r {
            w.put(runs.keys[i] - runs.keys[i - 1] - 1, wd);
        }
        w.put(wc as u64, 3);
        for i in 0..r - 1 {
            w.put(runs.counts[i] as u64 - 1, wc);
        }
    }
}

/// Read the runs of `sorted.len() = m >= 1` ids of `k` bits and expand them into `sorted`.
pub(crate) fn get_runs(rd: &mut BitReader, k: u32, sorted: &mut [u64]) -> Result<()> {
    let m = sorted.len();
    if k == 0 {
        sorted.fill(0);
        return Ok(());
    }
    let r = rd.get(5)? as usize + 1;
    if r > m {
        return Err(Error::corrupt(format!(
            "gpz block has {r} segment runs for {m} particles"
        )));
    }
    let mut keys = [0u64; 32];
    keys[0] = rd.get(k)?;
    let mut counts = [1usize; 32];
    if r > 1 {
        let wd = rd.get(6)? as u32;
        if wd > k {
            return Err(Error::corrupt(format!(
                "gpz segment delta width {wd} exceeds the id width {k}"
            )));
        }
        for i in 1..r {
            let next = keys[i - 1]
                .checked_add(rd.get(wd)? + 1)
                .filter(|&v| v >> k == 0)
                .ok_or_else(|| Error::corrupt("gpz segment id out of range"))?;
            keys[i] = next;
        }
        let wc = rd.get(3)? as u32;
        if wc > 5 {
            return Err(Error::corrupt(format!(
                "gpz run-count width {wc} exceeds 5"
            )));
        }
        let mut used = 0usize;
        for c in counts.iter_mut().take(r - 1) {
            *c = rd.get(wc)? as usize + 1;
            used += *c;
        }
        if used >= m {
            return Err(Error::corrupt(format!(
                "gpz segment runs cover {used} of {m} particles before the last run"
            )));
        }
        counts[r - 1] = m - used;
    } else {
        counts[0] = m;
    }
    let mut at = 0;
    for i in 0..r {
        sorted[at..at + counts[i]].fill(keys[i]);
        at += counts[i];
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_round_trip() {
        for sorted in [
            vec![3u64],
            vec![0, 0, 0],
            vec![1, 1, 4, 9, 9, 9, 1000],
            (0..32).map(|i| i * 3).collect(),
        ] {
            let runs = runs_of(&sorted);
            for k in [11u32, 32] {
                let mut out = Vec::new();
                let mut w = BitWriter::new(&mut out);
                put_runs(&mut w, &runs, k);
                w.finish();
                assert_eq!(out.len() as u64, runs_bits(&runs, k).div_ceil(8));
                let mut back = vec![0; sorted.len()];
                get_runs(&mut BitReader::new(&out), k, &mut back).unwrap();
                assert_eq!(back, sorted);
            }
        }
    }
}
