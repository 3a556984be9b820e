//! Size-dependent time curves built from measured points: pinned staging copies
//! ([`StagingCurve`], one point per size for both directions) and every link between ranks
//! ([`Curve`]: exchanges, one-way messages, a transport's own collectives).
//!
//! The staging curve interpolates linearly in log(bytes)–log(seconds), because the achieved
//! bandwidth of pinned copies changes smoothly over orders of magnitude of size, and it is
//! measured up to the largest size it predicts. A link's time for a message is not `latency +
//! bytes / bandwidth` with one bandwidth either: over NCCL's socket transport a few channels and
//! TCP slow start make messages of a few MB travel well below the large-message rate, so a
//! straight line through 1 MiB and 64 MiB underestimates the mid-size messages that compressed
//! pieces produce. [`Curve`] therefore keeps the measured `(bytes, seconds)` points and
//! interpolates piecewise linearly between them (time is monotone in bytes); below the smallest
//! point it runs to the latency intercept at zero bytes, beyond the largest it continues with
//! the last segment's bandwidth. Without points (old profile files, the guesses) it is the plain
//! linear [`Link`].

use super::Link;

/// One measured size of a [`StagingCurve`]: seconds of a pinned device→host and host→device
/// copy of `bytes` (median over repetitions; every rank copying at once, slowest rank, or one
/// rank alone for a solo curve).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StagingPoint {
    /// Bytes copied.
    pub bytes: f64,
    /// Device→host seconds.
    pub d2h: f64,
    /// Host→device seconds.
    pub h2d: f64,
}

/// Size-dependent pinned staging times (device buffers): measured points, interpolated linearly
/// in log(bytes)–log(seconds) between them and extended with the bandwidth of the nearest
/// end point outside them. Pinned copies are not one `latency + bytes/bandwidth` line: the
/// achieved bandwidth depends on the size and on how many ranks copy through the same PCIe link
/// at once, so the model uses the time measured at the nearest sizes. An empty curve has no
/// opinion (callers fall back to a [`Link`]).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StagingCurve {
    /// Measured points, sorted by size (see [`insert`](Self::insert)).
    pub points: Vec<StagingPoint>,
}

impl StagingCurve {
    /// Whether no size has been measured.
    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }
    /// Add (or replace) the point of `p.bytes`, keeping the points sorted.
    pub fn insert(&mut self, p: StagingPoint) {
        if !(p.bytes > 0.0 && p.d2h > 0.0 && p.h2d > 0.0) {
            return;
        }
        self.points.retain(|q| q.bytes != p.bytes);
        let i = self.points.partition_point(|q| q.bytes < p.bytes);
        self.points.insert(i, p);
    }
    fn interp(&self, bytes: f64, f: impl Fn(&StagingPoint) -> f64) -> Option<f64> {
        interp_log(&self.points, bytes, |p| p.bytes, f)
    }
    /// Predicted device→host seconds for `bytes` (`None` when empty).
    pub fn d2h(&self, bytes: f64) -> Option<f64> {
        self.interp(bytes, |p| p.d2h)
    }
    /// Predicted host→device seconds for `bytes` (`None` when empty).
    pub fn h2d(&self, bytes: f64) -> Option<f64> {
        self.interp(bytes, |p| p.h2d)
    }
    /// The effective link of one staging hop of `bytes` (mean of both directions, latency 0: `bytes
    /// / bandwidth` is the interpolated time), for
    /// [`Scenario::with_staging`](super::Scenario::with_staging).
    pub fn link(&self, bytes: f64) -> Option<Link> {
        let b = bytes.max(1.0);
        let t = 0.5 * (self.d2h(b)? + self.h2d(b)?);
        Some(Link {
            bandwidth: b / t.max(1e-12),
            latency: 0.0,
        })
    }
}

/// Interpolate the seconds `y` of measured `points` (sorted by their size `x`) at `bytes`:
/// linear in log(bytes)–log(seconds) between points, the bandwidth of the nearest end point
/// outside them, 0 for no (or NaN) bytes, `None` without points.
fn interp_log<P>(
    pts: &[P],
    bytes: f64,
    x: impl Fn(&P) -> f64,
    y: impl Fn(&P) -> f64,
) -> Option<f64> {
    let (first, last) = (pts.first()?, pts.last()?);
    if bytes.is_nan() || bytes <= 0.0 {
        return Some(0.0);
    }
    if bytes <= x(first) {
        return Some(y(first) * bytes / x(first));
    }
    if bytes >= x(last) {
        return Some(y(last) * bytes / x(last));
    }
    let i = pts.partition_point(|q| x(q) < bytes).max(1);
    if x(&pts[i]) == bytes {
        return Some(y(&pts[i]));
    }
    let (a, b) = (&pts[i - 1], &pts[i]);
    let w = (bytes.ln() - x(a).ln()) / (x(b).ln() - x(a).ln());
    Some((y(a).ln() * (1.0 - w) + y(b).ln() * w).exp())
}

/// The time of one transfer (or one collective) as a function of its size: measured points,
/// interpolated piecewise linearly, with the linear `latency + bytes / bandwidth` model outside
/// them (and everywhere when there are no points). Every link curve of the [`Profile`]
/// (exchanges, one-way messages, a transport's own collectives) is one.
///
/// [`Profile`]: super::Profile
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Curve {
    /// Bytes per second: beyond the largest point (the last segment's bandwidth), everywhere
    /// when there are no points.
    #[serde(default)]
    pub bandwidth: f64,
    /// Seconds at zero bytes (the first segment's intercept, at most the first point's time).
    #[serde(default)]
    pub latency: f64,
    /// Measured `(bytes, seconds)`, strictly increasing in bytes, non-decreasing in time.
    /// Empty in profiles written before size-dependent calibration.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub points: Vec<(f64, f64)>,
}

impl From<Link> for Curve {
    fn from(l: Link) -> Self {
        Curve {
            bandwidth: l.bandwidth,
            latency: l.latency,
            points: Vec::new(),
        }
    }
}

impl Curve {
    /// Whether the curve says nothing (the default: no points and no line; not calibrated). A
    /// [`linear`](Self::linear) curve is not empty.
    pub fn is_empty(&self) -> bool {
        self.points.is_empty() && (self.bandwidth.is_nan() || self.bandwidth <= 0.0)
    }

    /// Seconds of one message of `bytes` ([`time`](Self::time)), or `None` when the curve is
    /// [empty](Self::is_empty).
    pub fn seconds(&self, bytes: f64) -> Option<f64> {
        if self.is_empty() {
            None
        } else if bytes.is_nan() {
            Some(0.0)
        } else {
            Some(self.time(bytes))
        }
    }

    /// The effective link of one message of `bytes` (latency 0: `bytes / bandwidth` is the
    /// curve's time), or `None` when the curve is [empty](Self::is_empty).
    pub fn link(&self, bytes: f64) -> Option<Link> {
        let b = bytes.max(1.0);
        let t = self.seconds(b)?;
        Some(Link {
            bandwidth: b / t.max(1e-12),
            latency: 0.0,
        })
    }

    /// The linear model `latency + bytes / bandwidth` (no points).
    pub fn linear(bandwidth: f64, latency: f64) -> Self {
        Curve {
            bandwidth,
            latency,
            points: Vec::new(),
        }
    }

    /// Build the model from measurements `(bytes, seconds)` in any order. Points that are not
    /// finite and positive are dropped, repeated sizes keep their smallest time, and times are
    /// made non-decreasing in bytes (a later point's time is raised to the earlier maximum), so
    /// the model is monotone. With no usable point the result is `fallback`.
    pub fn from_points(mut pts: Vec<(f64, f64)>, fallback: &Curve) -> Self {
        pts.retain(|&(b, t)| b.is_finite() && t.is_finite() && b > 0.0 && t > 0.0);
        pts.sort_by(|x, y| x.0.total_cmp(&y.0).then(x.1.total_cmp(&y.1)));
        pts.dedup_by(|later, earlier| later.0 == earlier.0);
        for i in 1..pts.len() {
            pts[i].1 = pts[i].1.max(pts[i - 1].1);
        }
        let n = pts.len();
        if n == 0 {
            return fallback.clone();
        }
        let avg = |(b, t): (f64, f64)| b / t;
        // the bandwidth of the segment i-1 .. i (the average one where the segment is flat)
        let seg_bw = |i: usize| {
            let (db, dt) = (pts[i].0 - pts[i - 1].0, pts[i].1 - pts[i - 1].1);
            if dt > db * 1e-15 {
                db / dt
            } else {
                avg(pts[i])
            }
        };
        let (bandwidth, latency) = if n == 1 {
            (avg(pts[0]), 0.0)
        } else {
            let bw = seg_bw(1);
            let lat = (pts[0].1 - pts[0].0 / bw).clamp(0.0, pts[0].1);
            (seg_bw(n - 1), lat)
        };
        Curve {
            bandwidth: bandwidth.max(1e6),
            latency,
            points: pts,
        }
    }

    /// Seconds for one message of `bytes` (monotone non-decreasing in `bytes`).
    pub fn time(&self, bytes: f64) -> f64 {
        let b = bytes.max(0.0);
        let (Some(&first), Some(&last)) = (self.points.first(), self.points.last()) else {
            return self.latency + b / self.bandwidth;
        };
        if b >= last.0 {
            return last.1 + (b - last.0) / self.bandwidth;
        }
        let t0 = self.latency.clamp(0.0, first.1);
        if b <= first.0 {
            return t0 + (first.1 - t0) * b / first.0;
        }
        // first index whose size is above b (b lies in its segment)
        let i = self.points.partition_point(|&(x, _)| x <= b);
        let ((b0, t0), (b1, t1)) = (self.points[i - 1], self.points[i]);
        t0 + (t1 - t0) * (b - b0) / (b1 - b0)
    }

    /// Seconds at zero bytes (the latency the model charges once per message).
    pub fn base(&self) -> f64 {
        match self.points.first() {
            Some(&(_, t)) => self.latency.clamp(0.0, t),
            None => self.latency,
        }
    }

    /// Seconds for `count` messages of `bytes` each moving at once (one grouped round, e.g. one
    /// piece to each of `count` peers): the latency once, the transfer part of a `bytes`
    /// message `count` times (each message at the rate of its own size; fractional `count`
    /// scales the transfer, e.g. `0.5` for half the traffic of a message of `bytes`).
    pub fn time_many(&self, bytes: f64, count: f64) -> f64 {
        let base = self.base();
        base + count.max(0.0) * (self.time(bytes) - base)
    }

    /// Effective bandwidth `bytes / time(bytes)` of one message of `bytes`, bytes per second.
    pub fn rate(&self, bytes: f64) -> f64 {
        bytes / self.time(bytes).max(1e-12)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: f64 = 1048576.0;

    /// A concave socket-like ramp: 60 us latency, rate rising from ~1 GB/s to 3.7 GB/s.
    fn socket() -> Curve {
        let pts = vec![
            (16.0 * MIB, 5.6e-3),
            (0.25 * MIB, 0.30e-3),
            (MIB, 0.80e-3),
            (4.0 * MIB, 1.9e-3),
            (64.0 * MIB, 19.6e-3),
        ];
        Curve::from_points(pts, &Curve::linear(3.5e9, 20e-6))
    }

    #[test]
    fn interpolates_through_points_and_extrapolates_with_last_segment() {
        let l = socket();
        assert_eq!(l.points.len(), 5);
        assert!(l.points.windows(2).all(|w| w[0].0 < w[1].0));
        for &(b, t) in &l.points {
            assert!((l.time(b) - t).abs() < 1e-12, "{b}: {} vs {t}", l.time(b));
        }
        // half way between 1 and 4 MiB in bytes -> half way in time
        let mid = l.time(2.5 * MIB);
        assert!((mid - (0.80e-3 + 1.9e-3) / 2.0).abs() < 1e-12);
        // last segment: 48 MiB in 14 ms
        let bw = 48.0 * MIB / 14.0e-3;
        assert!((l.bandwidth - bw).abs() / bw < 1e-12);
        let far = l.time(256.0 * MIB);
        assert!((far - (19.6e-3 + 192.0 * MIB / bw)).abs() < 1e-12);
        // below the first point: towards the first segment's intercept
        let bw0 = 0.75 * MIB / 0.5e-3;
        let lat = 0.30e-3 - 0.25 * MIB / bw0;
        assert!((l.latency - lat).abs() < 1e-12, "{}", l.latency);
        assert!((l.time(0.0) - lat).abs() < 1e-12);
        assert!(l.time(0.125 * MIB) > lat && l.time(0.125 * MIB) < 0.30e-3);
        // the ramp: mid-size messages slower than the linear 1 MiB / 64 MiB fit predicts
        let two_point = Curve::from_points(
            vec![(MIB, 0.80e-3), (64.0 * MIB, 19.6e-3)],
            &Curve::linear(1.0, 0.0),
        );
        assert!(l.time(4.0 * MIB) > two_point.time(4.0 * MIB));
        assert!(l.rate(4.0 * MIB) < l.rate(64.0 * MIB));
    }

    #[test]
    fn monotone_even_from_noisy_points() {
        let noisy = vec![
            (MIB, 1.0e-3),
            (2.0 * MIB, 0.9e-3), // faster than 1 MiB: noise
            (4.0 * MIB, 2.0e-3),
            (4.0 * MIB, 1.8e-3), // repeated size: the smaller time stays
            (8.0 * MIB, 2.0e-3), // flat last segment
            (f64::NAN, 1.0),
            (-1.0, 1.0),
        ];
        let l = Curve::from_points(noisy, &Curve::linear(1e9, 0.0));
        assert_eq!(l.points.len(), 4);
        assert_eq!(l.points[1], (2.0 * MIB, 1.0e-3));
        assert_eq!(l.points[2], (4.0 * MIB, 1.8e-3));
        assert!(l.bandwidth.is_finite() && l.bandwidth > 0.0);
        let mut prev = -1.0;
        for i in 0..2000 {
            let b = i as f64 * 0.01 * MIB;
            let t = l.time(b);
            assert!(t >= prev, "time falls at {b}: {t} < {prev}");
            prev = t;
        }
        assert!(l.time(64.0 * MIB) > l.time(8.0 * MIB));
    }

    #[test]
    fn linear_without_points_and_fallback() {
        let lin = Curve::linear(2e9, 10e-6);
        assert!((lin.time(2e9) - (1.0 + 10e-6)).abs() < 1e-12);
        assert_eq!(lin.base(), 10e-6);
        assert!((lin.time_many(2e9, 3.0) - (3.0 + 10e-6)).abs() < 1e-12);
        let fb = Curve::from_points(vec![(f64::INFINITY, 1.0)], &lin);
        assert_eq!(fb, lin);
        let one = Curve::from_points(vec![(MIB, 1e-3)], &lin);
        assert!((one.time(2.0 * MIB) - 2e-3).abs() < 1e-12);
        // an old profile file (no points) still reads
        let old: Curve = serde_json::from_str(r#"{"bandwidth":3.5e9,"latency":2e-5}"#).unwrap();
        assert_eq!(old, Curve::linear(3.5e9, 2e-5));
        let round: Curve =
            serde_json::from_str(&serde_json::to_string(&socket()).unwrap()).expect("round trip");
        assert_eq!(round, socket());
        let l: Curve = Link {
            bandwidth: 1e9,
            latency: 1e-6,
        }
        .into();
        assert_eq!(l, Curve::linear(1e9, 1e-6));
    }

    #[test]
    fn many_messages_share_the_latency() {
        let l = socket();
        let one = l.time(4.0 * MIB);
        assert!((l.time_many(4.0 * MIB, 1.0) - one).abs() < 1e-15);
        let three = l.time_many(4.0 * MIB, 3.0);
        assert!(three < 3.0 * one && three > one);
        assert!((l.time_many(4.0 * MIB, 0.0) - l.base()).abs() < 1e-15);
    }
}
