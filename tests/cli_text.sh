#!/usr/bin/env bash
# End-to-end tests of `mla tokenize` / `mla detokenize`: ids as JSON, round trips, --jsonl, exit codes
# (invalid UTF-8 and ids outside the vocabulary: 2; a broken tokenizer.json: 1, naming the field).
set -u
MLA=${MLA:-build/bin/mla}
root=$(cd "$(dirname "$0")/.." && pwd)
data=$root/tests/data/text
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

# The tiny tokenizer as an HF folder.
tok=$tmp/tiny
mkdir -p "$tok"
cp "$data/tiny_tokenizer.json" "$tok/tokenizer.json"
cp "$data/tiny_tokenizer_config.json" "$tok/tokenizer_config.json"

expect tokenize 0 '^\[[0-9]+(,[0-9]+)*\]$' -- tokenize --tokenizer "$tok" --text "Hello, world!"
expect tokenize_bos 0 '^\[0,' -- tokenize --tokenizer "$tok" --text "Hello" --add-special-tokens
expect tokenize_empty 0 '^\[\]$' -- tokenize --tokenizer "$tok" --text ""
expect tokenize_special 0 '^\[2,' -- tokenize --tokenizer "$tok" --text "<｜User｜>hi"
ids=$("$MLA" tokenize --tokenizer "$tok" --text "Hello, 世界 😀!" | tr -d '[]')
expect detokenize 0 '^Hello, 世界 😀!$' -- detokenize --tokenizer "$tok" --ids "$ids"
expect detokenize_skip 0 '^hi$' -- detokenize --tokenizer "$tok" --ids 0,2,$("$MLA" tokenize --tokenizer "$tok" --text hi | tr -d '[]') --skip-special-tokens
expect detokenize_keep 0 '^<｜begin▁of▁sentence｜>hi$' -- detokenize --tokenizer "$tok" --ids 0,$("$MLA" tokenize --tokenizer "$tok" --text hi | tr -d '[]')

# A file as it is (newlines and all), and --jsonl both ways: the corpus round-trips line for line.
printf 'line one\nline two\r\n\ttabbed' >"$tmp/text.txt"
"$MLA" tokenize --tokenizer "$tok" --text-file "$tmp/text.txt" >"$tmp/file_ids"
"$MLA" detokenize --tokenizer "$tok" --ids "$(tr -d '[]\n' <"$tmp/file_ids")" >"$tmp/file_back"
printf '\n' >>"$tmp/text.txt"
same text_file_round_trip "$tmp/text.txt" "$tmp/file_back"
"$MLA" tokenize --tokenizer "$tok" --jsonl "$data/corpus.jsonl" >"$tmp/ids.jsonl"
wc -l <"$tmp/ids.jsonl" | tr -d ' ' >"$tmp/n_ids"
wc -l <"$data/corpus.jsonl" | tr -d ' ' >"$tmp/n_corpus"
same jsonl_count "$tmp/n_ids" "$tmp/n_corpus"
"$MLA" detokenize --tokenizer "$tok" --jsonl "$tmp/ids.jsonl" >"$tmp/back.jsonl"
python3 -c "import json,sys; a=[json.loads(l) for l in open(sys.argv[1],encoding='utf-8')]; b=[json.loads(l) for l in open(sys.argv[2],encoding='utf-8')]; sys.exit(a!=b)" \
  "$data/corpus.jsonl" "$tmp/back.jsonl" && pass=$((pass + 1)) || { fail=$((fail + 1)); echo "FAIL jsonl_round_trip"; }

# Bad input: exit 2 naming the position or the id; a broken tokenizer.json: exit 1 naming the field.
printf 'ab\xc3(' >"$tmp/bad.txt"
expect bad_utf8 2 'byte offset 2' -- tokenize --tokenizer "$tok" --text-file "$tmp/bad.txt"
expect bad_utf8_arg 2 'byte offset 1' -- tokenize --tokenizer "$tok" --text "$(printf 'a\xff')"
printf '"fine"\n"not closed\n' >"$tmp/bad.jsonl"
expect bad_jsonl 2 'line 2' -- tokenize --tokenizer "$tok" --jsonl "$tmp/bad.jsonl"
expect no_text 2 'text' -- tokenize --tokenizer "$tok"
expect two_texts 2 'excludes' -- tokenize --tokenizer "$tok" --text a --text-file "$tmp/bad.txt"
expect id_outside 2 'token id 512 ' -- detokenize --tokenizer "$tok" --ids 5,512
expect id_huge 2 'token id 99999999999' -- detokenize --tokenizer "$tok" --ids 99999999999
printf '[1,2]\n[3,-4]\n' >"$tmp/bad_ids.jsonl"
expect id_negative_jsonl 2 'line 2: token id -4' -- detokenize --tokenizer "$tok" --jsonl "$tmp/bad_ids.jsonl"
expect ids_malformed 2 '--ids' -- detokenize --tokenizer "$tok" --ids 1,,2
expect no_folder 1 'tokenizer.json: cannot read' -- tokenize --tokenizer "$tmp/none" --text hi
mkdir -p "$tmp/broken"
python3 -c "import json,sys; j=json.load(open(sys.argv[1],encoding='utf-8')); j['pre_tokenizer']={'type':'Whitespace'}; json.dump(j,open(sys.argv[2],'w'))" \
  "$data/tiny_tokenizer.json" "$tmp/broken/tokenizer.json"
expect unsupported 1 "pre_tokenizer.type 'Whitespace'" -- tokenize --tokenizer "$tmp/broken" --text hi
printf '{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}}' >"$tmp/broken/tokenizer.json"
expect bad_merge 1 "model.merges\[0\]" -- tokenize --tokenizer "$tmp/broken" --text hi
printf '{"model": ' >"$tmp/broken/tokenizer.json"
expect not_json 1 'not valid JSON' -- detokenize --tokenizer "$tmp/broken" --ids 1

# The real DeepSeek-V3 tokenizer, where scripts/fetch_tokenizers.sh fetched it.
v3=${MLA_TOKENIZER_CACHE:-$root/.cache/tokenizers}/deepseek_v3
if [ -f "$v3/tokenizer.json" ]; then
  expect v3_tokenize 0 '^\[0,19923,2058\]$' -- tokenize --tokenizer "$v3" --text "Hello world" --add-special-tokens
  expect v3_detokenize 0 '^<｜User｜>Hello world$' -- detokenize --tokenizer "$v3" --ids 128803,19923,2058
else
  echo "SKIP v3 cases: no DeepSeek-V3 tokenizer in $v3 (scripts/fetch_tokenizers.sh)"
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
