//! `cuszi`: cuSZ-i's multi-level interpolation predictor with rANS coding of the residuals
//! (FORMAT.md, "cuszi"), the CPU encoder and decoder.
//!
//! Pipeline (compression):
//!
//! 1. **anchors** (module `interp`): every `S`-th point per dimension (`S` = 8 in 3-D, 16 in 2-D,
//!    512 in 1-D) is quantized directly by the shared verified quantizer
//!    ([`crate::quant::Quantizer::encode`]) and its code Lorenzo-predicted over the anchor grid;
//! 2. **interpolation**: every other point is predicted from coarser ones by linear or cubic
//!    splines, level by level (strides `S/2 ... 1`), inside its tile's box: either one pass per
//!    dimension, or (multi-dimensional levels) in stages by the point's number of odd
//!    coordinates, as the mean of the splines along them. Each level's mode, pass order and
//!    per-dimension splines are chosen by sampling (cuSZ-i's auto-tuning) and stored in the
//!    stream. Under abs/noa bounds the predictions are made from reconstructed values and the
//!    residual `x - prediction` is quantized (module `quant`: the encoder reconstructs each value
//!    exactly as the decoder will and checks the bound exactly); under rel bounds every value is
//!    quantized first and the integer codes are predicted exactly. A value that cannot be kept
//!    within the bound (NaN, ±Inf, the fill value, a missed bound) is stored losslessly and
//!    stands for its prediction in its neighbours' predictions;
//! 3. **entropy coding** (module `rans`): every residual has a class (its level and pass, known
//!    from its position); the classes' symbol histograms are grouped into a few static frequency
//!    tables, and each chunk of 32,768 residuals (tile after tile) is one rANS stream of four
//!    interleaved states coded with them. Module `entropy` and `huffman` decode the
//!    Huffman-coded streams of the first encoder (coder 0).
//!
//! Memory: the encoder holds an `i64` residual and a class byte per value (and, under rel
//! bounds, a code), the decoder the residuals, the classes and a tile-ordered copy of the output;
//! about 17 bytes per value beyond the input and output.
//!
//! # Block-parallel layout (the CUDA kernel's map)
//!
//! The stream is designed so that a CUDA implementation writes the same bytes:
//!
//! * a tile's residuals depend only on the data inside its box (its `S^d` points plus the halo
//!   at `+S`) and the anchor codes, because halo points lie on faces whose predictions never cross
//!   the face: a thread block per tile (or per 4 tiles, cuSZ-i's 32x8x8) computes them with the
//!   same IEEE f64 operations (no FMA: `--fmad=false`) or integer arithmetic; anchors need one
//!   small pass over the anchor grid first (decoding: an n-D prefix sum of the anchor residuals);
//!   the points of one pass or stage of a level do not depend on each other;
//! * the configuration sampling visits fixed tiles and sums integers (order-independent);
//! * the per-class histogram is an atomic-add kernel; the tables are built on the host from it
//!   (as cuSZ-i builds its codebook) with the deterministic rules of FORMAT.md ("Coders 1 to 3");
//! * each chunk of 32,768 residuals is coded by one thread (its rANS stream is sequential, its
//!   four interleaved states' updates independent; the chunks are independent, and a class
//!   follows from a position); chunk sizes go to the table and offsets follow from a prefix sum
//!   of the sizes, as in the other codecs.
//!
//! Decoding runs the same stages backwards: chunks in parallel, the anchor pass, tiles in
//! parallel (each tile reads its halo residuals from the neighbouring tiles' chunks), and a
//! gather from tile order to the array's order.

pub(crate) mod entropy;
pub(crate) mod grid;
pub(crate) mod huffman;
pub(crate) mod interp;
pub(crate) mod quant;
pub(crate) mod rans;

#[cfg(test)]
pub(crate) mod tests;

use rayon::prelude::*;

use crate::element::Element;
use crate::error::{Error, Result};
use crate::format::{zhash_bytes, BoundMode, Dims, Header, TABLE_ENTRY_LEN};
use crate::quant::{QuantParams, Quantizer};

use entropy::{LOSSLESS, NSYM};
use grid::{Grid, D};
use interp::Level;

/// log2 of residuals per entropy chunk.
pub const CHUNK_LOG2: usize = 15;
/// Residuals per entropy chunk.
pub const CHUNK: usize = 1 << CHUNK_LOG2;

/// The encoded chunk table, metadata and chunks (everything after the header).
pub(crate) struct Encoded {
    /// Chunk table, metadata, chunks.
    pub payload: Vec<u8>,
    /// Number of chunks.
    pub n_chunks: u32,
    /// `zhash` of the chunk table and the metadata.
    pub table_checksum: u32,
    /// Bytes of metadata.
    pub meta_len: u32,
}

/// The index of point `x` of volume `b` in the array (row-major).
#[inline]
fn raster(g: &Grid, b: usize, x: [usize; D]) -> usize {
    b * g.volume() + (x[0] * g.n[1] + x[1]) * g.n[2] + x[2]
}

/// Split `v` into the consecutive per-tile slices of the symbol order.
fn tile_slices<'a, X>(g: &Grid, mut v: &'a mut [X]) -> Vec<(usize, &'a mut [X])> {
    let mut out = Vec::with_capacity(g.n_tiles());
    for t in 0..g.n_tiles() {
        let (_, c) = g.tile_coords(t);
        let n: usize = g.owned(c).iter().product();
        let (a, rest) = std::mem::take(&mut v).split_at_mut(n);
        out.push((t, a));
        v = rest;
    }
    out
}

/// The index within its tile's owned points of box point `x` (`None` for halo points).
#[inline]
fn owned_index(x: [usize; D], e: [usize; D]) -> Option<usize> {
    (x[0] < e[0] && x[1] < e[1] && x[2] < e[2]).then(|| (x[0] * e[1] + x[1]) * e[2] + x[2])
}

/// The prediction stage's output: the level configuration, the residual sequence and the
/// lossless values by residual index.
pub(crate) struct Predicted<T> {
    /// Level configurations, coarsest first.
    pub levels: Vec<Level>,
    /// Residuals in symbol order ([`LOSSLESS`] for lossless values).
    pub res: Vec<i64>,
    /// Lossless values by residual index, sorted.
    pub lossless: Vec<(usize, T)>,
}

/// The residual sequence of `data` of shape `dims` (whose count is `data.len()`).
pub(crate) fn predict<T: Element>(data: &[T], dims: &Dims, params: &QuantParams) -> Predicted<T> {
    let g = Grid::new(dims);
    let q = params.quantizer::<T>();
    let rel = params.mode == BoundMode::Rel;
    // prequantization codes: of every value in the code domain (rel), of the anchors otherwise
    let codes: Vec<i64> = if rel {
        data.par_iter()
            .with_min_len(4096)
            .map(|&x| q.encode(x).unwrap_or(LOSSLESS))
            .collect()
    } else {
        Vec::new()
    };
    let code_at = |gi: usize| {
        if rel {
            codes[gi]
        } else {
            q.encode(data[gi]).unwrap_or(LOSSLESS)
        }
    };
    // anchors: Lorenzo over the anchor grid, in tile order
    let n_tiles = g.n_tiles();
    let mut anchors = vec![0i64; n_tiles];
    let mut anchor_res = vec![0i64; n_tiles];
    for t in 0..n_tiles {
        let (b, c) = g.tile_coords(t);
        let v = code_at(raster(&g, b, c.map(|x| x * g.stride)));
        let p = interp::anchor_prediction(&g, b, c, &anchors);
        let r = v.wrapping_sub(p);
        (anchors[t], anchor_res[t]) = if v == LOSSLESS || r == LOSSLESS {
            (p, LOSSLESS)
        } else {
            (v, r)
        };
    }
    let mut res = vec![0i64; data.len()];
    let (levels, lossless) = if rel {
        let levels = interp::choose_levels(&g, 1.0, |b, x| {
            let v = codes[raster(&g, b, x)];
            (v != LOSSLESS).then_some(v as f64)
        });
        #[cfg(test)]
        let levels = tests::forced_levels(levels);
        let point = |v: i64, p: i64| {
            let r = v.wrapping_sub(p);
            if v == LOSSLESS || r == LOSSLESS {
                (LOSSLESS, p)
            } else {
                (r, v)
            }
        };
        let tiles = Tiles::new(&g, &levels, &anchors, &anchor_res);
        let l = tiles.encode(data, &codes, &mut res, point);
        (levels, l)
    } else {
        let rq = quant::ResidualQuantizer::<T>::new(params);
        let fill = params.fill.map(|f| T::from_f64(f).to_bits_u64());
        let levels = interp::choose_levels(&g, 1.0 / params.step, |b, x| {
            let v = data[raster(&g, b, x)];
            (v.finite() && Some(v.to_bits_u64()) != fill).then(|| v.to_f64())
        });
        #[cfg(test)]
        let levels = tests::forced_levels(levels);
        let values = anchor_values(&q, &anchors);
        let point = |x: T, p: f64| match rq.encode(x, p) {
            Some(c) => c,
            None => (LOSSLESS, finite_or_zero(p)),
        };
        let tiles = Tiles::new(&g, &levels, &values, &anchor_res);
        let l = tiles.encode(data, data, &mut res, point);
        (levels, l)
    };
    Predicted {
        levels,
        res,
        lossless,
    }
}

/// Encode `data` of shape `dims` (whose count is `data.len()`), with coder 3.
pub(crate) fn encode<T: Element>(data: &[T], dims: &Dims, params: &QuantParams) -> Encoded {
    encode_rans(data, dims, params, rans::WAYS)
}

/// Encode with coder 2 ([`rans::WAYS_CODER_2`] states per chunk, the previous encoder's):
/// streams for the tests that older streams still decode.
#[cfg(test)]
pub(crate) fn encode_coder_2<T: Element>(data: &[T], dims: &Dims, params: &QuantParams) -> Encoded {
    encode_rans(data, dims, params, rans::WAYS_CODER_2)
}

/// Encode with coder 1 (one rANS state per chunk, an earlier encoder's): streams for the tests
/// that older streams still decode.
#[cfg(test)]
pub(crate) fn encode_one_state<T: Element>(
    data: &[T],
    dims: &Dims,
    params: &QuantParams,
) -> Encoded {
    encode_rans(data, dims, params, 1)
}

/// Encode with rANS of `ways` interleaved states per chunk (coder 1 for one, coder 2 for
/// [`rans::WAYS_CODER_2`], coder 3 for [`rans::WAYS`]).
fn encode_rans<T: Element>(data: &[T], dims: &Dims, params: &QuantParams, ways: usize) -> Encoded {
    let Predicted {
        levels,
        res,
        lossless,
    } = predict(data, dims, params);
    let g = Grid::new(dims);
    // entropy coding: per-class histograms, tables of grouped classes, one rANS stream per chunk
    let cls = classes(&g, &levels);
    let nc = interp::n_classes(g.levels());
    let hist = res
        .par_chunks(CHUNK)
        .zip(cls.par_chunks(CHUNK))
        .map(|(r, k)| {
            let mut h = vec![vec![0u64; rans::NSYM]; nc];
            for (&r, &k) in r.iter().zip(k) {
                h[k as usize][rans::symbol(r) as usize] += 1;
            }
            h
        })
        .reduce(
            || vec![vec![0u64; rans::NSYM]; nc],
            |mut a, b| {
                for (x, y) in a.iter_mut().zip(b) {
                    for (u, v) in x.iter_mut().zip(y) {
                        *u += v;
                    }
                }
                a
            },
        );
    let (map, freqs) = rans::group_classes(&hist);
    let tables = rans::tables(&freqs);
    let chunks: Vec<Vec<u8>> = res
        .par_chunks(CHUNK)
        .zip(cls.par_chunks(CHUNK))
        .enumerate()
        .map(|(i, (r, k))| {
            let lo = lossless.partition_point(|r| r.0 < i * CHUNK);
            let hi = lossless.partition_point(|r| r.0 < (i + 1) * CHUNK);
            let raw: Vec<T> = lossless[lo..hi].iter().map(|r| r.1).collect();
            rans::write_chunk(r, k, &map, &tables, &raw, ways)
        })
        .collect();
    drop(res);
    let meta = write_meta(&levels, &map, &freqs, ways);
    assemble(chunks, meta)
}

/// Encode with coder 0 (the first version 3 encoder's Huffman coding): streams for the tests
/// that older streams still decode.
#[cfg(test)]
pub(crate) fn encode_huffman<T: Element>(data: &[T], dims: &Dims, params: &QuantParams) -> Encoded {
    let Predicted {
        levels,
        res,
        lossless,
    } = predict(data, dims, params);
    let toks: Vec<(entropy::Tokens, Vec<u64>)> = res
        .par_chunks(CHUNK)
        .map(|c| {
            let mut hist = vec![0u64; NSYM];
            let t = entropy::tokenize(c, &mut hist);
            (t, hist)
        })
        .collect();
    let mut hist = vec![0u64; NSYM];
    for (_, h) in &toks {
        for (a, b) in hist.iter_mut().zip(h) {
            *a += b;
        }
    }
    let lens = huffman::code_lengths(&hist);
    let code_table = huffman::canonical_codes(&lens);
    let chunks: Vec<Vec<u8>> = toks
        .par_iter()
        .enumerate()
        .map(|(i, (t, _))| {
            let lo = lossless.partition_point(|r| r.0 < i * CHUNK);
            let hi = lossless.partition_point(|r| r.0 < (i + 1) * CHUNK);
            let raw: Vec<T> = lossless[lo..hi].iter().map(|r| r.1).collect();
            entropy::write_chunk(t, &code_table, &raw)
        })
        .collect();
    let mut cb = Vec::new();
    huffman::write_lengths(&lens, &mut cb);
    let mut meta = vec![levels.len() as u8, CODER_HUFFMAN];
    meta.extend_from_slice(&(cb.len() as u16).to_le_bytes());
    for lv in &levels {
        meta.extend_from_slice(&lv.to_bytes());
    }
    meta.extend_from_slice(&cb);
    meta.resize(meta.len().next_multiple_of(4), 0);
    assemble(chunks, meta)
}

/// The chunk table, the metadata and the chunks.
fn assemble(chunks: Vec<Vec<u8>>, meta: Vec<u8>) -> Encoded {
    let n = chunks.len();
    let total = n * TABLE_ENTRY_LEN + meta.len() + chunks.iter().map(Vec::len).sum::<usize>();
    let mut payload = Vec::with_capacity(total);
    for c in &chunks {
        payload.extend_from_slice(&(c.len() as u32).to_le_bytes());
        payload.extend_from_slice(&zhash_bytes(c).to_le_bytes());
    }
    payload.extend_from_slice(&meta);
    let table_checksum = zhash_bytes(&payload);
    for c in &chunks {
        payload.extend_from_slice(c);
    }
    Encoded {
        payload,
        n_chunks: n as u32,
        table_checksum,
        meta_len: meta.len() as u32,
    }
}

/// The class of every residual, in symbol order ([`interp::point_class`]). A class depends only
/// on the local coordinates in the tile, so one pattern over the first tile's owned extents
/// (the largest any tile has) serves every tile: whole tiles copy it, edge tiles read their rows
/// from it.
fn classes(g: &Grid, levels: &[Level]) -> Vec<u8> {
    let mut cls = vec![0u8; g.batch * g.volume()];
    if cls.is_empty() {
        return cls;
    }
    let log2s = g.stride.trailing_zeros();
    let full = g.owned([0; D]);
    let mut pattern = Vec::with_capacity(full.iter().product());
    for l0 in 0..full[0] {
        for l1 in 0..full[1] {
            for l2 in 0..full[2] {
                pattern.push(interp::point_class([l0, l1, l2], log2s, levels));
            }
        }
    }
    tile_slices(g, &mut cls)
        .into_par_iter()
        .for_each(|(t, out)| {
            let (_, c) = g.tile_coords(t);
            let e = g.owned(c);
            if e == full {
                out.copy_from_slice(&pattern);
                return;
            }
            let mut rows = out.chunks_exact_mut(e[2]);
            for l0 in 0..e[0] {
                for l1 in 0..e[1] {
                    let at = (l0 * full[1] + l1) * full[2];
                    if let Some(row) = rows.next() {
                        row.copy_from_slice(&pattern[at..at + e[2]]);
                    }
                }
            }
        });
    cls
}

/// The metadata section's coder byte: 0 Huffman (the first version 3 encoder's), 1 rANS with
/// one state per chunk (the second's), 2 rANS with [`rans::WAYS_CODER_2`] interleaved states
/// (the third's), 3 rANS with [`rans::WAYS`] interleaved states (this encoder's).
const CODER_HUFFMAN: u8 = 0;
/// See [`CODER_HUFFMAN`].
const CODER_RANS: u8 = 1;
/// See [`CODER_HUFFMAN`].
const CODER_RANS_INTERLEAVED: u8 = 2;
/// See [`CODER_HUFFMAN`].
const CODER_RANS_WARP: u8 = 3;

/// The metadata section of coders 1 to 3 (`ways` 1, [`rans::WAYS_CODER_2`] or [`rans::WAYS`]):
/// level count (u8), the
/// coder (u8), 0 (u16), two configuration bytes per level (coarsest first), the class count
/// (u8), the table count (u8), the table of every class (u8 each), the tables
/// ([`rans::write_table`]), zero padding to 4 bytes.
pub(crate) fn write_meta(levels: &[Level], map: &[u8], freqs: &[Vec<u32>], ways: usize) -> Vec<u8> {
    let coder = match ways {
        1 => CODER_RANS,
        rans::WAYS_CODER_2 => CODER_RANS_INTERLEAVED,
        _ => CODER_RANS_WARP,
    };
    let mut m = vec![levels.len() as u8, coder, 0, 0];
    for lv in levels {
        m.extend_from_slice(&lv.to_bytes());
    }
    m.push(map.len() as u8);
    m.push(freqs.len() as u8);
    m.extend_from_slice(map);
    for f in freqs {
        rans::write_table(f, &mut m);
    }
    m.resize(m.len().next_multiple_of(4), 0);
    m
}

/// The entropy coder of a stream, from its metadata.
pub(crate) enum Coder {
    /// Coder 0: one canonical Huffman codebook (its code lengths), zero-run symbols.
    Huffman(Vec<u8>),
    /// Coders 1 to 3: rANS with the class-to-table map, the tables and the interleaved states
    /// per chunk (1, [`rans::WAYS_CODER_2`] or [`rans::WAYS`]).
    Rans {
        /// The table of each point class.
        map: Vec<u8>,
        /// The normalized frequencies of each table (checked: summing to the scale).
        freqs: Vec<Vec<u32>>,
        /// Interleaved states per chunk.
        ways: usize,
    },
}

/// Parse and check the metadata section of a stream of grid `g`.
pub(crate) fn read_meta(m: &[u8], g: &Grid) -> Result<(Vec<Level>, Coder)> {
    if m.len() < 4 {
        return Err(Error::corrupt("cuszi metadata shorter than 4 bytes"));
    }
    let n_levels = m[0] as usize;
    if n_levels != g.levels() {
        return Err(Error::corrupt(format!(
            "cuszi metadata names {n_levels} levels, the shape has {}",
            g.levels()
        )));
    }
    let levels_end = 4 + 2 * n_levels;
    let levels = |m: &[u8]| {
        (0..n_levels)
            .map(|i| Level::from_bytes([m[4 + 2 * i], m[5 + 2 * i]]))
            .collect::<Result<Vec<_>>>()
    };
    let padding_ok = |end: usize| m.len() - end < 4 && m[end..].iter().all(|&b| b == 0);
    match m[1] {
        CODER_HUFFMAN => {
            let cb_len = u16::from_le_bytes([m[2], m[3]]) as usize;
            let end = levels_end + cb_len;
            if end > m.len() || !padding_ok(end) {
                return Err(Error::corrupt("cuszi metadata length mismatch"));
            }
            let lens = huffman::read_lengths(&m[levels_end..end], NSYM)?;
            Ok((levels(m)?, Coder::Huffman(lens)))
        }
        CODER_RANS | CODER_RANS_INTERLEAVED | CODER_RANS_WARP => {
            let ways = match m[1] {
                CODER_RANS => 1,
                CODER_RANS_INTERLEAVED => rans::WAYS_CODER_2,
                _ => rans::WAYS,
            };
            let nc = interp::n_classes(n_levels);
            if m[2] != 0 || m[3] != 0 || m.len() < levels_end + 2 + nc {
                return Err(Error::corrupt("cuszi metadata length mismatch"));
            }
            let (n_cls, n_tab) = (m[levels_end] as usize, m[levels_end + 1] as usize);
            let map = m[levels_end + 2..levels_end + 2 + nc].to_vec();
            if n_cls != nc || n_tab == 0 || map.iter().any(|&t| t as usize >= n_tab) {
                return Err(Error::corrupt("invalid cuszi class table map"));
            }
            let mut pos = levels_end + 2 + nc;
            let freqs = (0..n_tab)
                .map(|_| rans::read_table(m, &mut pos))
                .collect::<Result<Vec<_>>>()?;
            if !padding_ok(pos) {
                return Err(Error::corrupt("cuszi metadata length mismatch"));
            }
            Ok((levels(m)?, Coder::Rans { map, freqs, ways }))
        }
        c => Err(Error::corrupt(format!(
            "cuszi metadata names entropy coder {c}; this decoder knows 0 (Huffman), 1, 2 and 3 (rANS)"
        ))),
    }
}

/// Decode a header-checked compressed `cuszi` stream into `out` (`out.len() == h.count`).
pub(crate) fn decode<T: Element>(
    stream: &[u8],
    h: &Header,
    params: &QuantParams,
    out: &mut [T],
) -> Result<()> {
    let dims = h
        .dims
        .ok_or_else(|| Error::corrupt("cuszi stream without a shape"))?;
    if dims.count() != out.len() as u64 {
        return Err(Error::corrupt("shape does not match the value count"));
    }
    let g = Grid::new(&dims);
    let entries = h.chunk_table(stream)?;
    if entries.len() != out.len().div_ceil(CHUNK) {
        return Err(Error::corrupt("chunk count does not match the value count"));
    }
    let meta_at = h.header_len() + entries.len() * TABLE_ENTRY_LEN;
    let (levels, coder) = read_meta(&stream[meta_at..meta_at + h.meta_len as usize], &g)?;
    let mut res = try_alloc::<i64>(out.len())?;
    let cls = match &coder {
        Coder::Rans { .. } => classes(&g, &levels),
        Coder::Huffman(_) => Vec::new(),
    };
    let huff = match &coder {
        Coder::Huffman(lens) => Some(huffman::Decoder::new(lens)),
        Coder::Rans { .. } => None,
    };
    let tables = match &coder {
        Coder::Rans { freqs, .. } => rans::tables(freqs),
        Coder::Huffman(_) => Vec::new(),
    };
    let lossless: Vec<Vec<(usize, T)>> = res
        .par_chunks_mut(CHUNK)
        .zip(entries.par_iter())
        .enumerate()
        .map(|(i, (dst, e))| {
            let c = &stream[e.offset..e.offset + e.size];
            if zhash_bytes(c) != e.checksum {
                return Err(Error::corrupt(format!("chunk {i}: checksum mismatch")));
            }
            let mut raw = Vec::new();
            match (&coder, &huff) {
                (Coder::Rans { map, ways, .. }, _) => {
                    let k = &cls[i * CHUNK..i * CHUNK + dst.len()];
                    rans::read_chunk::<T>(c, k, map, &tables, dst, &mut raw, *ways)
                }
                (_, Some(dec)) => entropy::read_chunk::<T>(c, dec, dst, &mut raw),
                _ => unreachable!("a Huffman stream has its decoder"),
            }
            .map_err(|err| Error::corrupt(format!("chunk {i}: {err}")))?;
            if raw.is_empty() {
                return Ok(Vec::new());
            }
            let at = dst
                .iter()
                .enumerate()
                .filter(|(_, &r)| r == LOSSLESS)
                .map(|(k, _)| i * CHUNK + k);
            Ok(at.zip(raw).collect())
        })
        .collect::<Result<_>>()?;
    drop(cls);
    let lossless: Vec<(usize, T)> = lossless.into_iter().flatten().collect();
    let raw_at = |si: usize| -> T {
        let k = lossless.partition_point(|r| r.0 < si);
        debug_assert!(lossless.get(k).is_some_and(|r| r.0 == si));
        lossless.get(k).map(|r| r.1).unwrap_or_default()
    };
    // anchors, in tile order
    let n_tiles = g.n_tiles();
    let mut anchors = vec![0i64; n_tiles];
    let mut anchor_res = vec![0i64; n_tiles];
    for t in 0..n_tiles {
        let (b, c) = g.tile_coords(t);
        let p = interp::anchor_prediction(&g, b, c, &anchors);
        let r = res[g.tile_offset(b, c)];
        anchors[t] = if r == LOSSLESS { p } else { p.wrapping_add(r) };
        anchor_res[t] = r;
    }
    // tiles, into tile order
    let q = params.quantizer::<T>();
    let mut tiled = try_alloc::<T>(out.len())?;
    if h.mode == BoundMode::Rel {
        let point = |r: i64, p: i64| {
            if r == LOSSLESS {
                (None, p)
            } else {
                let c = p.wrapping_add(r);
                (Some(q.decode(c)), c)
            }
        };
        let tiles = Tiles::new(&g, &levels, &anchors, &anchor_res);
        tiles.decode(&q, &anchors, &res, &raw_at, &mut tiled, point);
    } else {
        let rq = quant::ResidualQuantizer::<T>::new(params);
        let point = |r: i64, p: f64| {
            if r == LOSSLESS {
                (None, finite_or_zero(p))
            } else {
                let v = rq.decode(r, p);
                (Some(v), v.to_f64())
            }
        };
        let values = anchor_values(&q, &anchors);
        let tiles = Tiles::new(&g, &levels, &values, &anchor_res);
        tiles.decode(&q, &anchors, &res, &raw_at, &mut tiled, point);
    }
    drop(res);
    // gather rows from tile order
    let row = g.n[2];
    out.par_chunks_mut(row.max(1))
        .enumerate()
        .for_each(|(ri, dst)| {
            let x1 = ri % g.n[1];
            let x0 = (ri / g.n[1]) % g.n[0];
            let b = ri / (g.n[1] * g.n[0]);
            // the row crosses tiles along the last dimension; each tile holds its part of the
            // row contiguously
            for (c2, part) in dst.chunks_mut(g.stride).enumerate() {
                let at = g.symbol_index(b, [x0, x1, c2 * g.stride]);
                part.copy_from_slice(&tiled[at..at + part.len()]);
            }
        });
    Ok(())
}

/// `v`, or 0 when it is not finite: the value a lossless point (or an anchor whose code does
/// not reconstruct to a finite value) stands for in the predictions of its neighbours.
#[inline(always)]
fn finite_or_zero(v: f64) -> f64 {
    if v.is_finite() {
        v
    } else {
        0.0
    }
}

/// The anchors' values in the value domain: the reconstruction of each anchor code (for a
/// lossless anchor, of its Lorenzo prediction), 0 where it is not finite.
fn anchor_values<T: Element>(q: &Quantizer<T>, anchors: &[i64]) -> Vec<f64> {
    anchors
        .iter()
        .map(|&c| finite_or_zero(q.decode(c).to_f64()))
        .collect()
}

/// The tile passes of one stream: grid, level configuration, the anchors' buffer values (codes
/// or values) and their residuals.
struct Tiles<'a, V> {
    g: &'a Grid,
    levels: &'a [Level],
    anchors: &'a [V],
    anchor_res: &'a [i64],
}

/// One tile's place in the array and the symbol sequence, as the tile passes see it.
struct TileAt {
    /// Volume.
    b: usize,
    /// Box extents (owned points plus the halo).
    e: [usize; D],
    /// Extents of the owned points.
    own: [usize; D],
    /// Array coordinates of the box origin (the anchor).
    o: [usize; D],
    /// Symbol index of the anchor (the first owned point).
    base: usize,
    /// Array index of the anchor.
    origin: usize,
}

impl TileAt {
    /// The symbol index of box point `x` (owned or halo).
    fn symbol_index(&self, g: &Grid, x: [usize; D]) -> usize {
        match owned_index(x, self.own) {
            Some(i) => self.base + i,
            None => g.symbol_index(self.b, std::array::from_fn(|d| self.o[d] + x[d])),
        }
    }

    /// The box rows `(x0, x1)` with their first box index, in box order.
    fn rows(&self) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
        let e = self.e;
        (0..e[0]).flat_map(move |x0| (0..e[1]).map(move |x1| (x0, x1, (x0 * e[1] + x1) * e[2])))
    }
}

/// A tile pass's per-thread buffers, reused from tile to tile: the box of buffer values and one
/// box each of source values and outputs. The passes read and write only these (in L1), and
/// the arrays are touched row by row when a tile is gathered and scattered.
struct BoxBufs<V, S, O> {
    buf: Vec<V>,
    src: Vec<S>,
    out: Vec<O>,
}

impl<V, S, O> Default for BoxBufs<V, S, O> {
    fn default() -> Self {
        BoxBufs {
            buf: Vec::new(),
            src: Vec::new(),
            out: Vec::new(),
        }
    }
}

impl<'a, V: interp::Domain + Default + Send + Sync> Tiles<'a, V> {
    fn new(g: &'a Grid, levels: &'a [Level], anchors: &'a [V], anchor_res: &'a [i64]) -> Self {
        Tiles {
            g,
            levels,
            anchors,
            anchor_res,
        }
    }

    /// Tile `t`'s geometry, with `bufs` sized to its box and `bufs.buf` holding only the
    /// anchors.
    fn open<S: Copy + Default, O: Copy + Default>(
        &self,
        t: usize,
        bufs: &mut BoxBufs<V, S, O>,
    ) -> TileAt {
        let g = self.g;
        let (b, c) = g.tile_coords(t);
        let e = g.boxed(c);
        let o = c.map(|x| x * g.stride);
        let n = e.iter().product();
        bufs.buf.clear();
        bufs.buf.resize(n, V::default());
        bufs.src.resize(n, S::default());
        bufs.out.resize(n, O::default());
        interp::place_anchors(g, b, c, e, self.anchors, &mut bufs.buf);
        TileAt {
            b,
            e,
            own: g.owned(c),
            o,
            base: g.tile_offset(b, c),
            origin: raster(g, b, o),
        }
    }

    /// Residuals of every tile into `res` (tile order); `point(source value, prediction)` gives
    /// a point's residual ([`LOSSLESS`] or a code) and the buffer value its neighbours see. The
    /// source is `src` (array order): the data, or their codes. Returns the lossless values of
    /// `data` by residual index.
    fn encode<T: Element, S: Copy + Default + Send + Sync>(
        &self,
        data: &[T],
        src: &[S],
        res: &mut [i64],
        point: impl Fn(S, V) -> (i64, V) + Sync,
    ) -> Vec<(usize, T)> {
        let g = self.g;
        // array index distance of one step along each dimension
        let ast = [g.n[1] * g.n[2], g.n[2], 1];
        let lossless: Vec<Vec<(usize, T)>> = tile_slices(g, res)
            .into_par_iter()
            .map_init(BoxBufs::<V, S, i64>::default, |bufs, (t, out)| {
                let at = self.open(t, bufs);
                let e = at.e;
                // the box's rows are contiguous in the array
                for (x0, x1, k) in at.rows() {
                    let from = at.origin + x0 * ast[0] + x1 * ast[1];
                    copy_row(&mut bufs.src[k..k + e[2]], &src[from..from + e[2]]);
                }
                let mut raw = Vec::new();
                let BoxBufs {
                    buf,
                    src,
                    out: rbox,
                } = bufs;
                interp::run_passes(buf, e, g.stride, self.levels, |idx, x, p| {
                    let (r, v) = point(src[idx], p);
                    rbox[idx] = r;
                    if r == LOSSLESS {
                        if let Some(i) = owned_index(x, at.own) {
                            let gi = at.origin + x[0] * ast[0] + x[1] * ast[1] + x[2];
                            raw.push((at.base + i, data[gi]));
                        }
                    }
                    v
                });
                rbox[0] = self.anchor_res[t];
                if rbox[0] == LOSSLESS {
                    raw.push((at.base, data[at.origin]));
                }
                copy_owned(&at, rbox, out);
                raw.sort_unstable_by_key(|r| r.0);
                raw
            })
            .collect();
        lossless.into_iter().flatten().collect()
    }

    /// Values of every tile into `tiled` (tile order) from the residuals `res`; `point(residual,
    /// prediction)` gives a point's value (`None`: lossless, `raw_at` of its index) and buffer
    /// value; `codes` are the anchor codes.
    fn decode<T: Element>(
        &self,
        q: &Quantizer<T>,
        codes: &[i64],
        res: &[i64],
        raw_at: &(impl Fn(usize) -> T + Sync),
        tiled: &mut [T],
        point: impl Fn(i64, V) -> (Option<T>, V) + Sync,
    ) {
        let g = self.g;
        tile_slices(g, tiled).into_par_iter().for_each_init(
            BoxBufs::<V, i64, T>::default,
            |bufs, (t, dst)| {
                let at = self.open(t, bufs);
                let (e, own) = (at.e, at.own);
                // each box row: its owned part (contiguous in one tile's symbols), then the halo
                // point past it
                for (x0, x1, k) in at.rows() {
                    let from = at.symbol_index(g, [x0, x1, 0]);
                    copy_row(&mut bufs.src[k..k + own[2]], &res[from..from + own[2]]);
                    if e[2] > own[2] {
                        bufs.src[k + own[2]] = res[at.symbol_index(g, [x0, x1, own[2]])];
                    }
                }
                let BoxBufs { buf, src, out } = bufs;
                interp::run_passes(buf, e, g.stride, self.levels, |idx, x, p| {
                    let (val, v) = point(src[idx], p);
                    out[idx] = match val {
                        Some(val) => val,
                        // (halo values are the neighbouring tiles' to write)
                        None if owned_index(x, own).is_some() => raw_at(at.symbol_index(g, x)),
                        None => T::default(),
                    };
                    v
                });
                out[0] = if src[0] == LOSSLESS {
                    raw_at(at.base)
                } else {
                    q.decode(codes[t])
                };
                copy_owned(&at, out, dst);
            },
        );
    }
}

/// `dst = src` for the rows of a tile (8 to 17 points in 2-D and 3-D): short rows are copied in
/// fixed-size blocks the compiler inlines, since a library call per row costs more than the
/// copy itself.
#[inline(always)]
fn copy_row<X: Copy>(dst: &mut [X], src: &[X]) {
    if dst.len() > 32 {
        dst.copy_from_slice(src);
        return;
    }
    let mut d = dst.chunks_exact_mut(4);
    let mut s = src.chunks_exact(4);
    for (d, s) in (&mut d).zip(&mut s) {
        let v: [X; 4] = [s[0], s[1], s[2], s[3]];
        d.copy_from_slice(&v);
    }
    for (d, &s) in d.into_remainder().iter_mut().zip(s.remainder()) {
        *d = s;
    }
}

/// Copy the owned points of box `bx` (box order) to `dst` (the tile's symbols, in raster order
/// over the owned extents).
fn copy_owned<X: Copy>(at: &TileAt, bx: &[X], dst: &mut [X]) {
    let (e, own) = (at.e, at.own);
    for (r, row) in dst.chunks_exact_mut(own[2]).enumerate() {
        let k = ((r / own[1]) * e[1] + r % own[1]) * e[2];
        copy_row(row, &bx[k..k + own[2]]);
    }
}

/// A vector of `n` default values, or [`Error::OutOfMemory`].
fn try_alloc<X: Default + Clone>(n: usize) -> Result<Vec<X>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| {
        Error::OutOfMemory(format!("{n} values of {} bytes", std::mem::size_of::<X>()))
    })?;
    v.resize(n, X::default());
    Ok(v)
}
