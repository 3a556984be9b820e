//! GPZ particle streams under corruption: the fuzz target's body over mutated (and re-sealed)
//! valid streams and random bytes on stable Rust. Always an `Error` or a decode that agrees with
//! the header; never a panic, hang or out-of-bounds access. Also gpz as a `CodecKind`: a
//! property round trip through `compress_nd` with the exact bound check, and the generic
//! decoder's fuzz body (`fuzz_targets/decode.rs`) over mutated wrapped streams.

mod common;

use common::fuzz_body::gpz_fuzz_body::{decode_any, reseal};
use common::{abs_diff_le, check_bound, fuzz_body};

use proptest::prelude::*;
use zcomm::codec::gpz::{compress_particles, decompress_particles_with_limits, Order};
use zcomm::{compress_nd, decompress, inspect, CodecKind, DecodeLimits, ErrorBound};

/// xorshift64 for test data.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Valid streams: d = 1..=4, both dtypes and orders, exceptions, a stored stream.
fn sample_streams() -> Vec<Vec<u8>> {
    let mut r = Rng(0x6E2);
    let mut out = Vec::new();
    for d in 1..=4usize {
        let n = 50 + 37 * d;
        let mut xs: Vec<f64> = (0..n * d)
            .map(|i| (i % 7) as f64 * 3.0 + (r.next() % 1000) as f64 * 1e-3)
            .collect();
        xs[d] = f64::NAN;
        xs[5 * d] = f64::INFINITY;
        let xf: Vec<f32> = xs.iter().map(|&x| x as f32).collect();
        for order in [Order::Preserve, Order::Reorder] {
            let b = ErrorBound::Noa(1e-3);
            out.push(compress_particles(&xs, d, b, order).unwrap().0);
            out.push(compress_particles(&xf, d, b, order).unwrap().0);
        }
    }
    let noise: Vec<f32> = (0..96)
        .map(|_| f32::from_bits(r.next() as u32 & 0x3fff_ffff))
        .collect();
    out.push(
        compress_particles(&noise, 3, ErrorBound::Abs(1e-30), Order::Preserve)
            .unwrap()
            .0,
    );
    out
}

#[test]
fn valid_streams_decode() {
    for s in sample_streams() {
        decode_any(&s);
        let ok32 = decompress_particles_with_limits::<f32>(&s, DecodeLimits::default()).is_ok();
        let ok64 = decompress_particles_with_limits::<f64>(&s, DecodeLimits::default()).is_ok();
        assert!(ok32 != ok64);
    }
}

#[test]
fn resealed_mutations_never_panic() {
    let mut r = Rng(0xBAD5EED);
    let streams = sample_streams();
    let (mut rejected, mut total) = (0, 0);
    for s in &streams {
        for _ in 0..3_000 {
            let mut c = s.clone();
            for _ in 0..1 + r.below(4) {
                let i = r.below(c.len() as u64) as usize;
                c[i] = r.next() as u8;
            }
            if r.below(4) == 0 {
                let cut = r.below(c.len() as u64) as usize;
                c.truncate(cut);
            }
            reseal(&mut c);
            decode_any(&c);
            total += 1;
            let l = DecodeLimits::default().with_max_count(1 << 22);
            if decompress_particles_with_limits::<f32>(&c, l).is_err()
                && decompress_particles_with_limits::<f64>(&c, l).is_err()
            {
                rejected += 1;
            }
        }
    }
    eprintln!("resealed gpz mutations: {rejected} of {total} rejected");
    assert!(rejected > total / 4, "{rejected}/{total} rejected");
}

#[test]
fn random_bytes_never_panic() {
    let mut r = Rng(0xF022);
    let streams = sample_streams();
    for i in 0..20_000 {
        let len = r.below(if i % 2 == 0 { 200 } else { 3000 }) as usize;
        let mut b: Vec<u8> = (0..len).map(|_| r.next() as u8).collect();
        if i % 3 == 0 {
            // graft a real header so parsing goes further
            let s = &streams[r.below(streams.len() as u64) as usize];
            let hl = 56 + 48 * s[7] as usize;
            if b.len() >= hl {
                b[..hl].copy_from_slice(&s[..hl]);
            }
        }
        decode_any(&b);
        reseal(&mut b);
        decode_any(&b);
    }
}

/// `n` particles of `d` f64 coordinates from `vals` (cycled), with a NaN and an infinity when
/// `specials`.
fn particle_data(vals: &[f64], n: usize, d: usize, specials: bool) -> Vec<f64> {
    let mut xs: Vec<f64> = (0..n * d)
        .map(|i| vals[i % vals.len()] + (i % d) as f64)
        .collect();
    if specials && xs.len() > 7 {
        xs[3] = f64::NAN;
        xs[7] = f64::NEG_INFINITY;
    }
    xs
}

/// Every finite coordinate within the stream's recorded bound and, when compressed, within its
/// axis's own bound (both compared exactly: `common::abs_diff_le`), and every non-finite one
/// bit for bit.
fn check_gpz_round_trip<T: zcomm::Element>(
    xs: &[T],
    n: usize,
    d: usize,
    b: ErrorBound,
) -> Result<(), TestCaseError> {
    // (a shape has no zero extent but the 1-D [0] of no values)
    let shape = if n == 0 { vec![0] } else { vec![n, d] };
    let s = compress_nd(xs, &shape, b, CodecKind::Gpz)
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert!(s.len() <= zcomm::compress_bound(xs.len(), T::DTYPE));
    let h = inspect(&s).unwrap();
    prop_assert_eq!(h.count, xs.len() as u64);
    let axes = if h.is_stored() {
        None
    } else {
        Some(zcomm::codec::gpz_payload_header(&s, &h).unwrap().axes)
    };
    let back: Vec<T> = decompress(&s).unwrap();
    check_bound(xs, &back, b, h.abs_bound).map_err(TestCaseError::fail)?;
    if let Some(a) = &axes {
        for (i, (x, y)) in xs.iter().zip(&back).enumerate() {
            let lim = (a[i % d].abs_bound, 0.0);
            prop_assert!(
                !x.finite() || abs_diff_le(x.to_f64(), y.to_f64(), lim),
                "value {}: {:?} -> {:?} misses its axis bound {}",
                i,
                x,
                y,
                lim.0
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn prop_gpz_compress_nd_round_trip(
        vals in proptest::collection::vec(-1e4f64..1e4, 1..64),
        n in 0usize..300,
        d in 1usize..=4,
        abs in any::<bool>(),
        u in 0.0f64..1.0,
        specials in any::<bool>(),
    ) {
        let b = if abs {
            ErrorBound::Abs(10f64.powf(-6.0 + 6.0 * u))
        } else {
            ErrorBound::Noa(10f64.powf(-7.0 + 6.0 * u))
        };
        let xs = particle_data(&vals, n, d, specials);
        check_gpz_round_trip(&xs, n, d, b)?;
        let xf: Vec<f32> = xs.iter().map(|&x| x as f32).collect();
        check_gpz_round_trip(&xf, n, d, b)?;
    }
}

/// Wrapped (zcomm) gpz streams: compressed in both orders, 1-D, stored, empty.
fn wrapped_streams() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let vals: Vec<f64> = (0..97).map(|i| ((i * 37) % 101) as f64 * 0.1).collect();
    for d in 1..=4usize {
        let n = 70 + 11 * d;
        let xs = particle_data(&vals, n, d, true);
        let xf: Vec<f32> = xs.iter().map(|&x| x as f32).collect();
        for order in [Order::Preserve, Order::Reorder] {
            let b = ErrorBound::Noa(1e-3);
            out.push(
                zcomm::codec::compress_particles_nd(&xs, &[n, d], b, order)
                    .unwrap()
                    .0,
            );
            out.push(
                zcomm::codec::compress_particles_nd(&xf, &[n, d], b, order)
                    .unwrap()
                    .0,
            );
        }
    }
    let xs = particle_data(&vals, 500, 1, false);
    out.push(zcomm::compress(&xs, ErrorBound::Abs(1e-2), CodecKind::Gpz).unwrap());
    let noise: Vec<f32> = (0..96u32)
        .map(|i| f32::from_bits(i.wrapping_mul(2_654_435_761) >> 2))
        .collect();
    let st = compress_nd(&noise, &[32, 3], ErrorBound::Abs(1e-30), CodecKind::Gpz).unwrap();
    assert!(inspect(&st).unwrap().is_stored());
    out.push(st);
    out.push(zcomm::compress::<f32>(&[], ErrorBound::Abs(1.0), CodecKind::Gpz).unwrap());
    for s in &out {
        assert_eq!(inspect(s).unwrap().codec, CodecKind::Gpz.tag());
    }
    out
}

/// The generic decoder on mutated gpz streams, checksums recomputed (inner and outer) so that the
/// structural and cross-checks are what rejects them: never a panic, and most are errors.
#[test]
fn generic_decoder_on_mutated_gpz_streams() {
    let mut r = Rng(0x5EA1);
    let streams = wrapped_streams();
    let (mut rejected, mut total) = (0, 0);
    for s in &streams {
        fuzz_body::decode_any(s);
        for _ in 0..1_500 {
            let mut c = s.clone();
            for _ in 0..1 + r.below(4) {
                let i = r.below(c.len() as u64) as usize;
                c[i] = r.next() as u8;
            }
            if r.below(4) == 0 {
                let cut = r.below(c.len() as u64) as usize;
                c.truncate(cut);
            }
            fuzz_body::decode_any(&c);
            fuzz_body::reseal(&mut c);
            fuzz_body::decode_any(&c);
            total += 1;
            if decompress::<f32>(&c).is_err() && decompress::<f64>(&c).is_err() {
                rejected += 1;
            }
        }
    }
    eprintln!("resealed wrapped gpz mutations: {rejected} of {total} rejected");
    assert!(rejected > total / 4, "{rejected}/{total} rejected");
}

/// Truncations of a wrapped stream are errors, every one.
#[test]
fn truncated_gpz_streams_are_errors() {
    for s in wrapped_streams() {
        for cut in 0..s.len() {
            let t = &s[..cut];
            assert!(
                inspect(t).is_err()
                    || decompress::<f32>(t).is_err() && decompress::<f64>(t).is_err(),
                "cut {cut}"
            );
        }
    }
}
