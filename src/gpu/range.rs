//! Value ranges without a pass of their own (issue 16). A ring reduction quantises its first
//! messages under a range taken from a sample of its input
//! ([`GpuCodec::sampled_range_device`], [`crate::quant::sampled_range`]) and needs the exact
//! range only before its final compression; that range is accumulated on the device, in a
//! [`DeviceRange`], by kernels that read the data anyway: the compression of the rank's input
//! ([`GpuCodec::compress_device_tracking`]) and the fused decompress-and-add whose base is that
//! input ([`GpuCodec::decompress_add_to_device_tracking`], in `accumulate.rs`). What those
//! kernels cannot fold (other codecs, stored streams, ...) the caller folds with one range
//! kernel ([`GpuCodec::add_range_device`]). Nothing here synchronizes except the reads.

use super::*;
use crate::format::Dtype;

/// A device-side accumulator of a finite value range: the two `u64` order-preserving keys of
/// `kernels/util.cu`'s `zu_range` (word 0 = the largest key, word 1 = the largest complemented
/// key, both 0 = empty), which kernels raise with `atomicMax` on their stream, so that ranges of
/// several buffers (or of the chunks of one buffer) accumulate with no host synchronisation;
/// only [`DeviceRange::read`] waits.
///
/// The keys are in the element's own width (f32 keys in the low 32 bits), so one accumulator
/// takes one dtype between clears: the first fold records it and a fold of the other dtype is
/// refused ([`Error::Mismatch`]).
///
/// Ordering: the folds run on the [`GpuCodec`]'s stream; [`DeviceRange::clear`] and
/// [`DeviceRange::read`] run on the stream they are given. Pass the codec's stream (or order the
/// streams yourself).
pub struct DeviceRange {
    /// The two key words.
    words: CudaSlice<u64>,
    /// The dtype of the values folded since the last clear (the keys' width), `None` before the
    /// first fold.
    dtype: Option<Dtype>,
}

impl std::fmt::Debug for DeviceRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceRange")
            .field("dtype", &self.dtype)
            .finish_non_exhaustive()
    }
}

impl DeviceRange {
    /// An empty accumulator (zeroed words, allocated on `stream`'s device).
    pub fn new(stream: &Arc<CudaStream>) -> Result<DeviceRange> {
        stream.context().bind_to_thread().map_err(gpu_err("bind"))?;
        let words = stream
            .alloc_zeros::<u64>(2)
            .map_err(|e| Error::OutOfMemory(format!("range words: {e:?}")))?;
        Ok(DeviceRange { words, dtype: None })
    }

    /// Empty it again (a memset queued on `stream`, no synchronisation), for the next reduction.
    pub fn clear(&mut self, stream: &Arc<CudaStream>) -> Result<()> {
        stream.context().bind_to_thread().map_err(gpu_err("bind"))?;
        stream
            .memset_zeros(&mut self.words)
            .map_err(gpu_err("memset"))?;
        self.dtype = None;
        Ok(())
    }

    /// The smallest and largest finite value folded in since the last clear, `None` when there
    /// was none: equal to [`crate::quant::finite_range`] of all those values (`-0.0` as
    /// `+0.0`), decoded as [`GpuCodec::value_range_device`] decodes its kernel's keys.
    /// Synchronizes `stream` (after the folds queued on it).
    pub fn read(&self, stream: &Arc<CudaStream>) -> Result<Option<(f64, f64)>> {
        stream.context().bind_to_thread().map_err(gpu_err("bind"))?;
        let mut h = [0u64; 2];
        stream
            .memcpy_dtoh(&self.words, &mut h[..])
            .map_err(gpu_err("range d2h"))?;
        stream.synchronize().map_err(gpu_err("sync"))?;
        Ok(match self.dtype {
            Some(Dtype::F64) => util::decode_keys::<f64>(h),
            Some(_) => util::decode_keys::<f32>(h),
            // nothing folded since the clear: the words are zero
            None => None,
        })
    }

    /// The words' device address for a fold of `T` values on `s`, recording `T` as the
    /// accumulator's dtype (refused when it holds keys of the other dtype).
    pub(crate) fn words_for<T: GpuElement>(&mut self, s: &CudaStream) -> Result<u64> {
        match self.dtype {
            Some(d) if d != T::DTYPE => {
                return Err(Error::Mismatch {
                    what: "dtype of a DeviceRange",
                    expected: d.to_string(),
                    found: T::DTYPE.to_string(),
                })
            }
            _ => self.dtype = Some(T::DTYPE),
        }
        Ok(raw_ptr_mut(&mut self.words, s))
    }
}

impl GpuCodec {
    /// [`crate::quant::sampled_range`] of `x` (device memory): the finite range of every value
    /// when `x` holds at most [`crate::quant::RANGE_SAMPLES`], else of the values at `k * (n /
    /// RANGE_SAMPLES)` for `k < RANGE_SAMPLES` and the last one, with the canonical zero; `None`
    /// when no value read is finite. One small kernel (65,537 strided reads at most) and a
    /// read-back: synchronizes the stream. A reduction bounds its first quantisations with it
    /// before any pass over the whole input.
    pub fn sampled_range_device<T: GpuElement>(
        &mut self,
        x: &CudaView<'_, T>,
    ) -> Result<Option<(f64, f64)>> {
        let s = self.stream.clone();
        if raw_ptr(x, &s) % (T::SIZE as u64) != 0 {
            return Err(Error::invalid("device buffer must be element aligned"));
        }
        self.last_times = KernelTimes::default();
        util::RangeScale::for_stream(&s)?.sampled(&s, x)
    }

    /// Fold the finite range of `x` (device memory) into `acc`: one range kernel on this codec's
    /// stream, no synchronisation (for what the fused kernels did not fold: their `false`).
    pub fn add_range_device<T: GpuElement>(
        &mut self,
        x: &CudaView<'_, T>,
        acc: &mut DeviceRange,
    ) -> Result<()> {
        let s = self.stream.clone();
        if raw_ptr(x, &s) % (T::SIZE as u64) != 0 {
            return Err(Error::invalid("device buffer must be element aligned"));
        }
        let words = acc.words_for::<T>(&s)?;
        if x.is_empty() {
            return Ok(());
        }
        util::RangeScale::for_stream(&s)?.fold(&s, x, words)
    }

    /// [`GpuCodec::compress_device`] of `input` under [`ErrorBound::Abs`]`(abs_bound)` (the same
    /// bytes, the same errors), which, when the returned flag is `true`, has also folded the
    /// finite range of `input` into `acc` inside the compression kernel (its pass 1 reads every
    /// value once anyway), so that no range pass of its own is needed. No synchronisation
    /// beyond [`GpuCodec::compress_device`]'s.
    ///
    /// Tracked (`true`): aatrox, cuszp-plain and cuszp-outlier, f32 and f64, with a
    /// non-degenerate bound, whatever the stream becomes (compressed, or stored when it would
    /// not be smaller: the kernel has read every value by then); an empty input (nothing to
    /// fold). Not tracked (`false`, `acc` untouched: the caller folds `input` with
    /// [`GpuCodec::add_range_device`]): the other codecs and a degenerate bound (whose
    /// quantisation step [`crate::quant::QuantParams::derive_abs`] refuses).
    pub fn compress_device_tracking<T: GpuElement>(
        &mut self,
        input: &CudaView<'_, T>,
        abs_bound: f64,
        codec: CodecKind,
        out: &mut CudaViewMut<'_, u8>,
        acc: &mut DeviceRange,
    ) -> Result<(usize, bool)> {
        let bound = ErrorBound::Abs(abs_bound);
        let blocked = matches!(
            codec,
            CodecKind::Aatrox | CodecKind::CuszpPlain | CodecKind::CuszpOutlier
        );
        let untracked = |gpu: &mut Self, out: &mut CudaViewMut<'_, u8>| {
            gpu.compress_device(input, bound, codec, out)
                .map(|len| (len, input.is_empty()))
        };
        if !blocked || input.is_empty() {
            return untracked(self, out);
        }
        // (validates the bound as compress_device does; None: degenerate step)
        let Some(params) = QuantParams::derive_abs::<T>(abs_bound)? else {
            return untracked(self, out);
        };
        // the checks of compress_device_impl, in its order
        let n = input.len();
        let (in_ptr, out_ptr, n_chunks) = self.blocked_buffers(input, codec, out)?;
        let s = self.stream.clone();
        let words = acc.words_for::<T>(&s)?;
        self.last_times = KernelTimes::default();
        self.zero_ctrl(n_chunks)?;
        let len =
            self.compress_with_params::<T>(in_ptr, n, codec, &params, false, Some(words), out_ptr)?;
        Ok((len, true))
    }
}
