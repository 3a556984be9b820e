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
//! decode of its own stream).

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
        self.decompress_add_impl(stream, None, out)
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
        self.decompress_add_impl(stream, Some(base), out)
    }

    fn decompress_add_impl<T: GpuElement>(
        &mut self,
        stream: &CudaView<'_, u8>,
        base: Option<&CudaView<'_, T>>,
        out: &mut CudaViewMut<'_, T>,
    ) -> Result<()> {
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
            return self.decompress_add_shaped(stream, out);
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
            return s.synchronize().map_err(gpu_err("sync"));
        }
        let e =
            self.decode_with_header::<T>("decompress_add", &h, sp, stream.len(), op, base_ptr)?;
        if e != 0 {
            return Err(decode_error(e));
        }
        Ok(())
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
        let has_kernel = matches!(
            codec,
            CodecKind::Aatrox | CodecKind::CuszpPlain | CodecKind::CuszpOutlier
        );
        if !enc.reconstruct || !has_kernel || acc.is_empty() {
            return Ok(None);
        }
        let Some(params) = QuantParams::derive_abs::<T>(enc.abs_bound)? else {
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
        let len = self.compress_blocked::<T>(acc, codec, &params, true, out)?;
        if len < HEADER_LEN + acc.len() * T::SIZE {
            return Ok(Some(len));
        }
        // Incompressible: the stream stores the sum itself, which `acc` may no longer hold
        // (partly reconstructed): form it again and store it.
        sum(self, acc)?;
        self.compress_blocked::<T>(acc, codec, &params, false, out)
            .map(Some)
    }
}
