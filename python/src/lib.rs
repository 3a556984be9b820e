//! `zcomm._native`: the codec work behind the `zcomm` Python package.
//!
//! The Python layer (`zcomm/__init__.py`, `zcomm/torch.py`) checks dtypes, devices and
//! contiguity and passes buffers here as `(address, element count)` pairs of memory that it keeps
//! alive for the duration of the call (a torch tensor's `data_ptr()`: zero copy). Everything that
//! touches values (compress, decode, decode-and-accumulate, range) runs here with the GIL released.
//!
//! Only public zcomm API is used: `compress_with_options`, `compress_particles_nd`, `decompress_into`,
//! `inspect`, `quant::finite_range`, `model::predict`, and for CUDA tensors the GPU codec
//! (`gpu::GpuCodec`, module `cuda`).

use pyo3::create_exception;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyDict};
use zcomm::{CodecKind, ErrorBound};

mod cuda;

create_exception!(
    _native,
    ZcommError,
    PyValueError,
    "An error from zcomm (invalid argument, corrupt stream, dtype or length mismatch)."
);

fn err(e: zcomm::Error) -> PyErr {
    ZcommError::new_err(e.to_string())
}

fn bad(msg: impl Into<String>) -> PyErr {
    ZcommError::new_err(msg.into())
}

/// Element type of a raw buffer.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Dt {
    F32,
    F64,
}

fn dt(s: &str) -> PyResult<Dt> {
    match s {
        "f32" => Ok(Dt::F32),
        "f64" => Ok(Dt::F64),
        _ => Err(bad(format!(
            "unsupported buffer dtype `{s}` (expected f32 or f64)"
        ))),
    }
}

/// A read-only slice over caller-owned memory.
///
/// Safety: the Python caller guarantees that `ptr` points to `count` initialized, aligned values
/// of `T` that stay alive and are not written during the call.
unsafe fn slice<'a, T>(ptr: usize, count: usize) -> PyResult<&'a [T]> {
    if count == 0 {
        return Ok(&[]);
    }
    if ptr == 0 || ptr % std::mem::align_of::<T>() != 0 {
        return Err(bad("buffer address is null or misaligned"));
    }
    Ok(std::slice::from_raw_parts(ptr as *const T, count))
}

/// A mutable slice over caller-owned memory (same contract as [`slice`], exclusive access).
unsafe fn slice_mut<'a, T>(ptr: usize, count: usize) -> PyResult<&'a mut [T]> {
    if count == 0 {
        return Ok(&mut []);
    }
    if ptr == 0 || ptr % std::mem::align_of::<T>() != 0 {
        return Err(bad("buffer address is null or misaligned"));
    }
    Ok(std::slice::from_raw_parts_mut(ptr as *mut T, count))
}

fn parse_bound(s: &str) -> PyResult<ErrorBound> {
    s.parse::<ErrorBound>().map_err(err)
}

fn parse_codec(s: &str) -> PyResult<CodecKind> {
    if s == "auto" {
        return Ok(CodecKind::default());
    }
    s.parse::<CodecKind>().map_err(err)
}

/// Validate an error-bound spec (`abs:E`, `noa:E`, `rel:E`) and return `(mode, value)`.
#[pyfunction]
fn bound_spec(spec: &str) -> PyResult<(String, f64)> {
    let b = parse_bound(spec)?;
    let mode = match b {
        ErrorBound::Abs(_) => "abs",
        ErrorBound::Noa(_) => "noa",
        ErrorBound::Rel(_) => "rel",
    };
    Ok((mode.to_string(), b.value()))
}

/// Validate a codec name (`auto` = the default codec) and return its canonical name.
#[pyfunction]
fn codec_name(name: &str) -> PyResult<&'static str> {
    Ok(parse_codec(name)?.name())
}

/// Names of every codec.
#[pyfunction]
fn codecs() -> Vec<&'static str> {
    CodecKind::ALL.iter().map(|c| c.name()).collect()
}

/// Largest stream size for `count` values of `dtype`.
#[pyfunction]
fn compress_bound(count: usize, dtype: &str) -> PyResult<usize> {
    Ok(match dt(dtype)? {
        Dt::F32 => zcomm::compress_bound(count, zcomm::Dtype::F32),
        Dt::F64 => zcomm::compress_bound(count, zcomm::Dtype::F64),
    })
}

/// Compress `count` values at `ptr`. With `range=(min, max)` and a `noa` bound, the range is the
/// given one (e.g. agreed on by all ranks) instead of the data's own. With `dims` (the array's
/// shape, slowest first, 1 to 4 extents whose product is `count`), the shape-aware codecs
/// (cuszi, gpz) use it and record it in the stream; the others compress the values as 1-D.
#[pyfunction]
#[pyo3(signature = (ptr, count, dtype, bound, codec, range=None, dims=None))]
#[allow(clippy::too_many_arguments)]
fn compress<'py>(
    py: Python<'py>,
    ptr: usize,
    count: usize,
    dtype: &str,
    bound: &str,
    codec: &str,
    range: Option<(f64, f64)>,
    dims: Option<Vec<u64>>,
) -> PyResult<Bound<'py, PyByteArray>> {
    let d = dt(dtype)?;
    let b = parse_bound(bound)?;
    let c = parse_codec(codec)?;
    let mut opts = zcomm::CompressOptions::default();
    if let Some(r) = range {
        opts = opts.with_range(r);
    }
    if let Some(s) = dims.filter(|_| c.uses_dims()) {
        opts = opts.with_dims(zcomm::Dims::new(&s).map_err(err)?);
    }
    let stream = py.allow_threads(|| -> zcomm::Result<Vec<u8>> {
        // SAFETY: see `slice`; the Python wrapper holds the tensor.
        match d {
            Dt::F32 => zcomm::compress_with_options(host_values::<f32>(ptr, count)?, b, c, &opts),
            Dt::F64 => zcomm::compress_with_options(host_values::<f64>(ptr, count)?, b, c, &opts),
        }
    });
    let stream = stream.map_err(err)?;
    Ok(PyByteArray::new(py, &stream))
}

/// [`slice`] for the codec calls that run without the GIL (their errors are zcomm errors).
fn host_values<'a, T>(ptr: usize, count: usize) -> zcomm::Result<&'a [T]> {
    // SAFETY: the Python caller keeps `count` values alive at `ptr` during the call.
    unsafe { slice::<T>(ptr, count) }.map_err(|e| zcomm::Error::invalid(e.to_string()))
}

/// Compress `count` values at `ptr` as GPZ particles of shape `dims` (`[N]` or `[N, d]`, d = 1
/// to 4 coordinates, AoS) in `order` (`preserve` or `reorder`). Returns the stream and, for
/// `reorder`, the permutation as little-endian u64 bytes (`perm[i]` is the original index of
/// the decoded particle `i`), else `None`.
#[pyfunction]
fn compress_particles<'py>(
    py: Python<'py>,
    ptr: usize,
    count: usize,
    dtype: &str,
    bound: &str,
    dims: Vec<usize>,
    order: &str,
) -> PyResult<(Bound<'py, PyByteArray>, Option<Bound<'py, PyByteArray>>)> {
    let d = dt(dtype)?;
    let b = parse_bound(bound)?;
    let o = order.parse::<zcomm::codec::gpz::Order>().map_err(err)?;
    let r = py.allow_threads(|| match d {
        Dt::F32 => {
            zcomm::codec::compress_particles_nd(host_values::<f32>(ptr, count)?, &dims, b, o)
        }
        Dt::F64 => {
            zcomm::codec::compress_particles_nd(host_values::<f64>(ptr, count)?, &dims, b, o)
        }
    });
    let (stream, perm) = r.map_err(err)?;
    let perm = perm.map(|p| {
        let bytes: Vec<u8> = p.iter().flat_map(|i| i.to_le_bytes()).collect();
        PyByteArray::new(py, &bytes)
    });
    Ok((PyByteArray::new(py, &stream), perm))
}

/// Header fields of a stream as a dict (cheap; validates the header checksum).
#[pyfunction]
fn inspect<'py>(py: Python<'py>, ptr: usize, len: usize) -> PyResult<Bound<'py, PyDict>> {
    let s = unsafe { slice::<u8>(ptr, len)? };
    let h = zcomm::inspect(s).map_err(err)?;
    header_dict(py, &h, len)
}

/// The dict `inspect` returns, for a header of a `len`-byte stream.
fn header_dict<'py>(
    py: Python<'py>,
    h: &zcomm::format::Header,
    len: usize,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    let dtype = match h.dtype {
        zcomm::Dtype::F32 => "f32",
        zcomm::Dtype::F64 => "f64",
    };
    d.set_item("dtype", dtype)?;
    d.set_item("count", h.count)?;
    d.set_item("stored", h.is_stored())?;
    d.set_item(
        "codec",
        if h.is_stored() {
            "stored".to_string()
        } else {
            CodecKind::from_tag(h.codec)
                .map(|c| c.name().to_string())
                .unwrap_or_default()
        },
    )?;
    d.set_item("mode", format!("{:?}", h.mode).to_lowercase())?;
    d.set_item("bound_value", h.bound_value)?;
    d.set_item("abs_bound", h.abs_bound)?;
    d.set_item("step", h.step)?;
    d.set_item("range", (h.range_min, h.range_max))?;
    d.set_item("stream_bytes", len)?;
    d.set_item("dims", h.dims.map(|x| x.as_slice().to_vec()))?;
    Ok(d)
}

fn header_dtype(s: &[u8]) -> PyResult<(Dt, usize)> {
    let h = zcomm::inspect(s).map_err(err)?;
    let d = match h.dtype {
        zcomm::Dtype::F32 => Dt::F32,
        zcomm::Dtype::F64 => Dt::F64,
    };
    let n = usize::try_from(h.count).map_err(|_| bad("stream count does not fit in memory"))?;
    Ok((d, n))
}

/// Decode a stream into `count` values at `out` (dtype `dtype`, which must be the stream's).
/// With `add`, the decoded values are added to `out` instead (`out += decoded`, in `dtype`).
#[pyfunction]
#[pyo3(signature = (ptr, len, out, count, dtype, add=false))]
fn decompress_into(
    py: Python<'_>,
    ptr: usize,
    len: usize,
    out: usize,
    count: usize,
    dtype: &str,
    add: bool,
) -> PyResult<()> {
    let d = dt(dtype)?;
    let s = unsafe { slice::<u8>(ptr, len)? };
    let (sd, n) = header_dtype(s)?;
    if sd != d {
        return Err(bad(format!(
            "stream holds {} values, output is {}",
            if sd == Dt::F32 { "f32" } else { "f64" },
            dtype
        )));
    }
    if n != count {
        return Err(bad(format!("stream holds {n} values, output has {count}")));
    }
    fn run<T: zcomm::Element + std::ops::AddAssign>(
        s: &[u8],
        o: &mut [T],
        add: bool,
    ) -> zcomm::Result<()> {
        if add {
            let mut tmp = vec![T::default(); o.len()];
            zcomm::decompress_into(s, &mut tmp)?;
            for (a, b) in o.iter_mut().zip(tmp) {
                *a += b;
            }
            Ok(())
        } else {
            zcomm::decompress_into(s, o)
        }
    }
    py.allow_threads(|| match d {
        Dt::F32 => run(
            s,
            unsafe { slice_mut::<f32>(out, count) }
                .map_err(|e| zcomm::Error::invalid(e.to_string()))?,
            add,
        ),
        Dt::F64 => run(
            s,
            unsafe { slice_mut::<f64>(out, count) }
                .map_err(|e| zcomm::Error::invalid(e.to_string()))?,
            add,
        ),
    })
    .map_err(err)
}

/// Decode each stream (`(address, length)` pairs, all of `count` values of one dtype) and sum
/// them **in the given order** into the f64 accumulator at `acc` (`acc[i] += x_r[i]` for r in
/// order, each addition one f64 rounding): the same streams in the same order give bit-identical
/// sums on every rank and every run.
#[pyfunction]
fn accumulate_f64(
    py: Python<'_>,
    streams: Vec<(usize, usize)>,
    acc: usize,
    count: usize,
) -> PyResult<()> {
    let mut parsed = Vec::with_capacity(streams.len());
    for (r, &(p, l)) in streams.iter().enumerate() {
        let s = unsafe { slice::<u8>(p, l)? };
        let (d, n) = header_dtype(s)?;
        if n != count {
            return Err(bad(format!(
                "stream {r} holds {n} values, expected {count}"
            )));
        }
        parsed.push((s, d));
    }
    let acc = unsafe { slice_mut::<f64>(acc, count)? };
    py.allow_threads(|| -> zcomm::Result<()> {
        let mut t32 = Vec::new();
        let mut t64 = Vec::new();
        for (s, d) in parsed {
            match d {
                Dt::F32 => {
                    t32.resize(count, 0f32);
                    zcomm::decompress_into(s, &mut t32)?;
                    for (a, &x) in acc.iter_mut().zip(&t32) {
                        *a += x as f64;
                    }
                }
                Dt::F64 => {
                    t64.resize(count, 0f64);
                    zcomm::decompress_into(s, &mut t64)?;
                    for (a, &x) in acc.iter_mut().zip(&t64) {
                        *a += x;
                    }
                }
            }
        }
        Ok(())
    })
    .map_err(err)
}

/// The finite value range `(min, max)` of a buffer, or `None` if it has no finite value.
#[pyfunction]
fn finite_range(
    py: Python<'_>,
    ptr: usize,
    count: usize,
    dtype: &str,
) -> PyResult<Option<(f64, f64)>> {
    let d = dt(dtype)?;
    match d {
        Dt::F32 => {
            let x = unsafe { slice::<f32>(ptr, count)? };
            Ok(py.allow_threads(|| zcomm::quant::finite_range(x)))
        }
        Dt::F64 => {
            let x = unsafe { slice::<f64>(ptr, count)? };
            Ok(py.allow_threads(|| zcomm::quant::finite_range(x)))
        }
    }
}

/// zcomm's transfer model ([`zcomm::model::predict`], serial form): seconds of the raw and of the
/// compressed path for `bytes` at ratio `ratio` over a link of `bandwidth` bytes/s and `latency`
/// s, with compression / decompression throughputs `tc` / `td` bytes/s.
#[pyfunction]
fn predict(bytes: f64, ratio: f64, bandwidth: f64, latency: f64, tc: f64, td: f64) -> (f64, f64) {
    let link = zcomm::model::Link { bandwidth, latency };
    let p = zcomm::model::predict(&zcomm::model::Scenario::new(bytes, ratio, link, tc, td));
    (p.raw_serial, p.compressed_serial)
}

/// The native half of the `zcomm` Python package.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("ZcommError", m.py().get_type::<ZcommError>())?;
    m.add_function(wrap_pyfunction!(bound_spec, m)?)?;
    m.add_function(wrap_pyfunction!(codec_name, m)?)?;
    m.add_function(wrap_pyfunction!(codecs, m)?)?;
    m.add_function(wrap_pyfunction!(compress_bound, m)?)?;
    m.add_function(wrap_pyfunction!(compress, m)?)?;
    m.add_function(wrap_pyfunction!(compress_particles, m)?)?;
    m.add_function(wrap_pyfunction!(inspect, m)?)?;
    m.add_function(wrap_pyfunction!(decompress_into, m)?)?;
    m.add_function(wrap_pyfunction!(accumulate_f64, m)?)?;
    m.add_function(wrap_pyfunction!(finite_range, m)?)?;
    m.add_function(wrap_pyfunction!(predict, m)?)?;
    m.add_function(wrap_pyfunction!(cuda::cuda_available, m)?)?;
    m.add_function(wrap_pyfunction!(cuda::cuda_compress, m)?)?;
    m.add_function(wrap_pyfunction!(cuda::cuda_decompress_into, m)?)?;
    m.add_function(wrap_pyfunction!(cuda::cuda_inspect, m)?)?;
    m.add_function(wrap_pyfunction!(cuda::cuda_finite_range, m)?)?;
    Ok(())
}
