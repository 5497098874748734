# tests/cli_lib.sh — what every CLI test script shares (source it): $MLA, a temp folder, the
# pass/fail counters and the `expect` and `same` checks.
MLA=${MLA:-build/bin/mla}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0
fail=0

# expect NAME RC STDOUT_PATTERN -- ARGS...  (pattern: grep -E on stdout; for rc != 0 on stderr,
# which must then be exactly one line and stdout empty)
expect() {
  local name=$1 want_rc=$2 pattern=$3
  shift 4
  "$MLA" "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  local where="$tmp/out"
  [ "$want_rc" -ne 0 ] && where="$tmp/err"
  local ok=1
  [ "$rc" -eq "$want_rc" ] || ok=0
  grep -qE -- "$pattern" "$where" || ok=0
  if [ "$want_rc" -ne 0 ]; then
    [ "$(wc -l <"$tmp/err")" -eq 1 ] || ok=0
    [ -s "$tmp/out" ] && ok=0
  fi
  if [ $ok -eq 1 ]; then
    pass=$((pass + 1))
  else
    fail=$((fail + 1))
    echo "FAIL $name: rc=$rc (want $want_rc), pattern '$pattern'"
    echo "  stdout: $(head -c 400 "$tmp/out")"
    echo "  stderr: $(head -c 400 "$tmp/err")"
  fi
}

same() {  # same NAME FILE_A FILE_B
  if cmp -s "$2" "$3"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL $1: $2 and $3 differ"; fi
}
