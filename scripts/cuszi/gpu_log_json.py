#!/usr/bin/env python3
"""Turn the console lines of `tests/gpu_cuszi.rs`'s throughput tests (as kept in a
`bench/results/*.log`) into JSON lines, one per measured direction.

The tests write these records themselves when `ZCOMM_BENCH_JSON=FILE` is set; this script
recovers them from logs of runs made without it. A `== LABEL ...` line before a block names the
build the block measured (field `build`); fields a log line lacks are left out.

Usage: ``gpu_log_json.py LOG [--device NAME] > LOG.jsonl``

Example: ``python3 scripts/cuszi/gpu_log_json.py bench/results/2026-11-28-h200-cuszi-coder3.log
--device "NVIDIA H200"``
"""

import argparse
import json
import re
import sys

HEAD = re.compile(r"^cuszi (?P<shape>.+?) f32 (?P<bound>\S+): ")
DEC = re.compile(
    r"ratio (?P<ratio>[\d.]+) \| gpu decompress median (?P<ms>[\d.]+) ms = (?P<gbps>[\d.]+) GB/s"
    r"(?: \(min (?P<min>[\d.]+) ms, max (?P<max>[\d.]+) ms, (?P<runs>\d+) runs\))?"
    r" \| (?P<same>bit-identical)?"
)
ENC = re.compile(
    r"gpu compress median (?P<ms>[\d.]+) ms = (?P<gbps>[\d.]+) GB/s"
    r"(?: \(min (?P<min>[\d.]+) ms, max (?P<max>[\d.]+) ms, (?P<runs>\d+) runs\))?"
    r" \| byte-identical to CPU compress_nd: (?P<same>true|false)"
)


def records(lines, device):
    """Yield one dict per decompress or compress line of `lines`."""
    build = None
    for line in lines:
        line = line.strip()
        if line.startswith("== "):
            build = line[3:].split()[0]
            continue
        head = HEAD.match(line)
        if not head:
            continue
        rest = line[head.end():]
        for op, pat in (("decompress", DEC), ("compress", ENC)):
            m = pat.match(rest) if op == "compress" else pat.search(rest)
            if not m:
                continue
            rec = {
                "op": op,
                "codec": "cuszi",
                "dtype": "f32",
                "shape": head["shape"],
                "error_bound": head["bound"],
                "time_ms": float(m["ms"]),
                "input_gbps": float(m["gbps"]),
                "same_as_cpu": (m["same"] is not None) if op == "decompress" else m["same"] == "true",
            }
            if op == "decompress":
                rec["ratio"] = float(m["ratio"])
            if m["min"]:
                rec.update(min_ms=float(m["min"]), max_ms=float(m["max"]), runs=int(m["runs"]))
            if build:
                rec["build"] = build
            if device:
                rec["device"] = device
            yield rec


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("log", help="a gpu_cuszi throughput log")
    ap.add_argument("--device", help="the GPU the log was measured on")
    a = ap.parse_args()
    with open(a.log, encoding="utf-8") as f:
        for rec in records(f, a.device):
            print(json.dumps(rec))


if __name__ == "__main__":
    sys.exit(main())
