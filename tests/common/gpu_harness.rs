//! The set-up shared by the GPU test harnesses (`tests/gpu.rs`, `tests/gpu_gpz.rs`; custom
//! harness, libtest-mimic): trials that are reported *ignored*, with the reason, on a machine
//! without a CUDA device or libnvrtc (never passed), and their seeded generator.
//!
//! Included with `#[path]` by those tests only (they need the `cuda` feature), not through
//! `common/mod.rs`, which every test compiles.
#![allow(dead_code)]

use libtest_mimic::{Completion, Failed, Trial};
use zcomm::gpu::compile;

/// A test that needs a CUDA device: ignored at run time without one. With a device, `open(0)`
/// loads the GPU object under test (`what` names it in the failure when it cannot load) and
/// `test` runs on it.
pub fn gpu_trial_of<G: 'static>(
    name: &str,
    what: &'static str,
    open: fn(usize) -> zcomm::Result<G>,
    test: fn(&mut G),
) -> Trial {
    Trial::ignorable_test(name, move || {
        if !zcomm::gpu::device_available() {
            return Ok(Completion::ignored_with("skipped: no CUDA device"));
        }
        let mut gpu = open(0)
            .map_err(|e| Failed::from(format!("GPU present but {what} failed to load: {e}")))?;
        test(&mut gpu);
        Ok(Completion::Completed)
    })
}

/// A test that needs libnvrtc only: ignored at run time without it.
pub fn nvrtc_trial(name: &str, test: fn()) -> Trial {
    Trial::ignorable_test(name, move || {
        if !compile::nvrtc_available() {
            return Ok(Completion::ignored_with("skipped: libnvrtc not found"));
        }
        test();
        Ok(Completion::Completed)
    })
}

/// xorshift64: the seeded generator of the GPU tests' data and corruptions (the seed must not be
/// zero, which stays zero).
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Roughly normal around 0 (a sum of four uniforms: close enough for clustering).
    pub fn normal(&mut self) -> f64 {
        (0..4).map(|_| self.unit()).sum::<f64>() - 2.0
    }
}
