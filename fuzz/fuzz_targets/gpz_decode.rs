//! cargo-fuzz target: the GPZ particle decoder on arbitrary bytes, as given and with every
//! checksum recomputed (`cargo fuzz run gpz_decode`).
//!
//! The body is shared with `tests/gpz.rs`, which runs it on stable Rust in CI.
#![no_main]

#[path = "../../tests/common/gpz_fuzz_body.rs"]
mod gpz_fuzz_body;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    gpz_fuzz_body::decode_any(data);
    let mut s = data.to_vec();
    gpz_fuzz_body::reseal(&mut s);
    gpz_fuzz_body::decode_any(&s);
});
