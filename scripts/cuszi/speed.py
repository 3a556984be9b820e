#!/usr/bin/env python3
"""Single-core cuszi compress/decompress throughput of several zcomm builds, measured together.

For every field of ``fields.py`` (as ``ratio_check.py`` finds them) and every bound ``noa:1e-2``,
``noa:1e-3``, ``noa:1e-4`` it runs ``zcomm bench --codec cuszi --threads 1 --runs RUNS --json``
of each build in turn, ROUNDS times (builds interleaved, so that a change in the machine's load
hits them alike). A run's time is the median of its RUNS timed runs (zcomm bench); per build,
field and bound the record keeps every round's times and reports the fastest round (the least
disturbed by other processes on a shared machine) and the median round, as MB/s of raw input
(10^6 bytes per second). It fails (exit 1) when a build misses the bound, or when the builds
named by ``--same`` (builds that must write the same streams) differ in ratio.

Usage: ``speed.py FIELD_DIR LABEL=ZCOMM_BINARY... [--same LABEL,LABEL] [--rounds N] [--runs N]
[--json-out FILE]``
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Any, Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ratio_check import BOUNDS, DIMS  # noqa: E402


def bench(zcomm: str, path: str, dims: List[int], bound: str, runs: int) -> Dict[str, Any]:
    """One ``zcomm bench`` of cuszi on one thread: its JSON record."""
    cmd = [zcomm, "bench", "-i", path, "--dtype", "f32", "--error-bound", bound,
           "--dims", "x".join(map(str, dims)), "--runs", str(runs), "--codec", "cuszi",
           "--threads", "1", "--json"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)[0]


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("fields")
    ap.add_argument("builds", nargs="+", help="LABEL=ZCOMM_BINARY")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--same", default="", help="labels of builds whose streams must agree")
    ap.add_argument("--json-out")
    a = ap.parse_args(argv)
    same = [lb for lb in a.same.split(",") if lb]
    builds = [b.split("=", 1) for b in a.builds]
    names = [n for n in DIMS if os.path.exists(os.path.join(a.fields, n + ".f32"))]
    if not names:
        print(f"speed: no fields in {a.fields}", file=sys.stderr)
        return 2
    rows: List[Dict[str, Any]] = []
    failures: List[str] = []
    labels = [lb for lb, _ in builds]
    head = " | ".join(f"{lb} ratio | {lb} comp | {lb} decomp" for lb in labels)
    print(f"| field | bound | {head} |")
    print("|---|---|" + "---:|---:|---:|" * len(labels))
    for name in names:
        path, dims = os.path.join(a.fields, name + ".f32"), DIMS[name]
        nbytes = os.path.getsize(path)
        for bound in BOUNDS:
            times: Dict[str, Dict[str, List[float]]] = {lb: {"c": [], "d": []} for lb in labels}
            ratios: Dict[str, float] = {}
            for _ in range(a.rounds):
                for lb, exe in builds:
                    r = bench(exe, path, dims, bound, a.runs)
                    if not r["bound_ok"]:
                        failures.append(f"{name} {bound}: {lb} missed its bound")
                    ratios[lb] = r["ratio"]
                    times[lb]["c"].append(r["compress_s"])
                    times[lb]["d"].append(r["decompress_s"])
            if len({ratios[lb] for lb in same}) > 1:
                failures.append(f"{name} {bound}: ratios differ {ratios}")
            row: Dict[str, Any] = {"field": name, "dims": dims, "bound": bound, "bytes": nbytes,
                                   "ratio": ratios, "builds": {}}
            cells = []
            for lb in labels:
                t = times[lb]
                mbs = {k: nbytes / min(v) / 1e6 for k, v in t.items()}
                med = {k: nbytes / statistics.median(v) / 1e6 for k, v in t.items()}
                row["builds"][lb] = {
                    "compress_s": t["c"], "decompress_s": t["d"],
                    "compress_mbps_best": mbs["c"], "decompress_mbps_best": mbs["d"],
                    "compress_mbps_median": med["c"], "decompress_mbps_median": med["d"],
                }
                cells.append(f"{ratios[lb]:.2f} | {mbs['c']:.1f} | {mbs['d']:.1f}")
            rows.append(row)
            print(f"| {name} | {bound} | " + " | ".join(cells) + " |", flush=True)
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump({"builds": dict(builds), "rounds": a.rounds, "runs": a.runs,
                       "threads": 1, "rows": rows, "failures": failures}, f, indent=1)
    for m in failures:
        print("speed: " + m, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
