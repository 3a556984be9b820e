//! Per-operation counters and the JSON summary (`ZCOMM_REPORT`) written at `MPI_Finalize`.

use std::collections::BTreeMap;

use zcomm::comm::{Decision, OpStats};

/// Counters of one intercepted MPI function on one rank.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct OpReport {
    /// Calls of the function.
    pub calls: u64,
    /// Calls that went through zcomm and were compressed.
    pub compressed: u64,
    /// Calls that went through zcomm and were sent raw (the policy's decision).
    pub raw: u64,
    /// Calls passed to PMPI unchanged.
    pub passthrough: u64,
    /// Calls that went through zcomm with CUDA device buffers (compressed or raw, staged
    /// through the host by the GPU codec).
    #[serde(default)]
    pub device: u64,
    /// Why calls were passed through (reason → calls).
    pub passthrough_reasons: BTreeMap<String, u64>,
    /// Uncompressed bytes of the calls that went through zcomm (this rank's sends).
    pub bytes: u64,
    /// Bytes this rank put on the wire for those calls (payloads).
    pub wire_bytes: u64,
    /// `bytes / wire_bytes` (1 when nothing went through zcomm).
    pub ratio: f64,
    /// Sum of the model's predicted times of the chosen paths (s).
    pub predicted_s: f64,
    /// Sum of the measured times (s).
    pub measured_s: f64,
    /// Largest guaranteed absolute bound of a compressed call.
    pub bound: f64,
    /// Largest measured error (with `ZCOMM_VERIFY=1`), `null` when not measured.
    pub max_error: Option<f64>,
    /// Compressed calls whose measured error exceeded their bound (`ZCOMM_VERIFY=1`).
    pub bound_violations: u64,
}

impl OpReport {
    /// Count one call handled by zcomm.
    pub fn record(&mut self, st: &OpStats) {
        self.calls += 1;
        match st.decision {
            Decision::Compressed => self.compressed += 1,
            Decision::Raw => self.raw += 1,
        }
        self.bytes += st.bytes;
        self.wire_bytes += st.wire_bytes;
        self.predicted_s += st.predicted_s;
        self.measured_s += st.measured_s;
        if st.decision == Decision::Compressed {
            self.bound = self.bound.max(st.bound);
        }
        if let Some(e) = st.max_error {
            self.max_error = Some(self.max_error.map_or(e, |m: f64| m.max(e)));
            // a little slack for the rounding of the check itself
            if st.decision == Decision::Compressed && e > st.bound * (1.0 + 1e-9) {
                self.bound_violations += 1;
            }
        }
        self.update_ratio();
    }

    /// Count one call passed through to PMPI.
    pub fn pass(&mut self, reason: &str) {
        self.calls += 1;
        self.passthrough += 1;
        *self
            .passthrough_reasons
            .entry(reason.to_string())
            .or_default() += 1;
    }

    fn update_ratio(&mut self) {
        self.ratio = if self.wire_bytes > 0 {
            self.bytes as f64 / self.wire_bytes as f64
        } else {
            1.0
        };
    }

    /// Add another rank's counters.
    pub fn merge(&mut self, o: &OpReport) {
        self.calls += o.calls;
        self.compressed += o.compressed;
        self.raw += o.raw;
        self.passthrough += o.passthrough;
        self.device += o.device;
        for (k, v) in &o.passthrough_reasons {
            *self.passthrough_reasons.entry(k.clone()).or_default() += v;
        }
        self.bytes += o.bytes;
        self.wire_bytes += o.wire_bytes;
        self.predicted_s += o.predicted_s;
        self.measured_s += o.measured_s;
        self.bound = self.bound.max(o.bound);
        self.max_error = match (self.max_error, o.max_error) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        self.bound_violations += o.bound_violations;
        self.update_ratio();
    }
}

/// One rank's report.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct RankReport {
    /// Rank in `MPI_COMM_WORLD`.
    pub rank: usize,
    /// MPI function name → counters.
    pub ops: BTreeMap<String, OpReport>,
    /// Notes (e.g. how device buffers were handled).
    pub notes: Vec<String>,
}

impl RankReport {
    /// The counters of `op`.
    pub fn op(&mut self, op: &str) -> &mut OpReport {
        self.ops.entry(op.to_string()).or_default()
    }
    /// Add a note once.
    pub fn note(&mut self, n: &str) {
        if !self.notes.iter().any(|x| x == n) {
            self.notes.push(n.to_string());
        }
    }
}

/// The whole job's report (written by rank 0).
#[derive(Debug, Clone, serde::Serialize)]
pub struct JobReport<'a> {
    /// Library name and version.
    pub library: &'static str,
    /// Ranks in `MPI_COMM_WORLD`.
    pub ranks: usize,
    /// The settings in effect.
    pub settings: &'a crate::settings::Settings,
    /// Sum over ranks per MPI function (`ratio` = total bytes / total wire bytes).
    pub total: BTreeMap<String, OpReport>,
    /// Every rank's counters.
    pub per_rank: Vec<RankReport>,
}

impl<'a> JobReport<'a> {
    /// Combine the ranks' reports.
    pub fn new(settings: &'a crate::settings::Settings, per_rank: Vec<RankReport>) -> Self {
        let mut total: BTreeMap<String, OpReport> = BTreeMap::new();
        for r in &per_rank {
            for (k, v) in &r.ops {
                total.entry(k.clone()).or_default().merge(v);
            }
        }
        JobReport {
            library: concat!("zcomm-mpi ", env!("CARGO_PKG_VERSION")),
            ranks: per_rank.len(),
            settings,
            total,
            per_rank,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_and_ratio() {
        let mut a = OpReport::default();
        a.pass("small");
        let mut b = OpReport {
            bytes: 100,
            wire_bytes: 10,
            calls: 1,
            compressed: 1,
            ..Default::default()
        };
        b.update_ratio();
        assert_eq!(b.ratio, 10.0);
        a.merge(&b);
        assert_eq!(a.calls, 2);
        assert_eq!(a.ratio, 10.0);
        assert_eq!(a.passthrough_reasons["small"], 1);
    }
}
