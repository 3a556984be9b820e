//! [`NcclConfig`]: the settings of an [`NcclComm`](super::NcclComm).

use super::*;

/// Settings of an [`NcclComm`] (all ranks must use the same policy and bound).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct NcclConfig {
    /// When to compress.
    pub policy: Policy,
    /// Error bound (for reductions: of the result).
    pub bound: ErrorBound,
    /// Uncompressed bytes per pipeline piece of a point-to-point message (rounded to whole codec
    /// chunks); the compressed reductions' ring cuts its segments into the pieces the model
    /// chooses ([`Profile::ring_pieces`](crate::model::Profile::ring_pieces)).
    pub piece_bytes: usize,
    /// Pieces per segment of the compressed reductions' ring, and per buffer of the compressed
    /// allgather, instead of the model's choice (`None`: the model's,
    /// [`Profile::ring_pieces`](crate::model::Profile::ring_pieces) and
    /// [`Profile::gather_pieces`](crate::model::Profile::gather_pieces)); all ranks must use the
    /// same. For measurements and tests.
    pub pieces: Option<usize>,
    /// Exchange and check a descriptor before every operation (mismatched counts, dtypes,
    /// bounds or operations become an error on every rank instead of a hang).
    pub check: bool,
    /// Calibrate link and codec speeds at start-up (else: [`Profile::direct_guess`]).
    pub calibrate: bool,
    /// Label of the link NCCL uses (`nvlink`, `socket`, ...); `None`: from the environment
    /// (`socket` when `NCCL_P2P_DISABLE=1` and `NCCL_SHM_DISABLE=1`, else `nvlink`).
    pub transport_label: Option<String>,
}

impl NcclConfig {
    /// Default policy (`Auto(aatrox)`), 64 MiB pieces, checks and calibration on.
    pub fn new(bound: ErrorBound) -> Self {
        NcclConfig {
            policy: Policy::default(),
            bound,
            piece_bytes: 64 << 20,
            pieces: None,
            check: true,
            calibrate: true,
            transport_label: None,
        }
    }
    /// With a policy.
    pub fn with_policy(mut self, p: Policy) -> Self {
        self.policy = p;
        self
    }
    /// With a piece size (bytes).
    pub fn with_piece_bytes(mut self, b: usize) -> Self {
        self.piece_bytes = b;
        self
    }
    /// With a fixed number of pieces per ring segment and allgather buffer (see [`NcclConfig::pieces`]).
    pub fn with_pieces(mut self, pieces: usize) -> Self {
        self.pieces = Some(pieces.max(1));
        self
    }
    /// With or without start-up calibration.
    pub fn with_calibration(mut self, on: bool) -> Self {
        self.calibrate = on;
        self
    }
    /// With or without per-operation descriptor checks.
    pub fn with_check(mut self, on: bool) -> Self {
        self.check = on;
        self
    }
}
