#!/usr/bin/env bash
# GPU benchmark + bit-identity tests on the GPU machine (no Rust there: build here, carry binaries).
#
# Here (repository root):
#   mkdir -p .devgpu && cargo build --release --bin zcomm && cargo test --release --test gpu --no-run
#   cp target/release/deps/gpu-<hash> .devgpu/gpu && cp target/release/zcomm .devgpu/ && strip .devgpu/*
#   cp ../shared/tools/device-env.sh bench/gpu/gen_fields.py bench/gpu/run-h100.sh .devgpu/
#   (.devgpu is listed in .git/info/exclude)
# There (device tool, carry [".devgpu"]):
#   bash .devgpu/run-h100.sh            # env: NCU=1 (profile), VARIANTS="8 16/3" (warps[/min blocks per SM]), NO_TESTS=1, NO_FULL=1, CLI=1
#     DVARIANTS="default PF_FASTQ=0:PF_VEC=0 ZC_ONEPASS=1@16/3" (kernel -D switches, ':' between defines,
#       optional @warps/minblocks; ZCOMM_GPU_DEFINES), FULL_DEFINES="..." (defines for the full bench),
#     VCODECS=aatrox,pfpl (codecs of the variant runs), CODECS=... (full bench), FILES=grf,grf_thr,uniform,resnet50,
#     VFILES=/tmp/f/uniform.f32:f32:uniform,... (inputs of the variant runs), LIBTESTS="pfpl::gpu_tests" (lib unit tests to run from tests/zcomm), BOUNDS=noa:1e-2,noa:1e-3,noa:1e-4
# Writes $OUT/tests.log, $OUT/bench.json (the records committed under bench/results/), bench.log.
cd "$(dirname "$0")"
source ./device-env.sh
export ZCOMM_CACHE_DIR=/tmp/zc RUST_BACKTRACE=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv | tee $OUT/gpu.txt
T0=$(date +%s)
if [ -z "$NO_TESTS" ]; then
timeout ${TEST_TIMEOUT:-200} ./gpu --test-threads=3 ${TESTS:-} 2>&1 | tail -40 | tee $OUT/tests.log
[ -n "$LIBTESTS" ] && timeout ${TEST_TIMEOUT:-200} ./zcomm-lib $LIBTESTS --test-threads=2 2>&1 | tail -30 | tee -a $OUT/tests.log
echo "tests took $(( $(date +%s) - T0 )) s"
fi
[ -n "$NO_BENCH" ] && exit 0
[ -f /tmp/f/grf.f32 ] || python3 gen_fields.py /tmp/f 2>&1 | tee $OUT/gen.log
B() { timeout ${BENCH_TIMEOUT:-300} ./gpu --ignored bench_files --nocapture 2>&1 | grep -v "^test \|^running\|^$"; }
for V in $VARIANTS; do
  W=${V%/*}; M=${V#*/}; [ "$M" = "$V" ] && M=
  echo "== ZC_WARPS=$W ZC_MINB=${M:-default}"
  ZCOMM_GPU_WARPS=$W ZCOMM_GPU_MINB=$M ZCOMM_BENCH_RUNS=10 ZCOMM_BENCH_FILES=/tmp/f/grf.f32:f32:grf512 ZCOMM_BENCH_BOUNDS=noa:1e-3 ZCOMM_BENCH_CODECS=aatrox,cuszp-plain ZCOMM_BENCH_JSON=$OUT/w$W-$M.json B | tee -a $OUT/variants.log
done
for V in $DVARIANTS; do
  WM=; case $V in *@*) WM=${V#*@}; V=${V%@*};; esac
  W=${WM%/*}; M=${WM#*/}; [ "$M" = "$WM" ] && M=
  D=${V//:/ }; [ "$V" = default ] && D=
  echo "== ZCOMM_GPU_DEFINES='$D' warps=${W:-16} minb=${M:-default}"
  ZCOMM_GPU_WARPS=$W ZCOMM_GPU_MINB=$M ZCOMM_GPU_DEFINES="$D" ZCOMM_BENCH_RUNS=10 ZCOMM_BENCH_FILES=${VFILES:-/tmp/f/grf.f32:f32:grf512} ZCOMM_BENCH_BOUNDS=noa:1e-3 ZCOMM_BENCH_CODECS=${VCODECS:-aatrox,pfpl} ZCOMM_BENCH_JSON=$OUT/d-${V//[:=]/_}${WM:+-w${WM//\//_}}.json B | tee -a $OUT/variants.log
done
[ -n "$NO_FULL" ] && { echo "total $(( $(date +%s) - T0 )) s"; exit 0; }
echo "== full bench"
declare -A NAME=([grf]=grf512 [grf_thr]=grf512-thr84 [uniform]=uniform [resnet50]=resnet50-grad)
F=
FILES=${FILES:-grf,grf_thr,uniform,resnet50}
for f in ${FILES//,/ }; do [ -f /tmp/f/$f.f32 ] && F=$F${F:+,}/tmp/f/$f.f32:f32:${NAME[$f]}; done
ZCOMM_GPU_DEFINES="$FULL_DEFINES" ZCOMM_BENCH_CODECS=${CODECS:-aatrox,cuszp-plain,cuszp-outlier,pfpl} ZCOMM_BENCH_BOUNDS=${BOUNDS:-noa:1e-2,noa:1e-3,noa:1e-4} \
  ZCOMM_BENCH_FILES=$F ZCOMM_BENCH_JSON=$OUT/bench.json B | tee $OUT/bench.log
echo "bench done at $(( $(date +%s) - T0 )) s"
if [ -n "$NCU" ] && command -v ncu >/dev/null; then
  ZCOMM_BENCH_RUNS=1 ZCOMM_BENCH_FILES=/tmp/f/grf.f32:f32:grf512 ZCOMM_BENCH_BOUNDS=noa:1e-3 ZCOMM_BENCH_CODECS=${NCU_CODEC:-aatrox} ZCOMM_BENCH_JSON=/tmp/x.json \
    timeout 150 ncu -k regex:"${NCU_KERNELS:-zc_(de)?compress_f32_aatrox}" -c 8 --section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis ${NCU_EXTRA:-} \
    ./gpu --ignored bench_files --nocapture > $OUT/ncu.txt 2>&1
  grep -E "zc_|Throughput|Duration|Occupancy|Stall|Warp Cycles|Issued|Eligible|Registers|Block Limit" $OUT/ncu.txt | head -80
fi
if [ -n "$CLI" ]; then
  echo "== CLI --device gpu (host-to-host through src/bin/zcomm/device.rs)"
  timeout 120 ./zcomm bench --device gpu -i /tmp/f/grf.f32 --dtype f32 --error-bound noa:1e-3 --codec aatrox --runs 5 2>&1 | tail -5
  ./zcomm compress --device gpu -i /tmp/f/grf.f32 --dtype f32 --error-bound noa:1e-3 -o /tmp/g.zc 2>&1 | tail -2
  ./zcomm compress --device cpu -i /tmp/f/grf.f32 --dtype f32 --error-bound noa:1e-3 -o /tmp/c.zc 2>&1 | tail -2
  cmp /tmp/g.zc /tmp/c.zc && echo "CLI gpu stream == cpu stream"
fi
echo "total $(( $(date +%s) - T0 )) s"
