#!/usr/bin/env bash
# Tensor parallelism on a machine with 2 or more NVIDIA GPUs (docs/tensor_parallel.md): the in-process
# TP tests on one GPU, the NCCL communicator and its benchmark, the CLI's --tp runs on CUDA (logits and
# greedy ids against transformers, the server, a killed rank), then whole-model decode at TP 1 and TP 2.
# Results under $OUT.
#   BUILD=build OUT=/tmp/out bash scripts/gpu_tp.sh [--quick]
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
OUT=${OUT:-gpu-results}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # never NVLink multicast
export MLA_TEST_DATA="$PWD/tests/data"
gpus=$(nvidia-smi -L | wc -l)
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
rc=0
run() {  # run NAME CMD...: stdout+stderr to $OUT/NAME.txt, its last lines here
  local name=$1; shift
  "$@" > "$OUT/$name.txt" 2>&1 || { rc=1; echo "gpu_tp: $name failed"; }
  tail -n 3 "$OUT/$name.txt"
}
run test_tp "$BUILD/bin/test_tp"
run test_communicator "$BUILD/bin/test_communicator"
if [ "$gpus" -lt 2 ]; then echo "gpu_tp: $gpus GPU(s): the multi-GPU part needs 2"; exit 1; fi
run test_nccl "$BUILD/bin/test_nccl"
"$BUILD/bin/bench_allreduce" > "$OUT/allreduce.json" 2> "$OUT/allreduce.err" || rc=1
MLA=$BUILD/bin/mla MLA_TP_PLATFORM=cuda MLA_TP_MAX=2 bash tests/cli_tp.sh > "$OUT/cli_tp_cuda.txt" 2>&1 || rc=1
tail -n 3 "$OUT/cli_tp_cuda.txt"
[ "${1:-}" = "--quick" ] && { echo "gpu_tp: rc=$rc"; exit $rc; }
# Whole-model decode and prefill, random weights, bf16: TP 1 against TP 2 (rank 0 measures its ceilings).
for tp in 1 2; do
  "$BUILD/bin/mla" bench-model --random-weights deepseek-v2-lite --platform cuda --dtype bf16 --kv-dtype bf16 \
    --tp $tp --batch 1,8,64,128 --context 1024 --prefill 4096 > "$OUT/v2lite_tp$tp.json" 2> "$OUT/v2lite_tp$tp.err" || rc=1
  tail -n 6 "$OUT/v2lite_tp$tp.err"
  # A V3-shaped model of 5 layers (3 dense, 2 MoE): decode b128 at s 4096, per layer.
  "$BUILD/bin/mla" bench-model --random-weights deepseek-v3:5 --platform cuda --dtype bf16 --kv-dtype bf16 \
    --tp $tp --batch 128 --context 4096 --steps 8 --prefill 0 > "$OUT/v3x5_tp$tp.json" 2> "$OUT/v3x5_tp$tp.err" || rc=1
  tail -n 2 "$OUT/v3x5_tp$tp.err"
done
echo "gpu_tp: rc=$rc"
exit $rc
