//! cargo-fuzz target: the stream decoder on arbitrary bytes (`cargo fuzz run decode`).
//!
//! The body is shared with `tests/corruption.rs`, which runs it on stable Rust in CI.
#![no_main]

// shared with decode_resealed, which also uses its resealing helpers
#[allow(dead_code)]
#[path = "../../tests/common/fuzz_body.rs"]
mod fuzz_body;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    fuzz_body::decode_any(data);
});
