#!/usr/bin/env bash
# bench/gpu/compare_builds.sh — `mla bench` of two builds on one GPU, alternating (A B A B), then a
# table of every row: both runs of each build, the run-to-run spread (the noise) and B against A.
# Optionally the SASS of both builds' attention kernels, matched by name (cuobjdump, c++filt).
#   bash bench/gpu/compare_builds.sh BUILD_A BUILD_B OUT_DIR [--sass] [mla bench options...]
# A full `mla bench` runs for minutes: one pair per device call may be all that fits.
set -uo pipefail
A=$1 B=$2 OUT=$3
shift 3
sass=0
[ "${1:-}" = "--sass" ] && { sass=1; shift; }
mkdir -p "$OUT"
here=$(cd "$(dirname "$0")" && pwd)
if [ $sass = 1 ]; then
  cuobjdump -sass "$A/bin/mla" > "$OUT/a.sass" && cuobjdump -sass "$B/bin/mla" > "$OUT/b.sass" &&
    python3 "$here/compare_builds.py" sass "$OUT/a.sass" "$OUT/b.sass" | tee "$OUT/sass.txt"
fi
for i in 1 2; do
  for v in a b; do
    bin=$A/bin/mla
    [ $v = b ] && bin=$B/bin/mla
    s=$(date +%s)
    "$bin" bench "$@" > "$OUT/bench_${v}_$i.json" 2> "$OUT/bench_${v}_$i.err"
    echo "bench $v $i: rc=$? $(($(date +%s) - s)) s"
  done
done
python3 "$here/compare_builds.py" bench "$OUT" | tee "$OUT/table.txt"
