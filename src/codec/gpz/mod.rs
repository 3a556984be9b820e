//! GPZ: an error-bounded codec for particle coordinates (after Li et al., "GPZ: GPU-Accelerated
//! Lossy Compressor for Particle Data"), CPU implementation.
//!
//! Particle arrays (`N` particles × `d = 1..=4` coordinates, AoS) compress poorly with the mesh
//! codecs: neighbours in storage order are not neighbours in space. GPZ works on blocks of 32
//! consecutive particles, in four stages:
//!
//! 1. **Spatial quantisation** (`quantize.rs`): each coordinate becomes an integer code under a
//!    per-axis bound (same rules as the other codecs); within the block the codes are split
//!    into a *segment id* (the cell of a `2^L`-per-axis grid over the block's bounding box) and
//!    an in-segment offset.
//! 2. **Sort** (`sort.rs`): the block's particles are sorted stably by segment id, so particles
//!    of one cell become adjacent.
//! 3. **Encoding** (`runs.rs`, `bitplane.rs`): run-length coding of the sorted ids, delta coding
//!    of the distinct ids, fixed-width (bit-plane) coding of the offsets; the encoder picks the
//!    level `L` that gives the smallest block (`block.rs`).
//! 4. **Compaction** ([`layout`]): blocks of varying size are concatenated behind a table of
//!    their sizes.
//!
//! The stream format is documented in `GPZ-FORMAT.md`; it is not a `ZCMP` stream (the other
//! codecs' format) and has its own magic and version. As [`CodecKind::Gpz`](crate::CodecKind)
//! (`compress_nd(data, &[n, d], bound, CodecKind::Gpz)`, the CLI, the communication layer) a GPZ
//! stream travels wrapped in a version 3 `ZCMP` header (FORMAT.md, "gpz"), which
//! `zcomm::decompress` and `zcomm::inspect` read; [`crate::codec::compress_particles_nd`]
//! writes that form and returns the permutation of a [`Order::Reorder`] stream.
//!
//! # Order
//!
//! Sorting reorders particles within each block. [`Order::Preserve`] (the default) stores each
//! block's permutation (a Lehmer code of at most 129 bits per block, or, when few segments are
//! occupied, each particle's segment-run index) and decompression returns the
//! particles in their original order; the encoder stores no permutation for a block whose sort is
//! the identity, and picks a coarser segmentation where the permutation would cost more than the
//! sort saves. [`Order::Reorder`] stores no permutation: decompression returns the particles in
//! stored order and [`compress_particles`] returns the permutation (`perm[i]` is the original
//! index of output particle `i`).
//!
//! `Reorder` is safe when the particle order carries no meaning of its own, or when every other
//! per-particle array (velocities, ids, masses) is permuted with the same permutation
//! (`v_out[i] = v[perm[i]]`) before it is sent, so that arrays still correspond after decoding.
//! It is not safe when the receiver indexes particles by position against data it already holds
//! (e.g. a ghost-particle list exchanged once and updated by position each step): use `Preserve`
//! there. The permutation never crosses a block: particle `i` moves within `32 * (i / 32) ..`.
//!
//! # Guarantees
//!
//! Every coordinate of every particle decodes within the axis's bound: `abs:E` → `E`, `noa:E` →
//! `E * (max_c - min_c)` over the finite values of axis `c` (the guaranteed bound is recorded in
//! the header). The encoder reconstructs every coordinate exactly as the decoder will and keeps
//! a particle verbatim (as an exception) when any of its coordinates misses the bound or is NaN
//! or ±Inf. `rel` bounds are refused.
//!
//! # GPU mapping
//!
//! The layout is designed for one warp per 32-particle block (lane `j` holds particle `j`):
//! stage 1 is a per-lane quantisation and a warp min/max reduction (`__shfl_down_sync`); stage 2
//! a warp sort of `(segment id, lane)` pairs, evaluated for each candidate level; stage 3 a warp
//! scan of "id differs from the previous lane" flags for the runs, a ballot per offset bit plane
//! and per-lane Lehmer digits or run indices at lane-determined bit positions; every field's bit position
//! follows from widths known to the whole warp, so lanes write their fields independently. Each
//! block is written to a scratch slot and its size to the table; a device-wide prefix sum of the
//! sizes places the blocks and one compaction pass copies them (the paper's three-step
//! compaction). Decoding needs only the block sizes' prefix sum: a warp can take a group of
//! blocks, one lane parsing each block's header, then decode them one after another (the CUDA
//! decoder, `zcomm::gpu::gpz`). Checksums are `zhash` word sums, computed by parallel reduction.
//!
//! ```
//! use zcomm::codec::gpz::{compress_particles, decompress_particles, Order};
//! use zcomm::ErrorBound;
//! let pos: Vec<f32> = (0..3000).map(|i| ((i * 7919) % 1000) as f32 * 0.01).collect();
//! let (stream, perm) = compress_particles(&pos, 3, ErrorBound::Abs(1e-3), Order::Preserve).unwrap();
//! assert!(perm.is_none());
//! let (back, d) = decompress_particles::<f32>(&stream).unwrap();
//! assert_eq!(d, 3);
//! assert!(pos.iter().zip(&back).all(|(a, b)| ((a - b).abs() as f64) <= 1e-3));
//! ```

mod bitplane;
mod block;
pub mod layout;
mod quantize;
mod runs;
mod sort;
#[cfg(test)]
mod tests;

use rayon::prelude::*;

use crate::codec::DecodeLimits;
use crate::element::Element;
use crate::error::{Error, Result};
use crate::format::zhash_bytes;
use crate::quant::{ErrorBound, Quantizer};

use block::{decode_block, encode_block, Ctx};
use layout::{block_offsets, header_len, BLOCK, TABLE_ENTRY_LEN};
pub use layout::{AxisRecord, GpzHeader};

/// The format constants that the CUDA twin (`kernels/gpz.cu`, `#define NAME VALUE`) repeats, by
/// the kernel's name: checked against the kernel source by a test of `gpu::gpz`.
#[cfg(feature = "cuda")]
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) fn kernel_constants() -> Vec<(&'static str, u64)> {
    vec![
        ("GZ_WIDTH_BITS", block::WIDTH_BITS as u64),
        ("GZ_LEVEL_BITS", block::LEVEL_BITS as u64),
        ("GZ_BLOCK", BLOCK as u64),
        // max_level(d) = min(32 / d, GZ_LMAX_CAP)
        ("GZ_LMAX_CAP", quantize::max_level(1) as u64),
        ("GZ_TABLE_ENTRY", TABLE_ENTRY_LEN as u64),
    ]
}

/// Blocks encoded or decoded per parallel task.
const GROUP_BLOCKS: usize = 1024;

/// Particle order of a GPZ stream (see the [module docs](self#order) for when each is safe).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Order {
    /// Decompression restores the original order (each block stores its permutation).
    #[default]
    Preserve,
    /// Decompression returns particles in stored order; compression returns the permutation.
    Reorder,
}

impl Order {
    /// The header tag (0 preserve, 1 reorder).
    pub fn tag(self) -> u8 {
        match self {
            Order::Preserve => 0,
            Order::Reorder => 1,
        }
    }
    /// Parse a header tag.
    pub fn from_tag(t: u8) -> Result<Self> {
        match t {
            0 => Ok(Order::Preserve),
            1 => Ok(Order::Reorder),
            _ => Err(Error::corrupt(format!("unknown gpz order tag {t}"))),
        }
    }
    /// The name used on the command line (`preserve`, `reorder`).
    pub fn name(self) -> &'static str {
        match self {
            Order::Preserve => "preserve",
            Order::Reorder => "reorder",
        }
    }
}

impl std::fmt::Display for Order {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Order {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "preserve" => Ok(Order::Preserve),
            "reorder" => Ok(Order::Reorder),
            _ => Err(Error::invalid(format!(
                "unknown particle order `{s}` (expected preserve or reorder)"
            ))),
        }
    }
}

/// The number of particles in `len` values of `d` coordinates each, or the argument error that
/// both encoders (this one and the GPU's) report for a `d` outside `1..=4` or a partial particle.
pub(crate) fn particle_count(len: usize, d: usize) -> Result<usize> {
    if !(1..=4).contains(&d) {
        return Err(Error::invalid(format!(
            "gpz takes 1 to 4 coordinates per particle, got {d}"
        )));
    }
    if len % d != 0 {
        return Err(Error::invalid(format!(
            "{len} values are not whole particles of {d} coordinates"
        )));
    }
    Ok(len / d)
}

/// Compress `coords`, `N` particles of `d` coordinates each stored particle by particle
/// (`x0 y0 z0 x1 y1 z1 ...`), so that every coordinate decodes within `bound` on its axis.
///
/// Returns the stream and, for [`Order::Reorder`], the permutation: `perm[i]` is the original
/// index of the particle that [`decompress_particles`] returns at position `i` (`None` for
/// [`Order::Preserve`]). Falls back to a stored stream when compression would not pay.
///
/// Errors ([`Error::InvalidArgument`]): `d` outside `1..=4`, `coords.len()` not a multiple of
/// `d`, an invalid or `rel` bound.
pub fn compress_particles<T: Element>(
    coords: &[T],
    d: usize,
    bound: ErrorBound,
    order: Order,
) -> Result<(Vec<u8>, Option<Vec<u64>>)> {
    let n = particle_count(coords.len(), d)?;
    let params = quantize::axis_params(coords, d, bound)?;
    let qz: Vec<Quantizer<T>> = params.iter().map(|p| p.quantizer::<T>()).collect();
    let mut ctx = Ctx {
        d,
        qz: &qz,
        gmin: [0; 4],
        gw: [0; 4],
        preserve: order == Order::Preserve,
        lmax: quantize::max_level(d),
    };
    if let Some(r) = quantize::code_range(coords, d, &qz) {
        for (c, &(lo, hi)) in r.iter().enumerate() {
            ctx.gmin[c] = lo;
            ctx.gw[c] = bitplane::bit_width(hi.wrapping_sub(lo) as u64);
        }
    }
    let axes = params
        .iter()
        .enumerate()
        .map(|(c, p)| AxisRecord {
            abs_bound: p.abs_bound,
            step: p.step,
            range: p.range,
            base: ctx.gmin[c],
            base_width: ctx.gw[c],
        })
        .collect();
    let mut header = GpzHeader::compressed(T::DTYPE, (n, d), bound, order, axes);
    let group_values = GROUP_BLOCKS * BLOCK * d;
    let groups: Vec<(Vec<u8>, Vec<u8>, Vec<u8>)> = coords
        .par_chunks(group_values)
        .map(|g| {
            let mut data = Vec::with_capacity(g.len() * T::SIZE / 2);
            let mut table = Vec::with_capacity(g.len() / (BLOCK * d) * TABLE_ENTRY_LEN + 2);
            let mut slots = vec![0u8; g.len() / d];
            for (b, s) in g.chunks(BLOCK * d).zip(slots.chunks_mut(BLOCK)) {
                let before = data.len();
                encode_block(&ctx, b, &mut data, s);
                table.extend_from_slice(&((data.len() - before) as u16).to_le_bytes());
            }
            (table, data, slots)
        })
        .collect();
    let table_len: usize = groups.iter().map(|g| g.0.len()).sum();
    let data_len: usize = groups.iter().map(|g| g.1.len()).sum();
    let raw_len = coords.len() * T::SIZE;
    let mut out;
    let mut perm = None;
    if table_len + data_len < raw_len {
        out = Vec::with_capacity(header_len(d) + table_len + data_len);
        out.resize(header_len(d), 0);
        for g in &groups {
            out.extend_from_slice(&g.0);
        }
        let data_at = out.len();
        for g in &groups {
            out.extend_from_slice(&g.1);
        }
        header.table_checksum = zhash_bytes(&out[header_len(d)..data_at]);
        header.data_checksum = zhash_bytes(&out[data_at..]);
        if order == Order::Reorder {
            let mut p = Vec::with_capacity(n);
            for (gi, g) in groups.iter().enumerate() {
                for (bi, s) in g.2.chunks(BLOCK).enumerate() {
                    let first = (gi * GROUP_BLOCKS + bi) * BLOCK;
                    p.extend(s.iter().map(|&j| (first + j as usize) as u64));
                }
            }
            perm = Some(p);
        }
    } else {
        drop(groups);
        header.stored = true;
        out = Vec::with_capacity(header_len(d) + raw_len);
        out.resize(header_len(d), 0);
        for &x in coords {
            x.write_le(&mut out);
        }
        header.data_checksum = zhash_bytes(&out[header_len(d)..]);
        if order == Order::Reorder {
            perm = Some((0..n as u64).collect());
        }
    }
    header.payload_len = (out.len() - header_len(d)) as u64;
    out[..header_len(d)].copy_from_slice(&header.to_bytes());
    Ok((out, perm))
}

/// [`compress_particles`] for coordinates stored axis by axis (SoA): `axes[c][i]` is coordinate
/// `c` of particle `i`. Produces the same stream as the interleaved array would.
///
/// Errors ([`Error::InvalidArgument`]): no axes or more than 4, axes of different lengths, and
/// the errors of [`compress_particles`].
pub fn compress_particles_soa<T: Element>(
    axes: &[&[T]],
    bound: ErrorBound,
    order: Order,
) -> Result<(Vec<u8>, Option<Vec<u64>>)> {
    let d = axes.len();
    if !(1..=4).contains(&d) {
        return Err(Error::invalid(format!(
            "gpz takes 1 to 4 coordinate axes, got {d}"
        )));
    }
    let n = axes[0].len();
    if axes.iter().any(|a| a.len() != n) {
        return Err(Error::invalid("gpz coordinate axes differ in length"));
    }
    let mut aos = Vec::with_capacity(n * d);
    for i in 0..n {
        aos.extend(axes.iter().map(|a| a[i]));
    }
    compress_particles(&aos, d, bound, order)
}

/// The largest stream [`compress_particles`] writes for `n` particles of `d` coordinates of
/// `dtype` (a stored stream: the header and the raw values), e.g. to size a receive buffer.
pub fn compress_bound(n: usize, d: usize, dtype: crate::format::Dtype) -> usize {
    header_len(d) + n * d * dtype.size()
}

/// Parse and validate a GPZ stream's header (cheap; does not decode).
pub fn inspect_particles(stream: &[u8]) -> Result<GpzHeader> {
    GpzHeader::parse(stream)
}

/// Decompress a GPZ stream into `N * d` coordinates (AoS) and `d`. The stream's dtype must be
/// `T`. A [`Order::Preserve`] stream decodes in the original order, a [`Order::Reorder`] stream
/// in stored order.
pub fn decompress_particles<T: Element>(stream: &[u8]) -> Result<(Vec<T>, usize)> {
    decompress_particles_with_limits(stream, DecodeLimits::default())
}

/// [`decompress_particles`] into one vector per axis (SoA).
pub fn decompress_particles_soa<T: Element>(stream: &[u8]) -> Result<Vec<Vec<T>>> {
    let (aos, d) = decompress_particles::<T>(stream)?;
    Ok((0..d)
        .map(|c| aos.iter().skip(c).step_by(d).copied().collect())
        .collect())
}

/// [`decompress_particles`] with explicit limits for untrusted input (checked before anything
/// is allocated).
pub fn decompress_particles_with_limits<T: Element>(
    stream: &[u8],
    limits: DecodeLimits,
) -> Result<(Vec<T>, usize)> {
    let h = GpzHeader::parse(stream)?;
    crate::codec::check_dtype::<T>(h.dtype)?;
    let values = h.check_limits(&limits)?;
    let d = h.d;
    let payload = &stream[header_len(d)..];
    if h.stored {
        if values.checked_mul(T::SIZE) != Some(payload.len()) {
            return Err(Error::corrupt(format!(
                "gpz stored stream holds {} bytes for {values} values",
                payload.len()
            )));
        }
        if zhash_bytes(payload) != h.data_checksum {
            return Err(Error::corrupt("gpz stored data checksum mismatch"));
        }
        let out = payload.chunks_exact(T::SIZE).map(T::read_le).collect();
        return Ok((out, d));
    }
    let offsets = block_offsets(&h, payload)?;
    let data = &payload[(offsets.len() - 1) * TABLE_ENTRY_LEN..];
    let qz: Vec<Quantizer<T>> = (0..d).map(|c| h.axis_params(c).quantizer::<T>()).collect();
    let mut ctx = Ctx {
        d,
        qz: &qz,
        gmin: [0; 4],
        gw: [0; 4],
        preserve: h.order == Order::Preserve,
        lmax: quantize::max_level(d),
    };
    for (c, a) in h.axes.iter().enumerate() {
        ctx.gmin[c] = a.base;
        ctx.gw[c] = a.base_width;
    }
    let mut out = Vec::new();
    out.try_reserve_exact(values).map_err(|_| {
        Error::OutOfMemory(format!("{values} values of {} for gpz decoding", T::DTYPE))
    })?;
    out.resize(values, T::default());
    out.par_chunks_mut(GROUP_BLOCKS * BLOCK * d)
        .enumerate()
        .try_for_each(|(gi, g)| {
            for (bi, b) in g.chunks_mut(BLOCK * d).enumerate() {
                let k = gi * GROUP_BLOCKS + bi;
                decode_block(&ctx, &data[offsets[k]..offsets[k + 1]], b)?;
            }
            Ok::<(), Error>(())
        })?;
    Ok((out, d))
}
