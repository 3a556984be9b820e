//! The decoder fuzz body, shared by `fuzz/fuzz_targets/decode.rs` (cargo-fuzz) and the regular
//! test `tests/corruption.rs` (which runs it over random and mutated streams on stable Rust).
//!
//! Whatever the bytes, decoding must return `Ok` or `Err`, never panic, hang or read out of bounds,
//! and a successful decode must agree with the header.

use zcomm::codec::decompress_with_limits;
use zcomm::format::{
    data_checksum, table_entry_len, zhash_bytes, CODEC_GPZ, CODEC_PFPL, HEADER_LEN, HEADER_LEN_V3,
    TABLE_ENTRY_LEN, VERSION_SHAPED,
};
use zcomm::{inspect, DecodeLimits, Dtype};

/// Largest value count the fuzz body lets a stream claim (keeps allocations small).
pub const FUZZ_MAX_COUNT: u64 = 1 << 22;

/// Decode `data` every way the public API allows; panics only if an invariant is broken.
pub fn decode_any(data: &[u8]) {
    let limits = DecodeLimits::default().with_max_count(FUZZ_MAX_COUNT);
    let header = inspect(data);
    let r32 = decompress_with_limits::<f32>(data, limits);
    let r64 = decompress_with_limits::<f64>(data, limits);
    assert!(
        !(r32.is_ok() && r64.is_ok()),
        "a stream decoded as both f32 and f64"
    );
    if let Ok(v) = &r32 {
        let h = header.as_ref().expect("decoded stream has a valid header");
        assert_eq!(h.dtype, Dtype::F32);
        assert_eq!(h.count, v.len() as u64);
    }
    if let Ok(v) = &r64 {
        let h = header.as_ref().expect("decoded stream has a valid header");
        assert_eq!(h.dtype, Dtype::F64);
        assert_eq!(h.count, v.len() as u64);
    }
    if let Ok(h) = &header {
        if h.count <= FUZZ_MAX_COUNT {
            // decompress_into must agree with decompress
            let n = h.count as usize;
            match h.dtype {
                Dtype::F32 => {
                    let mut out = vec![0f32; n];
                    let r = zcomm::decompress_into(data, &mut out);
                    assert_eq!(r.is_ok(), r32.is_ok());
                    if let Ok(v) = &r32 {
                        assert!(same_bits(v, &out));
                    }
                }
                Dtype::F64 => {
                    let mut out = vec![0f64; n];
                    let r = zcomm::decompress_into(data, &mut out);
                    assert_eq!(r.is_ok(), r64.is_ok());
                    if let Ok(v) = &r64 {
                        assert!(same_bits(v, &out));
                    }
                }
            }
            // the chunked decoder accepts exactly what decompress accepts, with the same bytes
            let mut w = Vec::new();
            let (r, ok, bytes) = match h.dtype {
                Dtype::F32 => (
                    zcomm::decompress_to_writer::<f32, _>(data, &mut w, limits),
                    r32.is_ok(),
                    r32.as_ref().map(|v| le_bytes(v)).unwrap_or_default(),
                ),
                Dtype::F64 => (
                    zcomm::decompress_to_writer::<f64, _>(data, &mut w, limits),
                    r64.is_ok(),
                    r64.as_ref().map(|v| le_bytes(v)).unwrap_or_default(),
                ),
            };
            assert_eq!(
                r.is_ok(),
                ok,
                "decompress_to_writer disagrees with decompress"
            );
            if ok {
                assert!(w == bytes, "decompress_to_writer bytes differ");
            }
        }
    }
}

fn le_bytes<T: zcomm::Element>(v: &[T]) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len() * T::SIZE);
    v.iter().for_each(|x| x.write_le(&mut out));
    out
}

fn same_bits<T: zcomm::Element>(a: &[T], b: &[T]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x.to_bits_u64() == y.to_bits_u64())
}

/// Recompute every checksum of a (possibly mutated) stream so that the decoder's structural checks,
/// not its checksums, are what rejects it. Leaves streams too short to have a header alone.
pub fn reseal(s: &mut [u8]) {
    if s.len() < HEADER_LEN {
        return;
    }
    if u16::from_le_bytes([s[4], s[5]]) == VERSION_SHAPED {
        reseal_v3(s);
        return;
    }
    let stored = s[9] & 1 != 0;
    if stored {
        let c = zhash_bytes(&s[HEADER_LEN..]);
        s[76..80].copy_from_slice(&c.to_le_bytes());
    } else if s[6] == CODEC_PFPL {
        // u16 sizes, byte-aligned payloads, one data checksum over the chunk hashes
        let n = u32::from_le_bytes(s[72..76].try_into().unwrap()) as usize;
        let table_end = HEADER_LEN.saturating_add(n.saturating_mul(table_entry_len(CODEC_PFPL)));
        if table_end <= s.len() {
            let mut off = table_end;
            let mut hashes = Vec::with_capacity(n);
            for i in 0..n {
                let e = HEADER_LEN + 2 * i;
                let size = u16::from_le_bytes([s[e], s[e + 1]]) as usize;
                if off.saturating_add(size) > s.len() {
                    break;
                }
                hashes.push(zhash_bytes(&s[off..off + size]));
                off += size;
            }
            if hashes.len() == n {
                s[80..84].copy_from_slice(&data_checksum(&hashes).to_le_bytes());
            }
            let c = zhash_bytes(&s[HEADER_LEN..table_end]);
            s[76..80].copy_from_slice(&c.to_le_bytes());
        }
    } else {
        let n = u32::from_le_bytes(s[72..76].try_into().unwrap()) as usize;
        let table_end = HEADER_LEN.saturating_add(n.saturating_mul(TABLE_ENTRY_LEN));
        if table_end <= s.len() {
            let mut off = table_end;
            for i in 0..n {
                let e = HEADER_LEN + i * TABLE_ENTRY_LEN;
                let size = u32::from_le_bytes(s[e..e + 4].try_into().unwrap()) as usize;
                if off.saturating_add(size) > s.len() {
                    break;
                }
                let c = zhash_bytes(&s[off..off + size]);
                s[e + 4..e + 8].copy_from_slice(&c.to_le_bytes());
                off += size;
            }
            let c = zhash_bytes(&s[HEADER_LEN..table_end]);
            s[76..80].copy_from_slice(&c.to_le_bytes());
        }
    }
    let h = zhash_bytes(&s[..92]);
    s[92..96].copy_from_slice(&h.to_le_bytes());
}

/// [`reseal`] of a version 3 stream (136-byte header; the payload checksum covers the chunk table
/// and the codec metadata that follows it).
fn reseal_v3(s: &mut [u8]) {
    if s.len() < HEADER_LEN_V3 {
        return;
    }
    let hl = HEADER_LEN_V3;
    let at = |s: &[u8], o: usize| u32::from_le_bytes(s[o..o + 4].try_into().unwrap()) as usize;
    if s[9] & 1 != 0 {
        let c = zhash_bytes(&s[hl..]);
        s[76..80].copy_from_slice(&c.to_le_bytes());
    } else {
        if s[6] == CODEC_GPZ {
            // the payload is a GPZ stream: reseal it first (its header is the metadata the
            // payload checksum covers)
            gpz_fuzz_body::reseal(&mut s[hl..]);
        }
        let (n, meta) = (at(s, 72), at(s, 128));
        let first = hl
            .saturating_add(n.saturating_mul(TABLE_ENTRY_LEN))
            .saturating_add(meta);
        if first <= s.len() {
            let mut off = first;
            for i in 0..n {
                let e = hl + i * TABLE_ENTRY_LEN;
                let size = at(s, e);
                if off.saturating_add(size) > s.len() {
                    break;
                }
                let c = zhash_bytes(&s[off..off + size]);
                s[e + 4..e + 8].copy_from_slice(&c.to_le_bytes());
                off += size;
            }
            let c = zhash_bytes(&s[hl..first]);
            s[76..80].copy_from_slice(&c.to_le_bytes());
        }
    }
    let h = zhash_bytes(&s[..132]);
    s[132..136].copy_from_slice(&h.to_le_bytes());
}

/// The GPZ stream's own fuzz body: its `reseal` recomputes the checksums of the payload of a
/// `gpz` stream (the path is relative to this file, so fuzz targets that include this file
/// alone get it too).
#[allow(dead_code)] // (its decoder half serves tests/gpz.rs and the gpz fuzz target)
#[path = "gpz_fuzz_body.rs"]
pub mod gpz_fuzz_body;
