//! The one place where a message's path is chosen: raw, or compressed with which codec.
//!
//! Every operation predicts the time of its raw path and, for each candidate codec, the time of
//! its compressed path (from the codec's calibrated speeds and the message's sampled ratio), and
//! hands them to [`choose`]. The fastest compressed candidate wins if it beats raw by the
//! hysteresis margin [`HYSTERESIS`]; otherwise the message goes raw. On a slow link the ratio
//! dominates the compressed time, so the higher-ratio codec wins; on a fast link the codec's own
//! speed does, so the faster codec wins.
//!
//! ```
//! use zcomm::model::choice::{choose, Candidate};
//! use zcomm::CodecKind;
//! let c = choose(
//!     1.0,
//!     [
//!         Candidate { codec: CodecKind::Aatrox, ratio: 70.0, predicted_s: 0.30 },
//!         Candidate { codec: CodecKind::Pfpl, ratio: 149.0, predicted_s: 0.20 },
//!     ],
//! );
//! assert_eq!(c.codec, Some(CodecKind::Pfpl));
//! assert!(choose(1.0, [Candidate { codec: CodecKind::Aatrox, ratio: 2.0, predicted_s: 0.99 }])
//!     .codec
//!     .is_none());
//! ```

use crate::codec::CodecKind;

/// A compressed path must be predicted at least this much faster than raw (`t_cmp < 0.95 t_raw`)
/// to be taken: a margin against the model's own error, so that a near-tie keeps the cheaper,
/// exact raw path.
pub const HYSTERESIS: f64 = 0.95;

/// The one rule between two predictions: a compressed path predicted at `cmp_s` is taken over
/// the raw path predicted at `raw_s` when it is faster by the [`HYSTERESIS`] margin.
pub fn compressed_wins(cmp_s: f64, raw_s: f64) -> bool {
    cmp_s < HYSTERESIS * raw_s
}

/// Whether `policy` compresses a message whose paths are predicted at `raw_s` and `cmp_s`:
/// never / always as the policy says, `Auto` by [`compressed_wins`].
pub fn policy_compresses(policy: super::Policy, raw_s: f64, cmp_s: f64) -> bool {
    match policy {
        super::Policy::Never => false,
        super::Policy::Always(_) => true,
        super::Policy::Auto(_) => compressed_wins(cmp_s, raw_s),
    }
}

/// One codec's predicted compressed path for a message.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    /// The codec.
    pub codec: CodecKind,
    /// Its (estimated) compression ratio on this message.
    pub ratio: f64,
    /// Predicted time of the compressed path (s).
    pub predicted_s: f64,
}

/// What [`choose`] decided.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Choice {
    /// The codec to compress with; `None`: send raw.
    pub codec: Option<CodecKind>,
    /// Predicted time of the raw path (s).
    pub raw_s: f64,
    /// The best compressed candidate (whether or not it was taken), if any was valid.
    pub best: Option<Candidate>,
}

impl Choice {
    /// Predicted time of the chosen path (s).
    pub fn predicted_s(&self) -> f64 {
        match (self.codec, self.best) {
            (Some(_), Some(b)) => b.predicted_s,
            _ => self.raw_s,
        }
    }
}

/// Choose between the raw path (predicted `raw_s`) and the candidates: the candidate with the
/// smallest predicted time if it is below [`HYSTERESIS`]` · raw_s`, else raw. Candidates with a
/// non-finite or negative prediction are ignored (a broken profile must not make compression look
/// free); ties keep the earlier candidate, so the caller's order (its preferred codec first) breaks
/// them deterministically on every rank.
pub fn choose(raw_s: f64, candidates: impl IntoIterator<Item = Candidate>) -> Choice {
    let best = candidates
        .into_iter()
        .filter(|c| c.predicted_s.is_finite() && c.predicted_s >= 0.0)
        .fold(None::<Candidate>, |b, c| match b {
            Some(b) if b.predicted_s <= c.predicted_s => Some(b),
            _ => Some(c),
        });
    let take = raw_s.is_finite() && best.is_some_and(|b| b.predicted_s < HYSTERESIS * raw_s);
    Choice {
        codec: if take { best.map(|b| b.codec) } else { None },
        raw_s,
        best,
    }
}

/// A smooth, heavy-tailed (log-normal) field of `n` values: `exp(2g)` of a sum of four sines
/// `g` of unit variance: most values sit near 1 and a few reach e^6, and the heavy tail stretches
/// the `noa` range. The case where the codecs' ratios differ most (at `noa:1e-2` pfpl reaches
/// about twice aatrox's), used by the tests and examples of `Auto`'s per-message codec choice.
pub fn log_normal_field(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let t = i as f64 / n as f64;
            let g = [(3.0, 0.3), (17.0, 1.1), (61.0, 2.0), (211.0, 4.2)]
                .iter()
                .map(|(f, ph)| (std::f64::consts::TAU * f * t + ph).sin())
                .sum::<f64>()
                / 2f64.sqrt();
            (2.0 * g).exp() as f32
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(codec: CodecKind, t: f64) -> Candidate {
        Candidate {
            codec,
            ratio: 10.0,
            predicted_s: t,
        }
    }

    #[test]
    fn fastest_candidate_below_the_margin_wins() {
        let c = choose(
            1.0,
            [cand(CodecKind::Aatrox, 0.5), cand(CodecKind::Pfpl, 0.4)],
        );
        assert_eq!(c.codec, Some(CodecKind::Pfpl));
        assert_eq!(c.predicted_s(), 0.4);
    }

    #[test]
    fn near_ties_with_raw_stay_raw() {
        let c = choose(1.0, [cand(CodecKind::Aatrox, 0.96)]);
        assert_eq!(c.codec, None);
        assert_eq!(c.predicted_s(), 1.0);
    }

    #[test]
    fn broken_predictions_never_win() {
        for t in [f64::NAN, -1.0, f64::INFINITY] {
            assert_eq!(choose(1.0, [cand(CodecKind::Aatrox, t)]).codec, None);
        }
        assert_eq!(choose(f64::NAN, [cand(CodecKind::Aatrox, 0.1)]).codec, None);
    }

    #[test]
    fn ties_keep_the_first_candidate() {
        let c = choose(
            1.0,
            [cand(CodecKind::Pfpl, 0.5), cand(CodecKind::Aatrox, 0.5)],
        );
        assert_eq!(c.codec, Some(CodecKind::Pfpl));
    }
}
