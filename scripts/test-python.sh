#!/usr/bin/env bash
# Python package tests: builds and installs `pip install ./python` into a venv and runs pytest on
# python/tests (codec round trips, bad input, 2-process gloo DDP and FSDP training). Installs what
# it needs itself; wheels are cached under ${ZCOMM_CI_CACHE:-$HOME/.cache}/zcomm-pip so reruns are offline.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${ZCOMM_CI_CACHE:-$HOME/.cache}/zcomm-pip"
WHEELS="$CACHE/wheels"
VENV="$CACHE/venv"
PY="${PYTHON:-python3}"
PKGS=(torch numpy scikit-learn pytest maturin)
mkdir -p "$WHEELS"

if ! "$PY" -m venv --help >/dev/null 2>&1 || ! "$PY" -c 'import ensurepip' >/dev/null 2>&1; then
  echo "test-python: installing python3-venv"
  (apt-get update -qq && apt-get install -y -qq python3-venv python3-pip) >/dev/null
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip)

# offline from the cache when it has everything, else fill it from the package index first
if ! "${PIP[@]}" install -q --no-index --find-links "$WHEELS" "${PKGS[@]}" 2>/dev/null; then
  echo "test-python: downloading wheels into $WHEELS (torch is large: once)"
  "${PIP[@]}" download -q -d "$WHEELS" "${PKGS[@]}"
  "${PIP[@]}" install -q --no-index --find-links "$WHEELS" "${PKGS[@]}"
fi

# the package itself, exactly as a user installs it (needs cargo; builds without MPI or CUDA)
command -v cargo >/dev/null || { echo "test-python: cargo not found" >&2; exit 1; }
"${PIP[@]}" install -q --no-index --find-links "$WHEELS" --force-reinstall --no-deps ./python

# run from outside the source tree so that the installed package is the one imported
cd /tmp
set +e
"$VENV/bin/python" -m pytest -q -rs -p no:cacheprovider "$OLDPWD/python/tests"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "test-python: pytest collected no tests: failing" >&2
  exit 1
fi
exit "$rc"
