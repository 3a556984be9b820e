//! Round trips with exact bound checks, adversarial inputs, shapes, corrupted streams.

use proptest::prelude::*;

use crate::codec::{compress_nd, compress_with_options, decompress, inspect, CodecKind};
use crate::element::Element;
use crate::format::{zhash_bytes, Dims, Dtype, HEADER_LEN_V3};
use crate::quant::{pred, ErrorBound};
use crate::CompressOptions;

/// Compress `data` of shape `dims` with cuszi under `bound`, decode it, and check every value
/// with the rule of the other codecs' tests: finite values within the header's absolute bound
/// (abs/noa) or `pred(E |x|)` (rel), computed in f64; anything else bit-exact. Returns the
/// stream.
fn check<T: Element>(data: &[T], dims: &[usize], bound: ErrorBound) -> Vec<u8> {
    let s = compress_nd(data, dims, bound, CodecKind::Cuszi).unwrap();
    let h = inspect(&s).unwrap();
    assert_eq!(h.count, data.len() as u64);
    let want: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
    assert_eq!(h.dims.unwrap().as_slice(), &want[..]);
    let back: Vec<T> = decompress(&s).unwrap();
    assert_eq!(back.len(), data.len());
    for (i, (x, y)) in data.iter().zip(&back).enumerate() {
        let (xv, yv) = (x.to_f64(), y.to_f64());
        if x.finite() {
            let lim = match bound {
                ErrorBound::Rel(e) => pred(e * xv.abs()),
                _ => h.abs_bound,
            };
            let d = (xv - yv).abs();
            assert!(
                d <= lim,
                "{bound} {dims:?} value {i}: |{xv:e} - {yv:e}| = {d:e} > {lim:e}"
            );
        } else {
            assert_eq!(x.to_bits_u64(), y.to_bits_u64(), "{dims:?} value {i}");
        }
    }
    s
}

/// A smooth 3-D field of shape `n`.
fn field<T: Element>(n: [usize; 3]) -> Vec<T> {
    let mut v = Vec::with_capacity(n.iter().product());
    for i in 0..n[0] {
        for j in 0..n[1] {
            for k in 0..n[2] {
                let (x, y, z) = (i as f64 * 0.07, j as f64 * 0.05, k as f64 * 0.09);
                v.push(T::from_f64(
                    x.sin() * y.cos() * 100.0 + (z + x).cos() * 30.0 + 7.0,
                ));
            }
        }
    }
    v
}

#[test]
fn smooth_fields_round_trip_every_mode() {
    for dims in [[33usize, 17, 20], [8, 8, 8], [1, 9, 40], [2, 1, 1]] {
        let d32 = field::<f32>(dims);
        let d64 = field::<f64>(dims);
        for b in [
            ErrorBound::Abs(1e-2),
            ErrorBound::Noa(1e-3),
            ErrorBound::Noa(1e-6),
            ErrorBound::Rel(1e-3),
        ] {
            check(&d32, &dims, b);
            check(&d64, &dims, b);
            // the same values as 1-D and 2-D
            let n = d32.len();
            check(&d32, &[n], b);
            check(&d64, &[dims[0] * dims[1], dims[2]], b);
        }
    }
}

/// Adversarial values: NaN payloads, infinities, subnormals, signed zeros, values near the
/// dtype's limits, mixed into a smooth field.
fn adversarial<T: Element>(n: usize, seed: u64) -> Vec<T> {
    let mut r = seed | 1;
    let mut next = move || {
        r ^= r << 13;
        r ^= r >> 7;
        r ^= r << 17;
        r
    };
    let big = if T::SIZE == 4 {
        f32::MAX as f64
    } else {
        f64::MAX
    };
    let tiny = if T::SIZE == 4 {
        f32::from_bits(1) as f64
    } else {
        f64::from_bits(1)
    };
    (0..n)
        .map(|i| {
            let v = match next() % 23 {
                0 => return T::from_bits_u64(next() | 0x7FF0_0000_0000_0001 | 0x7F80_0001),
                1 => f64::INFINITY,
                2 => f64::NEG_INFINITY,
                3 => tiny * (next() % 100) as f64,
                4 => -0.0,
                5 => big * 0.999,
                6 => -big,
                _ => (i as f64 * 0.01).sin() * 50.0,
            };
            T::from_f64(v)
        })
        .collect()
}

#[test]
fn adversarial_values_keep_the_bound() {
    for dims in [
        &[1usize][..],
        &[1, 1, 1],
        &[1, 77],
        &[77, 1],
        &[5, 3, 7],
        &[2, 3, 4, 5],
        &[3, 1, 9, 10],
        &[9, 17, 8],
        &[1030],
    ] {
        let n: usize = dims.iter().product();
        for seed in 1..4 {
            let d32 = adversarial::<f32>(n, seed);
            let d64 = adversarial::<f64>(n, seed);
            for b in [
                ErrorBound::Abs(1e-3),
                ErrorBound::Noa(1e-4),
                ErrorBound::Rel(1e-2),
                ErrorBound::Abs(1e-300),
            ] {
                check(&d32, dims, b);
                check(&d64, dims, b);
            }
        }
    }
}

#[test]
fn degenerate_arrays() {
    let b = ErrorBound::Noa(1e-3);
    check::<f32>(&[], &[0], b);
    check(&[3.5f32], &[1, 1, 1, 1], b);
    check(&vec![-2.5f64; 4096], &[16, 16, 16], b);
    check(&vec![0.0f32; 5000], &[50, 100], b);
    check(&vec![f32::NAN; 300], &[3, 10, 10], b);
    // only subnormals, and a range spanning the whole f64 line
    let sub: Vec<f64> = (0..999).map(|i| f64::from_bits(i * 7919)).collect();
    check(&sub, &[9, 111], ErrorBound::Abs(1e-310));
    let wide: Vec<f64> = (0..1000)
        .map(|i| if i % 2 == 0 { f64::MAX } else { -f64::MAX } * ((i % 7) as f64 / 7.0))
        .collect();
    check(&wide, &[10, 10, 10], ErrorBound::Noa(1e-5));
    let wide32: Vec<f32> = wide.iter().map(|&x| (x / 1e280) as f32 * 3e27).collect();
    check(&wide32, &[10, 100], ErrorBound::Noa(1e-7));
}

#[test]
fn fill_values_are_kept_exactly() {
    let mut d = field::<f32>([20, 30, 10]);
    for x in d.iter_mut().step_by(11) {
        *x = -1e10;
    }
    let opts = CompressOptions::default()
        .with_fill_value(-1e10)
        .with_dims(Dims::new(&[20, 30, 10]).unwrap());
    let s = compress_with_options(&d, ErrorBound::Noa(1e-3), CodecKind::Cuszi, &opts).unwrap();
    let h = inspect(&s).unwrap();
    assert_eq!(h.fill_value, Some(-1e10));
    let back: Vec<f32> = decompress(&s).unwrap();
    for (x, y) in d.iter().zip(&back) {
        if *x == -1e10 {
            assert_eq!(x.to_bits(), y.to_bits());
        } else {
            assert!(((x - y).abs() as f64) <= h.abs_bound);
        }
    }
}

thread_local! {
    /// Test override of the sampled configuration: every level multi-dimensional (`Some(true)`)
    /// or every level by passes (`Some(false)`).
    static FORCE_MULTI: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
}

/// The sampled `levels`, with [`FORCE_MULTI`]'s override applied.
pub(crate) fn forced_levels(mut levels: Vec<super::interp::Level>) -> Vec<super::interp::Level> {
    if let Some(m) = FORCE_MULTI.with(|f| f.get()) {
        for lv in &mut levels {
            lv.multi = m;
        }
    }
    levels
}

/// Both level modes (passes and multi-dimensional means) keep the bound in both domains, on
/// shapes with partial tiles, 2-D, 1-D and batched 4-D, and with adversarial values.
#[test]
fn both_level_modes_keep_the_bound() {
    for multi in [true, false] {
        FORCE_MULTI.with(|f| f.set(Some(multi)));
        for dims in [[33usize, 17, 20], [9, 9, 9], [1, 5, 40], [2, 3, 3]] {
            let d32 = field::<f32>(dims);
            let d64 = field::<f64>(dims);
            for b in [
                ErrorBound::Abs(1e-2),
                ErrorBound::Noa(1e-4),
                ErrorBound::Rel(1e-3),
            ] {
                check(&d32, &dims, b);
                check(&d64, &dims, b);
                check(&d32, &[d32.len()], b);
            }
        }
        let d = field::<f32>([6, 10, 12]);
        check(&d, &[2, 3, 10, 12], ErrorBound::Noa(1e-3));
        let a = adversarial::<f64>(3000, 11);
        for b in [ErrorBound::Noa(1e-3), ErrorBound::Rel(1e-2)] {
            check(&a, &[10, 15, 20], b);
            check(&a, &[50, 60], b);
        }
    }
    FORCE_MULTI.with(|f| f.set(None));
}

/// The shape is used: a smooth 3-D field compresses better with its shape than as 1-D (a
/// correctness sanity check of the predictor, not a benchmark).
#[test]
fn the_shape_helps_on_a_smooth_field() {
    let d = field::<f32>([64, 64, 64]);
    let b = ErrorBound::Noa(1e-4);
    let nd = check(&d, &[64, 64, 64], b);
    let flat = check(&d, &[64 * 64 * 64], b);
    assert!(
        nd.len() * 3 < flat.len() * 2,
        "{} vs {}",
        nd.len(),
        flat.len()
    );
    assert!(nd.len() * 8 < d.len() * 4);
}

#[test]
fn shape_errors_are_clear() {
    let d = vec![1.0f32; 24];
    let b = ErrorBound::Abs(1e-3);
    for (dims, what) in [
        (&[5usize, 5][..], "holds 25 values"),
        (&[2, 0, 12], "zero dimension"),
        (&[1, 2, 3, 2, 2], "1 to 4 dimensions"),
        (&[], "1 to 4 dimensions"),
    ] {
        let e = compress_nd(&d, dims, b, CodecKind::Cuszi).unwrap_err();
        assert!(e.to_string().contains(what), "{dims:?}: {e}");
        // the same checks whatever the codec
        assert!(compress_nd(&d, dims, b, CodecKind::Pfpl).is_err());
    }
}

/// Codecs that ignore the shape write version 2 streams, byte-identical to the 1-D ones, and a
/// version 2 stream written before version 3 existed still decodes.
#[test]
fn version_2_streams_are_unchanged() {
    let d = field::<f64>([10, 20, 30]);
    for &c in CodecKind::ALL.iter().filter(|c| !c.uses_dims()) {
        let b = ErrorBound::Noa(1e-3);
        let s = compress_nd(&d, &[10, 20, 30], b, c).unwrap();
        assert_eq!(s, crate::codec::compress(&d, b, c).unwrap());
        let h = inspect(&s).unwrap();
        assert_eq!((h.version(), h.header_len(), h.dims), (2, 96, None));
    }
    // an aatrox stream of 200 f32 values written by the version 2 encoder (tests/roundtrip.rs)
    let hex = "5a434d500200010101000f0000000000c8000000000000007b14ae47e17a843f7b14ae47e17a843f00000040e17a943f00000000000000000000000000000000d80000000000000001000000111092c0000000000000000000000000a8cda86ed00000008b02193d0000000001000000050505050505050000000000000000000000000000000000000000000000000000000000aefc2af080c69969803e78187e01f807feff0700feffffff90a392ea263ae302383cfc02c03f00fd00c0ffffffffff7f5768744240e7ec26401f1c1ebf00fc01ffff0300000000007a47cdecb389f1003c0efe00c00f00ff00f0ffff000000c0e7f67ee9e031321be00f0e071f00fe00ffff0100ffffffffafff747dc9cc78000e0f7f00f00f80ff00f0ffffff00000073000000f0000000f00000000f000000ff000000";
    let s = unhex(hex);
    let h = inspect(&s).unwrap();
    assert_eq!(
        (h.version(), h.count, h.shape().as_slice()),
        (2, 200, &[200u64][..])
    );
    assert_eq!(decompress::<f32>(&s).unwrap().len(), 200);
}

fn unhex(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect()
}

/// Recompute every checksum of a (mutated) version 3 stream: chunk checksums, the payload
/// checksum over table and metadata, the header checksum.
pub(crate) fn reseal_v3(s: &mut [u8]) {
    if s.len() < HEADER_LEN_V3 {
        return;
    }
    let u32_at = |s: &[u8], o: usize| u32::from_le_bytes(s[o..o + 4].try_into().unwrap());
    let stored = s[9] & 1 != 0;
    let hl = HEADER_LEN_V3;
    if stored {
        let c = zhash_bytes(&s[hl..]);
        s[76..80].copy_from_slice(&c.to_le_bytes());
    } else {
        let n = u32_at(s, 72) as usize;
        let meta = u32_at(s, 128) as usize;
        let table_end = hl.saturating_add(n.saturating_mul(8));
        let first = table_end.saturating_add(meta);
        if first <= s.len() {
            let mut off = first;
            for i in 0..n {
                let e = hl + 8 * i;
                let size = u32_at(s, e) as usize;
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

/// Decode `s` as its own dtype (f32 when the header is unreadable).
fn decodes(s: &[u8]) -> bool {
    match inspect(s).map(|h| h.dtype) {
        Ok(Dtype::F64) => decompress::<f64>(s).is_ok(),
        _ => decompress::<f32>(s).is_ok(),
    }
}

fn sample_streams() -> Vec<Vec<u8>> {
    let mut v = Vec::new();
    let d = field::<f32>([12, 20, 37]);
    v.push(compress_nd(&d, &[12, 20, 37], ErrorBound::Noa(1e-3), CodecKind::Cuszi).unwrap());
    let a = adversarial::<f64>(2000, 5);
    v.push(compress_nd(&a, &[40, 50], ErrorBound::Abs(1e-2), CodecKind::Cuszi).unwrap());
    let big = field::<f32>([40, 40, 40]);
    v.push(compress_nd(&big, &[40, 40, 40], ErrorBound::Rel(1e-3), CodecKind::Cuszi).unwrap());
    // values whose codes overflow: all lossless, a stored stream
    let noise: Vec<f32> = (0..999u32)
        .map(|i| f32::from_bits(0x6000_0000 + i * 7919))
        .collect();
    v.push(compress_nd(&noise, &[999], ErrorBound::Abs(1e-9), CodecKind::Cuszi).unwrap());
    v
}

#[test]
fn corrupt_streams_are_errors() {
    let streams = sample_streams();
    assert!(inspect(&streams[3]).unwrap().is_stored());
    assert!(!inspect(&streams[0]).unwrap().is_stored());
    assert!(inspect(&streams[2]).unwrap().n_chunks > 1);
    for s in &streams {
        assert!(decodes(s));
        for n in 0..s.len() {
            assert!(
                !decodes(&s[..n]),
                "truncation to {n} of {} accepted",
                s.len()
            );
        }
        let mut longer = s.clone();
        longer.extend([0; 4]);
        assert!(!decodes(&longer));
    }
    // every single bit flip of a small stream
    let s = &streams[0];
    for i in 0..s.len() * 8 {
        let mut m = s.clone();
        m[i / 8] ^= 1 << (i % 8);
        assert!(
            !decodes(&m),
            "flip of bit {} of byte {} accepted",
            i % 8,
            i / 8
        );
    }
}

/// Header fields of version 3, changed and resealed: each is rejected with an error.
#[test]
fn invalid_shape_fields_are_rejected() {
    let s = &sample_streams()[0];
    let put = |off: usize, bytes: &[u8]| {
        let mut m = s.clone();
        m[off..off + bytes.len()].copy_from_slice(bytes);
        reseal_v3(&mut m);
        m
    };
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("ndims 0", put(92, &[0])),
        ("ndims 5", put(92, &[5])),
        ("ndims 2 with a third extent", put(92, &[2])),
        ("reserved", put(93, &[1])),
        ("product", put(96, &13u64.to_le_bytes())),
        ("zero extent", put(104, &0u64.to_le_bytes())),
        ("unused extent", put(120, &1u64.to_le_bytes())),
        ("meta not a multiple of 4", put(128, &[1])),
        ("meta too long", put(128, &[0, 0, 1])),
        ("another codec in version 3", put(6, &[1])),
        ("version 2 cuszi", put(4, &[2])),
        (
            "levels",
            put(136 + 8 * inspect(s).unwrap().n_chunks as usize, &[2]),
        ),
    ];
    for (what, m) in cases {
        let e = decompress::<f32>(&m);
        assert!(e.is_err(), "{what}: accepted");
    }
    // a shape with extents of 1 around the same values is the same array
    let h = inspect(s).unwrap();
    assert_eq!(h.dims.unwrap().as_slice(), &[12, 20, 37]);
}

/// Random mutations, resealed so that the structure checks (not the checksums) see them:
/// errors or values, never a panic.
#[test]
fn resealed_mutations_never_panic() {
    let mut r = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        r ^= r << 13;
        r ^= r >> 7;
        r ^= r << 17;
        r
    };
    for s in sample_streams() {
        for _ in 0..300 {
            let mut m = s.clone();
            for _ in 0..1 + next() % 4 {
                let i = (next() % m.len() as u64) as usize;
                m[i] ^= 1 << (next() % 8);
            }
            if next() % 5 == 0 {
                let n = (next() % m.len() as u64) as usize;
                m.truncate(n);
            }
            reseal_v3(&mut m);
            let _ = decodes(&m);
        }
    }
}

/// A cuszi stream of the first version 3 encoder (256 f32 values of shape 16x16, abs:1e-2, with
/// a NaN; Huffman-coded residuals) decodes to values within the bound.
#[test]
fn golden_stream_decodes() {
    let mut d: Vec<f32> = (0..256)
        .map(|i| ((i / 16) as f32 * 0.3).sin() * 10.0 + (i % 16) as f32 * 0.25)
        .collect();
    d[77] = f32::NAN;
    let g = unhex(GOLDEN_16X16);
    assert!(!inspect(&g).unwrap().is_stored());
    let back: Vec<f32> = decompress(&g).unwrap();
    for (x, y) in d.iter().zip(&back) {
        assert!((x - y).abs() <= 1e-2 || x.to_bits() == y.to_bits());
    }
}

/// `s` (a compressed cuszi stream of `data`, shape `dims`) with its payload replaced by coder 0
/// (Huffman, the first version 3 encoder's), header fields and checksums updated.
fn as_coder_0<T: Element>(s: &[u8], data: &[T], dims: &[usize], bound: ErrorBound) -> Vec<u8> {
    with_payload(s, data, dims, bound, super::encode_huffman)
}

/// `s` with its payload replaced by an earlier encoder's coder: 1 (one rANS state per chunk)
/// or 2 (four states per chunk).
pub(crate) fn as_older_coder<T: Element>(
    coder: u8,
    s: &[u8],
    data: &[T],
    dims: &[usize],
    bound: ErrorBound,
) -> Vec<u8> {
    let encode = match coder {
        1 => super::encode_one_state,
        2 => super::encode_coder_2,
        _ => panic!("no earlier rANS coder {coder}"),
    };
    with_payload(s, data, dims, bound, encode)
}

/// `s` with its payload replaced by what `encode` writes, header fields and checksums updated.
fn with_payload<T: Element>(
    s: &[u8],
    data: &[T],
    dims: &[usize],
    bound: ErrorBound,
    encode: fn(&[T], &Dims, &crate::quant::QuantParams) -> super::Encoded,
) -> Vec<u8> {
    let params = crate::quant::QuantParams::derive(data, bound).unwrap();
    let shape = Dims::new(&dims.iter().map(|&d| d as u64).collect::<Vec<_>>()).unwrap();
    let e = encode(data, &shape, &params);
    let mut o = s[..HEADER_LEN_V3].to_vec();
    o[64..72].copy_from_slice(&(e.payload.len() as u64).to_le_bytes());
    o[72..76].copy_from_slice(&e.n_chunks.to_le_bytes());
    o[76..80].copy_from_slice(&e.table_checksum.to_le_bytes());
    o[128..132].copy_from_slice(&e.meta_len.to_le_bytes());
    o.extend_from_slice(&e.payload);
    reseal_v3(&mut o);
    o
}

/// Whether streams `a` and `b` decode to the same values bit for bit.
fn decode_alike<T: Element>(a: &[u8], b: &[u8]) -> bool {
    let bits = |s: &[u8]| -> Vec<u64> {
        let v: Vec<T> = decompress(s).unwrap();
        v.iter().map(|x| x.to_bits_u64()).collect()
    };
    bits(a) == bits(b)
}

/// Streams of coder 0 (Huffman) still decode, within the bound, to what coder 3 decodes (the
/// predictor is the same: only the residuals' coding differs), and corrupted ones are errors.
#[test]
fn coder_0_streams_still_decode() {
    let dims = [12usize, 20, 37];
    let d = field::<f32>(dims);
    let mut a = adversarial::<f64>(2000, 7);
    a[5] = f64::NAN;
    for (bound, rel) in [
        (ErrorBound::Noa(1e-3), false),
        (ErrorBound::Rel(1e-3), true),
    ] {
        let s = check(&d, &dims, bound);
        let old = as_coder_0(&s, &d, &dims, bound);
        assert_eq!(inspect(&old).unwrap().count, d.len() as u64);
        let meta_at = HEADER_LEN_V3 + 8 * inspect(&old).unwrap().n_chunks as usize;
        assert_eq!(old[meta_at + 1], 0, "coder byte");
        assert!(decode_alike::<f32>(&old, &s), "rel {rel}");
        let s2 = check(&a, &[40, 50], bound);
        let old2 = as_coder_0(&s2, &a, &[40, 50], bound);
        assert!(decode_alike::<f64>(&old2, &s2), "rel {rel}");
        // a truncated or altered coder-0 chunk is an error
        let mut m = old.clone();
        let n = m.len();
        m[n - 9] ^= 0x44;
        reseal_v3(&mut m);
        let _ = decodes(&m);
        assert!(!decodes(&old[..old.len() - 4]));
    }
    // an unknown coder is refused with a clear error
    let s = check(&d, &dims, ErrorBound::Noa(1e-3));
    let mut m = s.clone();
    let meta_at = HEADER_LEN_V3 + 8 * inspect(&s).unwrap().n_chunks as usize;
    m[meta_at + 1] = 4;
    reseal_v3(&mut m);
    let err = decompress::<f32>(&m).unwrap_err().to_string();
    assert!(err.contains("entropy coder 4"), "{err}");
}

/// Streams of coders 1 (one rANS state per chunk) and 2 (four) still decode, bit for bit as
/// coder 3 (the residuals are the same, only their rANS streams differ); read as another coder,
/// each one is an error; a truncated one too.
#[test]
fn coder_1_and_2_streams_still_decode() {
    use super::rans::{WAYS, WAYS_CODER_2};
    let dims = [12usize, 20, 37];
    let d = field::<f32>(dims);
    let mut a = adversarial::<f64>(70_000, 11);
    a[5] = f64::NAN;
    for bound in [
        ErrorBound::Noa(1e-3),
        ErrorBound::Abs(1e-6),
        ErrorBound::Rel(1e-3),
    ] {
        let s = check(&d, &dims, bound);
        let meta_at = HEADER_LEN_V3 + 8 * inspect(&s).unwrap().n_chunks as usize;
        assert_eq!(s[meta_at + 1], 3, "coder byte");
        let n_chunks = inspect(&s).unwrap().n_chunks as usize;
        for (coder, ways) in [(1u8, 1usize), (2, WAYS_CODER_2)] {
            let old = as_older_coder(coder, &s, &d, &dims, bound);
            assert_eq!(old[meta_at + 1], coder, "coder byte");
            // about 4 bytes per chunk and extra state (the states' final bits differ)
            let extra = 4 * (WAYS - ways) * n_chunks;
            assert!(
                s.len() <= old.len() + extra + 4 * n_chunks,
                "{} {}",
                s.len(),
                old.len()
            );
            // (at least half of it: a final state carries at most a byte of the data)
            assert!(
                s.len() + extra / 2 + 4 * n_chunks >= old.len() + extra,
                "{} {}",
                s.len(),
                old.len()
            );
            assert!(decode_alike::<f32>(&old, &s), "{bound:?}");
            let s2 = check(&a, &[70, 1000], bound);
            let old2 = as_older_coder(coder, &s2, &a, &[70, 1000], bound);
            assert!(decode_alike::<f64>(&old2, &s2), "{bound:?}");
            for other in [1u8, 2, 3].into_iter().filter(|&o| o != coder) {
                let mut m = old.clone();
                m[meta_at + 1] = other;
                reseal_v3(&mut m);
                assert!(
                    !decodes(&m),
                    "{bound:?} coder {coder} read as coder {other}"
                );
            }
            assert!(!decodes(&old[..old.len() - 4]));
        }
        let mut m = s.clone();
        m[meta_at + 1] = 2;
        reseal_v3(&mut m);
        assert!(!decodes(&m), "{bound:?} coder 3 read as coder 2");
    }
}

/// The per-class rANS coder reaches far below one bit per value where a Huffman code cannot
/// (a smooth field at a loose bound).
#[test]
fn rans_beats_huffman_on_smooth_fields() {
    let dims = [40usize, 40, 40];
    let d = field::<f32>(dims);
    let s = check(&d, &dims, ErrorBound::Noa(1e-2));
    let old = as_coder_0(&s, &d, &dims, ErrorBound::Noa(1e-2));
    // (without the rANS states, 4 bytes each per chunk)
    let states = 4 * super::rans::WAYS * inspect(&s).unwrap().n_chunks as usize;
    assert!(
        (s.len() - states) * 4 < old.len() * 3,
        "{} vs {}",
        s.len(),
        old.len()
    );
}

/// This encoder's stream (coder 3) of the golden data writes byte for byte what the reference
/// below holds (a CUDA twin must write the same bytes) and decodes within the bound; the
/// previous encoders' streams of it (coders 1 and 2) decode to the same values.
#[test]
fn golden_stream_coder_3() {
    let mut d: Vec<f32> = (0..256)
        .map(|i| ((i / 16) as f32 * 0.3).sin() * 10.0 + (i % 16) as f32 * 0.25)
        .collect();
    d[77] = f32::NAN;
    let s = compress_nd(&d, &[16, 16], ErrorBound::Abs(1e-2), CodecKind::Cuszi).unwrap();
    let hex: String = s.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(hex, GOLDEN_16X16_CODER_3.concat());
    let back: Vec<f32> = decompress(&s).unwrap();
    for (x, y) in d.iter().zip(&back) {
        assert!((x - y).abs() <= 1e-2 || x.to_bits() == y.to_bits());
    }
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for old in [GOLDEN_16X16_CODER_1, GOLDEN_16X16_CODER_2] {
        let old: Vec<f32> = decompress(&unhex(&old.concat())).unwrap();
        assert_eq!(bits(&old), bits(&back));
    }
}

const GOLDEN_16X16_CODER_3: &[&str] = &[
    "5a434d500300050101000f000000000000010000000000007b14ae47e17a843f7b14ae47e17a843f00000040",
    "e17a943f0000000000000000000000000000000018010000000000000100000087805ef90000000000000000",
    "0000000002000000100000000000000010000000000000000000000000000000000000000000000060000000",
    "30b4f36cb00000003f2ab8660403000009000900090809040d040001020001000002000003000006ff03836a",
    "0be40300a9080b8706188303cd036003a806983328cc19ae01993305a802b81cac01b81c10b81c20b81c5b9b",
    "0e05ca03ff0f2eff1f05ff0f00ff2f00ff0f0000a40000001e3263df02411d7402411d7402411d7401b35276",
    "02411d7402411d7402411d740195fcbf02411d7402411d7402411d7426d47f03013b71ea0499fe1601c0b98f",
    "012f96a802411d74012f96a802411d74012f96a802411d74012f96a802411d74012f96a802411d74012f96a8",
    "02411d74012f96a802411d74012f96a803d9f9fa5f7b5d080808080808080849b388249942fed87dd98972a1",
    "3000000000000000007843e70000c07fdd08dd08",
];

const GOLDEN_16X16_CODER_2: &[&str] = &[
    "5a434d500300050101000f000000000000010000000000007b14ae47e17a843f7b14ae47e17a843f00000040",
    "e17a943f00000000000000000000000000000000b00000000000000001000000fec824a50000000000000000",
    "0000000002000000100000000000000010000000000000000000000000000000000000000000000060000000",
    "beae2e1048000000cde0ecf40402000009000900090809040d040001020001000002000003000006ff03836a",
    "0be40300a9080b8706188303cd036003a806983328cc19ae01993305a802b81cac01b81c10b81c20b81c5b9b",
    "0e05ca03ff0f2eff1f05ff0f00ff2f00ff0f00003b0000000c2eed9900b694c1342ba87a01bc8e9da54af3f3",
    "513d6e4d0b2a1cf85ee44d346b830144b87b585deb71f95b545f499e2f7415d743a67200f700000000c07fdd",
    "08dd0800",
];

const GOLDEN_16X16_CODER_1: &[&str] = &[
    "5a434d500300050101000f000000000000010000000000007b14ae47e17a843f7b14ae47e17a843f00000040",
    "e17a943f00000000000000000000000000000000a400000000000000010000008b1a7b840000000000000000",
    "0000000002000000100000000000000010000000000000000000000000000000000000000000000060000000",
    "6e45aaed3c000000f31cd6b60401000009000900090809040d040001020001000002000003000006ff03836a",
    "0be40300a9080b8706188303cd036003a806983328cc19ae01993305a802b81cac01b81c10b81c20b81c5b9b",
    "0e05ca03ff0f2eff1f05ff0f00ff2f00ff0f00003000000018881a77d9f824762f548170db57cd4fbccbcaaa",
    "240630792bb6f8c9335521ca32ce9f27f4cb41db4243f80b4d982e5f0000c07fdd08dd08",
];

const GOLDEN_16X16: &str = concat!(
    "5a434d500300050101000f000000000000010000000000007b14ae47e17a843f7b14ae47e17a843f00000040",
    "e17a943f00000000000000000000000000000000a80000000000000001000000bc6690290000000000000000",
    "0000000002000000100000000000000010000000000000000000000000000000000000000000000038000000",
    "e2366ac0680000009397031b040029002400240021082104ffffa706ffa00589058f05910484020305840582",
    "05048a059705b006ffc306a707ffac07060305068b000000d3020000fbb66cd4c104104104113665996658d4",
    "a1084210853e719e337ff5372e5cb972e5cbe70cc330cc1a9421084210a7f719db366b284210842166acab2a",
    "ca9a9fb8ccfbc67acd9acc104104104113d33a674ce8d4d0a142850a1429200000c07fdd08dd0800",
);

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn round_trips_keep_the_bound(
        dims in proptest::collection::vec(1usize..14, 1..=4),
        seed in any::<u64>(),
        smooth in any::<bool>(),
        mode in 0u8..3,
        e_exp in -6i32..0,
        f64s in any::<bool>(),
    ) {
        let n: usize = dims.iter().product();
        let e = 10f64.powi(e_exp);
        let b = match mode {
            0 => ErrorBound::Abs(e),
            1 => ErrorBound::Noa(e),
            _ => ErrorBound::Rel(e),
        };
        if f64s {
            let d: Vec<f64> = if smooth {
                (0..n).map(|i| (i as f64 * 0.03).cos() * 4.0).collect()
            } else {
                adversarial(n, seed)
            };
            check(&d, &dims, b);
        } else {
            let d: Vec<f32> = if smooth {
                (0..n).map(|i| (i as f32 * 0.03).cos() * 4.0).collect()
            } else {
                adversarial(n, seed)
            };
            check(&d, &dims, b);
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(
        bytes in proptest::collection::vec(any::<u8>(), 0..400),
        v3 in any::<bool>(),
    ) {
        let mut s = bytes;
        if v3 && s.len() >= HEADER_LEN_V3 {
            s[..4].copy_from_slice(b"ZCMP");
            s[4..6].copy_from_slice(&3u16.to_le_bytes());
            s[6] = crate::format::CODEC_CUSZI;
            reseal_v3(&mut s);
        }
        let _ = decodes(&s);
    }
}

/// Residual statistics of one raw f32 file (development aid): `CUSZI_FILE`, `CUSZI_DIMS`
/// (`ZxYxX`), `CUSZI_BOUND` (`noa:1e-3`).
#[test]
#[ignore]
fn residual_report() {
    use super::grid::{Grid, D};
    use crate::quant::QuantParams;
    let Ok(path) = std::env::var("CUSZI_FILE") else {
        return;
    };
    let dims: Vec<u64> = std::env::var("CUSZI_DIMS")
        .unwrap()
        .split('x')
        .map(|v| v.parse().unwrap())
        .collect();
    let bound: ErrorBound = std::env::var("CUSZI_BOUND").unwrap().parse().unwrap();
    let bytes = std::fs::read(path).unwrap();
    let data: Vec<f32> = bytes.chunks_exact(4).map(f32::read_le).collect();
    let params = QuantParams::derive(&data, bound).unwrap();
    let dims = Dims::new(&dims).unwrap();
    let p = super::predict(&data, &dims, &params);
    let g = Grid::new(&dims);
    let nl = g.levels();
    // a point's class gives its level: 0 for the anchor, else 1 + (class - 1) / D
    let cls = super::classes(&g, &p.levels);
    let level: Vec<usize> = cls
        .iter()
        .map(|&k| if k == 0 { 0 } else { 1 + (k as usize - 1) / D })
        .collect();
    let ent = |it: &mut dyn Iterator<Item = i64>| {
        let mut h = std::collections::HashMap::new();
        let mut n = 0.0;
        for r in it {
            *h.entry(r).or_insert(0.0) += 1.0;
            n += 1.0;
        }
        let e: f64 = h.values().map(|&c: &f64| -c / n * (c / n).log2()).sum();
        (n, e)
    };
    let (n, e) = ent(&mut p.res.iter().copied());
    println!("all: n {n} H0 {e:.4} bits, ratio {:.2}", 32.0 / e);
    let mut cond = 0.0;
    for lv in 0..=nl {
        let (m, e) = ent(&mut p
            .res
            .iter()
            .zip(&level)
            .filter(|x| *x.1 == lv)
            .map(|x| *x.0));
        let z = p
            .res
            .iter()
            .zip(&level)
            .filter(|x| *x.1 == lv && *x.0 == 0)
            .count();
        cond += m * e;
        println!(
            "level {lv}: n {m} H0 {e:.4} zero frac {:.3}",
            z as f64 / m.max(1.0)
        );
    }
    println!(
        "per-level H: {:.4} bits, ratio {:.2}",
        cond / n,
        32.0 * n / cond
    );
    let mut cond = 0.0;
    for k in 0..super::interp::n_classes(nl) {
        let (m, e) = ent(&mut p
            .res
            .iter()
            .zip(&cls)
            .filter(|x| *x.1 as usize == k)
            .map(|x| *x.0));
        cond += m * e;
        if m > 0.0 {
            println!("class {k}: n {m} H0 {e:.4}");
        }
    }
    println!(
        "per-class H: {:.4} bits, ratio {:.2}",
        cond / n,
        32.0 * n / cond
    );
    println!("levels {:?}", p.levels);
    println!("lossless {}", p.lossless.len());
    let s = compress_nd(
        &data,
        &dims
            .as_slice()
            .iter()
            .map(|&d| d as usize)
            .collect::<Vec<_>>(),
        bound,
        CodecKind::Cuszi,
    )
    .unwrap();
    println!(
        "stream {} bytes, ratio {:.2}",
        s.len(),
        (data.len() * 4) as f64 / s.len() as f64
    );
}

/// Valid streams of many kinds for the mutation fuzzer: 1-D to 4-D shapes, f32 and f64, the
/// three bound modes, lossless values and big residuals, fill values, several chunks, both
/// coders, both level modes.
fn fuzz_corpus() -> Vec<Vec<u8>> {
    let mut v = sample_streams();
    let f = field::<f32>([40, 40, 40]);
    v.push(compress_nd(&f, &[40, 40, 40], ErrorBound::Noa(1e-4), CodecKind::Cuszi).unwrap());
    let f = field::<f64>([9, 17, 10]);
    for b in [
        ErrorBound::Abs(1e-3),
        ErrorBound::Noa(1e-2),
        ErrorBound::Rel(1e-2),
    ] {
        v.push(compress_nd(&f, &[9, 17, 10], b, CodecKind::Cuszi).unwrap());
        v.push(compress_nd(&f, &[3, 3, 17, 10], b, CodecKind::Cuszi).unwrap());
    }
    let a = adversarial::<f32>(3000, 11);
    v.push(compress_nd(&a, &[3000], ErrorBound::Noa(1e-3), CodecKind::Cuszi).unwrap());
    v.push(compress_nd(&a, &[60, 50], ErrorBound::Rel(1e-3), CodecKind::Cuszi).unwrap());
    let d = field::<f32>([5, 33, 21]);
    for multi in [true, false] {
        FORCE_MULTI.with(|m| m.set(Some(multi)));
        let s = compress_nd(&d, &[5, 33, 21], ErrorBound::Abs(1e-2), CodecKind::Cuszi).unwrap();
        FORCE_MULTI.with(|m| m.set(None));
        v.push(as_coder_0(&s, &d, &[5, 33, 21], ErrorBound::Abs(1e-2)));
        v.push(s);
    }
    let mut filled = field::<f32>([20, 30, 10]);
    for x in filled.iter_mut().step_by(7) {
        *x = -1e10;
    }
    let opts = CompressOptions::default()
        .with_fill_value(-1e10)
        .with_dims(Dims::new(&[20, 30, 10]).unwrap());
    v.push(compress_with_options(&filled, ErrorBound::Noa(1e-3), CodecKind::Cuszi, &opts).unwrap());
    v.push(compress_nd(&[1.5f32], &[1], ErrorBound::Abs(0.1), CodecKind::Cuszi).unwrap());
    v
}

/// One random mutation of `m`: a bit flip, a random byte, a truncation, an extension, or a
/// length-like field (header sizes and counts, extents, chunk table entries, a chunk's rANS
/// byte count, metadata counts) set to an edge value. Returns what it did.
fn mutate(m: &mut Vec<u8>, next: &mut impl FnMut() -> u64) -> String {
    if m.is_empty() {
        m.push(next() as u8);
        return "push".into();
    }
    let at = |m: &Vec<u8>, x: u64| (x % m.len() as u64) as usize;
    let u32_at = |m: &[u8], o: usize| {
        m.get(o..o + 4)
            .map_or(0, |b| u32::from_le_bytes(b.try_into().unwrap()))
    };
    let hl = HEADER_LEN_V3;
    let n_chunks = u32_at(m, 72) as usize;
    let meta = u32_at(m, 128) as usize;
    // offsets of length-like fields: (offset, width)
    let mut fields: Vec<(usize, usize)> = vec![(64, 8), (72, 4), (92, 1), (128, 4)];
    fields.extend((0..4).map(|d| (96 + 8 * d, 8)));
    for i in 0..n_chunks.min(64) {
        fields.push((hl + 8 * i, 4));
    }
    let meta_at = hl.saturating_add(n_chunks.saturating_mul(8));
    for k in 0..meta.min(64) {
        fields.push((meta_at + k, 1));
    }
    let mut off = meta_at.saturating_add(meta);
    for i in 0..n_chunks.min(64) {
        fields.push((off, 4)); // the chunk's rANS byte (or Huffman bit) count
        off = off.saturating_add(u32_at(m, hl + 8 * i) as usize);
    }
    fields.retain(|&(o, w)| o + w <= m.len());
    match next() % 8 {
        0 | 1 => {
            let i = at(m, next());
            m[i] ^= 1 << (next() % 8);
            format!("flip byte {i}")
        }
        2 => {
            let i = at(m, next());
            m[i] = next() as u8;
            format!("byte {i}")
        }
        3 => {
            let n = at(m, next());
            m.truncate(n);
            format!("truncate {n}")
        }
        4 => {
            let k = 1 + next() % 16;
            m.extend((0..k).map(|_| next() as u8));
            format!("extend {k}")
        }
        _ if !fields.is_empty() => {
            let (o, w) = fields[(next() % fields.len() as u64) as usize];
            let mut cur = [0u8; 8];
            cur[..w].copy_from_slice(&m[o..o + w]);
            let cur = u64::from_le_bytes(cur);
            let v = match next() % 8 {
                0 => 0,
                1 => 1,
                2 => cur.wrapping_add(1),
                3 => cur.wrapping_sub(1),
                4 => cur.wrapping_add(4),
                5 => u64::MAX,
                6 => 1 << (next() % (8 * w as u64)),
                _ => next(),
            };
            m[o..o + w].copy_from_slice(&v.to_le_bytes()[..w]);
            format!("field {o} ({w} bytes) {cur} -> {v}")
        }
        _ => {
            let i = at(m, next());
            m[i] ^= 0x80;
            format!("flip byte {i} bit 7")
        }
    }
}

/// Mutation fuzzing of the decoder (a deterministic stand-in for `cargo fuzz run cuszi` on
/// stable Rust): valid streams of [`fuzz_corpus`], each case one to four mutations
/// ([`mutate`]), resealed nine times in ten so that the structure checks see them, decoded as
/// f32 and f64 with a value limit of 2^22. Every decode must return an error or as many values
/// as the header names, never panic, and finish within a second. Runs for `CUSZI_FUZZ_SECS`
/// seconds (default 20) from seed `CUSZI_FUZZ_SEED`; lists the failing cases.
#[test]
#[ignore]
fn fuzz_mutated_streams() {
    use crate::codec::{decompress_with_limits, DecodeLimits};
    use std::time::{Duration, Instant};
    let secs: u64 = std::env::var("CUSZI_FUZZ_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let mut r: u64 = std::env::var("CUSZI_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x2545_F491_4F6C_DD1D)
        | 1;
    let mut next = move || {
        r ^= r << 13;
        r ^= r >> 7;
        r ^= r << 17;
        r
    };
    let corpus = fuzz_corpus();
    for s in &corpus {
        assert!(decodes(s));
    }
    let limits = DecodeLimits::default().with_max_count(1 << 22);
    let end = Instant::now() + Duration::from_secs(secs);
    let (mut cases, mut accepted) = (0u64, 0u64);
    let mut failures: Vec<String> = Vec::new();
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    while Instant::now() < end && failures.len() < 20 {
        let k = (next() % corpus.len() as u64) as usize;
        let mut m = corpus[k].clone();
        let what: Vec<String> = (0..1 + next() % 4)
            .map(|_| mutate(&mut m, &mut next))
            .collect();
        if next() % 10 != 0 {
            reseal_v3(&mut m);
        }
        cases += 1;
        let t = Instant::now();
        let got = std::panic::catch_unwind(|| {
            let count = inspect(&m).map(|h| h.count).ok();
            let a = decompress_with_limits::<f32>(&m, limits)
                .map(|v| v.len())
                .ok();
            let b = decompress_with_limits::<f64>(&m, limits)
                .map(|v| v.len())
                .ok();
            for n in [a, b].into_iter().flatten() {
                assert_eq!(
                    Some(n as u64),
                    count,
                    "output length differs from the header"
                );
            }
            a.is_some() || b.is_some()
        });
        let took = t.elapsed();
        match got {
            Ok(ok) => accepted += ok as u64,
            Err(p) => {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                failures.push(format!("stream {k}, {what:?}: panic {msg}"));
            }
        }
        if took > Duration::from_secs(1) {
            failures.push(format!("stream {k}, {what:?}: took {took:?}"));
        }
    }
    std::panic::set_hook(hook);
    println!(
        "cuszi fuzz: {cases} cases from {} streams in {secs} s, {accepted} decoded, {} failures",
        corpus.len(),
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
