//! [`DeviceStager`]: the GPU codec, device scratch and reused pinned host buffers behind every
//! staged device operation, and the local staging to / from the host.

use super::*;

/// The utility kernels of the device reductions (value range, the mean's division).
pub(super) type DevUtils = crate::gpu::util::RangeScale;

/// Compile (or take from the cache) and load them on `stream`'s context.
pub(super) fn load_dev_utils(stream: &std::sync::Arc<CudaStream>) -> Result<DevUtils> {
    let (m, blocks) =
        crate::gpu::util::compile_and_load(stream, crate::gpu::compile::Module::Util)?;
    DevUtils::from_module(&m, blocks)
}

/// Wall-clock seconds of each stage of the last staged operation on this rank.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct StageTimes {
    /// GPU compression.
    pub compress: f64,
    /// Device→host copy.
    pub d2h: f64,
    /// MPI exchange (descriptors, payload, verdict).
    pub network: f64,
    /// Host→device copy.
    pub h2d: f64,
    /// GPU decompression.
    pub decompress: f64,
}

/// A stager's pinned buffer lent to a non-blocking transfer ([`OwnedBytes`]; handed back to
/// the stager by the wait).
pub(super) struct PinnedBytes(PinnedHostSlice<u8>);

impl OwnedBytes for PinnedBytes {
    fn bytes(&mut self) -> Result<&mut [u8]> {
        self.0.as_mut_slice().map_err(gpu_err("pinned"))
    }
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any> {
        self
    }
}

/// GPU codec + device scratch + pinned host buffers for staged communication.
pub struct DeviceStager {
    pub(super) gpu: GpuCodec,
    pub(super) scratch_out: Option<CudaSlice<u8>>,
    pub(super) scratch_in: Option<CudaSlice<u8>>,
    pub(super) pinned_send: Option<PinnedHostSlice<u8>>,
    pub(super) pinned_recv: Option<PinnedHostSlice<u8>>,
    /// Device buffers that received staged messages of the device ring, for reuse.
    pub(super) recv_pool: Vec<CudaSlice<u8>>,
    pub(super) profile: Option<Profile>,
    /// Value range / scaling kernels of the device reductions (compiled on first use).
    pub(super) utils: Option<DevUtils>,
    /// Stage times of the last operation.
    pub last: StageTimes,
    /// The model's stages of the last operation's path (compressed or raw) at the ratios it
    /// achieved (see [`Terms`]; for a pipelined exchange the serial sums of its chunks).
    pub last_predicted: Terms,
}

impl std::fmt::Debug for DeviceStager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceStager({:?})", self.gpu)
    }
}

pub(super) fn now() -> std::time::Instant {
    std::time::Instant::now()
}

impl DeviceStager {
    /// Wrap a GPU codec (no calibration yet: see [`calibrate`](Self::calibrate)).
    pub fn new(gpu: GpuCodec) -> Self {
        DeviceStager {
            gpu,
            scratch_out: None,
            scratch_in: None,
            pinned_send: None,
            pinned_recv: None,
            recv_pool: Vec::new(),
            profile: None,
            utils: None,
            last: StageTimes::default(),
            last_predicted: Terms::default(),
        }
    }
    /// The GPU codec (its stream is the one all copies run on).
    pub fn gpu(&mut self) -> &mut GpuCodec {
        &mut self.gpu
    }
    /// The profile (the communicator's host parts and the device parts), if calibrated.
    pub fn profile(&self) -> Option<Profile> {
        self.profile.clone()
    }
    /// Use a known profile.
    pub fn set_profile(&mut self, p: Profile) {
        self.profile = Some(p);
    }

    /// Allocate now the device scratch and pinned host buffers that staged messages of up to
    /// `values` elements of `T` need (compressed or raw), so that the first operation of that
    /// size does not pay for them: pinning gigabytes of host memory takes a large part of a
    /// second, which would otherwise land in the first exchange's time (and in its comparison
    /// with the model). Buffers only grow; later, larger messages grow them again.
    pub fn reserve<T: GpuElement>(&mut self, values: usize) -> Result<()> {
        let s = self.stream();
        let cap = crate::compress_bound(values, T::DTYPE);
        Self::grow_dev(&mut self.scratch_out, &s, cap)?;
        Self::grow_dev(&mut self.scratch_in, &s, cap)?;
        Self::grow_pinned(&mut self.pinned_send, &s, cap)?;
        Self::grow_pinned(&mut self.pinned_recv, &s, cap)
    }

    pub(super) fn stream(&self) -> std::sync::Arc<CudaStream> {
        self.gpu.stream().clone()
    }

    pub(super) fn grow_dev(
        slot: &mut Option<CudaSlice<u8>>,
        s: &std::sync::Arc<CudaStream>,
        n: usize,
    ) -> Result<()> {
        let need = n.max(4).next_multiple_of(4);
        if slot.as_ref().map_or(true, |b| b.len() < need) {
            *slot = None;
            // SAFETY: scratch is written (by a kernel or a copy) before it is read.
            let b = unsafe { s.alloc::<u8>(need) }
                .map_err(|e| Error::OutOfMemory(format!("{need} device bytes: {e:?}")))?;
            *slot = Some(b);
        }
        Ok(())
    }

    pub(super) fn grow_pinned(
        slot: &mut Option<PinnedHostSlice<u8>>,
        s: &std::sync::Arc<CudaStream>,
        n: usize,
    ) -> Result<()> {
        let need = n.max(1);
        if slot.as_ref().map_or(true, |b| b.len() < need) {
            *slot = None;
            // SAFETY: pinned memory is written by a copy before it is read; flags 0 (cached,
            // not write-combined) because the CPU (MPI) reads it.
            let b = unsafe { s.context().alloc_pinned_with_flags::<u8>(need, 0) }
                .map_err(|e| Error::OutOfMemory(format!("{need} pinned bytes: {e:?}")))?;
            *slot = Some(b);
        }
        Ok(())
    }

    /// Compress `data` on the device into the device scratch; returns the stream length.
    pub(super) fn compress_to_scratch<T: GpuElement>(
        &mut self,
        data: &CudaView<'_, T>,
        bound: ErrorBound,
        codec: CodecKind,
    ) -> Result<usize> {
        let s = self.stream();
        Self::grow_dev(
            &mut self.scratch_out,
            &s,
            crate::compress_bound(data.len(), T::DTYPE),
        )?;
        let mut out = self.scratch_out.take().expect("grown");
        let r = {
            let mut v = out.slice_mut(..);
            self.gpu.compress_device(data, bound, codec, &mut v)
        };
        self.scratch_out = Some(out);
        r
    }

    /// Estimated compression ratio of `x` under `bound` with `codec`: up to `chunks` codec
    /// chunks spread evenly over it ([`device_sample`]) compressed on the GPU, as
    /// [`model::estimate_ratio`] does on the host. A `noa` bound is first made the absolute
    /// bound of the whole buffer (one value-range pass), so that the sample sees the step the
    /// message will get.
    pub(super) fn sample_ratio<T: GpuElement>(
        &mut self,
        x: &CudaView<'_, T>,
        bound: ErrorBound,
        codec: CodecKind,
        chunks: usize,
    ) -> Result<f64> {
        if x.is_empty() {
            return Ok(1.0);
        }
        let bound = match bound {
            ErrorBound::Noa(e) => match self.gpu.value_range_device(x)? {
                Some((lo, hi)) if e * (hi - lo) > 0.0 && (e * (hi - lo)).is_finite() => {
                    ErrorBound::Abs(e * (hi - lo))
                }
                _ => bound,
            },
            b => b,
        };
        let s = self.stream();
        let sample = device_sample(&s, x, chunks)?;
        let len = self.compress_to_scratch(&sample.as_view(), bound, codec)?;
        Ok((sample.len() * T::SIZE) as f64 / len.max(1) as f64)
    }

    /// Copy `n` bytes of device memory at `src` into `dst` (host) and wait.
    pub(super) fn d2h(s: &CudaStream, src: u64, dst: &mut [u8]) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        // raw driver call: make the stream's context current on this thread first
        s.context().bind_to_thread().map_err(gpu_err("bind"))?;
        // SAFETY: the caller guarantees `src` holds at least dst.len() bytes on this stream's
        // context; we synchronize before returning so `dst` is not used while the copy runs.
        unsafe { cu::memcpy_dtoh_async(dst, src, s.cu_stream()) }.map_err(gpu_err("d2h"))?;
        s.synchronize().map_err(gpu_err("sync"))
    }

    /// Copy `src` (host) to device memory at `dst` and wait.
    pub(super) fn h2d(s: &CudaStream, src: &[u8], dst: u64) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        s.context().bind_to_thread().map_err(gpu_err("bind"))?;
        // SAFETY: the caller guarantees `dst` holds at least src.len() bytes; synchronized
        // before returning so `src` outlives the copy.
        unsafe { cu::memcpy_htod_async(dst, src, s.cu_stream()) }.map_err(gpu_err("h2d"))?;
        s.synchronize().map_err(gpu_err("sync"))
    }

    /// Compress a device buffer on the GPU and keep the stream in host memory.
    pub fn stage_to_host<T: GpuElement>(
        &mut self,
        data: &CudaView<'_, T>,
        bound: ErrorBound,
        codec: CodecKind,
    ) -> Result<Staged> {
        let len = self.compress_timed(data, bound, codec)?;
        let mut st = Staged {
            buf: self.alloc_pinned(len)?,
            len,
            count: data.len(),
            dtype: T::DTYPE,
        };
        self.stream_to_pinned(len, &mut st.buf)?;
        Ok(st)
    }

    /// [`stage_to_host`](Self::stage_to_host) reusing `staged`'s pinned memory when it is large
    /// enough (steady-state checkpointing allocates nothing).
    pub fn restage<T: GpuElement>(
        &mut self,
        data: &CudaView<'_, T>,
        bound: ErrorBound,
        codec: CodecKind,
        staged: &mut Staged,
    ) -> Result<()> {
        let len = self.compress_timed(data, bound, codec)?;
        if staged.buf.len() < len {
            staged.buf = self.alloc_pinned(len)?;
        }
        self.stream_to_pinned(len, &mut staged.buf)?;
        staged.len = len;
        staged.count = data.len();
        staged.dtype = T::DTYPE;
        Ok(())
    }

    pub(super) fn compress_timed<T: GpuElement>(
        &mut self,
        data: &CudaView<'_, T>,
        bound: ErrorBound,
        codec: CodecKind,
    ) -> Result<usize> {
        let t = now();
        let len = self.compress_to_scratch(data, bound, codec)?;
        self.last = StageTimes {
            compress: t.elapsed().as_secs_f64(),
            ..Default::default()
        };
        let bytes = (data.len() * T::SIZE) as f64;
        self.last_predicted = self
            .profile
            .clone()
            .unwrap_or_else(Profile::staged_guess)
            .staged(codec)
            .stage_terms(bytes, bytes / len.max(1) as f64)
            .1;
        Ok(len)
    }

    /// D2H of the first `len` bytes of the compression scratch into `dst`; returns the seconds
    /// it took.
    fn scratch_to(&mut self, len: usize, dst: &mut PinnedHostSlice<u8>) -> Result<f64> {
        let t = now();
        let s = self.stream();
        let src = self.scratch_out.as_ref().expect("grown");
        let (p, _g) = src.device_ptr(&s);
        Self::d2h(
            &s,
            p,
            &mut dst.as_mut_slice().map_err(gpu_err("pinned"))?[..len],
        )?;
        Ok(t.elapsed().as_secs_f64())
    }

    /// D2H of the first `len` bytes of the compression scratch into `dst` (the stage's time in
    /// `last.d2h`).
    pub(super) fn stream_to_pinned(
        &mut self,
        len: usize,
        dst: &mut PinnedHostSlice<u8>,
    ) -> Result<()> {
        self.last.d2h = self.scratch_to(len, dst)?;
        Ok(())
    }

    /// D2H of the first `len` bytes of the compression scratch into the stager's pinned send
    /// buffer (grown once, then reused); returns the seconds the copy took.
    pub(super) fn scratch_to_pinned_send(&mut self, len: usize) -> Result<f64> {
        let s = self.stream();
        Self::grow_pinned(&mut self.pinned_send, &s, len)?;
        let mut dst = self.pinned_send.take().expect("grown");
        let r = self.scratch_to(len, &mut dst);
        self.pinned_send = Some(dst);
        r
    }

    /// Raw D2H of `data` into the stager's pinned send buffer (grown once, then reused);
    /// returns the byte count.
    pub(super) fn values_to_pinned_send<T: GpuElement>(
        &mut self,
        data: &CudaView<'_, T>,
    ) -> Result<usize> {
        let t = now();
        let s = self.stream();
        let n = std::mem::size_of::<T>() * data.len();
        Self::grow_pinned(&mut self.pinned_send, &s, n)?;
        let (p, _g) = data.device_ptr(&s);
        let dst = self.pinned_send.as_mut().expect("grown");
        Self::d2h(
            &s,
            p,
            &mut dst.as_mut_slice().map_err(gpu_err("pinned"))?[..n],
        )?;
        self.last.d2h = t.elapsed().as_secs_f64();
        Ok(n)
    }

    /// Upload `range` of the pinned send (`from_send`) or receive buffer into `out`: H2D +
    /// GPU decompression of a stream (`compressed`), else an H2D of the raw values. Adds the
    /// copy and decompression times to `last`.
    pub(super) fn upload_pinned<T: GpuElement>(
        &mut self,
        from_send: bool,
        range: std::ops::Range<usize>,
        out: &mut CudaViewMut<'_, T>,
        compressed: bool,
    ) -> Result<()> {
        let slot = if from_send {
            self.pinned_send.take()
        } else {
            self.pinned_recv.take()
        };
        let (h2d, dec) = (self.last.h2d, self.last.decompress);
        let r = match &slot {
            None if range.is_empty() => self.upload_bytes(&[], out, compressed),
            None => Err(Error::Comm("device staging: no pinned buffer".into())),
            Some(b) => b
                .as_slice()
                .map_err(gpu_err("pinned"))
                .and_then(|b| self.upload_bytes(&b[range], out, compressed)),
        };
        if from_send {
            self.pinned_send = slot;
        } else {
            self.pinned_recv = slot;
        }
        self.last.h2d += h2d;
        self.last.decompress += dec;
        r
    }

    /// H2D (+ decompression when `compressed`) of host `bytes` into `out`; sets `last.h2d`
    /// (and `last.decompress`).
    pub(super) fn upload_bytes<T: GpuElement>(
        &mut self,
        bytes: &[u8],
        out: &mut CudaViewMut<'_, T>,
        compressed: bool,
    ) -> Result<()> {
        if compressed {
            self.upload_and_decompress(bytes, out)
        } else {
            let t = now();
            let r = self.copy_to_device(bytes, out);
            self.last.h2d = t.elapsed().as_secs_f64();
            self.last.decompress = 0.0;
            r
        }
    }

    /// The first `len` bytes of the pinned send (`send`) or receive buffer.
    pub(super) fn pinned_bytes(&self, send: bool, len: usize) -> Result<&[u8]> {
        let slot = if send {
            &self.pinned_send
        } else {
            &self.pinned_recv
        };
        match slot {
            Some(b) => Ok(&b.as_slice().map_err(gpu_err("pinned"))?[..len]),
            None if len == 0 => Ok(&[]),
            None => Err(Error::Comm("device staging: no pinned buffer".into())),
        }
    }

    /// Lend the pinned send (`send`) or receive buffer, grown to at least `n` bytes, to a
    /// non-blocking transfer (it owns it until the wait hands it back through
    /// [`reclaim_pinned`](Self::reclaim_pinned); meanwhile the stager grows a new one if another
    /// operation needs it). When no pinned memory can be had, a pageable vector of `n` bytes
    /// stands in (slower, but the collective still runs on every rank: an error here, after the
    /// agreement, would leave the other ranks waiting in the transfer).
    pub(super) fn lend_pinned(&mut self, send: bool, n: usize) -> Box<dyn OwnedBytes> {
        let s = self.stream();
        let slot = if send {
            &mut self.pinned_send
        } else {
            &mut self.pinned_recv
        };
        if n == 0 {
            return match slot.take() {
                Some(b) => Box::new(PinnedBytes(b)),
                None => Box::new(Vec::new()),
            };
        }
        match Self::grow_pinned(slot, &s, n) {
            Ok(()) => Box::new(PinnedBytes(slot.take().expect("grown"))),
            Err(_) => Box::new(vec![0u8; n]),
        }
    }

    /// Take back a buffer lent by [`lend_pinned`](Self::lend_pinned): pinned memory returns to
    /// its slot (unless the slot already holds a buffer at least as large), a stand-in vector
    /// is dropped.
    pub(super) fn reclaim_pinned(&mut self, send: bool, b: Box<dyn OwnedBytes>) {
        if let Ok(b) = b.into_any().downcast::<PinnedBytes>() {
            let slot = if send {
                &mut self.pinned_send
            } else {
                &mut self.pinned_recv
            };
            if slot.as_ref().map_or(true, |cur| cur.len() < b.0.len()) {
                *slot = Some(b.0);
            }
        }
    }

    /// Page-locked host memory (cached, CPU-readable) on this stager's context.
    pub fn alloc_pinned(&self, n: usize) -> Result<PinnedHostSlice<u8>> {
        let mut slot = None;
        Self::grow_pinned(&mut slot, &self.stream(), n)?;
        Ok(slot.expect("grown"))
    }

    /// Copy a staged stream back to the device and decompress it into `out`.
    pub fn restore_to_device<T: GpuElement>(
        &mut self,
        staged: &Staged,
        out: &mut CudaViewMut<'_, T>,
    ) -> Result<()> {
        if staged.dtype != T::DTYPE || staged.count != out.len() {
            return Err(Error::Mismatch {
                what: "staged buffer",
                expected: format!("{} x {}", out.len(), T::DTYPE),
                found: format!("{} x {}", staged.count, staged.dtype),
            });
        }
        self.last = StageTimes::default();
        let bytes = (staged.count * staged.dtype.size()) as f64;
        let dp = self.profile.clone().unwrap_or_else(Profile::staged_guess);
        // predicted with the speeds of the codec that made the stream
        let codec = crate::inspect(staged.stream()?)
            .ok()
            .and_then(|h| CodecKind::from_tag(h.codec).ok());
        let dp = dp.staged(codec.unwrap_or_else(|| dp.calibrated_codec()));
        self.last_predicted = dp.restore_terms(bytes, staged.ratio()).1;
        self.upload_and_decompress(staged.stream()?, out)
    }

    pub(super) fn upload_and_decompress<T: GpuElement>(
        &mut self,
        bytes: &[u8],
        out: &mut CudaViewMut<'_, T>,
    ) -> Result<()> {
        let s = self.stream();
        Self::grow_dev(&mut self.scratch_in, &s, bytes.len())?;
        let t = now();
        {
            let dst = self.scratch_in.as_mut().expect("grown");
            let (p, _g) = dst.device_ptr_mut(&s);
            Self::h2d(&s, bytes, p)?;
        }
        self.last.h2d = t.elapsed().as_secs_f64();
        let t = now();
        let src = self.scratch_in.take().expect("grown");
        let r = {
            let v = src.slice(0..bytes.len());
            self.gpu.decompress_device(&v, out)
        };
        self.scratch_in = Some(src);
        self.last.decompress = t.elapsed().as_secs_f64();
        r
    }

    /// Uncompressed device→host copy (the raw staging baseline).
    pub fn copy_to_host<T: GpuElement>(
        &mut self,
        data: &CudaView<'_, T>,
        out: &mut [u8],
    ) -> Result<()> {
        let n = std::mem::size_of::<T>() * data.len();
        if out.len() != n {
            return Err(Error::invalid("copy_to_host: output length differs"));
        }
        let s = self.stream();
        let (p, _g) = data.device_ptr(&s);
        Self::d2h(&s, p, out)
    }

    /// Uncompressed host→device copy (the raw staging baseline).
    pub fn copy_to_device<T: GpuElement>(
        &mut self,
        data: &[u8],
        out: &mut CudaViewMut<'_, T>,
    ) -> Result<()> {
        let n = std::mem::size_of::<T>() * out.len();
        if data.len() != n {
            return Err(Error::invalid("copy_to_device: input length differs"));
        }
        let s = self.stream();
        let (p, _g) = out.device_ptr_mut(&s);
        Self::h2d(&s, data, p)
    }

    /// The utility kernels (compiled with NVRTC on first use).
    pub(super) fn utils(&mut self) -> Result<&DevUtils> {
        if self.utils.is_none() {
            self.utils = Some(load_dev_utils(&self.stream())?);
        }
        Ok(self.utils.as_ref().expect("loaded"))
    }
}

/// Up to `chunks` codec chunks (32,768 values) spread evenly over `x`, copied on `s` into one
/// new device buffer: the sample whose compression estimates the ratio of `x` (the device form
/// of the host's [`model::estimate_ratio`], used by the staged and the NCCL operations).
pub(crate) fn device_sample<T: GpuElement>(
    s: &std::sync::Arc<CudaStream>,
    x: &CudaView<'_, T>,
    chunks: usize,
) -> Result<CudaSlice<T>> {
    const CHUNK: usize = 1 << crate::codec::blocked::CHUNK_LOG2;
    let n = x.len();
    let nch = n.div_ceil(CHUNK);
    let k = nch.min(chunks.max(1));
    let m: usize = (0..k)
        .map(|i| {
            let lo = (i * nch / k) * CHUNK;
            (lo + CHUNK).min(n) - lo
        })
        .sum();
    // SAFETY: every element is written by the copies below before it is read.
    let mut sample = unsafe { s.alloc::<T>(m.max(1)) }
        .map_err(|e| Error::OutOfMemory(format!("{m} sample values: {e:?}")))?;
    let mut at = 0;
    for i in 0..k {
        let lo = (i * nch / k) * CHUNK;
        let hi = (lo + CHUNK).min(n);
        let mut dst = sample.slice_mut(at..at + hi - lo);
        s.memcpy_dtod(&x.slice(lo..hi), &mut dst)
            .map_err(gpu_err("sample copy"))?;
        at += hi - lo;
    }
    Ok(sample)
}
