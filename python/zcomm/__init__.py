"""zcomm: error-bounded lossy compression of tensors, and compressed PyTorch communication.

Tensor codec API (this module)::

    stream = zcomm.compress(grad, error_bound="noa:1e-3")   # torch.uint8 tensor, same device
    back = zcomm.decompress(stream)                          # 1-D float32/float64 tensor
    zcomm.decompress_add(stream, out)                        # out += decoded

    s = zcomm.compress(field, "noa:1e-3", codec="cuszi")     # uses field's 1-4-D shape
    s, perm = zcomm.compress_particles(pos, "noa:1e-3", order="reorder")  # pos: [N, 3]

Every finite value ``x`` comes back as ``x'`` with ``|x - x'| <= E`` (``abs:E``),
``<= E * (max - min)`` (``noa:E``) or ``<= E * |x|`` (``rel:E``); NaN and +-Inf are kept exactly.
The streams are the bytes the Rust crate's ``zcomm::compress`` writes for the same values.

Dtypes: ``float32`` and ``float64`` are compressed as they are; ``complex64`` / ``complex128`` as
their interleaved real and imaginary parts (the bound holds on each part); ``bfloat16`` and
``float16`` are widened exactly to ``float32`` (so the bound holds on the values as given, and
the stream decodes to ``float32``; decoding into a bf16/fp16 ``out`` adds the rounding to that
dtype, at most half an ulp of each result).

CUDA tensors are compressed and decoded on their GPU by the Rust crate's CUDA codecs, in place
(zero copy: the kernels read the tensor's memory and write the stream into a tensor on the same
device); the streams are the same bytes as the CPU codecs write. PyTorch's current stream on the
tensor's device is synchronized before each call, and each call returns with its results
complete. Without a usable CUDA driver (``cuda_available()`` is false) CUDA tensors are staged
through the host and the CPU codecs are used, with the same results.

Shape-aware codecs: ``cuszi`` (interpolation across every dimension) and ``gpz`` (particles:
``[N, d]`` coordinates, d = 1..4) use the tensor's shape, which the stream records;
:func:`decompress` then returns a tensor of that shape. They run on the CPU (a CUDA tensor is
staged through the host); :func:`compress_particles` also returns GPZ's reorder permutation.

DDP / FSDP communication hooks live in :mod:`zcomm.torch`.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Optional, Tuple

from . import _native
from ._native import ZcommError

__all__ = [
    "ZcommError",
    "compress",
    "compress_particles",
    "decompress",
    "decompress_add",
    "inspect",
    "codecs",
    "parse_bound",
    "cuda_available",
]

__version__ = "0.1.0"


def _torch() -> Any:
    try:
        import torch
    except ImportError as e:  # pragma: no cover - torch is installed in every tested setup
        raise ImportError("zcomm's tensor API needs PyTorch: pip install torch") from e
    return torch


def cuda_available() -> bool:
    """Whether CUDA tensors are compressed on their GPU (a CUDA driver and device are usable)."""
    return bool(_native.cuda_available())


def _on_gpu(*tensors: Any) -> bool:
    """Whether every given tensor is a CUDA tensor that the GPU codecs can take."""
    ok = all(t.device.type == "cuda" for t in tensors)
    if ok:
        torch = _torch()
        for t in tensors:
            torch.cuda.current_stream(t.device).synchronize()
    return ok and cuda_available()


def codecs() -> list:
    """Names of the codecs (``aatrox`` is the default, also selected by ``"auto"``)."""
    return list(_native.codecs())


def parse_bound(error_bound: str) -> Tuple[str, float]:
    """Validate an error-bound spec ``abs:E`` / ``noa:E`` / ``rel:E``; return ``(mode, E)``.

    Raises :class:`ZcommError` (a ``ValueError``) for a malformed spec or ``E <= 0``.
    """
    if not isinstance(error_bound, str):
        raise ZcommError(
            f"error_bound must be a string like 'noa:1e-3' or 'abs:1e-4', got {error_bound!r}"
        )
    return _native.bound_spec(error_bound)


def _plan(t: Any) -> Tuple[Any, str]:
    """The flat float32/float64 view of ``t`` that is compressed, and its native dtype name."""
    torch = _torch()
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(t).__name__}")
    if not t.is_contiguous():
        raise ValueError(
            "zcomm needs a contiguous tensor (got strides "
            f"{tuple(t.stride())} for shape {tuple(t.shape)}); call .contiguous() first"
        )
    if t.dtype == torch.float32:
        return t.reshape(-1), "f32"
    if t.dtype == torch.float64:
        return t.reshape(-1), "f64"
    if t.dtype == torch.complex64:
        return torch.view_as_real(t).reshape(-1), "f32"
    if t.dtype == torch.complex128:
        return torch.view_as_real(t).reshape(-1), "f64"
    if t.dtype in (torch.bfloat16, torch.float16):
        return t.reshape(-1).to(torch.float32), "f32"
    raise TypeError(
        f"zcomm cannot compress dtype {t.dtype}: supported are float32, float64, complex64, "
        "complex128, bfloat16 and float16"
    )


def _host(t: Any) -> Any:
    return t if t.device.type == "cpu" else t.cpu()


# codecs that use the array's shape (and record it in the stream)
_SHAPED = ("cuszi", "gpz")


def _dims(tensor: Any, codec: str) -> Optional[Tuple[int, ...]]:
    """The shape a shape-aware ``codec`` compresses ``tensor`` as (``None``: 1-D).

    Complex tensors add a last extent of 2 (real, imaginary). ``gpz`` reads the last extent as
    the coordinates per particle and every leading extent as particles (``[..., d]`` →
    ``[N, d]``); ``cuszi`` takes up to 4 extents and merges any leading ones beyond them. An
    empty tensor or a 0-d scalar is 1-D.
    """
    shape = list(tensor.shape) + ([2] if tensor.dtype.is_complex else [])
    if len(shape) < 2 or 0 in shape:
        return None

    keep = 1 if codec == "gpz" else 3
    if len(shape) > keep + 1:
        shape = [math.prod(shape[:-keep])] + shape[-keep:]
    return tuple(shape)


def compress(
    tensor: Any,
    error_bound: str = "noa:1e-3",
    codec: str = "auto",
    *,
    value_range: Optional[Tuple[float, float]] = None,
) -> Any:
    """Compress ``tensor`` so that every finite value is reconstructed within ``error_bound``.

    Args:
        tensor: a contiguous float32 / float64 / complex64 / complex128 / bfloat16 / float16
            tensor of any shape (it is compressed flat, in memory order).
        error_bound: ``"abs:E"``, ``"noa:E"`` (E times the finite value range) or ``"rel:E"``.
        codec: ``"auto"`` (the default codec, aatrox), ``"aatrox"``, ``"cuszp-plain"``,
            ``"cuszp-outlier"``, ``"pfpl"``, or a shape-aware codec (CPU only): ``"cuszi"``
            (1- to 4-D fields; the tensor's shape, leading extents beyond 4 merged) or ``"gpz"``
            (particles ``[N, d]``, d = 1..4, in their original order; see
            :func:`compress_particles`).
        value_range: for ``noa`` bounds, the ``(min, max)`` to scale the bound with instead of
            the tensor's own finite range (e.g. a range agreed on by several ranks).

    Returns:
        A 1-D ``torch.uint8`` tensor holding the stream, on ``tensor``'s device.

    Raises:
        TypeError: not a tensor, or an unsupported dtype.
        ValueError: a non-contiguous tensor; :class:`ZcommError` (a ``ValueError``) for a bad
            bound (``<= 0``, NaN, unknown mode) or codec name.
    """
    torch = _torch()
    flat, dt = _plan(tensor)
    parse_bound(error_bound)
    name = _native.codec_name(codec)
    dims = _dims(tensor, name) if name in _SHAPED else None
    if _on_gpu(flat) and name not in _SHAPED:
        cap = _native.compress_bound(flat.numel(), dt)
        buf = torch.empty(cap, dtype=torch.uint8, device=flat.device)
        n = _native.cuda_compress(
            flat.data_ptr(), flat.numel(), dt, error_bound, codec, value_range,
            flat.device.index, buf.data_ptr(), cap,
        )
        return buf[:n].clone()
    h = _host(flat)
    ba = _native.compress(h.data_ptr(), h.numel(), dt, error_bound, codec, value_range, dims)
    return _stream_tensor(ba, tensor.device)


def _stream_tensor(ba: bytearray, device: Any) -> Any:
    """A native result's bytes as a ``torch.uint8`` tensor on ``device``."""
    torch = _torch()
    out = torch.frombuffer(ba, dtype=torch.uint8) if len(ba) else torch.empty(0, dtype=torch.uint8)
    return out if device.type == "cpu" else out.to(device)


def compress_particles(
    positions: Any, error_bound: str = "noa:1e-3", order: str = "preserve"
) -> Tuple[Any, Optional[Any]]:
    """Compress particle coordinates with GPZ (spatial quantization, per-block sort).

    Args:
        positions: a contiguous float32 / float64 (or bf16 / fp16, widened to float32) tensor of
            shape ``[N, d]`` (``N`` particles of ``d = 1..4`` coordinates; leading extents
            ``[..., d]`` are particles too) or ``[N]``.
        error_bound: ``"abs:E"`` or ``"noa:E"``, per coordinate (``noa``: ``E`` times each
            axis's own range); ``rel`` is not supported.
        order: ``"preserve"`` (decoding restores the particles' order) or ``"reorder"``
            (decoding returns them in the stream's order: higher ratio, and a permutation).

    Returns:
        ``(stream, perm)``: the stream (``torch.uint8``, on ``positions``' device; decode it with
        :func:`decompress`, which returns shape ``[N, d]``) and, for ``"reorder"``, a
        ``torch.int64`` tensor with ``perm[i]`` = the original index of decoded particle ``i``
        (apply it to other per-particle arrays: ``velocities[perm]``); ``None`` for
        ``"preserve"``. Runs on the CPU (CUDA tensors are staged through the host).

    Raises:
        TypeError: not a tensor, or a complex / unsupported dtype.
        ZcommError: a bad bound or order, or a shape whose last extent is not 1..4.
    """
    torch = _torch()
    if isinstance(positions, torch.Tensor) and positions.dtype.is_complex:
        raise TypeError("compress_particles takes real coordinates, not complex tensors")
    flat, dt = _plan(positions)
    parse_bound(error_bound)
    # [..., d] -> [N, d]; a 1-D or empty set is N particles of one coordinate
    dims = _dims(positions, "gpz") or (flat.numel(),)
    h = _host(flat)
    ba, pb = _native.compress_particles(h.data_ptr(), h.numel(), dt, error_bound, list(dims), order)
    stream = _stream_tensor(ba, positions.device)
    if pb is None:
        return stream, None
    perm = torch.frombuffer(pb, dtype=torch.int64) if len(pb) else torch.empty(0, dtype=torch.int64)
    return stream, perm if positions.device.type == "cpu" else perm.to(positions.device)


def _stream_host(stream: Any) -> Any:
    torch = _torch()
    if isinstance(stream, (bytes, bytearray, memoryview)):
        b = bytearray(stream)
        return torch.frombuffer(b, dtype=torch.uint8) if len(b) else torch.empty(0, dtype=torch.uint8)
    if not isinstance(stream, torch.Tensor):
        raise TypeError(f"expected a torch.uint8 stream tensor or bytes, got {type(stream).__name__}")
    if stream.dtype != torch.uint8:
        raise TypeError(f"a zcomm stream is a torch.uint8 tensor, got dtype {stream.dtype}")
    if not stream.is_contiguous():
        raise ValueError("the stream tensor must be contiguous")
    return _host(stream.reshape(-1))


def _stream_device(stream: Any) -> Any:
    """A CUDA stream tensor as a flat contiguous uint8 tensor (checked like a host stream)."""
    torch = _torch()
    if stream.dtype != torch.uint8:
        raise TypeError(f"a zcomm stream is a torch.uint8 tensor, got dtype {stream.dtype}")
    if not stream.is_contiguous():
        raise ValueError("the stream tensor must be contiguous")
    s = stream.reshape(-1)
    # the GPU decoder reads streams in 4-byte words: a slice at an unaligned offset (e.g. one
    # stream of a concatenated exchange buffer) is copied to its own allocation
    return s if s.data_ptr() % 16 == 0 else s.clone()


def _cuda_header(s: Any) -> Optional[Dict[str, Any]]:
    """The header of the CUDA stream ``s`` read on its GPU, or ``None`` when the GPU path cannot
    take it: the shape-aware codecs' streams (no CUDA codec) and corrupt headers (the host
    path then raises its error)."""
    try:
        return dict(_native.cuda_inspect(s.data_ptr(), s.numel(), s.device.index))
    except ZcommError:
        return None


def _decode_gpu(stream: Any, out: Optional[Any], add: bool) -> Any:
    """Decode (``add``: accumulate) a CUDA stream on its GPU; ``out`` None: a new tensor."""
    torch = _torch()
    s = _stream_device(stream)
    h = _cuda_header(s)
    if h is None:
        # a stream the CUDA codecs do not decode (cuszi, gpz: shaped streams) or a corrupt one:
        # the host decodes it (same values) or raises the host's error
        host = s.cpu()
        if out is None:
            return decompress(host).to(s.device)
        # decoding overwrites `tmp`: only an accumulation needs `out`'s values
        tmp = out.detach().cpu().clone() if add else torch.empty_like(out, device="cpu")
        (decompress_add if add else decompress)(host, tmp)
        with torch.no_grad():
            out.copy_(tmp)
        return out
    sdt, count = h["dtype"], int(h["count"])
    if out is None:
        res = torch.empty(count, dtype=torch.float32 if sdt == "f32" else torch.float64, device=s.device)
        _native.cuda_decompress_into(s.data_ptr(), s.numel(), res.data_ptr(), count, sdt, s.device.index, False)
        return res
    if out.device != s.device:
        raise ValueError(f"out is on {out.device}, the stream on {s.device}")
    flat, dt = _plan(out)
    if flat.numel() != count:
        raise ValueError(f"out holds {flat.numel()} values, the stream holds {count}")
    if dt != sdt:
        raise ValueError(f"the stream holds {sdt} values; out ({out.dtype}) needs {dt}")
    if out.dtype in (torch.bfloat16, torch.float16):
        # `flat` is already a float32 copy of `out`: decode (and add) into it, then round once
        # into the caller's dtype
        _native.cuda_decompress_into(s.data_ptr(), s.numel(), flat.data_ptr(), count, sdt, s.device.index, add)
        with torch.no_grad():
            out.reshape(-1).copy_(flat)
        return out
    _native.cuda_decompress_into(s.data_ptr(), s.numel(), flat.data_ptr(), count, sdt, s.device.index, add)
    return out


def inspect(stream: Any) -> Dict[str, Any]:
    """Header of a stream (dtype, count, codec, bound mode and value, abs_bound, range...).

    Raises :class:`ZcommError` for a corrupt or truncated header.
    """
    torch = _torch()
    if isinstance(stream, torch.Tensor) and _on_gpu(stream):
        h = _cuda_header(_stream_device(stream))
        if h is not None:
            return h
    s = _stream_host(stream)
    return dict(_native.inspect(s.data_ptr(), s.numel()))


def _decode_target(out: Any, count: int, sdt: str) -> Tuple[Any, Any]:
    """(flat buffer the stream decodes into, final tensor or None when a copy back is needed)."""
    torch = _torch()
    flat, dt = _plan(out)
    if flat.numel() != count:
        raise ValueError(f"out holds {flat.numel()} values, the stream holds {count}")
    if dt != sdt:
        raise ValueError(f"the stream holds {sdt} values; out ({out.dtype}) needs {dt}")
    direct = out.device.type == "cpu" and out.dtype not in (torch.bfloat16, torch.float16)
    if direct:
        return flat, None
    view = torch.view_as_real(out).reshape(-1) if out.dtype.is_complex else out.reshape(-1)
    return flat.cpu().clone(), view  # decode on the host in f32/f64, then one copy back


def decompress(stream: Any, out: Optional[Any] = None) -> Any:
    """Decode ``stream`` (a ``torch.uint8`` tensor or bytes).

    Without ``out``: returns a new float32 / float64 tensor (the stream's dtype) on the
    stream's device, 1-D, or of the shape the stream records (``cuszi`` / ``gpz`` streams). With ``out`` (contiguous, any supported dtype with the same number of
    underlying float values, e.g. the original tensor's shape and dtype): decodes into it and
    returns it. Raises :class:`ZcommError` for a corrupt stream or a count / dtype mismatch.
    """
    torch = _torch()
    if (
        isinstance(stream, torch.Tensor)
        and (out is None or out.device == stream.device)
        and _on_gpu(stream)
    ):
        return _decode_gpu(stream, out, False)
    s = _stream_host(stream)
    h = _native.inspect(s.data_ptr(), s.numel())
    sdt, count = h["dtype"], int(h["count"])
    if out is None:
        res = torch.empty(count, dtype=torch.float32 if sdt == "f32" else torch.float64)
        _native.decompress_into(s.data_ptr(), s.numel(), res.data_ptr(), count, sdt, False)
        if h.get("dims"):
            res = res.reshape(h["dims"])
        dev = stream.device if isinstance(stream, torch.Tensor) else torch.device("cpu")
        return res if dev.type == "cpu" else res.to(dev)
    buf, back = _decode_target(out, count, sdt)
    _native.decompress_into(s.data_ptr(), s.numel(), buf.data_ptr(), count, sdt, False)
    if back is not None:
        with torch.no_grad():
            back.copy_(buf)
    return out


def decompress_add(stream: Any, out: Any) -> Any:
    """``out += decompress(stream)`` without allocating the decoded tensor on the caller's side.

    ``out`` must be contiguous with as many underlying float values as the stream. For float32 /
    float64 / complex outputs the addition is done in the output's dtype; for bf16 / fp16 it is
    done in float32 and rounded once. Returns ``out``.
    """
    torch = _torch()
    if isinstance(stream, torch.Tensor) and out.device == stream.device and _on_gpu(stream):
        return _decode_gpu(stream, out, True)
    s = _stream_host(stream)
    h = _native.inspect(s.data_ptr(), s.numel())
    sdt, count = h["dtype"], int(h["count"])
    buf, back = _decode_target(out, count, sdt)
    _native.decompress_into(s.data_ptr(), s.numel(), buf.data_ptr(), count, sdt, True)
    if back is not None:
        with torch.no_grad():
            back.copy_(buf)
    return out
