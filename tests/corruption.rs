//! Corrupt, truncated and mismatched streams: always an `Error`, never a panic, hang or
//! out-of-bounds access.

mod common;

use common::fuzz_body::decode_any;
use common::{gen, reseal, specials, Rng};
use zcomm::codec::decompress_with_limits;
use zcomm::format::{table_entry_len, CODEC_PFPL};
use zcomm::{compress, decompress, decompress_into, CodecKind, DecodeLimits, Error, ErrorBound};

/// A varied set of valid streams: every codec and mode, both dtypes, raw layers, stored streams,
/// several chunks and partial layers.
fn sample_streams() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let f32s: Vec<f32> = gen(1, 70_001, 3);
    let mut with_specials: Vec<f32> = gen(0, 33_000, 4);
    for (i, s) in specials::<f32>().into_iter().enumerate() {
        with_specials[i * 977] = s;
    }
    let f64s: Vec<f64> = gen(7, 40_000, 5);
    let noise: Vec<f32> = gen(3, 5_000, 6); // arbitrary bits: a stored stream
    for &c in CodecKind::ALL {
        for b in [
            ErrorBound::Abs(1e-3),
            ErrorBound::Noa(1e-3),
            ErrorBound::Rel(1e-3),
        ] {
            if !c.supports_bound(b) {
                continue; // (gpz: no rel)
            }
            out.push((
                format!("{c} {b} f32 smooth"),
                compress(&f32s, b, c).unwrap(),
            ));
            out.push((format!("{c} {b} f64 mixed"), compress(&f64s, b, c).unwrap()));
        }
        out.push((
            format!("{c} f32 specials"),
            compress(&with_specials, ErrorBound::Noa(1e-4), c).unwrap(),
        ));
        out.push((
            format!("{c} f32 short"),
            compress(&f32s[..45], ErrorBound::Abs(1e-2), c).unwrap(),
        ));
        out.push((
            format!("{c} f32 empty"),
            compress::<f32>(&[], ErrorBound::Abs(1e-2), c).unwrap(),
        ));
        out.push((
            format!("{c} noise"),
            compress(&noise, ErrorBound::Abs(1e-6), c).unwrap(),
        ));
    }
    out
}

fn decode_checked(name: &str, s: &[u8]) -> bool {
    // the stream's own dtype; a mismatching one must fail anyway
    let h = zcomm::inspect(s);
    let ok = match h.map(|h| h.dtype) {
        Ok(zcomm::Dtype::F64) => decompress::<f64>(s).is_ok(),
        _ => decompress::<f32>(s).is_ok(),
    };
    let _ = name;
    ok
}

#[test]
fn samples_are_valid() {
    let streams = sample_streams();
    assert!(streams
        .iter()
        .any(|(_, s)| zcomm::inspect(s).unwrap().is_stored()));
    assert!(streams
        .iter()
        .any(|(_, s)| !zcomm::inspect(s).unwrap().is_stored()));
    for (name, s) in &streams {
        assert!(decode_checked(name, s), "{name}: valid stream rejected");
    }
}

#[test]
fn every_truncation_is_an_error() {
    for (name, s) in sample_streams() {
        for n in 0..s.len() {
            assert!(
                !decode_checked(&name, &s[..n]),
                "{name}: truncation to {n} of {} accepted",
                s.len()
            );
        }
        let mut longer = s.clone();
        longer.push(0);
        assert!(
            !decode_checked(&name, &longer),
            "{name}: stream with a trailing byte accepted"
        );
        longer.extend_from_slice(&[0; 3]);
        assert!(
            !decode_checked(&name, &longer),
            "{name}: stream with 4 trailing bytes accepted"
        );
    }
}

#[test]
fn every_single_bit_flip_of_a_small_stream_is_an_error() {
    let data: Vec<f32> = gen(7, 1_500, 8);
    for &c in CodecKind::ALL {
        let s = compress(&data, ErrorBound::Noa(1e-3), c).unwrap();
        for i in 0..s.len() * 8 {
            let mut m = s.clone();
            m[i / 8] ^= 1 << (i % 8);
            assert!(
                !decode_checked("", &m),
                "{c}: flip of bit {} of byte {} accepted",
                i % 8,
                i / 8
            );
        }
    }
}

#[test]
fn thousands_of_random_single_bit_flips_are_errors() {
    let mut r = Rng(0xF11F);
    let streams = sample_streams();
    let mut tried = 0;
    for (name, s) in &streams {
        for _ in 0..300 {
            let mut m = s.clone();
            let bit = r.below(m.len() as u64 * 8);
            m[(bit / 8) as usize] ^= 1 << (bit % 8);
            tried += 1;
            assert!(
                !decode_checked(name, &m),
                "{name}: flip of bit {} of byte {} accepted",
                bit % 8,
                bit / 8
            );
        }
    }
    assert!(tried > 10_000, "only {tried} corrupted streams tried");
}

/// Several flipped bits in one stream must not cancel in the checksums (zhash's per-word mix is
/// nonlinear: see `two_opposite_flips_of_the_same_bit_are_detected`).
#[test]
fn thousands_of_random_multi_bit_flips_are_errors() {
    let mut r = Rng(0xF11F);
    let streams = sample_streams();
    let mut accepted = Vec::new();
    let mut tried = 0;
    for (name, s) in &streams {
        for _ in 0..300 {
            let mut m = s.clone();
            let flips = 2 + r.below(3);
            let mut bits = Vec::new();
            for _ in 0..flips {
                let bit = r.below(m.len() as u64 * 8);
                bits.push(bit);
                m[(bit / 8) as usize] ^= 1 << (bit % 8);
            }
            if m == *s {
                continue; // the same bit flipped twice
            }
            tried += 1;
            if decode_checked(name, &m) {
                accepted.push(format!("{name}: bits {bits:?}"));
            }
        }
    }
    assert!(tried > 10_000, "only {tried} corrupted streams tried");
    assert!(
        accepted.is_empty(),
        "{} of {tried} multi-bit corruptions accepted, e.g.\n{}",
        accepted.len(),
        accepted[..accepted.len().min(5)].join("\n")
    );
}

#[test]
fn wrong_dtype_and_count_are_mismatch_errors() {
    let data: Vec<f32> = gen(0, 1000, 1);
    let data64: Vec<f64> = gen(0, 1000, 1);
    for &c in CodecKind::ALL {
        for s32 in [
            compress(&data, ErrorBound::Noa(1e-3), c).unwrap(),
            compress(&gen::<f32>(3, 100, 2), ErrorBound::Abs(1e-9), c).unwrap(), // stored
        ] {
            match decompress::<f64>(&s32) {
                Err(Error::Mismatch { what, .. }) => assert_eq!(what, "dtype"),
                other => panic!("{c}: f32 stream decoded as f64: {other:?}"),
            }
            let n = zcomm::inspect(&s32).unwrap().count as usize;
            for wrong in [0, n - 1, n + 1, 2 * n] {
                let mut out = vec![0f32; wrong];
                match decompress_into(&s32, &mut out) {
                    Err(Error::Mismatch { what, .. }) => assert_eq!(what, "value count"),
                    other => panic!("{c}: count {n} stream into {wrong} values: {other:?}"),
                }
            }
            let mut out64 = vec![0f64; n];
            assert!(matches!(
                decompress_into(&s32, &mut out64),
                Err(Error::Mismatch { .. })
            ));
        }
        // (a rel stream where the codec takes rel bounds: gpz does not)
        let b64 = if c.supports_bound(ErrorBound::Rel(1e-3)) {
            ErrorBound::Rel(1e-3)
        } else {
            ErrorBound::Abs(1e-3)
        };
        let s64 = compress(&data64, b64, c).unwrap();
        assert!(matches!(
            decompress::<f32>(&s64),
            Err(Error::Mismatch { what: "dtype", .. })
        ));
    }
}

#[test]
fn decode_limits_are_enforced() {
    let data = vec![0f32; 100_000];
    let s = compress(&data, ErrorBound::Abs(1e-3), CodecKind::Aatrox).unwrap();
    let lim = DecodeLimits::default().with_max_count(99_999);
    assert!(decompress_with_limits::<f32>(&s, lim).is_err());
    let lim = DecodeLimits::default().with_max_count(100_000);
    assert_eq!(decompress_with_limits::<f32>(&s, lim).unwrap(), data);
}

/// Mutations that keep every checksum valid, so the structural checks must catch them (or the
/// stream decodes to something, which is allowed: garbage in, garbage out, but no panic).
#[test]
fn resealed_mutations_never_panic() {
    let mut r = Rng(0x5EA1);
    let streams = sample_streams();
    let mut rejected = 0usize;
    let mut total = 0usize;
    for (name, s) in &streams {
        for _ in 0..400 {
            let mut m = s.clone();
            match r.below(6) {
                // random bytes anywhere
                0 => {
                    for _ in 0..1 + r.below(3) {
                        let i = r.below(m.len() as u64) as usize;
                        m[i] = r.next_u64() as u8;
                    }
                }
                // header fields: codec, dtype, mode, flags, chunk_log2, count, n_chunks
                1 => {
                    let fields: [(usize, usize); 9] = [
                        (6, 1),
                        (7, 1),
                        (8, 1),
                        (9, 1),
                        (10, 2),
                        (16, 8),
                        (40, 8),
                        (64, 8),
                        (72, 4),
                    ];
                    let (o, w) = fields[r.below(9) as usize];
                    let v = r.next_u64().to_le_bytes();
                    let small = (r.below(5) as u8).to_le_bytes();
                    if r.below(2) == 0 {
                        m[o..o + w].copy_from_slice(&v[..w]);
                    } else {
                        m[o..o + w].fill(0);
                        m[o] = small[0];
                    }
                }
                // chunk table sizes (pfpl: u16 sizes of any value; others: u32 multiples of 4)
                2 => {
                    let n = u32::from_le_bytes(m[72..76].try_into().unwrap()) as usize;
                    if n > 0 && m[9] & 1 == 0 {
                        let e = 96 + table_entry_len(m[6]) * r.below(n as u64) as usize;
                        if m[6] == CODEC_PFPL {
                            let d = r.below(9) as i64 - 4;
                            let v = (u16::from_le_bytes([m[e], m[e + 1]]) as i64 + d).max(0);
                            m[e..e + 2].copy_from_slice(&(v as u16).to_le_bytes());
                        } else {
                            let d = (r.below(9) as i64 - 4) * 4;
                            let v = (u32::from_le_bytes(m[e..e + 4].try_into().unwrap()) as i64
                                + d)
                                .max(0);
                            m[e..e + 4].copy_from_slice(&(v as u32).to_le_bytes());
                        }
                    }
                }
                // the first bytes of a chunk: init, mask, rate bytes (pfpl: the bitmaps)
                3 => {
                    let n = u32::from_le_bytes(m[72..76].try_into().unwrap()) as usize;
                    let start = 96 + table_entry_len(m[6]) * n;
                    if start + 48 < m.len() {
                        let i = start + r.below(48) as usize;
                        m[i] = match r.below(4) {
                            0 => 0xFF,
                            1 => 0,
                            2 => r.below(64) as u8 | 0xC0,
                            _ => r.next_u64() as u8,
                        };
                    }
                }
                // truncate or extend and fix payload_len
                4 => {
                    let new_len = 96 + r.below(m.len() as u64 + 64) as usize;
                    m.resize(new_len, r.next_u64() as u8);
                    let pl = (new_len - 96) as u64;
                    m[64..72].copy_from_slice(&pl.to_le_bytes());
                }
                // swap two 4-byte words
                _ => {
                    let a = r.below(m.len() as u64 / 4) as usize * 4;
                    let b = r.below(m.len() as u64 / 4) as usize * 4;
                    for k in 0..4 {
                        m.swap(a + k, b + k);
                    }
                }
            }
            reseal(&mut m);
            total += 1;
            let res = std::panic::catch_unwind(|| decode_any(&m));
            assert!(
                res.is_ok(),
                "{name}: decoder panicked on a resealed mutation"
            );
            if !decode_checked(name, &m) {
                rejected += 1;
            }
        }
    }
    eprintln!("resealed mutations: {rejected} of {total} rejected");
    assert!(
        rejected > total / 4,
        "structural checks reject too few mutations: {rejected}/{total}"
    );
}

/// The fuzz target's body over random byte strings (with and without a plausible header).
#[test]
fn fuzz_body_on_random_inputs() {
    let mut r = Rng(0xF022);
    let valid = sample_streams();
    for i in 0..20_000 {
        let len = r.below(if i % 2 == 0 { 200 } else { 4000 }) as usize;
        let mut b: Vec<u8> = (0..len).map(|_| r.next_u64() as u8).collect();
        if i % 3 == 0 && b.len() >= 96 {
            // graft a real header so parsing goes further
            let (_, s) = &valid[r.below(valid.len() as u64) as usize];
            b[..96].copy_from_slice(&s[..96]);
            let pl = (b.len() - 96) as u64;
            b[64..72].copy_from_slice(&pl.to_le_bytes());
            reseal(&mut b);
        }
        decode_any(&b);
    }
    for (_, s) in &valid {
        decode_any(s);
    }
}

/// zhash is a sum of per-word terms (so that a GPU warp can reduce it in any order). With a
/// linear per-word mix, flipping the same bit in two words, 0->1 in one and 1->0 in the other,
/// changes the two terms by exactly opposite amounts and the checksum not at all (148 of 640 such
/// pairs passed unnoticed with the former `rotl(.., 13) * K` mix); the nonlinear fmix32 mix of
/// `zhash_mix` makes such cancellations as rare as any other 32-bit collision.
#[test]
fn two_opposite_flips_of_the_same_bit_are_detected() {
    let data: Vec<f32> = gen(1, 70_001, 3);
    let s = compress(&data, ErrorBound::Abs(1e-3), CodecKind::Aatrox).unwrap();
    let n = zcomm::inspect(&s).unwrap().n_chunks as usize;
    let start = 96 + 8 * n;
    let mut accepted = Vec::new();
    let mut tried = 0;
    for bit in 0..32 {
        // pairs of words in the payload, with the bit set in one and clear in the other
        let word =
            |k: usize| u32::from_le_bytes(s[start + 4 * k..start + 4 * k + 4].try_into().unwrap());
        let words = (s.len() - start) / 4;
        let mut pairs = 0;
        for a in (0..words).step_by(97) {
            let b = a + 1 + (a * 7919) % 200;
            if b >= words || (word(a) >> bit) & 1 == (word(b) >> bit) & 1 {
                continue;
            }
            let mut m = s.clone();
            m[start + 4 * a + bit / 8] ^= 1 << (bit % 8);
            m[start + 4 * b + bit / 8] ^= 1 << (bit % 8);
            tried += 1;
            if decode_checked("", &m) {
                accepted.push((bit, a, b));
            }
            pairs += 1;
            if pairs == 20 {
                break;
            }
        }
    }
    assert!(tried > 200);
    assert!(
        accepted.is_empty(),
        "{} of {tried} double flips accepted (bit, word a, word b after the chunk table): {:?}",
        accepted.len(),
        &accepted[..accepted.len().min(10)]
    );
}

/// Overwrite `bytes` at `off`, reseal every checksum, and check that `inspect`, `decompress`
/// and the chunked decoder all reject the stream.
fn assert_field_rejected(name: &str, s: &[u8], off: usize, bytes: &[u8]) {
    let mut m = s.to_vec();
    m[off..off + bytes.len()].copy_from_slice(bytes);
    reseal(&mut m);
    let what = format!("{name}: bytes {bytes:02x?} at offset {off}");
    assert!(zcomm::inspect(&m).is_err(), "{what}: inspect accepted it");
    assert!(
        decompress::<f32>(&m).is_err(),
        "{what}: decompress f32 accepted it"
    );
    assert!(
        decompress::<f64>(&m).is_err(),
        "{what}: decompress f64 accepted it"
    );
    let mut sink = Vec::new();
    let r = zcomm::decompress_to_writer::<f32, _>(&m, &mut sink, DecodeLimits::default());
    assert!(r.is_err(), "{what}: decompress_to_writer accepted it");
    decode_any(&m);
}

/// Every header field is validated for stored and compressed streams alike (a stored stream used
/// to skip the codec, chunk_log2, bound and step checks).
#[test]
fn invalid_header_fields_are_rejected_for_every_stream_kind() {
    let noise: Vec<f32> = gen(3, 5_000, 6);
    let smooth: Vec<f32> = gen(1, 5_000, 3);
    let smooth64: Vec<f64> = gen(1, 5_000, 3);
    let mut streams = Vec::new();
    for &c in CodecKind::ALL {
        for b in [
            ErrorBound::Abs(1e-3),
            ErrorBound::Noa(1e-3),
            ErrorBound::Rel(1e-3),
        ] {
            if !c.supports_bound(b) {
                continue; // (gpz: no rel)
            }
            let st = compress(&noise, ErrorBound::Abs(1e-30), c).unwrap();
            assert_eq!(st[9] & 1, 1, "{c}: noise is stored");
            streams.push((format!("{c} {b} stored"), st));
            streams.push((format!("{c} {b} f32"), compress(&smooth, b, c).unwrap()));
            streams.push((format!("{c} {b} f64"), compress(&smooth64, b, c).unwrap()));
        }
        if c == CodecKind::Gpz {
            continue; // (no fill values)
        }
        let o = zcomm::CompressOptions::default().with_fill_value(-1e10);
        let s = zcomm::compress_with_options(&smooth, ErrorBound::Noa(1e-3), c, &o).unwrap();
        streams.push((format!("{c} fill"), s));
    }
    let f = |v: f64| v.to_le_bytes();
    for (name, s) in &streams {
        // sanity: the stream itself is valid
        assert!(zcomm::inspect(s).is_ok(), "{name}");
        let mode = s[8];
        let mut bad: Vec<(usize, Vec<u8>)> = vec![
            (6, vec![0]), // codec tags
            (6, vec![7]),
            (6, vec![0xFF]),
            (7, vec![3]), // dtype
            (8, vec![0]), // mode
            (8, vec![4]),
            (9, vec![s[9] | 4]), // unknown flag bits
            (9, vec![s[9] | 0x80]),
            (10, 100u16.to_le_bytes().to_vec()), // chunk_log2
            (10, 0u16.to_le_bytes().to_vec()),
            (10, 64u16.to_le_bytes().to_vec()),
            (
                10,
                (u16::from_le_bytes([s[10], s[11]]) ^ 1)
                    .to_le_bytes()
                    .to_vec(),
            ),
            (12, vec![1]),              // reserved
            (24, f(f64::NAN).to_vec()), // bound value
            (24, f(-1e-3).to_vec()),
            (24, f(0.0).to_vec()),
            (24, f(f64::INFINITY).to_vec()),
            (32, f(f64::NAN).to_vec()), // absolute bound
            (32, f(-1.0).to_vec()),
            (32, f(f64::INFINITY).to_vec()),
            (40, f(f64::NAN).to_vec()), // step
            (40, f(-0.5).to_vec()),
            (40, f(f64::INFINITY).to_vec()),
            (48, f(f64::NAN).to_vec()), // range
            (56, f(f64::NEG_INFINITY).to_vec()),
        ];
        if mode == 3 {
            bad.push((24, f(1.0).to_vec())); // rel bound >= 1
        }
        if mode == 2 {
            // min > max
            let mut lohi = s[56..64].to_vec();
            lohi.extend_from_slice(&s[48..56]);
            if s[48..56] != s[56..64] {
                bad.push((48, lohi));
            }
        } else {
            bad.push((48, f(1.0).to_vec())); // abs/rel streams carry no range
            bad.push((32, f(0.5).to_vec())); // abs/rel: the absolute bound repeats E
        }
        if s[9] & 2 != 0 {
            bad.push((84, f(f64::NAN).to_vec())); // fill value
            bad.push((84, f(f64::INFINITY).to_vec()));
            bad.push((84, f(1.1).to_vec())); // not an f32 value
        } else {
            bad.push((84, f(1.0).to_vec())); // reserved without the fill flag
            bad.push((90, vec![1]));
        }
        for (off, bytes) in bad {
            assert_field_rejected(name, s, off, &bytes);
        }
    }
}

/// The reported stored stream: unknown codec tag, chunk_log2 = 100, a NaN bound and a negative
/// step, all at once, with a recomputed checksum.
#[test]
fn stored_stream_with_garbage_header_fields_is_rejected() {
    let noise: Vec<f32> = gen(3, 1_000, 6);
    let mut s = compress(&noise, ErrorBound::Abs(1e-30), CodecKind::Aatrox).unwrap();
    assert_eq!(s[9] & 1, 1);
    s[6] = 9;
    s[10..12].copy_from_slice(&100u16.to_le_bytes());
    s[24..32].copy_from_slice(&f64::NAN.to_le_bytes());
    s[40..48].copy_from_slice(&(-1.0f64).to_le_bytes());
    reseal(&mut s);
    assert!(zcomm::inspect(&s).is_err());
    assert!(decompress::<f32>(&s).is_err());
}

/// The byte limit: a small valid stream that decodes to more than `max_bytes` is refused before
/// anything is allocated, with an error (no abort); the default limit is at most 64 GiB.
#[test]
fn decode_byte_limit_refuses_bombs() {
    let zeros = vec![0f32; 1 << 22];
    for &c in CodecKind::ALL {
        let s = compress(&zeros, ErrorBound::Abs(1e-3), c).unwrap();
        // (gpz spends at least 3 bytes per block of 32 values: its bombs are small ones)
        let small = if c == CodecKind::Gpz { 1 << 20 } else { 20_000 };
        assert!(s.len() < small, "{c}: {}", s.len());
        let lim = DecodeLimits::default().with_max_bytes((1 << 24) - 1);
        let e = decompress_with_limits::<f32>(&s, lim).unwrap_err();
        assert!(matches!(e, Error::OutOfMemory(_)), "{c}: {e}");
        assert!(e.to_string().contains("limit"), "{e}");
        let mut w = Vec::new();
        assert!(zcomm::decompress_to_writer::<f32, _>(&s, &mut w, lim).is_err());
        assert!(w.is_empty());
        let lim = DecodeLimits::default().with_max_bytes(1 << 24);
        assert_eq!(decompress_with_limits::<f32>(&s, lim).unwrap(), zeros);
    }
    let d = DecodeLimits::default();
    assert!(d.max_bytes <= 64 << 30 && d.max_bytes > 0);
    assert_eq!(d.max_bytes, DecodeLimits::default_max_bytes());
    // a stream claiming 2^40 f64 values (8 TiB) in a few hundred bytes: a clear error
    let s = compress(&[0f64; 2048], ErrorBound::Abs(1e-3), CodecKind::Pfpl).unwrap();
    let mut m = s.clone();
    m[16..24].copy_from_slice(&(1u64 << 40).to_le_bytes());
    m[72..76].copy_from_slice(&((1u64 << 29) as u32).to_le_bytes());
    reseal(&mut m);
    let e = decompress_with_limits::<f64>(&m, DecodeLimits::unlimited()).unwrap_err();
    assert!(!e.to_string().is_empty());
    assert!(decompress::<f64>(&m).is_err());
}

/// The chunked decoder hands over consecutive batches whose concatenation is `decompress`'s
/// output, for stored and compressed streams of every codec, and stops at a sink error.
#[test]
fn chunked_decode_matches_decompress() {
    let big: Vec<f32> = gen(1, (1 << 24) + 12_345, 3);
    let noise: Vec<f64> = gen(3, 70_001, 6);
    for &c in CodecKind::ALL {
        for s in [
            compress(&big, ErrorBound::Noa(1e-4), c).unwrap(),
            compress(&big[..100], ErrorBound::Abs(1e-4), c).unwrap(),
            compress::<f32>(&[], ErrorBound::Abs(1e-4), c).unwrap(),
        ] {
            let want: Vec<f32> = decompress(&s).unwrap();
            let mut got = Vec::new();
            let mut batches = 0;
            let n = zcomm::decompress_chunked::<f32, _>(&s, DecodeLimits::default(), |v| {
                batches += 1;
                got.extend_from_slice(v);
                Ok(())
            })
            .unwrap();
            assert_eq!(n, want.len() as u64);
            assert!(got == want, "{c}");
            assert!(
                batches <= want.len().div_ceil(1 << 24).max(1),
                "{c}: {batches}"
            );
        }
        let s = compress(&noise, ErrorBound::Abs(1e-300), c).unwrap();
        let mut w = Vec::new();
        zcomm::decompress_to_writer::<f64, _>(&s, &mut w, DecodeLimits::default()).unwrap();
        // (cuszi compresses this noise a little: its raw values are checked by decompress)
        let h = zcomm::inspect(&s).unwrap();
        if h.is_stored() {
            assert_eq!(&w[..], &s[h.header_len()..], "{c}: stored stream bytes");
        } else {
            let v: Vec<f64> = decompress(&s).unwrap();
            assert!(
                w.chunks_exact(8).zip(&v).all(|(b, x)| b == x.to_le_bytes()),
                "{c}"
            );
        }
        // a sink error stops the decode and comes back unchanged
        let s = compress(&big, ErrorBound::Noa(1e-4), c).unwrap();
        let e = zcomm::decompress_chunked::<f32, _>(&s, DecodeLimits::default(), |_| {
            Err(Error::invalid("sink full"))
        })
        .unwrap_err();
        assert!(e.to_string().contains("sink full"), "{e}");
        // a wrong dtype is a mismatch
        assert!(matches!(
            zcomm::decompress_to_writer::<f64, _>(&s, &mut Vec::new(), DecodeLimits::default()),
            Err(Error::Mismatch { .. })
        ));
    }
}
