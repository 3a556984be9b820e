#!/usr/bin/env bash
# THE test command (README, CI): installs what it needs, then runs every CPU check:
# rustfmt, clippy (-D warnings), the whole test suite with all features and with none, rustdoc,
# the multi-process tests under mpirun (2 and 4 ranks and more, see mpi-tests/run.sh), and the
# Python package (scripts/test-python.sh: pip install ./python, pytest).
# GPU and NCCL tests are reported as ignored ("skipped: no CUDA device") on machines without a device, not as
# passed; NVRTC is installed anyway so that every kernel is compiled.
set -euo pipefail
cd "$(dirname "$0")/.."

start=$(date +%s)
step() {
    echo
    echo "=== [$(($(date +%s) - start))s] $*"
}

step "setup"
# shellcheck source=scripts/setup.sh
. scripts/setup.sh
if nvrtc_lib=$(scripts/nvrtc-for-ci.sh); then
    export LD_LIBRARY_PATH="$nvrtc_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "NVRTC: $nvrtc_lib"
else
    echo "warning: could not install NVRTC: kernels will not be compiled by the GPU tests" >&2
fi
export CARGO_TERM_COLOR=never
# Open MPI as root (CI containers) and oversubscribed ranks on 2 cores
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
# proptest: 256 cases per property (PROPTEST_CASES overrides)

log=$(mktemp)
trap 'rm -f "$log"' EXIT
failed=()
# run one check; keep going on failure so that one run reports every problem
check() {
    local name=$1
    shift
    step "$name"
    if ! "$@" 2>&1 | tee -a "$log"; then
        failed+=("$name")
        echo "FAILED: $name"
    fi
}

check "cargo fmt --check" cargo fmt --all --check
check "cargo clippy --workspace --all-targets --all-features -- -D warnings" \
    cargo clippy --workspace --all-targets --all-features -- -D warnings
check "cargo test --release --workspace --all-features" \
    cargo test --release --workspace --all-features --no-fail-fast
# in a target directory of its own: in the shared one this build would replace
# target/release/zcomm with a binary without CUDA (`--device gpu` would then fail after a test run)
check "cargo test --release --no-default-features" \
    cargo test --release --no-default-features --no-fail-fast \
    --target-dir "${CARGO_TARGET_DIR:-target}/no-default"
# a broken or private intra-doc link is an error, as clippy's warnings are
check "cargo doc --no-deps --all-features (warnings denied)" \
    env RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --all-features
if [ -f mpi-tests/run.sh ]; then
    check "mpi-tests/run.sh (mpirun -n 1, 2, 3, 4, 8)" bash mpi-tests/run.sh --all-features
else
    step "mpi-tests/run.sh not present: skipped"
fi
check "mpi-tests/pmpi/run.sh (PMPI: unmodified C, Fortran and mpi4py under mpirun -n 1-4, corrupted messages, local Slurm)" \
    bash mpi-tests/pmpi/run.sh
check "scripts/qsim/run.sh (state vectors against Qiskit, mpirun -n 2 and 4)" \
    env QSIM_CARGO_FLAGS=--all-features bash scripts/qsim/run.sh
check "python package (pytest)" bash scripts/test-python.sh
check "scripts/cuszi/run.sh (cuSZ-i ratio against the Lorenzo entropy estimate and the 1-D codecs)" \
    bash scripts/cuszi/run.sh

# one closing line over every cargo test run (+ every failed check)
read -r passed nfailed ignored < <(awk '/^test result:/ {
        for (i = 1; i <= NF; i++) {
            if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i; if ($(i+1) ~ /^ignored/) g += $i
        }
    } END { print p + 0, f + 0, g + 0 }' "$log")
echo
if [ ${#failed[@]} -ne 0 ]; then
    echo "=== [$(($(date +%s) - start))s] FAILED checks: ${failed[*]}"
    echo "tests: $passed passed, $((nfailed + ${#failed[@]})) failed, $ignored skipped"
    exit 1
fi
echo "=== [$(($(date +%s) - start))s] all checks passed"
echo "tests: $passed passed, 0 failed, $ignored skipped"
