#!/usr/bin/env bash
# cuSZ-i ratio check (issue 20): generated 2-D/3-D fields and a real climate field (the eofs
# package's example data from PyPI), every codec through `zcomm bench --dims`, cuszi against the
# order-0 entropy of Lorenzo residuals (scripts/cuszi/lorenzo_entropy.py) and the 1-D codecs.
# Installs what it needs (numpy/scipy in the Python test venv, the eofs wheel cached under
# ${ZCOMM_CI_CACHE:-$HOME/.cache}/zcomm-pip/wheels). Usage: scripts/cuszi/run.sh [--json-out FILE]
set -euo pipefail
cd "$(dirname "$0")/../.."
CACHE="${ZCOMM_CI_CACHE:-$HOME/.cache}/zcomm-pip"
WHEELS="$CACHE/wheels"
VENV="$CACHE/venv"
mkdir -p "$WHEELS"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PY="$VENV/bin/python"
if ! "$PY" -c 'import numpy, scipy' 2>/dev/null; then
    "$PY" -m pip install -q --no-index --find-links "$WHEELS" numpy scipy 2>/dev/null || {
        "$PY" -m pip download -q -d "$WHEELS" numpy scipy
        "$PY" -m pip install -q --no-index --find-links "$WHEELS" numpy scipy
    }
fi
EOFS="$WHEELS/eofs-2.0.0-py3-none-any.whl"
[ -f "$EOFS" ] || "$PY" -m pip download -q --no-deps -d "$WHEELS" eofs==2.0.0
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
"$PY" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2], [n for n in zipfile.ZipFile(sys.argv[1]).namelist() if n.endswith("hgt_djf.nc")])' "$EOFS" "$TMP/eofs"
cargo build --release --bin zcomm
TARGET_DIR=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
"$PY" scripts/cuszi/fields.py "$TMP/fields" --climate "$TMP/eofs/eofs/examples/example_data" >/dev/null
"$PY" scripts/cuszi/ratio_check.py "$TARGET_DIR/release/zcomm" "$TMP/fields" "$@"
