//! The versioned little-endian stream layout (see `FORMAT.md`): header, chunk table, `zhash`.
//!
//! This module is the only place that knows byte offsets; codecs and kernels build on it.
//!
//! Two header versions are read: version 2 (96 bytes), written by the codecs that ignore the
//! array's shape, and version 3 (136 bytes: version 2's fields plus the shape), written by the
//! shape-aware `cuszi` and `gpz` codecs (a `gpz` stream wraps a complete GPZ particle stream,
//! GPZ-FORMAT.md, as its payload).

use rayon::prelude::*;

use crate::error::{Error, Result};

pub mod dims;
pub use dims::{Dims, MAX_DIMS};

/// Stream magic.
pub const MAGIC: [u8; 4] = *b"ZCMP";
/// Format version of the streams of codecs that ignore the shape (96-byte header).
pub const VERSION: u16 = 2;
/// Format version of the streams of shape-aware codecs (`cuszi`, `gpz`): the version 2 fields, then the
/// shape and the codec metadata length ([`HEADER_LEN_V3`] bytes). Versions other than 2 and 3
/// are rejected.
pub const VERSION_SHAPED: u16 = 3;
/// Header size in bytes of a version 2 stream (the fixed part every version starts with).
pub const HEADER_LEN: usize = 96;
/// Header size in bytes of a version 3 stream.
pub const HEADER_LEN_V3: usize = 136;
/// Bytes per chunk-table entry of the aatrox / cuszp codecs (`size: u32`, `checksum: u32`).
pub const TABLE_ENTRY_LEN: usize = 8;
/// Bytes per chunk-table entry of `pfpl` streams (`size: u16`; chunk payloads are checked through
/// the header's data checksum instead of a per-chunk one).
pub const PFPL_TABLE_ENTRY_LEN: usize = 2;
/// Codec tag of `pfpl`, the codec whose chunk table is [`PFPL_TABLE_ENTRY_LEN`] bytes per chunk.
pub const CODEC_PFPL: u8 = 4;
/// Codec tag of `cuszi`, the shape-aware codec: its streams are version 3, and only its
/// compressed streams carry codec metadata (entropy tables, predictor configuration).
pub const CODEC_CUSZI: u8 = 5;
/// Codec tag of `gpz`, the particle codec: its streams are version 3 (the shape is `[N, d]`, or
/// `[N]` for one coordinate), and a compressed stream's payload is a complete GPZ stream
/// (GPZ-FORMAT.md) whose header is the codec metadata (`meta_len = 56 + 48 d`, covered by the
/// payload checksum) and which carries its own block table (`n_chunks = 0`).
pub const CODEC_GPZ: u8 = 6;
/// `chunk_log2` of `gpz` streams: log2 of the particles per GPZ block (32).
pub const GPZ_CHUNK_LOG2: u16 = 5;
/// Flag bit: the values follow the header verbatim.
pub const FLAG_STORED: u8 = 1;
/// Flag bit: the stream has a fill value (header offset 84): values bitwise equal to it were kept
/// exactly and left out of the `noa` value range.
pub const FLAG_FILL: u8 = 2;
/// Every flag bit a stream may set.
pub const KNOWN_FLAGS: u8 = FLAG_STORED | FLAG_FILL;
/// The codec tags a stream may carry (1 aatrox, 2 cuszp-plain, 3 cuszp-outlier, 4 pfpl,
/// 5 cuszi, 6 gpz).
pub const CODEC_TAGS: std::ops::RangeInclusive<u8> = 1..=6;

/// Element type of a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    /// IEEE binary32.
    F32,
    /// IEEE binary64.
    F64,
}

impl Dtype {
    /// Bytes per value.
    pub fn size(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::F64 => 8,
        }
    }
    /// The tag stored in the header.
    pub fn tag(self) -> u8 {
        match self {
            Dtype::F32 => 1,
            Dtype::F64 => 2,
        }
    }
    /// Parse a header tag.
    pub fn from_tag(t: u8) -> Result<Self> {
        match t {
            1 => Ok(Dtype::F32),
            2 => Ok(Dtype::F64),
            _ => Err(Error::corrupt(format!("unknown dtype tag {t}"))),
        }
    }
}

impl std::fmt::Display for Dtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Dtype::F32 => "f32",
            Dtype::F64 => "f64",
        })
    }
}

impl std::str::FromStr for Dtype {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "f32" => Ok(Dtype::F32),
            "f64" => Ok(Dtype::F64),
            _ => Err(Error::invalid(format!(
                "unknown dtype `{s}` (expected f32 or f64)"
            ))),
        }
    }
}

/// Error-bound mode tag of a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BoundMode {
    /// Absolute.
    Abs,
    /// Relative to the value range (what cuSZp/AATROX call REL).
    Noa,
    /// Point-wise relative.
    Rel,
}

impl BoundMode {
    /// Header tag.
    pub fn tag(self) -> u8 {
        match self {
            BoundMode::Abs => 1,
            BoundMode::Noa => 2,
            BoundMode::Rel => 3,
        }
    }
    /// Parse a header tag.
    pub fn from_tag(t: u8) -> Result<Self> {
        match t {
            1 => Ok(BoundMode::Abs),
            2 => Ok(BoundMode::Noa),
            3 => Ok(BoundMode::Rel),
            _ => Err(Error::corrupt(format!("unknown bound mode tag {t}"))),
        }
    }
}

/// The parsed stream header (96 bytes in version 2, 136 in version 3).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Header {
    /// Codec tag (1 aatrox, 2 cuszp-plain, 3 cuszp-outlier, 4 pfpl, 5 cuszi, 6 gpz).
    pub codec: u8,
    /// Element type.
    pub dtype: Dtype,
    /// Error-bound mode.
    pub mode: BoundMode,
    /// Flags ([`FLAG_STORED`]).
    pub flags: u8,
    /// log2 of values per chunk.
    pub chunk_log2: u16,
    /// Number of values.
    pub count: u64,
    /// The user's bound value.
    pub bound_value: f64,
    /// Guaranteed absolute bound (abs/noa) or the relative bound (rel).
    pub abs_bound: f64,
    /// Quantization step.
    pub step: f64,
    /// Smallest finite value (noa) or 0.
    pub range_min: f64,
    /// Largest finite value (noa) or 0.
    pub range_max: f64,
    /// Bytes after the header.
    pub payload_len: u64,
    /// Number of chunks (0 when stored).
    pub n_chunks: u32,
    /// `zhash` of the chunk table (or of the raw values when stored).
    pub payload_checksum: u32,
    /// Compressed `pfpl` streams: the [`data_checksum()`] of the chunk payloads (header offset 80);
    /// 0 for every other stream.
    pub data_checksum: u32,
    /// The fill value (header offset 84, flag [`FLAG_FILL`]): a finite value of the stream's
    /// dtype (widened to f64) whose occurrences were kept exactly and left out of the range.
    /// [`Header::to_bytes`] sets or clears [`FLAG_FILL`] from this field.
    pub fill_value: Option<f64>,
    /// The array's shape (version 3 streams, header offsets 92..128); `None` in version 2
    /// streams, whose codecs treat every array as 1-D. Its product equals `count`.
    pub dims: Option<Dims>,
    /// Version 3: bytes of codec metadata between the chunk table and the first chunk (header
    /// offset 128; covered by the payload checksum); 0 in version 2 and in stored streams.
    pub meta_len: u32,
}

impl Header {
    /// Whether the values are stored verbatim.
    pub fn is_stored(&self) -> bool {
        self.flags & FLAG_STORED != 0
    }

    /// The stream's format version: [`VERSION_SHAPED`] when it carries a shape, else
    /// [`VERSION`].
    pub fn version(&self) -> u16 {
        if self.dims.is_some() {
            VERSION_SHAPED
        } else {
            VERSION
        }
    }

    /// Bytes of the header: [`HEADER_LEN`] (version 2) or [`HEADER_LEN_V3`] (version 3).
    pub fn header_len(&self) -> usize {
        if self.dims.is_some() {
            HEADER_LEN_V3
        } else {
            HEADER_LEN
        }
    }

    /// Bytes between the header and the first chunk, all covered by the payload checksum (0 for
    /// stored streams): `n_chunks` entries of [`table_entry_len`] bytes, then `meta_len` bytes
    /// of codec metadata (version 3).
    pub fn table_len(&self) -> usize {
        if self.is_stored() {
            0
        } else {
            self.n_chunks as usize * table_entry_len(self.codec) + self.meta_len as usize
        }
    }

    /// The shape: the header's (version 3), or the 1-D `[count]` (version 2).
    pub fn shape(&self) -> Dims {
        self.dims.unwrap_or(Dims::linear(self.count))
    }

    /// Serialize to exactly [`Header::header_len`] bytes (version 3 when `dims` is set; the
    /// header checksum is computed here).
    pub fn to_vec(&self) -> Vec<u8> {
        let v2 = self.to_bytes();
        let Some(d) = self.dims else {
            return v2.to_vec();
        };
        let mut b = vec![0u8; HEADER_LEN_V3];
        b[..92].copy_from_slice(&v2[..92]);
        b[4..6].copy_from_slice(&VERSION_SHAPED.to_le_bytes());
        b[92] = d.ndims() as u8;
        for (i, x) in d.padded().iter().enumerate() {
            b[96 + 8 * i..104 + 8 * i].copy_from_slice(&x.to_le_bytes());
        }
        b[128..132].copy_from_slice(&self.meta_len.to_le_bytes());
        let h = zhash_bytes(&b[..132]);
        b[132..136].copy_from_slice(&h.to_le_bytes());
        b
    }

    /// Serialize the version 2 header: exactly [`HEADER_LEN`] bytes (the header checksum is
    /// computed here). `dims` and `meta_len` are not part of it: a header that carries them is
    /// written with [`Header::to_vec`].
    pub fn to_bytes(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4..6].copy_from_slice(&VERSION.to_le_bytes());
        b[6] = self.codec;
        b[7] = self.dtype.tag();
        b[8] = self.mode.tag();
        b[9] = if self.fill_value.is_some() {
            self.flags | FLAG_FILL
        } else {
            self.flags & !FLAG_FILL
        };
        b[10..12].copy_from_slice(&self.chunk_log2.to_le_bytes());
        b[16..24].copy_from_slice(&self.count.to_le_bytes());
        b[24..32].copy_from_slice(&self.bound_value.to_le_bytes());
        b[32..40].copy_from_slice(&self.abs_bound.to_le_bytes());
        b[40..48].copy_from_slice(&self.step.to_le_bytes());
        b[48..56].copy_from_slice(&self.range_min.to_le_bytes());
        b[56..64].copy_from_slice(&self.range_max.to_le_bytes());
        b[64..72].copy_from_slice(&self.payload_len.to_le_bytes());
        b[72..76].copy_from_slice(&self.n_chunks.to_le_bytes());
        b[76..80].copy_from_slice(&self.payload_checksum.to_le_bytes());
        b[80..84].copy_from_slice(&self.data_checksum.to_le_bytes());
        if let Some(f) = self.fill_value {
            b[84..92].copy_from_slice(&f.to_le_bytes());
        }
        let h = zhash_bytes(&b[..92]);
        b[92..96].copy_from_slice(&h.to_le_bytes());
        b
    }

    /// Parse and validate a header from the start of `stream`; checks that the stream length
    /// matches `payload_len` exactly, and the chunk-table (or stored-payload) checksum. (The
    /// `pfpl` data checksum is verified by [`Header::chunk_table`].)
    pub fn parse(stream: &[u8]) -> Result<Self> {
        if stream.len() < HEADER_LEN {
            return Err(Error::corrupt(format!(
                "stream of {} bytes is shorter than the {HEADER_LEN}-byte header",
                stream.len()
            )));
        }
        let h = if u16_at(stream, 4) == VERSION_SHAPED {
            let b: &[u8; HEADER_LEN_V3] = stream
                .get(..HEADER_LEN_V3)
                .and_then(|b| b.try_into().ok())
                .ok_or_else(|| {
                    Error::corrupt(format!(
                        "stream of {} bytes is shorter than the {HEADER_LEN_V3}-byte version 3 \
                         header",
                        stream.len()
                    ))
                })?;
            Self::parse_fields_v3(b, stream.len())?
        } else {
            let b: &[u8; HEADER_LEN] = stream[..HEADER_LEN].try_into().expect("header length");
            Self::parse_fields(b, stream.len())?
        };
        let hl = h.header_len();
        if h.is_stored() {
            if zhash_bytes(&stream[hl..]) != h.payload_checksum {
                return Err(Error::corrupt("stored payload checksum mismatch"));
            }
        } else {
            let table = h.table_len();
            if zhash_bytes(&stream[hl..hl + table]) != h.payload_checksum {
                return Err(Error::corrupt("chunk table checksum mismatch"));
            }
        }
        Ok(h)
    }

    /// Every header check that needs no payload bytes, for stored and compressed streams alike
    /// (FORMAT.md, "Header"): magic, version, header checksum, codec/dtype/mode tags, flags,
    /// reserved bytes, `chunk_log2` (the codec's own value), the bound fields, the range, the
    /// fill value, `payload_len == stream_len - 96`, count/chunk consistency, and the chunk
    /// table fitting the payload. (A GPU decoder verifies the payload checksums on the device.)
    ///
    /// Version 2 only: a version 3 header is longer ([`Header::parse_fields_v3`]), and is
    /// rejected here with an error that says so.
    pub fn parse_fields(b: &[u8; HEADER_LEN], stream_len: usize) -> Result<Self> {
        Self::parse_common(b, stream_len, None)
    }

    /// [`Header::parse_fields`] for a version 3 header ([`HEADER_LEN_V3`] bytes): the version 2
    /// checks, then the shape (1 to 4 extents, none zero except the 1-D shape of an empty
    /// stream, unused extents and reserved bytes zero, product equal to `count`), the metadata
    /// length (a multiple of 4; 0 in stored streams), and that the codec writes version 3.
    pub fn parse_fields_v3(b: &[u8; HEADER_LEN_V3], stream_len: usize) -> Result<Self> {
        Self::parse_common(&b[..HEADER_LEN], stream_len, Some(b))
    }

    fn parse_common(b: &[u8], stream_len: usize, v3: Option<&[u8; HEADER_LEN_V3]>) -> Result<Self> {
        if b[0..4] != MAGIC {
            return Err(Error::corrupt("bad magic (not a zcomm stream)"));
        }
        let version = u16_at(b, 4);
        let want = if v3.is_some() {
            VERSION_SHAPED
        } else {
            VERSION
        };
        if version != want {
            return Err(Error::corrupt(if version == VERSION_SHAPED {
                format!(
                    "format version 3 (a shaped stream, codec tag {}) has a \
                     {HEADER_LEN_V3}-byte header, not {HEADER_LEN}",
                    b[6]
                )
            } else {
                format!("unsupported format version {version}")
            }));
        }
        let (dims, meta_len) = match v3 {
            None => {
                if zhash_bytes(&b[..92]) != u32_at(b, 92) {
                    return Err(Error::corrupt("header checksum mismatch"));
                }
                (None, 0)
            }
            Some(b3) => {
                if zhash_bytes(&b3[..132]) != u32_at(b3, 132) {
                    return Err(Error::corrupt("header checksum mismatch"));
                }
                (Some(parse_dims(b3)?), u32_at(b3, 128))
            }
        };
        let flags = b[9];
        let fill_value = (flags & FLAG_FILL != 0).then(|| f64_at(b, 84));
        let h = Header {
            codec: b[6],
            dtype: Dtype::from_tag(b[7])?,
            mode: BoundMode::from_tag(b[8])?,
            flags: b[9],
            chunk_log2: u16_at(b, 10),
            count: u64_at(b, 16),
            bound_value: f64_at(b, 24),
            abs_bound: f64_at(b, 32),
            step: f64_at(b, 40),
            range_min: f64_at(b, 48),
            range_max: f64_at(b, 56),
            payload_len: u64_at(b, 64),
            n_chunks: u32_at(b, 72),
            payload_checksum: u32_at(b, 76),
            data_checksum: u32_at(b, 80),
            fill_value,
            dims,
            meta_len,
        };
        if !CODEC_TAGS.contains(&h.codec) {
            return Err(Error::corrupt(format!("unknown codec tag {}", h.codec)));
        }
        if matches!(h.codec, CODEC_CUSZI | CODEC_GPZ) != dims.is_some() {
            return Err(Error::corrupt(format!(
                "codec tag {} is not written in format version {version}",
                h.codec
            )));
        }
        if let Some(d) = dims {
            if d.count() != h.count {
                return Err(Error::corrupt(format!(
                    "shape {d} holds {} values, header says {}",
                    d.count(),
                    h.count
                )));
            }
            if meta_len % 4 != 0 || (h.is_stored() && meta_len != 0) {
                return Err(Error::corrupt(format!(
                    "invalid codec metadata length {meta_len}"
                )));
            }
            if h.codec == CODEC_GPZ {
                // the shape names the particles' coordinate count, and a compressed stream's
                // metadata is exactly the GPZ header of that many axes
                let d = gpz_coords(&d).map_err(|e| Error::corrupt(e.to_string()))?;
                if !h.is_stored() && meta_len as usize != gpz_header_len(d) {
                    return Err(Error::corrupt(format!(
                        "gpz metadata length {meta_len} is not the header length of {d} axes"
                    )));
                }
            }
        }
        if h.flags & !KNOWN_FLAGS != 0 {
            return Err(Error::corrupt(format!("unknown flag bits {:#x}", h.flags)));
        }
        if u32_at(b, 12) != 0 || (h.fill_value.is_none() && b[84..92].iter().any(|&x| x != 0)) {
            return Err(Error::corrupt("reserved header bytes are not zero"));
        }
        let want_log2 = codec_chunk_log2(h.codec, h.dtype);
        if h.chunk_log2 != want_log2 {
            return Err(Error::corrupt(format!(
                "chunk_log2 {} unsupported (codec tag {} with {} values uses {want_log2})",
                h.chunk_log2, h.codec, h.dtype
            )));
        }
        h.check_bound_fields()?;
        if h.data_checksum != 0 && (h.codec != CODEC_PFPL || h.is_stored()) {
            return Err(Error::corrupt(
                "data checksum set in a stream that has none (reserved bytes not zero)",
            ));
        }
        let actual = stream_len.saturating_sub(h.header_len()) as u64;
        if h.payload_len != actual {
            return Err(Error::corrupt(format!(
                "header says {} payload bytes, stream has {actual}",
                h.payload_len
            )));
        }
        if h.is_stored() {
            let need = h.count.checked_mul(h.dtype.size() as u64);
            if need != Some(h.payload_len) || h.n_chunks != 0 {
                return Err(Error::corrupt(
                    "stored stream length does not match its count",
                ));
            }
        } else {
            if !(1..=30).contains(&h.chunk_log2) {
                return Err(Error::corrupt(format!("bad chunk_log2 {}", h.chunk_log2)));
            }
            // (a gpz payload carries its own block table: no chunk table here)
            let expect = if h.codec == CODEC_GPZ {
                0
            } else {
                h.count.div_ceil(1u64 << h.chunk_log2)
            };
            if expect != h.n_chunks as u64 {
                return Err(Error::corrupt(format!(
                    "{} values need {expect} chunks, header says {}",
                    h.count, h.n_chunks
                )));
            }
            let table = h.n_chunks as u64 * table_entry_len(h.codec) as u64 + meta_len as u64;
            if table > h.payload_len {
                return Err(Error::corrupt(
                    "chunk table runs past the end of the stream",
                ));
            }
        }
        Ok(h)
    }

    /// The checks of the bound, step, range and fill value fields (FORMAT.md, "Header"): what an
    /// encoder can write, for every stream kind.
    fn check_bound_fields(&self) -> Result<()> {
        let bad = |what: &str, v: f64| Err(Error::corrupt(format!("header carries {what} {v:e}")));
        let e = self.bound_value;
        if !(e.is_finite() && e > 0.0) || (self.mode == BoundMode::Rel && e >= 1.0) {
            return bad("an invalid bound value", e);
        }
        let eb = self.abs_bound;
        match self.mode {
            // abs and rel: the absolute-bound field repeats E
            BoundMode::Abs | BoundMode::Rel if eb.to_bits() != e.to_bits() => {
                return bad("an absolute bound different from the bound value", eb);
            }
            BoundMode::Noa if !(eb.is_finite() && eb >= 0.0) => {
                return bad("an invalid absolute bound", eb);
            }
            _ => {}
        }
        // abs/noa steps are positive; a rel step underflows to 0 for a tiny E (nothing is then
        // representable, so such a stream is always stored)
        let s = self.step;
        let step_ok = s.is_finite()
            && if self.mode == BoundMode::Rel && self.is_stored() {
                s >= 0.0
            } else {
                s > 0.0
            };
        if !step_ok {
            return bad("an invalid step", s);
        }
        let (lo, hi) = (self.range_min, self.range_max);
        let range_ok = if self.mode == BoundMode::Noa {
            lo.is_finite() && hi.is_finite() && lo <= hi
        } else {
            lo.to_bits() == 0 && hi.to_bits() == 0
        };
        if !range_ok {
            return Err(Error::corrupt(format!(
                "header carries an invalid value range ({lo:e}, {hi:e})"
            )));
        }
        if let Some(f) = self.fill_value {
            let representable = match self.dtype {
                Dtype::F32 => (f as f32) as f64 == f,
                Dtype::F64 => true,
            };
            if !(f.is_finite() && representable) {
                return bad("a fill value that is not a finite value of its dtype", f);
            }
        }
        Ok(())
    }

    /// The chunk table of a compressed (non-stored) stream whose header was parsed by
    /// [`Header::parse`]: each chunk's offset from the start of the stream, size and checksum,
    /// with the sizes checked to sum to the payload.
    ///
    /// * aatrox / cuszp: `(size, checksum)` entries, sizes checked to be multiples of 4; the
    ///   caller verifies each chunk against its checksum.
    /// * `pfpl`: u16 sizes and byte-aligned payloads; each entry's `checksum` is the `zhash` of
    ///   the chunk's bytes, computed here (in parallel), and their [`data_checksum()`] is checked
    ///   against the header before this returns.
    pub fn chunk_table(&self, stream: &[u8]) -> Result<Vec<ChunkEntry>> {
        if self.codec == CODEC_PFPL {
            return self.pfpl_chunk_table(stream);
        }
        let n = self.n_chunks as usize;
        let hl = self.header_len();
        let t = &stream[hl..hl + n * TABLE_ENTRY_LEN];
        let mut off = (hl + self.table_len()) as u64;
        let mut out = try_entries(n)?;
        for i in 0..n {
            let size = u32_at(t, i * 8);
            let checksum = u32_at(t, i * 8 + 4);
            if size % 4 != 0 {
                return Err(Error::corrupt(format!(
                    "chunk {i} size {size} not a multiple of 4"
                )));
            }
            out.push(ChunkEntry {
                offset: off as usize,
                size: size as usize,
                checksum,
            });
            off += size as u64;
        }
        if off != stream.len() as u64 {
            return Err(Error::corrupt(
                "chunk sizes do not add up to the payload length",
            ));
        }
        Ok(out)
    }

    /// [`Header::chunk_table`] of a `pfpl` stream.
    fn pfpl_chunk_table(&self, stream: &[u8]) -> Result<Vec<ChunkEntry>> {
        let n = self.n_chunks as usize;
        let table = &stream[HEADER_LEN..HEADER_LEN + n * PFPL_TABLE_ENTRY_LEN];
        let mut off = HEADER_LEN + table.len();
        let mut out = try_entries(n)?;
        for e in table.chunks_exact(PFPL_TABLE_ENTRY_LEN) {
            let size = u16::from_le_bytes([e[0], e[1]]) as usize;
            out.push(ChunkEntry {
                offset: off,
                size,
                checksum: 0,
            });
            off += size;
        }
        if off != stream.len() {
            return Err(Error::corrupt(
                "chunk sizes do not add up to the payload length",
            ));
        }
        let sum = out
            .par_iter_mut()
            .enumerate()
            .with_min_len(64)
            .map(|(i, e)| {
                e.checksum = zhash_bytes(&stream[e.offset..e.offset + e.size]);
                zhash_mix(e.checksum, i as u32)
            })
            .reduce(|| 0, u32::wrapping_add);
        if zhash_final(sum, n as u32) != self.data_checksum {
            return Err(Error::corrupt("data checksum mismatch"));
        }
        Ok(out)
    }
}

/// An empty vector for `n` chunk entries (`n` is bounded by the stream's length, but the
/// allocation is checked all the same: no abort on a failed allocation).
fn try_entries(n: usize) -> Result<Vec<ChunkEntry>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n)
        .map_err(|_| Error::OutOfMemory(format!("a chunk table of {n} entries")))?;
    Ok(v)
}

/// The shape of a version 3 header (offsets 92..128), checked: 1 to 4 extents, reserved bytes
/// 93..96 and unused extents zero, no zero extent except the 1-D shape of an empty stream.
fn parse_dims(b: &[u8; HEADER_LEN_V3]) -> Result<Dims> {
    let n = b[92] as usize;
    if b[93..96].iter().any(|&x| x != 0) {
        return Err(Error::corrupt("reserved header bytes are not zero"));
    }
    if !(1..=MAX_DIMS).contains(&n) {
        return Err(Error::corrupt(format!(
            "header has {n} dimensions (1 to {MAX_DIMS} allowed)"
        )));
    }
    let all: Vec<u64> = (0..MAX_DIMS).map(|i| u64_at(b, 96 + 8 * i)).collect();
    if all[n..].iter().any(|&x| x != 0) {
        return Err(Error::corrupt("unused shape extents are not zero"));
    }
    Dims::check(&all[..n]).map_err(|e| Error::corrupt(format!("header shape: {e}")))
}

/// One chunk's place in the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkEntry {
    /// Byte offset from the start of the stream.
    pub offset: usize,
    /// Size in bytes (a multiple of 4 except in `pfpl` streams).
    pub size: usize,
    /// `zhash` of the chunk's bytes (stored in the table, or computed for `pfpl`).
    pub checksum: u32,
}

/// The `chunk_log2` a stream of codec tag `codec` and `dtype` carries (stored streams too): 15 for
/// aatrox / cuszp, 12 (f32) or 11 (f64) for `pfpl` (16 KiB chunks).
pub fn codec_chunk_log2(codec: u8, dtype: Dtype) -> u16 {
    match (codec, dtype) {
        (CODEC_PFPL, Dtype::F32) => 12,
        (CODEC_PFPL, Dtype::F64) => 11,
        (CODEC_GPZ, _) => GPZ_CHUNK_LOG2,
        _ => 15,
    }
}

/// The coordinates per particle of a `gpz` array of shape `dims`: 1 for a 1-D shape (`N`
/// particles of one coordinate), else the last extent (`[N, d]`, AoS), which must be 1 to 4.
/// Errors ([`Error::InvalidArgument`]) for a last extent outside `1..=4`.
pub fn gpz_coords(dims: &Dims) -> Result<usize> {
    let s = dims.as_slice();
    if s.len() < 2 {
        return Ok(1);
    }
    let d = s[s.len() - 1];
    if !(1..=4).contains(&d) {
        return Err(Error::invalid(format!(
            "gpz compresses particles of 1 to 4 coordinates (shape [N, d], AoS): the last \
             extent of shape {dims} is {d}"
        )));
    }
    Ok(d as usize)
}

/// Bytes of a GPZ header with `d` coordinates per particle (GPZ-FORMAT.md: a fixed part of
/// 48 bytes, one 48-byte record per axis, the header checksum and 4 reserved bytes), which is
/// the codec metadata of a compressed `gpz` zcomm stream. Lives here, with the other stream
/// layouts, so that checking a zcomm header needs nothing from the codecs.
pub fn gpz_header_len(d: usize) -> usize {
    48 + 48 * d + 8
}

/// Bytes per chunk-table entry of streams of codec tag `codec`: [`PFPL_TABLE_ENTRY_LEN`] for
/// `pfpl`, [`TABLE_ENTRY_LEN`] for every other tag.
pub fn table_entry_len(codec: u8) -> usize {
    if codec == CODEC_PFPL {
        PFPL_TABLE_ENTRY_LEN
    } else {
        TABLE_ENTRY_LEN
    }
}

/// The `pfpl` chunk table for chunk payload sizes `sizes` (each at most `u16::MAX`): `n` u16
/// little-endian sizes.
pub fn pfpl_table(sizes: impl IntoIterator<Item = usize>) -> Vec<u8> {
    sizes
        .into_iter()
        .flat_map(|s| {
            u16::try_from(s)
                .expect("pfpl chunk size fits u16")
                .to_le_bytes()
        })
        .collect()
}

/// The `pfpl` data checksum (header offset 80): `zhash` of the word sequence `c_0 … c_{n-1}`,
/// where `c_i` is the `zhash` of chunk `i`'s payload bytes.
pub fn data_checksum(chunk_hashes: &[u32]) -> u32 {
    let sum = chunk_hashes
        .iter()
        .enumerate()
        .fold(0u32, |a, (i, &c)| a.wrapping_add(zhash_mix(c, i as u32)));
    zhash_final(sum, chunk_hashes.len() as u32)
}

/// Bytes of the largest stream `count` values of `dtype` can produce, whatever the codec (a
/// stored version 3 stream: [`HEADER_LEN_V3`] bytes of header, then the values). Streams of the
/// codecs with version 2 headers are at most [`HEADER_LEN`] `+ count * size` bytes.
pub fn compress_bound(count: usize, dtype: Dtype) -> usize {
    HEADER_LEN_V3 + count * dtype.size()
}

/// `zhash` mixing step of word `w` at index `i` (see `FORMAT.md`): MurmurHash3's 32-bit finalizer
/// of `w XOR (i * 0x9E3779B9)`. Nonlinear, so flips in different words do not cancel; a bijection
/// of `w` for fixed `i`, so any single changed word changes the hash.
#[inline(always)]
pub fn zhash_mix(w: u32, i: u32) -> u32 {
    let mut h = w ^ i.wrapping_mul(0x9E37_79B9);
    h ^= h >> 16;
    h = h.wrapping_mul(0x85EB_CA6B);
    h ^= h >> 13;
    h = h.wrapping_mul(0xC2B2_AE35);
    h ^ (h >> 16)
}

/// The last step of `zhash`: `sum` (of [`zhash_mix`] terms) XOR `nwords * 0x27D4EB2F`.
#[inline(always)]
pub fn zhash_final(sum: u32, nwords: u32) -> u32 {
    sum ^ nwords.wrapping_mul(0x27D4_EB2F)
}

/// `zhash` of a byte string (zero-padded to whole 32-bit words).
pub fn zhash_bytes(b: &[u8]) -> u32 {
    let mut sum = 0u32;
    let mut n = 0u32;
    let mut chunks = b.chunks_exact(4);
    for c in &mut chunks {
        sum = sum.wrapping_add(zhash_mix(u32::from_le_bytes([c[0], c[1], c[2], c[3]]), n));
        n = n.wrapping_add(1);
    }
    let rem = chunks.remainder();
    if !rem.is_empty() {
        let mut w = [0u8; 4];
        w[..rem.len()].copy_from_slice(rem);
        sum = sum.wrapping_add(zhash_mix(u32::from_le_bytes(w), n));
        n = n.wrapping_add(1);
    }
    zhash_final(sum, n)
}

pub(crate) fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
pub(crate) fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"))
}
pub(crate) fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"))
}
pub(crate) fn f64_at(b: &[u8], o: usize) -> f64 {
    f64::from_bits(u64_at(b, o))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Header {
        Header {
            codec: 1,
            dtype: Dtype::F32,
            mode: BoundMode::Noa,
            flags: 0,
            chunk_log2: 15,
            count: 10,
            bound_value: 1e-3,
            abs_bound: 1e-3,
            step: 2e-3,
            range_min: -1.0,
            range_max: 1.0,
            payload_len: 8,
            n_chunks: 1,
            payload_checksum: zhash_bytes(&[0; 8]),
            data_checksum: 0,
            fill_value: None,
            dims: None,
            meta_len: 0,
        }
    }

    #[test]
    fn header_round_trip_and_every_byte_flip_is_caught() {
        let h = sample();
        let mut s = h.to_bytes().to_vec();
        s.extend_from_slice(&[0; 8]);
        assert_eq!(Header::parse(&s).unwrap(), h);
        for i in 0..HEADER_LEN {
            for bit in 0..8 {
                let mut c = s.clone();
                c[i] ^= 1 << bit;
                assert!(
                    Header::parse(&c).is_err(),
                    "flip of byte {i} bit {bit} not caught"
                );
            }
        }
        for n in 0..s.len() {
            assert!(Header::parse(&s[..n]).is_err());
        }
    }

    /// A version 3 header (shape and metadata length) round-trips, and every bit flip of its
    /// 136 bytes is caught.
    #[test]
    fn version_3_header_round_trip_and_every_byte_flip_is_caught() {
        let mut h = sample();
        h.codec = CODEC_CUSZI;
        h.dims = Some(Dims::new(&[2, 5]).unwrap());
        h.meta_len = 4;
        h.payload_len = 12;
        h.payload_checksum = zhash_bytes(&[0; 12]);
        let mut s = h.to_vec();
        assert_eq!((s.len(), h.header_len(), h.version()), (136, 136, 3));
        s.extend_from_slice(&[0; 12]);
        assert_eq!(Header::parse(&s).unwrap(), h);
        assert_eq!(h.table_len(), 12);
        for i in 0..HEADER_LEN_V3 {
            for bit in 0..8 {
                let mut c = s.clone();
                c[i] ^= 1 << bit;
                assert!(
                    Header::parse(&c).is_err(),
                    "flip of byte {i} bit {bit} not caught"
                );
            }
        }
        // the version 2 parser of a GPU decoder says what it is
        let e = Header::parse_fields(s[..96].try_into().unwrap(), s.len()).unwrap_err();
        assert!(e.to_string().contains("version 3"), "{e}");
    }

    /// Version 1 streams (and any other version) are rejected, whatever else they hold.
    #[test]
    fn other_versions_are_rejected() {
        let h = sample();
        let mut s = h.to_bytes().to_vec();
        s.extend_from_slice(&[0; 8]);
        for v in [0u16, 1, 3, 4, 0xFFFF] {
            let mut c = s.clone();
            c[4..6].copy_from_slice(&v.to_le_bytes());
            let hc = zhash_bytes(&c[..92]);
            c[92..96].copy_from_slice(&hc.to_le_bytes());
            let e = Header::parse(&c).unwrap_err().to_string();
            assert!(e.contains("version"), "{e}");
        }
    }

    /// pfpl: u16 table entries and a data checksum at offset 80, which other codecs must leave 0.
    #[test]
    fn pfpl_table_and_data_checksum_fields() {
        let sizes = [0usize, 7, 16_384];
        let table = pfpl_table(sizes);
        assert_eq!(table, [0, 0, 7, 0, 0, 0x40]);
        let chunks: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0x5A; n]).collect();
        let hashes: Vec<u32> = chunks.iter().map(|c| zhash_bytes(c)).collect();
        let mut h = sample();
        h.codec = CODEC_PFPL;
        h.chunk_log2 = 12;
        h.count = 3 * 4096;
        h.n_chunks = 3;
        h.payload_len = (table.len() + 7 + 16_384) as u64;
        h.payload_checksum = zhash_bytes(&table);
        h.data_checksum = data_checksum(&hashes);
        assert_eq!(h.table_len(), 6);
        let mut s = h.to_bytes().to_vec();
        s.extend_from_slice(&table);
        for c in &chunks {
            s.extend_from_slice(c);
        }
        assert_eq!(Header::parse(&s).unwrap(), h);
        let t = h.chunk_table(&s).unwrap();
        assert_eq!(
            t.iter().map(|e| e.offset).collect::<Vec<_>>(),
            [102, 102, 109]
        );
        assert_eq!(t.iter().map(|e| e.checksum).collect::<Vec<_>>(), hashes);
        // a changed payload byte or data checksum fails the table parse
        let mut c = s.clone();
        c[105] ^= 1;
        assert!(h.chunk_table(&c).is_err());
        let mut h2 = h;
        h2.data_checksum ^= 1;
        let mut c = s.clone();
        c[..HEADER_LEN].copy_from_slice(&h2.to_bytes());
        assert!(Header::parse(&c).is_ok());
        assert!(h2.chunk_table(&c).is_err());
        // another codec with a data checksum: reserved bytes not zero
        let mut h3 = sample();
        h3.data_checksum = 1;
        let mut c = h3.to_bytes().to_vec();
        c.extend_from_slice(&[0; 8]);
        assert!(Header::parse(&c).is_err());
    }

    #[test]
    fn zhash_detects_single_word_changes() {
        let base: Vec<u8> = (0..64u8).collect();
        let h = zhash_bytes(&base);
        for i in 0..base.len() {
            let mut c = base.clone();
            c[i] ^= 0x10;
            assert_ne!(zhash_bytes(&c), h);
        }
    }
}
