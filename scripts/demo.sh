#!/usr/bin/env bash
# THE demo command (README): installs what it needs, builds in release mode and runs the
# gradient-averaging `allreduce` example on 2 MPI ranks. Without a GPU (or without CUDA libraries)
# the example uses the CPU codec. The column names are followed by a one-line legend (speedup, pred err,
# [Compressed]/[Raw], auto rows) and ends with a verdict line (every bound held, or violated).
# Extra arguments go to the example, e.g.
#   scripts/demo.sh --input /path/field.f32 --dtype f32 --error-bound noa:1e-3
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/setup.sh
. scripts/setup.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cargo build --release --example allreduce --bin zcomm
bin="$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')/release"
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
    echo "demo: GPU found: $(nvidia-smi -L | head -1)"
else
    echo "demo: no GPU: the allreduce example runs the CPU codec"
fi
mpirun_args=(-n 2 --oversubscribe)
[ "$(id -u)" = 0 ] && mpirun_args+=(--allow-run-as-root)
set -x
exec mpirun "${mpirun_args[@]}" "$bin/examples/allreduce" "$@"
