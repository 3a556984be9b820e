//! Fused decompress-and-accumulate (`out = base + decompress(stream)` in one kernel), used by
//! the ring reductions (`comm::device_ring`, `comm::nccl`): the `zc_decompress_add_*`
//! instantiations of `kernels/blocked.cu` (`ACCUMULATE = true`) add every decoded value to the
//! base with one IEEE rounding (`__fadd_rn` / `__dadd_rn`) instead of storing it, so no
//! decompressed copy is ever materialised; the base may be `out` itself or another buffer (a
//! ring step then adds a received partial sum to its input without first copying the input).
//! Stored (uncompressed) streams are checksummed, then added by `zc_add_raw_*`; pfpl adds in
//! place, so for those two a separate base is first copied into `out`. `cuszi` and `gpz`
//! streams have no accumulating kernels: they are decoded into a scratch buffer that
//! `zc_add_raw_*` then adds (the same single rounding per value), with the base copied into
//! `out` first as for pfpl.
//!
//! [`GpuCodec::reduce_step_device`] is a ring's whole reduce step: that accumulation, the
//! mean's division, and the compression of the sum by the `zc_compress_recon_*` kernels, which
//! leave in the sum's buffer what the stream decodes to (so the ring's final segment needs no
//! decode of its own stream); [`GpuCodec::compress_reconstruct_device`] is that compression on
//! its own, for a caller that forms the sum itself.
//!
//! [`GpuCodec::decompress_add_to_device_tracking`] is the three-operand accumulation that also
//! folds the finite range of its base into a [`DeviceRange`] (`zc_decompress_add_track_*`: the
//! kernel loads every base value anyway, and it is latency-bound, so the min / max costs little).

use super::*;

/// How [`GpuCodec::reduce_step_device`] compresses the sum it forms.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepEncoding {
    /// The codec (the reconstructing kernels exist for aatrox, cuszp-plain and cuszp-outlier;
    /// for the others [`GpuCodec::reduce_step_device`] does nothing and the caller compresses,
    /// then decodes).
    pub codec: CodecKind,
    /// The absolute error bound of the compression.
    pub abs_bound: f64,
    /// The sum is divided by this before it is compressed (a mean's last step), unless it is 1.
    pub divisor: f64,
    /// Leave in the sum's buffer the values the stream decodes to (what every receiver of the
    /// stream holds), instead of the sum itself.
    pub reconstruct: bool,
}

impl GpuCodec {
    /// `out[i] = out[i] + x[i]` where `x` is the device-resident `stream` decoded (same checks
    /// and errors as [`GpuCodec::decompress_device`]; on an error `out` may be partly updated).
    pub fn decompress_add_device<T: GpuElement>(
        &mut self,
        stream: &CudaView<'_, u8>,
        out: &mut CudaViewMut<'_, T>,
    ) -> Result<()> {
        self.decompress_add_impl(stream, None, out, None)
            .map(|_| ())
    }

    /// `out[i] = base[i] + x[i]` where `x` is the device-resident `stream` decoded, with the
    /// same single rounding as [`GpuCodec::decompress_add_device`] (whose result it equals bit
    /// for bit after copying `base` into `out`); `base` and `out` have the same length and do
    /// not overlap. On an error `out` may be partly written.
    pub fn decompress_add_to_device<T: GpuElement>(
        &mut self,
        stream: &CudaView<'_, u8>,
        base: &CudaView<'_, T>,
        out: &mut CudaViewMut<'_, T>,
    ) -> Result<()> {
        if base.len() != out.len() {
            return Err(Error::Mismatch {
                what: "value count",
                expected: out.len().to_string(),
                found: format!("{} in the base", base.len()),
            });
        }
        self.decompress_add_impl(stream, Some(base), out, None)
            .map(|_| ())
    }

    /// [`GpuCodec::decompress_add_to_device`] (the same result bits, the same checks and
    /// errors) which, when it returns `true`, has also folded the finite range of `base` into
    /// `acc` inside the fused decompress-and-add kernel, from the loads of the base it makes
    /// anyway. No synchronisation beyond [`GpuCodec::decompress_add_to_device`]'s.
    ///
    /// Tracked (`true`): compressed (not stored) aatrox, cuszp-plain and cuszp-outlier streams
    /// under an abs or noa bound, f32 and f64. Not tracked (`false`, `acc`
    /// untouched: the caller folds `base` with [`GpuCodec::add_range_device`]): stored streams,
    /// `rel` streams, pfpl, cuszi and gpz. On an error `acc` may hold part of the range.
    pub fn decompress_add_to_device_tracking<T: GpuElement>(
        &mut self,
        stream: &CudaView<'_, u8>,
        base: &CudaView<'_, T>,
        out: &mut CudaViewMut<'_, T>,
        acc: &mut DeviceRange,
    ) -> Result<bool> {
        if base.len() != out.len() {
            return Err(Error::Mismatch {
                what: "value count",
                expected: out.len().to_string(),
                found: format!("{} in the base", base.len()),
            });
        }
        self.decompress_add_impl(stream, Some(base), out, Some(acc))
    }

    /// The body of the decompress-and-add calls; `track` (with a separate `base`): fold the
    /// base's range into it where the kernel can (returns whether it did).
    fn decompress_add_impl<T: GpuElement>(
        &mut self,
        stream: &CudaView<'_, u8>,
        base: Option<&CudaView<'_, T>>,
        out: &mut CudaViewMut<'_, T>,
        mut track: Option<&mut DeviceRange>,
    ) -> Result<bool> {
        if let Some(tracked) = self.decompress_add_guessed(stream, base, out, &mut track)? {
            return Ok(tracked);
        }
        let h = self.inspect_device(stream)?;
        check_header_for::<T>(&h, out.len())?;
        let s = self.stream.clone();
        let sp = raw_ptr(stream, &s);
        if sp % 16 != 0 || raw_ptr_mut(out, &s) % (T::SIZE as u64) != 0 {
            return Err(Error::invalid(
                "device buffers must be 16-byte (stream) / element aligned",
            ));
        }
        // the kernels that add in place get the base copied into `out` first
        let codec = CodecKind::from_tag(h.codec)?;
        let shaped = !h.is_stored() && matches!(codec, CodecKind::Cuszi | CodecKind::Gpz);
        let in_place = h.is_stored() || codec == CodecKind::Pfpl || shaped;
        let base_ptr = match base {
            Some(b) if in_place => {
                s.memcpy_dtod(b, out).map_err(gpu_err("copy base"))?;
                raw_ptr_mut(out, &s)
            }
            Some(b) => {
                let bp = raw_ptr(b, &s);
                if bp % (T::SIZE as u64) != 0 {
                    return Err(Error::invalid("the base must be element aligned"));
                }
                bp
            }
            None => raw_ptr_mut(out, &s),
        };
        let op = raw_ptr_mut(out, &s);
        self.last_times = KernelTimes::default();
        if shaped {
            return self.decompress_add_shaped(stream, out).map(|_| false);
        }
        if h.is_stored() {
            let payload = sp + h.header_len() as u64;
            let got = self.copy_hash(payload, h.payload_len as usize, None)?;
            if got != h.payload_checksum {
                return Err(Error::corrupt("stored payload checksum mismatch"));
            }
            let f = self.func(&format!("zc_add_raw_{}", T::KERNEL_TAG))?;
            let n = h.count;
            let grid = (self.sm_count * 8).min((n as usize).div_ceil(256).max(1) as u32);
            self.launch(&f, grid, 256, &mut [arg(&payload), arg(&n), arg(&op)])?;
            s.synchronize().map_err(gpu_err("sync"))?;
            return Ok(false);
        }
        // the tracking kernels: a separate base, a blocked codec, abs/noa (the rest: `false`)
        let words = match track {
            Some(acc) if base.is_some() && codec != CodecKind::Pfpl && h.mode != BoundMode::Rel => {
                Some(acc.words_for::<T>(&s)?)
            }
            _ => None,
        };
        let e = self.decode_with_header::<T>(
            "decompress_add",
            &h,
            sp,
            stream.len(),
            op,
            base_ptr,
            words,
        )?;
        if e != 0 {
            return Err(decode_error(e));
        }
        if codec != CodecKind::Pfpl {
            self.decode_guess = Some((T::DTYPE, codec, h.mode));
        }
        Ok(words.is_some())
    }

    /// The decompress-and-add launched before the header is back, for the dtype, codec and
    /// mode of the last blocked stream decoded (as [`GpuCodec::decompress_device`] does; a
    /// ring's pieces all share them): `Some(tracked)` when it ran (`out` holds the sums;
    /// `tracked` as [`GpuCodec::decompress_add_to_device_tracking`] returns), `None` when the
    /// ordinary path must decide (no guess, another header: nothing was written).
    fn decompress_add_guessed<T: GpuElement>(
        &mut self,
        stream: &CudaView<'_, u8>,
        base: Option<&CudaView<'_, T>>,
        out: &mut CudaViewMut<'_, T>,
        track: &mut Option<&mut DeviceRange>,
    ) -> Result<Option<bool>> {
        let Some((dtype, codec, mode)) = self.decode_guess else {
            return Ok(None);
        };
        if dtype != T::DTYPE || codec == CodecKind::Pfpl {
            return Ok(None);
        }
        let s = self.stream.clone();
        let base_ptr = match base {
            Some(b) => raw_ptr(b, &s),
            None => raw_ptr_mut(out, &s),
        };
        if base_ptr % (T::SIZE as u64) != 0 {
            return Ok(None); // the ordinary path rejects it
        }
        // tracking as the ordinary path: a separate base, an abs/noa stream
        let onto = match track {
            Some(acc) if base.is_some() && mode != BoundMode::Rel => {
                Onto::Tracking(base_ptr, acc.words_for::<T>(&s)?)
            }
            _ => Onto::Base(base_ptr),
        };
        let ran = self.decompress_speculative::<T>(stream, out, (codec, mode), onto)?;
        Ok(ran.then_some(matches!(onto, Onto::Tracking(..))))
    }

    /// One step of a compressed ring reduction: `acc[i] = base[i] + x[i]` (`x` the
    /// device-resident `incoming` stream decoded, as [`GpuCodec::decompress_add_to_device`]),
    /// divided by `enc.divisor` unless it is 1 (IEEE division, as the ring's scaling), then
    /// compressed with `enc.codec` under the absolute bound `enc.abs_bound` into `out` (at least
    /// [`crate::compress_bound`] bytes, 16-byte aligned). Returns the stream's length; its bytes
    /// are those of [`GpuCodec::compress_device`] on the sum. With `enc.reconstruct`, `acc` is
    /// left holding what the stream decodes to (the ring's final segment: the rank keeps exactly
    /// what every other rank decodes, without decoding its own stream; the compression kernel
    /// writes each value's reconstruction right after its last read of it), otherwise the sum.
    ///
    /// `Ok(None)`, with nothing written, when the step has nothing to gain over the separate
    /// calls (the caller then makes them): no reconstruction asked for, a codec without the
    /// reconstructing kernel, or a bound whose quantisation step is degenerate. `base` and `acc`
    /// have the same length and do not overlap. On an error `acc` and `out` are unspecified.
    pub fn reduce_step_device<T: GpuElement>(
        &mut self,
        incoming: &CudaView<'_, u8>,
        base: &CudaView<'_, T>,
        acc: &mut CudaViewMut<'_, T>,
        enc: StepEncoding,
        out: &mut CudaViewMut<'_, u8>,
    ) -> Result<Option<usize>> {
        let codec = enc.codec;
        if !enc.reconstruct {
            return Ok(None);
        }
        let Some(params) = Self::reconstructing_params::<T>(codec, enc.abs_bound, acc.len())?
        else {
            return Ok(None);
        };
        let s = self.stream.clone();
        let divisor = T::from_f64(enc.divisor);
        let sum = |gpu: &mut Self, acc: &mut CudaViewMut<'_, T>| -> Result<()> {
            gpu.decompress_add_to_device(incoming, base, acc)?;
            if enc.divisor != 1.0 {
                super::util::RangeScale::for_stream(&s)?.scale(&s, acc, divisor)?;
            }
            Ok(())
        };
        sum(self, acc)?;
        if let Some(len) = self.compress_reconstruct_with(acc, codec, &params, out)? {
            return Ok(Some(len));
        }
        // Incompressible: the stream stores the sum itself, which `acc` may no longer hold
        // (partly reconstructed): form it again and store it.
        sum(self, acc)?;
        self.compress_blocked::<T>(acc, codec, &params, false, out)
            .map(Some)
    }

    /// Compress `acc` (device memory) with `codec` under the absolute bound `abs_bound` into
    /// `out` (at least [`crate::compress_bound`] bytes, 16-byte aligned) with the reconstructing
    /// `zc_compress_recon_*` kernel, which leaves in `acc` what the stream decodes to (each
    /// value's reconstruction written right after its last read): the second half of
    /// [`GpuCodec::reduce_step_device`], for a caller that forms the sum itself. Returns the
    /// stream's length; its bytes are those of [`GpuCodec::compress_device`] on `acc`'s values
    /// under [`ErrorBound::Abs`]`(abs_bound)`.
    ///
    /// `Ok(None)`, with nothing written, for a codec without the reconstructing kernel (only
    /// aatrox, cuszp-plain and cuszp-outlier have one), a bound whose quantisation step is
    /// degenerate, or no values. `Ok(None)` too when the result is incompressible (the stream
    /// would store the values, which `acc` may no longer hold): then `acc` may be partly
    /// overwritten with reconstructions and `out` holds nothing useful; the caller re-forms the
    /// values and compresses them with [`GpuCodec::compress_device`]. On an error `acc` and
    /// `out` are unspecified.
    pub fn compress_reconstruct_device<T: GpuElement>(
        &mut self,
        acc: &mut CudaViewMut<'_, T>,
        codec: CodecKind,
        abs_bound: f64,
        out: &mut CudaViewMut<'_, u8>,
    ) -> Result<Option<usize>> {
        let Some(params) = Self::reconstructing_params::<T>(codec, abs_bound, acc.len())? else {
            return Ok(None);
        };
        self.compress_reconstruct_with::<T>(acc, codec, &params, out)
    }

    /// [`GpuCodec::compress_reconstruct_device`] with its quantizer.
    fn compress_reconstruct_with<T: GpuElement>(
        &mut self,
        acc: &mut CudaViewMut<'_, T>,
        codec: CodecKind,
        params: &QuantParams,
        out: &mut CudaViewMut<'_, u8>,
    ) -> Result<Option<usize>> {
        let len = self.compress_blocked::<T>(acc, codec, params, true, out)?;
        Ok((len < HEADER_LEN + acc.len() * T::SIZE).then_some(len))
    }

    /// The quantizer of [`GpuCodec::compress_reconstruct_device`], `None` where it compresses
    /// nothing (no reconstructing kernel for `codec`, no values, a degenerate step); errors
    /// for an invalid bound.
    fn reconstructing_params<T: GpuElement>(
        codec: CodecKind,
        abs_bound: f64,
        n: usize,
    ) -> Result<Option<QuantParams>> {
        let has_kernel = matches!(
            codec,
            CodecKind::Aatrox | CodecKind::CuszpPlain | CodecKind::CuszpOutlier
        );
        if !has_kernel || n == 0 {
            return Ok(None);
        }
        QuantParams::derive_abs::<T>(abs_bound)
    }
}
