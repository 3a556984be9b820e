//! Small utility kernels shared by the communication layers (`comm::device`, `comm::nccl`): the
//! value range of a device buffer and an IEEE division by a scalar, as CUDA source plus the
//! NVRTC compile-and-load step (`--fmad=false`, IEEE division, the device's own architecture).
//!
//! [`util_cuda!`](crate::gpu::util_cuda) expands to the shared source as a string literal, so a
//! module can append its own kernels with `concat!`. Entry points: `zu_range_f32/f64(x, n, out)`
//! (`out[0]` = max order-preserving key, `out[1]` = max of the complemented key, over finite
//! values; both 0 when there is none) and `zu_scale_f32/f64(x, n, d)` (`x[i] = x[i] / d`).
//! Device helpers for appended kernels: `zu_key`, `zu_finite`, `zu_wmax`.

use std::sync::Arc;

use cudarc::driver::{
    CudaFunction, CudaModule, CudaSlice, CudaStream, CudaView, CudaViewMut, LaunchConfig,
    PushKernelArg,
};

use crate::error::{Error, Result};
use crate::gpu::GpuElement;

/// The shared CUDA source (see the [module docs](self)) as a string literal.
macro_rules! util_cuda {
    () => {
        r#"
typedef unsigned long long u64;
typedef unsigned int u32;
__device__ __forceinline__ u64 zu_key(float x) {
    u32 b = __float_as_uint(x);
    return (u64)((b & 0x80000000u) ? ~b : (b | 0x80000000u));
}
__device__ __forceinline__ u64 zu_key(double x) {
    u64 b = (u64)__double_as_longlong(x);
    return (b >> 63) ? ~b : (b | 0x8000000000000000ull);
}
__device__ __forceinline__ bool zu_finite(float x) { return ((__float_as_uint(x) >> 23) & 0xffu) != 0xffu; }
__device__ __forceinline__ bool zu_finite(double x) {
    return ((((u64)__double_as_longlong(x)) >> 52) & 0x7ffull) != 0x7ffull;
}
__device__ __forceinline__ u64 zu_wmax(u64 v) {
    for (int s = 16; s >= 1; s >>= 1) { u64 o = __shfl_xor_sync(0xffffffffu, v, s); v = o > v ? o : v; }
    return v;
}
// out[0] = max key, out[1] = max ~key (min), over finite values.
template <typename T> __device__ void zu_range(const T* x, u64 n, u64* out) {
    u64 hi = 0, lo = 0;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        T v = x[i];
        if (zu_finite(v)) { u64 k = zu_key(v); hi = k > hi ? k : hi; lo = ~k > lo ? ~k : lo; }
    }
    hi = zu_wmax(hi); lo = zu_wmax(lo);
    if ((threadIdx.x & 31) == 0) { if (hi) atomicMax(out, hi); if (lo) atomicMax(out + 1, lo); }
}
__device__ __forceinline__ float zu_div(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ double zu_div(double a, double b) { return __ddiv_rn(a, b); }
template <typename T> __device__ void zu_scale(T* x, u64 n, T d) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) x[i] = zu_div(x[i], d);
}
extern "C" __global__ void zu_range_f32(const float* x, u64 n, u64* out) { zu_range<float>(x, n, out); }
extern "C" __global__ void zu_range_f64(const double* x, u64 n, u64* out) { zu_range<double>(x, n, out); }
extern "C" __global__ void zu_scale_f32(float* x, u64 n, float d) { zu_scale<float>(x, n, d); }
extern "C" __global__ void zu_scale_f64(double* x, u64 n, double d) { zu_scale<double>(x, n, d); }
"#
    };
}
pub(crate) use util_cuda;

/// `sm_XY` of a compute capability (a close architecture for unknown ones).
pub(crate) fn arch_of(major: i32, minor: i32) -> &'static str {
    match (major, minor) {
        (9, 0) => "sm_90",
        (8, 0) => "sm_80",
        (8, 6) => "sm_86",
        (8, 9) => "sm_89",
        (10, 0) => "sm_100",
        (12, 0) => "sm_120",
        (7, 0) => "sm_70",
        (7, 5) => "sm_75",
        _ => "sm_80",
    }
}

/// Compile `source` with NVRTC for `stream`'s device and load it; returns the module and a grid
/// size for grid-stride kernels (8 blocks per SM). `what` names the kernels in errors.
pub(crate) fn compile_and_load(
    stream: &Arc<CudaStream>,
    source: &str,
    what: &str,
) -> Result<(Arc<CudaModule>, u32)> {
    let gpu = |e: cudarc::driver::DriverError| Error::Gpu(format!("{what}: {e:?}"));
    // SAFETY: only tries to dlopen the library.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(Error::Unavailable(format!(
            "libnvrtc not found (needed for {what})"
        )));
    }
    let ctx = stream.context();
    ctx.bind_to_thread().map_err(gpu)?;
    let (maj, min) = ctx.compute_capability().map_err(gpu)?;
    let opts = cudarc::nvrtc::CompileOptions {
        fmad: Some(false),
        prec_div: Some(true),
        arch: Some(arch_of(maj, min)),
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(source, opts)
        .map_err(|e| Error::Gpu(format!("NVRTC ({what}): {e:?}")))?;
    let module = ctx.load_module(ptx).map_err(gpu)?;
    let sms = ctx
        .attribute(
            cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        )
        .map_err(gpu)?;
    Ok((module, (sms.max(1) as u32) * 8))
}

/// The loaded `zu_range_*` / `zu_scale_*` kernels of a module built from [`util_cuda!`].
pub(crate) struct RangeScale {
    range: [CudaFunction; 2],
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
        let (module, blocks) = compile_and_load(stream, util_cuda!(), "the utility kernels")?;
        let k = Arc::new(Self::from_module(&module, blocks)?);
        cache.insert(key, k.clone());
        Ok(k)
    }

    /// The kernels of `module` (which contains [`util_cuda!`]); `blocks` caps the grid.
    pub(crate) fn from_module(module: &Arc<CudaModule>, blocks: u32) -> Result<Self> {
        let f = |n: &str| module.load_function(n).map_err(gpu_err("load function"));
        Ok(RangeScale {
            range: [f("zu_range_f32")?, f("zu_range_f64")?],
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

    /// Smallest and largest finite values of `x` (`None` when there is none). Synchronizes
    /// `stream`.
    pub(crate) fn range<T: GpuElement>(
        &self,
        stream: &Arc<CudaStream>,
        x: &CudaView<'_, T>,
    ) -> Result<Option<(f64, f64)>> {
        let n = x.len();
        if n == 0 {
            return Ok(None);
        }
        stream.context().bind_to_thread().map_err(gpu_err("bind"))?;
        let mut guard = self.out.lock().unwrap_or_else(|p| p.into_inner());
        let out = match guard.as_mut() {
            Some(o) => {
                stream.memset_zeros(o).map_err(gpu_err("memset"))?;
                o
            }
            None => guard.insert(stream.alloc_zeros::<u64>(2).map_err(gpu_err("alloc"))?),
        };
        let n64 = n as u64;
        let mut b = stream.launch_builder(&self.range[idx::<T>()]);
        b.arg(x).arg(&n64).arg(&mut *out);
        // SAFETY: the kernel reads n values of x and writes two u64 of out.
        unsafe { b.launch(self.cfg(n)) }.map_err(gpu_err("range kernel"))?;
        let mut h = [0u64; 2];
        stream
            .memcpy_dtoh(&*out, &mut h[..])
            .map_err(gpu_err("range d2h"))?;
        stream.synchronize().map_err(gpu_err("sync"))?;
        if h[0] == 0 {
            return Ok(None);
        }
        let dec = crate::gpu::from_key::<T>;
        Ok(Some((dec(!h[1]), dec(h[0]))))
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

/// PTX of `source` compiled like [`compile_and_load`] for sm_90, for the kernels' compile tests;
/// `None` (after a loud "skipped" line) when libnvrtc is missing.
#[cfg(test)]
pub(crate) fn ptx_for_test(source: &str) -> Option<String> {
    // SAFETY: only tries to dlopen the library.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        eprintln!("skipped: libnvrtc not found");
        return None;
    }
    let opts = cudarc::nvrtc::CompileOptions {
        fmad: Some(false),
        prec_div: Some(true),
        arch: Some("sm_90"),
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(source, opts).expect("NVRTC");
    Some(ptx.to_src())
}

#[cfg(test)]
mod tests {
    /// The shared source compiles with NVRTC (CI installs libnvrtc; skipped loudly without it).
    #[test]
    fn util_source_compiles() {
        let Some(text) = super::ptx_for_test(util_cuda!()) else {
            return;
        };
        for k in [
            "zu_range_f32",
            "zu_range_f64",
            "zu_scale_f32",
            "zu_scale_f64",
        ] {
            assert!(text.contains(k), "{k} missing from the PTX");
        }
    }
}
