//! cargo-fuzz target: arbitrary bytes with every checksum recomputed before decoding, so that the
//! fuzzer explores the decoder's structural checks instead of stopping at a checksum mismatch
//! (`cargo fuzz run decode_resealed`).
#![no_main]

#[path = "../../tests/common/fuzz_body.rs"]
mod fuzz_body;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let mut s = data.to_vec();
    fuzz_body::reseal(&mut s);
    fuzz_body::decode_any(&s);
});
