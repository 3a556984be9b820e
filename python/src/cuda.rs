//! The GPU codecs behind CUDA tensors: the same streams as the CPU functions (the CUDA kernels
//! write the CPU twin's bytes), computed in device memory, zero copy.
//!
//! The Python layer passes device addresses of tensors it keeps alive, after synchronizing
//! PyTorch's current stream on that device (so the inputs are complete); each call here ends
//! with the codec's own stream synchronized (so the outputs are complete for any stream). One
//! [`GpuCodec`] per device ordinal is created on first use and kept; the CUDA driver and NVRTC
//! are loaded at run time, so without them these functions raise a clear error.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaSlice, CudaStream};

use pyo3::prelude::*;
use pyo3::types::PyDict;
use zcomm::gpu::{GpuCodec, GpuElement};
use zcomm::{CodecKind, ErrorBound};

use crate::{dt, err, header_dict, parse_bound, parse_codec, Dt};

/// The per-device codecs (compiled kernels, scratch), created on first use.
fn codecs() -> &'static Mutex<HashMap<usize, GpuCodec>> {
    static CODECS: OnceLock<Mutex<HashMap<usize, GpuCodec>>> = OnceLock::new();
    CODECS.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Runs `f` with the codec of device `ordinal` (created on first use).
fn with_codec<R>(
    ordinal: usize,
    f: impl FnOnce(&mut GpuCodec) -> zcomm::Result<R>,
) -> zcomm::Result<R> {
    if !zcomm::gpu::device_available() {
        return Err(zcomm::Error::Unavailable(
            "no CUDA device (or no CUDA driver) for a CUDA tensor".into(),
        ));
    }
    let mut map = codecs()
        .lock()
        .map_err(|_| zcomm::Error::Gpu("a previous GPU call panicked".into()))?;
    let gpu = match map.entry(ordinal) {
        std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
        std::collections::hash_map::Entry::Vacant(v) => v.insert(GpuCodec::new(ordinal)?),
    };
    f(gpu)
}

/// Borrow `count` values at device address `ptr` for the duration of `f`, without taking
/// ownership (the tensor's allocator keeps it).
///
/// Safety: `ptr` is a live, element-aligned device allocation of at least `count` values in the
/// codec's context (PyTorch's primary context of that device), not freed during the call.
unsafe fn borrowed<T: cudarc::driver::DeviceRepr, R>(
    stream: &Arc<CudaStream>,
    ptr: usize,
    count: usize,
    f: impl FnOnce(&mut CudaSlice<T>) -> zcomm::Result<R>,
) -> zcomm::Result<R> {
    if ptr == 0 || ptr % std::mem::align_of::<T>() != 0 {
        return Err(zcomm::Error::invalid(
            "device buffer address is null or misaligned",
        ));
    }
    let mut s = stream.upgrade_device_ptr::<T>(ptr as u64, count);
    let r = f(&mut s);
    // the memory belongs to the tensor: never free it here
    let _ = s.leak();
    r
}

/// Whether a CUDA device and the driver are usable by the GPU codecs.
#[pyfunction]
pub fn cuda_available() -> bool {
    zcomm::gpu::device_available()
}

/// Compress `count` values at device address `ptr` on device `ordinal` into the device buffer
/// `out` (`out_cap` bytes, at least `compress_bound`); returns the stream's length. `range` as
/// for the CPU `compress`.
#[pyfunction]
#[pyo3(signature = (ptr, count, dtype, bound, codec, range, ordinal, out, out_cap))]
#[allow(clippy::too_many_arguments)]
pub fn cuda_compress(
    py: Python<'_>,
    ptr: usize,
    count: usize,
    dtype: &str,
    bound: &str,
    codec: &str,
    range: Option<(f64, f64)>,
    ordinal: usize,
    out: usize,
    out_cap: usize,
) -> PyResult<usize> {
    let d = dt(dtype)?;
    let b = parse_bound(bound)?;
    let c = parse_codec(codec)?;
    fn run<T: GpuElement>(
        gpu: &mut GpuCodec,
        (ptr, count, out, out_cap): (usize, usize, usize, usize),
        b: ErrorBound,
        c: CodecKind,
        range: Option<(f64, f64)>,
    ) -> zcomm::Result<usize> {
        let st = gpu.stream().clone();
        // SAFETY: the Python caller holds both tensors on this device (see `borrowed`)
        unsafe {
            borrowed::<T, _>(&st, ptr, count, |x| {
                borrowed::<u8, _>(&st, out, out_cap, |o| {
                    let (xv, mut ov) = (x.as_view(), o.as_view_mut());
                    match range {
                        Some(r) => gpu.compress_device_with_range(&xv, b, c, r, &mut ov),
                        None => gpu.compress_device(&xv, b, c, &mut ov),
                    }
                })
            })
        }
    }
    py.allow_threads(|| {
        with_codec(ordinal, |gpu| match d {
            Dt::F32 => run::<f32>(gpu, (ptr, count, out, out_cap), b, c, range),
            Dt::F64 => run::<f64>(gpu, (ptr, count, out, out_cap), b, c, range),
        })
    })
    .map_err(err)
}

/// Decode the device stream at `ptr` (`len` bytes) into `count` values of `dtype` at device
/// address `out`; with `add`, `out += decoded` (one rounding per value, fused).
#[pyfunction]
#[pyo3(signature = (ptr, len, out, count, dtype, ordinal, add=false))]
#[allow(clippy::too_many_arguments)]
pub fn cuda_decompress_into(
    py: Python<'_>,
    ptr: usize,
    len: usize,
    out: usize,
    count: usize,
    dtype: &str,
    ordinal: usize,
    add: bool,
) -> PyResult<()> {
    let d = dt(dtype)?;
    fn run<T: GpuElement>(
        gpu: &mut GpuCodec,
        (ptr, len, out, count): (usize, usize, usize, usize),
        add: bool,
    ) -> zcomm::Result<()> {
        let st = gpu.stream().clone();
        // SAFETY: as in `cuda_compress`
        unsafe {
            borrowed::<u8, _>(&st, ptr, len, |s| {
                borrowed::<T, _>(&st, out, count, |o| {
                    let (sv, mut ov) = (s.as_view(), o.as_view_mut());
                    if add {
                        gpu.decompress_add_device(&sv, &mut ov)
                    } else {
                        gpu.decompress_device(&sv, &mut ov)
                    }
                })
            })
        }
    }
    py.allow_threads(|| {
        with_codec(ordinal, |gpu| match d {
            Dt::F32 => run::<f32>(gpu, (ptr, len, out, count), add),
            Dt::F64 => run::<f64>(gpu, (ptr, len, out, count), add),
        })
    })
    .map_err(err)
}

/// Header fields of a device stream (read on the device; the same dict as `inspect`).
#[pyfunction]
pub fn cuda_inspect<'py>(
    py: Python<'py>,
    ptr: usize,
    len: usize,
    ordinal: usize,
) -> PyResult<Bound<'py, PyDict>> {
    let h = py
        .allow_threads(|| {
            with_codec(ordinal, |gpu| {
                let st = gpu.stream().clone();
                // SAFETY: as in `cuda_compress`
                unsafe { borrowed::<u8, _>(&st, ptr, len, |s| gpu.inspect_device(&s.as_view())) }
            })
        })
        .map_err(err)?;
    header_dict(py, &h, len)
}

/// The finite value range of `count` values at device address `ptr`, or `None`.
#[pyfunction]
pub fn cuda_finite_range(
    py: Python<'_>,
    ptr: usize,
    count: usize,
    dtype: &str,
    ordinal: usize,
) -> PyResult<Option<(f64, f64)>> {
    if count == 0 {
        return Ok(None);
    }
    let d = dt(dtype)?;
    fn run<T: GpuElement>(
        gpu: &mut GpuCodec,
        ptr: usize,
        count: usize,
    ) -> zcomm::Result<Option<(f64, f64)>> {
        let st = gpu.stream().clone();
        // SAFETY: as in `cuda_compress`
        unsafe { borrowed::<T, _>(&st, ptr, count, |x| gpu.value_range_device(&x.as_view())) }
    }
    py.allow_threads(|| {
        with_codec(ordinal, |gpu| match d {
            Dt::F32 => run::<f32>(gpu, ptr, count),
            Dt::F64 => run::<f64>(gpu, ptr, count),
        })
    })
    .map_err(err)
}
