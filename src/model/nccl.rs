//! The model of the device-native NCCL operations: [`NcclProfile`] (link curves and codec
//! speeds) and the sampled [`WireRatio`]s.

use super::{pipeline, seconds_at, CodecSpeed, NcclLink};
use crate::codec::CodecKind;

/// Compression ratios (moved bytes / wire bytes) of the two directions of the exchanges of a
/// compressed operation: `major` for the larger message of each exchange (per step the
/// direction that finishes last), `minor` for the smaller one (`minor >= major`). A plain ratio
/// converts to the symmetric pair (both directions alike).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct WireRatio {
    /// Ratio of the larger message of every exchange.
    pub major: f64,
    /// Ratio of the smaller message of every exchange (`f64::MAX`: nothing comes back).
    pub minor: f64,
}

impl From<f64> for WireRatio {
    fn from(r: f64) -> Self {
        WireRatio { major: r, minor: r }
    }
}

impl WireRatio {
    /// `(major, minor)` made usable: positive, `minor >= major`.
    pub(crate) fn sane(self) -> (f64, f64) {
        let major = if self.major > 0.0 { self.major } else { 1e-9 };
        let minor = if self.minor.is_nan() {
            major
        } else {
            self.minor.max(major)
        };
        (major, minor)
    }
}

/// Calibrated speeds of the NCCL links and the device codec (identical on all ranks).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct NcclProfile {
    /// Link label (`nvlink`, `socket`).
    pub transport: String,
    /// Raw NCCL allreduce: time by buffer size (calibrated at several sizes and interpolated,
    /// [`NcclLink`]; `latency + bytes/bandwidth` in profiles without points).
    pub allreduce: NcclLink,
    /// Raw NCCL allgather: time by gathered output size.
    pub allgather: NcclLink,
    /// Pairwise exchange (grouped ncclSend + ncclRecv of `bytes` each way): time by message
    /// size, evaluated at each compressed piece's size by the predictions.
    pub p2p: NcclLink,
    /// One-way message (ncclSend on one rank, ncclRecv on its peer, nothing coming back): time
    /// by message size. `None` in profiles written before it was calibrated: then [`p2p`]
    /// (both directions loaded) stands in.
    ///
    /// [`p2p`]: Self::p2p
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p2p_one: Option<NcclLink>,
    /// Device codec speeds, one record per calibrated codec (f32 then f64 when calibrated):
    /// `decompress` the plain decode (the allgather's, the point-to-point's and the ring's
    /// final round), `decompress_add` the fused decompress-and-add of the ring's steps, and the
    /// records' fixed costs (`compress_overhead`, `decompress_overhead`,
    /// `decompress_add_overhead`; 0 in profiles written before) are each codec's own
    /// ([`codec_fixed`](Self::codec_fixed)). Profiles written before the plain decode was
    /// calibrated hold the fused one in `decompress` and no `decompress_add`: it then stands for
    /// both.
    pub codecs: Vec<CodecSpeed>,
    /// Host cost per pipeline piece (the size message round on the bootstrap transport), seconds.
    pub piece_overhead: f64,
    /// Fixed cost of one device compression call (launches, size readback, header), seconds, of
    /// the policy's codec at calibration; stands for codecs without their own.
    #[serde(default)]
    pub compress_fixed: f64,
    /// Fixed cost of one device decompression call (header readback, launch, error flag), as
    /// `compress_fixed`.
    #[serde(default)]
    pub decompress_fixed: f64,
    /// Input bytes per second of the value-range pass a compressing call makes over its input,
    /// beyond [`range_fixed`](Self::range_fixed); `0`: not calibrated, no cost.
    #[serde(default)]
    pub range_rate: f64,
    /// Fixed seconds of one value-range pass (launch and read-back: the intercept of the line
    /// through a tiny and a large pass); 0 in profiles written before (whose `range_rate` came
    /// from one 64 MiB pass and so includes it).
    #[serde(default)]
    pub range_fixed: f64,
    /// Bytes per second of a device-to-device copy, reported by the calibration; not charged
    /// (the reductions' ring reads its input in place); `0`: not calibrated.
    #[serde(default)]
    pub copy_rate: f64,
}

impl NcclProfile {
    /// Guessed speeds for a link label (before calibration): NVLink ≈ 300 GB/s algbw, socket
    /// ≈ 3.5 GB/s; codec ≈ 300 GB/s.
    pub fn guess(transport: &str) -> Self {
        let bw = if transport == "socket" { 3.5e9 } else { 300e9 };
        let l = NcclLink::linear(bw, 20e-6);
        NcclProfile {
            transport: transport.to_string(),
            allreduce: l.clone(),
            allgather: l.clone(),
            p2p: l,
            p2p_one: None,
            codecs: Vec::new(),
            piece_overhead: 5e-6,
            compress_fixed: 50e-6,
            decompress_fixed: 50e-6,
            range_rate: 0.0,
            range_fixed: 0.0,
            copy_rate: 0.0,
        }
    }

    /// The calibrated record of `codec` on `dtype_tag` (1 f32, 2 f64), else of any codec on it.
    fn codec_record(&self, codec: CodecKind, dtype_tag: u8) -> Option<&CodecSpeed> {
        self.codecs
            .iter()
            .find(|c| c.codec == codec && c.dtype == dtype_tag)
            .or_else(|| self.codecs.iter().find(|c| c.dtype == dtype_tag))
    }

    /// Device codec throughput `(compress, decompress)` in bytes/s for `codec` on `dtype_tag`
    /// (1 f32, 2 f64; `decompress` the plain decode); a conservative default when not
    /// calibrated.
    pub fn codec_speed(&self, codec: CodecKind, dtype_tag: u8) -> (f64, f64) {
        self.codec_record(codec, dtype_tag)
            .map(|c| (c.compress, c.decompress))
            .unwrap_or((200e9, 300e9))
    }

    /// Fixed seconds `(compress, decompress)` of one device codec call of `codec` on
    /// `dtype_tag`: its record's own (calibrated per codec), else the profile's
    /// [`compress_fixed`](Self::compress_fixed) / [`decompress_fixed`](Self::decompress_fixed)
    /// (profiles written before per-codec fixed costs).
    pub fn codec_fixed(&self, codec: CodecKind, dtype_tag: u8) -> (f64, f64) {
        let own = |v: f64, fallback: f64| if v > 0.0 { v } else { fallback };
        match self.codec_record(codec, dtype_tag) {
            Some(c) => (
                own(c.compress_overhead, self.compress_fixed),
                own(c.decompress_overhead, self.decompress_fixed),
            ),
            None => (self.compress_fixed, self.decompress_fixed),
        }
    }

    /// Seconds of one fused decompress-and-add of `bytes` of output: its own line where
    /// calibrated, else the plain decode's.
    fn decompress_add_s(&self, bytes: f64, codec: CodecKind, dtype_tag: u8) -> f64 {
        match self.codec_record(codec, dtype_tag) {
            Some(c) if c.decompress_add > 0.0 => {
                bytes / c.decompress_add + c.decompress_add_overhead
            }
            _ => {
                let (_, td) = self.codec_speed(codec, dtype_tag);
                bytes / td + self.codec_fixed(codec, dtype_tag).1
            }
        }
    }

    /// Seconds of the codec stage of one pipeline piece of `piece` bytes, `(compress,
    /// decompress)`: each call's throughput term and fixed cost, the compression also the size
    /// message that follows it.
    fn piece_codec_s(&self, piece: f64, codec: CodecKind, dtype_tag: u8) -> (f64, f64) {
        let (tc, td) = self.codec_speed(codec, dtype_tag);
        let (fc, fd) = self.codec_fixed(codec, dtype_tag);
        (piece / tc + fc + self.piece_overhead, piece / td + fd)
    }

    /// Seconds of the value-range pass over `bytes`.
    fn range_s(&self, bytes: f64) -> f64 {
        if self.range_rate > 0.0 {
            seconds_at(bytes, self.range_rate) + self.range_fixed
        } else {
            0.0
        }
    }

    /// The one-way link ([`p2p_one`](Self::p2p_one), else the pairwise curve).
    pub fn one_way(&self) -> &NcclLink {
        self.p2p_one.as_ref().unwrap_or(&self.p2p)
    }

    /// Seconds of one exchange round in which this rank's `peers` exchanges carry `major` bytes
    /// in one direction and `minor <= major` bytes in the other, all at once: while both
    /// directions move, the pairwise curve at `minor` ([`p2p`](Self::p2p)); the rest of the
    /// larger message alone, on the one-way curve (`one(major) - one(minor)`). Symmetric
    /// messages: the pairwise curve; nothing coming back: the one-way curve.
    pub fn exchange(&self, major: f64, minor: f64, peers: f64) -> f64 {
        let minor = minor.clamp(0.0, major.max(0.0));
        let one = self.one_way();
        let solo = (one.time_many(major, peers) - one.time_many(minor, peers)).max(0.0);
        self.p2p.time_many(minor, peers) + solo
    }

    /// Seconds of one round in which every rank sends its stream (this rank's `major` bytes at
    /// most, `minor` at least) to all `peers` others at once and receives theirs: with one peer
    /// the pairwise [`exchange`](Self::exchange); with more, the raw allgather curve at the
    /// gathered size `(peers + 1) × major`, since such a round is an allgather of the streams
    /// and the links to the peers carry them side by side (a sum of pairwise exchanges would
    /// charge them one after another).
    pub fn gather_exchange(&self, major: f64, minor: f64, peers: f64) -> f64 {
        if peers <= 1.0 {
            return self.exchange(major, minor, peers);
        }
        self.allgather.time((peers + 1.0) * major.max(minor))
    }

    /// Predicted `(raw, compressed)` seconds of an allreduce of `bytes` per rank over `p` ranks
    /// at compression ratios `ratio` ([`WireRatio`]; a plain `f64` for both directions alike),
    /// with `pieces` pipeline pieces per segment (`reduce_scatter_only`: stop after the
    /// reduce-scatter).
    ///
    /// Compressed (the device ring, `comm::device_ring`, which reads the input in place): the
    /// value-range pass and its agreement round, then `p-1` ring steps and (allreduce) one
    /// allgather round, each pipelined over `pieces` (`g + n + (k-1) max(g, n)` per round; the
    /// operations run the ring on whole segments, `pieces = 1`): per piece the codec stage
    /// (compress + fixed + size message, the fused decompress-and-add + fixed; the allgather
    /// round decodes the `p-1` other ranks' pieces with the plain decode, this rank's own values
    /// are left in place by its compression) and the network stage ([`exchange`](Self::exchange) of the pieces'
    /// compressed sizes, `bytes / p / pieces / ratio`). Raw: the allreduce curve at `bytes`.
    #[allow(clippy::too_many_arguments)]
    pub fn predict_allreduce(
        &self,
        bytes: f64,
        p: usize,
        ratio: impl Into<WireRatio>,
        pieces: usize,
        codec: CodecKind,
        dtype_tag: u8,
        reduce_scatter_only: bool,
    ) -> (f64, f64) {
        let pf = p.max(1) as f64;
        let (major, minor) = ratio.into().sane();
        let piece = bytes / pf / pieces.max(1) as f64;
        let (comp, dec) = self.piece_codec_s(piece, codec, dtype_tag);
        let dec_add = self.decompress_add_s(piece, codec, dtype_tag);
        let net = self.exchange(piece / major, piece / minor, 1.0);
        let prep = self.range_s(bytes) + self.piece_overhead;
        let rs = (pf - 1.0) * pipeline(&[comp + dec_add, net], pieces);
        if reduce_scatter_only {
            // NCCL's reduce-scatter moves (p-1)/p of the data of an allreduce's first half
            let raw = self.allreduce.time_many(bytes, 0.5);
            return (raw, prep + rs);
        }
        // each piece goes to the p-1 other ranks in one grouped round
        let net = self.gather_exchange(piece / major, piece / minor, pf - 1.0);
        let ag = pipeline(&[comp + (pf - 1.0) * dec, net], pieces);
        (self.allreduce.time(bytes), prep + rs + ag)
    }

    /// Predicted `(raw, compressed)` seconds of an allgather of `bytes` per rank (compressed:
    /// the value-range pass, then one pipelined round of `pieces` pieces of
    /// `bytes / pieces / ratio` to every other rank, `p` decompressions per piece; raw: the
    /// allgather curve at `p × bytes`).
    pub fn predict_allgather(
        &self,
        bytes: f64,
        p: usize,
        ratio: impl Into<WireRatio>,
        pieces: usize,
        codec: CodecKind,
        dtype_tag: u8,
    ) -> (f64, f64) {
        let pf = p.max(1) as f64;
        let (major, minor) = ratio.into().sane();
        let piece = bytes / pieces.max(1) as f64;
        let (comp, dec) = self.piece_codec_s(piece, codec, dtype_tag);
        let gpu = comp + pf * dec;
        let net = self.gather_exchange(piece / major, piece / minor, pf - 1.0);
        let cmp = self.range_s(bytes) + pipeline(&[gpu, net], pieces);
        (self.allgather.time(pf * bytes), cmp)
    }

    /// Predicted `(raw, compressed)` seconds of one point-to-point message of `bytes`, one way
    /// ([`one_way`](Self::one_way) curve; compressed: the value-range pass, then `pieces`
    /// pipelined messages of `bytes / pieces / ratio`).
    pub fn predict_p2p(
        &self,
        bytes: f64,
        ratio: f64,
        pieces: usize,
        codec: CodecKind,
        dtype_tag: u8,
    ) -> (f64, f64) {
        let cr = ratio.max(1e-9);
        let piece = bytes / pieces.max(1) as f64;
        let lk = self.one_way();
        let (comp, dec) = self.piece_codec_s(piece, codec, dtype_tag);
        let gpu = comp + dec;
        let cmp = self.range_s(bytes) + pipeline(&[gpu, lk.time(piece / cr)], pieces);
        (lk.time(bytes), cmp)
    }
}

#[cfg(test)]
mod tests {
    use super::super::choice::{choose, Candidate};
    use super::*;

    /// Every NCCL operation's `Auto` choice for a 512 MiB f32 buffer at the ratios aatrox (70)
    /// and pfpl (149) reach on a log-normal field at `noa:1e-2`, with GPU-like codec speeds
    /// (aatrox the faster): over a slow link (1 GB/s) pfpl, over a fast one (25 GB/s, where
    /// compression still beats raw NCCL) aatrox.
    #[test]
    fn auto_picks_the_denser_codec_on_a_slow_link_and_the_faster_on_a_fast_one() {
        let ratios = [(CodecKind::Aatrox, 70.0), (CodecKind::Pfpl, 149.0)];
        for (bw, want) in [(1e9, CodecKind::Pfpl), (25e9, CodecKind::Aatrox)] {
            let mut prof = NcclProfile::guess("nvlink");
            let l = NcclLink::linear(bw, 20e-6);
            (prof.allreduce, prof.allgather, prof.p2p) = (l.clone(), l.clone(), l);
            prof.codecs = [
                (CodecKind::Aatrox, 1300e9, 1900e9),
                (CodecKind::Pfpl, 500e9, 600e9),
            ]
            .map(|(codec, compress, decompress)| {
                CodecSpeed::new(codec, 1, compress, decompress, 10.0)
            })
            .to_vec();
            // 512 MiB per rank, 4 ranks, 8 pipeline pieces
            type Op = fn(&NcclProfile, f64, CodecKind) -> (f64, f64);
            let ops: [(&str, Op); 4] = [
                ("allreduce", |p, r, c| {
                    p.predict_allreduce(536870912.0, 4, r, 8, c, 1, false)
                }),
                ("reduce_scatter", |p, r, c| {
                    p.predict_allreduce(536870912.0, 4, r, 8, c, 1, true)
                }),
                ("allgather", |p, r, c| {
                    p.predict_allgather(536870912.0, 4, r, 8, c, 1)
                }),
                ("send", |p, r, c| p.predict_p2p(536870912.0, r, 8, c, 1)),
            ];
            for (name, op) in ops {
                let raw = op(&prof, 1.0, want).0;
                let c = choose(
                    raw,
                    ratios.map(|(codec, ratio)| Candidate {
                        codec,
                        ratio,
                        predicted_s: op(&prof, ratio, codec).1,
                    }),
                );
                assert_eq!(c.codec, Some(want), "{name} at {bw:e} B/s: {c:?}");
            }
        }
    }

    /// A codec's own fixed costs replace the profile's; records without them (profiles written
    /// before) and uncalibrated codecs keep the profile's.
    #[test]
    fn per_codec_fixed_costs_fall_back_to_the_profiles() {
        let mut prof = NcclProfile::guess("socket");
        prof.codecs = vec![
            CodecSpeed::new(CodecKind::Aatrox, 1, 3e11, 4e11, 10.0),
            CodecSpeed {
                compress_overhead: 80e-6,
                decompress_overhead: 70e-6,
                ..CodecSpeed::new(CodecKind::Pfpl, 1, 1e11, 2e11, 20.0)
            },
        ];
        assert_eq!(prof.codec_fixed(CodecKind::Aatrox, 1), (50e-6, 50e-6));
        assert_eq!(prof.codec_fixed(CodecKind::Pfpl, 1), (80e-6, 70e-6));
        assert_eq!(prof.codec_fixed(CodecKind::Pfpl, 2), (50e-6, 50e-6));
        let (_, a) = prof.predict_p2p(1e8, 10.0, 1, CodecKind::Pfpl, 1);
        prof.codecs[1].compress_overhead = 0.0;
        let (_, b) = prof.predict_p2p(1e8, 10.0, 1, CodecKind::Pfpl, 1);
        assert!((a - b - 30e-6).abs() < 1e-12, "{a} vs {b}");
    }
}
