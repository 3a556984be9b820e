//! GPU codecs: CUDA context/stream handling, NVRTC kernel compilation and device workspaces.
//!
//! [`GpuCodec`] runs every codec on the GPU and writes exactly the bytes of the CPU twin
//! ([`crate::compress`]); its decoder accepts and rejects exactly what [`crate::decompress`]
//! does. `aatrox`, `cuszp-plain`, `cuszp-outlier` (`kernels/blocked.cu`) and `pfpl`
//! (`kernels/pfpl.cu`) are its own kernels, described below; `cuszi` and `gpz` go to the CUDA
//! classes [`cuszi::CusziGpu`] and [`gpz::GpzGpu`] on the same stream (see [`GpuCodec`] for
//! what that path does).
//!
//! * Compression: one kernel (plus, for `noa` and degenerate steps, one reduction kernel for the
//!   value range). The host builds the 96-byte header with the same Rust code as the CPU path.
//!   [`GpuCodec::compress_device_with_range`] takes the `noa` range from the caller (e.g. one
//!   [`GpuCodec::value_range_device`] call reused) and skips that kernel and its read-back.
//! * Value ranges without a pass of their own (a ring reduction's): [`DeviceRange`] accumulates
//!   on the device the ranges that [`GpuCodec::compress_device_tracking`] and
//!   [`GpuCodec::decompress_add_to_device_tracking`] fold in their kernels;
//!   [`GpuCodec::sampled_range_device`] is a sample's range for the first quantisations.
//! * Decompression: one kernel; corruption is reported through a device flag as
//!   [`Error::Corrupt`].
//! * Kernels are compiled by NVRTC at first use for the device's architecture with
//!   `--fmad=false` and cached on disk (`$ZCOMM_CACHE_DIR`, `$XDG_CACHE_HOME/zcomm` or
//!   `~/.cache/zcomm`).
//! * Workspaces (look-back status words, counters, host staging buffers) are kept and grown, so
//!   steady-state calls on device buffers allocate nothing.
//!
//! ```no_run
//! # fn main() -> zcomm::Result<()> {
//! use zcomm::gpu::GpuCodec;
//! use zcomm::{CodecKind, ErrorBound};
//! let mut gpu = GpuCodec::new(0)?;
//! let data: Vec<f32> = (0..1 << 20).map(|i| (i as f32 * 1e-3).sin()).collect();
//! let stream = gpu.compress(&data, ErrorBound::Noa(1e-3), CodecKind::Aatrox)?;
//! assert_eq!(stream, zcomm::compress(&data, ErrorBound::Noa(1e-3), CodecKind::Aatrox)?);
//! let back: Vec<f32> = gpu.decompress(&stream)?;
//! # Ok(()) }
//! ```

mod accumulate;
pub use accumulate::StepEncoding;
mod decode;
use decode::{check_header_for, decode_error, judge_guessed, parse_header_fields, Onto};
mod queued;
pub(crate) use queued::{Decode, QueuedDecode};
mod range;
pub use range::DeviceRange;
pub mod bench;
pub mod compile;
pub mod cuszi;
mod functions;
pub mod gpz;
mod shaped;
mod step_timer;
#[doc(hidden)]
pub mod testing;
pub(crate) mod util;

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{
    result as cu, sys as cu_sys, CudaContext, CudaFunction, CudaSlice, CudaStream, CudaView,
    CudaViewMut, DevicePtr, DevicePtrMut, DeviceRepr, PinnedHostSlice, ValidAsZeroBits,
};

use crate::codec::CodecKind;
use crate::element::Element;
use crate::error::{Error, Result};
use crate::format::{
    zhash_bytes, zhash_final, BoundMode, Dtype, Header, FLAG_STORED, HEADER_LEN, HEADER_LEN_V3,
};
use crate::quant::{ErrorBound, QuantParams};

/// The value of an order-preserving key of the kernels (`zc_key` / `zu_key`: the sign bit flipped
/// for non-negative values, all bits for negative ones; f32 keys in the low 32 bits), as f64.
pub(crate) fn from_key<T>(k: u64) -> f64 {
    if std::mem::size_of::<T>() == 4 {
        let k = k as u32;
        let b = if k & 0x8000_0000 != 0 {
            k & 0x7fff_ffff
        } else {
            !k
        };
        f32::from_bits(b) as f64
    } else {
        let b = if k & (1 << 63) != 0 {
            k & !(1u64 << 63)
        } else {
            !k
        };
        f64::from_bits(b)
    }
}

/// Threads per block of the pfpl kernels (kernels/pfpl.cu, PF_THREADS).
const PFPL_THREADS: u32 = 256;
const CTRL_WORDS: usize = 16;
// ctrl word indices (kernels/blocked.cu ZC_*, kernels/pfpl.cu PF_*; checked by
// compile::tests::constants_shared_with_the_kernels_agree)
const C_HASH: usize = 2;
const C_PAYLOAD: usize = 3;
const C_ERR: usize = 4;
/// pfpl: sum of `zhash_mix(c_i, i)` over chunk hashes `c_i` (the data checksum before its final
/// step; kernels/pfpl.cu PF_DHASH).
const C_DHASH: usize = 5;
const C_MIN: usize = 6;
const C_MAX: usize = 7;
const C_FIRST: usize = 8;
/// u64 words of the pinned small-transfer buffer: the ctrl words, or a header read or written
/// on its own (a version 3 header with the largest GPZ header after it, 136 + 248 bytes).
const PINNED_WORDS: usize = 64;
// (56 + 48 d: the GPZ header of d = 4 axes, GPZ-FORMAT.md)
const _: () =
    assert!(HEADER_LEN_V3 + 56 + 48 * 4 <= PINNED_WORDS * 8 && CTRL_WORDS <= PINNED_WORDS);
// Result words of a blocked-codec decompression, written by the kernel's last block into
// host-mapped memory (kernels/blocked.cu ZC_RES_*): error bits, the launch's `seq`, the header.
const R_ERR: usize = 0;
const R_SEQ: usize = 1;
const R_HDR: usize = 2;
const RES_WORDS: usize = R_HDR + HEADER_LEN / 8;
/// Sets of result words: slot 0 for the decodes waited for at once, the others for decodes
/// queued without waiting ([`GpuCodec::queue_decode`]), one each until it is settled.
const RESULT_SLOTS: usize = 1 + queued::QUEUE_DEPTH;
/// Error bit of a guessing decoder launch whose guess was wrong (kernels/blocked.cu
/// `ZC_E_GUESS`): it decoded nothing.
const E_GUESS: u64 = 64;

/// Finite value range and the index of the first finite non-zero value of an input (from the
/// stats kernel; the value itself is read only when the quantizer needs it).
type Stats = (Option<(f64, f64)>, Option<u64>);

/// Element types the GPU codecs handle (`f32`, `f64`).
pub trait GpuElement: Element + DeviceRepr + ValidAsZeroBits {
    /// Kernel name suffix.
    const KERNEL_TAG: &'static str;
}
impl GpuElement for f32 {
    const KERNEL_TAG: &'static str = "f32";
}
impl GpuElement for f64 {
    const KERNEL_TAG: &'static str = "f64";
}

/// Whether a CUDA driver and at least one device are present.
pub fn device_available() -> bool {
    // SAFETY: only tries to dlopen the driver.
    if !unsafe { cu_sys::is_culib_present() } {
        return false;
    }
    matches!(CudaContext::device_count(), Ok(n) if n > 0)
}

fn gpu_err(what: &str) -> impl Fn(cu::DriverError) -> Error + '_ {
    move |e| Error::Gpu(format!("{what}: {e:?}"))
}

/// Kernel times of the last call (CUDA events around each launch), when timing is on.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct KernelTimes {
    /// Milliseconds in the value-range kernel (noa without a given range / degenerate step /
    /// [`GpuCodec::value_range_device`]), 0 if not launched.
    pub stats_ms: f32,
    /// Milliseconds in the main compress or decompress kernel. For `cuszi` and `gpz`, whose
    /// calls are a sequence of kernels with small read-backs between them, the span of the
    /// whole call's device work (the host's decisions between the kernels included).
    pub main_ms: f32,
}

/// A CUDA device with the codecs loaded, one stream, and reusable workspaces.
///
/// `cuszi` and `gpz` run on [`cuszi::CusziGpu`] and [`gpz::GpzGpu`], created on this codec's
/// stream at their first call (their kernels compiled or loaded then). A message is compressed
/// as the 1-D array it is, with the bytes of [`crate::compress`]: `cuszi` with the shape
/// `[n]`, `gpz` as `n` particles of one coordinate in input order, its GPZ stream wrapped in
/// the version 3 header as the CPU wraps it (GPZ-FORMAT.md). Decompression takes any shape a
/// stream records. What those classes leave to the CPU twin (`cuszi`: `rel` bounds,
/// degenerate steps, stored streams) runs on a host copy, so the bytes are the same; a given
/// `noa` range (`compress_device_with_range`) has no `cuszi` kernels and is compressed by the
/// CPU twin too, and `gpz` refuses it, and `rel` bounds, with the CPU's errors. The
/// decompress-and-add calls decode those streams into a scratch buffer and add it with the
/// same single rounding as the fused kernels; [`GpuCodec::reduce_step_device`] has no
/// reconstructing kernel for them (its callers compress, then decode).
pub struct GpuCodec {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// The blocked codecs' and utility kernels.
    funcs: functions::Functions,
    name: String,
    arch: String,
    sm_count: u32,
    threads: u32,
    /// Device words of every launch, cleared by one memset (or, between decompressions, by the
    /// blocked decoder itself): [`CTRL_WORDS`] ctrl words (ticket,
    /// done count, hashes, error flags, ...) followed by the per-chunk look-back status words.
    work: CudaSlice<u64>,
    /// Status words that `work` holds after the ctrl words.
    status_cap: usize,
    /// How many leading status words are known to be zero together with the ctrl words a
    /// blocked decoder uses (ticket, done, hash, error): the decoder's last block leaves them
    /// so, and then the next decompression needs no memset. 0 when not known.
    clean_status: usize,
    /// The `seq` argument of the last blocked-decoder launch (its last block writes it back).
    seq: u64,
    /// Host-mapped page-locked words the blocked decoders write their result into (allocated at
    /// the first decompression), with their host and device addresses.
    mapped: Option<(PinnedHostSlice<u64>, usize, u64)>,
    host_ctrl: Vec<u64>,
    /// Pinned host words for the small transfers of every call (ctrl words, the 96-byte header,
    /// one value): pinned copies skip the driver's pageable staging.
    pinned: Option<PinnedHostSlice<u64>>,
    // host-API staging buffers (grown on demand)
    dev_in: Option<CudaSlice<u8>>,
    dev_out: Option<CudaSlice<u8>>,
    /// The device ring's compression scratch (`comm::device_ring`), kept between calls so that
    /// repeated reductions allocate it once.
    pub(crate) ring_scratch: Option<CudaSlice<u8>>,
    /// The device ring's exact-range words (`comm::device_ring`, a deferred final bound), kept
    /// between calls like the scratch and cleared at the start of each.
    pub(crate) ring_range: Option<DeviceRange>,
    /// The `cuszi` kernels on this codec's stream, loaded at the first `cuszi` call.
    cuszi: Option<cuszi::CusziGpu>,
    /// The `gpz` kernels on this codec's stream, loaded at the first `gpz` call.
    gpz: Option<gpz::GpzGpu>,
    /// Device scratch of `cuszi` and `gpz` calls, kept and grown: the GPZ stream before it is
    /// wrapped, the values a decompress-and-add decodes before adding them.
    shaped_scratch: Option<CudaSlice<u8>>,
    timing: bool,
    ev: Option<[cudarc::driver::CudaEvent; 4]>,
    last_times: KernelTimes,
    /// Dtype, codec and bound mode of the last blocked stream decompressed: the next
    /// `decompress_device` of that dtype launches for them before the header is back.
    decode_guess: Option<(Dtype, CodecKind, BoundMode)>,
    /// The `seq` of every decode queued and not yet settled ([`GpuCodec::settle`]); its
    /// result slot is `queued::slot_of(seq)`.
    queued: Vec<u64>,
}

impl std::fmt::Debug for GpuCodec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuCodec")
            .field("device", &self.name)
            .field("arch", &self.arch)
            .finish()
    }
}

/// Registers, local (spilled) bytes and static shared bytes of a loaded kernel.
pub(crate) fn resources(f: &CudaFunction) -> Result<(i32, i32, i32)> {
    Ok((
        f.num_regs().map_err(gpu_err("attr"))?,
        f.local_size_bytes().map_err(gpu_err("attr"))?,
        f.shared_size_bytes().map_err(gpu_err("attr"))?,
    ))
}

/// The device address of `p` on stream `s`, for raw driver calls and `u64` kernel arguments
/// (shared with [`gpz`]).
fn raw_ptr<T, P: DevicePtr<T>>(p: &P, s: &CudaStream) -> u64 {
    let (ptr, _g) = p.device_ptr(s);
    ptr
}
/// [`raw_ptr`] of a buffer the caller writes through.
fn raw_ptr_mut<T, P: DevicePtrMut<T>>(p: &mut P, s: &CudaStream) -> u64 {
    let (ptr, _g) = p.device_ptr_mut(s);
    ptr
}

/// `data` as a slice of `U`, for the `*_any` entry points that dispatch a generic [`Element`] on
/// its dtype to the f32 or f64 kernels. Panics unless `T` and `U` have the same dtype.
pub(crate) fn same_elements<T: Element, U: Element>(data: &[T]) -> &[U] {
    assert_eq!(T::DTYPE, U::DTYPE, "element types differ");
    // SAFETY: Element is sealed to f32/f64 and DTYPE names the type itself, so T and U are
    // the same type.
    unsafe { std::slice::from_raw_parts(data.as_ptr() as *const U, data.len()) }
}

/// [`same_elements`] of a slice the callee writes.
pub(crate) fn same_elements_mut<T: Element, U: Element>(data: &mut [T]) -> &mut [U] {
    assert_eq!(T::DTYPE, U::DTYPE, "element types differ");
    // SAFETY: as in `same_elements`.
    unsafe { std::slice::from_raw_parts_mut(data.as_mut_ptr() as *mut U, data.len()) }
}

/// Pointer to a kernel argument, as `cuLaunchKernel` wants it.
fn arg<T>(v: &T) -> *mut c_void {
    v as *const T as *mut c_void
}

impl GpuCodec {
    /// Open device `ordinal`, compile (or load from the cache) the kernels for its architecture.
    /// [`Error::Unavailable`] without a CUDA driver, device or NVRTC.
    pub fn new(ordinal: usize) -> Result<Self> {
        // SAFETY: only tries to dlopen the driver.
        if !unsafe { cu_sys::is_culib_present() } {
            return Err(Error::Unavailable("CUDA driver (libcuda) not found".into()));
        }
        let n = CudaContext::device_count()
            .map_err(|e| Error::Unavailable(format!("no CUDA device: {e:?}")))?;
        if ordinal >= n.max(0) as usize {
            return Err(Error::Unavailable(format!(
                "no CUDA device {ordinal} ({n} present)"
            )));
        }
        let ctx = CudaContext::new(ordinal).map_err(gpu_err("cuCtx"))?;
        let (maj, min) = ctx
            .compute_capability()
            .map_err(gpu_err("compute capability"))?;
        let arch = format!("sm_{maj}{min}");
        let name = ctx.name().map_err(gpu_err("device name"))?;
        let sm_count = ctx
            .attribute(cu_sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(gpu_err("SM count"))? as u32;
        let warps = compile::blocked_warps();
        let cubin = compile::blocked_cubin(&arch, warps)?;
        let module = ctx
            .load_module(cudarc::nvrtc::Ptx::from_binary(cubin))
            .map_err(gpu_err("cuModuleLoadData"))?;
        let stream = ctx.default_stream();
        let work = stream
            .alloc_zeros::<u64>(CTRL_WORDS + 64)
            .map_err(gpu_err("alloc"))?;
        Ok(GpuCodec {
            ctx,
            stream,
            funcs: functions::Functions::new(module, "blocked"),
            name,
            arch,
            sm_count,
            threads: 32 * warps,
            work,
            status_cap: 64,
            clean_status: 0,
            seq: 0,
            mapped: None,
            host_ctrl: vec![0; CTRL_WORDS],
            pinned: None,
            dev_in: None,
            dev_out: None,
            ring_scratch: None,
            ring_range: None,
            cuszi: None,
            gpz: None,
            shaped_scratch: None,
            timing: false,
            ev: None,
            last_times: KernelTimes::default(),
            decode_guess: None,
            queued: Vec::new(),
        })
    }

    /// Move this codec to a stream of its own instead of the context's default stream, so that
    /// several codecs on one device (the ranks of a loopback group, a compute stream beside a
    /// communication stream) run their work concurrently.
    pub fn with_own_stream(mut self) -> Result<Self> {
        // the workspace was cleared on the old stream: finish that before switching
        self.stream.synchronize().map_err(gpu_err("sync"))?;
        self.stream = self.ctx.new_stream().map_err(gpu_err("new stream"))?;
        // (the shape-aware codecs' classes are created on the new stream when first used)
        self.cuszi = None;
        self.gpz = None;
        Ok(self)
    }

    /// The device's name (e.g. "NVIDIA H100 80GB HBM3").
    pub fn device_name(&self) -> &str {
        &self.name
    }
    /// The architecture the kernels were compiled for (e.g. "sm_90").
    pub fn arch(&self) -> &str {
        &self.arch
    }
    /// The CUDA context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
    /// The stream every operation of this codec is ordered on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Record CUDA events around each kernel launch (see [`GpuCodec::last_kernel_times`]).
    pub fn set_kernel_timing(&mut self, on: bool) -> Result<()> {
        if on && self.ev.is_none() {
            let mk = || {
                self.ctx
                    .new_event(Some(cu_sys::CUevent_flags::CU_EVENT_DEFAULT))
                    .map_err(gpu_err("event"))
            };
            self.ev = Some([mk()?, mk()?, mk()?, mk()?]);
        }
        self.timing = on;
        Ok(())
    }
    /// Kernel times of the last compress/decompress call (zeros unless timing is on).
    pub fn last_kernel_times(&self) -> KernelTimes {
        self.last_times
    }

    /// Registers, spilled bytes and static shared memory of a kernel (for reports).
    pub fn kernel_resources(&mut self, name: &str) -> Result<(i32, i32, i32)> {
        resources(&self.func(name)?)
    }

    fn func(&mut self, name: &str) -> Result<CudaFunction> {
        self.funcs.get(name)
    }

    fn launch(
        &self,
        f: &CudaFunction,
        grid: u32,
        block: u32,
        args: &mut [*mut c_void],
    ) -> Result<()> {
        self.ctx.bind_to_thread().map_err(gpu_err("bind"))?;
        // SAFETY: `args` point at values whose types match the kernel's parameters (checked by
        // the callers below against kernels/blocked.cu) and outlive the call; the buffers they
        // name are live allocations of the sizes the kernel assumes.
        unsafe {
            cu::launch_kernel(
                f.cu_function(),
                (grid, 1, 1),
                (block, 1, 1),
                0,
                self.stream.cu_stream(),
                args,
            )
        }
        .map_err(gpu_err("cuLaunchKernel"))
    }

    fn record(&self, i: usize) -> Result<()> {
        if self.timing {
            if let Some(ev) = &self.ev {
                ev[i]
                    .record(&self.stream)
                    .map_err(gpu_err("event record"))?;
            }
        }
        Ok(())
    }
    fn elapsed(&self, a: usize, b: usize) -> Result<f32> {
        match (&self.ev, self.timing) {
            (Some(ev), true) => ev[a].elapsed_ms(&ev[b]).map_err(gpu_err("event elapsed")),
            _ => Ok(0.0),
        }
    }

    /// Device address of the ctrl words.
    fn ctrl_ptr(&mut self) -> u64 {
        raw_ptr_mut(&mut self.work, &self.stream.clone())
    }

    /// Device address of the look-back status words (right after the ctrl words).
    fn status_ptr(&mut self) -> u64 {
        self.ctrl_ptr() + (CTRL_WORDS * 8) as u64
    }

    /// Clear the ctrl words and the first `n_status` status words (one memset, queued on the
    /// stream), growing the workspace when needed.
    fn zero_ctrl(&mut self, n_status: usize) -> Result<()> {
        // whatever launch follows leaves its words set
        self.clean_status = 0;
        if self.status_cap < n_status {
            let cap = n_status.next_power_of_two();
            self.work = self
                .stream
                .alloc_zeros::<u64>(CTRL_WORDS + cap)
                .map_err(|e| Error::OutOfMemory(format!("look-back workspace: {e:?}")))?;
            self.status_cap = cap;
        }
        self.ctx.bind_to_thread().map_err(gpu_err("bind"))?;
        let p = self.ctrl_ptr();
        // SAFETY: the allocation holds CTRL_WORDS + status_cap >= CTRL_WORDS + n_status words.
        unsafe {
            cu::memset_d8_async(p, 0, (CTRL_WORDS + n_status) * 8, self.stream.cu_stream())
                .map_err(gpu_err("memset"))?;
        }
        Ok(())
    }

    /// The pinned small-transfer buffer ([`PINNED_WORDS`] u64), allocated at first use.
    fn pinned_ptr(&mut self) -> Result<*mut u64> {
        if self.pinned.is_none() {
            // SAFETY: plain page-locked host memory (not write-combined: the host reads it).
            let p = unsafe { self.ctx.alloc_pinned_with_flags::<u64>(PINNED_WORDS, 0) }
                .map_err(|e| Error::OutOfMemory(format!("pinned host words: {e:?}")))?;
            self.pinned = Some(p);
        }
        let p = self.pinned.as_mut().expect("allocated above");
        p.as_mut_ptr().map_err(gpu_err("pinned"))
    }

    /// Copy `bytes` (at most `PINNED_WORDS * 8`) from device address `src` to the host through
    /// the pinned buffer; synchronizes the stream.
    fn read_small(&mut self, src: u64, out: &mut [u8]) -> Result<()> {
        if out.len() > PINNED_WORDS * 8 {
            return Err(Error::invalid("small read longer than the pinned buffer"));
        }
        let hp = self.pinned_ptr()? as *mut u8;
        let s = self.stream.clone();
        // SAFETY: the pinned buffer holds PINNED_WORDS * 8 >= out.len() bytes and is used by
        // this codec only; the stream is synchronized before it is read.
        unsafe {
            let h = std::slice::from_raw_parts_mut(hp, out.len());
            cu::memcpy_dtoh_async(h, src, s.cu_stream()).map_err(gpu_err("memcpy dtoh"))?;
            s.synchronize().map_err(gpu_err("sync"))?;
            out.copy_from_slice(h);
        }
        Ok(())
    }

    fn read_ctrl(&mut self) -> Result<()> {
        let cp = self.ctrl_ptr();
        let mut b = [0u8; CTRL_WORDS * 8];
        self.read_small(cp, &mut b)?;
        for (w, c) in self.host_ctrl.iter_mut().zip(b.chunks_exact(8)) {
            *w = u64::from_ne_bytes(c.try_into().expect("8 bytes"));
        }
        Ok(())
    }

    /// Write `bytes` (a header: at most `PINNED_WORDS * 8`) to device address `dst` through the
    /// pinned buffer; synchronizes the stream.
    fn write_bytes(&mut self, dst: u64, bytes: &[u8]) -> Result<()> {
        if bytes.len() > PINNED_WORDS * 8 {
            return Err(Error::invalid("small write longer than the pinned buffer"));
        }
        let hp = self.pinned_ptr()? as *mut u8;
        let s = self.stream.clone();
        // SAFETY: as in read_small; the copy completes before the pinned buffer is reused.
        unsafe {
            let h = std::slice::from_raw_parts_mut(hp, bytes.len());
            h.copy_from_slice(bytes);
            cu::memcpy_htod_async(dst, &*h, s.cu_stream()).map_err(gpu_err("memcpy htod"))?;
        }
        s.synchronize().map_err(gpu_err("sync"))
    }

    /// The value at index `idx` of the input at device address `input` (the first finite
    /// non-zero value the stats kernel found), read only when the quantizer needs it.
    fn value_at<T: GpuElement>(&mut self, input: u64, idx: u64) -> Result<f64> {
        let mut b = [0u8; 8];
        self.read_small(input + idx * T::SIZE as u64, &mut b[..T::SIZE])?;
        Ok(T::read_le(&b[..T::SIZE]).to_f64())
    }

    /// Value range and first finite non-zero value of `n` values at `input` (one kernel).
    /// With `clear` false the caller has already cleared the ctrl words on the stream (the
    /// compression kernels use other ctrl words than this one, so one memset serves both).
    fn stats<T: GpuElement>(&mut self, input: u64, n: usize, clear: bool) -> Result<Stats> {
        if clear {
            self.zero_ctrl(0)?;
        }
        let f = self.func(&format!("zc_stats_{}", T::KERNEL_TAG))?;
        let ctrl = self.ctrl_ptr();
        let n64 = n as u64;
        let grid = (self.sm_count * 8).min(n.div_ceil(256 * 4).max(1) as u32);
        self.record(0)?;
        self.launch(&f, grid, 256, &mut [arg(&input), arg(&n64), arg(&ctrl)])?;
        self.record(1)?;
        self.read_ctrl()?;
        self.last_times.stats_ms = self.elapsed(0, 1)?;
        let c = &self.host_ctrl;
        let from_key = from_key::<T>;
        let range = if c[C_MIN] != 0 && c[C_MAX] != 0 {
            // same canonical zero as quant::finite_range
            Some((from_key(!c[C_MIN]) + 0.0, from_key(c[C_MAX]) + 0.0))
        } else {
            None
        };
        let first = (c[C_FIRST] != 0).then(|| !c[C_FIRST]);
        Ok((range, first))
    }

    /// The finite value range `(min, max)` of `input` (device memory), exactly as the value-range
    /// kernel of [`GpuCodec::compress_device`] computes it for a `noa` bound (equal to
    /// [`crate::quant::finite_range`] of the same values, `-0.0` as `+0.0`), or `None` when
    /// `input` holds no finite value. One reduction kernel and a small read-back (synchronizes
    /// the stream); with kernel timing on, [`GpuCodec::last_kernel_times`] reports it as
    /// `stats_ms`. Compute it once and pass it to [`GpuCodec::compress_device_with_range`] to
    /// skip that kernel on later calls (`(0.0, 0.0)` in place of `None` gives the same stream as
    /// [`GpuCodec::compress_device`]).
    pub fn value_range_device<T: GpuElement>(
        &mut self,
        input: &CudaView<'_, T>,
    ) -> Result<Option<(f64, f64)>> {
        let s = self.stream.clone();
        let in_ptr = raw_ptr(input, &s);
        if in_ptr % (T::SIZE as u64) != 0 {
            return Err(Error::invalid("device buffer must be element aligned"));
        }
        self.last_times = KernelTimes::default();
        if input.is_empty() {
            return Ok(None);
        }
        Ok(self.stats::<T>(in_ptr, input.len(), true)?.0)
    }

    /// Compress `input` (device memory) into `out` (device memory, at least
    /// [`crate::compress_bound`] bytes, 4-byte aligned). Returns the stream length; the bytes
    /// `out[..len]` equal what [`crate::compress`] returns for the same values.
    pub fn compress_device<T: GpuElement>(
        &mut self,
        input: &CudaView<'_, T>,
        bound: ErrorBound,
        codec: CodecKind,
        out: &mut CudaViewMut<'_, u8>,
    ) -> Result<usize> {
        self.compress_device_impl(input, bound, codec, None, out)
    }

    /// [`GpuCodec::compress_device`] under a `noa` bound with the value range `range = (min,
    /// max)` given by the caller (e.g. from one [`GpuCodec::value_range_device`] call reused for
    /// many compressions): no value-range kernel and no read-back for it, except when the bound
    /// is degenerate (e.g. `min == max`) and the first finite non-zero value is needed, as in
    /// [`GpuCodec::compress_device`]. The bytes `out[..len]` equal what
    /// [`crate::compress_with_range`] returns for the same values and range (see there for the
    /// guarantee), and what [`GpuCodec::compress_device`] returns when `range` is the data's own.
    /// Rejects the same bounds and ranges as [`crate::compress_with_range`]
    /// ([`Error::InvalidArgument`]).
    pub fn compress_device_with_range<T: GpuElement>(
        &mut self,
        input: &CudaView<'_, T>,
        bound: ErrorBound,
        codec: CodecKind,
        range: (f64, f64),
        out: &mut CudaViewMut<'_, u8>,
    ) -> Result<usize> {
        self.compress_device_impl(input, bound, codec, Some(range), out)
    }

    /// The body of [`GpuCodec::compress_device`] (`range` = None: measured by the value-range
    /// kernel for `noa`) and [`GpuCodec::compress_device_with_range`] (`range` given).
    fn compress_device_impl<T: GpuElement>(
        &mut self,
        input: &CudaView<'_, T>,
        bound: ErrorBound,
        codec: CodecKind,
        range: Option<(f64, f64)>,
        out: &mut CudaViewMut<'_, u8>,
    ) -> Result<usize> {
        bound.validate()?;
        if !codec.has_gpu() {
            return Err(no_gpu_kernels(codec));
        }
        match codec {
            CodecKind::Cuszi => return self.compress_cuszi(input, bound, range, out),
            CodecKind::Gpz => return self.compress_gpz(input, bound, range, out),
            _ => {}
        }
        let n = input.len();
        let (in_ptr, out_ptr, n_chunks) = self.blocked_buffers(input, codec, out)?;
        self.last_times = KernelTimes::default();
        // one memset for the statistics kernel's and the compression kernel's ctrl words and the
        // look-back status words
        if n > 0 {
            self.zero_ctrl(n_chunks)?;
        }
        let params = self.device_params::<T>(in_ptr, n, bound, range)?;
        self.compress_with_params::<T>(in_ptr, n, codec, &params, false, None, out_ptr)
    }

    /// The checks of a blocked compression's buffers (`out` at least
    /// [`crate::compress_bound`] bytes and 16-byte aligned, `input` element aligned, a chunk
    /// count the stream's table can hold): the input and output addresses and the chunk count.
    pub(crate) fn blocked_buffers<T: GpuElement>(
        &self,
        input: &CudaView<'_, T>,
        codec: CodecKind,
        out: &mut CudaViewMut<'_, u8>,
    ) -> Result<(u64, u64, usize)> {
        let n = input.len();
        let bound_len = HEADER_LEN + n * T::SIZE;
        if out.len() < bound_len {
            return Err(Error::invalid(format!(
                "output buffer of {} bytes is smaller than compress_bound = {bound_len}",
                out.len()
            )));
        }
        let s = &self.stream;
        let in_ptr = raw_ptr(input, s);
        let out_ptr = raw_ptr_mut(out, s);
        if out_ptr % 16 != 0 || in_ptr % (T::SIZE as u64) != 0 {
            return Err(Error::invalid(
                "device buffers must be 16-byte (output) / element aligned",
            ));
        }
        let n_chunks = n.div_ceil(1 << codec.chunk_log2(T::DTYPE));
        if n_chunks > u32::MAX as usize {
            return Err(Error::invalid("too many values for one stream"));
        }
        Ok((in_ptr, out_ptr, n_chunks))
    }

    /// The quantizer parameters of the `n` values at device address `in_ptr` under `bound`
    /// (`range`: a given `noa` range): the CPU path's Rust code, with the statistics it needs
    /// (the value range unless given, the first finite non-zero value for a degenerate step)
    /// from the value-range kernel. The caller has cleared the ctrl words on the stream.
    fn device_params<T: GpuElement>(
        &mut self,
        in_ptr: u64,
        n: usize,
        bound: ErrorBound,
        range: Option<(f64, f64)>,
    ) -> Result<QuantParams> {
        let mut stats: Option<Stats> = None;
        if range.is_none() && n > 0 && matches!(bound, ErrorBound::Noa(_)) {
            stats = Some(self.stats::<T>(in_ptr, n, false)?);
        }
        let mut first_err = None;
        let params = {
            let st = stats;
            let me = &mut *self;
            let mut first_cell = st.map(|s| s.1);
            let first_nonzero = || {
                if n == 0 {
                    return None;
                }
                let idx = match first_cell.take() {
                    Some(i) => i,
                    None => match me.stats::<T>(in_ptr, n, false) {
                        Ok(s) => s.1,
                        Err(e) => {
                            first_err = Some(e);
                            return None;
                        }
                    },
                }?;
                match me.value_at::<T>(in_ptr, idx) {
                    Ok(v) => Some(v),
                    Err(e) => {
                        first_err = Some(e);
                        None
                    }
                }
            };
            match range {
                Some(r) => QuantParams::derive_with_range::<T>(bound, r, first_nonzero),
                None => QuantParams::derive_from_stats::<T>(
                    bound,
                    || st.and_then(|s| s.0),
                    first_nonzero,
                ),
            }?
        };
        if let Some(e) = first_err {
            return Err(e);
        }
        Ok(params)
    }

    /// Compress `data` (device memory) with a blocked codec under `params`, into `out` (at least
    /// [`crate::compress_bound`] bytes, 16-byte aligned); with `reconstruct` (abs/noa modes) the
    /// kernel overwrites `data` with what the stream decodes it to, except when the stream would
    /// be stored (returned length = `compress_bound`), after which `data` is unspecified and
    /// `out` holds no stream (no stored copy is made of values `data` may no longer hold).
    pub(crate) fn compress_blocked<T: GpuElement>(
        &mut self,
        data: &mut CudaViewMut<'_, T>,
        codec: CodecKind,
        params: &QuantParams,
        reconstruct: bool,
        out: &mut CudaViewMut<'_, u8>,
    ) -> Result<usize> {
        let n = data.len();
        if out.len() < HEADER_LEN + n * T::SIZE {
            return Err(Error::invalid(format!(
                "output buffer of {} bytes is smaller than compress_bound = {}",
                out.len(),
                HEADER_LEN + n * T::SIZE
            )));
        }
        let s = self.stream.clone();
        let (in_ptr, out_ptr) = (raw_ptr_mut(data, &s), raw_ptr_mut(out, &s));
        if out_ptr % 16 != 0 || in_ptr % (T::SIZE as u64) != 0 {
            return Err(Error::invalid(
                "device buffers must be 16-byte (output) / element aligned",
            ));
        }
        if n > 0 {
            self.zero_ctrl(n.div_ceil(1 << codec.chunk_log2(T::DTYPE)))?;
        }
        self.last_times = KernelTimes::default();
        self.compress_with_params::<T>(in_ptr, n, codec, params, reconstruct, None, out_ptr)
    }

    /// Launch the compression kernel of `codec` for the `n` values at device address `in_ptr`
    /// quantised with `params` into `out_ptr` (`compress_bound` bytes; ctrl and status words
    /// clear), and finish the stream: returns its length, storing the values instead when the
    /// compressed stream would not be smaller. `reconstruct`: the `compress_recon` kernel, which
    /// overwrites the input with its reconstruction (blocked codecs, abs/noa). `track`: the
    /// device address of a [`DeviceRange`]'s words, into which the `compress_track` kernel
    /// (blocked codecs, abs/noa, not with `reconstruct`) folds the input's finite range.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn compress_with_params<T: GpuElement>(
        &mut self,
        in_ptr: u64,
        n: usize,
        codec: CodecKind,
        params: &QuantParams,
        reconstruct: bool,
        track: Option<u64>,
        out_ptr: u64,
    ) -> Result<usize> {
        let raw_len = n * T::SIZE;
        let bound_len = HEADER_LEN + raw_len;
        let n_chunks = n.div_ceil(1 << codec.chunk_log2(T::DTYPE));
        if n_chunks > u32::MAX as usize {
            return Err(Error::invalid("too many values for one stream"));
        }
        let header = |flags, payload_len: u64, n_chunks, payload_checksum, data_checksum| Header {
            data_checksum,
            ..stream_header::<T>(
                codec,
                n,
                params,
                flags,
                payload_len,
                n_chunks,
                payload_checksum,
            )
        };
        if n == 0 {
            let h = header(FLAG_STORED, 0, 0, zhash_bytes(&[]), 0);
            self.write_bytes(out_ptr, &h.to_bytes())?;
            return Ok(HEADER_LEN);
        }
        let step = T::from_f64(params.step);
        let inv = T::from_f64(1.0 / step.to_f64());
        let threads = if codec == CodecKind::Pfpl {
            PFPL_THREADS
        } else {
            self.threads
        };
        let op = match (reconstruct, track) {
            (true, None) => "compress_recon",
            (false, None) => "compress",
            (false, Some(_)) => "compress_track",
            (true, Some(_)) => {
                return Err(Error::invalid(
                    "no kernel both reconstructs and tracks the value range",
                ))
            }
        };
        let f = self.func(&kernel_name::<T>(op, codec, params.mode)?)?;
        let count = n as u64;
        let cap = bound_len as u64;
        let status = self.status_ptr();
        let ctrl = self.ctrl_ptr();
        let nc = n_chunks as u32;
        let (step64, eb) = (params.step, params.abs_bound);
        // the blocked kernels' last block writes the header: this one with its payload length
        // and checksums filled in (kernels/blocked.cu zc_write_header)
        let hdr_words = header_words(&header(0, 0, nc, 0, 0));
        let range_ptr = track.unwrap_or(0);
        let mut args = [
            arg(&in_ptr),
            arg(&count),
            arg(&out_ptr),
            arg(&cap),
            arg(&status),
            arg(&ctrl),
            arg(&nc),
            arg(&step),
            arg(&inv),
            arg(&step64),
            arg(&eb),
            arg(&hdr_words),
            arg(&range_ptr),
        ];
        let n_args = match (codec, track) {
            (CodecKind::Pfpl, _) => 11,
            (_, None) => 12,
            (_, Some(_)) => 13,
        };
        self.record(2)?;
        self.launch(&f, nc, threads, &mut args[..n_args])?;
        self.record(3)?;
        self.read_ctrl()?;
        self.last_times.main_ms = self.elapsed(2, 3)?;
        let payload = self.host_ctrl[C_PAYLOAD];
        if payload < raw_len as u64 {
            if codec == CodecKind::Pfpl {
                // table: one u16 size per chunk
                let dc = zhash_final(self.host_ctrl[C_DHASH] as u32, nc);
                let th = zhash_final(self.host_ctrl[C_HASH] as u32, nc.div_ceil(2));
                let h = header(0, payload, nc, th, dc);
                self.write_bytes(out_ptr, &h.to_bytes())?;
            }
            return Ok(HEADER_LEN + payload as usize);
        }
        if reconstruct {
            // the values are partly overwritten: storing them would store garbage (the caller
            // re-forms them; see compress_blocked)
            return Ok(bound_len);
        }
        // stored stream: raw values after the header
        let hash = self.copy_hash(in_ptr, raw_len, Some(out_ptr + HEADER_LEN as u64))?;
        let h = header(FLAG_STORED, raw_len as u64, 0, hash, 0);
        self.write_bytes(out_ptr, &h.to_bytes())?;
        Ok(bound_len)
    }

    /// Queue a kernel that holds this codec's stream for `micros` microseconds (benchmarks: the
    /// launches queued behind it start back to back, so [`GpuCodec::last_kernel_times`] of the
    /// next call does not include the host's launch latency where the call does not wait on
    /// the GPU before its kernel).
    pub fn hold_stream(&mut self, micros: u32) -> Result<()> {
        let f = self.func("zc_spin")?;
        let ns = u64::from(micros) * 1000;
        self.launch(&f, 1, 1, &mut [arg(&ns)])
    }

    /// zhash of `bytes` (a multiple of 4) at `src`, copying them to `dst` when given.
    fn copy_hash(&mut self, src: u64, bytes: usize, dst: Option<u64>) -> Result<u32> {
        self.zero_ctrl(0)?;
        let f = self.func("zc_copy_hash")?;
        let ctrl = self.ctrl_ptr();
        let nwords = (bytes / 4) as u64;
        let dst = dst.unwrap_or(0);
        let grid = (self.sm_count * 8).min((nwords as usize).div_ceil(256).max(1) as u32);
        self.launch(
            &f,
            grid,
            256,
            &mut [arg(&src), arg(&nwords), arg(&dst), arg(&ctrl)],
        )?;
        self.read_ctrl()?;
        Ok((self.host_ctrl[C_HASH] as u32) ^ (nwords as u32).wrapping_mul(0x27D4_EB2F))
    }

    fn staging(slot: &mut Option<CudaSlice<u8>>, s: &Arc<CudaStream>, bytes: usize) -> Result<()> {
        let need = bytes.max(16);
        if slot.as_ref().map(|b| b.len() < need).unwrap_or(true) {
            *slot = None;
            // SAFETY: u8 device memory; every byte read later is written first.
            let b = unsafe { s.alloc::<u8>(need) }
                .map_err(|e| Error::OutOfMemory(format!("{need} device bytes: {e:?}")))?;
            *slot = Some(b);
        }
        Ok(())
    }

    /// Run `op` on the staging buffers grown to `in_bytes` and `out_bytes` (at least): they are
    /// taken out of `self` for the call, so that `op` can use `self` too, and put back after it,
    /// whether it failed or not.
    fn with_staging<R>(
        &mut self,
        in_bytes: usize,
        out_bytes: usize,
        op: impl FnOnce(&mut Self, &mut CudaSlice<u8>, &mut CudaSlice<u8>) -> Result<R>,
    ) -> Result<R> {
        let s = self.stream.clone();
        Self::staging(&mut self.dev_in, &s, in_bytes)?;
        Self::staging(&mut self.dev_out, &s, out_bytes)?;
        let mut din = self.dev_in.take().expect("staged");
        let mut dout = self.dev_out.take().expect("staged");
        let r = op(self, &mut din, &mut dout);
        self.dev_in = Some(din);
        self.dev_out = Some(dout);
        r
    }

    /// Compress host values on the GPU (copies in, [`GpuCodec::compress_device`], copies out).
    pub fn compress<T: GpuElement>(
        &mut self,
        data: &[T],
        bound: ErrorBound,
        codec: CodecKind,
    ) -> Result<Vec<u8>> {
        let s = self.stream.clone();
        let in_bytes = std::mem::size_of_val(data);
        let cap = crate::format::compress_bound(data.len(), T::DTYPE);
        self.with_staging(in_bytes, cap, |this, din, dout| {
            let ip = raw_ptr_mut(din, &s);
            // SAFETY: din holds at least in_bytes bytes.
            unsafe { cu::memcpy_htod_async(ip, data, s.cu_stream()) }.map_err(gpu_err("htod"))?;
            // SAFETY: the first data.len() elements were just written.
            let view = unsafe { din.transmute::<T>(data.len()) }.expect("staging size");
            let mut ov = dout.slice_mut(0..cap);
            let len = this.compress_device(&view, bound, codec, &mut ov)?;
            let mut v = vec![0u8; len];
            let op = raw_ptr(dout, &s);
            // SAFETY: len <= dout.len().
            unsafe { cu::memcpy_dtoh_async(&mut v[..], op, s.cu_stream()) }
                .map_err(gpu_err("dtoh"))?;
            s.synchronize().map_err(gpu_err("sync"))?;
            Ok(v)
        })
    }

    /// [`GpuCodec::compress`] with [`crate::CompressOptions`]. The kernels do not implement fill
    /// values: a fill value is an [`Error::InvalidArgument`] (use the CPU's
    /// [`crate::compress_with_options`]) rather than being ignored, and so is a given range
    /// (use [`GpuCodec::compress_device_with_range`]).
    pub fn compress_with_options<T: GpuElement>(
        &mut self,
        data: &[T],
        bound: ErrorBound,
        codec: CodecKind,
        options: &crate::CompressOptions,
    ) -> Result<Vec<u8>> {
        if let Some(f) = options.fill_value {
            return Err(Error::invalid(format!(
                "fill value {f:e}: fill values are not supported by the GPU codecs (compress on \
                 the CPU instead)"
            )));
        }
        if options.range.is_some() {
            return Err(Error::invalid(
                "a given value range is not supported by GpuCodec::compress_with_options (use \
                 GpuCodec::compress_device_with_range)",
            ));
        }
        self.compress(data, bound, codec)
    }

    /// Decompress a host stream on the GPU into `out` (length = the stream's count).
    pub fn decompress_into<T: GpuElement>(&mut self, stream: &[u8], out: &mut [T]) -> Result<()> {
        let s = self.stream.clone();
        let out_bytes = std::mem::size_of_val(out);
        self.with_staging(stream.len(), out_bytes, |this, din, dout| {
            let ip = raw_ptr_mut(din, &s);
            // SAFETY: din holds at least stream.len() bytes.
            unsafe { cu::memcpy_htod_async(ip, stream, s.cu_stream()) }.map_err(gpu_err("htod"))?;
            let view = din.slice(0..stream.len());
            // SAFETY: T is plain old data; out.len() elements fit.
            let mut ov = unsafe { dout.transmute_mut::<T>(out.len()) }.expect("staging size");
            this.decompress_device(&view, &mut ov)?;
            let op = raw_ptr(dout, &s);
            // SAFETY: out_bytes <= dout.len().
            unsafe { cu::memcpy_dtoh_async(out, op, s.cu_stream()) }.map_err(gpu_err("dtoh"))?;
            s.synchronize().map_err(gpu_err("sync"))?;
            Ok(())
        })
    }

    /// [`GpuCodec::compress`] for any [`Element`] (dispatches on the dtype; for generic callers).
    pub fn compress_any<T: Element>(
        &mut self,
        data: &[T],
        bound: ErrorBound,
        codec: CodecKind,
    ) -> Result<Vec<u8>> {
        match T::DTYPE {
            Dtype::F32 => self.compress(same_elements::<T, f32>(data), bound, codec),
            Dtype::F64 => self.compress(same_elements::<T, f64>(data), bound, codec),
        }
    }

    /// [`GpuCodec::decompress_into`] for any [`Element`] (dispatches on the dtype).
    pub fn decompress_into_any<T: Element>(&mut self, stream: &[u8], out: &mut [T]) -> Result<()> {
        match T::DTYPE {
            Dtype::F32 => self.decompress_into(stream, same_elements_mut::<T, f32>(out)),
            Dtype::F64 => self.decompress_into(stream, same_elements_mut::<T, f64>(out)),
        }
    }

    /// Decompress a host stream on the GPU into a new vector.
    pub fn decompress<T: GpuElement>(&mut self, stream: &[u8]) -> Result<Vec<T>> {
        if stream.len() < HEADER_LEN {
            return Err(Error::corrupt("stream shorter than its header"));
        }
        let h = parse_header_fields(&stream[..stream.len().min(HEADER_LEN_V3)], stream.len())?;
        crate::codec::check_dtype::<T>(h.dtype)?;
        let limit = crate::codec::DecodeLimits::default().max_count;
        if h.count > limit {
            return Err(Error::corrupt(format!(
                "stream claims {} values, limit is {limit}",
                h.count
            )));
        }
        let mut out = vec![T::default(); h.count as usize];
        self.decompress_into(stream, &mut out)?;
        Ok(out)
    }
}

/// The name of a codec's kernel `op` (`compress`, `decompress`, `decompress_add`,
/// `decompress_hdr`) for dtype `T` and bound mode `mode`: `zc_{op}_{dtype}_{codec}_{abs|rel}`
/// (kernels/blocked.cu; kernels/pfpl.cu for pfpl).
/// The header of a stream the GPU writes (FORMAT.md "Header") of `n` values compressed with
/// `codec` and `params`: every field from the arguments, no fill value, data checksum 0.
fn stream_header<T: GpuElement>(
    codec: CodecKind,
    n: usize,
    params: &QuantParams,
    flags: u8,
    payload_len: u64,
    n_chunks: u32,
    payload_checksum: u32,
) -> Header {
    Header {
        flags,
        payload_len,
        n_chunks,
        payload_checksum,
        data_checksum: 0,
        fill_value: None,
        ..crate::codec::params_header::<T>(codec, n, params)
    }
}

/// A header as the little-endian u32 words a compression kernel takes (kernels/blocked.cu
/// `ZHeader`): its last block fills in the payload length and checksums and writes it.
fn header_words(h: &Header) -> [u32; HEADER_LEN / 4] {
    let mut words = [0u32; HEADER_LEN / 4];
    for (w, b) in words.iter_mut().zip(h.to_bytes().chunks_exact(4)) {
        *w = u32::from_le_bytes(b.try_into().expect("4 bytes"));
    }
    words
}

fn kernel_name<T: GpuElement>(op: &str, codec: CodecKind, mode: BoundMode) -> Result<String> {
    let cname = match codec {
        CodecKind::Aatrox => "aatrox",
        CodecKind::CuszpPlain => "plain",
        CodecKind::CuszpOutlier => "outlier",
        CodecKind::Pfpl => "pfpl",
        _ => return Err(no_gpu_kernels(codec)),
    };
    let m = if mode == BoundMode::Rel { "rel" } else { "abs" };
    Ok(format!("zc_{op}_{}_{cname}_{m}", T::KERNEL_TAG))
}

// Decompression error bits (kernels/blocked.cu `ZC_E_*`; pfpl's `PF_E_*` are the same); the
// host sets E_CHECKSUM and E_TABLE itself too.
const E_SIZE: u64 = 1;
const E_RANGE: u64 = 2;
const E_CHECKSUM: u64 = 4;
const E_META: u64 = 8;
const E_TOTAL: u64 = 16;
const E_TABLE: u64 = 32;

/// The error for a codec without GPU kernels (of [`GpuCodec`]'s own, for the `kernel_name`
/// families; or outside [`CodecKind::WITH_GPU`]).
fn no_gpu_kernels(codec: impl std::fmt::Display) -> Error {
    Error::Unavailable(format!(
        "{codec} is not supported on the GPU yet (use the CPU codec, --device cpu)"
    ))
}
