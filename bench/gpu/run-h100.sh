#!/usr/bin/env bash
# GPU benchmark + bit-identity tests on the GPU machine (no Rust there: build here, carry binaries).
#
# Here (repository root):
#   mkdir -p .devgpu && cargo build --release --bin zcomm && cargo test --release --test gpu --no-run
#   cp target/release/deps/gpu-<hash> .devgpu/gpu && cp target/release/zcomm .devgpu/ && strip .devgpu/*
#   cp ../shared/tools/device-env.sh bench/gpu/gen_fields.py bench/gpu/run-h100.sh .devgpu/
#   (.devgpu is listed in .git/info/exclude)
# There (device tool, carry [".devgpu"]):
#   bash .devgpu/run-h100.sh            # env: NCU=1 (profile), NO_TESTS=1, NO_FULL=1, CLI=1,
#     CODECS=... (full bench), FILES=grf,grf_thr,uniform,resnet50,
#     LIBTESTS="pfpl::gpu_tests" (lib unit tests to run from tests/zcomm), BOUNDS=noa:1e-2,noa:1e-3,noa:1e-4
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
[ -n "$NO_FULL" ] && { echo "total $(( $(date +%s) - T0 )) s"; exit 0; }
echo "== full bench"
declare -A NAME=([grf]=grf512 [grf_thr]=grf512-thr84 [uniform]=uniform [resnet50]=resnet50-grad)
F=
FILES=${FILES:-grf,grf_thr,uniform,resnet50}
for f in ${FILES//,/ }; do [ -f /tmp/f/$f.f32 ] && F=$F${F:+,}/tmp/f/$f.f32:f32:${NAME[$f]}; done
ZCOMM_BENCH_CODECS=${CODECS:-aatrox,cuszp-plain,cuszp-outlier,pfpl} ZCOMM_BENCH_BOUNDS=${BOUNDS:-noa:1e-2,noa:1e-3,noa:1e-4} \
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
