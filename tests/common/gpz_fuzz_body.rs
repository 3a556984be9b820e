//! The GPZ decoder fuzz body, shared by `fuzz/fuzz_targets/gpz_decode.rs` (cargo-fuzz) and
//! `tests/gpz.rs` (which runs it over random and mutated streams on stable Rust).
//!
//! Whatever the bytes, decoding must return `Ok` or `Err`, never panic, hang or read out of
//! bounds, and a successful decode must agree with the header.

use zcomm::codec::gpz::layout::header_len;
use zcomm::codec::gpz::{decompress_particles_with_limits, inspect_particles};
use zcomm::format::zhash_bytes;
use zcomm::{DecodeLimits, Dtype};

/// Largest value count the fuzz body lets a stream claim (keeps allocations small).
pub const FUZZ_MAX_COUNT: u64 = 1 << 22;

/// Decode `data` as f32 and as f64 particles; panics only if an invariant is broken.
pub fn decode_any(data: &[u8]) {
    let limits = DecodeLimits::default().with_max_count(FUZZ_MAX_COUNT);
    let header = inspect_particles(data);
    let r32 = decompress_particles_with_limits::<f32>(data, limits);
    let r64 = decompress_particles_with_limits::<f64>(data, limits);
    assert!(
        !(r32.is_ok() && r64.is_ok()),
        "a stream decoded as both f32 and f64"
    );
    let check = |len: usize, d: usize, dtype: Dtype| {
        let h = header.as_ref().expect("decoded stream has a valid header");
        assert_eq!(h.dtype, dtype);
        assert_eq!(h.d, d);
        assert_eq!(h.n * d as u64, len as u64);
    };
    if let Ok((v, d)) = &r32 {
        check(v.len(), *d, Dtype::F32);
    }
    if let Ok((v, d)) = &r64 {
        check(v.len(), *d, Dtype::F64);
    }
}

/// Recompute every checksum of a GPZ stream (header, block table, block data) and its
/// `payload_len`, so that mutations reach the decoder's structural checks instead of stopping
/// at a checksum mismatch. Leaves inputs without a plausible header unchanged.
pub fn reseal(s: &mut [u8]) {
    if s.len() < 48 {
        return;
    }
    let d = s[7] as usize;
    if !(1..=4).contains(&d) || s.len() < header_len(d) {
        return;
    }
    let hl = header_len(d);
    let n = u64::from_le_bytes(s[16..24].try_into().expect("8 bytes"));
    let payload_len = (s.len() - hl) as u64;
    s[32..40].copy_from_slice(&payload_len.to_le_bytes());
    if s[10] & 1 != 0 {
        let h = zhash_bytes(&s[hl..]);
        s[44..48].copy_from_slice(&h.to_le_bytes());
    } else {
        let t = usize::try_from(n.div_ceil(32).saturating_mul(2))
            .unwrap_or(usize::MAX)
            .min(s.len() - hl);
        let th = zhash_bytes(&s[hl..hl + t]);
        let dh = zhash_bytes(&s[hl + t..]);
        s[40..44].copy_from_slice(&th.to_le_bytes());
        s[44..48].copy_from_slice(&dh.to_le_bytes());
    }
    let o = hl - 8;
    let hh = zhash_bytes(&s[..o]);
    s[o..o + 4].copy_from_slice(&hh.to_le_bytes());
}
