//! Configuration from the environment (read once, in `MPI_Init`).
//!
//! | variable | values | default |
//! |---|---|---|
//! | `ZCOMM_ERROR_BOUND` | `abs:E`, `noa:E`, `rel:E` (end to end for reductions) | `noa:1e-4` |
//! | `ZCOMM_POLICY` | `auto`, `always`, `never` (also `auto:CODEC`, `always:CODEC`) | `auto` |
//! | `ZCOMM_CODEC` | `aatrox`, `cuszp-plain`, `cuszp-outlier`, `pfpl` | `aatrox` |
//! | `ZCOMM_MIN_BYTES` | bytes per rank (suffix `k`, `m`, `g`: binary units) | `65536` |
//! | `ZCOMM_P2P` | `on`, `off`: compress point-to-point messages | `on` |
//! | `ZCOMM_NONBLOCKING` | `on`, `off`: compress `MPI_Iallreduce` on a progress thread (asks MPI for `MPI_THREAD_MULTIPLE`) | `on` |
//! | `ZCOMM_COMMS` | `all`, `world`: communicators that may compress | `all` |
//! | `ZCOMM_DEVICE` | `stage`: collectives on CUDA device buffers compress on the GPU and stage the stream through host memory (any MPI); `pass`: device buffers go to PMPI unchanged (needs a CUDA-aware MPI) | `stage` |
//! | `ZCOMM_VERIFY` | `0`, `1`: measure the max error of every compressed call | `0` |
//! | `ZCOMM_CALIBRATION` | `auto`, `fixed`, `load`, `measure` | `auto` |
//! | `ZCOMM_REPORT` | path of the JSON summary written by rank 0 at `MPI_Finalize` | none |
//! | `ZCOMM_LOG` | a `tracing` filter (`info`, `debug`, `zcomm=debug`) for stderr | none |
//!
//! `ZCOMM_TEST_CORRUPT` is a test hook, honoured only by a library built with the `test-hooks`
//! feature (see [`crate::hooks`]); elsewhere setting it is an invalid setting.
//!
//! `ZCOMM_PROFILE` (the calibration cache) and `ZCOMM_TIMEOUT` (the watchdog) are read by the
//! zcomm library itself.

use std::fmt;
use std::str::FromStr;

use zcomm::model::Policy;
use zcomm::{CodecKind, ErrorBound};

/// Where the calibration profile of each intercepted communicator comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CalibrationMode {
    /// `fixed` for `always`/`never` (the model is not consulted), `load` for `auto`.
    Auto,
    /// A built-in profile (10 GB/s link, no codec speeds): measures nothing.
    Fixed,
    /// Load the cached profile (`ZCOMM_PROFILE` or the per-host cache), else measure and save it.
    Load,
    /// Measure at the first intercepted call on every communicator.
    Measure,
}

/// Which communicators may compress.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Comms {
    /// Every intra-communicator (unless opted out with the `zcomm` info key).
    All,
    /// `MPI_COMM_WORLD` only (others unless opted in with the `zcomm` info key).
    World,
}

/// What the collectives do with CUDA device buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceMode {
    /// Compress on the GPU and stage the stream through pinned host memory (works with any MPI).
    Stage,
    /// Pass device buffers to PMPI unchanged (the MPI library must be CUDA-aware).
    Pass,
}

/// The library's settings.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Settings {
    /// End-to-end error bound.
    #[serde(serialize_with = "display")]
    pub bound: ErrorBound,
    /// Compression policy (the codec included).
    #[serde(serialize_with = "display")]
    pub policy: Policy,
    /// Smallest message (bytes per rank) that is considered for compression.
    pub min_bytes: usize,
    /// Point-to-point compression on.
    pub p2p: bool,
    /// `MPI_Iallreduce` compressed on a progress thread (MPI is asked for `MPI_THREAD_MULTIPLE`).
    pub nonblocking: bool,
    /// Communicators that may compress.
    pub comms: Comms,
    /// Device buffers of the collectives: staged through zcomm's GPU codec or passed through.
    pub device: DeviceMode,
    /// Measure the max error of every compressed call.
    pub verify: bool,
    /// Calibration source.
    pub calibration: CalibrationMode,
    /// JSON report path.
    pub report: Option<String>,
    /// `tracing` filter.
    pub log: Option<String>,
    /// Test hook: corrupt one outgoing compressed message (`ZCOMM_TEST_CORRUPT`, builds with the
    /// `test-hooks` feature only).
    pub test_corrupt: Option<crate::hooks::Corrupt>,
}

fn display<T: fmt::Display, S: serde::Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

/// A bad setting: the variable, its value and what was expected.
#[derive(Debug, Clone)]
pub struct SettingError(pub String);

impl fmt::Display for SettingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn bad(var: &str, value: &str, expected: impl fmt::Display) -> SettingError {
    SettingError(format!("{var}=`{value}`: {expected}"))
}

/// Parse a byte count: a non-negative integer with an optional `k`, `m`, `g` suffix (×1024^n).
pub fn parse_bytes(s: &str) -> Option<usize> {
    let t = s.trim().to_ascii_lowercase();
    let t = t.strip_suffix('b').unwrap_or(&t);
    let (num, mul) = match t.chars().last()? {
        'k' => (&t[..t.len() - 1], 1usize << 10),
        'm' => (&t[..t.len() - 1], 1 << 20),
        'g' => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    num.trim().parse::<usize>().ok()?.checked_mul(mul)
}

fn parse_switch(var: &str, v: &str) -> Result<bool, SettingError> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "on" | "yes" | "true" => Ok(true),
        "0" | "off" | "no" | "false" => Ok(false),
        _ => Err(bad(var, v, "expected on/off (1/0)")),
    }
}

impl Settings {
    /// Read the settings from a variable lookup (the environment in the library, a map in tests).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, SettingError> {
        let get = |k: &str| get(k).filter(|v| !v.trim().is_empty());
        let bound = match get("ZCOMM_ERROR_BOUND") {
            None => ErrorBound::Noa(1e-4),
            Some(v) => {
                let b = ErrorBound::from_str(v.trim()).map_err(|e| {
                    bad(
                        "ZCOMM_ERROR_BOUND",
                        &v,
                        format!("expected abs:E, noa:E or rel:E with E > 0 ({e})"),
                    )
                })?;
                b.validate()
                    .map_err(|e| bad("ZCOMM_ERROR_BOUND", &v, e.to_string()))?;
                b
            }
        };
        let codec = match get("ZCOMM_CODEC") {
            None => None,
            Some(v) => Some(CodecKind::from_str(v.trim()).map_err(|e| {
                bad(
                    "ZCOMM_CODEC",
                    &v,
                    format!("expected one of aatrox, cuszp-plain, cuszp-outlier, pfpl ({e})"),
                )
            })?),
        };
        let policy = match get("ZCOMM_POLICY") {
            None => Policy::Auto(codec.unwrap_or_default()),
            Some(v) => {
                let p = Policy::from_str(v.trim()).map_err(|_| {
                    bad(
                        "ZCOMM_POLICY",
                        &v,
                        "expected auto, always or never (optionally auto:CODEC, always:CODEC)",
                    )
                })?;
                match (p, codec) {
                    // ZCOMM_CODEC applies unless the policy names its own codec
                    (Policy::Auto(_), Some(c)) if !v.contains(':') => Policy::Auto(c),
                    (Policy::Always(_), Some(c)) if !v.contains(':') => Policy::Always(c),
                    (p, _) => p,
                }
            }
        };
        let min_bytes = match get("ZCOMM_MIN_BYTES") {
            None => 65536,
            Some(v) => parse_bytes(&v).ok_or_else(|| {
                bad(
                    "ZCOMM_MIN_BYTES",
                    &v,
                    "expected a byte count (e.g. 65536, 64k, 1m)",
                )
            })?,
        };
        let p2p = match get("ZCOMM_P2P") {
            None => true,
            Some(v) => parse_switch("ZCOMM_P2P", &v)?,
        };
        let nonblocking = match get("ZCOMM_NONBLOCKING") {
            None => true,
            Some(v) => parse_switch("ZCOMM_NONBLOCKING", &v)?,
        };
        let test_corrupt = match get("ZCOMM_TEST_CORRUPT") {
            None => None,
            Some(v) => Some(
                crate::hooks::Corrupt::parse(&v).map_err(|e| bad("ZCOMM_TEST_CORRUPT", &v, e))?,
            ),
        };
        let verify = match get("ZCOMM_VERIFY") {
            None => false,
            Some(v) => parse_switch("ZCOMM_VERIFY", &v)?,
        };
        let comms = match get("ZCOMM_COMMS").as_deref().map(str::trim) {
            None | Some("all") => Comms::All,
            Some("world") => Comms::World,
            Some(v) => return Err(bad("ZCOMM_COMMS", v, "expected all or world")),
        };
        let device = match get("ZCOMM_DEVICE").as_deref().map(str::trim) {
            None | Some("stage") => DeviceMode::Stage,
            Some("pass") => DeviceMode::Pass,
            Some(v) => return Err(bad("ZCOMM_DEVICE", v, "expected stage or pass")),
        };
        let calibration = match get("ZCOMM_CALIBRATION").as_deref().map(str::trim) {
            None | Some("auto") => CalibrationMode::Auto,
            Some("fixed") => CalibrationMode::Fixed,
            Some("load") => CalibrationMode::Load,
            Some("measure") => CalibrationMode::Measure,
            Some(v) => {
                return Err(bad(
                    "ZCOMM_CALIBRATION",
                    v,
                    "expected auto, fixed, load or measure",
                ))
            }
        };
        let report = get("ZCOMM_REPORT");
        let log = get("ZCOMM_LOG");
        if let Some(l) = &log {
            tracing_subscriber::EnvFilter::try_new(l)
                .map_err(|e| bad("ZCOMM_LOG", l, format!("not a tracing filter ({e})")))?;
        }
        Ok(Settings {
            bound,
            policy,
            min_bytes,
            p2p,
            nonblocking,
            comms,
            device,
            verify,
            calibration,
            report,
            log,
            test_corrupt,
        })
    }

    /// Read the settings from the process environment.
    pub fn from_env() -> Result<Self, SettingError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// The calibration mode actually used (resolves `auto`).
    pub fn effective_calibration(&self) -> CalibrationMode {
        match (self.calibration, self.policy) {
            (CalibrationMode::Auto, Policy::Auto(_)) => CalibrationMode::Load,
            (CalibrationMode::Auto, _) => CalibrationMode::Fixed,
            (c, _) => c,
        }
    }

    /// A hash of everything that must agree across ranks (so that every rank takes the same
    /// path in every collective).
    pub fn agreement_hash(&self) -> u64 {
        // FNV-1a over a canonical text
        let text = format!(
            "{}|{}|{}|{}|{}|{:?}|{:?}|{}|{:?}",
            self.bound,
            self.policy,
            self.min_bytes,
            self.p2p,
            self.nonblocking,
            self.comms,
            self.device,
            self.verify,
            self.effective_calibration()
        );
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in text.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn parse(pairs: &[(&str, &str)]) -> Result<Settings, SettingError> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Settings::from_lookup(|k| m.get(k).cloned())
    }

    #[test]
    fn defaults() {
        let s = parse(&[]).unwrap();
        assert_eq!(s.policy, Policy::Auto(CodecKind::Aatrox));
        assert_eq!(s.min_bytes, 65536);
        assert!(s.p2p);
        assert!(s.nonblocking);
        assert!(s.test_corrupt.is_none());
        assert_eq!(s.device, DeviceMode::Stage);
        assert_eq!(s.effective_calibration(), CalibrationMode::Load);
    }

    #[test]
    fn values() {
        let s = parse(&[
            ("ZCOMM_ERROR_BOUND", "abs:1e-3"),
            ("ZCOMM_POLICY", "always"),
            ("ZCOMM_CODEC", "pfpl"),
            ("ZCOMM_MIN_BYTES", "4k"),
            ("ZCOMM_P2P", "off"),
            ("ZCOMM_DEVICE", "pass"),
        ])
        .unwrap();
        assert_eq!(s.device, DeviceMode::Pass);
        assert_eq!(s.bound, ErrorBound::Abs(1e-3));
        assert_eq!(s.policy, Policy::Always(CodecKind::Pfpl));
        assert_eq!(s.min_bytes, 4096);
        assert!(!s.p2p);
        assert_eq!(s.effective_calibration(), CalibrationMode::Fixed);
    }

    #[test]
    fn errors_name_the_variable() {
        for (k, v) in [
            ("ZCOMM_ERROR_BOUND", "abs"),
            ("ZCOMM_ERROR_BOUND", "abs:-1"),
            ("ZCOMM_ERROR_BOUND", "max:1e-3"),
            ("ZCOMM_POLICY", "sometimes"),
            ("ZCOMM_CODEC", "zip"),
            ("ZCOMM_MIN_BYTES", "-5"),
            ("ZCOMM_P2P", "maybe"),
            ("ZCOMM_NONBLOCKING", "sometimes"),
            ("ZCOMM_TEST_CORRUPT", "x"),
            ("ZCOMM_COMMS", "some"),
            ("ZCOMM_CALIBRATION", "x"),
            ("ZCOMM_DEVICE", "gpu"),
        ] {
            let e = parse(&[(k, v)]).unwrap_err();
            assert!(e.0.starts_with(k), "{e}");
        }
    }

    #[test]
    fn bytes() {
        assert_eq!(parse_bytes("0"), Some(0));
        assert_eq!(parse_bytes("1m"), Some(1 << 20));
        assert_eq!(parse_bytes("2KB"), Some(2048));
        assert_eq!(parse_bytes("x"), None);
        assert_eq!(parse_bytes(""), None);
    }
}
