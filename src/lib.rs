#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

pub mod codec;
pub mod element;
pub mod error;
pub mod format;
pub mod quant;
mod simd;

pub use codec::{
    compress, compress_nd, compress_with_options, compress_with_range, decompress,
    decompress_chunked, decompress_into, decompress_to_writer, inspect, CodecKind, CompressOptions,
    DecodeLimits,
};
pub use element::Element;
pub use error::{Error, Result};
pub use format::{compress_bound, Dims, Dtype};
pub use quant::ErrorBound;

#[cfg(feature = "cuda")]
pub mod gpu;

pub mod comm;

pub mod model;
