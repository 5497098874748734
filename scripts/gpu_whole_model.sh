#!/usr/bin/env bash
# The whole model on one GPU, in one run: the GPU tests of the model path, `mla bench-model`
# (decode and prefill against in-run rooflines), the V3 layer rows of `mla bench`, `mla serve`
# with random V2-Lite weights under `mla bench-serve`, and a transformers-made V2-Lite-shaped
# checkpoint loaded by mla (load time; greedy ids against transformers in f32 and bf16).
#   BIN=build/bin OUT=/tmp/out bash scripts/gpu_whole_model.sh
set -u
cd "$(dirname "$0")/.."
BIN=${BIN:-build/bin}; R=${OUT:-gpu-whole-model}; mkdir -p "$R"
M=$BIN/mla
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > "$R/gpu.txt" 2>&1
CK=${CKPT:-/tmp/v2lite}; mkdir -p "$CK"; $M shape deepseek-v2-lite > "$CK/config.json"
rm -f /tmp/mla_bench_done
python3 scripts/hf_random_checkpoint.py "$CK" "$R/hf.json" --wait-for /tmp/mla_bench_done > "$R/hf.log" 2>&1 &
hf=$!
export MLA_TEST_DATA=$PWD/tests/data MLA_CUDA_POISON=1
t() { local n=$1; shift; timeout ${T:-120} "$@" > "$R/$n.txt" 2>&1; echo "$n rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$R/$n.txt" | tr '\n' ' ')"; }
t step_plan $BIN/test_step_plan --gtest_filter='Gpu/*:*StepBits*tiny*:*StepBits*odd*'
t moe $BIN/test_moe --gtest_filter='*cuda*:*rocm*'
t model_load $BIN/test_model_load
t argmax $BIN/test_sampler --gtest_filter='ArgmaxRows.*'
t sched_cuda $BIN/test_scheduler --gtest_filter='*Cuda*'
grep "worst relative" "$R/sched_cuda.txt"
t communicator $BIN/test_communicator
t oracle $BIN/test_oracle --gtest_filter='*cuda*:*rocm*'
T=150 t methods_cuda $BIN/test_methods --gtest_filter='Cuda/*'
t nan $BIN/test_nan_isolation
t bad $BIN/test_bad_batches
unset MLA_CUDA_POISON
timeout 150 $M bench-model --random-weights deepseek-v2-lite --platform cuda --dtype bf16 --kv-dtype bf16 \
  --batch 1,16,64,128 --context 1024 --steps 16 --prefill 4096 > "$R/bench_model.json" 2> "$R/bench_model.err"
echo "bench-model rc=$?"; grep -v loading "$R/bench_model.err"
timeout 100 $M bench --layers > "$R/bench_layers.json" 2> "$R/bench_layers.err"; echo "bench layers rc=$?"
tail -n 12 "$R/bench_layers.err"
$M serve --random-weights deepseek-v2-lite --platform cuda --dtype bf16 --kv-dtype bf16 --port 0 --port-file "$R/port" \
  --kv-tokens 300000 --max-running 128 --token-budget 8192 --prefill-chunk 2048 > "$R/serve.log" 2>&1 &
srv=$!
for i in $(seq 1 120); do [ -f "$R/port" ] && break; sleep 1; done
P=$(cat "$R/port")
bs() {
  local name=$1; shift
  timeout 100 $M bench-serve --port "$P" --vocab-size 102400 "$@" > "$R/bs_$name.json" 2> "$R/bs_$name.err"
  echo "bench-serve $name rc=$? $(python3 -c "import json; j = json.load(open('$R/bs_$name.json')); \
print(round(j['output_throughput']), j['ttft_ms'], j['tpot_ms'], j['prefix_cache_hit_rate'], \
'graphs recorded', j['step_graph_captures'], 'replayed', j['step_graph_replays'], 'kept', j['step_graphs'])" 2>&1)"
}
bs c1 --num-prompts 4 --input-len 1024 --output-len 128 --max-concurrency 1 --seed 101
bs c16 --num-prompts 32 --input-len 1024 --output-len 256 --max-concurrency 16 --seed 102
bs c64 --num-prompts 128 --input-len 1024 --output-len 256 --max-concurrency 64 --seed 103
bs c128 --num-prompts 256 --input-len 1024 --output-len 256 --max-concurrency 128 --seed 104
# Uneven lengths and arrivals, as a serving load has them: batch sizes wander, and with them the
# step-graph keys (bench/NOTES.md, "How many step graphs a serving load makes").
bs c64_uneven --num-prompts 256 --input-len 1024 --output-len 128 --range-ratio 0.5 --max-concurrency 64 --seed 107
bs poisson --num-prompts 300 --input-len 1024 --output-len 128 --range-ratio 0.5 --request-rate 40 --seed 108
bs cold --num-prompts 3 --input-len 4160 --output-len 1 --max-concurrency 1 --seed 105
bs cached --num-prompts 6 --input-len 4160 --shared-prefix-len 4096 --output-len 1 --max-concurrency 1 --seed 106
kill -INT $srv; wait $srv; echo "serve rc=$?"
touch /tmp/mla_bench_done
wait $hf; echo "transformers rc=$?"; tail -n 2 "$R/hf.log"; cat "$R/hf.json"; echo
t0=$(date +%s%N); cat "$CK"/*.safetensors > /dev/null; t1=$(date +%s%N); echo "read the shards: $(( (t1 - t0) / 1000000 )) ms"
for d in f32 bf16; do
  timeout 100 $M generate --model "$CK" --platform cuda --dtype $d --kv-dtype $d --ids 1,2,3,4,5,6,7,8 \
    --max-new-tokens 16 --json > "$R/gen_$d.json" 2> "$R/gen_$d.err"
  echo "mla generate $d rc=$? $(cat "$R/gen_$d.json")"; grep loaded "$R/gen_$d.err"
done
