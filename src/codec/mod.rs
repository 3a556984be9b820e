//! Codecs: the CPU implementation of every stream format (the "CPU twin" of the GPU kernels),
//! a registry by name, and the top-level [`compress`] / [`decompress`] functions.
//!
//! ```
//! use zcomm::{compress, decompress, CodecKind, ErrorBound};
//! let data: Vec<f32> = (0..100_000).map(|i| (i as f32 * 1e-3).sin()).collect();
//! let stream = compress(&data, ErrorBound::Abs(1e-4), CodecKind::Aatrox).unwrap();
//! let back: Vec<f32> = decompress(&stream).unwrap();
//! assert!(stream.len() * 4 < data.len() * 4);
//! assert!(data.iter().zip(&back).all(|(a, b)| (a - b).abs() <= 1e-4));
//! ```

pub mod blocked;
pub mod pfpl;

use crate::element::Element;
use crate::error::{Error, Result};
use crate::format::{zhash_bytes, BoundMode, Header, FLAG_STORED, HEADER_LEN};
use crate::quant::{ErrorBound, QuantParams};

/// The compressors zcomm implements.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum CodecKind {
    /// AATROX hierarchical delta (the default).
    #[default]
    Aatrox,
    /// cuSZp2 plain fixed-length encoding.
    CuszpPlain,
    /// cuSZp2 outlier fixed-length encoding.
    CuszpOutlier,
    /// PFPL: in-place quantization, negabinary deltas, bit shuffle, zero-byte elimination.
    Pfpl,
}

impl CodecKind {
    /// Every codec, in registry order.
    pub const ALL: &'static [CodecKind] = &[
        CodecKind::Aatrox,
        CodecKind::CuszpPlain,
        CodecKind::CuszpOutlier,
        CodecKind::Pfpl,
    ];

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            CodecKind::Aatrox => "aatrox",
            CodecKind::CuszpPlain => "cuszp-plain",
            CodecKind::CuszpOutlier => "cuszp-outlier",
            CodecKind::Pfpl => "pfpl",
        }
    }
    /// The header tag.
    pub fn tag(self) -> u8 {
        match self {
            CodecKind::Aatrox => 1,
            CodecKind::CuszpPlain => 2,
            CodecKind::CuszpOutlier => 3,
            CodecKind::Pfpl => 4,
        }
    }
    /// The header's `chunk_log2` for this codec and dtype (15 for aatrox/cuszp; see
    /// [`pfpl::chunk_log2`]).
    pub fn chunk_log2(self, dtype: crate::format::Dtype) -> u16 {
        match self {
            CodecKind::Pfpl => pfpl::chunk_log2(dtype),
            _ => blocked::CHUNK_LOG2 as u16,
        }
    }
    /// Look a codec up by header tag.
    pub fn from_tag(t: u8) -> Result<Self> {
        Self::ALL
            .iter()
            .copied()
            .find(|c| c.tag() == t)
            .ok_or_else(|| Error::corrupt(format!("unknown codec tag {t}")))
    }
}

impl std::fmt::Display for CodecKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for CodecKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Self::ALL
            .iter()
            .copied()
            .find(|c| c.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = Self::ALL.iter().map(|c| c.name()).collect();
                Error::invalid(format!(
                    "unknown codec `{s}` (expected one of {})",
                    names.join(", ")
                ))
            })
    }
}

/// Compress `data` with `codec` so that every finite value is reconstructed within `bound`
/// (non-finite values are kept exactly). Falls back to a stored stream when compression would not
/// make the data smaller. Uses all rayon threads.
pub fn compress<T: Element>(data: &[T], bound: ErrorBound, codec: CodecKind) -> Result<Vec<u8>> {
    let params = QuantParams::derive(data, bound)?;
    // (pfpl also returns its data checksum; the other codecs have none)
    let (body, data_checksum) = match codec {
        CodecKind::Aatrox | CodecKind::CuszpPlain | CodecKind::CuszpOutlier => {
            (blocked::encode(data, &params, codec), 0)
        }
        CodecKind::Pfpl => pfpl::encode(data, &params),
    };
    let raw_len = data.len() * T::SIZE;
    let header = |flags, payload_len: usize, n_chunks, payload_checksum, data_checksum| Header {
        codec: codec.tag(),
        dtype: T::DTYPE,
        mode: params.mode,
        flags,
        chunk_log2: codec.chunk_log2(T::DTYPE),
        count: data.len() as u64,
        bound_value: params.bound_value,
        abs_bound: params.abs_bound,
        step: params.step,
        range_min: params.range.0,
        range_max: params.range.1,
        payload_len: payload_len as u64,
        n_chunks,
        payload_checksum,
        data_checksum,
    };
    if body.payload.len() < raw_len {
        let h = header(
            0,
            body.payload.len(),
            body.n_chunks,
            body.table_checksum,
            data_checksum,
        );
        let mut out = Vec::with_capacity(HEADER_LEN + body.payload.len());
        out.extend_from_slice(&h.to_bytes());
        out.extend_from_slice(&body.payload);
        Ok(out)
    } else {
        Ok(stored_stream(data, header(FLAG_STORED, raw_len, 0, 0, 0)))
    }
}

/// A stream that keeps `data` verbatim (used when compression does not pay).
fn stored_stream<T: Element>(data: &[T], mut h: Header) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + data.len() * T::SIZE);
    out.extend_from_slice(&[0; HEADER_LEN]);
    for &x in data {
        x.write_le(&mut out);
    }
    h.payload_checksum = zhash_bytes(&out[HEADER_LEN..]);
    out[..HEADER_LEN].copy_from_slice(&h.to_bytes());
    out
}

/// Limits a decoder applies to untrusted streams.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct DecodeLimits {
    /// Largest value count accepted (default 2^36).
    pub max_count: u64,
}

impl Default for DecodeLimits {
    fn default() -> Self {
        DecodeLimits { max_count: 1 << 36 }
    }
}

impl DecodeLimits {
    /// Accept at most `n` values.
    pub fn with_max_count(mut self, n: u64) -> Self {
        self.max_count = n;
        self
    }
}

/// Parse and validate a stream's header (cheap; does not decode).
pub fn inspect(stream: &[u8]) -> Result<Header> {
    let h = Header::parse(stream)?;
    check_codec_fields(&h)?;
    Ok(h)
}

/// The codec-specific header checks of [`inspect`] (shared with the GPU decoder, which parses the
/// header with [`Header::parse_fields`] and verifies checksums on the device).
pub(crate) fn check_codec_fields(h: &Header) -> Result<()> {
    if !h.is_stored() {
        let codec = CodecKind::from_tag(h.codec)?;
        if h.chunk_log2 != codec.chunk_log2(h.dtype) {
            return Err(Error::corrupt(format!(
                "chunk_log2 {} unsupported",
                h.chunk_log2
            )));
        }
        if h.mode == BoundMode::Rel && h.step.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater)
        {
            return Err(Error::corrupt("rel stream with a non-positive step"));
        }
    }
    Ok(())
}

/// Decompress a stream into a new vector. The stream's dtype must be `T`.
pub fn decompress<T: Element>(stream: &[u8]) -> Result<Vec<T>> {
    decompress_with_limits(stream, DecodeLimits::default())
}

/// [`decompress`] with explicit limits for untrusted input.
pub fn decompress_with_limits<T: Element>(stream: &[u8], limits: DecodeLimits) -> Result<Vec<T>> {
    let h = inspect(stream)?;
    check_dtype::<T>(&h)?;
    if h.count > limits.max_count {
        return Err(Error::corrupt(format!(
            "stream claims {} values, limit is {}",
            h.count, limits.max_count
        )));
    }
    let n = usize::try_from(h.count)
        .map_err(|_| Error::corrupt(format!("{} values do not fit in memory", h.count)))?;
    let mut out = Vec::new();
    out.try_reserve_exact(n).map_err(|_| {
        Error::OutOfMemory(format!(
            "{n} values of {} ({} bytes)",
            T::DTYPE,
            n * T::SIZE
        ))
    })?;
    out.resize(n, T::default());
    decode_checked(stream, &h, &mut out)?;
    Ok(out)
}

/// Decompress into `out`, whose length must equal the stream's count.
pub fn decompress_into<T: Element>(stream: &[u8], out: &mut [T]) -> Result<()> {
    let h = inspect(stream)?;
    check_dtype::<T>(&h)?;
    if h.count != out.len() as u64 {
        return Err(Error::Mismatch {
            what: "value count",
            expected: out.len().to_string(),
            found: h.count.to_string(),
        });
    }
    decode_checked(stream, &h, out)
}

fn check_dtype<T: Element>(h: &Header) -> Result<()> {
    if h.dtype != T::DTYPE {
        return Err(Error::Mismatch {
            what: "dtype",
            expected: T::DTYPE.to_string(),
            found: h.dtype.to_string(),
        });
    }
    Ok(())
}

fn decode_checked<T: Element>(stream: &[u8], h: &Header, out: &mut [T]) -> Result<()> {
    if h.is_stored() {
        for (o, b) in out
            .iter_mut()
            .zip(stream[HEADER_LEN..].chunks_exact(T::SIZE))
        {
            *o = T::read_le(b);
        }
        return Ok(());
    }
    let params = QuantParams {
        mode: h.mode,
        bound_value: h.bound_value,
        abs_bound: h.abs_bound,
        step: h.step,
        range: (h.range_min, h.range_max),
    };
    match CodecKind::from_tag(h.codec)? {
        c @ (CodecKind::Aatrox | CodecKind::CuszpPlain | CodecKind::CuszpOutlier) => {
            blocked::decode(stream, h, &params, c, out)
        }
        CodecKind::Pfpl => pfpl::decode(stream, h, &params, out),
    }
}
