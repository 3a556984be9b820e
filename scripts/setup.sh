#!/usr/bin/env bash
# Install what building and testing zcomm needs on a Debian/Ubuntu machine, skipping what is there:
# Open MPI (headers, mpicc, mpirun), libclang (bindgen for the mpi crate), a C toolchain,
# pkg-config, python3 + pip (for NVRTC), and a Rust toolchain with rustfmt and clippy.
# Source it (`. scripts/setup.sh`) so that PATH changes stick.
set -euo pipefail

_zc_sudo() {
    if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
        echo "setup: need root (or sudo) to run: $*" >&2
        return 1
    fi
}

_zc_missing=()
_zc_need() { dpkg -s "$1" >/dev/null 2>&1 || _zc_missing+=("$1"); }
_zc_need libopenmpi-dev
_zc_need openmpi-bin
_zc_need libclang-dev
command -v pkg-config >/dev/null || _zc_need pkg-config
{ command -v cc >/dev/null && command -v make >/dev/null; } || _zc_need build-essential
command -v python3 >/dev/null || _zc_need python3
# pip may come from elsewhere (pyenv, a venv): install Debian's only when python3 has none
python3 -m pip --version >/dev/null 2>&1 || _zc_need python3-pip
_zc_list="${_zc_missing[*]}"
if [ -n "$_zc_list" ]; then
    echo "setup: installing $_zc_list"
    _zc_sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q
    # shellcheck disable=SC2086
    _zc_sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $_zc_list
else
    echo "setup: system packages present"
fi

if ! command -v cargo >/dev/null; then
    if [ -x "$HOME/.cargo/bin/cargo" ]; then
        export PATH="$HOME/.cargo/bin:$PATH"
    else
        echo "setup: installing Rust with rustup"
        command -v curl >/dev/null || _zc_sudo apt-get install -y -q curl ca-certificates
        curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal -c rustfmt -c clippy
        export PATH="$HOME/.cargo/bin:$PATH"
    fi
fi
if command -v rustup >/dev/null; then
    for c in rustfmt clippy; do
        rustup component list --installed 2>/dev/null | grep -q "^$c" || rustup component add "$c"
    done
fi
echo "setup: $(cargo --version), $(mpirun --version 2>/dev/null | head -1)"
