#!/usr/bin/env bash
# bench/cuda/ab_run.sh — mla_decode_test binaries interleaved on one GPU: for each round, each
# binary, each row, `BIN --no-test --case ROW`, the rows prefixed with the binary's name and the
# round; then bench/cuda/ab_table.py's table. The binaries' names are their directories' names
# (bench/cuda/build_variant.sh writes BUILD/variants/NAME/mla_decode_test) or the file's own.
#   ROUNDS=2 bash bench/cuda/ab_run.sh OUT_FILE ROW... -- BINARY...
set -uo pipefail
[ $# -ge 3 ] || { sed -n 2,6p "$0"; exit 2; }
out=$1
shift
rows=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do rows+=("$1"); shift; done
shift
: > "$out"
for round in $(seq 1 "${ROUNDS:-2}"); do
  for bin in "$@"; do
    name=$(basename "$bin")
    [ "$name" = mla_decode_test ] && name=$(basename "$(dirname "$bin")")
    for row in "${rows[@]}"; do
      timeout 120 "$bin" --no-test --case "$row" 2>&1 | grep '^  h' | sed "s/^/$name r$round /" >> "$out"
    done
  done
done
python3 "$(dirname "$0")/ab_table.py" "$out"
