#!/usr/bin/env python3
"""Markdown tables of `nccl_bench` JSON records (examples/nccl_bench.rs), one row per operation,
size and bound: raw NCCL, the compressed call (`always`), its speedup, the model's prediction and
error, what `auto` chose and its speedup against raw NCCL timed alternately, the ratio and the
largest error against the guaranteed bound.

    python3 bench/nccl_table.py bench/results/FILE.json [...]
"""
import json
import sys


def rows(recs):
    by = {}
    for r in recs:
        by.setdefault((r["op"], r["bytes"], r["error_bound"]), {})[r["policy"]] = r
    out = []
    for (op, size, bound), pol in sorted(by.items(), key=lambda kv: (kv[0][0], kv[0][1], -float(kv[0][2].split(":")[1]))):
        a, auto = pol.get("always"), pol.get("auto")
        if a is None:
            continue
        pred = a["predicted_compressed_ms"]
        err = (a["compressed_ms"] - pred) / pred * 100 if pred else float("nan")
        if auto is not None:
            sp = auto.get("speedup_paired") or auto["speedup"]
            auto_s = f"{auto['decision']} {sp:.2f}x"
        else:
            auto_s = "-"
        out.append(
            f"| {op} | {size >> 20} | {bound} | {a['raw_ms']:.3f} | {a['compressed_ms']:.3f} | "
            f"{a['speedup']:.2f}x | {pred:.3f} | {err:+.0f} % | {auto_s} | {a['ratio']:.2f} | "
            f"{a['max_error']:.3e} / {a['abs_bound']:.3e} |"
        )
    return out


def main():
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        return
    print("| op | MiB/rank | bound | raw NCCL ms | compressed ms | speedup | model ms | model err | auto (vs raw, alternating) | ratio | max error / bound |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---|---:|---:|")
    for path in sys.argv[1:]:
        with open(path) as f:
            for line in rows(json.load(f)):
                print(line)


if __name__ == "__main__":
    main()
