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
# The ROCm platform on this GPU (rocm-on-cuda): its twins, kernels and GEMMs through the same harness.
"$BUILD/bin/test_methods" --gtest_filter='Rocm/*' > "$OUT/test_methods_rocm.txt" 2>&1 || rc=1
"$BUILD/bin/test_oracle" --gtest_filter='*rocm*' > "$OUT/test_oracle_rocm.txt" 2>&1 || rc=1
[ -x "$BUILD/bin/test_rocm_gemm" ] && { "$BUILD/bin/test_rocm_gemm" > "$OUT/test_rocm_gemm.txt" 2>&1 || rc=1; }
# NaN isolation and bad batches on every platform this GPU runs (CPU, CUDA, ROCm).
"$BUILD/bin/test_nan_isolation" > "$OUT/test_nan_isolation.txt" 2>&1 || rc=1
"$BUILD/bin/test_bad_batches" > "$OUT/test_bad_batches.txt" 2>&1 || rc=1
tail -n 3 "$OUT/test_methods_rocm.txt" "$OUT/test_oracle_rocm.txt" "$OUT/test_nan_isolation.txt" "$OUT/test_bad_batches.txt"
for p in cuda rocm; do
  "$BUILD/bin/mla" demo --model tests/data/v3_tiny --platform $p > "$OUT/demo_$p.txt" 2>&1 || rc=1
  cat "$OUT/demo_$p.txt"
done
# Whole V3 layers: the ROCm twins on this GPU against the CUDA platform (JSON).
"$BUILD/bin/mla" bench --rocm-vs-cuda $quick > "$OUT/rocm_vs_cuda.json" 2> "$OUT/rocm_vs_cuda.err" || rc=1
echo "gpu_check: rc=$rc"
exit $rc
