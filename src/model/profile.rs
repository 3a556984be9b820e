//! The one calibrated [`Profile`] of every communicator: links between ranks, staging copies,
//! codec speeds (CPU and GPU, shared and solo) and the device passes, whatever the transport.
//!
//! Each communicator fills the parts its transport has and leaves the rest empty (an empty
//! curve, a rate of 0, no codec records: *not calibrated*, the predictions then fall back as
//! documented on each field): the host [`Communicator`](crate::comm::Communicator) measures
//! the host ping-pong, MPI's own allreduce, the host addition and the CPU codecs; its
//! [`DeviceStager`](crate::comm::device::DeviceStager) adds the pinned staging curves, the
//! exchanges between pinned buffers, the GPU codecs and the device passes; the NCCL
//! communicator the same GPU codecs and passes (one calibration,
//! `comm::device_calibrate`), its exchanges and NCCL's own collectives. The predictions
//! read the same fields for the same things: the staged operations through
//! [`Profile::staged`] ([`StagedModel`](super::StagedModel)), the device-direct ones (NCCL,
//! loopback) through the methods of [`direct`](super::direct), host buffers through
//! [`Scenario`](super::Scenario).

use std::path::{Path, PathBuf};

use super::{CodecSpeed, Curve, Link, StagingCurve};
use crate::codec::CodecKind;
use crate::error::{Error, Result};
use crate::format::Dtype;

/// Calibration results of a communicator, cached as JSON (format version 2; version 1 files,
/// the host part alone, still load).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Profile {
    /// Format version of the file (2).
    pub version: u32,
    /// Host name of rank 0 when measured.
    pub host: String,
    /// Number of ranks when measured.
    pub ranks: usize,
    /// Which compressor the CPU codec speeds belong to (`cpu`).
    pub compressor: String,
    /// The link the device curves were measured on (`staged`: pinned host buffers over the
    /// host transport; NCCL's `nvlink`, `socket`, ...;
    /// empty: host links only).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub transport: String,
    /// The host link between ranks, from a ping-pong of host buffers (the fallback of the
    /// exchange curves).
    pub link: Link,
    /// The pinned staging copies as one line (the fallback of the staging curves), if device
    /// buffers are staged.
    pub staging: Option<Link>,
    /// The transport's own (uncompressed) allreduce: seconds by bytes per rank (MPI's on host
    /// buffers, NCCL's on device buffers; measured, because large allreduces can be far from
    /// link speed). `None`: not measured.
    #[serde(default)]
    pub allreduce: Option<Curve>,
    /// The transport's own allgather: seconds by gathered output bytes. `None`: not measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allgather: Option<Curve>,
    /// The host addition pass of the raw ring reductions (`acc += x` over host memory, every
    /// rank at once; bytes of `acc` per second). On one node the ranks' additions share the
    /// memory system with the transport, so the pass is far from free. 0 = not calibrated (not
    /// charged).
    #[serde(default)]
    pub host_add: f64,
    /// CPU codec speeds.
    pub codecs: Vec<CodecSpeed>,
    /// Seconds since the Unix epoch when measured.
    pub created: u64,
    /// Pinned copy times at several sizes (every rank copying at once), for the size
    /// dependence of staging; empty: the `staging` line.
    #[serde(default, skip_serializing_if = "StagingCurve::is_empty")]
    pub staging_curve: StagingCurve,
    /// Pinned copy times of one rank copying alone (the others idle); empty: the shared curve.
    #[serde(default, skip_serializing_if = "StagingCurve::is_empty")]
    pub staging_curve_solo: StagingCurve,
    /// Simultaneous exchanges between two ranks (both send `bytes` and receive `bytes` at once:
    /// between the pinned staging buffers over MPI, or a grouped NCCL send + receive): the link
    /// of the pairwise exchanges, the ring's steps and the allgathers' rounds. Empty: the host
    /// ping-pong `link`.
    #[serde(default, skip_serializing_if = "Curve::is_empty")]
    pub link_exchange: Curve,
    /// One-way transfers between two ranks (one sends, the other receives, the rest idle), for
    /// broadcasts and point-to-point messages. Empty: the exchange curve (NCCL) or the host
    /// ping-pong `link` (staged).
    #[serde(default, skip_serializing_if = "Curve::is_empty")]
    pub link_one_way: Curve,
    /// GPU codec speeds: every codec the device calibration measured, the one it was asked for
    /// first (its lines stand for codecs without their own).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_codecs: Vec<CodecSpeed>,
    /// Device-to-device copy (bytes copied per second, every rank at once), reported; the
    /// device algorithms copy no values. 0 = not calibrated.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub device_copy: f64,
    /// The value-range pass over a device buffer (input bytes per second beyond
    /// `range_fixed`, its read-back included); 0 = not calibrated (not charged).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub range_pass: f64,
    /// Fixed seconds of one value-range pass (launch and read-back).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub range_fixed: f64,
    /// The mean's in-place division kernel (bytes of values per second); 0 = not calibrated.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub scale_pass: f64,
    /// Ranks sharing one GPU (the most of any GPU); 0 = unknown (treated as 1).
    #[serde(default, skip_serializing_if = "is_zero_usize")]
    pub ranks_per_gpu: usize,
    /// Host cost per pipeline piece of the device-direct operations (the size message round on
    /// the bootstrap transport), seconds.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub piece_overhead: f64,
}

fn is_zero(v: &f64) -> bool {
    *v == 0.0
}

fn is_zero_usize(v: &usize) -> bool {
    *v == 0
}

impl Profile {
    /// A profile with the given host link and nothing else calibrated.
    pub fn new(link: Link) -> Self {
        Profile {
            version: 2,
            host: String::new(),
            ranks: 0,
            compressor: "cpu".into(),
            transport: String::new(),
            link,
            staging: None,
            allreduce: None,
            allgather: None,
            host_add: 0.0,
            codecs: Vec::new(),
            created: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            staging_curve: StagingCurve::default(),
            staging_curve_solo: StagingCurve::default(),
            link_exchange: Curve::default(),
            link_one_way: Curve::default(),
            gpu_codecs: Vec::new(),
            device_copy: 0.0,
            range_pass: 0.0,
            range_fixed: 0.0,
            scale_pass: 0.0,
            ranks_per_gpu: 0,
            piece_overhead: 0.0,
        }
    }
    /// The guess for staged device buffers before any calibration (H100-class PCIe, one rank
    /// per GPU; the GPU codecs at [`CodecSpeed::gpu_guess`]).
    pub fn staged_guess() -> Self {
        Profile {
            staging: Some(Link {
                bandwidth: 20e9,
                latency: 10e-6,
            }),
            ..Profile::new(Link {
                bandwidth: 10e9,
                latency: 5e-6,
            })
        }
    }
    /// The guess for a device-direct transport before calibration: NVLink ≈ 300 GB/s, socket
    /// ≈ 3.5 GB/s for every link curve (`transport` labels it); the GPU codecs at
    /// [`CodecSpeed::gpu_guess`].
    pub fn direct_guess(transport: &str) -> Self {
        let bw = if transport == "socket" { 3.5e9 } else { 300e9 };
        let l = Curve::linear(bw, 20e-6);
        Profile {
            transport: transport.to_string(),
            allreduce: Some(l.clone()),
            allgather: Some(l.clone()),
            link_exchange: l,
            piece_overhead: 5e-6,
            ..Profile::new(Link {
                bandwidth: bw,
                latency: 20e-6,
            })
        }
    }
    /// The speeds of CPU `codec` on `dtype`, if calibrated.
    pub fn codec_speed(&self, codec: CodecKind, dtype: Dtype) -> Option<CodecSpeed> {
        self.codecs
            .iter()
            .copied()
            .find(|c| c.codec == codec && c.dtype == dtype.tag())
    }
    /// The calibrated GPU lines of `codec` on `dtype_tag` (1 f32, 2 f64), else its f32 lines,
    /// else `None`.
    pub fn gpu_record(&self, codec: CodecKind, dtype_tag: u8) -> Option<CodecSpeed> {
        let of = |d: u8| {
            self.gpu_codecs
                .iter()
                .copied()
                .find(|c| c.codec == codec && c.dtype == d)
        };
        of(dtype_tag).or_else(|| of(1))
    }
    /// The GPU lines the model uses for `codec` on `dtype_tag`: its own
    /// ([`gpu_record`](Self::gpu_record)), else those of the codec the calibration was asked for
    /// (the first record), else [`CodecSpeed::gpu_guess`]; always labelled `codec`.
    pub fn gpu_lines(&self, codec: CodecKind, dtype_tag: u8) -> CodecSpeed {
        let c = self
            .gpu_record(codec, dtype_tag)
            .or_else(|| self.gpu_codecs.first().copied())
            .unwrap_or_else(|| CodecSpeed::gpu_guess(codec));
        CodecSpeed { codec, ..c }
    }
    /// Seconds of the value-range pass over `bytes` of a device buffer (its line: rate and
    /// fixed cost); 0 when not calibrated.
    pub fn range_s(&self, bytes: f64) -> f64 {
        if self.range_pass > 0.0 {
            super::seconds_at(bytes, self.range_pass) + self.range_fixed
        } else {
            0.0
        }
    }
    /// Seconds a compressed reduction of `bytes` per rank spends on the inputs' value range
    /// before its ring: an allreduce (`full`) whose codec measures the range in its kernels
    /// ([`CodecKind::measures_range_on_gpu`]) samples it (one small call); otherwise a range
    /// pass ([`range_s`](Self::range_s)).
    pub fn reduction_range_s(&self, bytes: f64, full: bool, codec: crate::codec::CodecKind) -> f64 {
        if full && codec.measures_range_on_gpu() {
            self.range_fixed
        } else {
            self.range_s(bytes)
        }
    }
    /// The staging line (`staging`, else the staged guess's).
    pub fn staging_line(&self) -> Link {
        self.staging.unwrap_or(Link {
            bandwidth: 20e9,
            latency: 10e-6,
        })
    }
    /// Read a profile from a JSON file and [`validate`](Self::validate) it.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)?;
        let p = Self::from_json(&text)?;
        p.validate()?;
        Ok(p)
    }
    /// A cached profile's bytes (read from `path`) parsed and [`validate`](Self::validate)d, or
    /// `None` after a warning that names the file and the reason, so that the caller
    /// recalibrates: a damaged or hand-edited cache must not feed the model zero, negative,
    /// non-finite or absurd speeds (which made `Auto` compress every message).
    pub fn from_cache(bytes: &[u8], path: &Path) -> Option<Self> {
        let p = Self::from_json(&String::from_utf8_lossy(bytes)).and_then(|p| {
            p.validate()?;
            Ok(p)
        });
        match p {
            Ok(p) => Some(p),
            Err(e) => {
                tracing::warn!(target: "zcomm::model", path = %path.display(), "ignoring the cached profile ({e}); recalibrating");
                None
            }
        }
    }
    /// Check that every speed is usable by the model: bandwidths and codec throughputs finite,
    /// `> 0` and at most [`MAX_RATE`](Self::MAX_RATE) (the rates documented as "0 = not
    /// calibrated" may also be 0); latencies finite, `>= 0` and at most
    /// [`MAX_LATENCY`](Self::MAX_LATENCY); ratios finite and `> 0`; curve points finite and
    /// positive. The error names the field.
    pub fn validate(&self) -> Result<()> {
        let rate = |what: &str, v: f64| {
            if v.is_finite() && v > 0.0 && v <= Self::MAX_RATE {
                Ok(())
            } else {
                Err(Error::invalid(format!(
                    "profile {what} = {v}: expected a rate in (0, {:e}] bytes/s",
                    Self::MAX_RATE
                )))
            }
        };
        let seconds = |what: &str, v: f64| {
            if v.is_finite() && (0.0..=Self::MAX_LATENCY).contains(&v) {
                Ok(())
            } else {
                Err(Error::invalid(format!(
                    "profile {what} = {v}: expected seconds in [0, {}]",
                    Self::MAX_LATENCY
                )))
            }
        };
        let link = |what: &str, l: &Link| {
            rate(&format!("{what}.bandwidth"), l.bandwidth)?;
            seconds(&format!("{what}.latency"), l.latency)
        };
        let curve = |what: &str, c: &Curve| {
            link(
                what,
                &Link {
                    bandwidth: c.bandwidth,
                    latency: c.latency,
                },
            )?;
            for &(b, t) in &c.points {
                if !(b.is_finite() && b > 0.0) {
                    return Err(Error::invalid(format!(
                        "profile {what}: point of {b} bytes"
                    )));
                }
                seconds(&format!("{what} at {b} bytes"), t)?;
            }
            Ok(())
        };
        let optional = |what: &str, v: f64| if v == 0.0 { Ok(()) } else { rate(what, v) };
        link("link", &self.link)?;
        if let Some(l) = &self.staging {
            link("staging", l)?;
        }
        if let Some(c) = &self.allreduce {
            curve("allreduce", c)?;
        }
        if let Some(c) = &self.allgather {
            curve("allgather", c)?;
        }
        for (what, c) in [
            ("link_exchange", &self.link_exchange),
            ("link_one_way", &self.link_one_way),
        ] {
            if !c.is_empty() {
                curve(what, c)?;
            }
        }
        optional("host_add", self.host_add)?;
        optional("device_copy", self.device_copy)?;
        optional("range_pass", self.range_pass)?;
        optional("scale_pass", self.scale_pass)?;
        seconds("range_fixed", self.range_fixed)?;
        seconds("piece_overhead", self.piece_overhead)?;
        for c in self.codecs.iter().chain(&self.gpu_codecs) {
            rate(&format!("{} compress", c.codec), c.compress)?;
            rate(&format!("{} decompress", c.codec), c.decompress)?;
            if !(c.ratio.is_finite() && c.ratio > 0.0) {
                return Err(Error::invalid(format!(
                    "profile {} ratio = {}: expected a finite ratio > 0",
                    c.codec, c.ratio
                )));
            }
        }
        Ok(())
    }
    /// The largest rate (bytes/s) a valid profile holds: 10 PB/s, three orders of magnitude
    /// above any memory system; beyond it a "measurement" is a broken timer or a damaged file.
    pub const MAX_RATE: f64 = 1e16;
    /// The largest per-message latency (seconds) a valid profile holds.
    pub const MAX_LATENCY: f64 = 60.0;
    /// Parse a profile from JSON text (the format only: see [`validate`](Self::validate)).
    /// Version 1 files (the host part alone) load as version 2 profiles without device parts.
    pub fn from_json(text: &str) -> Result<Self> {
        let mut p: Profile =
            serde_json::from_str(text).map_err(|e| Error::invalid(format!("profile JSON: {e}")))?;
        if !(1..=2).contains(&p.version) {
            return Err(Error::invalid(format!(
                "profile version {} unsupported",
                p.version
            )));
        }
        p.version = 2;
        Ok(p)
    }
    /// The profile as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("profile serializes")
    }
    /// Write the profile as JSON (creating parent directories; atomically: a temporary file in
    /// the same directory renamed over `path`, so a crash never leaves half a profile).
    pub fn save(&self, path: &Path) -> Result<()> {
        if let Some(d) = path.parent() {
            std::fs::create_dir_all(d)?;
        }
        let tmp = path.with_extension(format!("json.tmp{}", std::process::id()));
        std::fs::write(&tmp, self.to_json())?;
        std::fs::rename(&tmp, path).inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })?;
        Ok(())
    }
    /// The default cache path: `$ZCOMM_PROFILE`, else
    /// `$XDG_CACHE_HOME/zcomm/profile-{key}.json` (or `~/.cache/...`, or the temp dir).
    pub fn default_path(key: &str) -> PathBuf {
        if let Some(p) = std::env::var_os("ZCOMM_PROFILE") {
            return PathBuf::from(p);
        }
        let base = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .unwrap_or_else(std::env::temp_dir);
        let key: String = key
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        base.join("zcomm").join(format!("profile-{key}.json"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A version 1 file (the host part alone, the format before one profile held every
    /// communicator's parts) loads as a version 2 profile with the same host numbers and no
    /// device parts; its `allreduce` line becomes a curve without points.
    #[test]
    fn version_1_host_profiles_still_load() {
        let v1 = r#"{"version":1,"host":"node7","ranks":2,"compressor":"cpu",
            "link":{"bandwidth":3.1e9,"latency":1.5e-6},"staging":null,
            "allreduce":{"bandwidth":2.5e9,"latency":4e-6},"host_add":1.7e10,
            "codecs":[{"codec":"aatrox","dtype":1,"compress":5.5e9,"decompress":8.1e9,"ratio":9.5}],
            "created":1795700000}"#;
        let p = Profile::from_json(v1).unwrap();
        p.validate().unwrap();
        assert_eq!(p.version, 2);
        assert_eq!((p.host.as_str(), p.ranks, p.host_add), ("node7", 2, 1.7e10));
        assert_eq!(p.link.bandwidth, 3.1e9);
        let ar = p.allreduce.as_ref().unwrap();
        assert!(ar.points.is_empty() && (ar.time(1e9) - (4e-6 + 1e9 / 2.5e9)).abs() < 1e-15);
        assert_eq!(
            p.codec_speed(CodecKind::Aatrox, Dtype::F32).unwrap().ratio,
            9.5
        );
        assert!(
            p.gpu_codecs.is_empty() && p.link_exchange.is_empty() && p.staging_curve.is_empty()
        );
        // an unknown version is refused
        let v9 = v1.replace("\"version\":1", "\"version\":9");
        assert!(Profile::from_json(&v9).is_err());
    }

    /// `validate` also refuses unusable device parts: a GPU codec rate, a curve point, the
    /// range pass's fixed cost; the device parts of a calibrated-looking profile pass.
    #[test]
    fn validate_checks_the_device_parts() {
        let mut good = Profile::direct_guess("nvlink");
        good.gpu_codecs = vec![CodecSpeed::new(CodecKind::Aatrox, 1, 3e11, 4e11, 9.0)];
        good.link_exchange =
            Curve::from_points(vec![(1e6, 1e-5), (6.4e7, 2e-4)], &Curve::default());
        good.range_pass = 8e11;
        good.range_fixed = 2e-5;
        good.validate().unwrap();
        type Edit = fn(&mut Profile);
        let bad: [(&str, Edit); 6] = [
            ("gpu compress", |p| p.gpu_codecs[0].compress = f64::NAN),
            ("gpu ratio", |p| p.gpu_codecs[0].ratio = 0.0),
            ("curve point", |p| p.link_exchange.points[1].1 = -1.0),
            ("curve bytes", |p| {
                p.link_exchange.points[0].0 = f64::INFINITY
            }),
            ("range fixed", |p| p.range_fixed = f64::NAN),
            ("range pass", |p| p.range_pass = -3.0),
        ];
        for (what, edit) in bad {
            let mut p = good.clone();
            edit(&mut p);
            assert!(p.validate().is_err(), "{what} passed validation");
        }
    }

    /// `save` writes the whole file or nothing: the result reads back, and no temporary file
    /// is left beside it.
    #[test]
    fn save_is_atomic_and_reads_back() {
        let dir = std::env::temp_dir().join(format!("zcomm-profile-save-{}", std::process::id()));
        let path = dir.join("p.json");
        let p = Profile::staged_guess();
        p.save(&path).unwrap();
        assert_eq!(Profile::load(&path).unwrap(), p);
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert_eq!(left.len(), 1, "{left:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
