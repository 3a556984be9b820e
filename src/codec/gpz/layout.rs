//! Stage 4 and its inverse: the stream header, the block table and the checksums
//! (GPZ-FORMAT.md). This is the only part of the codec that knows byte offsets.

use super::Order;
use crate::codec::DecodeLimits;
use crate::element::Element;
use crate::error::{Error, Result};
use crate::format::{f64_at, u32_at, u64_at, zhash_bytes, BoundMode, Dtype};
use crate::quant::{ErrorBound, QuantParams};

/// Stream magic of GPZ streams (distinct from the `ZCMP` streams of the other codecs).
pub const MAGIC: [u8; 4] = *b"ZGPZ";
/// GPZ format version written and accepted.
pub const VERSION: u16 = 1;
/// log2 of particles per block.
pub const BLOCK_LOG2: u8 = 5;
/// Particles per block (one warp).
pub const BLOCK: usize = 1 << BLOCK_LOG2;
/// Flag bit: the particles follow the header verbatim.
pub const FLAG_STORED: u8 = 1;
/// Bytes of the fixed part of the header.
const FIXED_LEN: usize = 48;
/// Bytes of one axis record.
const AXIS_LEN: usize = 48;
/// Bytes of one block-table entry (`size: u16`).
pub const TABLE_ENTRY_LEN: usize = 2;

/// Header bytes of a stream with `d` coordinates per particle (`56 + 48 d`: the fixed part,
/// the axis records, the header checksum and 4 reserved bytes). The zcomm header check owns
/// the number ([`gpz_header_len`](crate::format::gpz_header_len)); a test ties it to this
/// module's layout constants.
pub fn header_len(d: usize) -> usize {
    crate::format::gpz_header_len(d)
}

/// The quantization record of one coordinate axis.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AxisRecord {
    /// Guaranteed absolute bound of this axis.
    pub abs_bound: f64,
    /// Quantization step (a value of the stream's dtype).
    pub step: f64,
    /// Finite value range of this axis (`noa`), `(0, 0)` for `abs`.
    pub range: (f64, f64),
    /// Smallest code of this axis over the non-exception particles; the block bases are
    /// relative to it.
    pub base: i64,
    /// Bit width of the block bases of this axis.
    pub base_width: u32,
}

/// A parsed and validated GPZ stream header.
#[derive(Debug, Clone, PartialEq)]
pub struct GpzHeader {
    /// Element type.
    pub dtype: Dtype,
    /// Coordinates per particle (1..=4).
    pub d: usize,
    /// Error-bound mode (`abs` or `noa`).
    pub mode: BoundMode,
    /// The user's bound value `E`.
    pub bound_value: f64,
    /// Particle order of the decoded stream.
    pub order: Order,
    /// Whether the particles are stored verbatim (compression did not pay).
    pub stored: bool,
    /// Number of particles.
    pub n: u64,
    /// Bytes after the header.
    pub payload_len: u64,
    /// `zhash` of the block table (0 for stored streams).
    pub table_checksum: u32,
    /// `zhash` of the block data (or of the raw values of a stored stream).
    pub data_checksum: u32,
    /// One record per axis.
    pub axes: Vec<AxisRecord>,
}

impl GpzHeader {
    /// The header of a compressed (not stored) stream of `n` particles of `d` coordinates under
    /// `bound`, before its payload length and checksums are known (the CPU and GPU encoders).
    pub fn compressed(
        dtype: Dtype,
        (n, d): (usize, usize),
        bound: ErrorBound,
        order: Order,
        axes: Vec<AxisRecord>,
    ) -> Self {
        GpzHeader {
            dtype,
            d,
            mode: bound.mode(),
            bound_value: bound.value(),
            order,
            stored: false,
            n: n as u64,
            payload_len: 0,
            table_checksum: 0,
            data_checksum: 0,
            axes,
        }
    }

    /// Number of blocks (`ceil(n / 32)`; 0 for stored streams).
    pub fn n_blocks(&self) -> u64 {
        if self.stored {
            0
        } else {
            self.n.div_ceil(BLOCK as u64)
        }
    }

    /// Serialize (the header checksum is computed here).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = vec![0u8; header_len(self.d)];
        b[0..4].copy_from_slice(&MAGIC);
        b[4..6].copy_from_slice(&VERSION.to_le_bytes());
        b[6] = self.dtype.tag();
        b[7] = self.d as u8;
        b[8] = self.mode.tag();
        b[9] = self.order.tag();
        b[10] = if self.stored { FLAG_STORED } else { 0 };
        b[11] = BLOCK_LOG2;
        b[16..24].copy_from_slice(&self.n.to_le_bytes());
        b[24..32].copy_from_slice(&self.bound_value.to_le_bytes());
        b[32..40].copy_from_slice(&self.payload_len.to_le_bytes());
        b[40..44].copy_from_slice(&self.table_checksum.to_le_bytes());
        b[44..48].copy_from_slice(&self.data_checksum.to_le_bytes());
        for (c, a) in self.axes.iter().enumerate() {
            let o = FIXED_LEN + AXIS_LEN * c;
            b[o..o + 8].copy_from_slice(&a.abs_bound.to_le_bytes());
            b[o + 8..o + 16].copy_from_slice(&a.step.to_le_bytes());
            b[o + 16..o + 24].copy_from_slice(&a.range.0.to_le_bytes());
            b[o + 24..o + 32].copy_from_slice(&a.range.1.to_le_bytes());
            b[o + 32..o + 40].copy_from_slice(&a.base.to_le_bytes());
            b[o + 40] = a.base_width as u8;
        }
        let o = FIXED_LEN + AXIS_LEN * self.d;
        let h = zhash_bytes(&b[..o]);
        b[o..o + 4].copy_from_slice(&h.to_le_bytes());
        b
    }

    /// Parse and validate a header at the start of `stream` (checksum, tags, reserved bytes,
    /// the bound and every axis record, the payload length). Does not read the payload.
    pub fn parse(stream: &[u8]) -> Result<GpzHeader> {
        Self::parse_with_len(stream, stream.len())
    }

    /// [`GpzHeader::parse`] of a stream of `stream_len` bytes whose first bytes are `stream`
    /// (at least its header, or all of it when it is shorter): a device decoder reads only the
    /// header to the host.
    pub(crate) fn parse_with_len(stream: &[u8], stream_len: usize) -> Result<GpzHeader> {
        let avail = stream_len.min(stream.len());
        if avail < FIXED_LEN {
            return Err(Error::corrupt(format!(
                "gpz stream of {stream_len} bytes is shorter than its header"
            )));
        }
        if stream[0..4] != MAGIC {
            return Err(Error::corrupt("not a gpz stream (bad magic)"));
        }
        let version = u16::from_le_bytes([stream[4], stream[5]]);
        if version != VERSION {
            return Err(Error::corrupt(format!(
                "gpz format version {version} unsupported (expected {VERSION})"
            )));
        }
        let d = stream[7] as usize;
        if !(1..=4).contains(&d) {
            return Err(Error::corrupt(format!(
                "gpz stream has {d} coordinates per particle (expected 1..=4)"
            )));
        }
        let hl = header_len(d);
        if avail < hl {
            return Err(Error::corrupt("gpz stream truncated inside its header"));
        }
        let o = FIXED_LEN + AXIS_LEN * d;
        if u32_at(stream, o) != zhash_bytes(&stream[..o]) {
            return Err(Error::corrupt("gpz header checksum mismatch"));
        }
        let dtype = Dtype::from_tag(stream[6])?;
        let mode = BoundMode::from_tag(stream[8])?;
        if mode == BoundMode::Rel {
            return Err(Error::corrupt("gpz stream with a rel bound"));
        }
        let order = Order::from_tag(stream[9])?;
        let flags = stream[10];
        if flags & !FLAG_STORED != 0 {
            return Err(Error::corrupt(format!("gpz flags {flags:#x} unknown")));
        }
        if stream[11] != BLOCK_LOG2 {
            return Err(Error::corrupt(format!(
                "gpz block_log2 {} unsupported (expected {BLOCK_LOG2})",
                stream[11]
            )));
        }
        let reserved = stream[12..16].iter().chain(&stream[o + 4..o + 8]);
        if reserved
            .chain((0..d).flat_map(|c| {
                let a = FIXED_LEN + AXIS_LEN * c;
                &stream[a + 41..a + 48]
            }))
            .any(|&x| x != 0)
        {
            return Err(Error::corrupt("gpz reserved header bytes are not zero"));
        }
        let h = GpzHeader {
            dtype,
            d,
            mode,
            bound_value: f64_at(stream, 24),
            order,
            stored: flags & FLAG_STORED != 0,
            n: u64_at(stream, 16),
            payload_len: u64_at(stream, 32),
            table_checksum: u32_at(stream, 40),
            data_checksum: u32_at(stream, 44),
            axes: (0..d)
                .map(|c| {
                    let a = FIXED_LEN + AXIS_LEN * c;
                    AxisRecord {
                        abs_bound: f64_at(stream, a),
                        step: f64_at(stream, a + 8),
                        range: (f64_at(stream, a + 16), f64_at(stream, a + 24)),
                        base: u64_at(stream, a + 32) as i64,
                        base_width: stream[a + 40] as u32,
                    }
                })
                .collect(),
        };
        match dtype {
            Dtype::F32 => h.check_axes::<f32>()?,
            Dtype::F64 => h.check_axes::<f64>()?,
        }
        if h.payload_len != (stream_len - hl) as u64 {
            return Err(Error::corrupt(format!(
                "gpz payload_len {} but {} bytes follow the header",
                h.payload_len,
                stream_len - hl
            )));
        }
        if h.stored && h.table_checksum != 0 {
            return Err(Error::corrupt("gpz stored stream with a table checksum"));
        }
        Ok(h)
    }

    /// The bound of the stream.
    pub fn bound(&self) -> ErrorBound {
        match self.mode {
            BoundMode::Noa => ErrorBound::Noa(self.bound_value),
            _ => ErrorBound::Abs(self.bound_value),
        }
    }

    /// The quantization parameters of axis `c` (as the encoder derived them).
    pub fn axis_params(&self, c: usize) -> QuantParams {
        let a = &self.axes[c];
        QuantParams {
            mode: self.mode,
            bound_value: self.bound_value,
            abs_bound: a.abs_bound,
            step: a.step,
            range: a.range,
            fill: None,
        }
    }

    /// Every axis record must be what the encoder derives from the bound and the range: the
    /// parameters are re-derived (the recorded step stands in for the first non-zero value a
    /// degenerate bound would use) and compared bit for bit.
    fn check_axes<T: Element>(&self) -> Result<()> {
        let bound = self.bound();
        bound
            .validate()
            .map_err(|e| Error::corrupt(format!("gpz header bound: {e}")))?;
        for (c, a) in self.axes.iter().enumerate() {
            let (lo, hi) = a.range;
            let range_ok = match self.mode {
                BoundMode::Noa => lo.is_finite() && hi.is_finite() && lo <= hi,
                _ => lo.to_bits() == 0 && hi.to_bits() == 0,
            };
            if !range_ok {
                return Err(Error::corrupt(format!("gpz axis {c}: invalid range")));
            }
            let p = QuantParams::derive_from_stats::<T>(bound, || Some(a.range), || Some(a.step))?;
            if p.abs_bound.to_bits() != a.abs_bound.to_bits()
                || p.step.to_bits() != a.step.to_bits()
            {
                return Err(Error::corrupt(format!(
                    "gpz axis {c}: bound {:e} / step {:e} do not follow from the header",
                    a.abs_bound, a.step
                )));
            }
            if a.base_width > T::MAX_RATE || (a.base as f64).abs() >= T::QMAX {
                return Err(Error::corrupt(format!(
                    "gpz axis {c}: base {} / width {} out of range",
                    a.base, a.base_width
                )));
            }
        }
        Ok(())
    }

    /// Check the particle count against `limits` (before anything is allocated).
    pub(crate) fn check_limits(&self, limits: &DecodeLimits) -> Result<usize> {
        let values = match self.n.checked_mul(self.d as u64) {
            Some(v) if v <= limits.max_count => v,
            _ => {
                return Err(Error::corrupt(format!(
                    "gpz stream claims {} particles of {} coordinates, limit is {} values",
                    self.n, self.d, limits.max_count
                )))
            }
        };
        let bytes = values.saturating_mul(self.dtype.size() as u64);
        if bytes > limits.max_bytes {
            return Err(Error::OutOfMemory(format!(
                "gpz stream decodes to {bytes} bytes, above the decode limit of {} bytes",
                limits.max_bytes
            )));
        }
        usize::try_from(values)
            .map_err(|_| Error::corrupt(format!("{values} values do not fit in memory")))
    }
}

/// The block table of a compressed stream, checked: returns each block's byte offset in the
/// payload (after the table) and validates the table and data checksums and the total size.
pub(crate) fn block_offsets(h: &GpzHeader, payload: &[u8]) -> Result<Vec<usize>> {
    let nb = usize::try_from(h.n_blocks())
        .map_err(|_| Error::corrupt("gpz block count does not fit in memory"))?;
    let table_len = nb
        .checked_mul(TABLE_ENTRY_LEN)
        .filter(|&t| t <= payload.len())
        .ok_or_else(|| Error::corrupt("gpz stream truncated inside its block table"))?;
    let table = &payload[..table_len];
    if zhash_bytes(table) != h.table_checksum {
        return Err(Error::corrupt("gpz block table checksum mismatch"));
    }
    let mut offsets = Vec::with_capacity(nb + 1);
    let mut at = 0usize;
    offsets.push(0);
    for e in table.chunks_exact(TABLE_ENTRY_LEN) {
        let size = u16::from_le_bytes([e[0], e[1]]) as usize;
        if size == 0 {
            return Err(Error::corrupt("gpz block of size 0"));
        }
        at += size;
        offsets.push(at);
    }
    let data = &payload[table_len..];
    if at != data.len() {
        return Err(Error::corrupt(format!(
            "gpz blocks sum to {at} bytes but {} follow the table",
            data.len()
        )));
    }
    if zhash_bytes(data) != h.data_checksum {
        return Err(Error::corrupt("gpz block data checksum mismatch"));
    }
    Ok(offsets)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_len_matches_the_layout() {
        for d in 1..=4 {
            assert_eq!(header_len(d), FIXED_LEN + AXIS_LEN * d + 8);
        }
    }
}
