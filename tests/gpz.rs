//! GPZ particle streams under corruption: the fuzz target's body over mutated (and re-sealed)
//! valid streams and random bytes on stable Rust. Always an `Error` or a decode that agrees with
//! the header; never a panic, hang or out-of-bounds access.

#[path = "common/gpz_fuzz_body.rs"]
mod gpz_fuzz_body;

use gpz_fuzz_body::{decode_any, reseal};
use zcomm::codec::gpz::{compress_particles, decompress_particles_with_limits, Order};
use zcomm::{DecodeLimits, ErrorBound};

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
