#!/usr/bin/env bash
# Runs every GPU test and the CUDA benchmark on a machine with an NVIDIA GPU, writing results
# under $OUT (default ./gpu-results). Uses a build made elsewhere when BUILD points to one
# (binaries carried to the GPU machine), else builds here.
#   BUILD=build OUT=/tmp/out bash scripts/gpu_check.sh [--quick]
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
# Libraries carried beside binaries built elsewhere (scripts/bundle_libs.sh BUILD/bundled-libs ...).
[ -d "$BUILD/bundled-libs" ] && export LD_LIBRARY_PATH="$(cd "$BUILD/bundled-libs" && pwd):${LD_LIBRARY_PATH:-}"
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
# Runs one test binary into $OUT/NAME.txt. A GPU check that skipped is a failed GPU check: rc=1 when a
# test failed, when none ran, or when any case SKIPPED (every case run here has its platform).
gtest() {
  local name=$1; shift
  "$@" > "$OUT/$name.txt" 2>&1 || rc=1
  if grep -q '^\[  SKIPPED \]' "$OUT/$name.txt"; then
    echo "gpu_check: $name skipped cases (their GPU platform was not there):"
    grep '^\[  SKIPPED \]' "$OUT/$name.txt" | head -n 5
    rc=1
  fi
  grep -q '^\[  PASSED  \] [1-9]' "$OUT/$name.txt" || { echo "gpu_check: $name passed no test"; rc=1; }
  tail -n 3 "$OUT/$name.txt"
}
# The reference harness and the HF oracle cases, on the GPU (the CPU cases run in CI).
export MLA_TEST_DATA="$PWD/tests/data" MLA_CUDA_POISON=1
gtest test_methods_cuda "$BUILD/bin/test_methods" --gtest_filter='Cuda/*'
gtest test_oracle_cuda "$BUILD/bin/test_oracle" --gtest_filter='*cuda*'
# The ROCm platform on this GPU (rocm-on-cuda): its twins, kernels and GEMMs through the same harness.
gtest test_methods_rocm "$BUILD/bin/test_methods" --gtest_filter='Rocm/*'
gtest test_oracle_rocm "$BUILD/bin/test_oracle" --gtest_filter='*rocm*'
if [ -x "$BUILD/bin/test_rocm_gemm" ]; then gtest test_rocm_gemm "$BUILD/bin/test_rocm_gemm"
else echo "gpu_check: $BUILD/bin/test_rocm_gemm is missing"; rc=1; fi
# One device plan per step: a decode step copies its plan once and never waits; a layer gives the
# same bits with and without a step (CUDA and ROCm).
gtest test_step_plan "$BUILD/bin/test_step_plan"
# MoE routing and experts on CUDA and on the ROCm kernels (rocm-on-cuda), batch invariance included.
gtest test_moe "$BUILD/bin/test_moe" --gtest_filter='*cuda*:*rocm*'
# The dense GEMMs (linear_small up to 16 rows, cuBLAS past it) and the absorb kernels, every platform.
gtest test_linear "$BUILD/bin/test_linear"
# NaN isolation and bad batches on every platform this GPU runs (CPU, CUDA, ROCm).
gtest test_nan_isolation "$BUILD/bin/test_nan_isolation"
gtest test_bad_batches "$BUILD/bin/test_bad_batches"
# Loading (staged uploads, random weights made on the GPU), the platform's greedy pick, and what
# batching does to a request's logits on CUDA.
gtest test_model_load "$BUILD/bin/test_model_load"
gtest test_sampler_argmax "$BUILD/bin/test_sampler" --gtest_filter='ArgmaxRows.*'
gtest test_scheduler_cuda "$BUILD/bin/test_scheduler" --gtest_filter='*Cuda*'
for p in cuda rocm; do
  "$BUILD/bin/mla" demo --model tests/data/v3_tiny --platform $p > "$OUT/demo_$p.txt" 2>&1 || rc=1
  cat "$OUT/demo_$p.txt"
done
# Whole V3 layers: the ROCm twins on this GPU against the CUDA platform (JSON).
"$BUILD/bin/mla" bench --rocm-vs-cuda $quick > "$OUT/rocm_vs_cuda.json" 2> "$OUT/rocm_vs_cuda.err" || rc=1
# Tensor parallelism: in-process ranks on this GPU; with 2+ GPUs the NCCL communicator, the CLI's
# --tp runs and whole-model TP 1 vs TP 2 (scripts/gpu_tp.sh).
gtest test_tp_cuda "$BUILD/bin/test_tp" --gtest_filter='*cuda*'
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
  BUILD=$BUILD OUT=$OUT/tp bash scripts/gpu_tp.sh $quick || rc=1
fi
echo "gpu_check: rc=$rc"
exit $rc
