//! The codec seam of the communicator: a small object-safe trait so the GPU codec can replace the
//! CPU twin without touching the communication algorithms.

use crate::codec::CodecKind;
use crate::error::Result;
use crate::quant::ErrorBound;

/// Compresses host buffers into zcomm streams and back. Implementations must write streams any
/// other implementation can decode (the format is shared by the CPU twin and the GPU kernels).
pub trait Compressor: Send + Sync {
    /// Short name recorded in profiles (`cpu`, `gpu:...`).
    fn name(&self) -> String;
    /// Compress f32 values.
    fn compress_f32(&self, data: &[f32], bound: ErrorBound, codec: CodecKind) -> Result<Vec<u8>>;
    /// Compress f64 values.
    fn compress_f64(&self, data: &[f64], bound: ErrorBound, codec: CodecKind) -> Result<Vec<u8>>;
    /// Decompress an f32 stream into `out` (length must equal the stream's count).
    fn decompress_f32(&self, stream: &[u8], out: &mut [f32]) -> Result<()>;
    /// Decompress an f64 stream into `out` (length must equal the stream's count).
    fn decompress_f64(&self, stream: &[u8], out: &mut [f64]) -> Result<()>;
}

/// The CPU twin (`zcomm::compress` / `zcomm::decompress_into`, multi-threaded with rayon).
#[derive(Debug, Default, Clone, Copy)]
pub struct CpuCompressor;

impl Compressor for CpuCompressor {
    fn name(&self) -> String {
        "cpu".into()
    }
    fn compress_f32(&self, data: &[f32], bound: ErrorBound, codec: CodecKind) -> Result<Vec<u8>> {
        crate::compress(data, bound, codec)
    }
    fn compress_f64(&self, data: &[f64], bound: ErrorBound, codec: CodecKind) -> Result<Vec<u8>> {
        crate::compress(data, bound, codec)
    }
    fn decompress_f32(&self, stream: &[u8], out: &mut [f32]) -> Result<()> {
        crate::decompress_into(stream, out)
    }
    fn decompress_f64(&self, stream: &[u8], out: &mut [f64]) -> Result<()> {
        crate::decompress_into(stream, out)
    }
}
