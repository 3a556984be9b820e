#!/usr/bin/env bash
# Run the zcomm MPI examples as benchmarks. Used by the sbatch scripts and on a single GPU host.
#   usage: slurm/run-benchmarks.sh LAUNCHER BIN_DIR OUT_DIR
#   LAUNCHER: the MPI launcher with its rank count, quoted, e.g. "srun --mpi=pmix" or
#             "mpirun -n 2 --bind-to none -x LD_LIBRARY_PATH -x ZCOMM_PROFILE"
#   BIN_DIR:  folder holding examples/{staging,allreduce,statevector}
# Environment: ZCOMM_BENCH_VALUES (f32 values per rank, default 268435456 = 1 GiB),
#              ZCOMM_BENCH_BOUND (default noa:1e-3), ZCOMM_BENCH_ITERS (default 3),
#              ZCOMM_BENCH_QUBITS (statevector: qubits of the QFT circuit, default 26).
set -uo pipefail
launch=$1; bin=$2; out=$3
mkdir -p "$out"
n=${ZCOMM_BENCH_VALUES:-268435456}
bound=${ZCOMM_BENCH_BOUND:-noa:1e-3}
iters=${ZCOMM_BENCH_ITERS:-3}
fail=0
step() {
    local name=$1; shift
    echo "== $name: $*"
    $launch "$@" 2>&1 | tee "$out/$name.txt"
    [ "${PIPESTATUS[0]}" = 0 ] || fail=1
}
# GPU staging + staged device exchange (falls back to host buffers without a GPU)
step staging "$bin/examples/staging" --n "$n" --error-bound "$bound" --iters "$iters" \
    --pingpong-mib 256 --json "$out/staging.jsonl"
# gradient averaging (host buffers, GPU codec when present)
gpu=""; command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 && gpu="--gpu"
step allreduce "$bin/examples/allreduce" --n $((n / 4)) --error-bound "$bound" --iters 2 $gpu
# distributed state-vector simulation (needs a power-of-two rank count; CPU gates, compressed swaps)
step statevector "$bin/examples/statevector" --circuit "qft:${ZCOMM_BENCH_QUBITS:-26}" --dtype c64 \
    --fidelity 0.999 --json "$out/statevector.json"
exit $fail
