#!/usr/bin/env bash
# Runs every libFuzzer target (built by `make fuzz` into BUILD, default build-fuzz) for
# FUZZ_SECONDS seconds each (default 60), starting from the seeds in fuzz/corpus/<target>/.
# New inputs go to BUILD/corpus/<target>/ (the seeds are never written); a crash leaves its input
# in BUILD/crashes/ and fails the run. Prints each target's executions from libFuzzer's stats.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-fuzz}
SECS=${FUZZ_SECONDS:-60}
TARGETS=${FUZZ_TARGETS:-"fuzz_safetensors fuzz_safetensors_index fuzz_config fuzz_cli_ids fuzz_tokenizer_json fuzz_tokenizer_encode fuzz_chat_template"}
status=0
for t in $TARGETS; do
  mkdir -p "$BUILD/corpus/$t" "$BUILD/crashes"
  dict=()
  case $t in
    fuzz_cli_ids | fuzz_tokenizer_encode) ;;
    fuzz_chat_template) dict=(-dict=fuzz/jinja.dict) ;;
    *) dict=(-dict=fuzz/json.dict) ;;
  esac
  log="$BUILD/$t.log"
  "$BUILD/bin/$t" -max_total_time="$SECS" -timeout=10 -print_final_stats=1 ${FUZZ_SEED:+-seed=$FUZZ_SEED} \
    -artifact_prefix="$BUILD/crashes/$t-" "${dict[@]}" "$BUILD/corpus/$t" "fuzz/corpus/$t" \
    >"$log" 2>&1
  rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  secs=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1)
  if [ $rc -eq 0 ]; then
    echo "fuzz: $t: ${execs:-?} executions (${secs:-?}/s), ${cov:-cov: ?}, no crash"
  else
    status=1
    echo "fuzz: $t: FAILED (exit $rc) after ${execs:-?} executions; input in $BUILD/crashes/:"
    grep -E 'ERROR|SUMMARY|runtime error|==ABORTING|deadly signal|Test unit written|requirement failed|terminate called|what\(\)' "$log" | head -20
    echo "  full log: $log"
  fi
done
exit $status
