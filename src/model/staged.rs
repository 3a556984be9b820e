//! The model of the staged device operations (device buffers staged through pinned host
//! memory and carried by the host transport): [`StagedModel`], the [`Profile`]'s staging and
//! link curves with one GPU codec's call lines, and the per-stage [`Terms`] of every
//! operation's raw and compressed predictions.
//!
//! Codec calls follow the line `t(b) = overhead + b / rate` through a tiny and the full
//! calibration call ([`call_line`](super::call_line)), so a call is charged its fixed cost once.

use super::choice::{self, Candidate, Choice};
#[cfg(test)]
use super::Curve;
use super::{seconds_at, CodecSpeed, Link, Profile, Scenario};
use crate::codec::CodecKind;

/// The staged model of one GPU codec ([`Profile::staged`]): every prediction below reads the
/// profile's staging and link curves and this codec's call lines.
#[derive(Debug, Clone, Copy)]
pub struct StagedModel<'a> {
    /// The calibrated profile.
    pub p: &'a Profile,
    /// The codec's GPU call lines ([`Profile::gpu_lines`]).
    pub c: CodecSpeed,
    /// The codec.
    pub codec: CodecKind,
}

impl std::ops::Deref for StagedModel<'_> {
    type Target = Profile;
    /// The profile's codec-independent terms (staging copies, links) read through the model.
    fn deref(&self) -> &Profile {
        self.p
    }
}

impl Profile {
    /// The staged model of `codec`: its calibrated GPU lines, else those of the codec the
    /// calibration was asked for, else the guess ([`gpu_lines`](Self::gpu_lines)).
    pub fn staged(&self, codec: CodecKind) -> StagedModel<'_> {
        StagedModel {
            p: self,
            c: self.gpu_lines(codec, 1),
            codec,
        }
    }
    /// The GPU codec the device calibration was asked for (the first record; the default
    /// codec when none was calibrated).
    pub fn calibrated_codec(&self) -> CodecKind {
        self.gpu_codecs
            .first()
            .map_or_else(CodecKind::default, |c| c.codec)
    }
    /// `Policy::Auto`'s choice for one staged device operation ([`choice::choose`]): each
    /// candidate `(codec, ratio)` predicted by `cmp(model, codec, ratio)` on the
    /// [`staged`](Self::staged) model of its codec, against the raw path's `raw_s`.
    pub fn choose_staged(
        &self,
        raw_s: f64,
        candidates: &[(CodecKind, f64)],
        cmp: impl Fn(&StagedModel<'_>, CodecKind, f64) -> f64,
    ) -> Choice {
        choice::choose(
            raw_s,
            candidates.iter().map(|&(codec, ratio)| Candidate {
                codec,
                ratio,
                predicted_s: cmp(&self.staged(codec), codec, ratio),
            }),
        )
    }
}

/// The model's time of one device operation split by stage (seconds; the same stages as the
/// measured [`StageTimes`](crate::comm::device::StageTimes), `link` ↔ `network`), so a measurement
/// shows which term misses. `device` holds device-memory passes that
/// [`StageTimes`](crate::comm::device::StageTimes) does not time (the reductions' input copy, range
/// pass and the mean's division). Codec terms include the per-call fixed costs.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Terms {
    /// GPU compression.
    pub compress: f64,
    /// Device→host copies.
    pub d2h: f64,
    /// MPI transfers (latency + bytes / link bandwidth).
    pub link: f64,
    /// Host→device copies.
    pub h2d: f64,
    /// GPU decompression (the ring's fused decompress-and-add included).
    pub decompress: f64,
    /// Device-memory passes (copies, range, scaling).
    pub device: f64,
}

impl Terms {
    /// The predicted time: the sum of the stages (the operations run them one after another).
    pub fn total(&self) -> f64 {
        self.compress + self.d2h + self.link + self.h2d + self.decompress + self.device
    }
    /// Every stage times `k` (e.g. `k` equal chunks).
    pub fn times(&self, k: f64) -> Terms {
        Terms {
            compress: self.compress * k,
            d2h: self.d2h * k,
            link: self.link * k,
            h2d: self.h2d * k,
            decompress: self.decompress * k,
            device: self.device * k,
        }
    }
}

/// Seconds of a calibrated call line (fixed cost + `bytes / rate`), or `fallback` when the
/// rate was not calibrated (0 in profiles written before it existed).
fn line_or(overhead: f64, rate: f64, bytes: f64, fallback: impl FnOnce() -> f64) -> f64 {
    if rate > 0.0 {
        overhead + bytes / rate
    } else {
        fallback()
    }
}

impl Profile {
    /// Seconds of a pinned device→host copy of `bytes`.
    pub fn d2h_s(&self, bytes: f64) -> f64 {
        self.staging_curve
            .d2h(bytes)
            .unwrap_or_else(|| self.staging_line().latency + bytes / self.staging_line().bandwidth)
    }
    /// Seconds of a pinned host→device copy of `bytes`.
    pub fn h2d_s(&self, bytes: f64) -> f64 {
        self.staging_curve
            .h2d(bytes)
            .unwrap_or_else(|| self.staging_line().latency + bytes / self.staging_line().bandwidth)
    }
    /// Seconds of a pinned device→host copy of `bytes` by one rank alone (the solo curve; the
    /// shared one when not calibrated).
    pub fn d2h_solo_s(&self, bytes: f64) -> f64 {
        self.staging_curve_solo
            .d2h(bytes)
            .unwrap_or_else(|| self.d2h_s(bytes))
    }
    /// Seconds of a pinned host→device copy of `bytes` by one rank alone.
    pub fn h2d_solo_s(&self, bytes: f64) -> f64 {
        self.staging_curve_solo
            .h2d(bytes)
            .unwrap_or_else(|| self.h2d_s(bytes))
    }
    /// Seconds of the pinned device→host copy of a stream of `bytes` that a GPU compression has
    /// just written. Ranks sharing a GPU ([`sharing`](Profile::sharing) > 1) run their compressions
    /// at once, but their contexts are time-sliced, so the calls end one after another and each
    /// rank's copy runs while the others are still compressing: alone (the solo curve). With one
    /// rank per GPU the ranks' copies meet on the host link: the shared curve.
    pub fn d2h_after_compress_s(&self, bytes: f64) -> f64 {
        if self.sharing() > 1 {
            self.d2h_solo_s(bytes)
        } else {
            self.d2h_s(bytes)
        }
    }
    /// Ranks per GPU (at least 1).
    pub fn sharing(&self) -> usize {
        self.ranks_per_gpu.max(1)
    }
    /// Seconds of one one-way transfer of `bytes` (one rank sends, one receives): the one-way
    /// curve, else `link` (the two-way ping-pong).
    pub fn one_way_s(&self, link: Link, bytes: f64) -> f64 {
        self.link_one_way
            .seconds(bytes)
            .unwrap_or(link.latency + bytes / link.bandwidth)
    }
    /// Seconds of one simultaneous exchange of `bytes` each way between two ranks (both send
    /// and receive at once): the exchange curve, else `link` (the host ping-pong).
    pub fn pair_s(&self, link: Link, bytes: f64) -> f64 {
        self.link_exchange
            .seconds(bytes)
            .unwrap_or(link.latency + bytes / link.bandwidth)
    }
    /// The staging link of one hop of `bytes` (the curve at that size, else `staging`).
    pub fn staging_link(&self, bytes: f64) -> Link {
        self.staging_curve
            .link(bytes)
            .unwrap_or(self.staging_line())
    }
    /// Seconds of the link part of a pairwise exchange that sends `out` bytes and receives `inn`
    /// at the same time. Both directions share the link (on one node: the memory system), as in
    /// the calibrated exchange ([`pair_s`](Profile::pair_s)), so equal messages take the exchange's
    /// time; when one direction carries less, the other gets more of the shared capacity (the
    /// exchange of the mean size), but its message never arrives sooner than it would alone
    /// ([`one_way_s`](Profile::one_way_s)).
    pub fn exchange_s(&self, link: Link, out: f64, inn: f64) -> f64 {
        let shared = self.pair_s(link, 0.5 * (out + inn));
        shared.max(self.one_way_s(link, out.max(inn)))
    }
}

impl StagedModel<'_> {
    /// Fixed seconds of one compression + decompression call pair beyond the throughput terms
    /// (launches, synchronizations, the `noa` range pass, header read-backs), charged once per
    /// pipeline chunk ([`Scenario::chunk_overhead`]).
    pub fn call_overhead(&self) -> f64 {
        self.c.compress_overhead + self.c.decompress_overhead
    }
    /// Seconds of one GPU compression call on `bytes` (fixed cost + throughput term).
    pub fn compress_s(&self, bytes: f64) -> f64 {
        self.c.compress_overhead + bytes / self.c.compress
    }
    /// Seconds of one GPU decompression call producing `bytes`.
    pub fn decompress_s(&self, bytes: f64) -> f64 {
        self.c.decompress_overhead + bytes / self.c.decompress
    }
    /// Seconds of one fused decompress-and-add call on `bytes` of values (the plain
    /// decompression's when not calibrated).
    pub fn decompress_add_s(&self, bytes: f64) -> f64 {
        line_or(
            self.c.decompress_add_overhead,
            self.c.decompress_add,
            bytes,
            || self.decompress_s(bytes),
        )
    }
    /// Seconds of one GPU compression call on `bytes` by one rank alone (the shared line when
    /// not calibrated).
    pub fn compress_solo_s(&self, bytes: f64) -> f64 {
        line_or(
            self.c.compress_solo_overhead,
            self.c.compress_solo,
            bytes,
            || self.compress_s(bytes),
        )
    }
    /// Seconds of one GPU decompression call producing `bytes` by one rank alone.
    pub fn decompress_solo_s(&self, bytes: f64) -> f64 {
        line_or(
            self.c.decompress_solo_overhead,
            self.c.decompress_solo,
            bytes,
            || self.decompress_s(bytes),
        )
    }
    /// Seconds of the decompression producing `bytes` that follows an upload taking `h2d`
    /// seconds with every rank uploading at once (the shared curve), for the slowest rank. The
    /// `s` ranks of one GPU ([`sharing`](Profile::sharing)) get their uploads one after another
    /// (the first done after `h2d / s`), so the last rank's call cannot end before
    /// `h2d + decompress_solo` (its own upload, then its call alone), nor before the GPU has
    /// done all `s` calls at the shared rate, started when the first upload is done
    /// (`h2d / s + decompress_shared`): the later of the two, minus the upload (*staggered*).
    /// But the driver does not always serialize the uploads of ranks sharing a GPU: when they
    /// end together, the `s` calls run at once at the shared rate (*concurrent*). Both happened
    /// in back-to-back runs of the same binary (see the module docs), so with `s > 1` the model
    /// takes the mean of the two cases (the prediction that is off least in either). One rank
    /// per GPU: `max(solo, shared)` (the same physical call).
    pub fn decompress_after_upload_s(&self, bytes: f64, h2d: f64) -> f64 {
        let s = self.sharing() as f64;
        let solo = self.decompress_solo_s(bytes);
        let shared = self.decompress_s(bytes);
        let staggered = solo.max(h2d / s + shared - h2d);
        if self.sharing() <= 1 {
            return staggered;
        }
        let concurrent = staggered.max(shared);
        0.5 * (staggered + concurrent)
    }
    /// The model scenario of a staged point-to-point transfer of `bytes` at `ratio` over `link`
    /// in `chunks` pieces: the raw hops use the staging link at the chunk size, the compressed
    /// hops at the compressed chunk size; every chunk pays one compress + decompress call's
    /// fixed cost ([`call_overhead`](Self::call_overhead)) on top of the throughput slopes.
    pub fn scenario(&self, link: Link, bytes: f64, ratio: f64, chunks: usize) -> Scenario {
        let k = chunks.max(1);
        let c = bytes / k as f64;
        Scenario::new(bytes, ratio, link, self.c.compress, self.c.decompress)
            .with_staging(Some(self.staging_link(c)))
            .with_compressed_staging(Some(self.staging_link(c / ratio.max(1e-9))))
            .with_chunks(k)
            .with_chunk_overhead(self.call_overhead())
    }

    /// Whether a compressed device exchange of `bytes` at `ratio` is predicted faster in
    /// `chunks` pipelined chunks than as one message (by at least 10 %, per-chunk overhead
    /// included).
    pub fn pipeline_pays(&self, link: Link, bytes: f64, ratio: f64, chunks: usize) -> bool {
        if chunks <= 1 {
            return false;
        }
        let whole = super::predict(&self.scenario(link, bytes, ratio, 1)).compressed_serial;
        let piped = super::predict(&self.scenario(link, bytes, ratio, chunks)).compressed_pipelined;
        piped < 0.9 * whole
    }
    /// Model stages (raw, compressed) of
    /// [`DeviceStager::stage_to_host`](crate::comm::device::DeviceStager::stage_to_host) of
    /// `bytes`: a D2H of the values vs a GPU compression + D2H of the stream.
    pub fn stage_terms(&self, bytes: f64, ratio: f64) -> (Terms, Terms) {
        let raw = Terms {
            d2h: self.d2h_s(bytes),
            ..Terms::default()
        };
        let cmp = Terms {
            compress: self.compress_s(bytes),
            d2h: self.d2h_after_compress_s(bytes / ratio.max(1e-9)),
            ..Terms::default()
        };
        (raw, cmp)
    }
    /// Model (raw, compressed) seconds of
    /// [`DeviceStager::stage_to_host`](crate::comm::device::DeviceStager::stage_to_host) of
    /// `bytes`.
    pub fn predict_stage_to_host(&self, bytes: f64, ratio: f64) -> (f64, f64) {
        let (r, c) = self.stage_terms(bytes, ratio);
        (r.total(), c.total())
    }
    /// Model stages (raw, compressed) of
    /// [`DeviceStager::restore_to_device`](crate::comm::device::DeviceStager::restore_to_device) of
    /// `bytes`: an H2D of the values vs an H2D of the stream + GPU decompression.
    pub fn restore_terms(&self, bytes: f64, ratio: f64) -> (Terms, Terms) {
        let raw = Terms {
            h2d: self.h2d_s(bytes),
            ..Terms::default()
        };
        let h2d = self.h2d_s(bytes / ratio.max(1e-9));
        let cmp = Terms {
            h2d,
            decompress: self.decompress_after_upload_s(bytes, h2d),
            ..Terms::default()
        };
        (raw, cmp)
    }
    /// Model (raw, compressed) seconds of
    /// [`DeviceStager::restore_to_device`](crate::comm::device::DeviceStager::restore_to_device) of
    /// `bytes`.
    pub fn predict_restore_to_device(&self, bytes: f64, ratio: f64) -> (f64, f64) {
        let (r, c) = self.restore_terms(bytes, ratio);
        (r.total(), c.total())
    }
    /// Model stages of one whole-message
    /// [`Communicator::sendrecv_device`](crate::comm::Communicator::sendrecv_device) of `bytes`
    /// that sent `out` bytes and received `inn` bytes (on the wire): the copy out of the sent
    /// message, the exchange ([`exchange_s`](Profile::exchange_s)), the copy in of the received one,
    /// the compression when the sent message was compressed (`zipped.0`; the copy out then follows
    /// it: [`d2h_after_compress_s`](Profile::d2h_after_compress_s)) and the decompression when the
    /// received one was (`zipped.1`; after the upload:
    /// [`decompress_after_upload_s`](Self::decompress_after_upload_s)), both of `bytes`
    /// uncompressed.
    pub fn exchange_terms(
        &self,
        link: Link,
        bytes: f64,
        out: f64,
        inn: f64,
        zipped: (bool, bool),
    ) -> Terms {
        let h2d = self.h2d_s(inn);
        Terms {
            compress: if zipped.0 {
                self.compress_s(bytes)
            } else {
                0.0
            },
            d2h: if zipped.0 {
                self.d2h_after_compress_s(out)
            } else {
                self.d2h_s(out)
            },
            link: self.exchange_s(link, out, inn),
            h2d,
            decompress: if zipped.1 {
                self.decompress_after_upload_s(bytes, h2d)
            } else {
                0.0
            },
            device: 0.0,
        }
    }
    /// Model stages (raw, compressed) of one whole-message
    /// [`Communicator::sendrecv_device`](crate::comm::Communicator::sendrecv_device) of `bytes` at
    /// `ratio` in both directions (the serial form of [`scenario`](Self::scenario) with one chunk,
    /// which has the same total).
    pub fn sendrecv_terms(&self, link: Link, bytes: f64, ratio: f64) -> (Terms, Terms) {
        let z = bytes / ratio.max(1e-9);
        (
            self.exchange_terms(link, bytes, bytes, bytes, (false, false)),
            self.exchange_terms(link, bytes, z, z, (true, true)),
        )
    }
    /// Model stages (raw, compressed) of
    /// [`Communicator::allgather_device`](crate::comm::Communicator::allgather_device) of `bytes`
    /// per rank over `p` ranks: staging out (compressed: after the compression, see
    /// [`d2h_after_compress_s`](Profile::d2h_after_compress_s)), `p-1` pairwise exchanges
    /// ([`pair_s`](Profile::pair_s)), then the uploads: raw, `p` (this rank's values too, from
    /// its send buffer); compressed, the `p-1` other streams (this rank decodes its own from
    /// the device), and `p` decompression calls, each after its upload
    /// ([`decompress_after_upload_s`](Self::decompress_after_upload_s)).
    pub fn allgather_terms(&self, link: Link, p: usize, bytes: f64, ratio: f64) -> (Terms, Terms) {
        let (pf, z) = (p.max(1) as f64, bytes / ratio.max(1e-9));
        let raw = Terms {
            d2h: self.d2h_s(bytes),
            link: (pf - 1.0) * self.pair_s(link, bytes),
            h2d: pf * self.h2d_s(bytes),
            ..Terms::default()
        };
        let h2d = self.h2d_s(z);
        let cmp = Terms {
            compress: self.compress_s(bytes),
            d2h: self.d2h_after_compress_s(z),
            link: (pf - 1.0) * self.pair_s(link, z),
            h2d: (pf - 1.0) * h2d,
            decompress: pf * self.decompress_after_upload_s(bytes, h2d),
            device: 0.0,
        };
        (raw, cmp)
    }
    /// Model (raw, compressed) seconds of
    /// [`Communicator::allgather_device`](crate::comm::Communicator::allgather_device).
    pub fn predict_allgather(&self, link: Link, p: usize, bytes: f64, ratio: f64) -> (f64, f64) {
        let (r, c) = self.allgather_terms(link, p, bytes, ratio);
        (r.total(), c.total())
    }
    /// Model stages (raw, compressed) of the blocking
    /// [`Communicator::bcast_device`](crate::comm::Communicator::bcast_device) of `bytes` over `p`
    /// ranks: the root alone compresses and stages out (solo codec call and copy), `ceil(log2 p)`
    /// one-way link transfers (binomial tree; [`one_way_s`](Profile::one_way_s) per step), then every
    /// rank uploads at once (shared curve) and decompresses after its upload
    /// ([`decompress_after_upload_s`](Self::decompress_after_upload_s)).
    pub fn bcast_terms(&self, link: Link, p: usize, bytes: f64, ratio: f64) -> (Terms, Terms) {
        let hops = (p.max(1) as f64).log2().ceil();
        let z = bytes / ratio.max(1e-9);
        let raw = Terms {
            d2h: self.d2h_solo_s(bytes),
            link: hops * self.one_way_s(link, bytes),
            h2d: self.h2d_s(bytes),
            ..Terms::default()
        };
        let h2d = self.h2d_s(z);
        let cmp = Terms {
            compress: self.compress_solo_s(bytes),
            d2h: self.d2h_solo_s(z),
            link: hops * self.one_way_s(link, z),
            h2d,
            decompress: self.decompress_after_upload_s(bytes, h2d),
            device: 0.0,
        };
        (raw, cmp)
    }
    /// Model (raw, compressed) seconds of the blocking
    /// [`Communicator::bcast_device`](crate::comm::Communicator::bcast_device).
    pub fn predict_bcast(&self, link: Link, p: usize, bytes: f64, ratio: f64) -> (f64, f64) {
        let (r, c) = self.bcast_terms(link, p, bytes, ratio);
        (r.total(), c.total())
    }
}

impl StagedModel<'_> {
    /// Model stages of the compressed device ring of
    /// [`Communicator::allreduce_device`](crate::comm::Communicator::allreduce_device) /
    /// `allreduce_mean_device` (`fin = Some(final_ratio)`) or
    /// [`Communicator::reduce_scatter_device`](crate::comm::Communicator::reduce_scatter_device)
    /// (`fin = None`) of `bytes` per rank over `p` ranks:
    ///
    /// * the value-range pass over the input (every kind; the input is read in place, never
    ///   copied: the first addition to a segment writes input + decoded into the accumulator,
    ///   which is the output itself);
    /// * `p-1` steps on a segment of `bytes/p` at the ring's `ratio`, each a GPU compression, a
    ///   D2H of the stream, the exchange ([`pair_s`](Profile::pair_s), plus the length header's
    ///   latency), an H2D of the
    ///   received stream and the fused GPU decompress-and-add;
    /// * (allreduces) the mean's division of this rank's segment (`mean`), its compression once
    ///   more at the final bound, whose stream has its own ratio `final_ratio` (the reduced
    ///   segment is a sum of `p` fields at a bound of its own, so it compresses differently from
    ///   the ring's partial sums), and the allgather of these streams
    ///   ([`allgather_terms`](Self::allgather_terms) of one segment) less the decode of this
    ///   rank's own stream: its compression leaves the reconstruction in place
    ///   ([`GpuCodec::reduce_step_device`](crate::gpu::GpuCodec::reduce_step_device); pfpl, which
    ///   has no such kernel, still decodes it, one of `p` decodes the model leaves out).
    pub fn reduce_terms(
        &self,
        link: Link,
        p: usize,
        bytes: f64,
        ratio: f64,
        fin: Option<f64>,
        mean: bool,
    ) -> Terms {
        if p < 2 {
            return Terms::default();
        }
        let pf = p as f64;
        let seg = bytes / pf;
        let z = seg / ratio.max(1e-9);
        let steps = pf - 1.0;
        let mut t = Terms {
            compress: steps * self.compress_s(seg),
            d2h: steps * self.d2h_after_compress_s(z),
            link: steps * (link.latency + self.pair_s(link, z)),
            h2d: steps * self.h2d_s(z),
            decompress: steps * self.decompress_add_s(seg),
            device: self.reduction_range_s(bytes, fin.is_some(), self.codec),
        };
        // (reduce-scatter ends with the ring: its own segment accumulated in the output)
        if let Some(rf) = fin {
            if mean {
                t.device += seconds_at(seg, self.p.scale_pass);
            }
            let g = self.allgather_terms(link, p, seg, rf).1;
            t.compress += g.compress;
            t.d2h += g.d2h;
            t.link += g.link;
            t.h2d += g.h2d;
            t.decompress += g.decompress * (pf - 1.0) / pf;
        }
        t
    }
    /// Model seconds of the compressed device ring (see [`reduce_terms`](Self::reduce_terms)),
    /// with the final streams (`full`) at the ring's ratio and no division.
    pub fn predict_reduce(&self, link: Link, p: usize, bytes: f64, ratio: f64, full: bool) -> f64 {
        self.reduce_terms(link, p, bytes, ratio, full.then_some(ratio), false)
            .total()
    }
}

#[cfg(test)]
impl Profile {
    /// This profile with GPU-like speeds of two codecs (tests of the choice): aatrox the
    /// faster, pfpl the denser, 0.1 ms per call (replacing their records, if any).
    pub(crate) fn with_test_codecs(mut self) -> Self {
        for (codec, c, d) in [
            (CodecKind::Aatrox, 1300e9, 1900e9),
            (CodecKind::Pfpl, 500e9, 600e9),
        ] {
            self.gpu_codecs.retain(|r| r.codec != codec);
            self.gpu_codecs.push(CodecSpeed {
                compress_overhead: 100e-6,
                decompress_overhead: 100e-6,
                decompress_add: d,
                decompress_add_overhead: 100e-6,
                ..CodecSpeed::new(codec, 1, c, d, 1.0)
            });
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 512³ f32 field (512 MiB) at the ratios aatrox and pfpl reach on a log-normal field at
    /// `noa:1e-2`.
    const BYTES: f64 = 536870912.0;
    const RATIOS: [(CodecKind, f64); 2] = [(CodecKind::Aatrox, 70.0), (CodecKind::Pfpl, 149.0)];

    /// H100-like staging and GPU-like codec lines: aatrox the faster, pfpl the denser.
    fn two_codecs() -> Profile {
        let mut p = Profile::staged_guess();
        p.staging = Some(Link {
            bandwidth: 25e9,
            latency: 10e-6,
        });
        p.with_test_codecs()
    }

    fn link(bandwidth: f64) -> Link {
        Link {
            bandwidth,
            latency: 2e-6,
        }
    }

    /// Every staged device operation's `Auto` choice: over a slow link (1 GB/s) the ratio
    /// dominates and pfpl (149) wins, over a fast one (400 GB/s) the codec's speed does and
    /// aatrox (70) wins; both beat raw (which stages 512 MiB both ways).
    #[test]
    fn auto_picks_the_denser_codec_on_a_slow_link_and_the_faster_on_a_fast_one() {
        let dp = two_codecs();
        type Op = fn(&StagedModel<'_>, Link, f64) -> (Terms, Terms);
        let ops: [(&str, Op); 4] = [
            ("sendrecv", |d, l, r| d.sendrecv_terms(l, BYTES, r)),
            ("allgather", |d, l, r| d.allgather_terms(l, 4, BYTES, r)),
            ("bcast", |d, l, r| d.bcast_terms(l, 4, BYTES, r)),
            // (the raw reduction is the staged host one; the raw allgather stands in for it)
            ("allreduce", |d, l, r| {
                let raw = d.allgather_terms(l, 4, BYTES, 1.0).0;
                (raw, d.reduce_terms(l, 4, BYTES, r, Some(r), false))
            }),
        ];
        for (name, op) in ops {
            for (bw, want) in [(1e9, CodecKind::Pfpl), (400e9, CodecKind::Aatrox)] {
                let raw = op(&dp.staged(want), link(bw), 1.0).0.total();
                let c = dp.choose_staged(raw, &RATIOS, |d, _, r| op(d, link(bw), r).1.total());
                assert_eq!(c.codec, Some(want), "{name} at {bw:e} B/s: {c:?}");
            }
        }
    }

    /// With a calibrated exchange curve the pairwise terms (sendrecv, the allgather's steps, the
    /// ring's steps) use it, not the host ping-pong's line; without one they fall back to the
    /// line; an exchange never beats the one-way transfer of its larger message.
    #[test]
    fn exchanges_use_the_pinned_exchange_curve() {
        let slow = link(2e9);
        let mut p = two_codecs();
        let line = p.staged(CodecKind::Aatrox).pair_s(slow, 64e6);
        assert!((line - (2e-6 + 64e6 / 2e9)).abs() < 1e-12);
        p.link_exchange = Curve::from_points(
            vec![(1e6, 0.3e-3), (64e6, 16e-3), (256e6, 64e-3)],
            &Curve::default(),
        );
        // (one way alone is faster than either direction of an exchange)
        p.link_one_way = Curve::from_points(vec![(1e6, 0.2e-3), (256e6, 40e-3)], &Curve::default());
        let dp = p.staged(CodecKind::Aatrox);
        assert!((dp.pair_s(slow, 64e6) - 16e-3).abs() < 1e-12);
        // equal messages: the exchange itself
        assert!((dp.exchange_s(slow, 64e6, 64e6) - 16e-3).abs() < 1e-12);
        // the ring's steps and the allgather's exchanges follow the curve
        let (n, bytes, ratio) = (2, 512e6, 4.0);
        let z = bytes / n as f64 / ratio;
        let t = dp.reduce_terms(slow, n, bytes, ratio, None, false);
        assert!((t.link - (2e-6 + dp.pair_s(slow, z))).abs() < 1e-12);
        let g = dp.allgather_terms(slow, 3, 64e6, 1.0).0;
        assert!((g.link - 2.0 * 16e-3).abs() < 1e-12);
        // a one-sided exchange is at least the one-way transfer of the larger message
        let one = dp.exchange_s(slow, 256e6, 0.0);
        assert!(one >= dp.one_way_s(slow, 256e6) && one >= dp.pair_s(slow, 128e6));
    }

    /// Without GPU codec records (an uncalibrated profile) every codec is predicted with the
    /// guess's lines, so the higher ratio always wins; with records each codec gets its own
    /// lines, and a codec without a record those of the first (the calibrated one).
    #[test]
    fn staged_models_take_each_codecs_lines() {
        let guess = Profile::staged_guess();
        assert_eq!(
            guess.staged(CodecKind::Pfpl).c,
            CodecSpeed::gpu_guess(CodecKind::Pfpl)
        );
        let raw = guess
            .staged(CodecKind::Pfpl)
            .sendrecv_terms(link(400e9), BYTES, 1.0)
            .0
            .total();
        let c = guess.choose_staged(raw, &RATIOS, |d, _, r| {
            d.sendrecv_terms(link(400e9), BYTES, r).1.total()
        });
        assert_eq!(c.codec, Some(CodecKind::Pfpl));
        let p = two_codecs();
        let pf = p.staged(CodecKind::Pfpl);
        assert_eq!((pf.c.compress, pf.c.decompress), (500e9, 600e9));
        assert_eq!(pf.call_overhead(), 200e-6);
        let other = p.staged(CodecKind::CuszpPlain);
        assert_eq!(
            (other.c.codec, other.c.compress),
            (CodecKind::CuszpPlain, 1300e9)
        );
        // the profile round-trips through JSON
        let back = Profile::from_json(&p.to_json()).unwrap();
        assert_eq!(back, p);
    }
}
