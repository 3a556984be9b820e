//! [`OpStats`]: what every operation reports (decision, codec, ratio, predicted and measured
//! time, guaranteed bound).

use super::*;

/// What an operation did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Decision {
    /// Sent uncompressed.
    Raw,
    /// Sent compressed.
    Compressed,
}

/// Per-operation report (also logged with `tracing::debug!`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct OpStats {
    /// Operation name.
    pub op: &'static str,
    /// Raw or compressed.
    pub decision: Decision,
    /// Codec used (when compressed).
    pub codec: Option<CodecKind>,
    /// Ratio the decision was based on (1 when not estimated).
    pub ratio_estimate: f64,
    /// Ratio achieved on what this rank sent (uncompressed bytes / bytes sent).
    pub ratio: f64,
    /// Uncompressed bytes this rank's sends represent.
    pub bytes: u64,
    /// Bytes this rank put on the wire (payloads only).
    pub wire_bytes: u64,
    /// Model: time of the raw path (s).
    pub predicted_raw_s: f64,
    /// Model: time of the compressed path (s).
    pub predicted_compressed_s: f64,
    /// Model: time of the chosen path (s).
    pub predicted_s: f64,
    /// Measured wall time of the whole call on this rank (s).
    pub measured_s: f64,
    /// Guaranteed absolute error per value (abs/noa), `E` for rel, 0 when raw.
    pub bound: f64,
    /// Measured max error of this rank's sent values, when verification is on.
    pub max_error: Option<f64>,
    /// Pipeline pieces per ring segment (reductions) or per buffer (allgather) of the device
    /// algorithms (1: whole segments and buffers, or neither).
    pub pieces: u32,
}

impl OpStats {
    pub(super) fn raw(op: u8) -> Self {
        OpStats {
            op: op_name(op),
            decision: Decision::Raw,
            codec: None,
            ratio_estimate: 1.0,
            ratio: 1.0,
            bytes: 0,
            wire_bytes: 0,
            predicted_raw_s: 0.0,
            predicted_compressed_s: 0.0,
            predicted_s: 0.0,
            measured_s: 0.0,
            bound: 0.0,
            max_error: None,
            pieces: 1,
        }
    }
    /// The stats of an operation of `bytes` decided by the model: the ratio estimate, both
    /// predictions and the one of the path taken (`compress`).
    pub(super) fn decided(
        op: u8,
        bytes: f64,
        ratio: f64,
        (raw_t, cmp_t): (f64, f64),
        compress: bool,
    ) -> Self {
        OpStats {
            bytes: bytes as u64,
            ratio_estimate: ratio,
            predicted_raw_s: raw_t,
            predicted_compressed_s: cmp_t,
            predicted_s: if compress { cmp_t } else { raw_t },
            ..Self::raw(op)
        }
    }
    /// The stats of an operation moving `bytes` uncompressed (`wire_bytes == bytes`).
    #[cfg(feature = "nccl")]
    pub(super) fn raw_bytes(op: u8, bytes: usize) -> Self {
        OpStats {
            bytes: bytes as u64,
            wire_bytes: bytes as u64,
            ..Self::raw(op)
        }
    }
    /// `(measured - predicted) / predicted`.
    pub fn prediction_error(&self) -> f64 {
        (self.measured_s - self.predicted_s) / self.predicted_s
    }
}

impl fmt::Display for OpStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {:?}{} ratio {:.2} (est {:.2}) {} B -> {} B, time {:.3} ms (predicted {:.3} ms; raw {:.3} ms, compressed {:.3} ms), bound {:.3e}",
            self.op,
            self.decision,
            self.codec.map(|c| format!("[{c}]")).unwrap_or_default(),
            self.ratio,
            self.ratio_estimate,
            self.bytes,
            self.wire_bytes,
            self.measured_s * 1e3,
            self.predicted_s * 1e3,
            self.predicted_raw_s * 1e3,
            self.predicted_compressed_s * 1e3,
            self.bound
        )?;
        if self.pieces > 1 {
            write!(f, ", in {} pieces", self.pieces)?;
        }
        if let Some(e) = self.max_error {
            write!(f, ", max error {e:.3e}")?;
        }
        Ok(())
    }
}
