//! [`Config`]: the settings of a [`Communicator`](super::Communicator), and how it calibrates.

use super::*;

/// Where the calibration profile comes from.
// (`Fixed` holds a whole profile inline: a configuration is made once per communicator, so the
// size does not matter, and a plain `Profile` keeps the variant easy to build)
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Calibration {
    /// Load the cached profile file if it exists, else measure and save it (default).
    LoadOrMeasure,
    /// Measure now and overwrite the cache.
    Measure,
    /// Use this profile; measure nothing.
    Fixed(Profile),
}

/// Communicator settings (all ranks must use the same policy and bound).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Config {
    /// When to compress.
    pub policy: Policy,
    /// Error bound of every compressed value (for reductions: of the result).
    pub bound: ErrorBound,
    /// Compute the actual max error of what this rank sends (costs one extra decompression).
    pub verify: bool,
    /// Profile source.
    pub calibration: Calibration,
    /// Profile cache path (default: [`Profile::default_path`]).
    pub profile_path: Option<PathBuf>,
    /// Codec chunks (32,768 values) compressed to estimate a message's ratio.
    pub sample_chunks: usize,
    /// Message size of the bandwidth ping-pong in calibration (bytes).
    pub pingpong_bytes: usize,
    /// Chunk size of pipelined point-to-point messages (uncompressed bytes; default 32 MiB).
    pub chunk_bytes: usize,
    /// Compressed point-to-point messages larger than this (uncompressed bytes; default 64 MiB)
    /// are chunk-pipelined (see the [module docs](super)).
    pub pipeline_min_bytes: usize,
    /// Whether a compressed device message above the threshold is chunk-pipelined: `None`
    /// (default) where the model predicts the pipeline faster than the whole message (from the
    /// second message on: the first teaches it the ratio); `Some(true)` / `Some(false)`: always
    /// / never. With `None`, the environment variable `ZCOMM_DEVICE_PIPELINE=always|never`
    /// decides instead (measurements).
    pub device_pipeline: Option<bool>,
}

impl Config {
    /// Default policy (`Auto(aatrox)`) with `bound`.
    pub fn new(bound: ErrorBound) -> Self {
        Config {
            policy: Policy::default(),
            bound,
            verify: false,
            calibration: Calibration::LoadOrMeasure,
            profile_path: None,
            sample_chunks: 4,
            pingpong_bytes: 16 << 20,
            chunk_bytes: 32 << 20,
            pipeline_min_bytes: 64 << 20,
            device_pipeline: None,
        }
    }
    /// With a pipeline chunk size and threshold (uncompressed bytes; a message is pipelined when
    /// it is compressed, larger than `min_bytes` and longer than one chunk).
    pub fn with_pipeline(mut self, chunk_bytes: usize, min_bytes: usize) -> Self {
        self.chunk_bytes = chunk_bytes.max(16);
        self.pipeline_min_bytes = min_bytes;
        self
    }
    /// With the device pipeline's decision taken from the model (`None`) or forced (see
    /// [`Config::device_pipeline`]).
    pub fn with_device_pipeline(mut self, pipeline: Option<bool>) -> Self {
        self.device_pipeline = pipeline;
        self
    }
    /// With a ping-pong message size for calibration.
    pub fn with_pingpong_bytes(mut self, b: usize) -> Self {
        self.pingpong_bytes = b.max(1 << 16);
        self
    }
    /// With a policy.
    pub fn with_policy(mut self, p: Policy) -> Self {
        self.policy = p;
        self
    }
    /// With max-error verification on the sending side.
    pub fn with_verify(mut self, v: bool) -> Self {
        self.verify = v;
        self
    }
    /// With a calibration source.
    pub fn with_calibration(mut self, c: Calibration) -> Self {
        self.calibration = c;
        self
    }
    /// With a profile cache path.
    pub fn with_profile_path(mut self, p: impl Into<PathBuf>) -> Self {
        self.profile_path = Some(p.into());
        self
    }
}
