#!/usr/bin/env bash
# libzcomm_mpi.so under an unmodified CUDA + MPI program (pmpi_device.c) on a GPU machine: the
# collectives on device buffers are compressed on the GPU (ZCOMM_DEVICE=stage, the default).
#
#   mpi-tests/pmpi/device.sh LIB [OUTDIR] [N ITERS]
#
# LIB: the libzcomm_mpi.so to preload (built with the default features: CUDA is loaded at run
# time). Runs, on every GPU the machine has (ranks round-robin over the devices):
#  1. without the library, the program staging through the host itself (--stage-self): exact
#     results, and the raw baseline times;
#  2. with the library, ZCOMM_POLICY=always, abs:1e-4, -n 2 and -n 3: every result within the
#     bound (collectives and point to point); a managed/host mix on one allreduce passes through
#     exactly; the report shows the device calls compressed with ratio > 1;
#  3. with the library, ZCOMM_POLICY=never (the library's staged raw path) and auto: times.
# Times: N f32 per rank (default 32 Mi = 128 MiB), best and median of ITERS (default 5), the
# slowest rank; a markdown table on stdout and OUTDIR/pmpi-device.json. Exits non-zero on any
# failure; exits 77 (skipped) without nvidia-smi, nvcc's CUDA runtime or mpicc.
set -euo pipefail
LIB=$(realpath "${1:?usage: device.sh LIB [OUTDIR] [N ITERS]}")
OUT=${2:-$(mktemp -d)}
N=${3:-33554432}
ITERS=${4:-5}
cd "$(dirname "$0")/../.."
CUDA=${CUDA_HOME:-/usr/local/cuda}
command -v nvidia-smi >/dev/null && [ -f "$CUDA/include/cuda_runtime.h" ] && command -v mpicc >/dev/null || {
    echo "device.sh: SKIPPED: needs a GPU (nvidia-smi), the CUDA runtime headers ($CUDA) and mpicc"
    exit 77
}
mkdir -p "$OUT"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
mpicc -O2 -Wall -o "$TMP/pmpi_device" mpi-tests/pmpi/pmpi_device.c -I"$CUDA/include" -L"$CUDA/lib64" -lcudart -lm
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --bind-to none -x LD_LIBRARY_PATH)
cuda_aware=$(ompi_info --parsable --all 2>/dev/null | sed -n 's/^mca:mpi:base:param:mpi_built_with_cuda_support:value:\(.*\)$/\1/p' | head -1)
echo "device.sh: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(nvidia-smi -L | wc -l) GPU(s); Open MPI built with CUDA support: ${cuda_aware:-unknown}"
fail=0
TIMES="$TMP/times.txt"
: >"$TIMES"

run() { # label, log, mpirun args...
    local label=$1 log=$2
    shift 2
    echo "== $label: $*"
    if "$@" >"$log" 2>&1; then
        grep -E '^(ok|FAIL|time|pmpi_device)' "$log" || true
    else
        cat "$log"
        echo "FAILED: $label"
        fail=1
    fi
    grep '^time ' "$log" >>"$TIMES" || true
}

E=1e-4
run "raw (program stages itself, no library)" "$TMP/raw.log" \
    "${MPIRUN[@]}" -n 2 "$TMP/pmpi_device" 0 --stage-self --time "$N" "$ITERS" --label raw-staged
Z=(-x LD_PRELOAD="$LIB" -x ZCOMM_ERROR_BOUND=abs:$E -x ZCOMM_CALIBRATION=fixed)
run "library, always, -n 2" "$TMP/always.log" \
    "${MPIRUN[@]}" -n 2 "${Z[@]}" -x ZCOMM_POLICY=always -x ZCOMM_REPORT="$OUT/report-always.json" \
    "$TMP/pmpi_device" $E --mixed --time "$N" "$ITERS" --label zcomm-always
run "library, always, -n 3" "$TMP/always3.log" \
    "${MPIRUN[@]}" -n 3 "${Z[@]}" -x ZCOMM_POLICY=always -x ZCOMM_REPORT="$OUT/report-always-3.json" \
    "$TMP/pmpi_device" $E --mixed
run "library, never (staged raw)" "$TMP/never.log" \
    "${MPIRUN[@]}" -n 2 "${Z[@]}" -x ZCOMM_POLICY=never "$TMP/pmpi_device" $E --time "$N" "$ITERS" --label zcomm-never
run "library, auto" "$TMP/auto.log" \
    "${MPIRUN[@]}" -n 2 "${Z[@]}" -x ZCOMM_POLICY=auto -x ZCOMM_REPORT="$OUT/report-auto.json" \
    "$TMP/pmpi_device" $E --time "$N" "$ITERS" --label zcomm-auto

# the reports: device calls compressed (ratio > 1); the mix passed through
for f in "$OUT/report-always.json" "$OUT/report-always-3.json"; do
    python3 - "$f" <<'EOF' || fail=1
import json, sys
r = json.load(open(sys.argv[1]))
t = r["total"]
bad = []
for op in ["MPI_Allreduce", "MPI_Reduce_scatter_block", "MPI_Allgather", "MPI_Bcast"]:
    o = t.get(op, {})
    if not (o.get("device", 0) > 0 and o.get("compressed", 0) > 0 and o.get("ratio", 0) > 1):
        bad.append(f"{op}: {o}")
for op in ["MPI_Sendrecv", "MPI_Send", "MPI_Isend"]:
    o = t.get(op, {})
    if not (o.get("compressed", 0) > 0 and o.get("ratio", 0) > 1):
        bad.append(f"{op} (device buffers, staged): {o}")
mix = t.get("MPI_Allreduce", {}).get("passthrough_reasons", {})
if "host buffers on some ranks, device buffers on others" not in mix:
    bad.append(f"the managed/host mix did not pass through: {mix}")
for b in bad:
    print("FAILED report", sys.argv[1], b)
if not bad:
    a = t["MPI_Allreduce"]
    print(f"report {sys.argv[1].split('/')[-1]}: device calls compressed; allreduce ratio {a['ratio']:.2f}, "
          f"{a['device']} device calls, passthrough {a['passthrough_reasons']}")
sys.exit(1 if bad else 0)
EOF
done

python3 - "$TIMES" "$OUT/pmpi-device.json" "$N" "$ITERS" <<'EOF'
import json, sys
rows = [l.split() for l in open(sys.argv[1])]
t = {}
for _, label, op, nbytes, best, med in rows:
    t.setdefault(op, {})[label] = (float(best), float(med))
labels = ["raw-staged", "zcomm-never", "zcomm-always", "zcomm-auto"]
print(f"\n{int(sys.argv[3]) * 4 / 2**20:.0f} MiB f32 per rank, 2 ranks; best (median) of {sys.argv[4]}, ms, slowest rank\n")
print("| operation | " + " | ".join(labels) + " | raw-staged / zcomm-always |")
print("|---|" + "---:|" * (len(labels) + 1))
for op, v in t.items():
    cells = [f"{v[l][0]:.2f} ({v[l][1]:.2f})" if l in v else "-" for l in labels]
    sp = v["raw-staged"][0] / v["zcomm-always"][0] if "raw-staged" in v and "zcomm-always" in v else float("nan")
    print(f"| {op} | " + " | ".join(cells) + f" | {sp:.2f}x |")
json.dump({"bytes_per_rank": int(sys.argv[3]) * 4, "iters": int(sys.argv[4]), "ranks": 2,
           "ms_best_median": t}, open(sys.argv[2], "w"), indent=1)
EOF
[ "$fail" = 0 ] && echo "device.sh: all passed" || { echo "device.sh: FAILED"; exit 1; }
