#!/usr/bin/env bash
# scripts/mutate.sh — mutation testing: do the tests catch what they claim?
# Applies each one-line mutation of a list file (default tests/mutations.txt) to a scratch copy of
# the tree, one at a time; rebuilds only the targets its tests need (a CPU-only build with ccache);
# runs those tests; prints which test caught it and, where the test prints one, its error against
# its tolerance. Exits 1 if any mutation survived (or did not apply). Not part of `make test`.
#   bash scripts/mutate.sh [LIST] [--only REGEX]      (make mutate)
# List format, one mutation per line, fields separated by ' @@ ' ('#' starts a comment line):
#   NAME @@ FILE @@ TEXT @@ REPLACEMENT @@ TESTS
# TEXT must occur exactly once in FILE (plain text, not a pattern); REPLACEMENT replaces it.
# TESTS: space-separated runs, each `BINARY:GTEST_FILTER` (a test binary built by CMake) or `cli`
# (tests/cli_tests.sh against the mutated mla). A mutation is caught when any run fails.
set -uo pipefail
cd "$(dirname "$0")/.."
SRC=$PWD
LIST=${1:-tests/mutations.txt}
[ "${1:-}" = "--only" ] && LIST=tests/mutations.txt
ONLY=""
for ((i = 1; i <= $#; i++)); do [ "${!i}" = "--only" ] && { j=$((i + 1)); ONLY=${!j}; }; done
SCRATCH=${MUTATE_DIR:-/tmp/mla-mutate}
JOBS=${JOBS:-2}
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.ccache} CCACHE_BASEDIR=$SCRATCH
[ -f "$LIST" ] || { echo "mutate: no list file $LIST" >&2; exit 2; }

# The scratch copy: the tracked and untracked (not ignored) files of this tree, refreshed.
# Only files that differ are copied, so the scratch build stays warm between runs.
mkdir -p "$SCRATCH/tree"
git ls-files -co --exclude-standard >"$SCRATCH/files"
while IFS= read -r f; do
  if ! cmp -s "$f" "$SCRATCH/tree/$f"; then mkdir -p "$SCRATCH/tree/$(dirname "$f")" && cp "$f" "$SCRATCH/tree/$f"; fi
done <"$SCRATCH/files"
# Files this tree no longer has leave the copy too (a moved source would still be globbed there).
(cd "$SCRATCH/tree" && find . -type f | sed 's|^\./||') | sort | comm -23 - <(sort "$SCRATCH/files") |
  while IFS= read -r f; do rm -f "$SCRATCH/tree/$f"; done
T=$SCRATCH/tree
B=$SCRATCH/build
if [ ! -f "$B/build.ninja" ]; then
  cmake -S "$T" -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMLA_CUDA=OFF -DMLA_BENCH=OFF \
    -DCMAKE_CXX_COMPILER_LAUNCHER=ccache >/dev/null || exit 2
fi
LOG=$SCRATCH/logs
mkdir -p "$LOG"

n=0 caught=0 survived=0 broken=0
printf '%-4s %-34s %-9s %s\n' "#" "mutation" "result" "caught by (error vs tolerance)"
while IFS= read -r line || [ -n "$line" ]; do
  [[ -z "${line// }" || "$line" =~ ^[[:space:]]*# ]] && continue
  n=$((n + 1))
  name=$(awk -F' @@ ' '{print $1}' <<<"$line")
  file=$(awk -F' @@ ' '{print $2}' <<<"$line")
  find=$(awk -F' @@ ' '{print $3}' <<<"$line")
  repl=$(awk -F' @@ ' '{print $4}' <<<"$line")
  tests=$(awk -F' @@ ' '{print $5}' <<<"$line")
  [ -n "$ONLY" ] && ! grep -qE -- "$ONLY" <<<"$name $file" && continue
  orig=$(mktemp)
  cp -p "$T/$file" "$orig"
  # Apply: exactly one occurrence of the text.
  count=$(FIND="$find" python3 -c 'import os,sys; print(open(sys.argv[1]).read().count(os.environ["FIND"]))' "$T/$file" 2>/dev/null ||
          grep -cF -- "$find" "$T/$file")
  if [ "$count" != "1" ]; then
    printf '%-4s %-34s %-9s %s\n' "$n" "$name" "BROKEN" "the text occurs $count times in $file"
    broken=$((broken + 1)); rm -f "$orig"; continue
  fi
  FIND="$find" REPL="$repl" perl -0pi -e 's/\Q$ENV{FIND}\E/$ENV{REPL}/' "$T/$file"
  # Build what the tests need.
  targets=""
  for t in $tests; do
    if [ "$t" = cli ]; then targets="$targets mla"; else targets="$targets ${t%%:*}"; fi
  done
  by="" detail="" nomatch=""
  if ! cmake --build "$B" --target $targets -j "$JOBS" >"$LOG/$n.build" 2>&1; then
    nomatch="the mutated tree does not compile ($LOG/$n.build)"  # a mutation must build to prove anything
  else
    for t in $tests; do
      if [ "$t" = cli ]; then
        MLA="$B/bin/mla" bash "$T/tests/cli_tests.sh" >"$LOG/$n.cli" 2>&1 && continue
        by="cli_tests.sh"; detail="($(grep -m1 '^FAIL' "$LOG/$n.cli"))"
        break
      fi
      bin=${t%%:*} filter=${t#*:}
      out="$LOG/$n.$bin"
      if (cd "$T" && MLA_TEST_DATA="$T/tests/data" timeout 600 "$B/bin/$bin" --gtest_filter="$filter" >"$out" 2>&1); then
        grep -qE '^\[  PASSED  \] [1-9]' "$out" && continue
        nomatch="$bin:$filter ran no test"  # a filter that matches nothing proves nothing
        continue
      fi
      first=$(grep -m1 '^\[  FAILED  \]' "$out" | sed 's/^\[  FAILED  \] //; s/, where.*//; s/ (.*//')
      [ -z "$first" ] && first="$bin (crashed or ran nothing)"
      by="$first"
      # The error against its tolerance, from the gtest message "Expected: (a) <= (b), actual: X vs Y".
      ev=$(grep -m1 -E 'actual: [^ ]+ vs [^ ]+' "$out" | sed -E 's/.*actual: ([^ ]+) vs ([^ ]+).*/\1 vs tol \2/')
      detail=${ev:+($ev)}
      break
    done
  fi
  cp "$orig" "$T/$file"; rm -f "$orig"  # a fresh mtime: the next build recompiles it
  if [ -z "$by" ] && [ -n "$nomatch" ]; then
    broken=$((broken + 1)); printf '%-4s %-34s %-9s %s\n' "$n" "$name" "BROKEN" "$nomatch"
  elif [ -n "$by" ]; then
    caught=$((caught + 1)); printf '%-4s %-34s %-9s %s %s\n' "$n" "$name" "caught" "$by" "$detail"
  else
    survived=$((survived + 1)); printf '%-4s %-34s %-9s %s\n' "$n" "$name" "SURVIVED" "$tests"
  fi
done <"$LIST"
echo "mutate: $((caught + survived + broken)) mutations run, $caught caught, $survived survived, $broken broken (did not apply, build or run a test)"
[ $survived -eq 0 ] && [ $broken -eq 0 ]
