//! The AATROX / cuSZp2 chunk layout (FORMAT.md, "aatrox / cuszp chunks"): CPU encoder and decoder.
//!
//! The three codecs share the hierarchical blocking of AATROX — chunks ("warp layers") of 32,768
//! values, iteration layers of 1,024, thread layers of 32 — and differ only in how deltas chain:
//!
//! * `aatrox`: one delta chain across the whole chunk, one initial code per chunk;
//! * `cuszp-plain`: every thread layer restarts from 0 (1-D Lorenzo within a 32-value block);
//! * `cuszp-outlier`: like plain, with the first delta optionally split off as a 1/2/4-byte outlier.
//!
//! Zero thread layers cost nothing beyond their rate byte, and a whole iteration layer of zero
//! thread layers costs one mask bit, so long zero runs compress far beyond 128:1.

use rayon::prelude::*;

use crate::codec::CodecKind;
use crate::element::Element;
use crate::error::{Error, Result};
use crate::format::{u32_at, zhash_bytes, ChunkEntry, Header, TABLE_ENTRY_LEN};
use crate::quant::{QuantParams, Quantizer};
use crate::simd::simd;

/// log2 of values per chunk (AATROX's warp layer, 32 × 32 × 32).
pub const CHUNK_LOG2: usize = 15;
/// Values per chunk.
pub const CHUNK: usize = 1 << CHUNK_LOG2;
/// Values per thread layer.
pub const LAYER: usize = 32;
/// Thread layers per iteration layer.
pub const LAYERS_PER_ITER: usize = 32;
/// Rate byte of a layer stored verbatim.
pub const RATE_RAW: u8 = 0xFF;

/// The encoded chunk table + payloads (everything after the header).
pub struct Body {
    /// Chunk table followed by the chunks.
    pub payload: Vec<u8>,
    /// Number of chunks.
    pub n_chunks: u32,
    /// `zhash` of the chunk table.
    pub table_checksum: u32,
}

/// Encode `data` into a chunk table and chunk payloads (in parallel over chunks).
pub fn encode<T: Element>(data: &[T], params: &QuantParams, codec: CodecKind) -> Body {
    let q = params.quantizer::<T>();
    let chunks: Vec<Vec<u8>> = data
        .par_chunks(CHUNK)
        .map_init(ChunkScratch::default, |s, c| {
            simd(
                #[inline(always)]
                || encode_chunk(c, &q, codec, s),
            )
        })
        .collect();
    Body::from_chunks(&chunks)
}

impl Body {
    /// Lay out encoded chunks behind their table (`size`, `zhash`) as FORMAT.md describes.
    pub fn from_chunks(chunks: &[Vec<u8>]) -> Body {
        let n = chunks.len();
        let total: usize = chunks.iter().map(Vec::len).sum::<usize>() + n * TABLE_ENTRY_LEN;
        let mut payload = Vec::with_capacity(total);
        for c in chunks {
            payload.extend_from_slice(&(c.len() as u32).to_le_bytes());
            payload.extend_from_slice(&zhash_bytes(c).to_le_bytes());
        }
        let table_checksum = zhash_bytes(&payload);
        for c in chunks {
            payload.extend_from_slice(c);
        }
        Body {
            payload,
            n_chunks: n as u32,
            table_checksum,
        }
    }
}

#[derive(Default)]
struct ChunkScratch {
    codes: Vec<i64>,
    raw: Vec<bool>,
}

/// Bits needed for magnitude `m` (0 for 0).
#[inline]
fn bit_width(m: u64) -> u32 {
    64 - m.leading_zeros()
}

#[inline]
fn zigzag(d: i64) -> u64 {
    ((d << 1) ^ (d >> 63)) as u64
}

#[inline]
fn unzigzag(z: u64) -> i64 {
    ((z >> 1) as i64) ^ -((z & 1) as i64)
}

/// Outlier width code and byte count for a zigzagged first delta (None: does not fit 4 bytes).
#[inline]
fn outlier_width(z: u64) -> Option<(u8, usize)> {
    match z {
        0..=0xFF => Some((1, 1)),
        0x100..=0xFFFF => Some((2, 2)),
        0x1_0000..=0xFFFF_FFFF => Some((3, 4)),
        _ => None,
    }
}

#[inline]
fn outlier_bytes(o: u8) -> usize {
    match o {
        0 => 0,
        1 => 1,
        2 => 2,
        _ => 4,
    }
}

#[inline]
fn packed_bytes(b: u32) -> usize {
    if b == 0 {
        0
    } else {
        4 + 4 * b as usize
    }
}

/// Bytes a thread layer of `n_t` values with rate byte `r` occupies.
#[inline]
fn layer_bytes<T: Element>(r: u8, n_t: usize) -> usize {
    if r == RATE_RAW {
        n_t * T::SIZE
    } else {
        outlier_bytes(r >> 6) + packed_bytes((r & 63) as u32)
    }
}

/// Write the sign word and `b` bit planes of 32 deltas. Magnitudes of `b <= 32` bits take a
/// 32-bit path (8 lanes per AVX2 vector instead of 4).
#[inline(always)]
fn pack(deltas: &[i64; LAYER], b: u32, out: &mut Vec<u8>) {
    let mut sign = 0u32;
    for (k, d) in deltas.iter().enumerate() {
        sign |= ((*d < 0) as u32) << k;
    }
    out.extend_from_slice(&sign.to_le_bytes());
    if b <= 32 {
        let mags: [u32; LAYER] = std::array::from_fn(|k| deltas[k].unsigned_abs() as u32);
        for j in 0..b {
            let mut w = 0u32;
            for (k, m) in mags.iter().enumerate() {
                w |= ((m >> j) & 1) << k;
            }
            out.extend_from_slice(&w.to_le_bytes());
        }
    } else {
        let mags: [u64; LAYER] = std::array::from_fn(|k| deltas[k].unsigned_abs());
        for j in 0..b {
            let mut w = 0u32;
            for (k, m) in mags.iter().enumerate() {
                w |= (((m >> j) & 1) as u32) << k;
            }
            out.extend_from_slice(&w.to_le_bytes());
        }
    }
}

/// Inverse of [`pack`]'s planes: the 32 magnitudes stored in `b` plane words at `c[pos..]`.
#[inline(always)]
fn unpack_planes(c: &[u8], pos: usize, b: usize) -> [u64; LAYER] {
    if b <= 32 {
        let mut mags = [0u32; LAYER];
        for j in 0..b {
            let w = u32_at(c, pos + 4 * j);
            for (k, m) in mags.iter_mut().enumerate() {
                *m |= ((w >> k) & 1) << j;
            }
        }
        mags.map(u64::from)
    } else {
        let mut mags = [0u64; LAYER];
        for j in 0..b {
            let w = u32_at(c, pos + 4 * j);
            for (k, m) in mags.iter_mut().enumerate() {
                *m |= (((w >> k) & 1) as u64) << j;
            }
        }
        mags
    }
}

#[inline(always)]
fn encode_chunk<T: Element>(
    vals: &[T],
    q: &Quantizer<T>,
    codec: CodecKind,
    s: &mut ChunkScratch,
) -> Vec<u8> {
    let n = vals.len();
    let n_layers = n.div_ceil(LAYER);
    s.codes.clear();
    s.codes.resize(n_layers * LAYER, 0);
    s.raw.clear();
    s.raw.resize(n_layers, false);
    for (l, layer) in vals.chunks(LAYER).enumerate() {
        let codes = &mut s.codes[l * LAYER..l * LAYER + layer.len()];
        let raw = !q.encode_layer(layer, codes);
        // padding past the end repeats the last code: delta 0
        if layer.len() < LAYER && !raw {
            let last = s.codes[l * LAYER + layer.len() - 1];
            s.codes[l * LAYER + layer.len()..(l + 1) * LAYER].fill(last);
        }
        s.raw[l] = raw;
    }
    let chained = codec == CodecKind::Aatrox;
    let init = if chained {
        s.raw
            .iter()
            .position(|r| !r)
            .map(|l| s.codes[l * LAYER])
            .unwrap_or(0)
    } else {
        0
    };
    // rate bytes and layer payloads
    let mut rates = vec![0u8; n_layers];
    let mut body: Vec<u8> = Vec::with_capacity(n * T::SIZE / 4);
    let mut prev = init;
    let mut deltas = [0i64; LAYER];
    for (l, rate_l) in rates.iter_mut().enumerate() {
        let start = l * LAYER;
        let n_t = (n - start).min(LAYER);
        if s.raw[l] {
            *rate_l = RATE_RAW;
            for &x in &vals[start..start + n_t] {
                x.write_le(&mut body);
            }
            continue;
        }
        let codes = &s.codes[start..start + LAYER];
        let mut p = if chained { prev } else { 0 };
        let mut all = 0u64;
        let mut rest = 0u64;
        for k in 0..LAYER {
            deltas[k] = codes[k].wrapping_sub(p);
            p = codes[k];
            let m = deltas[k].unsigned_abs();
            all |= m;
            if k > 0 {
                rest |= m;
            }
        }
        if chained {
            prev = codes[LAYER - 1];
        }
        let b_all = bit_width(all);
        debug_assert!(b_all <= T::MAX_RATE);
        let mut rate = b_all as u8;
        if codec == CodecKind::CuszpOutlier {
            let z = zigzag(deltas[0]);
            if let Some((o, w)) = outlier_width(z) {
                let b_rest = bit_width(rest);
                if w + packed_bytes(b_rest) < packed_bytes(b_all) {
                    rate = (o << 6) | b_rest as u8;
                    body.extend_from_slice(&z.to_le_bytes()[..w]);
                    deltas[0] = 0;
                }
            }
        }
        let b = (rate & 63) as u32;
        if b > 0 {
            pack(&deltas, b, &mut body);
        }
        *rate_l = rate;
    }
    // assemble: init, mask, rates of non-zero iterations, payloads, padding
    let mut mask = 0u32;
    for (i, it) in rates.chunks(LAYERS_PER_ITER).enumerate() {
        if it.iter().any(|&r| r != 0) {
            mask |= 1 << i;
        }
    }
    let mut out = Vec::with_capacity(16 + 32 * mask.count_ones() as usize + body.len());
    if T::SIZE == 4 {
        out.extend_from_slice(&(init as i32).to_le_bytes());
    } else {
        out.extend_from_slice(&init.to_le_bytes());
    }
    out.extend_from_slice(&mask.to_le_bytes());
    for (i, it) in rates.chunks(LAYERS_PER_ITER).enumerate() {
        if mask & (1 << i) != 0 {
            out.extend_from_slice(it);
            out.resize(out.len() + LAYERS_PER_ITER - it.len(), 0);
        }
    }
    out.extend_from_slice(&body);
    out.resize(out.len().next_multiple_of(4), 0);
    out
}

/// Decode a validated (header-parsed) blocked stream into `out` (`out.len() == h.count`).
pub fn decode<T: Element>(
    stream: &[u8],
    h: &Header,
    params: &QuantParams,
    codec: CodecKind,
    out: &mut [T],
) -> Result<()> {
    let entries = h.chunk_table(stream)?;
    decode_entries(stream, &entries, 0, params, codec, out)
}

/// Decode the chunks `entries` (from [`Header::chunk_table`]; the first is chunk `first` of the
/// stream) into `out`, which holds exactly their values. Each chunk's checksum is verified
/// before it is decoded.
pub fn decode_entries<T: Element>(
    stream: &[u8],
    entries: &[ChunkEntry],
    first: usize,
    params: &QuantParams,
    codec: CodecKind,
    out: &mut [T],
) -> Result<()> {
    if out.len().div_ceil(CHUNK) != entries.len() {
        return Err(Error::corrupt("chunk count does not match the value count"));
    }
    let q = params.quantizer::<T>();
    out.par_chunks_mut(CHUNK)
        .zip(entries.par_iter())
        .enumerate()
        .map(|(i, x)| (first + i, x))
        .try_for_each(|(ci, (dst, e))| {
            let c = &stream[e.offset..e.offset + e.size];
            simd(
                #[inline(always)]
                || decode_chunk(c, e, &q, codec, dst),
            )
            .map_err(|err| Error::corrupt(format!("chunk {ci}: {err}")))
        })
}

#[inline(always)]
fn decode_chunk<T: Element>(
    c: &[u8],
    e: &ChunkEntry,
    q: &Quantizer<T>,
    codec: CodecKind,
    dst: &mut [T],
) -> Result<()> {
    if zhash_bytes(c) != e.checksum {
        return Err(Error::corrupt("checksum mismatch"));
    }
    let n = dst.len();
    let n_layers = n.div_ceil(LAYER);
    let n_iters = n_layers.div_ceil(LAYERS_PER_ITER);
    let head = T::SIZE + 4;
    if c.len() < head {
        return Err(Error::corrupt("chunk shorter than its header"));
    }
    let init = if T::SIZE == 4 {
        u32_at(c, 0) as i32 as i64
    } else {
        i64::from_le_bytes(c[0..8].try_into().expect("8 bytes"))
    };
    let mask = u32_at(c, T::SIZE);
    if n_iters < 32 && mask >> n_iters != 0 {
        return Err(Error::corrupt("mask names iteration layers past the end"));
    }
    if codec != CodecKind::Aatrox && init != 0 {
        return Err(Error::corrupt("non-zero initial code in a cuszp chunk"));
    }
    // rate bytes
    let mut rates = vec![0u8; n_iters * LAYERS_PER_ITER];
    let mut pos = head;
    for i in 0..n_iters {
        if mask & (1 << i) != 0 {
            let r = c
                .get(pos..pos + LAYERS_PER_ITER)
                .ok_or_else(|| Error::corrupt("rate bytes truncated"))?;
            rates[i * LAYERS_PER_ITER..(i + 1) * LAYERS_PER_ITER].copy_from_slice(r);
            pos += LAYERS_PER_ITER;
            if r.iter().all(|&x| x == 0) {
                return Err(Error::corrupt(
                    "mask bit set for an all-zero iteration layer",
                ));
            }
        }
    }
    // validate rates and size before decoding
    let mut size = pos;
    for (l, &r) in rates.iter().enumerate() {
        if l >= n_layers {
            if r != 0 {
                return Err(Error::corrupt("rate byte for a layer past the end"));
            }
            continue;
        }
        if r != RATE_RAW {
            let (b, o) = ((r & 63) as u32, r >> 6);
            if b > T::MAX_RATE || (o != 0 && codec != CodecKind::CuszpOutlier) {
                return Err(Error::corrupt(format!("invalid rate byte {r:#x}")));
            }
        }
        size += layer_bytes::<T>(r, (n - l * LAYER).min(LAYER));
    }
    if size.next_multiple_of(4) != c.len() {
        return Err(Error::corrupt(format!(
            "chunk metadata implies {} bytes, table says {}",
            size.next_multiple_of(4),
            c.len()
        )));
    }
    let chained = codec == CodecKind::Aatrox;
    let mut prev = init;
    let mut deltas = [0i64; LAYER];
    for (l, &r) in rates.iter().enumerate().take(n_layers) {
        let start = l * LAYER;
        let n_t = (n - start).min(LAYER);
        let dst_l = &mut dst[start..start + n_t];
        if r == RATE_RAW {
            for (k, d) in dst_l.iter_mut().enumerate() {
                *d = T::read_le(&c[pos + k * T::SIZE..]);
            }
            pos += n_t * T::SIZE;
            continue;
        }
        let (b, o) = ((r & 63) as u32, r >> 6);
        let ow = outlier_bytes(o);
        let outlier = if ow > 0 {
            let mut z = [0u8; 8];
            z[..ow].copy_from_slice(&c[pos..pos + ow]);
            pos += ow;
            Some(unzigzag(u64::from_le_bytes(z)))
        } else {
            None
        };
        if b > 0 {
            let sign = u32_at(c, pos);
            let mags = unpack_planes(c, pos + 4, b as usize);
            pos += 4 + 4 * b as usize;
            for k in 0..LAYER {
                let m = mags[k] as i64;
                deltas[k] = if (sign >> k) & 1 != 0 {
                    m.wrapping_neg()
                } else {
                    m
                };
            }
        } else {
            deltas = [0; LAYER];
        }
        if let Some(d0) = outlier {
            deltas[0] = deltas[0].wrapping_add(d0);
        }
        let mut p = if chained { prev } else { 0 };
        for (k, d) in dst_l.iter_mut().enumerate() {
            p = p.wrapping_add(deltas[k]);
            *d = q.decode(p);
        }
        if chained {
            // the chain continues from the layer's last code (padding deltas are 0)
            for &dk in &deltas[n_t..] {
                p = p.wrapping_add(dk);
            }
            prev = p;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{compress, decompress};
    use crate::quant::ErrorBound;

    #[test]
    fn all_zero_compresses_beyond_5000() {
        let data = vec![0f32; 1 << 22];
        let s = compress(&data, ErrorBound::Noa(1e-2), CodecKind::Aatrox).unwrap();
        let ratio = (data.len() * 4) as f64 / s.len() as f64;
        assert!(ratio >= 5000.0, "ratio {ratio}");
        assert_eq!(decompress::<f32>(&s).unwrap(), data);
    }

    #[test]
    fn zigzag_round_trip() {
        for d in [0i64, 1, -1, 127, -128, 1 << 40, -(1 << 40)] {
            assert_eq!(unzigzag(zigzag(d)), d);
        }
    }
}

#[cfg(test)]
mod throughput {
    use super::*;
    use crate::quant::ErrorBound;

    /// `cargo test --release --lib throughput -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn single_core_throughput() {
        let n = 1 << 24;
        let data: Vec<f32> = (0..n)
            .map(|i| {
                let x = i as f32 * 1e-4;
                x.sin() * 10.0 + (x * 7.3).cos() + (i % 17) as f32 * 1e-3
            })
            .collect();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        for codec in CodecKind::ALL {
            let bound = ErrorBound::Noa(1e-3);
            let (s, tc) = pool.install(|| {
                let t = std::time::Instant::now();
                let s = crate::codec::compress(&data, bound, *codec).unwrap();
                (s, t.elapsed())
            });
            let td = pool.install(|| {
                let t = std::time::Instant::now();
                let _ = crate::codec::decompress::<f32>(&s).unwrap();
                t.elapsed()
            });
            let gb = (n * 4) as f64 / 1e9;
            println!(
                "{codec}: ratio {:.2} compress {:.2} GB/s decompress {:.2} GB/s",
                (n * 4) as f64 / s.len() as f64,
                gb / tc.as_secs_f64(),
                gb / td.as_secs_f64()
            );
        }
    }
}
