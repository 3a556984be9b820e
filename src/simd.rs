//! Run hot loops compiled for wider vector units when the CPU has them.

/// Run `f` compiled for AVX2 when the CPU has it, else for the baseline target. `f` must be an
/// `#[inline(always)]` closure that calls only `#[inline(always)]` functions to benefit. Results
/// are bit-identical either way: AVX2 brings no fused multiply-add and no change of rounding.
#[inline(always)]
pub(crate) fn simd<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx2")]
        fn run<R>(f: impl FnOnce() -> R) -> R {
            f()
        }
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2 (checked just above).
            return unsafe { run(f) };
        }
    }
    f()
}
