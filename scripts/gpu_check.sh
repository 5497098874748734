#!/usr/bin/env bash
# Runs every GPU test and the CUDA benchmark on a machine with an NVIDIA GPU, writing results
# under $OUT (default ./gpu-results). Uses a build made elsewhere when BUILD points to one
# (binaries carried to the GPU machine), else builds here.
#   BUILD=build OUT=/tmp/out bash scripts/gpu_check.sh [--quick]
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
OUT=${OUT:-gpu-results}
mkdir -p "$OUT"
quick=""
[ "${1:-}" = "--quick" ] && quick="--quick"
if [ ! -x "$BUILD/bin/mla" ]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release && cmake --build "$BUILD" -j "$(nproc)" || exit 1
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
rc=0
"$BUILD/bin/mla" bench $quick > "$OUT/bench.json" 2> "$OUT/bench.err" || rc=1
tail -n 5 "$OUT/bench.err"
# The reference harness and the HF oracle cases, on the GPU (the CPU cases run in CI).
export MLA_TEST_DATA="$PWD/tests/data" MLA_CUDA_POISON=1
"$BUILD/bin/test_methods" --gtest_filter='Cuda/*' > "$OUT/test_methods_cuda.txt" 2>&1 || rc=1
"$BUILD/bin/test_oracle" --gtest_filter='*cuda*' > "$OUT/test_oracle_cuda.txt" 2>&1 || rc=1
tail -n 3 "$OUT/test_methods_cuda.txt" "$OUT/test_oracle_cuda.txt"
"$BUILD/bin/mla" demo --model tests/data/v3_tiny --platform cuda > "$OUT/demo_cuda.txt" 2>&1 || rc=1
cat "$OUT/demo_cuda.txt"
echo "gpu_check: rc=$rc"
exit $rc
