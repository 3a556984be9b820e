#!/usr/bin/env bash
# Build the multi-process tests and examples and run them under mpirun with 1, 2, 3, 4 and 8 ranks.
# Exits non-zero on any failure. Usage: mpi-tests/run.sh [extra cargo flags, e.g. --no-default-features --features mpi]
set -euo pipefail
cd "$(dirname "$0")/.."
FEATURES=("$@")
[ ${#FEATURES[@]} -eq 0 ] && FEATURES=(--no-default-features --features mpi)
cargo build --release "${FEATURES[@]}" --example mpi_ops --example allreduce --example statevector --example staging
TARGET_DIR=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
BIN="$TARGET_DIR/release/examples"
MPIRUN=(mpirun --oversubscribe)
if [ "$(id -u)" = 0 ]; then MPIRUN+=(--allow-run-as-root); fi
# keep the processes from spinning on shared cores
export OMPI_MCA_mpi_yield_when_idle=1
export ZCOMM_PROFILE="${ZCOMM_PROFILE:-$(mktemp -d)/profile.json}"
fail=0
run() {
    echo "== $*"
    if ! timeout 600 "$@"; then
        echo "FAILED: $*"
        fail=1
    fi
}
run "${MPIRUN[@]}" -n 2 "$BIN/mpi_ops"
run "${MPIRUN[@]}" -n 4 "$BIN/mpi_ops"
run "${MPIRUN[@]}" -n 1 "$BIN/mpi_ops"
run "${MPIRUN[@]}" -n 3 "$BIN/mpi_ops" --only-reduce
run "${MPIRUN[@]}" -n 8 "$BIN/mpi_ops" --only-reduce
# the examples check their own bounds and exit non-zero on a violation
run "${MPIRUN[@]}" -n 2 "$BIN/allreduce" --n 200000 --iters 2
run "${MPIRUN[@]}" -n 3 "$BIN/allreduce" --n 100001 --iters 2 --dtype f64 --error-bound abs:1e-4
run "${MPIRUN[@]}" -n 4 "$BIN/allreduce" --n 50000 --iters 2 --dtype c64
# the state-vector simulator (built-in circuits; scripts/qsim/run.sh compares with Qiskit)
run "${MPIRUN[@]}" -n 2 "$BIN/statevector" --circuit qft:16 --fidelity 0.999
run "${MPIRUN[@]}" -n 4 "$BIN/statevector" --circuit random:14 --dtype c64 --error-bound noa:1e-4 --verify
run "${MPIRUN[@]}" -n 4 "$BIN/statevector" --circuit qft:12 --error-bound rel:1e-3 --policy always
run "${MPIRUN[@]}" -n 1 "$BIN/statevector" --circuit ghz:12
run "${MPIRUN[@]}" -n 2 "$BIN/staging" --n 300000
# MPI's int-count limits scaled down (ZCOMM_MPI_PIECE bytes): the piece splitting and the ring
# fallback of messages above 2^31 bytes run on small data
run "${MPIRUN[@]}" -n 3 -x ZCOMM_MPI_PIECE=777 "$BIN/mpi_ops" --only-reduce
run "${MPIRUN[@]}" -n 2 -x ZCOMM_MPI_PIECE=4096 "$BIN/staging" --n 100000 --iters 1
# ranks that disagree on the number of calls: with ZCOMM_TIMEOUT the watchdog must end the job
# (instead of a hang), failing, within a bounded time, with a message naming the operation
expect_abort() {
    echo "== (expected to abort) $*"
    local out t0 rc took
    out=$(mktemp)
    t0=$(date +%s)
    if timeout 120 "$@" >"$out" 2>&1; then rc=0; else rc=$?; fi
    took=$(($(date +%s) - t0))
    cat "$out"
    if [ "$rc" = 0 ] || [ "$rc" = 124 ] || [ "$took" -gt 90 ] ||
        ! grep -q "zcomm: allreduce exceeded ZCOMM_TIMEOUT=2s on rank 0; aborting" "$out"; then
        echo "FAILED (exit status $rc after ${took}s; expected the watchdog's abort): $*"
        fail=1
    else
        echo "aborted by the watchdog as expected (exit status $rc after ${took}s)"
    fi
    rm -f "$out"
}
expect_abort "${MPIRUN[@]}" -n 2 -x ZCOMM_TIMEOUT=2 "$BIN/mpi_ops" --watchdog
if [ $fail -ne 0 ]; then
    echo "mpi-tests: FAILURES"
    exit 1
fi
echo "mpi-tests: all passed"
