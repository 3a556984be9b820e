#!/usr/bin/env bash
# Static view of the CUDA kernels on a machine without a GPU: compile a kernels/*.cu file as
# NVRTC does at run time (same options, sm_90 by default) with nvcc from PyPI, and print each
# kernel's registers, stack (spills), shared memory and instruction count, and, with --loops,
# its loops (a backward branch) with their static sizes. Counting instructions of a loop body
# here before and after a change tells what a change does to an issue-bound kernel before any
# GPU time is spent (the GPU still decides: measure there).
set -euo pipefail

usage() {
  cat <<'EOF'
usage: scripts/kernel-sass.sh [--arch sm_90] [--loops] [--sass DIR] FILE.cu [KERNEL ...]

  FILE.cu     a file of kernels/ (its #include "common.cuh" is resolved there)
  KERNEL      kernel names (extern "C", e.g. cz_tiles_f32); default: every kernel
  --arch A    target architecture (default sm_90: H100 and H200)
  --loops     also list each kernel's loops: address, target, static instructions
  --sass DIR  also write each kernel's SASS to DIR/KERNEL.sass

nvcc is not NVRTC: it accepts code that NVRTC's JIT mode rejects (a generic lambda in device
code, for one), so run the NVRTC compile test (`cargo test --test gpu_cuszi cuszi_kernels_compile`
and the like) before taking a change to the GPU.

Tools: nvidia-cuda-nvcc 13.0.88 (as the GPU machines' CUDA 13.0), nvvm and crt of the same
release, cuobjdump and nvdisasm, installed once under $ZCOMM_CUDA_TOOLS (default
~/.cache/zcomm-cuda-tools) from PyPI.

examples:
  scripts/kernel-sass.sh kernels/cuszi.cu cz_tiles_f32 cz_enc_tiles_nh_f32
  scripts/kernel-sass.sh --loops --sass /tmp/sass kernels/blocked.cu zc_compress_f32
EOF
}

arch=sm_90
loops=0
sass_dir=
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --arch) arch=$2; shift 2 ;;
    --loops) loops=1; shift ;;
    --sass) sass_dir=$2; shift 2 ;;
    -*) echo "unknown option $1" >&2; usage >&2; exit 2 ;;
    *) break ;;
  esac
done
[ $# -ge 1 ] || { usage >&2; exit 2; }
src=$1; shift
[ -f "$src" ] || { echo "no such file: $src" >&2; exit 2; }

tools=${ZCOMM_CUDA_TOOLS:-$HOME/.cache/zcomm-cuda-tools}
bin="$tools/nvidia/cu13/bin"
if [ ! -x "$bin/nvdisasm" ] || [ ! -x "$bin/nvcc" ]; then
  echo "installing nvcc, cuobjdump and nvdisasm into $tools (once)" >&2
  python3 -m pip install -q --no-deps --target "$tools" \
    nvidia-cuda-nvcc==13.0.88 "nvidia-nvvm==13.0.*" "nvidia-cuda-crt==13.0.*" \
    "nvidia-cuda-runtime==13.0.*" nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm >&2
fi
export PATH="$bin:$PATH"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# the options of src/gpu/compile.rs NVRTC_OPTIONS
(cd "$(dirname "$src")" && nvcc -cubin -arch="$arch" --fmad=false -prec-div=true -std=c++17 \
  -o "$work/k.cubin" "$(basename "$src")")

if [ $# -eq 0 ]; then
  mapfile -t kernels < <(cuobjdump -res-usage "$work/k.cubin" | sed -n 's/^ *Function \([^:]*\):.*/\1/p' | sort)
else
  kernels=("$@")
fi
[ -n "$sass_dir" ] && mkdir -p "$sass_dir"
printf '%-34s %5s %6s %8s %7s\n' kernel regs stack shared instr
for k in "${kernels[@]}"; do
  res=$(cuobjdump -res-usage "$work/k.cubin" | grep -A1 "Function $k:" | tail -1 || true)
  if [ -z "$res" ]; then echo "$k: no such kernel in $src" >&2; exit 1; fi
  cuobjdump -sass -fun "$k" "$work/k.cubin" > "$work/$k.sass"
  [ -n "$sass_dir" ] && cp "$work/$k.sass" "$sass_dir/$k.sass"
  n=$(grep -cE '^ +/\*[0-9a-f]{4,}\*/' "$work/$k.sass" || true)
  reg=$(sed -n 's/.*REG:\([0-9]*\).*/\1/p' <<<"$res")
  stack=$(sed -n 's/.*STACK:\([0-9]*\).*/\1/p' <<<"$res")
  shared=$(sed -n 's/.*SHARED:\([0-9]*\).*/\1/p' <<<"$res")
  printf '%-34s %5s %6s %8s %7s\n' "$k" "$reg" "$stack" "$shared" "$n"
  if [ "$loops" = 1 ]; then
    # a loop: a branch to an earlier address; its static size is the distance in instructions
    python3 - "$work/$k.sass" <<'PY'
import re, sys
for line in open(sys.argv[1]):
    m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
    if m and "BRA" in m.group(2):
        t = re.search(r"0x([0-9a-f]+)", m.group(2))
        a = int(m.group(1), 16)
        if t and int(t.group(1), 16) <= a:
            print(f"    loop {a:05x} -> {int(t.group(1), 16):05x}: {(a - int(t.group(1), 16)) // 16 + 1} instructions")
PY
  fi
done
