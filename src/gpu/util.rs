//! Host side of the small utility kernels shared by the communication layers (`comm::device`,
//! `comm::nccl`): the value range of a device buffer (whole, sampled, or folded into a
//! [`crate::gpu::DeviceRange`]) and an IEEE division by a scalar (`kernels/util.cu`, compiled
//! through [`crate::gpu::compile`]).

use std::sync::Arc;

use cudarc::driver::{
    CudaFunction, CudaModule, CudaSlice, CudaStream, CudaView, CudaViewMut, LaunchConfig,
    PushKernelArg,
};

use crate::error::{Error, Result};
use crate::gpu::compile::{self, Module};
use crate::gpu::GpuElement;

/// The default stream of device `ordinal`: [`Error::Unavailable`] without a CUDA driver or
/// device.
pub(crate) fn default_stream(ordinal: usize) -> Result<Arc<CudaStream>> {
    if !super::device_available() {
        return Err(Error::Unavailable("no CUDA device".into()));
    }
    let ctx = cudarc::driver::CudaContext::new(ordinal)
        .map_err(|e| Error::Gpu(format!("context: {e:?}")))?;
    Ok(ctx.default_stream())
}

/// Compile (or take from the cache) and load `module` for `stream`'s device; returns the module
/// and a grid size for grid-stride kernels (8 blocks per SM).
pub(crate) fn compile_and_load(
    stream: &Arc<CudaStream>,
    module: Module,
) -> Result<(Arc<CudaModule>, u32)> {
    let gpu = |e: cudarc::driver::DriverError| Error::Gpu(format!("{}: {e:?}", module.name()));
    if !compile::nvrtc_available() {
        return Err(Error::Unavailable(format!(
            "libnvrtc not found (needed for the {} kernels)",
            module.name()
        )));
    }
    let ctx = stream.context();
    ctx.bind_to_thread().map_err(gpu)?;
    let m = compile::load(ctx, module)?;
    let sms = ctx
        .attribute(
            cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        )
        .map_err(gpu)?;
    Ok((m, (sms.max(1) as u32) * 8))
}

/// The blocks of `block` threads (with `smem` bytes of dynamic shared memory) of kernel `f`
/// that `sms` multiprocessors hold at once (at least one per SM): the grid of a grid-stride
/// kernel that runs as one wave. A larger grid splits the same work into more blocks than fit,
/// and its last partial wave runs with the SMs partly idle.
pub(crate) fn resident_blocks(
    f: &cudarc::driver::CudaFunction,
    block: u32,
    smem: usize,
    sms: u32,
) -> Result<u32> {
    let per_sm = f
        .occupancy_max_active_blocks_per_multiprocessor(block, smem, None)
        .map_err(|e| Error::Gpu(format!("occupancy: {e:?}")))?
        .max(1);
    Ok(per_sm * sms.max(1))
}

/// The loaded `zu_range_*` / `zu_range_sampled_*` / `zu_scale_*` kernels of a module that
/// contains `kernels/util.cu`.
pub(crate) struct RangeScale {
    range: [CudaFunction; 2],
    sampled: [CudaFunction; 2],
    scale: [CudaFunction; 2],
    blocks: u32,
    /// The range kernel's two output words, allocated at the first call and reused (cleared
    /// on the stream before each launch; the lock keeps concurrent callers apart).
    out: std::sync::Mutex<Option<CudaSlice<u64>>>,
}

fn idx<T>() -> usize {
    usize::from(std::mem::size_of::<T>() == 8)
}

fn gpu_err(what: &'static str) -> impl Fn(cudarc::driver::DriverError) -> Error {
    move |e| Error::Gpu(format!("{what}: {e:?}"))
}

impl RangeScale {
    /// The utility kernels for `stream`'s context: compiled at the first call for that context,
    /// then shared (a process-wide cache, so per-call users pay no compile).
    pub(crate) fn for_stream(stream: &Arc<CudaStream>) -> Result<Arc<RangeScale>> {
        type Cache = std::sync::Mutex<std::collections::HashMap<usize, Arc<RangeScale>>>;
        static CACHE: std::sync::OnceLock<Cache> = std::sync::OnceLock::new();
        let key = stream.context().cu_ctx() as usize;
        let mut cache = CACHE
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(k) = cache.get(&key) {
            return Ok(k.clone());
        }
        let (module, blocks) = compile_and_load(stream, Module::Util)?;
        let k = Arc::new(Self::from_module(&module, blocks)?);
        cache.insert(key, k.clone());
        Ok(k)
    }

    /// The kernels of `module` (which contains `kernels/util.cu`); `blocks` caps the grid.
    pub(crate) fn from_module(module: &Arc<CudaModule>, blocks: u32) -> Result<Self> {
        let f = |n: &str| module.load_function(n).map_err(gpu_err("load function"));
        Ok(RangeScale {
            range: [f("zu_range_f32")?, f("zu_range_f64")?],
            sampled: [f("zu_range_sampled_f32")?, f("zu_range_sampled_f64")?],
            scale: [f("zu_scale_f32")?, f("zu_scale_f64")?],
            blocks,
            out: std::sync::Mutex::new(None),
        })
    }

    /// A grid-stride launch over `n` values: 256 threads per block, at most `blocks` blocks.
    pub(crate) fn cfg(&self, n: usize) -> LaunchConfig {
        let b = (n.div_ceil(256) as u64).clamp(1, self.blocks as u64) as u32;
        LaunchConfig {
            grid_dim: (b, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// Smallest and largest finite values of `x` (`None` when there is none; the canonical
    /// zero of [`decode_keys`]). Synchronizes `stream`.
    pub(crate) fn range<T: GpuElement>(
        &self,
        stream: &Arc<CudaStream>,
        x: &CudaView<'_, T>,
    ) -> Result<Option<(f64, f64)>> {
        let n = x.len();
        if n == 0 {
            return Ok(None);
        }
        let n64 = n as u64;
        let h = self.keys_of(stream, |out| {
            let mut b = stream.launch_builder(&self.range[idx::<T>()]);
            b.arg(x).arg(&n64).arg(out);
            // SAFETY: the kernel reads n values of x and writes two u64 of out.
            unsafe { b.launch(self.cfg(n)) }
                .map(drop)
                .map_err(gpu_err("range kernel"))
        })?;
        Ok(decode_keys::<T>(h))
    }

    /// The two key words a range kernel `launch`ed on them leaves (zeroed first, read back
    /// after; synchronizes `stream`). The words are this context's one pair, held for the call.
    fn keys_of(
        &self,
        stream: &Arc<CudaStream>,
        launch: impl FnOnce(&mut CudaSlice<u64>) -> Result<()>,
    ) -> Result<[u64; 2]> {
        stream.context().bind_to_thread().map_err(gpu_err("bind"))?;
        let mut guard = self.out.lock().unwrap_or_else(|p| p.into_inner());
        let out = match guard.as_mut() {
            Some(o) => {
                stream.memset_zeros(o).map_err(gpu_err("memset"))?;
                o
            }
            None => guard.insert(stream.alloc_zeros::<u64>(2).map_err(gpu_err("alloc"))?),
        };
        launch(out)?;
        let mut h = [0u64; 2];
        stream
            .memcpy_dtoh(&*out, &mut h[..])
            .map_err(gpu_err("range d2h"))?;
        stream.synchronize().map_err(gpu_err("sync"))?;
        Ok(h)
    }

    /// Fold the finite range of `x` into the two key words at device address `words` (a
    /// [`crate::gpu::DeviceRange`]: the kernel raises them with atomicMax, see
    /// `kernels/util.cu`); one kernel on `stream`, no synchronization.
    pub(crate) fn fold<T: GpuElement>(
        &self,
        stream: &Arc<CudaStream>,
        x: &CudaView<'_, T>,
        words: u64,
    ) -> Result<()> {
        let n = x.len();
        if n == 0 {
            return Ok(());
        }
        stream.context().bind_to_thread().map_err(gpu_err("bind"))?;
        let n64 = n as u64;
        let mut b = stream.launch_builder(&self.range[idx::<T>()]);
        b.arg(x).arg(&n64).arg(&words);
        // SAFETY: the kernel reads n values of x and raises the two u64 at `words`, which the
        // caller's DeviceRange keeps allocated.
        unsafe { b.launch(self.cfg(n)) }
            .map(|_| ())
            .map_err(gpu_err("range kernel"))
    }

    /// [`crate::quant::sampled_range`] of `x`, read on the device: the finite range of every
    /// value when there are at most [`crate::quant::RANGE_SAMPLES`], else of the values at
    /// `k * (n / RANGE_SAMPLES)` for `k < RANGE_SAMPLES` and the last one (one kernel, the
    /// canonical zero of [`decode_keys`]). Synchronizes `stream`.
    pub(crate) fn sampled<T: GpuElement>(
        &self,
        stream: &Arc<CudaStream>,
        x: &CudaView<'_, T>,
    ) -> Result<Option<(f64, f64)>> {
        let n = x.len();
        if n == 0 {
            return Ok(None);
        }
        let s_max = crate::quant::RANGE_SAMPLES;
        // n <= RANGE_SAMPLES: positions 0..n-1 (stride 1) and n - 1, every value
        let (stride, m) = if n <= s_max {
            (1u64, n as u64 - 1)
        } else {
            ((n / s_max) as u64, s_max as u64)
        };
        let n64 = n as u64;
        let h = self.keys_of(stream, |out| {
            let mut b = stream.launch_builder(&self.sampled[idx::<T>()]);
            b.arg(x).arg(&n64).arg(&stride).arg(&m).arg(out);
            // SAFETY: the kernel reads x at positions k * stride (k < m, all < n) and n - 1,
            // and writes two u64 of out.
            unsafe { b.launch(self.cfg(m as usize + 1)) }
                .map(drop)
                .map_err(gpu_err("sampled range kernel"))
        })?;
        Ok(decode_keys::<T>(h))
    }

    /// `x_i = x_i / d` (IEEE division, rounded to nearest, as the host's `v / d`); does not
    /// synchronize.
    pub(crate) fn scale<T: GpuElement>(
        &self,
        stream: &Arc<CudaStream>,
        x: &mut CudaViewMut<'_, T>,
        d: T,
    ) -> Result<()> {
        let n = x.len();
        if n == 0 {
            return Ok(());
        }
        stream.context().bind_to_thread().map_err(gpu_err("bind"))?;
        let n64 = n as u64;
        let mut l = stream.launch_builder(&self.scale[idx::<T>()]);
        l.arg(x).arg(&n64).arg(&d);
        // SAFETY: reads and writes n values of x.
        unsafe { l.launch(self.cfg(n)) }
            .map(|_| ())
            .map_err(gpu_err("scale kernel"))
    }
}

/// The finite range `(min, max)` that two range key words hold (`zu_range`'s convention:
/// `h[0]` = max key, `h[1]` = max complemented key, 0 = no finite value), as
/// [`RangeScale::range`] decodes them but with the canonical zero of
/// [`crate::quant::finite_range`] (`-0.0` as `+0.0`, as `GpuCodec::value_range_device` gives it).
pub(crate) fn decode_keys<T>(h: [u64; 2]) -> Option<(f64, f64)> {
    if h[0] == 0 || h[1] == 0 {
        return None;
    }
    let dec = crate::gpu::from_key::<T>;
    Some((dec(!h[1]) + 0.0, dec(h[0]) + 0.0))
}
