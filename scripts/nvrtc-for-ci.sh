#!/usr/bin/env bash
# Make NVRTC (libnvrtc.so.13) available on a machine without a GPU, so CI can compile every kernel.
# Pinned to 13.0.88: the GPU machines run CUDA 13.0 (driver 580), which cannot load PTX from a newer
# NVRTC (13.5 emits PTX .version 9.5). Prints the directory to put on LD_LIBRARY_PATH:
#   export LD_LIBRARY_PATH="$(scripts/nvrtc-for-ci.sh)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# Installs into $ZCOMM_NVRTC_DIR (default ~/.cache/zcomm-nvrtc) once; later calls only print.
set -euo pipefail
dest=${ZCOMM_NVRTC_DIR:-$HOME/.cache/zcomm-nvrtc}
lib="$dest/nvidia/cu13/lib"
if [ ! -e "$lib/libnvrtc.so.13" ]; then
  python3 -m pip install -q --disable-pip-version-check --no-deps --target "$dest" \
    nvidia-cuda-nvrtc==13.0.88 >&2
fi
echo "$lib"
