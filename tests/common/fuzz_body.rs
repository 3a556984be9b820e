//! The decoder fuzz body, shared by `fuzz/fuzz_targets/decode.rs` (cargo-fuzz) and the regular
//! test `tests/corruption.rs` (which runs it over random and mutated streams on stable Rust).
//!
//! Whatever the bytes, decoding must return `Ok` or `Err`, never panic, hang or read out of bounds,
//! and a successful decode must agree with the header.

use zcomm::codec::decompress_with_limits;
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
        }
    }
}

fn same_bits<T: zcomm::Element>(a: &[T], b: &[T]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x.to_bits_u64() == y.to_bits_u64())
}
