//! Fused decompress-and-accumulate (`out = base + decompress(stream)` in one kernel), used by
//! the ring reductions (`comm::device_ring`, `comm::nccl`): the `zc_decompress_add_*`
//! instantiations of `kernels/blocked.cu` (`ACCUMULATE = true`) add every decoded value to the
//! base with one IEEE rounding (`__fadd_rn` / `__dadd_rn`) instead of storing it, so no
//! decompressed copy is ever materialised; the base may be `out` itself or another buffer (a
//! ring step then adds a received partial sum to its input without first copying the input).
//! Stored (uncompressed) streams are checksummed, then added by `zc_add_raw_*`; pfpl adds in
//! place, so for those two a separate base is first copied into `out`.
//!
//! [`GpuCodec::reduce_step_device`] goes one step further for a ring's reduce step: one kernel
//! decodes the received partial sum onto the input and compresses the sum, chunk by chunk, while
//! the chunk is still in L2, and can leave behind what that stream decodes to.

use super::*;

/// Bytes of dynamic shared memory a fused ring step is launched with (kernels/blocked.cu
/// `ZC_POOL_BYTES`, checked by a test): the pool the decoder's and the encoder's shared arrays
/// overlap in.
pub(crate) const FUSED_POOL_BYTES: u32 = 48128;

/// How [`GpuCodec::reduce_step_device`] compresses the sum it forms.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepEncoding {
    /// The codec (the fused kernels exist for aatrox, cuszp-plain and cuszp-outlier).
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
        let in_place = h.is_stored() || CodecKind::from_tag(h.codec)? == CodecKind::Pfpl;
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
        if h.is_stored() {
            let payload = sp + HEADER_LEN as u64;
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

    /// One step of a compressed ring reduction in one kernel: `acc[i] = base[i] + x[i]` (`x` the
    /// device-resident `incoming` stream decoded, with the single rounding of
    /// [`GpuCodec::decompress_add_to_device`]), divided by `enc.divisor` unless it is 1 (IEEE
    /// division, as the ring's scaling), then compressed with `enc.codec` under the absolute
    /// bound `enc.abs_bound` into `out` (at least [`crate::compress_bound`] bytes, 16-byte
    /// aligned). Returns the stream's length; its bytes are those of [`GpuCodec::compress_device`]
    /// on the sum. With `enc.reconstruct`, `acc` is left holding what the stream decodes to (the
    /// ring's final segment: the rank keeps exactly what every other rank decodes, without
    /// decoding its own stream), otherwise the sum.
    ///
    /// `Ok(None)`, with nothing written, when the step has no fused kernel (the caller then makes
    /// the separate calls): a codec without one, an `incoming` stream that is stored or of another
    /// codec or bound mode, a bound whose quantisation step is degenerate. `base` and `acc` have
    /// the same length and do not overlap. On an error `acc` and `out` are unspecified.
    pub fn reduce_step_device<T: GpuElement>(
        &mut self,
        incoming: &CudaView<'_, u8>,
        base: &CudaView<'_, T>,
        acc: &mut CudaViewMut<'_, T>,
        enc: StepEncoding,
        out: &mut CudaViewMut<'_, u8>,
    ) -> Result<Option<usize>> {
        let n = acc.len();
        if base.len() != n {
            return Err(Error::Mismatch {
                what: "value count",
                expected: n.to_string(),
                found: format!("{} in the base", base.len()),
            });
        }
        let codec = enc.codec;
        let fused = matches!(
            codec,
            CodecKind::Aatrox | CodecKind::CuszpPlain | CodecKind::CuszpOutlier
        );
        if !fused || n == 0 {
            return Ok(None);
        }
        let bound = ErrorBound::Abs(enc.abs_bound);
        bound.validate()?;
        let raw_len = n * T::SIZE;
        if out.len() < HEADER_LEN + raw_len {
            return Err(Error::invalid(format!(
                "output buffer of {} bytes is smaller than compress_bound = {}",
                out.len(),
                HEADER_LEN + raw_len
            )));
        }
        let h = self.inspect_device(incoming)?;
        check_header_for::<T>(&h, n)?;
        let nc = n.div_ceil(1 << codec.chunk_log2(T::DTYPE));
        let same = !h.is_stored()
            && h.mode != BoundMode::Rel
            && CodecKind::from_tag(h.codec)? == codec
            && h.n_chunks as usize == nc;
        // an abs bound needs no statistics of the sum unless its step is degenerate
        let mut degenerate = false;
        let params = QuantParams::derive_from_stats::<T>(
            bound,
            || None,
            || {
                degenerate = true;
                None
            },
        )?;
        if !same || degenerate {
            return Ok(None);
        }
        let s = self.stream.clone();
        let (sp, bp) = (raw_ptr(incoming, &s), raw_ptr(base, &s));
        let (ap, op) = (raw_ptr_mut(acc, &s), raw_ptr_mut(out, &s));
        if sp % 16 != 0 || op % 16 != 0 || ap % (T::SIZE as u64) != 0 || bp % (T::SIZE as u64) != 0
        {
            return Err(Error::invalid(
                "device buffers must be 16-byte (streams) / element aligned",
            ));
        }
        let f = self.func(&kernel_name::<T>("reduce_step", codec, BoundMode::Abs)?)?;
        f.set_attribute(
            cu_sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            FUSED_POOL_BYTES as i32,
        )
        .map_err(gpu_err("cuFuncSetAttribute"))?;
        self.last_times = KernelTimes::default();
        // the decoder's ctrl and status words, then the encoder's, cleared by one memset
        self.zero_ctrl(2 * nc + CTRL_WORDS)?;
        let (dctrl, dstatus) = (self.ctrl_ptr(), self.status_ptr());
        let cctrl = dstatus + 8 * nc as u64;
        let cstatus = cctrl + 8 * CTRL_WORDS as u64;
        let res = self.mapped_result_words()?;
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let (len, count, cap, nc32) = (
            incoming.len() as u64,
            n as u64,
            (HEADER_LEN + raw_len) as u64,
            nc as u32,
        );
        let tc = h.payload_checksum;
        let step = T::from_f64(h.step);
        let inv = T::from_f64(1.0 / step.to_f64());
        let (step64, eb) = (h.step, h.abs_bound);
        let divisor = T::from_f64(enc.divisor);
        let cstep = T::from_f64(params.step);
        let cinv = T::from_f64(1.0 / cstep.to_f64());
        let (cstep64, ceb) = (params.step, params.abs_bound);
        let hdr = header_words(&stream_header::<T>(codec, n, &params, 0, 0, nc32, 0));
        let recon = i32::from(enc.reconstruct);
        let mut args = [
            arg(&sp),
            arg(&len),
            arg(&ap),
            arg(&count),
            arg(&dstatus),
            arg(&dctrl),
            arg(&nc32),
            arg(&bp),
            arg(&tc),
            arg(&step),
            arg(&inv),
            arg(&step64),
            arg(&eb),
            arg(&seq),
            arg(&res),
            arg(&divisor),
            arg(&op),
            arg(&cap),
            arg(&cstatus),
            arg(&cctrl),
            arg(&cstep),
            arg(&cinv),
            arg(&cstep64),
            arg(&ceb),
            arg(&hdr),
            arg(&recon),
        ];
        self.record(2)?;
        self.launch_with_pool(&f, nc32, self.threads, FUSED_POOL_BYTES, &mut args)?;
        self.record(3)?;
        s.synchronize().map_err(gpu_err("sync"))?;
        self.last_times.main_ms = self.elapsed(2, 3)?;
        let host = self.mapped.as_ref().expect("allocated above").1 as *const u64;
        // SAFETY: `host` is the RES_WORDS-word mapped allocation; the kernel that writes it has
        // ended (stream synchronized), and nothing else writes it.
        let (e, got_seq) = unsafe {
            (
                std::ptr::read_volatile(host.add(R_ERR)),
                std::ptr::read_volatile(host.add(R_SEQ)),
            )
        };
        if got_seq != seq {
            return Err(Error::Gpu(
                "the fused ring step did not record its result".into(),
            ));
        }
        if e != 0 {
            return Err(decode_error(e));
        }
        let mut c = [0u8; 8];
        self.read_small(cctrl + 8 * C_PAYLOAD as u64, &mut c)?;
        let payload = u64::from_le_bytes(c);
        if payload < raw_len as u64 {
            return Ok(Some(HEADER_LEN + payload as usize));
        }
        // Incompressible: the stream is stored, and stores the sum itself, which `acc` may no
        // longer hold (reconstructed in place): form it again, in separate calls.
        self.decompress_add_to_device(incoming, base, acc)?;
        if enc.divisor != 1.0 {
            super::util::RangeScale::for_stream(&s)?.scale(&s, acc, divisor)?;
        }
        self.compress_device(&acc.as_view(), bound, codec, out)
            .map(Some)
    }
}
