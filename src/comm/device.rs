//! Device buffers with a non-CUDA-aware MPI: compress on the GPU, copy the compressed bytes
//! device→host into pinned memory, send, copy host→device, decompress on the GPU.
//!
//! * [`DeviceStager`] owns a [`GpuCodec`], device scratch and pinned host buffers (grown, then
//!   reused, so steady-state calls allocate nothing but the received message).
//! * [`Communicator::sendrecv_device`] is the staged pairwise exchange (raw or compressed by the
//!   policy). A compressed buffer larger than `Config::pipeline_min_bytes` goes through the same
//!   chunk pipeline as host messages (`comm::pipeline`, see the [`comm`](super) docs), with a
//!   device chunk codec: encode chunk `k` = GPU compression of that slice + D2H of its stream
//!   into pinned memory; decode = H2D + GPU decompression into the slice. Overlap it gets: the
//!   GPU compression (+ D2H) of chunk `k+1` runs while chunk `k`'s MPI transfer is in flight,
//!   and the H2D + decompression of chunk `k-1` while chunk `k` arrives. Not overlapped: the D2H
//!   of a chunk with its own compression (one stream, synchronous copies), and copies with GPU
//!   work of other chunks. The device pipeline is a composition of the tested stager pieces and
//!   the host-tested schedule; it has not been run on a GPU yet.
//! * [`DeviceStager::stage_to_host`] / [`DeviceStager::restore_to_device`] expose the GPU→CPU
//!   staging on its own (checkpoint/offload: compressed on the device, kept compressed on the
//!   host).
//! * [`GpuCompressor`] plugs the GPU codec into a [`Communicator`] for host buffers.
//! * [`Communicator::allgather_device`]: GPU compression, D2H of the stream, the byte allgather
//!   of the streams (after the usual descriptor agreement), then H2D + GPU decompression of every
//!   rank's stream into its slice of the output. `Auto` compresses like `Always` here (no device
//!   ratio estimate yet); `Never` moves the raw bytes.
//! * [`Communicator::allreduce_device`] / [`Communicator::allreduce_mean_device`]: D2H of the
//!   values, the host [`Communicator::allreduce`] (ring with the end-to-end bound, compressed on
//!   the wire with the communicator's [`Compressor`], e.g. a [`GpuCompressor`]), H2D of the
//!   result. The staging copies are uncompressed; only the network traffic is compressed.
//!
//! The collectives are compositions of tested pieces (stager copies, GPU codec, host
//! algorithms) compiled under feature `cuda`; they have not been run on a GPU yet.
//!
//! Complex device buffers are passed as their interleaved real scalars (`2n` f32/f64 values).

use std::sync::Mutex;

use cudarc::driver::{
    result as cu, CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut,
    PinnedHostSlice,
};

use super::{
    element::Real, Communicator, Compressor, Decision, Desc, OpStats, ReduceOp, OP_SENDRECV,
};
use crate::codec::CodecKind;
use crate::error::{Error, Result};
use crate::format::Dtype;
use crate::gpu::{GpuCodec, GpuElement};
use crate::model::{self, Link, Policy, Scenario};
use crate::quant::ErrorBound;

fn gpu_err(what: &'static str) -> impl Fn(cu::DriverError) -> Error {
    move |e| Error::Gpu(format!("{what}: {e:?}"))
}

/// The GPU codec behind the [`Compressor`] trait (host buffers, compressed on the device).
pub struct GpuCompressor {
    gpu: Mutex<GpuCodec>,
    name: String,
}

impl GpuCompressor {
    /// Wrap a GPU codec.
    pub fn new(gpu: GpuCodec) -> Self {
        let name = format!("gpu:{}", gpu.device_name());
        GpuCompressor {
            gpu: Mutex::new(gpu),
            name,
        }
    }
    fn lock(&self) -> Result<std::sync::MutexGuard<'_, GpuCodec>> {
        self.gpu
            .lock()
            .map_err(|_| Error::Gpu("GPU codec mutex poisoned".into()))
    }
}

impl Compressor for GpuCompressor {
    fn name(&self) -> String {
        self.name.clone()
    }
    fn compress_f32(&self, d: &[f32], b: ErrorBound, c: CodecKind) -> Result<Vec<u8>> {
        self.lock()?.compress(d, b, c)
    }
    fn compress_f64(&self, d: &[f64], b: ErrorBound, c: CodecKind) -> Result<Vec<u8>> {
        self.lock()?.compress(d, b, c)
    }
    fn decompress_f32(&self, s: &[u8], out: &mut [f32]) -> Result<()> {
        self.lock()?.decompress_into(s, out)
    }
    fn decompress_f64(&self, s: &[u8], out: &mut [f64]) -> Result<()> {
        self.lock()?.decompress_into(s, out)
    }
}

/// A device buffer compressed and kept in pinned host memory ([`DeviceStager::stage_to_host`]).
pub struct Staged {
    buf: PinnedHostSlice<u8>,
    len: usize,
    count: usize,
    dtype: Dtype,
}

impl std::fmt::Debug for Staged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Staged({} x {}, {} bytes)",
            self.count, self.dtype, self.len
        )
    }
}

impl Staged {
    /// The zcomm stream (readable with [`crate::decompress`] on the CPU too).
    pub fn stream(&self) -> Result<&[u8]> {
        Ok(&self.buf.as_slice().map_err(gpu_err("pinned"))?[..self.len])
    }
    /// Stream length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the stream is empty (never: a stream has a header).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Number of values.
    pub fn count(&self) -> usize {
        self.count
    }
    /// Value type.
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }
    /// Uncompressed bytes / stream bytes.
    pub fn ratio(&self) -> f64 {
        (self.count * self.dtype.size()) as f64 / self.len.max(1) as f64
    }
}

/// Measured device-side speeds (all ranks agree on them, see [`DeviceStager::calibrate`]).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DeviceProfile {
    /// Device→host / host→device pinned copies (slower direction).
    pub staging: Link,
    /// GPU compression throughput (input bytes/s).
    pub compress: f64,
    /// GPU decompression throughput (output bytes/s).
    pub decompress: f64,
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

/// GPU codec + device scratch + pinned host buffers for staged communication.
pub struct DeviceStager {
    gpu: GpuCodec,
    scratch_out: Option<CudaSlice<u8>>,
    scratch_in: Option<CudaSlice<u8>>,
    pinned_send: Option<PinnedHostSlice<u8>>,
    pinned_recv: Option<PinnedHostSlice<u8>>,
    profile: Option<DeviceProfile>,
    /// Stage times of the last operation.
    pub last: StageTimes,
}

impl std::fmt::Debug for DeviceStager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceStager({:?})", self.gpu)
    }
}

fn now() -> std::time::Instant {
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
            profile: None,
            last: StageTimes::default(),
        }
    }
    /// The GPU codec (its stream is the one all copies run on).
    pub fn gpu(&mut self) -> &mut GpuCodec {
        &mut self.gpu
    }
    /// The device profile, if calibrated.
    pub fn profile(&self) -> Option<DeviceProfile> {
        self.profile
    }
    /// Use a known profile.
    pub fn set_profile(&mut self, p: DeviceProfile) {
        self.profile = Some(p);
    }

    fn stream(&self) -> std::sync::Arc<CudaStream> {
        self.gpu.stream().clone()
    }

    fn grow_dev(
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

    fn grow_pinned(
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
    fn compress_to_scratch<T: GpuElement>(
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

    /// Copy `n` bytes of device memory at `src` into `dst` (host) and wait.
    fn d2h(s: &CudaStream, src: u64, dst: &mut [u8]) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        // SAFETY: the caller guarantees `src` holds at least dst.len() bytes on this stream's
        // context; we synchronize before returning so `dst` is not used while the copy runs.
        unsafe { cu::memcpy_dtoh_async(dst, src, s.cu_stream()) }.map_err(gpu_err("d2h"))?;
        s.synchronize().map_err(gpu_err("sync"))
    }

    /// Copy `src` (host) to device memory at `dst` and wait.
    fn h2d(s: &CudaStream, src: &[u8], dst: u64) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
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

    fn compress_timed<T: GpuElement>(
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
        Ok(len)
    }

    /// D2H of the first `len` bytes of the compression scratch.
    fn stream_to_pinned(&mut self, len: usize, dst: &mut PinnedHostSlice<u8>) -> Result<()> {
        let t = now();
        let s = self.stream();
        let src = self.scratch_out.as_ref().expect("grown");
        let (p, _g) = src.device_ptr(&s);
        Self::d2h(
            &s,
            p,
            &mut dst.as_mut_slice().map_err(gpu_err("pinned"))?[..len],
        )?;
        self.last.d2h = t.elapsed().as_secs_f64();
        Ok(())
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
        self.upload_and_decompress(staged.stream()?, out)
    }

    fn upload_and_decompress<T: GpuElement>(
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

    /// Measure GPU codec throughput and pinned copy bandwidth on `values` f32 values of a smooth
    /// field, on every rank at once (ranks sharing a GPU see their share); all ranks adopt the
    /// slowest rank's numbers. Collective over `comm`.
    pub fn calibrate(
        &mut self,
        comm: &Communicator,
        values: usize,
        codec: CodecKind,
    ) -> Result<DeviceProfile> {
        let s = self.stream();
        let host: Vec<f32> = (0..values)
            .map(|i| {
                let x = i as f64 * 1e-4;
                ((x.sin() * 3.0 + (x * 7.3).cos()) * 100.0) as f32
            })
            .collect();
        let dev = s.clone_htod(&host).map_err(gpu_err("htod"))?;
        let mut out = s.alloc_zeros::<f32>(values).map_err(gpu_err("alloc"))?;
        let bytes = (values * 4) as f64;
        let bound = ErrorBound::Noa(1e-3);
        Self::grow_pinned(&mut self.pinned_send, &s, values * 4)?;
        // Each phase on its own, every rank at once (a barrier before each repetition, as in a
        // collective where all ranks compress together); one warm-up (kernel loading), then the
        // median of 5.
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let reps = 6;
        let mut len = 0;
        let mut times = Vec::new();
        for k in 0..reps {
            comm.barrier()?;
            let t = now();
            len = self.compress_to_scratch(&dev.slice(..), bound, codec)?;
            if k > 0 {
                times.push(t.elapsed().as_secs_f64());
            }
        }
        let tc = median(std::mem::take(&mut times));
        for k in 0..reps {
            comm.barrier()?;
            let t = now();
            let src = self.scratch_out.take().expect("grown");
            let r = {
                let v = src.slice(0..len);
                let mut o = out.slice_mut(..);
                self.gpu.decompress_device(&v, &mut o)
            };
            self.scratch_out = Some(src);
            r?;
            if k > 0 {
                times.push(t.elapsed().as_secs_f64());
            }
        }
        let td = median(std::mem::take(&mut times));
        let mut times_h = Vec::new();
        for k in 0..reps {
            let pinned = self
                .pinned_send
                .as_mut()
                .expect("grown")
                .as_mut_slice()
                .map_err(gpu_err("pinned"))?;
            comm.barrier()?;
            let t = now();
            {
                let (p, _g) = dev.device_ptr(&s);
                Self::d2h(&s, p, &mut pinned[..values * 4])?;
            }
            let t1 = t.elapsed().as_secs_f64();
            comm.barrier()?;
            let t = now();
            {
                let (p, _g) = out.device_ptr_mut(&s);
                Self::h2d(&s, &pinned[..values * 4], p)?;
            }
            if k > 0 {
                times.push(t1);
                times_h.push(t.elapsed().as_secs_f64());
            }
        }
        let tdh = median(times);
        let thd = median(times_h);
        let mut v = [-bytes / tc, -bytes / td, -bytes / tdh.max(thd)];
        comm.transport().allreduce_f64(&mut v, ReduceOp::Max)?;
        let p = DeviceProfile {
            staging: Link {
                bandwidth: -v[2],
                latency: 10e-6,
            },
            compress: -v[0],
            decompress: -v[1],
        };
        tracing::info!(target: "zcomm::comm", "device profile: compress {} decompress {} staging {}",
            model::fmt_rate(p.compress), model::fmt_rate(p.decompress), model::fmt_rate(p.staging.bandwidth));
        self.profile = Some(p);
        Ok(p)
    }
}

impl Communicator {
    /// Staged pairwise exchange of device buffers (see the [module docs](self)): send `send` to
    /// `dest`, receive `recv.len()` values from `src` into `recv`. Raw path: D2H, MPI, H2D.
    /// Compressed path: GPU compress, D2H of the stream, MPI, H2D, GPU decompress. Mismatches
    /// fail on both ends, as for [`Communicator::sendrecv`].
    #[allow(clippy::too_many_arguments)]
    pub fn sendrecv_device<T: GpuElement + Real>(
        &mut self,
        dev: &mut DeviceStager,
        send: &CudaView<'_, T>,
        dest: usize,
        recv: &mut CudaViewMut<'_, T>,
        src: usize,
        tag: i32,
    ) -> Result<OpStats> {
        Self::check_tag(tag)?;
        let t0 = self.wtime();
        let n = send.len();
        let bytes = n * T::SIZE;
        let bound = self.config.bound;
        let codec = self.config.policy.codec().unwrap_or_default();
        let dp = dev.profile.unwrap_or(DeviceProfile {
            staging: Link {
                bandwidth: 20e9,
                latency: 10e-6,
            },
            compress: 200e9,
            decompress: 300e9,
        });
        let est = self.ratios.get(OP_SENDRECV | 0x80, tag as i64);
        let k = 1;
        let sc = Scenario::new(
            bytes as f64,
            est.unwrap_or(1.0),
            self.profile.link,
            dp.compress,
            dp.decompress,
        )
        .with_staging(Some(dp.staging))
        .with_chunks(k);
        let pr = model::predict(&sc);
        let compress = match self.config.policy {
            Policy::Never => false,
            Policy::Always(_) => true,
            // never when even an infinite ratio cannot pay; without an estimate yet, compress
            // once to learn the ratio
            Policy::Auto(_) => {
                let best = model::predict(&sc.clone_with_ratio(f64::INFINITY));
                best.compressed_serial < 0.95 * best.raw_serial
                    && (est.is_none() || pr.compressed_serial < 0.95 * pr.raw_serial)
            }
        } && n > 0;
        let mut st = OpStats::raw(OP_SENDRECV);
        st.bytes = bytes as u64;
        st.ratio_estimate = est.unwrap_or(1.0);
        st.predicted_raw_s = pr.raw_serial;
        st.predicted_compressed_s = pr.compressed_serial;
        dev.last = StageTimes::default();
        let s = dev.stream();
        let expect = Desc {
            count: recv.len() as u64,
            dtype: elem_tag::<T>(),
            ..self.local_desc::<f32>(OP_SENDRECV, 0)
        };
        let mut d = Desc {
            dtype: elem_tag::<T>(),
            ..self.local_desc::<f32>(OP_SENDRECV, n)
        };
        let len;
        let chunk_dev = super::pipeline::chunk_scalars(self.config.chunk_bytes, T::SIZE, 1);
        let chunk_dev = if compress && bytes > self.config.pipeline_min_bytes && n > chunk_dev {
            chunk_dev
        } else {
            0
        };
        if chunk_dev > 0 {
            // compressed chunk by chunk inside the pipeline
            st.decision = Decision::Compressed;
            st.codec = Some(codec);
            st.bound = match bound {
                ErrorBound::Abs(e) | ErrorBound::Rel(e) => e,
                // per chunk E·(chunk range), from the chunk headers (filled in below)
                ErrorBound::Noa(_) => 0.0,
            };
            d.decision = 1;
            len = 0;
        } else if compress {
            let t = now();
            len = dev.compress_to_scratch(send, bound, codec)?;
            dev.last.compress = t.elapsed().as_secs_f64();
            DeviceStager::grow_pinned(&mut dev.pinned_send, &s, len)?;
            let t = now();
            {
                let src_buf = dev.scratch_out.as_ref().expect("grown");
                let (p, _g) = src_buf.device_ptr(&s);
                let pin = dev
                    .pinned_send
                    .as_mut()
                    .expect("grown")
                    .as_mut_slice()
                    .map_err(gpu_err("pinned"))?;
                DeviceStager::d2h(&s, p, &mut pin[..len])?;
            }
            dev.last.d2h = t.elapsed().as_secs_f64();
            st.decision = Decision::Compressed;
            st.codec = Some(codec);
            st.wire_bytes = len as u64;
            st.ratio = bytes as f64 / len.max(1) as f64;
            st.bound = match bound {
                ErrorBound::Abs(e) | ErrorBound::Rel(e) => e,
                ErrorBound::Noa(e) => {
                    let h = crate::inspect(
                        &dev.pinned_send
                            .as_ref()
                            .expect("grown")
                            .as_slice()
                            .map_err(gpu_err("pinned"))?[..len],
                    )?;
                    e * (h.range_max - h.range_min)
                }
            };
            self.ratios.put(OP_SENDRECV | 0x80, tag as i64, st.ratio);
            d.decision = 1;
        } else {
            DeviceStager::grow_pinned(&mut dev.pinned_send, &s, bytes)?;
            let t = now();
            {
                let (p, _g) = send.device_ptr(&s);
                let pin = dev
                    .pinned_send
                    .as_mut()
                    .expect("grown")
                    .as_mut_slice()
                    .map_err(gpu_err("pinned"))?;
                DeviceStager::d2h(&s, p, &mut pin[..bytes])?;
            }
            dev.last.d2h = t.elapsed().as_secs_f64();
            len = bytes;
            st.wire_bytes = bytes as u64;
        }
        d.payload = len as u64;
        d.ratio = st.ratio;
        // network: the incoming payload (raw or compressed) lands in pinned memory
        let rbytes = recv.len() * T::SIZE;
        let cap = crate::compress_bound(recv.len(), T::DTYPE);
        DeviceStager::grow_pinned(&mut dev.pinned_recv, &s, cap)?;
        let theirs = self.transport().sendrecv(
            dest,
            &{
                let mut dd = d;
                if chunk_dev > 0 {
                    dd.chunk = chunk_dev as u64;
                    dd.payload = 0;
                }
                dd
            }
            .to_bytes(),
            src,
            super::TAG_DESC + tag,
        )?;
        let sd0 = Desc::parse(&theirs)?;
        if chunk_dev > 0 || sd0.chunk > 0 {
            let t = now();
            let r = self.sendrecv_device_chunked(
                dev,
                DevOut {
                    send,
                    chunk: chunk_dev,
                    bound,
                    codec,
                    len,
                },
                d,
                sd0,
                recv,
                dest,
                &expect,
                src,
                tag,
            );
            dev.last.network = t.elapsed().as_secs_f64();
            let (sent, chunks, noa_bound) = r?;
            if matches!(bound, ErrorBound::Noa(_)) && chunk_dev > 0 {
                st.bound = noa_bound;
            }
            if chunk_dev > 0 {
                st.wire_bytes = sent as u64;
                st.ratio = bytes as f64 / sent.max(1) as f64;
                self.ratios.put(OP_SENDRECV | 0x80, tag as i64, st.ratio);
            }
            self.chunks += chunks;
            st.predicted_s = if chunk_dev > 0 {
                // the model's pipelined form with this chunk count
                let k = super::pipeline::chunk_count(n, chunk_dev);
                let ratio = st.ratio.max(1e-9);
                let pk = model::predict(&sc.with_chunks(k).clone_with_ratio(ratio));
                st.predicted_compressed_s = pk.compressed_pipelined;
                pk.compressed_pipelined
            } else if compress {
                pr.compressed_serial
            } else {
                pr.raw_serial
            };
            return Ok(self.finish(st, t0));
        }
        let t = now();
        let (sd, n) = {
            let pin_s = dev
                .pinned_send
                .as_ref()
                .expect("grown")
                .as_slice()
                .map_err(gpu_err("pinned"))?;
            let pin_r = dev
                .pinned_recv
                .as_mut()
                .expect("grown")
                .as_mut_slice()
                .map_err(gpu_err("pinned"))?;
            self.exchange_into_after(
                &d,
                &sd0,
                &pin_s[..len],
                dest,
                &expect,
                src,
                tag,
                &mut pin_r[..cap],
            )?
        };
        dev.last.network = t.elapsed().as_secs_f64();
        let pin = dev
            .pinned_recv
            .as_ref()
            .expect("grown")
            .as_slice()
            .map_err(gpu_err("pinned"))?;
        if sd.decision == 1 {
            dev_upload(dev, n, recv)?;
        } else {
            if n != rbytes {
                return Err(Error::Comm("raw device payload of unexpected size".into()));
            }
            let t = now();
            let (p, _g) = recv.device_ptr_mut(&s);
            DeviceStager::h2d(&s, &pin[..rbytes], p)?;
            dev.last.h2d = t.elapsed().as_secs_f64();
        }
        let ratio_for_model = if compress {
            st.ratio
        } else {
            est.unwrap_or(1.0)
        };
        let pr = model::predict(&sc.with_chunks(k).clone_with_ratio(ratio_for_model));
        st.predicted_raw_s = pr.raw_serial;
        st.predicted_compressed_s = pr.compressed_serial;
        st.predicted_s = if compress {
            pr.compressed_serial
        } else {
            pr.raw_serial
        };
        tracing::debug!(target: "zcomm::comm", stages = ?dev.last, "sendrecv_device");
        Ok(self.finish(st, t0))
    }
}

/// Upload the first `n` bytes of the pinned receive buffer and decompress them into `out`.
fn dev_upload<T: GpuElement>(
    dev: &mut DeviceStager,
    n: usize,
    out: &mut CudaViewMut<'_, T>,
) -> Result<()> {
    let pinned = dev.pinned_recv.take().expect("grown");
    let r = pinned
        .as_slice()
        .map_err(gpu_err("pinned"))
        .and_then(|b| dev.upload_and_decompress(&b[..n], out));
    dev.pinned_recv = Some(pinned);
    r
}

impl Communicator {
    /// The sendrecv protocol (after the descriptor swap, `sd` is the peer's descriptor)
    /// receiving any payload into `buf[..n]` (returns the sender's descriptor and `n`). A payload
    /// larger than `buf` is drained and reported as an error.
    #[allow(clippy::too_many_arguments)]
    fn exchange_into_after(
        &self,
        d: &Desc,
        sd: &Desc,
        payload: &[u8],
        dest: usize,
        expect: &Desc,
        src: usize,
        tag: i32,
        buf: &mut [u8],
    ) -> Result<(Desc, usize)> {
        let t = self.transport();
        let sd = *sd;
        let n = usize::try_from(sd.payload)
            .map_err(|_| Error::Comm(format!("peer announced a {}-byte payload", sd.payload)))?;
        let fits = n <= buf.len();
        if fits {
            t.sendrecv_sized(dest, payload, src, &mut buf[..n], tag)?;
        } else {
            let mut v = vec![0u8; n];
            t.sendrecv_sized(dest, payload, src, &mut v, tag)?;
        }
        let verdict = t.sendrecv(src, &expect.to_bytes(), dest, super::TAG_VERDICT + tag)?;
        super::check_pair(&sd, expect)?;
        super::check_pair(d, &Desc::parse(&verdict)?)?;
        if !fits {
            return Err(Error::Comm(format!(
                "{n}-byte payload exceeds the receive buffer"
            )));
        }
        Ok((sd, n))
    }

    /// The pipelined device exchange (either side chunked): chunk schedule of
    /// `comm::pipeline` with a [`DeviceChunks`] codec, then the verdicts. Returns the bytes sent,
    /// the chunks moved and (noa) the largest per-chunk absolute bound sent.
    #[allow(clippy::too_many_arguments)]
    fn sendrecv_device_chunked<T: GpuElement + Real>(
        &mut self,
        dev: &mut DeviceStager,
        out: DevOut<'_, '_, T>,
        d: Desc,
        sd: Desc,
        recv: &mut CudaViewMut<'_, T>,
        dest: usize,
        expect: &Desc,
        src: usize,
        tag: i32,
    ) -> Result<(usize, u64, f64)> {
        use super::pipeline::{chunk_count, exchange_chunks};
        let pair = super::check_pair(&sd, expect);
        let nrecv = if sd.chunk > 0 {
            let chunk =
                usize::try_from(sd.chunk).map_err(|_| Error::Comm("bad chunk length".into()))?;
            let total = usize::try_from(sd.count)
                .map_err(|_| Error::Comm(format!("peer announced {} values", sd.count)))?;
            chunk_count(total, chunk)
        } else {
            1
        };
        let nsend = if out.chunk > 0 {
            chunk_count(out.send.len(), out.chunk)
        } else {
            1
        };
        let mut dc = DeviceChunks {
            dev,
            out,
            recv: pair.is_ok().then_some(recv),
            peer: sd,
            noa_bound: 0.0,
        };
        let (sent, r) = exchange_chunks(&*self.transport, &mut dc, dest, nsend, src, nrecv, tag)?;
        let noa_bound = dc.noa_bound;
        let verdict =
            self.transport
                .sendrecv(src, &expect.to_bytes(), dest, super::TAG_VERDICT + tag)?;
        pair?;
        super::check_pair(&d, &Desc::parse(&verdict)?)?;
        r?;
        let moved = if d.chunk > 0 { nsend as u64 } else { 0 }
            + if sd.chunk > 0 { nrecv as u64 } else { 0 };
        Ok((sent, moved, noa_bound))
    }
}

/// What the device side sends: chunked (`chunk > 0`, compressed on the GPU per chunk), or the
/// already staged whole payload (`len` bytes in the stager's pinned send buffer).
struct DevOut<'a, 'b, T> {
    send: &'a CudaView<'b, T>,
    chunk: usize,
    bound: ErrorBound,
    codec: CodecKind,
    len: usize,
}

/// The device [`ChunkCodec`](super::pipeline::ChunkCodec): a thin composition of the stager's
/// tested pieces (GPU compression into scratch, D2H into pinned memory; H2D + GPU
/// decompression).
struct DeviceChunks<'a, 'b, 'c, T> {
    dev: &'a mut DeviceStager,
    out: DevOut<'a, 'b, T>,
    /// `None`: a mismatch is known, drain and discard.
    recv: Option<&'a mut CudaViewMut<'c, T>>,
    peer: Desc,
    noa_bound: f64,
}

impl<T: GpuElement + Real> super::pipeline::ChunkCodec for DeviceChunks<'_, '_, '_, T> {
    fn encode(&mut self, k: usize) -> Result<Vec<u8>> {
        let dev = &mut *self.dev;
        let s = dev.stream();
        if self.out.chunk == 0 {
            // the whole payload, staged before the exchange
            let pin = dev
                .pinned_send
                .as_ref()
                .ok_or_else(|| Error::Comm("nothing staged".into()))?
                .as_slice()
                .map_err(gpu_err("pinned"))?;
            return Ok(pin[..self.out.len].to_vec());
        }
        let r = super::pipeline::chunk_range(self.out.send.len(), self.out.chunk, k);
        let view = self.out.send.slice(r);
        let t = now();
        let len = dev.compress_to_scratch(&view, self.out.bound, self.out.codec)?;
        dev.last.compress += t.elapsed().as_secs_f64();
        DeviceStager::grow_pinned(&mut dev.pinned_send, &s, len)?;
        let t = now();
        let src_buf = dev.scratch_out.as_ref().expect("grown");
        let (p, _g) = src_buf.device_ptr(&s);
        let pin = dev
            .pinned_send
            .as_mut()
            .expect("grown")
            .as_mut_slice()
            .map_err(gpu_err("pinned"))?;
        DeviceStager::d2h(&s, p, &mut pin[..len])?;
        dev.last.d2h += t.elapsed().as_secs_f64();
        if let ErrorBound::Noa(e) = self.out.bound {
            let h = crate::inspect(&pin[..len])?;
            self.noa_bound = self.noa_bound.max(e * (h.range_max - h.range_min));
        }
        Ok(pin[..len].to_vec())
    }

    fn decode(&mut self, k: usize, bytes: Vec<u8>) -> Result<()> {
        let Some(recv) = self.recv.as_mut() else {
            return Ok(());
        };
        let dev = &mut *self.dev;
        if self.peer.chunk == 0 {
            if self.peer.decision == 1 {
                return dev.upload_and_decompress(&bytes, recv);
            }
            if bytes.len() != recv.len() * T::SIZE {
                return Err(Error::Comm("raw device payload of unexpected size".into()));
            }
            let s = dev.stream();
            let t = now();
            let (p, _g) = recv.device_ptr_mut(&s);
            DeviceStager::h2d(&s, &bytes, p)?;
            dev.last.h2d += t.elapsed().as_secs_f64();
            return Ok(());
        }
        let chunk = self.peer.chunk as usize;
        let r = super::pipeline::chunk_range(recv.len(), chunk, k);
        let mut view = recv.slice_mut(r);
        let h2d = dev.last.h2d;
        let dec = dev.last.decompress;
        let res = dev.upload_and_decompress(&bytes, &mut view);
        // upload_and_decompress overwrites the stage times: accumulate over the chunks
        dev.last.h2d += h2d;
        dev.last.decompress += dec;
        res
    }
}

fn elem_tag<T: Real>() -> u8 {
    match T::DTYPE {
        Dtype::F32 => 1,
        Dtype::F64 => 2,
    }
}

trait WithRatio {
    fn clone_with_ratio(&self, r: f64) -> Self;
}
impl WithRatio for Scenario {
    fn clone_with_ratio(&self, r: f64) -> Self {
        Scenario { ratio: r, ..*self }
    }
}

impl Communicator {
    /// Allgather of device buffers (see the [module docs](self)): `out.len() == size *
    /// send.len()`, rank order; every rank ends with identical values. Collective.
    pub fn allgather_device<T: GpuElement + Real + super::CommElement>(
        &mut self,
        dev: &mut DeviceStager,
        send: &CudaView<'_, T>,
        out: &mut CudaViewMut<'_, T>,
    ) -> Result<OpStats> {
        let t0 = self.wtime();
        let (p, n) = (self.size(), send.len());
        let local = if out.len() != n * p {
            Err(Error::invalid(format!(
                "allgather_device: output has {} values, expected {p} x {n}",
                out.len()
            )))
        } else {
            Ok(())
        };
        let bound = self.config.bound;
        let codec = self.config.policy.codec().unwrap_or_default();
        let compress = !matches!(self.config.policy, Policy::Never) && n > 0;
        let mut st = OpStats::raw(super::OP_ALLGATHER);
        st.bytes = (n * T::SIZE) as u64;
        dev.last = StageTimes::default();
        // stage before the agreement, so a device failure on one rank fails every rank
        let staged: Result<Vec<u8>> = local.and_then(|()| {
            if compress {
                let staged = dev.stage_to_host(send, bound, codec)?;
                st.decision = Decision::Compressed;
                st.codec = Some(codec);
                st.bound = match bound {
                    ErrorBound::Abs(e) | ErrorBound::Rel(e) => e,
                    ErrorBound::Noa(e) => {
                        let h = crate::inspect(staged.stream()?)?;
                        e * (h.range_max - h.range_min)
                    }
                };
                Ok(staged.stream()?.to_vec())
            } else {
                let mut v = vec![0u8; n * T::SIZE];
                dev.copy_to_host(send, &mut v)?;
                Ok(v)
            }
        });
        let d = Desc {
            dtype: elem_tag::<T>(),
            decision: u8::from(compress),
            ..self.local_desc::<f32>(super::OP_ALLGATHER, n)
        };
        let (mine, local) = match staged {
            Ok(v) => (v, Ok(())),
            Err(e) => (Vec::new(), Err(e)),
        };
        self.agree(d, local)?;
        st.wire_bytes = mine.len() as u64;
        st.ratio = st.bytes as f64 / mine.len().max(1) as f64;
        let t = now();
        let parts = self.transport().allgatherv(&mine)?;
        dev.last.network = t.elapsed().as_secs_f64();
        for (k, part) in parts.iter().enumerate() {
            let mut view = out.slice_mut(k * n..(k + 1) * n);
            if compress {
                dev.upload_and_decompress(part, &mut view)?;
            } else {
                dev.copy_to_device(part, &mut view)?;
            }
        }
        Ok(self.finish(st, t0))
    }

    /// Sum of device buffers over all ranks with the end-to-end bound of the host
    /// [`allreduce`](Communicator::allreduce) (see the [module docs](self)). Collective.
    pub fn allreduce_device<T: GpuElement + Real + super::CommElement>(
        &mut self,
        dev: &mut DeviceStager,
        input: &CudaView<'_, T>,
        out: &mut CudaViewMut<'_, T>,
    ) -> Result<OpStats> {
        self.reduce_device(dev, input, out, false)
    }

    /// Mean of device buffers over all ranks (gradient averaging; the bound applies to the
    /// mean). Collective.
    pub fn allreduce_mean_device<T: GpuElement + Real + super::CommElement>(
        &mut self,
        dev: &mut DeviceStager,
        input: &CudaView<'_, T>,
        out: &mut CudaViewMut<'_, T>,
    ) -> Result<OpStats> {
        self.reduce_device(dev, input, out, true)
    }

    fn reduce_device<T: GpuElement + Real + super::CommElement>(
        &mut self,
        dev: &mut DeviceStager,
        input: &CudaView<'_, T>,
        out: &mut CudaViewMut<'_, T>,
        mean: bool,
    ) -> Result<OpStats> {
        let n = input.len();
        // a length mismatch is reported by the host allreduce on every rank
        let mut host_in = vec![T::default(); n];
        let mut host_out = vec![T::default(); out.len()];
        dev.last = StageTimes::default();
        let t = now();
        let staged = match super::element::scalar_bytes_mut(&mut host_in) {
            Some(b) => dev.copy_to_host(input, b),
            None => Err(Error::Unavailable(
                "device staging needs a little-endian host".into(),
            )),
        };
        if let Err(e) = staged {
            // make every rank fail together: a rejected argument fails the agreement everywhere
            let mut bad = vec![T::default(); n + 1];
            let _ = self.allreduce(&host_in, &mut bad);
            return Err(e);
        }
        dev.last.d2h = t.elapsed().as_secs_f64();
        let t = now();
        let st = if mean {
            self.allreduce_mean(&host_in, &mut host_out)?
        } else {
            self.allreduce(&host_in, &mut host_out)?
        };
        dev.last.network = t.elapsed().as_secs_f64();
        let t = now();
        let b = super::element::scalar_bytes(&host_out);
        dev.copy_to_device(&b, out)?;
        dev.last.h2d = t.elapsed().as_secs_f64();
        Ok(st)
    }
}
