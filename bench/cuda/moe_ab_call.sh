#!/usr/bin/env bash
# bench/cuda/moe_ab_call.sh — one GPU call's MoE A/B from bench/cuda/moe_ab_pack.sh's file: the
# candidate's test_moe (CUDA cases and the plan's, under each value of FLAGS: MLA_EXP_MOE, an
# experiment's switches), `mla bench --moe` (each expert GEMM timed alone) for the base and the
# candidate under each value of FLAGS, two rounds, then the V2-Lite prefill and the 5-layer V3
# shape's prefill alternated and test_oracle, within LIMIT seconds. Results in
# $OUT/moe_results.tar.xz (one file), the summary on stdout. Run from the repo root:
#   LIMIT=300 FLAGS="0 1" bash bench/cuda/moe_ab_call.sh PKG
set -uo pipefail
[ $# -ge 1 ] || { sed -n 2,8p "$0"; exit 2; }
T0=$SECONDS
el() { echo $((SECONDS - T0)); }
LIMIT=${LIMIT:-300} FLAGS=${FLAGS:-0} OUT=${OUT:-/tmp/moe_out}
R=$(mktemp -d) W=$(mktemp -d)
tar -xJf "$1" -C "$W" || exit 1
B=$W/bin
export LD_LIBRARY_PATH=$B/lib:${LD_LIBRARY_PATH:-} MLA_TEST_DATA=$PWD/tests/data
pack() { mkdir -p "$OUT" && tar -C "$R" -cf - . | xz -T0 -3 > "$OUT/moe_results.tar.xz"; }
trap pack EXIT
nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1
# The expert rows of `mla bench --moe`'s JSON: the whole call and each GEMM alone.
rows() {
  python3 - "$1" <<'PY'
import json, sys
def walk(x):
    if isinstance(x, dict):
        if 'parts' in x and 'experts_us' in x:
            p = x['parts']
            print('   %-20s experts %8.1f  gate/up %7.1f (%5.1f TF)  down %7.1f (%5.1f TF)  fill %.2f' % (
                x.get('name', '?'), x['experts_us'], p['gate_up_us'], p['gate_up_tflops'], p['down_us'],
                p['down_tflops'], p['tile_fill']))
        for v in x.values(): walk(v)
    elif isinstance(x, list):
        for v in x: walk(v)
walk(json.load(open(sys.argv[1])))
PY
}
for f in $FLAGS; do
  echo "## test_moe, MLA_EXP_MOE=$f ($(el) s)"
  MLA_EXP_MOE=$f timeout 100 "$B/cand/test_moe" --gtest_filter='*cuda*:MoePlan*' > "$R/test_moe_$f.txt" 2>&1
  echo "rc=$?"; grep -E '^\[  (PASSED|FAILED)  \]|Failure' "$R/test_moe_$f.txt" | head
done
echo "## mla bench --moe ($(el) s)"
for r in 1 2; do
  for v in base $(for f in $FLAGS; do echo "cand:$f"; done); do
    b=${v%%:*} f=0
    [ "$v" = base ] || f=${v#*:}
    [ "$(el)" -gt $((LIMIT - 25)) ] && break 2
    MLA_EXP_MOE=$f timeout 90 "$B/$b/mla" bench --moe > "$R/moe_${b}_${f}_$r.json" 2> "$R/moe_${b}_${f}_$r.err"
    echo "$b flags=$f round $r rc=$?"
    rows "$R/moe_${b}_${f}_$r.json" 2> /dev/null || head -n 2 "$R/moe_${b}_${f}_$r.err"
  done
done
echo "## V2-Lite prefill ($(el) s)"
for v in base cand base cand; do
  [ "$(el)" -gt $((LIMIT - 40)) ] && break
  timeout 60 "$B/$v/mla" bench-model --random-weights deepseek-v2-lite --platform cuda --dtype bf16 --kv-dtype bf16 \
    --context 1024 --prefill 4096,8x1024 --batch 1 --overlap --reps 1 > "$R/v2l_$v.json" 2> "$R/v2l_$v.err"
  echo "$v rc=$?"; grep -E "prefill [0-9]" "$R/v2l_$v.err"
done
echo "## V3 shape, 5 layers, prefill ($(el) s)"
for v in base cand base cand; do
  [ "$(el)" -gt $((LIMIT - 70)) ] && break
  timeout 60 "$B/$v/mla" bench-model --random-weights deepseek-v3:5 --platform cuda --dtype bf16 --kv-dtype bf16 \
    --context 4096 --prefill 4096,8x1024 --batch 1 --overlap --reps 1 > "$R/v3_$v.json" 2> "$R/v3_$v.err"
  echo "$v rc=$?"; grep -E "prefill [0-9]" "$R/v3_$v.err"
done
if [ "$(el)" -lt $((LIMIT - 60)) ]; then
  echo "## test_oracle CUDA + ROCm-on-CUDA ($(el) s)"
  timeout 60 "$B/cand/test_oracle" --gtest_filter='*cuda*:*rocm*' > "$R/test_oracle.txt" 2>&1; echo "rc=$?"
  grep -E '^\[  (PASSED|FAILED)  \]' "$R/test_oracle.txt"
fi
echo "## done ($(el) s); results in \$OUT/moe_results.tar.xz"
