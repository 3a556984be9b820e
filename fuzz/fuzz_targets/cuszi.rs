//! cargo-fuzz target: `cuszi` round trips on arbitrary shapes, bounds and values, then the
//! decoder on each stream with one bit flipped and every checksum recomputed
//! (`cargo fuzz run cuszi`).
//!
//! Input: byte 0 picks the number of dimensions (1 to 4), bytes 1..5 the extents (1 to 16),
//! byte 5 the bound mode and exponent, byte 6 the dtype and the flipped bit; the rest are the
//! values' little-endian bytes (repeated as needed to fill the shape).
#![no_main]

#[path = "../../tests/common/fuzz_body.rs"]
mod fuzz_body;

use zcomm::{compress_nd, decompress, inspect, CodecKind, Element, ErrorBound};

fn values<T: Element>(bytes: &[u8], n: usize) -> Vec<T> {
    if bytes.len() < T::SIZE {
        return (0..n).map(|i| T::from_f64((i as f64 * 0.1).sin())).collect();
    }
    let words: Vec<T> = bytes.chunks_exact(T::SIZE).map(T::read_le).collect();
    (0..n).map(|i| words[i % words.len()]).collect()
}

fn round_trip<T: Element>(data: &[T], dims: &[usize], bound: ErrorBound, flip: usize) {
    let s = compress_nd(data, dims, bound, CodecKind::Cuszi).expect("valid input compresses");
    let h = inspect(&s).expect("own stream parses");
    let back: Vec<T> = decompress(&s).expect("own stream decodes");
    for (x, y) in data.iter().zip(&back) {
        if x.finite() {
            let (xv, yv) = (x.to_f64(), y.to_f64());
            let lim = match bound {
                ErrorBound::Rel(e) => zcomm::quant::pred(e * xv.abs()),
                _ => h.abs_bound,
            };
            assert!((xv - yv).abs() <= lim, "{xv:e} -> {yv:e} beyond {lim:e}");
        } else {
            assert_eq!(x.to_bits_u64(), y.to_bits_u64());
        }
    }
    let mut m = s;
    let bit = flip % (m.len() * 8);
    m[bit / 8] ^= 1 << (bit % 8);
    fuzz_body::reseal(&mut m);
    fuzz_body::decode_any(&m);
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if data.len() < 7 {
        return;
    }
    let nd = 1 + data[0] as usize % 4;
    let dims: Vec<usize> = data[1..1 + nd].iter().map(|&b| 1 + b as usize % 16).collect();
    let n: usize = dims.iter().product();
    let e = 10f64.powi(-((data[5] >> 2) as i32 % 12));
    let bound = match data[5] & 3 {
        0 => ErrorBound::Abs(e),
        1 => ErrorBound::Noa(e),
        _ => ErrorBound::Rel(e.min(0.5)),
    };
    let flip = data[6] as usize * 131;
    if data[6] & 1 == 0 {
        round_trip(&values::<f32>(&data[7..], n), &dims, bound, flip);
    } else {
        round_trip(&values::<f64>(&data[7..], n), &dims, bound, flip);
    }
});
