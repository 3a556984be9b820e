#!/usr/bin/env bash
# Check the statevector example against Qiskit: generate QFT, GHZ, QAOA and random layered
# circuits as OpenQASM 2 with Qiskit, simulate them under mpirun with 2 and 4 ranks, and compare
# each --dump-state with qiskit.quantum_info.Statevector:
#   - uncompressed (--policy never, c128): fidelity >= 1 - 1e-10;
#   - compressed (--policy always, --fidelity F, c128 and c64): fidelity >= F.
# Then bad QASM (unknown gate, qubit out of range, syntax error) must fail on every rank with an
# error naming the line. Exits non-zero on any failure.
#
# Usage: scripts/qsim/run.sh [QUBITS...]   (default: 16 18)
# Qiskit is installed into a venv under ${ZCOMM_CI_CACHE:-$HOME/.cache}/zcomm-qsim-venv.
# Extra cargo flags: QSIM_CARGO_FLAGS (default: --no-default-features --features mpi).
set -euo pipefail
cd "$(dirname "$0")/../.."
SIZES=("$@")
[ ${#SIZES[@]} -eq 0 ] && SIZES=(16 18)
FID=0.999
start=$(date +%s)

VENV="${ZCOMM_CI_CACHE:-$HOME/.cache}/zcomm-qsim-venv"
if ! "$VENV/bin/python" -c "import qiskit, numpy" 2>/dev/null; then
    echo "== installing qiskit into $VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet qiskit numpy
fi
PY="$VENV/bin/python"

read -r -a CARGO_FLAGS <<<"${QSIM_CARGO_FLAGS:---no-default-features --features mpi}"
cargo build --release "${CARGO_FLAGS[@]}" --example statevector
TARGET_DIR=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
BIN="$TARGET_DIR/release/examples/statevector"
MPIRUN=(mpirun --oversubscribe)
if [ "$(id -u)" = 0 ]; then MPIRUN+=(--allow-run-as-root); fi
export OMPI_MCA_mpi_yield_when_idle=1
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export ZCOMM_PROFILE="${ZCOMM_PROFILE:-$WORK/profile.json}"

"$PY" scripts/qsim/gen.py "$WORK" "${SIZES[@]}"

fail=0
run() {
    echo "== $*"
    if ! timeout 300 "$@" >"$WORK/last.out" 2>&1; then
        cat "$WORK/last.out"
        echo "FAILED: $*"
        fail=1
    else
        # the per-exchange table is long: show the summary lines
        grep -E "^(statevector|bound|total|fidelity|verdict)" "$WORK/last.out" || true
    fi
}
: >"$WORK/manifest"
for n in "${SIZES[@]}"; do
    for c in qft ghz qaoa random; do
        q="$WORK/${c}_$n.qasm"
        for np in 2 4; do
            b="$WORK/${c}_${n}_np$np"
            run "${MPIRUN[@]}" -n "$np" "$BIN" --qasm "$q" --policy never \
                --dump-state "$b.exact.bin" --json "$b.exact.json"
            echo "$q $b.exact.bin c128 0.9999999999 $b.exact.json" >>"$WORK/manifest"
            run "${MPIRUN[@]}" -n "$np" "$BIN" --qasm "$q" --policy always --fidelity $FID \
                --dump-state "$b.zc.bin" --json "$b.zc.json"
            echo "$q $b.zc.bin c128 $FID $b.zc.json" >>"$WORK/manifest"
        done
    done
    # single precision, compressed, on the circuits with most exchanges
    for c in qft random; do
        q="$WORK/${c}_$n.qasm"
        b="$WORK/${c}_${n}_np4_c64"
        run "${MPIRUN[@]}" -n 4 "$BIN" --qasm "$q" --dtype c64 --policy always --fidelity $FID \
            --dump-state "$b.zc.bin" --json "$b.zc.json"
        echo "$q $b.zc.bin c64 $FID $b.zc.json" >>"$WORK/manifest"
    done
done
echo "== compare with qiskit.quantum_info.Statevector"
if ! "$PY" scripts/qsim/compare.py "$WORK/manifest"; then
    fail=1
fi

# bad QASM: a non-zero exit, and every rank names the line, before any exchange
bad() {
    local line=$1 what=$2 body=$3
    printf 'OPENQASM 2.0;\ninclude "qelib1.inc";\nqreg q[4];\nh q[0];\n%b' "$body" >"$WORK/bad.qasm"
    echo "== bad QASM ($what): expect 'line $line' from both ranks"
    if "${MPIRUN[@]}" -n 2 "$BIN" --qasm "$WORK/bad.qasm" >"$WORK/bad.out" 2>&1; then
        cat "$WORK/bad.out"
        echo "FAILED: accepted a bad circuit ($what)"
        fail=1
    elif [ "$(grep -o "bad.qasm: line $line: [^:]*$what" "$WORK/bad.out" | wc -l)" != 2 ]; then
        cat "$WORK/bad.out"
        echo "FAILED: expected 2 ranks to report line $line ($what)"
        fail=1
    else
        grep -m1 "line $line" "$WORK/bad.out"
    fi
}
bad 6 "unknown gate" 'cx q[0], q[1];\nfoo q[1];\n'
bad 7 "out of range" 'cx q[0], q[1];\ncx q[1],\n q[4];\n'
bad 5 "expected" 'rz(pi/2 q[1];\n'
bad 6 "measure" 'creg c[4];\nmeasure q -> c;\n'

echo "qsim: $(($(date +%s) - start))s"
if [ $fail -ne 0 ]; then
    echo "qsim: FAILURES"
    exit 1
fi
echo "qsim: all passed"
