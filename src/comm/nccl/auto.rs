//! The `Auto` policy's agreed ratio cache (pure host logic, no device needed).
//!
//! A collective's `Auto` decision must be identical on all ranks, so it may only depend on values
//! every rank holds bit for bit: the profile, the configuration, the element count and the ratio
//! estimate. The estimate is made identical by an agreement round (every rank's local estimate is
//! allgathered and all ranks derive the same [`WireRatio`] from the list, [`Agreed::from_all`];
//! after a compressed call every rank's measured pair, [`Agreed::from_measured`]); [`AgreedRatios`]
//! remembers such agreed values so that later calls of the same shape skip both the sample
//! compression and the agreement round. Only [`Agreed`] values can be stored, and an [`Agreed`]
//! can only be built from the full list of every rank's value, so nothing rank-local ever enters
//! the cache: every rank's cache evolves identically as long as all ranks make the same calls.

use std::collections::HashMap;

use crate::model::WireRatio;

/// What a cached ratio belongs to: the operation, the dtype tag and the element count (all
/// checked to be identical on every rank by the descriptor agreement), and the codec's tag
/// (`Auto` keeps one ratio per candidate codec).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct RatioKey {
    pub(crate) op: u8,
    pub(crate) dtype: u8,
    pub(crate) count: u64,
    pub(crate) codec: u8,
}

impl RatioKey {
    /// The key of operation `op` on `n` values of dtype tag `dtype` with `codec`.
    pub(crate) fn of(op: u8, dtype: u8, n: usize, codec: crate::codec::CodecKind) -> Self {
        RatioKey {
            op,
            dtype,
            count: n as u64,
            codec: codec.tag(),
        }
    }
}

/// Ratios every rank holds bit for bit, derived from the full list of every rank's values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Agreed(WireRatio);

fn positive(all: &[f64]) -> bool {
    !all.is_empty() && all.iter().all(|r| r.is_finite() && *r > 0.0)
}

impl Agreed {
    /// From every rank's ratio *estimate* (`all[j]` from rank `j`; identical slices on all ranks
    /// give identical results): the larger message of a step comes from the worst rank
    /// (`major` = the smallest estimate), and the two messages of a step carry twice the mean
    /// bytes, the mean being the harmonic mean `h` of the estimates (`1/minor = 2/h - 1/major`;
    /// two ranks: the larger estimate; one rank: `major = minor`). `None` when a value is not a
    /// positive finite number (a rank failed to estimate): the caller then runs raw and caches
    /// nothing.
    pub(crate) fn from_all(all: &[f64]) -> Option<Agreed> {
        if !positive(all) {
            return None;
        }
        let inv_h: f64 = all.iter().map(|x| 1.0 / x).sum::<f64>() / all.len() as f64;
        let major = all.iter().copied().fold(f64::INFINITY, f64::min);
        let inv_minor = (2.0 * inv_h - 1.0 / major).max(0.0);
        let minor = if inv_minor > 0.0 {
            (1.0 / inv_minor).max(major)
        } else {
            f64::MAX
        };
        (major.is_finite() && minor > 0.0).then_some(Agreed(WireRatio { major, minor }))
    }

    /// From every rank's *measured* pair (`majors[j]`, `minors[j]` from rank `j`): the slowest
    /// rank's, i.e. the smallest of each (`minor` at least `major`).
    pub(crate) fn from_measured(majors: &[f64], minors: &[f64]) -> Option<Agreed> {
        if !positive(majors) || !positive(minors) {
            return None;
        }
        let major = majors.iter().copied().fold(f64::INFINITY, f64::min);
        let minor = minors
            .iter()
            .copied()
            .fold(f64::INFINITY, f64::min)
            .max(major);
        Some(Agreed(WireRatio { major, minor }))
    }

    /// The agreed ratios.
    pub(crate) fn value(self) -> WireRatio {
        self.0
    }
}

/// Decode a list of little-endian `f64` (an allgather of one value per rank).
pub(crate) fn f64s(bytes: &[u8]) -> Vec<f64> {
    bytes
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect()
}

/// Agreed ratios per [`RatioKey`], each reused for [`REFRESH`](Self::REFRESH)` - 1` calls after
/// it was stored; the next call misses, so a new estimate is agreed (counting is per key and
/// identical on all ranks, so all ranks miss on the same call).
#[derive(Debug, Default)]
pub(crate) struct AgreedRatios {
    map: HashMap<RatioKey, (Agreed, u32)>,
}

impl AgreedRatios {
    /// Every `REFRESH`-th `Auto` call of a key re-estimates (unless a compressed call stored a
    /// measured ratio meanwhile).
    pub(crate) const REFRESH: u32 = 16;

    /// The agreed ratio for this call of `key`, or `None` when an estimate must be agreed (no
    /// entry, or the entry has been used `REFRESH - 1` times). Counts the use.
    pub(crate) fn lookup(&mut self, key: RatioKey) -> Option<WireRatio> {
        let e = self.map.get_mut(&key)?;
        if e.1 + 1 >= Self::REFRESH {
            return None;
        }
        e.1 += 1;
        Some(e.0.value())
    }

    /// Store an agreed ratio (resets the key's use count).
    pub(crate) fn put(&mut self, key: RatioKey, r: Agreed) {
        self.map.insert(key, (r, 0));
    }

    /// Forget everything (the bound or the policy changed: old ratios do not apply).
    pub(crate) fn clear(&mut self) {
        self.map.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: RatioKey = RatioKey {
        op: 5,
        dtype: 1,
        count: 1 << 20,
        codec: 1,
    };

    #[test]
    fn agreement_takes_the_worst_rank_and_the_mean_and_rejects_failures() {
        // two ranks: the worse estimate is the larger message, the better one the smaller
        let a = Agreed::from_all(&[2.0, 6.0]).unwrap().value();
        assert_eq!(a.major, 2.0);
        assert!((a.minor - 6.0).abs() < 1e-12, "{a:?}");
        assert_eq!(
            Agreed::from_all(&[4.0]).unwrap().value(),
            WireRatio::from(4.0)
        );
        // four ranks 2, 4, 4, 4: harmonic mean 3.2, 1/minor = 2/3.2 - 1/2 = 1/8
        let b = Agreed::from_all(&[4.0, 2.0, 4.0, 4.0]).unwrap().value();
        assert_eq!(b.major, 2.0);
        assert!((b.minor - 8.0).abs() < 1e-12, "{b:?}");
        // measured pairs: the smallest of each, minor never below major
        let m = Agreed::from_measured(&[10.0, 8.0], &[20.0, 30.0])
            .unwrap()
            .value();
        assert_eq!((m.major, m.minor), (8.0, 20.0));
        let m = Agreed::from_measured(&[10.0], &[5.0]).unwrap().value();
        assert_eq!((m.major, m.minor), (10.0, 10.0));
        assert!(Agreed::from_measured(&[10.0], &[0.0]).is_none());
        assert!(Agreed::from_all(&[]).is_none());
        assert!(Agreed::from_all(&[2.0, -1.0]).is_none());
        assert!(Agreed::from_all(&[2.0, 0.0]).is_none());
        assert!(Agreed::from_all(&[2.0, f64::NAN]).is_none());
        assert!(Agreed::from_all(&[2.0, f64::INFINITY]).is_none());
        // bytes of an allgather: the same list on every rank gives the same bits
        let bytes: Vec<u8> = [3.5f64, 7.25, 11.0]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let v = f64s(&bytes);
        assert_eq!(v, vec![3.5, 7.25, 11.0]);
        let x = Agreed::from_all(&v).unwrap().value();
        let y = Agreed::from_all(&f64s(&bytes)).unwrap().value();
        assert_eq!(x.major.to_bits(), y.major.to_bits());
        assert_eq!(x.minor.to_bits(), y.minor.to_bits());
    }

    /// Several "ranks" with different local estimates run the cache protocol: they agree
    /// (allgather + harmonic mean) on misses only, and always hold the same cache state.
    #[test]
    fn ranks_miss_and_hit_together_and_refresh_every_16th_call() {
        let p = 3;
        let mut caches: Vec<AgreedRatios> = (0..p).map(|_| AgreedRatios::default()).collect();
        let mut misses = Vec::new();
        for call in 0..40u32 {
            let looked: Vec<Option<WireRatio>> = caches.iter_mut().map(|c| c.lookup(K)).collect();
            assert!(
                looked.iter().all(|x| *x == looked[0]),
                "ranks disagree at call {call}: {looked:?}"
            );
            if looked[0].is_none() {
                misses.push(call);
                // rank-local estimates differ (and change with the call)
                let local: Vec<f64> = (0..p).map(|r| 2.0 + r as f64 + call as f64).collect();
                // the agreement round: everybody sees every estimate
                for c in caches.iter_mut() {
                    c.put(K, Agreed::from_all(&local).unwrap());
                }
            }
        }
        assert_eq!(misses, vec![0, 16, 32]);
        // other keys are independent
        let other = RatioKey { count: 7, ..K };
        assert!(caches[0].lookup(other).is_none());
        assert!(caches[0].lookup(K).is_some());
        caches[0].clear();
        assert!(caches[0].lookup(K).is_none());
    }

    #[test]
    fn a_put_after_a_compressed_call_restarts_the_count() {
        let mut c = AgreedRatios::default();
        c.put(K, Agreed::from_all(&[5.0]).unwrap());
        for _ in 0..10 {
            assert_eq!(c.lookup(K), Some(WireRatio::from(5.0)));
        }
        c.put(K, Agreed::from_all(&[8.0, 8.0]).unwrap());
        for _ in 0..AgreedRatios::REFRESH - 1 {
            assert_eq!(c.lookup(K), Some(WireRatio::from(8.0)));
        }
        assert!(c.lookup(K).is_none());
        // a failed estimate stores nothing: the next call misses again
        assert!(c.lookup(K).is_none());
    }
}
