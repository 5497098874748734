#!/usr/bin/env bash
# End-to-end tests of `mla tokenize` / `mla detokenize`: ids as JSON, round trips, --jsonl, exit codes
# (invalid UTF-8 and ids outside the vocabulary: 2; a broken tokenizer.json: 1, naming the field).
set -u
source "$(dirname "$0")/cli_lib.sh"
root=$(cd "$(dirname "$0")/.." && pwd)
data=$root/tests/data/text

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
same jsonl_round_trip "$data/corpus.jsonl" "$tmp/back.jsonl"  # the same JSON escapes, byte for byte

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
printf '{"pre_tokenizer": {"type": "Whitespace"}, "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}}' \
  >"$tmp/broken/tokenizer.json"
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
