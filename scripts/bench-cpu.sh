#!/usr/bin/env bash
# CPU benchmark table for BENCHMARKS.md: every codec on every raw f32 array of DATA_DIR, at NOA
# 1e-2/1e-3/1e-4, on one thread and on all cores. Usage:
#   scripts/bench-cpu.sh [DATA_DIR (default ../shared/data)] [RUNS (default 20)]
# Prints Markdown; writes the raw `zcomm bench --json` records to bench/results/DATE-cpu.json.
set -euo pipefail
cd "$(dirname "$0")/.."
data=${1:-../shared/data}
runs=${2:-20}
cargo build --release --bin zcomm >&2
bin="$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')/release/zcomm"
cores=$(nproc)
mkdir -p bench/results
json="bench/results/$(date -u +%Y-%m-%d)-cpu.json"
tmp=$(mktemp)
load0=$(cut -d" " -f1-3 /proc/loadavg)
for threads in 1 "$cores"; do
    for f in "$data"/*.f32; do
        for e in 1e-2 1e-3 1e-4; do
            "$bin" bench --input "$f" --dtype f32 --error-bound "noa:$e" --codec all \
                --runs "$runs" --threads "$threads" --json >>"$tmp"
        done
    done
done
echo "Date: $(date -u '+%Y-%m-%d %H:%M UTC'); CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $cores cores; zcomm $(git rev-parse --short HEAD); median of $runs runs; load average before/after: $load0 / $(cut -d" " -f1-3 /proc/loadavg)"
echo
python3 - "$tmp" "$json" "$cores" <<'PY'
import json, os, sys
src, dst, cores = sys.argv[1], sys.argv[2], int(sys.argv[3])
recs = json.loads("[" + open(src).read().replace("]\n[", "],[").replace("]\r\n[", "],[") + "]")
recs = [r for batch in recs for r in batch]
json.dump(recs, open(dst, "w"), indent=1)
key = lambda r: (os.path.basename(r["input"]), r["error_bound"], r["codec"])
by = {}
for r in recs:
    by.setdefault(key(r), {})[r["threads"]] = r
print("| input | bound | codec | ratio | max error | PSNR dB | compress GB/s 1 thread | decompress GB/s 1 thread | compress GB/s %d threads | decompress GB/s %d threads |" % (cores, cores))
print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
for k, t in by.items():
    one, all_ = t.get(1), t.get(cores, t.get(1))
    psnr = "inf" if one["psnr_db"] is None else "%.1f" % one["psnr_db"]
    assert one["bound_ok"] and all_["bound_ok"]
    print("| %s | %s | %s | %.2f | %.3e | %s | %.2f | %.2f | %.2f | %.2f |" % (
        k[0], k[1], k[2], one["ratio"], one["max_error"], psnr,
        one["compress_gbps"], one["decompress_gbps"], all_["compress_gbps"], all_["decompress_gbps"]))
PY
rm -f "$tmp"
echo >&2 "raw records: $json"
