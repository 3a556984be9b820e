"""Shape-aware codecs from Python: cuszi uses the tensor's shape, gpz compresses particles and
returns its reorder permutation; the streams are the Rust crate's and decode to the shape."""

from __future__ import annotations

import math

import pytest
import torch

import zcomm


def _smooth3d(n: int = 48, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A smooth 3-D field: along its rows it is far smoother than as a flat line."""
    g = torch.linspace(0, 2 * math.pi, n, dtype=torch.float64)
    z, y, x = torch.meshgrid(g, g, g, indexing="ij")
    return (torch.sin(x) * torch.cos(2 * y) + 0.5 * torch.sin(3 * z + x)).to(dtype).contiguous()


def _clustered(n: int, d: int, seed: int = 0) -> torch.Tensor:
    """Particles in a few clusters, stored in random order (neighbours in storage are not
    neighbours in space)."""
    gen = torch.Generator().manual_seed(seed)
    centres = torch.rand(8, d, generator=gen, dtype=torch.float64) * 100
    which = torch.randint(0, 8, (n,), generator=gen)
    return (centres[which] + torch.randn(n, d, generator=gen, dtype=torch.float64)).to(torch.float32)


def _noa_limit(x: torch.Tensor, e: float) -> float:
    return e * float(x.max() - x.min())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cuszi_uses_the_shape(dtype: torch.dtype) -> None:
    x = _smooth3d(dtype=dtype)
    s = zcomm.compress(x, "noa:1e-3", codec="cuszi")
    h = zcomm.inspect(s)
    assert h["codec"] == "cuszi" and h["dims"] == [48, 48, 48]
    y = zcomm.decompress(s)
    assert y.shape == x.shape and y.dtype == dtype
    err = float((y.double() - x.double()).abs().max())
    assert err <= _noa_limit(x.double(), 1e-3), err
    # the same values as a flat array: the shape is what pays
    flat = zcomm.compress(x.reshape(-1), "noa:1e-3", codec="cuszi")
    assert zcomm.inspect(flat)["dims"] == [x.numel()]
    assert s.numel() < flat.numel(), (s.numel(), flat.numel())
    # decoding into a caller's tensor of the shape works as for every codec
    out = torch.empty_like(x)
    assert torch.equal(zcomm.decompress(s, out=out), y)


def test_shape_rules() -> None:
    x = _smooth3d(12)
    # more than 4 extents: the leading ones are merged
    s = zcomm.compress(x.reshape(2, 6, 12, 3, 4), "noa:1e-2", codec="cuszi")
    assert zcomm.inspect(s)["dims"] == [12, 12, 3, 4]
    # complex: a last extent of 2 (real, imaginary)
    c = torch.complex(x, -x)
    s = zcomm.compress(c, "noa:1e-2", codec="cuszi")
    assert zcomm.inspect(s)["dims"] == [12, 12, 12, 2]
    back = torch.view_as_complex(zcomm.decompress(s))
    assert bool(((back - c).abs() <= 2 * _noa_limit(torch.view_as_real(c), 1e-2)).all())
    # the other codecs ignore the shape (1-D streams, as before)
    s = zcomm.compress(x, "noa:1e-2", codec="aatrox")
    assert zcomm.inspect(s)["dims"] is None and zcomm.decompress(s).dim() == 1
    # gpz: [..., d] are particles of d coordinates
    p = _clustered(300, 3).reshape(10, 30, 3)
    s = zcomm.compress(p, "noa:1e-3", codec="gpz")
    assert zcomm.inspect(s)["dims"] == [300, 3]
    assert zcomm.decompress(s).shape == (300, 3)


@pytest.mark.parametrize("order", ["preserve", "reorder"])
@pytest.mark.parametrize("d", [1, 2, 3, 4])
def test_particles_round_trip(order: str, d: int) -> None:
    pos = _clustered(5000, d, seed=d)
    e = 1e-3
    s, perm = zcomm.compress_particles(pos, f"noa:{e}", order=order)
    h = zcomm.inspect(s)
    assert h["codec"] == "gpz" and h["count"] == pos.numel()
    y = zcomm.decompress(s)
    assert y.shape == (5000, d)
    if order == "preserve":
        assert perm is None
        ref = pos
    else:
        assert perm is not None and perm.dtype == torch.int64
        assert torch.equal(torch.sort(perm).values, torch.arange(5000))
        # a block never moves a particle out of its 32-particle block
        assert bool((perm // 32 == torch.arange(5000) // 32).all())
        ref = pos[perm]
    # per axis: E times that axis's range
    for a in range(d):
        lim = _noa_limit(pos[:, a].double(), e)
        err = float((y[:, a].double() - ref[:, a].double()).abs().max())
        assert err <= lim, (a, err, lim)


def test_particles_reorder_beats_flat_codecs() -> None:
    pos = _clustered(1 << 15, 3, seed=7)
    s, _ = zcomm.compress_particles(pos, "noa:1e-3", order="reorder")
    flat = zcomm.compress(pos, "noa:1e-3", codec="aatrox")
    assert s.numel() < flat.numel(), (s.numel(), flat.numel())


def test_particles_permute_other_arrays() -> None:
    pos = _clustered(2000, 3, seed=3)
    ids = torch.arange(2000)
    s, perm = zcomm.compress_particles(pos, "abs:1e-4", order="reorder")
    y = zcomm.decompress(s)
    # the ids travel with their particles
    assert bool(((y - pos[ids[perm]]).abs() <= 1e-4).all())


def test_particles_edge_cases() -> None:
    s, perm = zcomm.compress_particles(torch.empty(0, 3), "noa:1e-3", order="reorder")
    assert zcomm.decompress(s).numel() == 0 and perm is not None and perm.numel() == 0
    one = torch.tensor([[1.0, 2.0, float("nan")]])
    s, perm = zcomm.compress_particles(one, "abs:1e-3", order="reorder")
    back = zcomm.decompress(s)
    assert torch.equal(torch.isnan(back), torch.isnan(one)) and perm.tolist() == [0]
    with pytest.raises(zcomm.ZcommError):
        zcomm.compress_particles(torch.zeros(10, 5), "noa:1e-3")  # 5 coordinates
    with pytest.raises(zcomm.ZcommError):
        zcomm.compress_particles(torch.zeros(10, 3), "rel:1e-3")
    with pytest.raises(zcomm.ZcommError):
        zcomm.compress_particles(torch.zeros(10, 3), "noa:1e-3", order="sideways")
    with pytest.raises(TypeError):
        zcomm.compress_particles(torch.zeros(10, 3, dtype=torch.complex64), "noa:1e-3")
