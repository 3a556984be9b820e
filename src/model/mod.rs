//! The overall-speedup model (AATROX §5.6) and the per-message compression policy.
//!
//! AATROX defines the speedup of sending data compressed over a link of bandwidth `BW` with
//! compression ratio `CR` and compression throughput `T_compr` as
//!
//! ```text
//! speedup = 1 / ((1/(BW·CR) + 1/T_compr) · BW)
//! ```
//!
//! ([`aatrox_speedup`]). zcomm extends it with decompression throughput `T_decompr`, per-message
//! latency `L` and optional staging hops (device→host before the network and host→device after it,
//! bandwidth `BW_s`, latency `L_s`), in two forms ([`predict`]):
//!
//! * **serial** (one message, every stage after the previous one):
//!   `t_raw = L + S/BW [+ 2 (L_s + S/BW_s)]`,
//!   `t_cmp = S/T_c + L + S/(CR·BW) + S/T_d [+ 2 (L_s + S/(CR·BW_s))]`;
//! * **pipelined** in `k` chunks of `c = S/k` bytes, each stage working on one chunk while the
//!   next stage works on the previous one: `t = Σ_stages t_i(c) + (k-1)·max_i t_i(c)`
//!   (fill time + steady state bounded by the slowest stage), for the raw and the compressed path.
//!
//! With `L = 0`, no staging, `T_d = ∞` and one chunk, `t_raw / t_cmp` is exactly AATROX's formula.
//! A [`Profile`] holds the calibrated link and codec speeds (JSON file, see [`Profile::load`]).
//! Pinned staging copies are size dependent: a [`StagingCurve`] of measured sizes gives the
//! staging link at each hop's size ([`Scenario::with_compressed_staging`] for the compressed
//! path's smaller streams); a [`Curve`] holds the measured times of a link by message size
//! (exchanges, one-way messages, a transport's own collectives), which a ping-pong [`Link`]
//! misjudges; calibrations take the [`median`] of repetitions. One [`Profile`] holds all of it
//! for every communicator.

pub mod choice;
pub mod curve;
pub mod direct;
mod profile;
pub mod staged;

pub use curve::{Curve, StagingCurve, StagingPoint};
pub use direct::WireRatio;
pub use profile::Profile;
pub use staged::{StagedModel, Terms};

use crate::codec::CodecKind;
use crate::error::{Error, Result};
#[cfg(test)]
use crate::format::Dtype;

/// AATROX §5.6 overall speedup: `1 / ((1/(bw·cr) + 1/tc) · bw)` (all rates in the same unit).
pub fn aatrox_speedup(bw: f64, cr: f64, tc: f64) -> f64 {
    1.0 / ((1.0 / (bw * cr) + 1.0 / tc) * bw)
}

/// Whether to compress a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Policy {
    /// Compress with the given codec when the model predicts it is faster, else send raw.
    Auto(CodecKind),
    /// Always compress with this codec (a stream that would expand is still sent stored).
    Always(CodecKind),
    /// Never compress.
    Never,
}

impl Default for Policy {
    fn default() -> Self {
        Policy::Auto(CodecKind::Aatrox)
    }
}

impl Policy {
    /// The codec this policy compresses with, if any.
    pub fn codec(&self) -> Option<CodecKind> {
        match *self {
            Policy::Auto(c) | Policy::Always(c) => Some(c),
            Policy::Never => None,
        }
    }
    /// A one-byte tag (for cross-rank agreement checks): high nibble kind, low nibble codec.
    pub fn tag(&self) -> u8 {
        match *self {
            Policy::Never => 0,
            Policy::Auto(c) => 0x10 | c.tag(),
            Policy::Always(c) => 0x20 | c.tag(),
        }
    }
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Policy::Auto(c) => write!(f, "auto:{c}"),
            Policy::Always(c) => write!(f, "always:{c}"),
            Policy::Never => f.write_str("never"),
        }
    }
}

impl std::str::FromStr for Policy {
    type Err = Error;
    /// `never`, `auto`, `auto:CODEC`, `always`, `always:CODEC`.
    fn from_str(s: &str) -> Result<Self> {
        let (k, c) = s.split_once(':').unwrap_or((s, "aatrox"));
        let codec: CodecKind = c.parse()?;
        match k {
            "never" | "raw" => Ok(Policy::Never),
            "auto" => Ok(Policy::Auto(codec)),
            "always" => Ok(Policy::Always(codec)),
            _ => Err(Error::invalid(format!(
                "policy `{s}`: expected never, auto[:CODEC], always[:CODEC]"
            ))),
        }
    }
}

/// A link: bandwidth in bytes/s and per-message latency in seconds.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Link {
    /// Bytes per second.
    pub bandwidth: f64,
    /// Seconds per message.
    pub latency: f64,
}

/// Measured speeds of one codec on one dtype, the one record of codec speeds of the profile
/// (CPU codecs in [`Profile::codecs`], GPU codecs in [`Profile::gpu_codecs`]): compression and decompression throughput (uncompressed bytes per
/// second) and, where calibrated, each call's fixed cost (the line `t(b) = overhead + b / rate`
/// through a tiny and a large call, [`call_line`]), the fused decompress-and-add's line, and the
/// lines of one rank calling alone (*solo*, the other ranks idle) next to the *shared* ones
/// (every rank at once). The fields after `ratio` are measured by the device calibration only:
/// elsewhere (and in profiles written before them) they are 0: no fixed cost, and a solo or
/// fused rate of 0 means "not calibrated" (the shared lines stand in).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CodecSpeed {
    /// The codec.
    pub codec: CodecKind,
    /// 1 = f32, 2 = f64 (the stream's dtype tag).
    pub dtype: u8,
    /// Compression throughput (input bytes/s), every rank at once, beyond `compress_overhead`.
    pub compress: f64,
    /// Decompression throughput (output bytes/s), every rank at once, beyond
    /// `decompress_overhead`.
    pub decompress: f64,
    /// Ratio measured on the calibration field.
    pub ratio: f64,
    /// Fixed seconds of one compression call.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub compress_overhead: f64,
    /// Fixed seconds of one decompression call.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub decompress_overhead: f64,
    /// Fused decompress-and-add throughput (output bytes/s) beyond `decompress_add_overhead`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub decompress_add: f64,
    /// Fixed seconds of one fused decompress-and-add call.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub decompress_add_overhead: f64,
    /// Compression throughput of one rank alone beyond `compress_solo_overhead`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub compress_solo: f64,
    /// Fixed seconds of one compression call of one rank alone.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub compress_solo_overhead: f64,
    /// Decompression throughput of one rank alone beyond `decompress_solo_overhead`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub decompress_solo: f64,
    /// Fixed seconds of one decompression call of one rank alone.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub decompress_solo_overhead: f64,
}

fn is_zero(v: &f64) -> bool {
    *v == 0.0
}

impl CodecSpeed {
    /// The guess for a GPU codec before calibration (H100-class: 200 GB/s compression,
    /// 300 GB/s decompression, 150 us per call).
    pub fn gpu_guess(codec: CodecKind) -> Self {
        CodecSpeed {
            compress_overhead: 150e-6,
            decompress_overhead: 150e-6,
            ..CodecSpeed::new(codec, 1, 200e9, 300e9, 1.0)
        }
    }
    /// Throughputs and ratio only (no fixed costs, no fused or solo lines: the host
    /// calibration's record).
    pub fn new(codec: CodecKind, dtype: u8, compress: f64, decompress: f64, ratio: f64) -> Self {
        CodecSpeed {
            codec,
            dtype,
            compress,
            decompress,
            ratio,
            compress_overhead: 0.0,
            decompress_overhead: 0.0,
            decompress_add: 0.0,
            decompress_add_overhead: 0.0,
            compress_solo: 0.0,
            compress_solo_overhead: 0.0,
            decompress_solo: 0.0,
            decompress_solo_overhead: 0.0,
        }
    }
}

/// Inputs of one prediction.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scenario {
    /// Uncompressed bytes moved.
    pub bytes: f64,
    /// Compression ratio (uncompressed / compressed).
    pub ratio: f64,
    /// The link between ranks.
    pub link: Link,
    /// Compression throughput (bytes/s); `f64::INFINITY` to ignore.
    pub compress: f64,
    /// Decompression throughput (bytes/s); `f64::INFINITY` to ignore.
    pub decompress: f64,
    /// Staging link crossed before and after the network (device buffers), if any.
    pub staging: Option<Link>,
    /// Staging link of the compressed path, when it differs from `staging` (pinned copies are
    /// size dependent and the compressed stream is `ratio` times smaller; see [`StagingCurve`]).
    /// `None`: the compressed path uses `staging` too.
    pub staging_compressed: Option<Link>,
    /// Number of pipeline chunks (1 = serial).
    pub chunks: usize,
    /// Fixed seconds of one compress + decompress call pair beyond the throughput terms (launches,
    /// synchronizations, range pass, header read-back; measured by timing a tiny buffer), paid
    /// once per chunk on the compressed path and not overlapped with the other stages (the
    /// codec calls block the host thread that also drives MPI).
    pub chunk_overhead: f64,
}

impl Scenario {
    /// One transfer of `bytes` at ratio `ratio` over `link` with codec throughputs `tc`/`td`.
    pub fn new(bytes: f64, ratio: f64, link: Link, tc: f64, td: f64) -> Self {
        Scenario {
            bytes,
            ratio,
            link,
            compress: tc,
            decompress: td,
            staging: None,
            staging_compressed: None,
            chunks: 1,
            chunk_overhead: 0.0,
        }
    }
    /// With staging hops.
    pub fn with_staging(mut self, s: Option<Link>) -> Self {
        self.staging = s;
        self
    }
    /// With a separate staging link for the compressed path's hops (`None`: as the raw path).
    pub fn with_compressed_staging(mut self, s: Option<Link>) -> Self {
        self.staging_compressed = s;
        self
    }
    /// With `k` pipeline chunks.
    pub fn with_chunks(mut self, k: usize) -> Self {
        self.chunks = k.max(1);
        self
    }
    /// With a fixed per-chunk codec overhead (seconds, see [`Scenario::chunk_overhead`]).
    pub fn with_chunk_overhead(mut self, s: f64) -> Self {
        self.chunk_overhead = if s.is_finite() { s.max(0.0) } else { 0.0 };
        self
    }
}

/// A prediction (seconds, and raw/compressed speedups).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Prediction {
    /// Raw path, serial.
    pub raw_serial: f64,
    /// Raw path, pipelined in `chunks`.
    pub raw_pipelined: f64,
    /// Compressed path, serial.
    pub compressed_serial: f64,
    /// Compressed path, pipelined in `chunks`.
    pub compressed_pipelined: f64,
}

impl Prediction {
    /// `raw_serial / compressed_serial` (1 when both are equal, zero times included).
    pub fn speedup_serial(&self) -> f64 {
        speedup(self.raw_serial, self.compressed_serial)
    }
    /// `raw_pipelined / compressed_pipelined` (1 when both are equal, zero times included).
    pub fn speedup_pipelined(&self) -> f64 {
        speedup(self.raw_pipelined, self.compressed_pipelined)
    }
}

fn speedup(raw: f64, cmp: f64) -> f64 {
    if raw == cmp {
        1.0
    } else {
        raw / cmp
    }
}

/// Seconds of `k` equal pieces passing `stages` one after another, each stage working on one
/// piece while the next stage works on the previous one: every stage once for the first piece
/// (the fill), then the slowest stage once per further piece (the steady state).
pub(crate) fn pipeline(stages: &[f64], k: usize) -> f64 {
    let sum: f64 = stages.iter().sum();
    let max = stages.iter().copied().fold(0.0, f64::max);
    sum + (k.saturating_sub(1)) as f64 * max
}

/// `v` if it is `> 0` (+∞ included), else 0: latencies and overheads come from measurements and
/// files, and one NaN or negative value must not make every prediction NaN (every comparison
/// false) or negative (the compressed path always "faster").
fn nonneg(v: f64) -> f64 {
    if v > 0.0 {
        v
    } else {
        0.0
    }
}

/// Seconds of a pass over `bytes` at `rate` bytes/s, or 0 when the rate was not calibrated
/// (`rate <= 0`: profiles written before the pass was measured charge nothing for it).
pub(crate) fn seconds_at(bytes: f64, rate: f64) -> f64 {
    if rate > 0.0 && bytes > 0.0 {
        bytes / rate
    } else {
        0.0
    }
}

/// Seconds to move `bytes` at `rate` bytes/s: an infinite rate costs nothing, an unusable one
/// (zero, negative, NaN) never finishes (+∞, so that a path with an unknown speed is never
/// preferred).
fn secs(bytes: f64, rate: f64) -> f64 {
    if bytes == 0.0 || rate == f64::INFINITY {
        0.0
    } else if rate > 0.0 {
        bytes / rate
    } else {
        f64::INFINITY
    }
}

/// A predicted time, never NaN or negative: `+∞ - ∞` or `0·∞` of unusable inputs count as
/// "never finishes", and every time is capped at `f64::MAX` so that the raw/compressed ratio of
/// two such times stays defined.
fn time(t: f64) -> f64 {
    if t.is_nan() {
        f64::MAX
    } else {
        t.clamp(0.0, f64::MAX)
    }
}

/// Predict raw and compressed transfer times, serial and pipelined (see the module docs).
///
/// Every time is finite and `>= 0` whatever the inputs: NaN or negative bytes, latencies and
/// overheads count as 0, a NaN or non-positive ratio as 1 (no compression), and a zero, negative
/// or NaN rate as a stage that never finishes (`f64::MAX` seconds), so that `Auto` does not choose
/// a path whose speed is unknown.
pub fn predict(s: &Scenario) -> Prediction {
    let k = s.chunks.max(1);
    let bytes = if s.bytes.is_nan() {
        0.0
    } else {
        s.bytes.max(0.0)
    };
    let c = bytes / k as f64;
    let cr = if s.ratio > 0.0 { s.ratio } else { 1.0 };
    let hop = |l: &Link, b: f64| nonneg(l.latency) + secs(b, l.bandwidth);
    let mut raw = Vec::with_capacity(3);
    let mut cmp = Vec::with_capacity(5);
    cmp.push(secs(c, s.compress));
    let cst = s.staging_compressed.or(s.staging);
    if let Some(st) = &s.staging {
        raw.push(hop(st, c));
    }
    if let Some(st) = &cst {
        cmp.push(hop(st, c / cr));
    }
    raw.push(hop(&s.link, c));
    cmp.push(hop(&s.link, c / cr));
    if let Some(st) = &s.staging {
        raw.push(hop(st, c));
    }
    if let Some(st) = &cst {
        cmp.push(hop(st, c / cr));
    }
    cmp.push(secs(c, s.decompress));
    let overhead = nonneg(s.chunk_overhead) * k as f64;
    Prediction {
        raw_serial: time(pipeline(&raw, 1) * k as f64),
        raw_pipelined: time(pipeline(&raw, k)),
        compressed_serial: time(pipeline(&cmp, 1) * k as f64 + overhead),
        compressed_pipelined: time(pipeline(&cmp, k) + overhead),
    }
}

/// The median of `v` (the upper one of an even count; NaN-safe ordering; 0 when empty). Used by
/// calibrations: robust against the odd repetition slowed down by another process.
pub fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut w = v.to_vec();
    w.sort_by(f64::total_cmp);
    w[w.len() / 2]
}

/// The line `t(b) = overhead + b / rate` through two measured calls of one operation, on
/// `small` and `big` bytes (`small < big`), as `(rate, overhead)`: the fixed per-call cost
/// (launches, synchronizations, read-backs) is the intercept and `rate` the slope, so that
/// `t(big)` is reproduced exactly and a call on `b` bytes costs `overhead + b / rate` once, not
/// `b / (big / t(big))` plus a separately charged overhead (which counts the fixed cost twice).
/// Degenerate measurements (a non-increasing pair, a non-positive intercept) give overhead 0
/// and the rate `big / t(big)`.
pub fn call_line(small: f64, t_small: f64, big: f64, t_big: f64) -> (f64, f64) {
    let whole = (big / t_big.max(1e-12), 0.0);
    if !(big > small && small >= 0.0 && t_big > 0.0 && t_small >= 0.0) {
        return whole;
    }
    let slope = (t_big - t_small) / (big - small);
    if !(slope > 0.0 && slope.is_finite()) {
        return whole;
    }
    let overhead = t_big - big * slope;
    if overhead.is_nan() || overhead <= 0.0 {
        return whole;
    }
    (1.0 / slope, overhead)
}

/// Parse a rate like `25GB/s`, `400 GB/s`, `12.5GiB/s`, `800MB/s`, `1e9` (bytes/s).
pub fn parse_rate(s: &str) -> Result<f64> {
    let t = s.trim().trim_end_matches("/s").trim();
    let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| Error::invalid(format!("rate `{s}`: `{num}` is not a number")))?;
    let mult = match unit.trim() {
        "" | "B" => 1.0,
        "KB" | "kB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "TB" => 1e12,
        "KiB" => 1024.0,
        "MiB" => 1048576.0,
        "GiB" => 1073741824.0,
        "TiB" => 1099511627776.0,
        u => return Err(Error::invalid(format!("rate `{s}`: unknown unit `{u}`"))),
    };
    let r = v * mult;
    if !(r.is_finite() && r > 0.0) {
        return Err(Error::invalid(format!("rate `{s}` must be finite and > 0")));
    }
    Ok(r)
}

/// Format bytes/s as `12.3 GB/s`.
pub fn fmt_rate(r: f64) -> String {
    if r >= 1e9 {
        format!("{:.2} GB/s", r / 1e9)
    } else {
        format!("{:.1} MB/s", r / 1e6)
    }
}

/// Compression-ratio estimates remembered per message tag ("the previous message with the same
/// tag").
#[derive(Debug, Default, Clone)]
pub struct RatioCache {
    map: std::collections::HashMap<(u8, i64), (f64, u32)>,
}

impl RatioCache {
    /// How many times [`get_fresh`](Self::get_fresh) returns one remembered ratio before it asks
    /// for a new estimate.
    pub const MAX_REUSE: u32 = 8;
    /// The ratio remembered for messages of kind `op` with `tag`.
    pub fn get(&self, op: u8, tag: i64) -> Option<f64> {
        self.map.get(&(op, tag)).map(|e| e.0)
    }
    /// Like [`get`](Self::get), but `None` after [`MAX_REUSE`](Self::MAX_REUSE) uses without a
    /// [`put`](Self::put), so that a stale estimate (e.g. one that made `Auto` send raw, which
    /// measures nothing) is refreshed now and then.
    pub fn get_fresh(&mut self, op: u8, tag: i64) -> Option<f64> {
        let e = self.map.get_mut(&(op, tag))?;
        if e.1 >= Self::MAX_REUSE {
            return None;
        }
        e.1 += 1;
        Some(e.0)
    }
    /// Remember the ratio of a message (or an estimate).
    pub fn put(&mut self, op: u8, tag: i64, ratio: f64) {
        if ratio.is_finite() && ratio > 0.0 {
            self.map.insert((op, tag), (ratio, 0));
        }
    }
}

/// Estimate the compression ratio of `data` under `bound` by compressing up to `max_chunks`
/// codec chunks (32,768 values) spread evenly over it. `noa` bounds are converted to the absolute
/// bound of the whole array first, so the sample sees the same step. Returns the ratio and, when
/// the sample was the whole array, its stream (so the caller can send it).
pub fn estimate_ratio<T: crate::Element>(
    data: &[T],
    bound: crate::ErrorBound,
    codec: CodecKind,
    max_chunks: usize,
) -> Result<(f64, Option<Vec<u8>>)> {
    const CHUNK: usize = 1 << crate::codec::blocked::CHUNK_LOG2;
    if data.is_empty() {
        return Ok((1.0, None));
    }
    let n_chunks = data.len().div_ceil(CHUNK);
    if n_chunks <= max_chunks.max(1) {
        let s = crate::compress(data, bound, codec)?;
        let ratio = (data.len() * T::SIZE) as f64 / s.len() as f64;
        return Ok((ratio, Some(s)));
    }
    let b = match bound {
        crate::ErrorBound::Noa(e) => {
            let (lo, hi) = crate::quant::finite_range(data).unwrap_or((0.0, 0.0));
            let w = e * (hi - lo);
            if w.is_finite() && w > 0.0 {
                crate::ErrorBound::Abs(w)
            } else {
                bound
            }
        }
        b => b,
    };
    let mut sample = Vec::with_capacity(max_chunks * CHUNK);
    for i in 0..max_chunks {
        let c = i * n_chunks / max_chunks;
        let lo = c * CHUNK;
        let hi = (lo + CHUNK).min(data.len());
        sample.extend_from_slice(&data[lo..hi]);
    }
    let s = crate::compress(&sample, b, codec)?;
    Ok(((sample.len() * T::SIZE) as f64 / s.len() as f64, None))
}

/// Measure the compression and decompression throughput of `codec` on a smooth synthetic field
/// of `n` values at `noa:1e-3` (best of `reps`).
pub fn measure_codec<T: crate::Element>(
    codec: CodecKind,
    n: usize,
    reps: usize,
) -> Result<CodecSpeed> {
    let data: Vec<T> = (0..n)
        .map(|i| {
            let x = i as f64 * 1e-4;
            T::from_f64((x.sin() * 3.0 + (x * 7.3).cos()) * 100.0 + (i % 17) as f64 * 1e-3)
        })
        .collect();
    let bound = crate::ErrorBound::Noa(1e-3);
    let mut best_c = f64::INFINITY;
    let mut best_d = f64::INFINITY;
    let mut len = 1;
    let mut out = vec![T::default(); n];
    for _ in 0..reps.max(1) {
        let t = std::time::Instant::now();
        let s = crate::compress(&data, bound, codec)?;
        best_c = best_c.min(t.elapsed().as_secs_f64());
        let t = std::time::Instant::now();
        crate::decompress_into(&s, &mut out)?;
        best_d = best_d.min(t.elapsed().as_secs_f64());
        len = s.len();
    }
    let bytes = (n * T::SIZE) as f64;
    Ok(CodecSpeed::new(
        codec,
        T::DTYPE.tag(),
        bytes / best_c.max(1e-9),
        bytes / best_d.max(1e-9),
        bytes / len as f64,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serial_model_reduces_to_aatrox() {
        let link = Link {
            bandwidth: 25e9,
            latency: 0.0,
        };
        let s = Scenario::new(1e9, 20.0, link, 400e9, f64::INFINITY);
        let p = predict(&s);
        let a = aatrox_speedup(25e9, 20.0, 400e9);
        assert!(
            (p.speedup_serial() - a).abs() < 1e-9 * a,
            "{} vs {a}",
            p.speedup_serial()
        );
        // 1/((1/500 + 1/400)*25) = 1/(0.1125) = 8.888..
        assert!((a - 80.0 / 9.0).abs() < 1e-9);
    }

    #[test]
    fn pipelined_is_bounded_by_slowest_stage() {
        let link = Link {
            bandwidth: 10e9,
            latency: 1e-6,
        };
        let st = Some(Link {
            bandwidth: 20e9,
            latency: 5e-6,
        });
        let s = Scenario::new(1e9, 10.0, link, 100e9, 200e9)
            .with_staging(st)
            .with_chunks(64);
        let p = predict(&s);
        assert!(p.compressed_pipelined < p.compressed_serial);
        assert!(p.raw_pipelined < p.raw_serial);
        // steady state ~ S/T_c (10 ms) dominates
        assert!(p.compressed_pipelined > 1e9 / 100e9);
        let one = predict(&s.with_chunks(1));
        assert_eq!(one.compressed_pipelined, one.compressed_serial);
    }

    #[test]
    fn chunk_overhead_makes_many_chunks_lose() {
        // the H100 shared-GPU case: 1 GiB at ratio 19, 4.3 GB/s link, ~0.75 ms per codec call
        let link = Link {
            bandwidth: 4.29e9,
            latency: 1.4e-6,
        };
        let st = Some(Link {
            bandwidth: 27e9,
            latency: 10e-6,
        });
        let base = Scenario::new(1073741824.0, 19.0, link, 252e9, 446e9).with_staging(st);
        let no_oh = predict(&base.with_chunks(64));
        let whole = predict(&base.with_chunk_overhead(0.75e-3));
        let piped = predict(&base.with_chunk_overhead(0.75e-3).with_chunks(64));
        assert!(no_oh.compressed_pipelined < whole.compressed_serial);
        assert!(piped.compressed_pipelined > whole.compressed_serial);
        assert!(
            (piped.compressed_pipelined - no_oh.compressed_pipelined - 64.0 * 0.75e-3).abs()
                < 1e-12
        );
        // the raw path has no codec calls
        assert_eq!(piped.raw_serial, no_oh.raw_serial);
    }

    #[test]
    fn staging_curve_interpolates_and_extends() {
        let mut c = StagingCurve::default();
        assert!(c.d2h(1e6).is_none() && c.link(1e6).is_none());
        c.insert(StagingPoint {
            bytes: 1e6,
            d2h: 1e-4,
            h2d: 2e-4,
        });
        c.insert(StagingPoint {
            bytes: 1e8,
            d2h: 4e-3,
            h2d: 4e-3,
        });
        // exact at the points, sorted regardless of insertion order
        c.insert(StagingPoint {
            bytes: 1e7,
            d2h: 5e-4,
            h2d: 6e-4,
        });
        assert_eq!(c.points.len(), 3);
        assert!(c.points.windows(2).all(|w| w[0].bytes < w[1].bytes));
        assert!((c.d2h(1e7).unwrap() - 5e-4).abs() < 1e-15);
        // between: monotone, geometric mean halfway in log size
        let mid = c.d2h(3e6).unwrap();
        assert!(mid > 1e-4 && mid < 5e-4);
        let half = c.d2h((1e7f64 * 1e8).sqrt()).unwrap();
        assert!((half - (5e-4f64 * 4e-3).sqrt()).abs() < 1e-12);
        // outside: the end point's bandwidth
        assert!((c.d2h(1e9).unwrap() - 4e-2).abs() < 1e-12);
        assert!((c.h2d(5e5).unwrap() - 1e-4).abs() < 1e-15);
        let l = c.link(1e8).unwrap();
        assert!((l.bandwidth - 1e8 / 4e-3).abs() < 1e-3 && l.latency == 0.0);
        // replacing a size keeps one point; invalid points are ignored
        c.insert(StagingPoint {
            bytes: 1e7,
            d2h: 1e-3,
            h2d: 1e-3,
        });
        c.insert(StagingPoint {
            bytes: 2e7,
            d2h: f64::NAN,
            h2d: 1.0,
        });
        assert_eq!(c.points.len(), 3);
        assert_eq!(c.d2h(1e7), Some(1e-3));
        // the curve round-trips through JSON (the profile carries it)
        let j = serde_json::to_string(&c).unwrap();
        assert_eq!(serde_json::from_str::<StagingCurve>(&j).unwrap(), c);
    }

    #[test]
    fn link_curve_interpolates_and_round_trips() {
        let c = Curve::default();
        assert!(c.is_empty() && c.seconds(1e6).is_none() && c.link(1e6).is_none());
        let c = Curve::from_points(
            vec![(256e6, 43e-3), (1e6, 0.1e-3), (16e6, f64::NAN)],
            &Curve::default(),
        );
        assert_eq!(c.points.len(), 2);
        assert!(c.points[0].0 < c.points[1].0);
        assert!((c.seconds(1e6).unwrap() - 0.1e-3).abs() < 1e-15);
        assert_eq!(c.seconds(f64::NAN), Some(0.0));
        // beyond the largest size: the last segment's bandwidth
        let seg = (256e6 - 1e6) / (43e-3 - 0.1e-3);
        assert!((c.seconds(1024e6).unwrap() - (43e-3 + 768e6 / seg)).abs() < 1e-12);
        // between points: linear in the size
        let mid = c.seconds(128.5e6).unwrap();
        assert!((mid - 0.5 * (0.1e-3 + 43e-3)).abs() < 1e-12);
        let l = c.link(256e6).unwrap();
        assert!((l.bandwidth - 256e6 / 43e-3).abs() < 1e-3 && l.latency == 0.0);
        let j = serde_json::to_string(&c).unwrap();
        assert_eq!(serde_json::from_str::<Curve>(&j).unwrap(), c);
    }

    #[test]
    fn call_line_reproduces_both_points() {
        // 0.3 ms fixed + 1 GiB at 250 GB/s; tiny call of 256 KiB
        let (o, r) = (0.3e-3, 250e9);
        let (small, big) = (262144.0, 1073741824.0);
        let (rate, oh) = call_line(small, o + small / r, big, o + big / r);
        assert!((rate / r - 1.0).abs() < 1e-9 && (oh - o).abs() < 1e-12);
        // the big call is reproduced exactly: overhead + big / rate = t(big)
        assert!((oh + big / rate - (o + big / r)).abs() < 1e-15);
        // degenerate: tiny call slower than the big one, or a negative intercept
        assert_eq!(call_line(small, 1.0, big, 0.5), (big / 0.5, 0.0));
        assert_eq!(call_line(small, 0.0, big, 4e-3), (big / 4e-3, 0.0));
        assert_eq!(call_line(big, 1e-3, small, 2e-3), (small / 2e-3, 0.0));
    }

    #[test]
    fn median_ignores_outliers() {
        assert_eq!(median(&[]), 0.0);
        assert_eq!(median(&[3.0]), 3.0);
        assert_eq!(median(&[1.0, 100.0, 2.0, 3.0, 2.5, 0.1, 2.2]), 2.2);
        assert_eq!(median(&[4.0, 1.0]), 4.0);
    }

    #[test]
    fn compressed_staging_link_only_changes_the_compressed_path() {
        let link = Link {
            bandwidth: 3e9,
            latency: 1e-6,
        };
        let raw_st = Link {
            bandwidth: 27e9,
            latency: 0.0,
        };
        let cmp_st = Link {
            bandwidth: 20e9,
            latency: 0.0,
        };
        let base = Scenario::new(1e9, 20.0, link, 100e9, 300e9).with_staging(Some(raw_st));
        let a = predict(&base);
        let b = predict(&base.with_compressed_staging(Some(cmp_st)));
        assert_eq!(a.raw_serial, b.raw_serial);
        let d = 2.0 * (1e9 / 20.0) * (1.0 / 20e9 - 1.0 / 27e9);
        assert!((b.compressed_serial - a.compressed_serial - d).abs() < 1e-12);
    }

    #[test]
    fn ratio_cache_expires_estimates() {
        let mut c = RatioCache::default();
        assert_eq!(c.get_fresh(1, 7), None);
        c.put(1, 7, 12.5);
        for _ in 0..RatioCache::MAX_REUSE {
            assert_eq!(c.get_fresh(1, 7), Some(12.5));
        }
        assert_eq!(c.get_fresh(1, 7), None);
        assert_eq!(c.get(1, 7), Some(12.5));
        c.put(1, 7, 3.0);
        assert_eq!(c.get_fresh(1, 7), Some(3.0));
        c.put(1, 8, f64::NAN);
        assert_eq!(c.get(1, 8), None);
    }

    #[test]
    fn rates_and_policies_parse() {
        assert_eq!(parse_rate("25GB/s").unwrap(), 25e9);
        assert_eq!(parse_rate("1 GiB/s").unwrap(), 1073741824.0);
        assert_eq!(parse_rate("800MB/s").unwrap(), 8e8);
        assert!(parse_rate("fast").is_err());
        assert!(parse_rate("0GB/s").is_err());
        assert_eq!("never".parse::<Policy>().unwrap(), Policy::Never);
        assert_eq!(
            "auto".parse::<Policy>().unwrap(),
            Policy::Auto(CodecKind::Aatrox)
        );
        assert_eq!(
            "always:cuszp-plain".parse::<Policy>().unwrap(),
            Policy::Always(CodecKind::CuszpPlain)
        );
    }

    #[test]
    fn profile_round_trips() {
        let mut p = Profile::new(Link {
            bandwidth: 1e10,
            latency: 2e-6,
        });
        p.codecs
            .push(measure_codec::<f32>(CodecKind::Aatrox, 1 << 16, 1).unwrap());
        let q = Profile::from_json(&p.to_json()).unwrap();
        assert_eq!(p.link, q.link);
        let (a, b) = (p.codecs[0], q.codecs[0]);
        assert!((a.compress / b.compress - 1.0).abs() < 1e-12 && a.codec == b.codec);
        assert!(q.codec_speed(CodecKind::Aatrox, Dtype::F32).unwrap().ratio > 1.0);
    }

    fn good_profile() -> Profile {
        let mut p = Profile::new(Link {
            bandwidth: 1e10,
            latency: 2e-6,
        });
        p.staging = Some(Link {
            bandwidth: 2e10,
            latency: 1e-5,
        });
        p.allreduce = Some(Curve::linear(5e9, 3e-6));
        p.codecs
            .push(CodecSpeed::new(CodecKind::Aatrox, 1, 3e9, 6e9, 8.0));
        p
    }

    /// A cached profile with a zero, negative, NaN, infinite or absurd (1e308) speed, latency or
    /// ratio anywhere is refused by `validate`, `load` and `from_cache` (the communicator then
    /// recalibrates); the intact profile is accepted.
    #[test]
    fn cached_profiles_with_unusable_speeds_are_refused() {
        let path = std::env::temp_dir().join(format!("zcomm-model-{}.json", std::process::id()));
        let good = good_profile();
        good.validate().unwrap();
        assert_eq!(
            Profile::from_cache(good.to_json().as_bytes(), &path),
            Some(good.clone())
        );
        type Edit = fn(&mut Profile, f64);
        let edits: [(&str, Edit); 9] = [
            ("link.bandwidth", |p, v| p.link.bandwidth = v),
            ("host_add", |p, v| p.host_add = v),
            ("link.latency", |p, v| p.link.latency = v),
            ("staging.bandwidth", |p, v| {
                p.staging.as_mut().unwrap().bandwidth = v
            }),
            ("allreduce.latency", |p, v| {
                p.allreduce.as_mut().unwrap().latency = v
            }),
            ("allreduce.bandwidth", |p, v| {
                p.allreduce.as_mut().unwrap().bandwidth = v
            }),
            ("compress", |p, v| p.codecs[0].compress = v),
            ("decompress", |p, v| p.codecs[0].decompress = v),
            ("ratio", |p, v| p.codecs[0].ratio = v),
        ];
        for (field, edit) in edits {
            let latency = field.ends_with("latency");
            for v in [0.0, -1.0, f64::NAN, f64::INFINITY, 1e308, -0.0] {
                if (latency || field == "host_add") && v == 0.0 || field == "ratio" && v == 1e308 {
                    // a zero latency, an uncalibrated addition and a huge ratio (constant
                    // data) are real
                    continue;
                }
                let mut p = good.clone();
                edit(&mut p, v);
                let e = p.validate().expect_err(&format!("{field} = {v} accepted"));
                assert!(
                    e.to_string().contains(field.split('.').next().unwrap()),
                    "{e}"
                );
                // NaN and infinities are written as JSON null: refused by the parser instead
                assert_eq!(Profile::from_cache(p.to_json().as_bytes(), &path), None);
                p.save(&path).unwrap();
                assert!(Profile::load(&path).is_err(), "{field} = {v} loaded");
            }
        }
        assert_eq!(Profile::from_cache(b"{ not json", &path), None);
        let _ = std::fs::remove_file(&path);
    }

    /// `predict` gives finite, non-negative times and defined speedups for any input, and a path
    /// whose speed is unusable is never the faster one.
    #[test]
    fn predictions_are_never_nan_or_negative() {
        let bad = [
            0.0,
            -1.0,
            -0.0,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            1e308,
        ];
        let base = Scenario::new(
            1e8,
            10.0,
            Link {
                bandwidth: 1e10,
                latency: 1e-6,
            },
            3e9,
            6e9,
        )
        .with_staging(Some(Link {
            bandwidth: 2e10,
            latency: 1e-5,
        }))
        .with_chunks(4)
        .with_chunk_overhead(1e-5);
        type Edit = fn(&mut Scenario, f64);
        let edits: [(&str, Edit); 9] = [
            ("bytes", |s, v| s.bytes = v),
            ("ratio", |s, v| s.ratio = v),
            ("bandwidth", |s, v| s.link.bandwidth = v),
            ("latency", |s, v| s.link.latency = v),
            ("compress", |s, v| s.compress = v),
            ("decompress", |s, v| s.decompress = v),
            ("staging bandwidth", |s, v| {
                s.staging.as_mut().unwrap().bandwidth = v
            }),
            ("staging latency", |s, v| {
                s.staging.as_mut().unwrap().latency = v
            }),
            ("chunk overhead", |s, v| s.chunk_overhead = v),
        ];
        for (field, edit) in edits {
            for v in bad {
                let mut s = base;
                edit(&mut s, v);
                let p = predict(&s);
                for t in [
                    p.raw_serial,
                    p.raw_pipelined,
                    p.compressed_serial,
                    p.compressed_pipelined,
                ] {
                    assert!(
                        t.is_finite() && t >= 0.0,
                        "{field} = {v}: time {t} in {p:?}"
                    );
                }
                for x in [p.speedup_serial(), p.speedup_pipelined()] {
                    assert!(!x.is_nan() && x >= 0.0, "{field} = {v}: speedup {x}");
                }
                let unusable = v.is_nan() || v <= 0.0;
                if unusable && matches!(field, "compress" | "decompress") {
                    assert!(
                        p.compressed_serial > p.raw_serial,
                        "{field} = {v}: an unknown codec speed wins: {p:?}"
                    );
                }
            }
        }
        // no bytes and no latency: both paths take no time, speedup 1
        let mut s = base;
        s.bytes = 0.0;
        s.link.latency = 0.0;
        s.staging = None;
        s.chunk_overhead = 0.0;
        let p = predict(&s);
        assert_eq!((p.raw_serial, p.compressed_serial), (0.0, 0.0));
        assert_eq!(p.speedup_serial(), 1.0);
        // the curves' interpolation of NaN bytes is 0, not NaN
        let c = Curve::from_points(vec![(1e6, 1e-3)], &Curve::default());
        assert_eq!(c.seconds(f64::NAN), Some(0.0));
    }

    #[test]
    fn ratio_estimate_is_close_on_smooth_data() {
        let data: Vec<f32> = (0..(1 << 20)).map(|i| (i as f32 * 1e-4).sin()).collect();
        let (est, s) =
            estimate_ratio(&data, crate::ErrorBound::Noa(1e-3), CodecKind::Aatrox, 4).unwrap();
        assert!(s.is_none());
        let full = crate::compress(&data, crate::ErrorBound::Noa(1e-3), CodecKind::Aatrox).unwrap();
        let real = (data.len() * 4) as f64 / full.len() as f64;
        assert!((est / real - 1.0).abs() < 0.3, "estimate {est} vs {real}");
    }
}
