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

/// Two `#[test]`s, `$f32` and `$f64`, that run the generic check `$check::<T>()` for each element
/// type: the codecs' tests cover f32 and f64 alike. Defined before the codec modules so that
/// their tests can use it too.
#[cfg(test)]
macro_rules! tests_for_f32_and_f64 {
    ($check:ident => $f32:ident, $f64:ident) => {
        #[test]
        fn $f32() {
            $check::<f32>();
        }

        #[test]
        fn $f64() {
            $check::<f64>();
        }
    };
}

pub mod blocked;
pub mod cuszi;
pub mod gpz;
pub mod pfpl;

use crate::element::Element;
use crate::error::{Error, Result};
use crate::format::{zhash_bytes, BoundMode, ChunkEntry, Dims, Header, FLAG_STORED};
use crate::quant::{first_nonzero, ErrorBound, QuantParams};

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
    /// cuSZ-i: multi-level spline interpolation over the array's shape (`compress_nd`), rANS
    /// coding. CPU twin and CUDA kernels (`gpu::cuszi`; `gpu::GpuCodec` compresses 1-D).
    Cuszi,
    /// GPZ: particle coordinates (`N` particles × `d = 1..=4` coordinates, AoS, the shape
    /// `[N, d]` of `compress_nd`; 1-D data is `N × 1`): per-block spatial sort and run/bit-plane
    /// coding ([`gpz`]). The stream wraps a GPZ stream (FORMAT.md, "gpz"). No `rel`
    /// bounds, fill values or given ranges. CPU twin and CUDA kernels (`gpu::gpz`;
    /// `gpu::GpuCodec` compresses `N × 1`).
    Gpz,
}

impl CodecKind {
    /// Every codec, in registry order.
    pub const ALL: &'static [CodecKind] = &[
        CodecKind::Aatrox,
        CodecKind::CuszpPlain,
        CodecKind::CuszpOutlier,
        CodecKind::Pfpl,
        CodecKind::Cuszi,
        CodecKind::Gpz,
    ];

    /// The codecs with GPU kernels behind `gpu::GpuCodec` (and so the ones the communication
    /// layer's `Policy::Auto` calibrates and chooses from), in registry order: every codec.
    /// `cuszi` and `gpz` compress a message as 1-D (`[n]`, `n × 1` particles) on the GPU, and
    /// `gpz` still refuses `rel` bounds there ([`CodecKind::supports_bound`]). (Kept a
    /// separate constant, not a use of [`ALL`](Self::ALL), so that a future CPU-only codec
    /// has a place to be left out; today the two lists are the same.)
    pub const WITH_GPU: &'static [CodecKind] = Self::ALL;

    /// Whether the codec has GPU kernels (`gpu::GpuCodec` refuses the others with
    /// [`Error::Unavailable`]).
    pub fn has_gpu(self) -> bool {
        Self::WITH_GPU.contains(&self)
    }

    /// Whether a stream's decoded values depend only on each value and the bound (and on
    /// chunks that start at whole multiples of 2^16 values), not on neighbours' predictions or
    /// the field's shape: such a buffer compressed in pieces decodes to the values of one
    /// stream (unless a piece's stream is stored raw where the whole one would not be), so the
    /// device algorithms may pipeline it.
    pub fn decodes_per_value(self) -> bool {
        matches!(
            self,
            CodecKind::Aatrox | CodecKind::CuszpPlain | CodecKind::CuszpOutlier | CodecKind::Pfpl
        )
    }

    /// Whether the codec's GPU kernels measure the value range of what they read (the blocked
    /// codecs' compression and fused decompress-and-add), so that a compressed allreduce on
    /// the device runs no range pass of its own (`comm::ring::FinalBound::Deferred`); for the
    /// others the ring measures it with a pass per segment.
    pub fn measures_range_on_gpu(self) -> bool {
        matches!(
            self,
            CodecKind::Aatrox | CodecKind::CuszpPlain | CodecKind::CuszpOutlier
        )
    }

    /// Whether the codec uses the array's shape (`compress_nd`, [`CompressOptions::with_dims`]);
    /// the others compress every array as 1-D and ignore it.
    pub fn uses_dims(self) -> bool {
        matches!(self, CodecKind::Cuszi | CodecKind::Gpz)
    }

    /// Whether the codec accepts bounds of `bound`'s mode: every codec but `gpz` (which refuses
    /// `rel` bounds) accepts all three. The communication layer sends a message raw rather than
    /// ask a codec for a bound it refuses.
    pub fn supports_bound(self, bound: ErrorBound) -> bool {
        !(self == CodecKind::Gpz && matches!(bound, ErrorBound::Rel(_)))
    }

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            CodecKind::Aatrox => "aatrox",
            CodecKind::CuszpPlain => "cuszp-plain",
            CodecKind::CuszpOutlier => "cuszp-outlier",
            CodecKind::Pfpl => "pfpl",
            CodecKind::Cuszi => "cuszi",
            CodecKind::Gpz => "gpz",
        }
    }
    /// The header tag.
    pub fn tag(self) -> u8 {
        match self {
            CodecKind::Aatrox => 1,
            CodecKind::CuszpPlain => 2,
            CodecKind::CuszpOutlier => 3,
            CodecKind::Pfpl => 4,
            CodecKind::Cuszi => crate::format::CODEC_CUSZI,
            CodecKind::Gpz => crate::format::CODEC_GPZ,
        }
    }
    /// The header's `chunk_log2` for this codec and dtype (15 for aatrox/cuszp/cuszi, 5 for
    /// gpz: particles per block; see [`pfpl::chunk_log2`]).
    pub fn chunk_log2(self, dtype: crate::format::Dtype) -> u16 {
        match self {
            CodecKind::Pfpl => pfpl::chunk_log2(dtype),
            CodecKind::Cuszi => cuszi::CHUNK_LOG2 as u16,
            CodecKind::Gpz => crate::format::GPZ_CHUNK_LOG2,
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
    if codec == CodecKind::Gpz {
        // (1-D: N particles of one coordinate, in input order)
        let opts = CompressOptions::default();
        return Ok(compress_particles_with_options(data, bound, &opts)?.0);
    }
    let params = QuantParams::derive(data, bound)?;
    compress_with_params(data, &params, codec, None)
}

/// [`compress`] of an array of shape `dims` (slowest dimension first, numpy's C order: 1 to 4
/// extents, none zero, whose product is `data.len()`).
///
/// Codecs that use the shape ([`CodecKind::uses_dims`]: `cuszi`, `gpz`) record it in the stream
/// (format version 3): `cuszi` predicts along every dimension, `gpz` reads `[N, d]` as `N`
/// particles of `d = 1..=4` coordinates (see [`compress_particles_nd`]). The others ignore it
/// and write the same bytes as [`compress`].
///
/// Errors ([`Error::InvalidArgument`]): an invalid bound or shape, or a shape whose product is
/// not `data.len()`; for `gpz`, a `rel` bound or a last extent outside 1..=4.
///
/// ```
/// use zcomm::{compress, compress_nd, decompress, inspect, CodecKind, ErrorBound};
/// let (nx, ny, nz) = (24usize, 20, 16);
/// let data: Vec<f32> = (0..nx * ny * nz)
///     .map(|i| {
///         let (x, y, z) = ((i / (ny * nz)) as f32, (i / nz % ny) as f32, (i % nz) as f32);
///         (x * 0.2).sin() * (y * 0.15).cos() + z * 0.01
///     })
///     .collect();
/// let b = ErrorBound::Noa(1e-3);
/// let s = compress_nd(&data, &[nx, ny, nz], b, CodecKind::Cuszi)?;
/// assert_eq!(inspect(&s)?.dims.unwrap().as_slice(), &[24, 20, 16]);
/// let back: Vec<f32> = decompress(&s)?;
/// let eb = inspect(&s)?.abs_bound;
/// assert!(data.iter().zip(&back).all(|(x, y)| ((x - y).abs() as f64) <= eb));
/// // codecs that ignore the shape write the 1-D stream
/// let a = compress_nd(&data, &[nx, ny, nz], b, CodecKind::Aatrox)?;
/// assert_eq!(a, compress(&data, b, CodecKind::Aatrox)?);
/// assert!(compress_nd(&data, &[nx, ny], b, CodecKind::Cuszi).is_err());
/// # Ok::<(), zcomm::Error>(())
/// ```
pub fn compress_nd<T: Element>(
    data: &[T],
    dims: &[usize],
    bound: ErrorBound,
    codec: CodecKind,
) -> Result<Vec<u8>> {
    let d: Vec<u64> = dims.iter().map(|&x| x as u64).collect();
    let opts = CompressOptions::default().with_dims(Dims::new(&d)?);
    compress_with_options(data, bound, codec, &opts)
}

/// [`compress`] under a `noa` bound with the value range `range = (min, max)` given by the caller
/// instead of measured from `data` (e.g. computed once and reused, or agreed on by all ranks).
///
/// * Every finite value is reconstructed within `E * (max - min)` of the **given** range (the
///   guaranteed bound is `pred(E * (max - min))`, as for a measured range); the header records
///   the given range as its `range_min` / `range_max`.
/// * The range need not contain the data: values the quantizer cannot reconstruct within that
///   bound (and non-finite values) are stored losslessly, as always.
/// * When `range` equals the data's own finite range ([`crate::quant::finite_range`]; `(0, 0)`
///   for data without finite values), the stream is byte-identical to [`compress`]'s. `-0.0` is
///   recorded as `+0.0`, as in a measured range.
///
/// Errors ([`Error::InvalidArgument`]): an invalid bound, a bound that is not `noa` (an `abs` or
/// `rel` bound does not depend on the range), a non-finite range value, or `min > max`.
///
/// ```
/// use zcomm::{compress, compress_with_range, decompress, CodecKind, ErrorBound};
/// let data: Vec<f32> = (0..10_000).map(|i| (i as f32 * 1e-3).sin()).collect();
/// let b = ErrorBound::Noa(1e-3);
/// let own = zcomm::quant::finite_range(&data).unwrap();
/// let s = compress_with_range(&data, b, CodecKind::Aatrox, own).unwrap();
/// assert_eq!(s, compress(&data, b, CodecKind::Aatrox).unwrap());
/// // a wider range: a looser absolute bound, 1e-3 * 4
/// let s = compress_with_range(&data, b, CodecKind::Aatrox, (-2.0, 2.0)).unwrap();
/// let back: Vec<f32> = decompress(&s).unwrap();
/// assert!(data.iter().zip(&back).all(|(x, y)| ((x - y).abs() as f64) <= 4e-3));
/// assert!(compress_with_range(&data, ErrorBound::Abs(1e-3), CodecKind::Aatrox, own).is_err());
/// ```
pub fn compress_with_range<T: Element>(
    data: &[T],
    bound: ErrorBound,
    codec: CodecKind,
    range: (f64, f64),
) -> Result<Vec<u8>> {
    if codec == CodecKind::Gpz {
        return Err(gpz_no_range());
    }
    let params = QuantParams::derive_with_range::<T>(bound, range, || first_nonzero(data))?;
    compress_with_params(data, &params, codec, None)
}

/// Options of [`compress_with_options`] beyond the bound and the codec. Build with
/// `CompressOptions::default()` and the `with_*` methods (the struct is non-exhaustive).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
#[non_exhaustive]
pub struct CompressOptions {
    /// A fill value marking missing points (e.g. `-1e10` on land in ocean data): values bitwise
    /// equal to it (after conversion to the data's dtype, round to nearest) are kept exactly and
    /// left out of the `noa` value range. Recorded in the header.
    pub fill_value: Option<f64>,
    /// A `noa` value range given instead of measured (as [`compress_with_range`]).
    pub range: Option<(f64, f64)>,
    /// The array's shape (see [`compress_nd`]); `None`: 1-D.
    pub dims: Option<Dims>,
    /// The particle order of `gpz` streams (default [`gpz::Order::Preserve`]: decoding restores
    /// the input order); ignored by the other codecs. With [`gpz::Order::Reorder`] the stream
    /// decodes in stored order, and only [`compress_particles_nd`] returns the permutation.
    pub particle_order: gpz::Order,
}

impl CompressOptions {
    /// Set the fill value (see [`CompressOptions::fill_value`]).
    pub fn with_fill_value(mut self, fill: f64) -> Self {
        self.fill_value = Some(fill);
        self
    }
    /// Set the `noa` value range (see [`compress_with_range`]).
    pub fn with_range(mut self, range: (f64, f64)) -> Self {
        self.range = Some(range);
        self
    }
    /// Set the array's shape (see [`compress_nd`]).
    pub fn with_dims(mut self, dims: Dims) -> Self {
        self.dims = Some(dims);
        self
    }
    /// Set the particle order of `gpz` streams (see [`CompressOptions::particle_order`]).
    pub fn with_particle_order(mut self, order: gpz::Order) -> Self {
        self.particle_order = order;
        self
    }
}

/// [`compress`] with [`CompressOptions`]: a fill value, a given `noa` range.
///
/// With a fill value `V`, every value bitwise equal to `T::from(V)` decodes to exactly that
/// value, and the `noa` range (and so the bound on the other values) is taken over the others.
/// The codecs store fill values losslessly (an aatrox/cuszp thread layer holding one is stored
/// raw; pfpl keeps their bits as words, which cost little in runs). With default options the
/// stream is byte-identical to [`compress`]'s.
///
/// Errors ([`Error::InvalidArgument`]): an invalid bound, a fill value that is not finite in
/// the dtype (NaN and infinities are always kept exactly), the range errors of
/// [`compress_with_range`], and a shape whose product is not `data.len()`.
///
/// ```
/// use zcomm::{compress_with_options, decompress, CodecKind, CompressOptions, ErrorBound};
/// let mut data: Vec<f32> = (0..10_000).map(|i| (i as f32 * 1e-3).sin()).collect();
/// for x in data.iter_mut().step_by(7) {
///     *x = -1e10; // land
/// }
/// let opts = CompressOptions::default().with_fill_value(-1e10);
/// let s = compress_with_options(&data, ErrorBound::Noa(1e-3), CodecKind::Pfpl, &opts).unwrap();
/// assert_eq!(zcomm::inspect(&s).unwrap().fill_value, Some(-1e10));
/// let back: Vec<f32> = decompress(&s).unwrap();
/// for (x, y) in data.iter().zip(&back) {
///     // the bound is 1e-3 of the ocean's range (2), not of 1e10
///     assert!(if *x == -1e10 { y == x } else { (x - y).abs() <= 2e-3 });
/// }
/// ```
pub fn compress_with_options<T: Element>(
    data: &[T],
    bound: ErrorBound,
    codec: CodecKind,
    options: &CompressOptions,
) -> Result<Vec<u8>> {
    if let Some(d) = options.dims {
        if d.count() != data.len() as u64 {
            return Err(Error::invalid(format!(
                "shape {d} holds {} values, the data has {}",
                d.count(),
                data.len()
            )));
        }
    }
    if codec == CodecKind::Gpz {
        return Ok(compress_particles_with_options(data, bound, options)?.0);
    }
    let params = QuantParams::derive_with_fill(data, bound, options.fill_value, options.range)?;
    compress_with_params(data, &params, codec, options.dims)
}

/// The error for a `noa` range given to `gpz` (it measures each axis's range itself; shared
/// with the GPU encoder, which refuses what this one refuses with the same words).
pub(crate) fn gpz_no_range() -> Error {
    Error::invalid(
        "gpz does not take a given value range (it measures the range of each coordinate axis)",
    )
}

/// The error for a `rel` bound given to `gpz` (shared with the GPU encoder).
pub(crate) fn gpz_no_rel() -> Error {
    Error::invalid("gpz does not support rel bounds (use abs or noa)")
}

/// Compress particle coordinates with `gpz` into a zcomm stream (the generic API's form, which
/// [`decompress`] and [`inspect`] read), returning the permutation of a
/// [`gpz::Order::Reorder`] stream as [`gpz::compress_particles`] does.
///
/// `dims` is `[N, d]` (`N` particles of `d = 1..=4` coordinates each, stored particle by
/// particle) or `[N]` (one coordinate); other shapes whose last extent is 1 to 4 are read as
/// `count / d` particles. `perm[i]` is the original index of decoded particle `i`; when the
/// stream falls back to stored values (compression did not pay) the particles keep the input
/// order and `perm` is the identity.
///
/// Errors ([`Error::InvalidArgument`]): an invalid or `rel` bound, a shape whose product is not
/// `data.len()` or whose last extent is outside 1..=4.
///
/// ```
/// use zcomm::codec::{compress_particles_nd, gpz::Order};
/// use zcomm::{decompress, inspect, ErrorBound};
/// let pos: Vec<f32> = (0..3000).map(|i| ((i * 7919) % 1000) as f32 * 0.01).collect();
/// let b = ErrorBound::Abs(1e-3);
/// let (s, perm) = compress_particles_nd(&pos, &[1000, 3], b, Order::Reorder)?;
/// let perm = perm.unwrap();
/// let back: Vec<f32> = decompress(&s)?;
/// assert_eq!(inspect(&s)?.dims.unwrap().as_slice(), &[1000, 3]);
/// for (i, &p) in perm.iter().enumerate() {
///     for c in 0..3 {
///         assert!((pos[3 * p as usize + c] - back[3 * i + c]).abs() <= 1e-3);
///     }
/// }
/// # Ok::<(), zcomm::Error>(())
/// ```
pub fn compress_particles_nd<T: Element>(
    data: &[T],
    dims: &[usize],
    bound: ErrorBound,
    order: gpz::Order,
) -> Result<(Vec<u8>, Option<Vec<u64>>)> {
    let d: Vec<u64> = dims.iter().map(|&x| x as u64).collect();
    let opts = CompressOptions::default()
        .with_dims(Dims::new(&d)?)
        .with_particle_order(order);
    compress_particles_with_options(data, bound, &opts)
}

/// [`compress_particles_nd`] with [`CompressOptions`] (the shape `options.dims`, default `[N]`,
/// and `options.particle_order`): the `gpz` body of [`compress_with_options`]. Writes a
/// version 3 header around a complete GPZ stream, or a stored stream when that is not smaller
/// than the values (then `perm` is the identity).
///
/// Errors ([`Error::InvalidArgument`]): a fill value or a given range (gpz measures each axis's
/// range itself), and the errors of [`compress_particles_nd`].
pub fn compress_particles_with_options<T: Element>(
    data: &[T],
    bound: ErrorBound,
    options: &CompressOptions,
) -> Result<(Vec<u8>, Option<Vec<u64>>)> {
    if options.fill_value.is_some() {
        return Err(Error::invalid(
            "gpz does not take a fill value (non-finite coordinates are kept exactly)",
        ));
    }
    if options.range.is_some() {
        return Err(gpz_no_range());
    }
    if matches!(bound, ErrorBound::Rel(_)) {
        return Err(gpz_no_rel());
    }
    let dims = options.dims.unwrap_or(Dims::linear(data.len() as u64));
    if dims.count() != data.len() as u64 {
        return Err(Error::invalid(format!(
            "shape {dims} holds {} values, the data has {}",
            dims.count(),
            data.len()
        )));
    }
    let d = crate::format::gpz_coords(&dims)?;
    // the outer header records the bound over all coordinates (for noa: of the range of all
    // axes together), which each axis's own bound in the GPZ header does not exceed
    let params = QuantParams::derive(data, bound)?;
    let (inner, perm) = gpz::compress_particles(data, d, bound, options.particle_order)?;
    let raw_len = data.len() * T::SIZE;
    let stored_inner = gpz::inspect_particles(&inner)?.stored;
    let header = Header {
        fill_value: None,
        dims: Some(dims),
        ..params_header::<T>(CodecKind::Gpz, data.len(), &params)
    };
    if stored_inner || inner.len() >= raw_len {
        // stored values keep the input order: the permutation is the identity
        let perm = perm.map(|p| (0..p.len() as u64).collect());
        let h = Header {
            flags: FLAG_STORED,
            payload_len: raw_len as u64,
            ..header
        };
        return Ok((stored_stream(data, h), perm));
    }
    let meta = gpz::layout::header_len(d);
    let h = Header {
        payload_len: inner.len() as u64,
        payload_checksum: zhash_bytes(&inner[..meta]),
        meta_len: meta as u32,
        ..header
    };
    let mut out = h.to_vec();
    out.extend_from_slice(&inner);
    Ok((out, perm))
}

/// The body of [`compress`] and [`compress_with_range`]: encode `data` (of shape `dims`, for
/// codecs that use it; `None`: 1-D) under `params` and wrap it in a header (or a stored stream
/// when compression does not pay).
fn compress_with_params<T: Element>(
    data: &[T],
    params: &QuantParams,
    codec: CodecKind,
    dims: Option<Dims>,
) -> Result<Vec<u8>> {
    // shape-aware codecs write version 3 headers, with the shape (1-D by default)
    let dims = codec
        .uses_dims()
        .then(|| dims.unwrap_or(Dims::linear(data.len() as u64)));
    // (pfpl also returns its data checksum, cuszi its metadata length; the others have none)
    let (body, data_checksum, meta_len) = match codec {
        CodecKind::Gpz => {
            // (gpz measures its own ranges: a stream from params alone is one without a fill
            // value or given range, i.e. compress's)
            if params.fill.is_some() {
                return Err(Error::invalid("gpz does not take a fill value"));
            }
            let bound = match params.mode {
                BoundMode::Abs => ErrorBound::Abs(params.bound_value),
                BoundMode::Noa => ErrorBound::Noa(params.bound_value),
                BoundMode::Rel => ErrorBound::Rel(params.bound_value),
            };
            let opts = CompressOptions {
                dims,
                ..CompressOptions::default()
            };
            return Ok(compress_particles_with_options(data, bound, &opts)?.0);
        }
        CodecKind::Aatrox | CodecKind::CuszpPlain | CodecKind::CuszpOutlier => {
            (blocked::encode(data, params, codec), 0, 0)
        }
        CodecKind::Pfpl => {
            let (b, c) = pfpl::encode(data, params);
            (b, c, 0)
        }
        CodecKind::Cuszi => {
            let shape = dims.unwrap_or(Dims::linear(data.len() as u64));
            let e = cuszi::encode(data, &shape, params);
            let body = blocked::Body {
                payload: e.payload,
                n_chunks: e.n_chunks,
                table_checksum: e.table_checksum,
            };
            (body, 0, e.meta_len)
        }
    };
    let raw_len = data.len() * T::SIZE;
    let header = |flags, payload_len: usize, n_chunks, payload_checksum, data_checksum| Header {
        flags,
        payload_len: payload_len as u64,
        n_chunks,
        payload_checksum,
        data_checksum,
        dims,
        ..params_header::<T>(codec, data.len(), params)
    };
    if body.payload.len() < raw_len {
        let mut h = header(
            0,
            body.payload.len(),
            body.n_chunks,
            body.table_checksum,
            data_checksum,
        );
        h.meta_len = meta_len;
        let head = h.to_vec();
        let mut out = Vec::with_capacity(head.len() + body.payload.len());
        out.extend_from_slice(&head);
        out.extend_from_slice(&body.payload);
        Ok(out)
    } else {
        Ok(stored_stream(data, header(FLAG_STORED, raw_len, 0, 0, 0)))
    }
}

/// The header of `count` values of `T` compressed by `codec` under `params` (the mode, bound,
/// step, range and fill value it records) before the payload is known: flags, payload length,
/// chunk count, checksums, shape and metadata length are left 0 / `None` for the caller to set.
/// One constructor for the CPU and GPU encoders, so that they record the parameters alike.
pub(crate) fn params_header<T: Element>(
    codec: CodecKind,
    count: usize,
    params: &QuantParams,
) -> Header {
    Header {
        codec: codec.tag(),
        dtype: T::DTYPE,
        mode: params.mode,
        flags: 0,
        chunk_log2: codec.chunk_log2(T::DTYPE),
        count: count as u64,
        bound_value: params.bound_value,
        abs_bound: params.abs_bound,
        step: params.step,
        range_min: params.range.0,
        range_max: params.range.1,
        payload_len: 0,
        n_chunks: 0,
        payload_checksum: 0,
        data_checksum: 0,
        fill_value: params.fill,
        dims: None,
        meta_len: 0,
    }
}

/// A stream that keeps `data` verbatim (used when compression does not pay).
fn stored_stream<T: Element>(data: &[T], mut h: Header) -> Vec<u8> {
    let hl = h.header_len();
    let mut out = Vec::with_capacity(hl + data.len() * T::SIZE);
    out.resize(hl, 0);
    for &x in data {
        x.write_le(&mut out);
    }
    h.payload_checksum = zhash_bytes(&out[hl..]);
    out[..hl].copy_from_slice(&h.to_vec());
    out
}

/// Limits a decoder applies to untrusted streams: a small stream can claim billions of values
/// (a "decompression bomb"), and the limits are checked before anything is allocated.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct DecodeLimits {
    /// Largest value count accepted (default 2^36).
    pub max_count: u64,
    /// Largest decoded size in bytes (`count * dtype size`) accepted (default
    /// [`DecodeLimits::default_max_bytes`]: the lesser of half the physical memory and 64 GiB).
    pub max_bytes: u64,
}

impl Default for DecodeLimits {
    fn default() -> Self {
        DecodeLimits {
            max_count: 1 << 36,
            max_bytes: Self::default_max_bytes(),
        }
    }
}

/// 64 GiB: the default decode limit's cap, and its value where the memory size is unknown.
const DEFAULT_MAX_BYTES_CAP: u64 = 64 << 30;

impl DecodeLimits {
    /// Accept at most `n` values.
    pub fn with_max_count(mut self, n: u64) -> Self {
        self.max_count = n;
        self
    }
    /// Accept at most `n` decoded bytes (`count * dtype size`).
    pub fn with_max_bytes(mut self, n: u64) -> Self {
        self.max_bytes = n;
        self
    }
    /// No limit beyond what the allocator grants (for trusted streams).
    pub fn unlimited() -> Self {
        DecodeLimits {
            max_count: u64::MAX,
            max_bytes: u64::MAX,
        }
    }
    /// The default byte limit: the lesser of half the physical memory (`MemTotal` of
    /// `/proc/meminfo`) and 64 GiB; 64 GiB where the memory size cannot be read.
    pub fn default_max_bytes() -> u64 {
        static BYTES: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
        *BYTES.get_or_init(|| match physical_memory() {
            Some(m) => (m / 2).min(DEFAULT_MAX_BYTES_CAP),
            None => DEFAULT_MAX_BYTES_CAP,
        })
    }

    /// Checks a header's count and decoded size against the limits.
    fn check(&self, h: &Header) -> Result<()> {
        if h.count > self.max_count {
            return Err(Error::corrupt(format!(
                "stream claims {} values, limit is {}",
                h.count, self.max_count
            )));
        }
        let bytes = h.count.saturating_mul(h.dtype.size() as u64);
        if bytes > self.max_bytes {
            return Err(Error::OutOfMemory(format!(
                "stream decodes to {bytes} bytes ({} values of {}), above the decode limit of \
                 {} bytes (DecodeLimits::with_max_bytes)",
                h.count, h.dtype, self.max_bytes
            )));
        }
        Ok(())
    }
}

/// Physical memory in bytes (`MemTotal` of `/proc/meminfo`), if readable.
fn physical_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let mut it = line["MemTotal:".len()..].split_whitespace();
    let n: u64 = it.next()?.parse().ok()?;
    match it.next() {
        Some("kB") => n.checked_mul(1024),
        None => Some(n),
        _ => None,
    }
}

/// Parse and validate a stream's header (cheap; does not decode).
pub fn inspect(stream: &[u8]) -> Result<Header> {
    let h = Header::parse(stream)?;
    check_codec_fields(&h)?;
    if h.codec == CodecKind::Gpz.tag() && !h.is_stored() {
        gpz_payload_header(stream, &h)?;
    }
    Ok(h)
}

/// The GPZ header of a compressed `gpz` stream whose zcomm header `h` was parsed (FORMAT.md,
/// "gpz"), checked against `h`: a valid, compressed (not stored) GPZ stream that fills the
/// payload, of the same dtype, bound mode and bound value, `N * d == count` with `d` the
/// shape's, and no axis with a bound above `h`'s or (noa) a range outside `h`'s. (What
/// [`inspect`] checks for such a stream; `info` uses it to show the particles and the order.)
///
/// Errors: [`Error::InvalidArgument`] when `h` is not the header of a compressed `gpz` stream
/// (a stored one has no GPZ header), [`Error::Corrupt`] for every failed check.
pub fn gpz_payload_header(stream: &[u8], h: &Header) -> Result<gpz::GpzHeader> {
    if h.codec != CodecKind::Gpz.tag() || h.is_stored() {
        return Err(Error::invalid(
            "not a compressed gpz stream: it has no GPZ header",
        ));
    }
    let payload = stream
        .get(h.header_len()..)
        .ok_or_else(|| Error::corrupt("gpz stream shorter than its header"))?;
    let g = gpz::inspect_particles(payload)?;
    check_gpz_payload(h, &g)?;
    Ok(g)
}

/// The checks of [`gpz_payload_header`] of the parsed GPZ header `g` of a compressed `gpz`
/// stream whose zcomm header is `h` (shared with the GPU decoder, which reads only the headers
/// to the host).
pub(crate) fn check_gpz_payload(h: &Header, g: &gpz::GpzHeader) -> Result<()> {
    let d = crate::format::gpz_coords(&h.shape()).map_err(|e| Error::corrupt(e.to_string()))?;
    let bad = |what: &str| Err(Error::corrupt(format!("gpz payload {what} its header")));
    if g.stored {
        return bad("is a stored GPZ stream inside");
    }
    if g.dtype != h.dtype || g.mode != h.mode || g.bound_value.to_bits() != h.bound_value.to_bits()
    {
        return bad("has another dtype, bound mode or bound value than");
    }
    if g.d != d || g.n.checked_mul(d as u64) != Some(h.count) {
        return bad("holds another particle count or coordinate count than the shape of");
    }
    for a in &g.axes {
        // (an axis without finite values would record (0, 0) outside the others' range, but
        // then every particle is an exception and the stream is stored: never wrapped)
        let range_ok =
            h.mode != BoundMode::Noa || (a.range.0 >= h.range_min && a.range.1 <= h.range_max);
        // (a NaN bound fails too: the GPZ header check refuses one, this keeps it so)
        if a.abs_bound.is_nan() || a.abs_bound > h.abs_bound || !range_ok {
            return bad("has an axis bound or range outside that of");
        }
    }
    Ok(())
}

/// Decode a checked compressed `gpz` stream into `out` (its `count` values).
fn gpz_decode<T: Element>(stream: &[u8], h: &Header, out: &mut [T]) -> Result<()> {
    gpz_payload_header(stream, h)?;
    // (the count was checked against the caller's limits and equals N * d)
    let (vals, _) = gpz::decompress_particles_with_limits::<T>(
        &stream[h.header_len()..],
        DecodeLimits::unlimited(),
    )?;
    if vals.len() != out.len() {
        return Err(Error::corrupt("gpz payload decodes to another value count"));
    }
    out.copy_from_slice(&vals);
    Ok(())
}

/// The codec-specific header checks of [`inspect`] (shared with the GPU decoder, which parses the
/// header with [`Header::parse_fields`] and verifies checksums on the device).
pub(crate) fn check_codec_fields(h: &Header) -> Result<()> {
    // every stream kind names a known codec with its own chunk size (stored streams too)
    let codec = CodecKind::from_tag(h.codec)?;
    if h.chunk_log2 != codec.chunk_log2(h.dtype) {
        return Err(Error::corrupt(format!(
            "chunk_log2 {} unsupported",
            h.chunk_log2
        )));
    }
    // (a compressed rel stream's positive step is a check of Header::parse_fields)
    Ok(())
}

/// Decompress a stream into a new vector. The stream's dtype must be `T`.
pub fn decompress<T: Element>(stream: &[u8]) -> Result<Vec<T>> {
    decompress_with_limits(stream, DecodeLimits::default())
}

/// [`decompress`] with explicit limits for untrusted input.
pub fn decompress_with_limits<T: Element>(stream: &[u8], limits: DecodeLimits) -> Result<Vec<T>> {
    let h = inspect(stream)?;
    check_dtype::<T>(h.dtype)?;
    limits.check(&h)?;
    let n = usize::try_from(h.count)
        .map_err(|_| Error::corrupt(format!("{} values do not fit in memory", h.count)))?;
    let mut out = try_vec::<T>(n)?;
    decode_checked(stream, &h, &mut out)?;
    Ok(out)
}

/// A vector of `n` default values, or [`Error::OutOfMemory`] when the allocation fails (instead
/// of the abort of an unchecked allocation).
fn try_vec<T: Element>(n: usize) -> Result<Vec<T>> {
    let mut out = Vec::new();
    out.try_reserve_exact(n).map_err(|_| {
        Error::OutOfMemory(format!(
            "{n} values of {} ({} bytes)",
            T::DTYPE,
            (n as u128) * T::SIZE as u128
        ))
    })?;
    out.resize(n, T::default());
    Ok(out)
}

/// Values decoded per batch by [`decompress_chunked`] (64 MiB of f32, 128 MiB of f64): a multiple
/// of every codec's chunk size, large enough to keep every thread busy.
const BATCH_VALUES: usize = 1 << 24;

/// Decode a stream batch by batch, handing each batch of consecutive values to `sink` in order:
/// at most `min(count, 2^24)` values are held at once, so a large stream is decoded without a
/// second full-size copy (the caller writes each batch to a file, a socket, a buffer...).
/// (Compressed `cuszi` and `gpz` streams are decoded whole first: cuszi tiles span the array,
/// and gpz streams have no chunk table.)
///
/// Everything [`decompress_with_limits`] checks is checked first (header, `limits`, the chunk
/// table; pfpl: its data checksum over all chunks); each aatrox/cuszp chunk's checksum is
/// verified before that chunk is decoded. On an error, the batches already handed over stay
/// with the caller, and the error is returned (the sink's own errors too, unchanged).
pub fn decompress_chunked<T: Element, F>(
    stream: &[u8],
    limits: DecodeLimits,
    mut sink: F,
) -> Result<u64>
where
    F: FnMut(&[T]) -> Result<()>,
{
    let h = inspect(stream)?;
    check_dtype::<T>(h.dtype)?;
    limits.check(&h)?;
    let count = usize::try_from(h.count)
        .map_err(|_| Error::corrupt(format!("{} values do not fit in memory", h.count)))?;
    if matches!(
        CodecKind::from_tag(h.codec)?,
        CodecKind::Cuszi | CodecKind::Gpz
    ) && !h.is_stored()
    {
        // cuszi tiles do not map to consecutive values, and a gpz preserve block's particles
        // come back through its permutation: decode all, hand over batch by batch
        let mut all = try_vec::<T>(count)?;
        decode_checked(stream, &h, &mut all)?;
        for c in all.chunks(BATCH_VALUES) {
            sink(c)?;
        }
        return Ok(h.count);
    }
    let mut buf = try_vec::<T>(count.min(BATCH_VALUES))?;
    if h.is_stored() {
        for c in stream[h.header_len()..].chunks(BATCH_VALUES * T::SIZE) {
            let n = c.len() / T::SIZE;
            let dst = &mut buf[..n];
            for (o, b) in dst.iter_mut().zip(c.chunks_exact(T::SIZE)) {
                *o = T::read_le(b);
            }
            sink(dst)?;
        }
        return Ok(h.count);
    }
    let params = header_params(&h);
    let codec = CodecKind::from_tag(h.codec)?;
    let entries = h.chunk_table(stream)?;
    let per = 1usize << h.chunk_log2;
    let chunks_per_batch = (BATCH_VALUES / per).max(1);
    for (i, batch) in entries.chunks(chunks_per_batch).enumerate() {
        let first = i * chunks_per_batch;
        let start = first * per;
        let n = (count - start).min(batch.len() * per);
        let dst = &mut buf[..n];
        decode_entries(stream, batch, first, &params, codec, dst)?;
        sink(dst)?;
    }
    Ok(h.count)
}

/// [`decompress_chunked`] into a writer: the decoded values as little-endian bytes (the raw
/// `count * size` bytes of the array), written batch by batch. Returns the number of values
/// written. The writer is not flushed.
///
/// ```
/// use zcomm::{compress, codec::decompress_to_writer, CodecKind, DecodeLimits, ErrorBound};
/// let data: Vec<f64> = (0..100_000).map(|i| (i as f64 * 1e-3).sin()).collect();
/// let s = compress(&data, ErrorBound::Abs(1e-6), CodecKind::Pfpl).unwrap();
/// let mut bytes = Vec::new();
/// let n = decompress_to_writer::<f64, _>(&s, &mut bytes, DecodeLimits::default()).unwrap();
/// assert_eq!((n, bytes.len()), (100_000, 800_000));
/// ```
pub fn decompress_to_writer<T: Element, W: std::io::Write + ?Sized>(
    stream: &[u8],
    out: &mut W,
    limits: DecodeLimits,
) -> Result<u64> {
    let mut bytes: Vec<u8> = Vec::new();
    decompress_chunked::<T, _>(stream, limits, |vals| {
        bytes.clear();
        bytes
            .try_reserve_exact(vals.len() * T::SIZE)
            .map_err(|_| Error::OutOfMemory(format!("{} bytes", vals.len() * T::SIZE)))?;
        for &v in vals {
            v.write_le(&mut bytes);
        }
        out.write_all(&bytes)?;
        Ok(())
    })
}

/// Decompress into `out`, whose length must equal the stream's count.
pub fn decompress_into<T: Element>(stream: &[u8], out: &mut [T]) -> Result<()> {
    let h = inspect(stream)?;
    check_dtype::<T>(h.dtype)?;
    if h.count != out.len() as u64 {
        return Err(Error::Mismatch {
            what: "value count",
            expected: out.len().to_string(),
            found: h.count.to_string(),
        });
    }
    decode_checked(stream, &h, out)
}

/// The error every decoder (CPU and GPU, every stream format) reports when a stream of element
/// type `found` is decoded into values of `T`: one function so that they all word it alike.
pub(crate) fn check_dtype<T: Element>(found: crate::format::Dtype) -> Result<()> {
    if found != T::DTYPE {
        return Err(Error::Mismatch {
            what: "dtype",
            expected: T::DTYPE.to_string(),
            found: found.to_string(),
        });
    }
    Ok(())
}

fn decode_checked<T: Element>(stream: &[u8], h: &Header, out: &mut [T]) -> Result<()> {
    if h.is_stored() {
        for (o, b) in out
            .iter_mut()
            .zip(stream[h.header_len()..].chunks_exact(T::SIZE))
        {
            *o = T::read_le(b);
        }
        return Ok(());
    }
    let params = header_params(h);
    match CodecKind::from_tag(h.codec)? {
        c @ (CodecKind::Aatrox | CodecKind::CuszpPlain | CodecKind::CuszpOutlier) => {
            blocked::decode(stream, h, &params, c, out)
        }
        CodecKind::Pfpl => pfpl::decode(stream, h, &params, out),
        CodecKind::Cuszi => cuszi::decode(stream, h, &params, out),
        CodecKind::Gpz => gpz_decode(stream, h, out),
    }
}

/// The quantizer parameters a header records.
fn header_params(h: &Header) -> QuantParams {
    QuantParams {
        mode: h.mode,
        bound_value: h.bound_value,
        abs_bound: h.abs_bound,
        step: h.step,
        range: (h.range_min, h.range_max),
        fill: h.fill_value,
    }
}

/// Decode chunks `entries` (the first is chunk `first`) of a checked compressed stream into
/// `out` (exactly their values).
fn decode_entries<T: Element>(
    stream: &[u8],
    entries: &[ChunkEntry],
    first: usize,
    params: &QuantParams,
    codec: CodecKind,
    out: &mut [T],
) -> Result<()> {
    match codec {
        CodecKind::Aatrox | CodecKind::CuszpPlain | CodecKind::CuszpOutlier => {
            blocked::decode_entries(stream, entries, first, params, codec, out)
        }
        CodecKind::Pfpl => pfpl::decode_entries(stream, entries, first, params, out),
        // (decompress_chunked decodes cuszi streams whole)
        CodecKind::Cuszi => Err(Error::corrupt("cuszi chunks are not decoded one by one")),
        CodecKind::Gpz => Err(Error::corrupt("gpz streams have no chunk table")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{finite_range, pred};

    /// The codecs that take a given `noa` range (gpz measures each axis's own and refuses one).
    fn given_range_codecs() -> impl Iterator<Item = &'static CodecKind> {
        CodecKind::ALL.iter().filter(|&&c| c != CodecKind::Gpz)
    }

    /// Test inputs of `n` values: smooth, with non-finite values, non-negative with `-0.0`,
    /// constant, all zeros, without finite values.
    fn inputs<T: Element>(n: usize) -> Vec<(&'static str, Vec<T>)> {
        let f = |g: &dyn Fn(usize) -> f64| (0..n).map(|i| T::from_f64(g(i))).collect::<Vec<T>>();
        vec![
            ("smooth", f(&|i| (i as f64 * 1e-3).sin() * 300.0 + 7.0)),
            (
                "specials",
                f(&|i| match i % 97 {
                    0 => f64::NAN,
                    1 => f64::INFINITY,
                    2 => f64::NEG_INFINITY,
                    _ => (i as f64 * 0.01).cos() * 1e3,
                }),
            ),
            (
                "neg-zero-min",
                f(&|i| if i % 5 == 0 { -0.0 } else { (i % 17) as f64 }),
            ),
            ("constant", f(&|_| -2.5)),
            ("zeros", f(&|_| 0.0)),
            ("no-finite", f(&|_| f64::NAN)),
        ]
    }

    fn own_range_is_compress<T: Element>() {
        for n in [0usize, 1, 1000, 40_000] {
            for (name, data) in inputs::<T>(n) {
                let own = finite_range(&data).unwrap_or((0.0, 0.0));
                for b in [ErrorBound::Noa(1e-2), ErrorBound::Noa(1e-5)] {
                    for &c in given_range_codecs() {
                        let want = compress(&data, b, c).unwrap();
                        let got = compress_with_range(&data, b, c, own).unwrap();
                        assert!(got == want, "{name} {} n={n} {c} {b}", T::DTYPE);
                    }
                }
            }
        }
        // a -0.0 given for +0.0 is the same range
        let data: Vec<T> = (0..1000).map(|i| T::from_f64((i % 9) as f64)).collect();
        let b = ErrorBound::Noa(1e-3);
        assert_eq!(
            compress_with_range(&data, b, CodecKind::Aatrox, (-0.0, 8.0)).unwrap(),
            compress(&data, b, CodecKind::Aatrox).unwrap()
        );
    }

    tests_for_f32_and_f64!(own_range_is_compress =>
        given_own_range_equals_compress_f32, given_own_range_equals_compress_f64);

    /// Every finite value within `pred(e * (max - min))` of the given range, non-finite values
    /// bit-exact, and the header records the given range.
    fn check_given<T: Element>(data: &[T], e: f64, c: CodecKind, range: (f64, f64)) {
        let s = compress_with_range(data, ErrorBound::Noa(e), c, range).unwrap();
        let h = inspect(&s).unwrap();
        assert_eq!((h.range_min, h.range_max), range, "{c}");
        let limit = pred(e * (range.1 - range.0));
        assert_eq!(h.abs_bound, limit, "{c}");
        let back: Vec<T> = decompress(&s).unwrap();
        for (x, y) in data.iter().zip(&back) {
            if x.finite() {
                let d = (x.to_f64() - y.to_f64()).abs();
                assert!(d <= limit, "{c} {range:?}: |{x:?} - {y:?}| = {d} > {limit}");
            } else {
                assert_eq!(x.to_bits_u64(), y.to_bits_u64(), "{c}");
            }
        }
    }

    fn given_ranges<T: Element>() {
        let data: Vec<T> = (0..50_000)
            .map(|i| {
                if i % 1001 == 0 {
                    T::from_f64(f64::NAN)
                } else {
                    T::from_f64((i as f64 * 3e-4).sin())
                }
            })
            .collect();
        let own = finite_range(&data).unwrap();
        for &c in given_range_codecs() {
            // wider: a looser absolute bound than the data's own range gives
            check_given(&data, 1e-3, c, (-5.0, 7.0));
            let wide = compress_with_range(&data, ErrorBound::Noa(1e-3), c, (-5.0, 7.0)).unwrap();
            let tight = compress(&data, ErrorBound::Noa(1e-3), c).unwrap();
            assert!(inspect(&wide).unwrap().abs_bound > inspect(&tight).unwrap().abs_bound);
            // narrower than the data (values that do not fit are kept losslessly) and degenerate
            check_given(&data, 1e-3, c, (own.0, own.0 + 1e-3));
            check_given(&data, 1e-3, c, (0.25, 0.25));
            // not even overlapping the data
            check_given(&data, 1e-2, c, (100.0, 101.0));
        }
    }

    tests_for_f32_and_f64!(given_ranges =>
        given_range_bounds_the_error_f32, given_range_bounds_the_error_f64);

    #[test]
    fn given_range_rejects_invalid_arguments() {
        let data: Vec<f32> = (0..100).map(|i| i as f32).collect();
        let c = CodecKind::Aatrox;
        let bad = [
            (ErrorBound::Abs(1e-3), (0.0, 99.0)),
            (ErrorBound::Rel(1e-3), (0.0, 99.0)),
            (ErrorBound::Noa(0.0), (0.0, 99.0)),
            (ErrorBound::Noa(f64::NAN), (0.0, 99.0)),
            (ErrorBound::Noa(1e-3), (f64::NAN, 99.0)),
            (ErrorBound::Noa(1e-3), (0.0, f64::NAN)),
            (ErrorBound::Noa(1e-3), (f64::NEG_INFINITY, 99.0)),
            (ErrorBound::Noa(1e-3), (0.0, f64::INFINITY)),
            (ErrorBound::Noa(1e-3), (99.0, 0.0)),
        ];
        for (b, r) in bad {
            let e = compress_with_range(&data, b, c, r).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument(_)), "{b} {r:?}: {e}");
        }
        let e = compress_with_range(&data, ErrorBound::Abs(1e-3), c, (0.0, 99.0)).unwrap_err();
        assert!(e.to_string().contains("noa"), "{e}");
    }

    /// Particles of `d` coordinates: clustered positions, some NaN and infinite coordinates.
    fn particles(n: usize, d: usize) -> Vec<f32> {
        (0..n * d)
            .map(|i| match i % 997 {
                5 => f32::NAN,
                9 => f32::INFINITY,
                _ => ((i / d * 7919) % 1000) as f32 * 0.01 + (i % d) as f32,
            })
            .collect()
    }

    #[test]
    fn gpz_is_a_dims_aware_codec_with_gpu_kernels() {
        let g = CodecKind::Gpz;
        assert_eq!((g.name(), g.tag()), ("gpz", crate::format::CODEC_GPZ));
        assert_eq!("gpz".parse::<CodecKind>().unwrap(), g);
        assert_eq!(CodecKind::from_tag(6).unwrap(), g);
        assert!(g.uses_dims() && g.has_gpu() && CodecKind::WITH_GPU.contains(&g));
        assert!(!g.supports_bound(ErrorBound::Rel(1e-3)));
        assert!(g.supports_bound(ErrorBound::Noa(1e-3)) && g.supports_bound(ErrorBound::Abs(1.0)));
    }

    #[test]
    fn gpz_stream_round_trips_through_the_generic_api() {
        for d in 1..=4usize {
            let n = 3001;
            let data = particles(n, d);
            for b in [ErrorBound::Abs(1e-3), ErrorBound::Noa(1e-4)] {
                let s = compress_nd(&data, &[n, d], b, CodecKind::Gpz).unwrap();
                let h = inspect(&s).unwrap();
                assert!(!h.is_stored(), "d={d} {b}");
                assert_eq!((h.codec, h.count, h.n_chunks), (6, (n * d) as u64, 0));
                assert_eq!(h.dims.unwrap().as_slice(), &[n as u64, d as u64]);
                assert_eq!(h.meta_len as usize, gpz::layout::header_len(d));
                let g = gpz_payload_header(&s, &h).unwrap();
                assert_eq!((g.n, g.d, g.order), (n as u64, d, gpz::Order::Preserve));
                let back: Vec<f32> = decompress(&s).unwrap();
                for (x, y) in data.iter().zip(&back) {
                    if x.is_finite() {
                        assert!(((x - y).abs() as f64) <= h.abs_bound, "d={d} {b}");
                    } else {
                        assert_eq!(x.to_bits(), y.to_bits());
                    }
                }
                // the same values as the particle API's, through every decoder
                let (want, _) = gpz::decompress_particles::<f32>(&s[h.header_len()..]).unwrap();
                // (bitwise: NaN coordinates)
                let same = |a: &[f32]| {
                    a.iter()
                        .map(|x| x.to_bits())
                        .eq(want.iter().map(|x| x.to_bits()))
                };
                assert!(same(&back));
                let mut into = vec![0f32; n * d];
                decompress_into(&s, &mut into).unwrap();
                assert!(same(&into));
                let mut chunked = Vec::new();
                decompress_chunked::<f32, _>(&s, DecodeLimits::default(), |v| {
                    chunked.extend_from_slice(v);
                    Ok(())
                })
                .unwrap();
                assert!(same(&chunked));
            }
        }
        // 1-D data: N particles of one coordinate, shape [N]
        let data = particles(5000, 1);
        let s = compress(&data, ErrorBound::Abs(1e-2), CodecKind::Gpz).unwrap();
        let h = inspect(&s).unwrap();
        assert_eq!(h.dims.unwrap().as_slice(), &[5000]);
        assert_eq!(gpz_payload_header(&s, &h).unwrap().d, 1);
    }

    #[test]
    fn gpz_reorder_returns_the_permutation_and_stored_streams_the_identity() {
        let (n, d) = (2000usize, 3);
        let data = particles(n, d);
        let b = ErrorBound::Abs(1e-3);
        let (s, perm) = compress_particles_nd(&data, &[n, d], b, gpz::Order::Reorder).unwrap();
        let perm = perm.unwrap();
        let h = inspect(&s).unwrap();
        assert_eq!(
            gpz_payload_header(&s, &h).unwrap().order,
            gpz::Order::Reorder
        );
        let back: Vec<f32> = decompress(&s).unwrap();
        assert!(perm.iter().enumerate().any(|(i, &p)| p != i as u64));
        for (i, &p) in perm.iter().enumerate() {
            for c in 0..d {
                let (x, y) = (data[3 * p as usize + c], back[3 * i + c]);
                assert!(x.to_bits() == y.to_bits() || ((x - y).abs() as f64) <= 1e-3);
            }
        }
        // noise does not compress: a stored stream in input order
        let noise: Vec<f32> = (0..3000u32)
            .map(|i| f32::from_bits(i.wrapping_mul(2_654_435_761) >> 2))
            .collect();
        let (s, perm) = compress_particles_nd(
            &noise,
            &[1000, 3],
            ErrorBound::Abs(1e-30),
            gpz::Order::Reorder,
        )
        .unwrap();
        assert!(inspect(&s).unwrap().is_stored());
        assert_eq!(perm.unwrap(), (0..1000).collect::<Vec<u64>>());
        assert_eq!(decompress::<f32>(&s).unwrap(), noise);
        // the generic API writes preserve streams, the same bytes as compress_nd
        let (s, perm) = compress_particles_nd(&data, &[n, d], b, gpz::Order::Preserve).unwrap();
        assert!(perm.is_none());
        assert_eq!(s, compress_nd(&data, &[n, d], b, CodecKind::Gpz).unwrap());
    }

    /// An axis without finite values beside an axis far from 0: every particle is an exception,
    /// so the stream is stored (the wrapper never holds a GPZ axis range of (0, 0) outside the
    /// header's range), and decodes exactly.
    #[test]
    fn gpz_axis_without_finite_values() {
        let data: Vec<f64> = (0..600)
            .map(|i| {
                if i % 2 == 1 {
                    f64::NAN
                } else {
                    5.0 + (i % 77) as f64 * 0.07
                }
            })
            .collect();
        for b in [ErrorBound::Noa(1e-3), ErrorBound::Abs(1e-3)] {
            let s = compress_nd(&data, &[300, 2], b, CodecKind::Gpz).unwrap();
            assert!(inspect(&s).unwrap().is_stored(), "{b}");
            let back: Vec<f64> = decompress(&s).unwrap();
            assert!(data
                .iter()
                .zip(&back)
                .all(|(x, y)| x.to_bits() == y.to_bits()));
        }
    }

    #[test]
    fn gpz_refuses_what_it_cannot_do() {
        let data = particles(100, 3);
        let bad = |r: Result<Vec<u8>>, what: &str| {
            let e = r.unwrap_err();
            assert!(matches!(e, Error::InvalidArgument(_)), "{what}: {e}");
            assert!(e.to_string().contains(what), "{what}: {e}");
        };
        let g = CodecKind::Gpz;
        bad(compress(&data, ErrorBound::Rel(1e-3), g), "rel");
        bad(
            compress_nd(&data, &[30, 10], ErrorBound::Abs(1.0), g),
            "1 to 4 coordinates",
        );
        bad(
            compress_nd(&data, &[3, 10, 10], ErrorBound::Abs(1.0), g),
            "last",
        );
        bad(
            compress_nd(&data, &[100, 2], ErrorBound::Abs(1.0), g),
            "holds",
        );
        bad(
            compress_with_range(&data, ErrorBound::Noa(1e-3), g, (0.0, 1.0)),
            "range",
        );
        let o = CompressOptions::default().with_fill_value(-1.0);
        bad(
            compress_with_options(&data, ErrorBound::Abs(1.0), g, &o),
            "fill value",
        );
        // other shapes whose last extent is 1..=4: count / d particles
        let s = compress_nd(&data, &[10, 10, 3], ErrorBound::Abs(1e-2), g).unwrap();
        let h = inspect(&s).unwrap();
        assert_eq!(gpz_payload_header(&s, &h).unwrap().n, 100);
    }

    /// Every inconsistency between the zcomm header and the GPZ payload is an error (with all
    /// checksums recomputed, so that the cross-checks are what rejects it).
    #[test]
    fn gpz_header_and_payload_must_agree() {
        let (n, d) = (500usize, 2);
        let data: Vec<f64> = particles(n, d).iter().map(|&x| x as f64).collect();
        let s = compress_nd(&data, &[n, d], ErrorBound::Noa(1e-3), CodecKind::Gpz).unwrap();
        let h = inspect(&s).unwrap();
        let hl = h.header_len();
        // rewrite the outer header (fields set by `f`) and re-checksum it
        let outer = |f: &dyn Fn(&mut Header)| {
            let mut h2 = h;
            f(&mut h2);
            let mut m = h2.to_vec();
            m.extend_from_slice(&s[hl..]);
            m
        };
        // rewrite the GPZ header (fields set by `f`) and re-checksum both
        let inner = |f: &dyn Fn(&mut gpz::GpzHeader)| {
            let mut g = gpz::inspect_particles(&s[hl..]).unwrap();
            f(&mut g);
            let gb = g.to_bytes();
            let mut p = s[hl..].to_vec();
            p[..gb.len()].copy_from_slice(&gb);
            let mut h2 = h;
            h2.payload_checksum = zhash_bytes(&p[..h.meta_len as usize]);
            let mut m = h2.to_vec();
            m.extend_from_slice(&p);
            m
        };
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("bound value", outer(&|h| h.bound_value = 2e-3)),
            ("range", outer(&|h| h.range_max = h.range_min + 1e-3)),
            ("abs bound", outer(&|h| h.abs_bound = 1e-9)),
            (
                "shape",
                outer(&|h| h.dims = Some(Dims::new(&[250, 4]).unwrap())),
            ),
            ("1-D shape", outer(&|h| h.dims = Some(Dims::linear(1000)))),
            (
                "bad d",
                outer(&|h| h.dims = Some(Dims::new(&[100, 10]).unwrap())),
            ),
            ("meta_len", outer(&|h| h.meta_len += 8)),
            ("n_chunks", outer(&|h| h.n_chunks = 16)),
            ("inner n", inner(&|g| g.n -= 1)),
            ("inner bound", inner(&|g| g.bound_value = 2e-3)),
        ];
        for (what, m) in cases {
            assert!(
                inspect(&m).is_err() || decompress::<f64>(&m).is_err(),
                "{what}"
            );
        }
        for cut in [0, 10, 96, hl, hl + 50, s.len() - 1] {
            assert!(decompress::<f64>(&s[..cut]).is_err(), "cut at {cut}");
        }
        assert!(decompress::<f32>(&s).is_err());
    }
}
