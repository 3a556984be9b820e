#!/usr/bin/env python3
"""Test fields for the dimension-aware codecs, written as raw little-endian f32 files.

* ``grf3d_b4_128``: a 128^3 Gaussian random field with power spectrum ``k^-4`` (smooth),
* ``grf3d_b3_128``: the same with ``k^-3`` (rougher),
* ``grf2d_b3_1024``: a 1024^2 Gaussian random field with ``k^-3``,
* ``smooth3d_128``: the analytic smooth 128^3 field of BENCHMARKS.md's first cuSZ-i table,
* ``hgt_djf`` (with ``--climate DIR``): the 500 hPa geopotential height of the ``eofs`` package's
  example data (65 winters x 29 latitudes x 49 longitudes), read from its NetCDF-3 file.

Usage: ``fields.py OUTDIR [--climate EOFS_EXAMPLE_DATA_DIR]``; prints ``name dims`` per field.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import List, Tuple

import numpy as np


def grf(shape: Tuple[int, ...], beta: float, seed: int) -> np.ndarray:
    """A Gaussian random field with isotropic power spectrum ``|k|^-beta`` (zero mean, unit
    variance), by filtering white noise in Fourier space."""
    rng = np.random.default_rng(seed)
    noise = np.fft.rfftn(rng.standard_normal(shape))
    ks = [np.fft.fftfreq(n) for n in shape[:-1]] + [np.fft.rfftfreq(shape[-1])]
    k2 = sum(np.meshgrid(*[k * k for k in ks], indexing="ij", sparse=True))
    k2[(0,) * len(shape)] = np.inf  # no mean
    f = np.fft.irfftn(noise * k2 ** (-beta / 4.0), s=shape, axes=list(range(len(shape))))
    return ((f - f.mean()) / f.std()).astype(np.float32)


def smooth3d(n: int) -> np.ndarray:
    """The analytic field of the first cuSZ-i table (x fastest)."""
    z, y, x = np.meshgrid(*[np.arange(n, dtype=np.float64)] * 3, indexing="ij")
    f = np.sin(0.05 * x) * np.cos(0.07 * y) * 100 + np.cos(0.04 * z + 0.03 * x) * 40 + np.sin(0.02 * (y + z)) * 20
    return f.astype(np.float32)


def climate(d: str) -> np.ndarray:
    """``z`` of ``hgt_djf.nc`` (time x latitude x longitude), as f32."""
    from scipy.io import netcdf_file

    with netcdf_file(os.path.join(d, "hgt_djf.nc"), mmap=False) as nc:
        z = np.array(nc.variables["z"].data, dtype=np.float64)[:, 0, :, :]
    if not np.isfinite(z).all() or np.abs(z).max() > 1e10:
        raise ValueError("hgt_djf.nc: missing values in z")
    return z.astype(np.float32)


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--climate", help="the eofs package's examples/example_data directory")
    a = ap.parse_args(argv)
    os.makedirs(a.outdir, exist_ok=True)
    fields = {
        "grf3d_b4_128": grf((128, 128, 128), 4.0, 1),
        "grf3d_b3_128": grf((128, 128, 128), 3.0, 2),
        "grf2d_b3_1024": grf((1024, 1024), 3.0, 3),
        "smooth3d_128": smooth3d(128),
    }
    if a.climate:
        fields["hgt_djf"] = climate(a.climate)
    for name, f in fields.items():
        f.astype("<f4").tofile(os.path.join(a.outdir, name + ".f32"))
        print(name, "x".join(str(n) for n in f.shape))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
