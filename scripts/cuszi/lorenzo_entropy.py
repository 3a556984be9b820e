#!/usr/bin/env python3
"""Order-0 entropy of Lorenzo residuals: the ratio an ideal entropy coder of a Lorenzo
predictor's quantization codes would reach on a field (a reference for dimension-aware codecs).

The field is prequantized the way an error-bounded codec with bound ``eb`` does it
(``q = round(x / (2 eb))``, ``eb = E * (max - min)`` for ``noa:E``, ``E`` for ``abs:E``), the
Lorenzo predictor of the field's dimensionality (1-D: previous value; 2-D: ``a + b - c``; 3-D:
the 7-neighbour form) is applied to the integer codes with zeros outside the grid, and the
order-0 (memoryless) entropy ``H`` of the residuals in bits per value gives the estimate
``ratio = 8 * sizeof(dtype) / H``. Real coders add codebooks, headers and outliers, so a
codec at or above this estimate beats the ideal order-0 Lorenzo coder.

Usage::

    lorenzo_entropy.py FILE --dims 128x128x128 --dtype f32 --error-bound noa:1e-3 [--json]
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Dict, List

import numpy as np


def parse_dims(s: str) -> List[int]:
    """``'ZxYxX'`` (slowest first) as a list of positive ints."""
    dims = [int(v) for v in s.lower().split("x")]
    if not dims or any(d <= 0 for d in dims) or len(dims) > 3:
        raise ValueError(f"--dims {s!r}: 1 to 3 positive extents, slowest first")
    return dims


def bound_of(x: np.ndarray, spec: str) -> float:
    """The absolute bound of ``abs:E`` / ``noa:E`` on the finite values of ``x``."""
    mode, _, val = spec.partition(":")
    e = float(val)
    if mode == "abs":
        return e
    if mode == "noa":
        f = x[np.isfinite(x)]
        return e * float(f.max() - f.min()) if f.size else e
    raise ValueError(f"--error-bound {spec!r}: abs:E or noa:E")


def lorenzo_residuals(q: np.ndarray) -> np.ndarray:
    """Residuals of the Lorenzo predictor of ``q``'s dimensionality (zeros outside the grid):
    the inclusion-exclusion of first differences along every axis."""
    r = q.astype(np.int64)
    for axis in range(q.ndim):
        r = np.diff(r, axis=axis, prepend=0)
    return r


def entropy_bits(r: np.ndarray) -> float:
    """Order-0 entropy of the values of ``r`` in bits per value."""
    _, counts = np.unique(r, return_counts=True)
    p = counts / counts.sum()
    return float(-(p * np.log2(p)).sum())


def estimate(x: np.ndarray, spec: str) -> Dict[str, float]:
    """Entropy (bits/value) and the ratio estimate of ``x`` (shaped) under ``spec``."""
    eb = bound_of(x, spec)
    xf = np.where(np.isfinite(x), x, 0.0).astype(np.float64)
    q = np.rint(xf / (2.0 * eb))
    h = max(entropy_bits(lorenzo_residuals(q)), 1e-12)
    bits = 8 * x.dtype.itemsize
    return {"bound": eb, "entropy_bits": h, "ratio": bits / h}


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file")
    ap.add_argument("--dims", required=True, help="extents, slowest first, e.g. 64x64x64")
    ap.add_argument("--dtype", choices=["f32", "f64"], default="f32")
    ap.add_argument("--error-bound", required=True, help="abs:E or noa:E")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    a = ap.parse_args(argv)
    dims = parse_dims(a.dims)
    x = np.fromfile(a.file, dtype="<f4" if a.dtype == "f32" else "<f8")
    if x.size != int(np.prod(dims)):
        print(f"lorenzo_entropy: {a.file} holds {x.size} values, --dims {a.dims} needs {int(np.prod(dims))}", file=sys.stderr)
        return 2
    est = estimate(x.reshape(dims), a.error_bound)
    if a.json:
        print(json.dumps({"file": a.file, "dims": dims, "error_bound": a.error_bound, **est}))
    else:
        print(f"{a.file} {a.error_bound}: {est['entropy_bits']:.3f} bits/value, ratio estimate {est['ratio']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
