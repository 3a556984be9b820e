//! The crate's error type.

use std::fmt;

/// Everything that can go wrong in zcomm. Bad input never panics: it becomes one of these.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A caller-supplied argument is invalid (bad error bound, wrong length, unknown name...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A compressed stream is malformed, truncated or fails its checksum.
    #[error("corrupt stream: {0}")]
    Corrupt(String),
    /// A stream decodes to a different dtype or length than the caller asked for.
    #[error("mismatch: {what}: expected {expected}, found {found}")]
    Mismatch {
        /// What disagreed (dtype, count, codec, ...).
        what: &'static str,
        /// What the caller or local rank expected.
        expected: String,
        /// What the stream or remote rank carried.
        found: String,
    },
    /// A required runtime library (CUDA driver, NVRTC, NCCL, MPI) or device is missing.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// A CUDA driver, NVRTC or NCCL call failed.
    #[error("gpu: {0}")]
    Gpu(String),
    /// An MPI or NCCL communication step failed, or ranks disagreed.
    #[error("communication: {0}")]
    Comm(String),
    /// This rank's part of a collective could not finish because another rank failed (that rank
    /// reports the cause). Lets a caller that ends the job on an error give the failing rank
    /// time to print its own error first.
    #[error("communication: {0}")]
    PeerFailed(String),
    /// An allocation (host or device) could not be made.
    #[error("out of memory: {0}")]
    OutOfMemory(String),
    /// An I/O error (files, profiles).
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Shorthand for [`Error::InvalidArgument`].
    pub fn invalid(msg: impl fmt::Display) -> Self {
        Error::InvalidArgument(msg.to_string())
    }
    /// Shorthand for [`Error::Corrupt`].
    pub fn corrupt(msg: impl fmt::Display) -> Self {
        Error::Corrupt(msg.to_string())
    }
}
