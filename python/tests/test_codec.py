"""Tensor codec API: round trips with exact bound checks for every dtype, bad input errors."""

import math

import numpy as np
import pytest
import torch

import zcomm

DTYPES = [torch.float32, torch.float64, torch.complex64, torch.complex128, torch.bfloat16, torch.float16]


def _data(dtype, n=20_000):
    g = torch.Generator().manual_seed(7)
    base = torch.sin(torch.arange(n, dtype=torch.float64) * 1e-3) + 0.01 * torch.randn(n, dtype=torch.float64, generator=g)
    if dtype.is_complex:
        return torch.complex(base, base.flip(0)).to(dtype)
    return base.to(dtype)


def _parts(t):
    """Underlying real values as float64 (complex: interleaved parts; bf16/fp16: exact widening)."""
    if t.dtype.is_complex:
        return torch.view_as_real(t).reshape(-1).double()
    return t.reshape(-1).double()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("bound", ["abs:1e-3", "noa:1e-4", "rel:1e-3"])
@pytest.mark.parametrize("codec", ["auto", "aatrox", "cuszp-plain", "cuszp-outlier", "pfpl"])
def test_round_trip_bound(dtype, bound, codec):
    x = _data(dtype)
    s = zcomm.compress(x, bound, codec)
    assert s.dtype == torch.uint8 and s.dim() == 1 and s.device == x.device
    y = zcomm.decompress(s)
    assert y.dtype == (torch.float64 if dtype in (torch.float64, torch.complex128) else torch.float32)
    xs, ys = _parts(x), y.double()
    assert xs.numel() == ys.numel()
    mode, e = zcomm.parse_bound(bound)
    if mode == "abs":
        lim = torch.full_like(xs, e)
    elif mode == "noa":
        lim = torch.full_like(xs, e * float(xs.max() - xs.min()))
    else:
        lim = e * xs.abs()
    assert bool(((xs - ys).abs() <= lim).all()), float(((xs - ys).abs() - lim).max())
    # decoding into a tensor of the original dtype and shape
    out = torch.empty_like(x)
    zcomm.decompress(s, out=out)
    if dtype in (torch.bfloat16, torch.float16):
        # exactly one rounding (to nearest) of the float32 reconstruction to the narrow dtype
        assert torch.equal(out, ys.float().to(dtype))
    else:
        assert torch.equal(_parts(out), ys)


def test_stream_is_rust_stream_bytes_and_deterministic():
    x = _data(torch.float32)
    a = zcomm.compress(x, "noa:1e-3")
    b = zcomm.compress(x.clone(), "noa:1e-3")
    assert torch.equal(a, b)
    h = zcomm.inspect(a)
    assert h["dtype"] == "f32" and h["count"] == x.numel() and h["codec"] == "aatrox"
    assert h["mode"] == "noa"
    # bytes in, bytes out
    y = zcomm.decompress(bytes(a.numpy().tobytes()))
    assert torch.equal(y, zcomm.decompress(a))


def test_decompress_add():
    x = _data(torch.float64)
    s = zcomm.compress(x, "abs:1e-6")
    out = torch.ones_like(x)
    zcomm.decompress_add(s, out)
    assert torch.allclose(out - 1, x, atol=1.0001e-6, rtol=0)
    c = _data(torch.complex64)
    s = zcomm.compress(c, "abs:1e-4")
    o = torch.zeros_like(c)
    zcomm.decompress_add(s, o)
    zcomm.decompress_add(s, o)
    assert torch.allclose(torch.view_as_real(o), 2 * torch.view_as_real(zcomm.decompress(s, out=torch.empty_like(c))), atol=0, rtol=0)


def test_non_finite_kept_exactly():
    x = torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), 2.0] * 1000)
    y = zcomm.decompress(zcomm.compress(x, "noa:1e-2"))
    assert torch.equal(torch.isnan(x), torch.isnan(y))
    fin = torch.isfinite(x)
    assert torch.equal(x[~fin & ~torch.isnan(x)], y[~fin & ~torch.isnan(y)])
    assert bool(((x[fin] - y[fin]).abs() <= 1e-2).all())


def test_empty_and_scalar():
    for x in (torch.empty(0), torch.tensor(3.5), torch.zeros(5, 0)):
        y = zcomm.decompress(zcomm.compress(x, "abs:1e-3"))
        assert y.numel() == x.numel()


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.bool, torch.complex32])
def test_unsupported_dtype(dtype):
    x = torch.zeros(10, dtype=dtype)
    with pytest.raises(TypeError, match="cannot compress dtype"):
        zcomm.compress(x)


def test_non_contiguous():
    x = torch.randn(10, 10).t()
    with pytest.raises(ValueError, match="contiguous"):
        zcomm.compress(x)
    with pytest.raises(ValueError, match="contiguous"):
        zcomm.decompress(zcomm.compress(x.contiguous()), out=torch.empty(10, 10).t())


@pytest.mark.parametrize("bound", ["abs:0", "noa:-1e-3", "abs:nan", "rel:1.5", "xyz:1e-3", "1e-3", "noa:abc"])
def test_bad_bound(bound):
    with pytest.raises(ValueError) as ei:
        zcomm.compress(torch.randn(100), bound)
    assert isinstance(ei.value, zcomm.ZcommError)
    assert "bound" in str(ei.value)


def test_bad_codec_and_types():
    with pytest.raises(ValueError, match="unknown codec"):
        zcomm.compress(torch.randn(10), "abs:1e-3", codec="zip")
    with pytest.raises(TypeError):
        zcomm.compress(np.zeros(3, dtype=np.float32))
    with pytest.raises(zcomm.ZcommError):
        zcomm.parse_bound(1e-3)


def test_corrupt_and_mismatched_streams():
    x = torch.randn(1000)
    s = zcomm.compress(x, "abs:1e-3")
    bad = s.clone()
    bad[len(bad) // 2] ^= 0xFF
    with pytest.raises(zcomm.ZcommError):
        zcomm.decompress(bad)
    with pytest.raises(zcomm.ZcommError):
        zcomm.decompress(s[:10])
    with pytest.raises(ValueError, match="values"):
        zcomm.decompress(s, out=torch.empty(999))
    with pytest.raises(ValueError, match="f32"):
        zcomm.decompress(s, out=torch.empty(1000, dtype=torch.float64))
    with pytest.raises(TypeError):
        zcomm.decompress(torch.zeros(10, dtype=torch.float32))
