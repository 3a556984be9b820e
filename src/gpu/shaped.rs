//! `cuszi` and `gpz` behind [`GpuCodec`]: the calls go to [`cuszi::CusziGpu`] and
//! [`gpz::GpzGpu`] on this codec's stream, with the zcomm stream around them written and checked
//! here exactly as the CPU path writes and checks it (FORMAT.md, GPZ-FORMAT.md).
//!
//! * `cuszi`: the CUDA class writes and reads the whole zcomm stream (version 3 header
//!   included); a message is the 1-D shape `[n]`, which is what [`crate::compress`] writes.
//! * `gpz`: the CUDA class writes and reads the inner GPZ stream. A message is `n` particles of
//!   one coordinate in input order; the outer header carries the quantizer parameters of
//!   [`crate::compress`] (the value range over all values, from the value-range kernel), the
//!   shape `[n]`, the GPZ header's length and checksum, and the GPZ stream follows it; a stream
//!   that does not compress is stored, as on the CPU.

use super::*;
use crate::codec::gpz::{GpzHeader, Order};
use crate::format::Dims;

impl GpuCodec {
    /// The `cuszi` kernels on this codec's stream, created at the first call.
    fn cuszi_gpu(&mut self) -> Result<&mut cuszi::CusziGpu> {
        if self.cuszi.is_none() {
            self.cuszi = Some(cuszi::CusziGpu::with_stream(self.stream.clone())?);
        }
        Ok(self.cuszi.as_mut().expect("created above"))
    }

    /// The `gpz` kernels on this codec's stream, created at the first call.
    fn gpz_gpu(&mut self) -> Result<&mut gpz::GpzGpu> {
        if self.gpz.is_none() {
            self.gpz = Some(gpz::GpzGpu::with_stream(self.stream.clone())?);
        }
        Ok(self.gpz.as_mut().expect("created above"))
    }

    /// Run `op` (one `cuszi` or `gpz` call, several kernels) between the timing events, so that
    /// with kernel timing on [`GpuCodec::last_kernel_times`] reports the span of its device work
    /// as `main_ms`.
    fn timed<R>(&mut self, op: impl FnOnce(&mut Self) -> Result<R>) -> Result<R> {
        self.last_times = KernelTimes::default();
        self.record(2)?;
        let r = op(self)?;
        self.record(3)?;
        if self.timing {
            self.stream.synchronize().map_err(gpu_err("sync"))?;
            self.last_times.main_ms = self.elapsed(2, 3)?;
        }
        Ok(r)
    }

    /// The output check of the shape-aware codecs: their streams have the version 3 header, so
    /// `out` must hold [`crate::compress_bound`] bytes.
    fn check_shaped_out<T: GpuElement>(n: usize, out: &CudaViewMut<'_, u8>) -> Result<()> {
        let cap = crate::format::compress_bound(n, T::DTYPE);
        if out.len() < cap {
            return Err(Error::invalid(format!(
                "output buffer of {} bytes is smaller than compress_bound = {cap}",
                out.len()
            )));
        }
        Ok(())
    }

    /// Compress `input` with the CPU twin on a host copy ([`crate::compress`], or
    /// [`crate::compress_with_range`] with `range`) and write the stream to `out` (at least
    /// [`crate::compress_bound`] bytes): what has no kernels, with the same bytes.
    fn compress_on_host<T: GpuElement>(
        &mut self,
        input: &CudaView<'_, T>,
        bound: ErrorBound,
        codec: CodecKind,
        range: Option<(f64, f64)>,
        out: &mut CudaViewMut<'_, u8>,
    ) -> Result<usize> {
        let s = self.stream.clone();
        self.ctx.bind_to_thread().map_err(gpu_err("bind"))?;
        let mut host = vec![T::default(); input.len()];
        if !host.is_empty() {
            let ip = raw_ptr(input, &s);
            // SAFETY: the view holds input.len() values; synchronized before `host` is read.
            unsafe { cu::memcpy_dtoh_async(&mut host[..], ip, s.cu_stream()) }
                .map_err(gpu_err("dtoh"))?;
            s.synchronize().map_err(gpu_err("sync"))?;
        }
        let stream = match range {
            Some(r) => crate::codec::compress_with_range(&host, bound, codec, r)?,
            None => crate::codec::compress(&host, bound, codec)?,
        };
        if stream.len() > out.len() {
            return Err(Error::invalid(format!(
                "output buffer of {} bytes is smaller than the {}-byte stream",
                out.len(),
                stream.len()
            )));
        }
        let op = raw_ptr_mut(out, &s);
        // SAFETY: `out` holds stream.len() bytes (checked above); the pageable source lives
        // until the synchronization.
        unsafe { cu::memcpy_htod_async(op, &stream[..], s.cu_stream()) }
            .map_err(gpu_err("htod"))?;
        s.synchronize().map_err(gpu_err("sync"))?;
        Ok(stream.len())
    }

    /// [`GpuCodec::compress_device`] (with `range`: `compress_device_with_range`) of `cuszi`:
    /// the 1-D shape `[n]` on [`cuszi::CusziGpu`], which writes the whole stream (and itself
    /// runs the CPU twin for rel bounds and degenerate steps). Empty input and a given range
    /// have no kernels: the CPU twin on a host copy.
    pub(super) fn compress_cuszi<T: GpuElement>(
        &mut self,
        input: &CudaView<'_, T>,
        bound: ErrorBound,
        range: Option<(f64, f64)>,
        out: &mut CudaViewMut<'_, u8>,
    ) -> Result<usize> {
        let n = input.len();
        Self::check_shaped_out::<T>(n, out)?;
        self.timed(|this| {
            if n == 0 || range.is_some() {
                return this.compress_on_host(input, bound, CodecKind::Cuszi, range, out);
            }
            this.cuszi_gpu()?.compress_device(input, &[n], bound, out)
        })
    }

    /// [`GpuCodec::compress_device`] of `gpz`: `n` particles of one coordinate (input order) on
    /// [`gpz::GpzGpu`] into the scratch, wrapped as [`crate::compress`] wraps it. A given range
    /// and `rel` bounds are refused with the CPU's errors; empty input is the CPU's
    /// header-only stored stream.
    pub(super) fn compress_gpz<T: GpuElement>(
        &mut self,
        input: &CudaView<'_, T>,
        bound: ErrorBound,
        range: Option<(f64, f64)>,
        out: &mut CudaViewMut<'_, u8>,
    ) -> Result<usize> {
        if range.is_some() {
            return Err(crate::codec::gpz_no_range());
        }
        if matches!(bound, ErrorBound::Rel(_)) {
            return Err(crate::codec::gpz_no_rel());
        }
        let n = input.len();
        Self::check_shaped_out::<T>(n, out)?;
        let s = self.stream.clone();
        let (in_ptr, out_ptr) = (raw_ptr(input, &s), raw_ptr_mut(out, &s));
        if out_ptr % 16 != 0 || in_ptr % (T::SIZE as u64) != 0 {
            return Err(Error::invalid(
                "device buffers must be 16-byte (output) / element aligned",
            ));
        }
        self.timed(|this| {
            if n == 0 {
                return this.compress_on_host(input, bound, CodecKind::Gpz, None, out);
            }
            // the outer header's parameters: those of the values as one array, as the CPU
            // derives them (QuantParams::derive), from the value-range kernel
            this.zero_ctrl(0)?;
            let params = this.device_params::<T>(in_ptr, n, bound, None)?;
            let inner_cap = crate::codec::gpz::compress_bound(n, 1, T::DTYPE);
            Self::staging(&mut this.shaped_scratch, &s, inner_cap)?;
            let mut scratch = this.shaped_scratch.take().expect("grown");
            let r = this.wrap_gpz::<T>(input, bound, &params, &mut scratch, inner_cap, out_ptr);
            this.shaped_scratch = Some(scratch);
            r
        })
    }

    /// The GPZ stream of `input` written into `scratch` (`inner_cap` bytes at least), then the
    /// zcomm stream at `out_ptr` ([`crate::compress_bound`] bytes): header and GPZ stream, or
    /// the stored values when the GPZ stream is stored or not smaller than them.
    fn wrap_gpz<T: GpuElement>(
        &mut self,
        input: &CudaView<'_, T>,
        bound: ErrorBound,
        params: &QuantParams,
        scratch: &mut CudaSlice<u8>,
        inner_cap: usize,
        out_ptr: u64,
    ) -> Result<usize> {
        let s = self.stream.clone();
        let n = input.len();
        let inner_len = {
            let mut sv = scratch.slice_mut(..inner_cap);
            self.gpz_gpu()?
                .compress_device(input, 1, bound, Order::Preserve, &mut sv)?
        };
        let meta = crate::codec::gpz::layout::header_len(1);
        let mut head = [0u8; PINNED_WORDS * 8];
        self.read_small(raw_ptr(scratch, &s), &mut head[..meta])?;
        let g = GpzHeader::parse_with_len(&head[..meta], inner_len)?;
        let raw_len = n * T::SIZE;
        let header = Header {
            fill_value: None,
            dims: Some(Dims::linear(n as u64)),
            ..crate::codec::params_header::<T>(CodecKind::Gpz, n, params)
        };
        let payload = out_ptr + HEADER_LEN_V3 as u64;
        if g.stored || inner_len >= raw_len {
            // stored values, in input order (as the CPU's stored stream)
            let hash = self.copy_hash(raw_ptr(input, &s), raw_len, Some(payload))?;
            let h = Header {
                flags: FLAG_STORED,
                payload_len: raw_len as u64,
                payload_checksum: hash,
                ..header
            };
            self.write_bytes(out_ptr, &h.to_vec())?;
            return Ok(HEADER_LEN_V3 + raw_len);
        }
        let sp = raw_ptr(scratch, &s);
        // SAFETY: the scratch holds the inner_len-byte GPZ stream, and the output
        // compress_bound = HEADER_LEN_V3 + raw_len > HEADER_LEN_V3 + inner_len bytes.
        unsafe { cu::memcpy_dtod_async(payload, sp, inner_len, s.cu_stream()) }
            .map_err(gpu_err("dtod"))?;
        let h = Header {
            payload_len: inner_len as u64,
            payload_checksum: zhash_bytes(&head[..meta]),
            meta_len: meta as u32,
            ..header
        };
        // (synchronizes the stream: the copy above is done when this returns)
        self.write_bytes(out_ptr, &h.to_vec())?;
        Ok(HEADER_LEN_V3 + inner_len)
    }

    /// [`GpuCodec::decompress_device`] of a compressed `cuszi` stream (header checked against
    /// `out` by the caller): [`cuszi::CusziGpu::decompress_device`], which accepts and rejects
    /// what the CPU decoder does.
    pub(super) fn decompress_cuszi<T: GpuElement>(
        &mut self,
        stream: &CudaView<'_, u8>,
        out: &mut CudaViewMut<'_, T>,
    ) -> Result<()> {
        self.timed(|this| this.cuszi_gpu()?.decompress_device(stream, out))
    }

    /// [`GpuCodec::decompress_device`] of a compressed `gpz` stream whose header `h` was parsed
    /// and checked against `out`: the checks of the CPU's [`crate::inspect`] on the GPZ header
    /// (read to the host with the metadata checksum), then [`gpz::GpzGpu::decompress_device`]
    /// of the GPZ stream after the header.
    pub(super) fn decompress_gpz<T: GpuElement>(
        &mut self,
        stream: &CudaView<'_, u8>,
        h: &Header,
        out: &mut CudaViewMut<'_, T>,
    ) -> Result<()> {
        let (hl, meta) = (h.header_len(), h.meta_len as usize);
        let mut head = [0u8; PINNED_WORDS * 8];
        if meta > head.len() || hl + meta > stream.len() {
            // (Header::parse_fields_v3 holds the metadata to a GPZ header inside the payload)
            return Err(Error::corrupt("gpz metadata runs past the stream"));
        }
        let sp = raw_ptr(stream, &self.stream.clone());
        self.read_small(sp + hl as u64, &mut head[..meta])?;
        if zhash_bytes(&head[..meta]) != h.payload_checksum {
            return Err(Error::corrupt("chunk table checksum mismatch"));
        }
        let g = GpzHeader::parse_with_len(&head[..meta], h.payload_len as usize)?;
        crate::codec::check_gpz_payload(h, &g)?;
        let inner = stream.slice(hl..);
        self.timed(|this| this.gpz_gpu()?.decompress_device(&inner, out).map(|_| ()))
    }

    /// `out[i] += x[i]` for the compressed `cuszi` or `gpz` `stream` (header checked against
    /// `out` by the caller): decoded into the scratch by [`GpuCodec::decompress_device`], then
    /// added by `zc_add_raw_*` (one IEEE rounding per value, as the fused kernels).
    pub(super) fn decompress_add_shaped<T: GpuElement>(
        &mut self,
        stream: &CudaView<'_, u8>,
        out: &mut CudaViewMut<'_, T>,
    ) -> Result<()> {
        let s = self.stream.clone();
        let n = out.len();
        Self::staging(&mut self.shaped_scratch, &s, n * T::SIZE)?;
        let mut scratch = self.shaped_scratch.take().expect("grown");
        let r = (|| {
            // SAFETY: the scratch holds n values of T (grown above); the decoder writes all of
            // them before the addition reads them.
            let mut tmp = unsafe { scratch.transmute_mut::<T>(n) }
                .ok_or_else(|| Error::Gpu("decode scratch too small".into()))?;
            self.decompress_device(stream, &mut tmp)?;
            if n == 0 {
                return Ok(());
            }
            let (src, dst) = (raw_ptr_mut(&mut tmp, &s), raw_ptr_mut(out, &s));
            let f = self.func(&format!("zc_add_raw_{}", T::KERNEL_TAG))?;
            let n64 = n as u64;
            let grid = (self.sm_count * 8).min(n.div_ceil(256).max(1) as u32);
            self.launch(&f, grid, 256, &mut [arg(&src), arg(&n64), arg(&dst)])?;
            s.synchronize().map_err(gpu_err("sync"))
        })();
        self.shaped_scratch = Some(scratch);
        r
    }
}
