//! The model of the device-direct operations (NCCL, the loopback; methods of [`Profile`]) and
//! the sampled [`WireRatio`]s.

use super::{pipeline, Curve, Profile};
use crate::codec::CodecKind;

/// The smallest predicted gain for which [`Profile::ring_pieces`] doubles the pieces.
pub const PIECES_MIN_GAIN: f64 = 0.05;

/// The smallest ring piece [`Profile::ring_pieces`] cuts, in uncompressed bytes.
pub const PIECE_MIN_BYTES: f64 = 16.0 * 1048576.0;

/// Pieces of a `piece_total`-byte buffer: from one, doubled while the doubled count's
/// predicted time `t(k)` is at least [`PIECES_MIN_GAIN`] shorter and pieces stay at least
/// [`PIECE_MIN_BYTES`] (at most 64).
fn doubled_pieces(piece_total: f64, t: impl Fn(usize) -> f64) -> usize {
    let mut k = 1;
    let mut tk = t(1);
    while k < 64 && piece_total / (2 * k) as f64 >= PIECE_MIN_BYTES {
        let t2 = t(2 * k);
        // (a NaN prediction stops too)
        let gains = t2 <= tk * (1.0 - PIECES_MIN_GAIN);
        if !gains {
            break;
        }
        (k, tk) = (2 * k, t2);
    }
    k
}

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

/// The model of the device-direct operations (device buffers carried device to device by the
/// transport: NCCL, the in-process loopback): `comm::device_ring`, `comm::device_gather` and the
/// pipelined point-to-point messages, predicted from the profile's exchange and one-way curves,
/// the transport's own collectives (the raw path) and the GPU codec lines.
impl Profile {
    /// Device codec throughput `(compress, decompress)` in bytes/s for `codec` on `dtype_tag`
    /// (1 f32, 2 f64; `decompress` the plain decode; [`gpu_lines`](Self::gpu_lines)).
    pub fn gpu_speed(&self, codec: CodecKind, dtype_tag: u8) -> (f64, f64) {
        let c = self.gpu_lines(codec, dtype_tag);
        (c.compress, c.decompress)
    }

    /// Fixed seconds `(compress, decompress)` of one device codec call of `codec` on
    /// `dtype_tag` ([`gpu_lines`](Self::gpu_lines)).
    pub fn gpu_fixed(&self, codec: CodecKind, dtype_tag: u8) -> (f64, f64) {
        let c = self.gpu_lines(codec, dtype_tag);
        (c.compress_overhead, c.decompress_overhead)
    }

    /// Seconds of one fused decompress-and-add of `bytes` of output: its own line where
    /// calibrated, else the plain decode's.
    fn decompress_add_s(&self, bytes: f64, codec: CodecKind, dtype_tag: u8) -> f64 {
        let c = self.gpu_lines(codec, dtype_tag);
        if c.decompress_add > 0.0 {
            bytes / c.decompress_add + c.decompress_add_overhead
        } else {
            bytes / c.decompress + c.decompress_overhead
        }
    }

    /// Seconds of the codec stage of one pipeline piece of `piece` bytes, `(compress,
    /// decompress)`: each call's throughput term and fixed cost, the compression also the size
    /// message that follows it.
    fn piece_codec_s(&self, piece: f64, codec: CodecKind, dtype_tag: u8) -> (f64, f64) {
        let (tc, td) = self.gpu_speed(codec, dtype_tag);
        let (fc, fd) = self.gpu_fixed(codec, dtype_tag);
        (piece / tc + fc + self.piece_overhead, piece / td + fd)
    }

    /// The one-way link ([`link_one_way`](Self::link_one_way), else the exchange curve).
    pub fn one_way(&self) -> &Curve {
        if self.link_one_way.is_empty() {
            &self.link_exchange
        } else {
            &self.link_one_way
        }
    }

    /// The transport's own allreduce (else the exchange curve).
    fn own_allreduce(&self) -> &Curve {
        self.allreduce.as_ref().unwrap_or(&self.link_exchange)
    }

    /// The transport's own allgather (else the exchange curve).
    fn own_allgather(&self) -> &Curve {
        self.allgather.as_ref().unwrap_or(&self.link_exchange)
    }

    /// Seconds of one exchange round in which this rank's `peers` exchanges carry `major` bytes
    /// in one direction and `minor <= major` bytes in the other, all at once: while both
    /// directions move, the pairwise curve at `minor` ([`link_exchange`](Self::link_exchange)); the rest of the
    /// larger message alone, on the one-way curve (`one(major) - one(minor)`). Symmetric
    /// messages: the pairwise curve; nothing coming back: the one-way curve.
    pub fn exchange(&self, major: f64, minor: f64, peers: f64) -> f64 {
        let minor = minor.clamp(0.0, major.max(0.0));
        let one = self.one_way();
        let solo = (one.time_many(major, peers) - one.time_many(minor, peers)).max(0.0);
        self.link_exchange.time_many(minor, peers) + solo
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
        self.own_allgather().time((peers + 1.0) * major.max(minor))
    }

    /// Predicted `(raw, compressed)` seconds of an allreduce of `bytes` per rank over `p` ranks
    /// at compression ratios `ratio` ([`WireRatio`]; a plain `f64` for both directions alike),
    /// with `pieces` pipeline pieces per segment (`reduce_scatter_only`: stop after the
    /// reduce-scatter).
    ///
    /// Compressed (the device ring, `comm::device_ring`, which reads the input in place): the
    /// value-range pass and its agreement round, then `p-1` ring steps and (allreduce) one
    /// allgather round, each pipelined over `pieces` (`g + n + (k-1) max(g, n)` per round; the
    /// operations run the ring with [`ring_pieces`](Self::ring_pieces)): per piece the codec stage
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
        let prep = self.reduction_range_s(bytes, !reduce_scatter_only, codec) + self.piece_overhead;
        let rs = (pf - 1.0) * pipeline(&[comp + dec_add, net], pieces);
        if reduce_scatter_only {
            // NCCL's reduce-scatter moves (p-1)/p of the data of an allreduce's first half
            let raw = self.own_allreduce().time_many(bytes, 0.5);
            return (raw, prep + rs);
        }
        // each piece goes to the p-1 other ranks in one grouped round
        let net = self.gather_exchange(piece / major, piece / minor, pf - 1.0);
        let ag = pipeline(&[comp + (pf - 1.0) * dec, net], pieces);
        (self.own_allreduce().time(bytes), prep + rs + ag)
    }

    /// Pieces per segment for the device ring of an allreduce (or, `reduce_scatter_only`, a
    /// reduce-scatter) of `bytes` per rank over `p` ranks at `ratio` ([`predict_allreduce`]'s
    /// arguments): doubling from one piece while the doubled count is predicted at least
    /// [`PIECES_MIN_GAIN`] faster, and pieces stay at least [`PIECE_MIN_BYTES`]. Pieces overlap
    /// the wire with the codec's work but cost each piece its codec calls' fixed time and host
    /// synchronisations, and on a link as fast as NVLink the transfers also take SMs from the
    /// kernels, which the model does not see: it is trusted only for clear gains (slower links,
    /// where the wire is a large part of a step).
    ///
    /// [`predict_allreduce`]: Self::predict_allreduce
    #[allow(clippy::too_many_arguments)]
    pub fn ring_pieces(
        &self,
        bytes: f64,
        p: usize,
        ratio: impl Into<WireRatio>,
        codec: CodecKind,
        dtype_tag: u8,
        reduce_scatter_only: bool,
    ) -> usize {
        let ratio = ratio.into();
        doubled_pieces(bytes / p.max(1) as f64, |k| {
            self.predict_allreduce(bytes, p, ratio, k, codec, dtype_tag, reduce_scatter_only)
                .1
        })
    }

    /// Pieces for the device allgather of `bytes` per rank over `p` ranks at `ratio`, by the
    /// rule of [`ring_pieces`](Self::ring_pieces) on [`predict_allgather`](Self::predict_allgather).
    pub fn gather_pieces(
        &self,
        bytes: f64,
        p: usize,
        ratio: impl Into<WireRatio>,
        codec: CodecKind,
        dtype_tag: u8,
    ) -> usize {
        let ratio = ratio.into();
        doubled_pieces(bytes, |k| {
            self.predict_allgather(bytes, p, ratio, k, codec, dtype_tag)
                .1
        })
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
        (self.own_allgather().time(pf * bytes), cmp)
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
    use super::super::CodecSpeed;
    use super::*;

    /// Every NCCL operation's `Auto` choice for a 512 MiB f32 buffer at the ratios aatrox (70)
    /// and pfpl (149) reach on a log-normal field at `noa:1e-2`, with GPU-like codec speeds
    /// (aatrox the faster): over a slow link (1 GB/s) pfpl, over a fast one (25 GB/s, where
    /// compression still beats raw NCCL) aatrox.
    #[test]
    fn auto_picks_the_denser_codec_on_a_slow_link_and_the_faster_on_a_fast_one() {
        let ratios = [(CodecKind::Aatrox, 70.0), (CodecKind::Pfpl, 149.0)];
        for (bw, want) in [(1e9, CodecKind::Pfpl), (25e9, CodecKind::Aatrox)] {
            let mut prof = Profile::direct_guess("nvlink");
            let l = Curve::linear(bw, 20e-6);
            (prof.allreduce, prof.allgather, prof.link_exchange) =
                (Some(l.clone()), Some(l.clone()), l);
            prof.gpu_codecs = [
                (CodecKind::Aatrox, 1300e9, 1900e9),
                (CodecKind::Pfpl, 500e9, 600e9),
            ]
            .map(|(codec, compress, decompress)| {
                CodecSpeed::new(codec, 1, compress, decompress, 10.0)
            })
            .to_vec();
            // 512 MiB per rank, 4 ranks, 8 pipeline pieces
            type Op = fn(&Profile, f64, CodecKind) -> (f64, f64);
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

    /// Each codec's own fixed costs are charged; a codec without a record (or a dtype without
    /// one) takes those of the calibrated codec (the first record), or of its f32 record.
    #[test]
    fn per_codec_fixed_costs_and_their_fallbacks() {
        let mut prof = Profile::direct_guess("socket");
        prof.gpu_codecs = vec![
            CodecSpeed {
                compress_overhead: 40e-6,
                decompress_overhead: 30e-6,
                ..CodecSpeed::new(CodecKind::Aatrox, 1, 3e11, 4e11, 10.0)
            },
            CodecSpeed {
                compress_overhead: 80e-6,
                decompress_overhead: 70e-6,
                ..CodecSpeed::new(CodecKind::Pfpl, 1, 1e11, 2e11, 20.0)
            },
        ];
        assert_eq!(prof.gpu_fixed(CodecKind::Aatrox, 1), (40e-6, 30e-6));
        assert_eq!(prof.gpu_fixed(CodecKind::Pfpl, 1), (80e-6, 70e-6));
        assert_eq!(prof.gpu_fixed(CodecKind::Pfpl, 2), (80e-6, 70e-6));
        assert_eq!(prof.gpu_fixed(CodecKind::Gpz, 1), (40e-6, 30e-6));
        let (_, a) = prof.predict_p2p(1e8, 10.0, 1, CodecKind::Pfpl, 1);
        prof.gpu_codecs[1].compress_overhead = 50e-6;
        let (_, b) = prof.predict_p2p(1e8, 10.0, 1, CodecKind::Pfpl, 1);
        assert!((a - b - 30e-6).abs() < 1e-12, "{a} vs {b}");
        // without records: the guess
        let guess = Profile::direct_guess("socket");
        assert_eq!(guess.gpu_fixed(CodecKind::Pfpl, 1), (150e-6, 150e-6));
    }

    /// Pieces where the wire is a large part of a ring step (a 10 GB/s link), whole segments
    /// where the codec's work dominates (an NVLink-class link), never pieces below the minimum.
    #[test]
    fn ring_pieces_cut_segments_only_where_the_wire_weighs() {
        let with_link = |bw: f64| {
            let mut prof = Profile::direct_guess("nvlink");
            let l = Curve::linear(bw, 20e-6);
            (prof.allreduce, prof.allgather, prof.link_exchange) =
                (Some(l.clone()), Some(l.clone()), l);
            let mut c = CodecSpeed::new(CodecKind::Aatrox, 1, 1300e9, 1900e9, 10.0);
            // the fixed costs of one codec call measured on an H200 host
            (c.compress_overhead, c.decompress_overhead) = (42e-6, 27e-6);
            prof.gpu_codecs = vec![c];
            prof
        };
        let gib = 1073741824.0;
        let fast = with_link(350e9);
        assert_eq!(
            fast.ring_pieces(gib, 2, 12.9, CodecKind::Aatrox, 1, false),
            1
        );
        let slow = with_link(10e9);
        let k = slow.ring_pieces(gib, 2, 12.9, CodecKind::Aatrox, 1, false);
        assert!(k > 1, "{k} pieces on a slow link");
        // each doubling was predicted at least PIECES_MIN_GAIN faster
        let t = |k| {
            slow.predict_allreduce(gib, 2, 12.9, k, CodecKind::Aatrox, 1, false)
                .1
        };
        assert!(t(k) <= t(1) * (1.0 - PIECES_MIN_GAIN));
        // a 64 MiB allreduce over 2 ranks: 32 MiB segments, at most 2 pieces of 16 MiB
        let small = with_link(1e9).ring_pieces(67108864.0, 2, 12.9, CodecKind::Aatrox, 1, false);
        assert!((1..=2).contains(&small), "{small}");
    }
}
