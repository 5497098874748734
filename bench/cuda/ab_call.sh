#!/usr/bin/env bash
# bench/cuda/ab_call.sh — one GPU call's kernel A/B from bench/cuda/ab_pack.sh's file, in order of
# what matters when time runs out: the candidate's correctness (every mla_decode_test case, the HF
# oracle on CUDA and ROCm-on-CUDA, the step plan with graph replay), the rows interleaved (base,
# candidate, extra variants; bench/cuda/ab_run.sh), the trace of the first row from both, the whole
# model alternated, and on an H200 the candidate's whole kernel table and the prefill benchmark.
# Every result goes into one file, $OUT/ab_results.tar.xz (a call brings back few files), and the
# summary to stdout. Run from the repo root on the GPU machine:
#   LIMIT=540 ROWS="row|row|..." MODEL="deepseek-v3:5 --context 16384" bash bench/cuda/ab_call.sh PKG
# LIMIT: seconds the script may take (each later part is skipped when too little is left).
set -uo pipefail
[ $# -ge 1 ] || { sed -n 2,10p "$0"; exit 2; }
T0=$SECONDS
el() { echo $((SECONDS - T0)); }
LIMIT=${LIMIT:-540}
ROWS=${ROWS:-"h128 b1   sq1 sk16384 bf16 s=64|h128 b16  sq1 sk4096 bf16 s=4|h128 b128 sq1 sk4096 bf16"}
MODEL=${MODEL:-"deepseek-v3:5 --context 16384"}
OUT=${OUT:-/tmp/ab_out}
R=$(mktemp -d)
W=$(mktemp -d)
tar -xJf "$1" -C "$W" || exit 1
B=$W/bin
export LD_LIBRARY_PATH=$B/lib:${LD_LIBRARY_PATH:-} MLA_TEST_DATA=$PWD/tests/data
pack() { mkdir -p "$OUT" && tar -C "$R" -cf - . | xz -T0 -3 > "$OUT/ab_results.tar.xz"; }
trap pack EXIT
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
echo "## $gpu"
# A test binary's verdict: its summary lines and how many cases skipped (a GPU case that skipped did
# not run), or nothing where it was cut.
verdict() {
  grep -E '^\[  (PASSED|FAILED)  \]|^== ' "$1" | tail -n 3
  grep -q '^\[  SKIPPED \]' "$1" && echo "skipped: $(grep '^\[  SKIPPED \] [^0-9]' "$1" | sed 's/ (.*//' | sort -u | wc -l) cases (not run)"
  return 0
}
echo "## mla_decode_test, every case ($(el) s)"
timeout 200 "$B/cand/mla_decode_test" --no-bench > "$R/test_decode.txt" 2>&1; echo "rc=$?"; verdict "$R/test_decode.txt"
echo "## test_oracle CUDA + ROCm-on-CUDA ($(el) s)"
timeout 150 "$B/cand/test_oracle" --gtest_filter='*cuda*:*rocm*' > "$R/test_oracle.txt" 2>&1; echo "rc=$?"; verdict "$R/test_oracle.txt"
echo "## test_step_plan but its ROCm bit cases (graph replay equal to eager) ($(el) s)"
timeout 150 "$B/cand/test_step_plan" --gtest_filter='-Rocm/*' > "$R/test_step_plan.txt" 2>&1; echo "rc=$?"
verdict "$R/test_step_plan.txt"
IFS='|' read -r -a rows <<< "$ROWS"
bins=("$B/base/mla_decode_test" "$B/cand/mla_decode_test")
for d in "$B"/*/; do
  n=$(basename "$d")
  case $n in base|cand|lib) ;; *) bins+=("$d/mla_decode_test") ;; esac
done
echo "## A/B, two rounds ($(el) s)"
ROUNDS=2 bash "$(dirname "$0")/ab_run.sh" "$R/ab.txt" "${rows[@]}" -- "${bins[@]}"
echo "## trace of '${rows[0]}' ($(el) s)"
for v in base cand; do
  timeout 60 "$B/$v/trace/mla_decode_test" --no-test --case "${rows[0]}" > "$R/trace_$v.txt" 2>&1
  echo "# $v"; grep -E '^    (wg0|combine)' "$R/trace_$v.txt" | head -n 20
done
echo "## whole model: $MODEL, batch 1 ($(el) s)"
for r in 1 2; do
  for v in base cand; do
    [ "$(el)" -gt $((LIMIT - 120)) ] && break 2
    # shellcheck disable=SC2086
    timeout 90 "$B/$v/mla" bench-model --random-weights $MODEL --platform cuda --dtype bf16 --kv-dtype bf16 \
      --overlap --prefill 0 --reps 1 --batch 1 > "$R/model_${v}_r$r.json" 2> "$R/model_${v}_r$r.err"
    echo "$v r$r rc=$? $(grep -oE '"step_ms": *[0-9.]+' "$R/model_${v}_r$r.json" | head -n 1)"
  done
done
if [[ $gpu == *H200* ]] && [ "$(el)" -lt $((LIMIT - 150)) ]; then
  echo "## the candidate's kernel table ($(el) s)"
  timeout 150 "$B/cand/mla_decode_test" --no-test > "$R/table.txt" 2>&1; echo "rc=$?"
  grep -E '^  h' "$R/table.txt" | head -n 30
  if [ "$(el)" -lt $((LIMIT - 60)) ]; then
    echo "## prefill ($(el) s)"
    timeout 60 "$B/mha_prefill_test" --bench > "$R/prefill.txt" 2>&1; echo "rc=$?"; tail -n 12 "$R/prefill.txt"
  fi
fi
echo "## done ($(el) s); results in \$OUT/ab_results.tar.xz"
