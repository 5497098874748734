#!/usr/bin/env bash
# `mla chat-template` end to end: the prompt on stdout equals transformers' rendering of the
# DeepSeek-V3 template (tests/data/text/cli/, from template_expected.json); with --json the ids
# equal transformers' encode(text, add_special_tokens=False) of the real DeepSeek-V3 tokenizer (run
# when scripts/fetch_tokenizers.sh has put it in the cache, skipped saying so otherwise); bad
# templates exit 1 and bad message files exit 2, each with one line on stderr.
set -u
MLA=${MLA:-build/bin/mla}
root=$(cd "$(dirname "$0")/.." && pwd)
data=$root/tests/data/text
cli=$data/cli
tok=${MLA_TOKENIZER_CACHE:-$root/.cache/tokenizers}/deepseek_v3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0
fail=0

ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL $*"; }

# The rendering (and with --json the ids) of each case, byte for byte.
for m in "$cli"/*.messages.json; do
  name=$(basename "$m" .messages.json)
  args=$(cat "$cli/$name.args")
  tools=()
  [ -f "$cli/$name.tools.json" ] && tools=(--tools-file "$cli/$name.tools.json")
  # shellcheck disable=SC2086
  "$MLA" chat-template --tokenizer "$data/deepseek_v3_config" --messages-file "$m" "${tools[@]}" $args \
    >"$tmp/out" 2>"$tmp/err"
  rc=$?
  if [ $rc -eq 0 ] && cmp -s "$tmp/out" "$cli/$name.txt"; then ok; else bad "$name: rc=$rc, text differs: $(head -c 300 "$tmp/err")"; fi
  if [ -f "$tok/tokenizer.json" ]; then
    # shellcheck disable=SC2086
    "$MLA" chat-template --tokenizer "$tok" --messages-file "$m" "${tools[@]}" $args --json >"$tmp/out" 2>"$tmp/err"
    rc=$?
    if [ $rc -eq 0 ] && cmp -s "$tmp/out" "$cli/$name.out.json"; then ok; else bad "$name --json: rc=$rc: $(head -c 300 "$tmp/out") $(head -c 300 "$tmp/err")"; fi
  fi
done
[ -f "$tok/tokenizer.json" ] || echo "cli_chat_template: no DeepSeek-V3 tokenizer in $tok (scripts/fetch_tokenizers.sh): --json ids not checked"

# expect_err NAME RC PATTERN -- ARGS...: exit code RC, exactly one line on stderr matching PATTERN, no stdout.
expect_err() {
  local name=$1 want=$2 pattern=$3
  shift 4
  "$MLA" "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [ $rc -eq "$want" ] && [ "$(wc -l <"$tmp/err")" -eq 1 ] && grep -qE -- "$pattern" "$tmp/err" && [ ! -s "$tmp/out" ]; then
    ok
  else
    bad "$name: rc=$rc (want $want), stderr: $(head -c 300 "$tmp/err")"
  fi
}

msgs=$cli/system_user.messages.json
printf '[{"role": "user", "content": "x"}' >"$tmp/truncated.json"
printf '{"role": "user"}' >"$tmp/object.json"
printf '[1]' >"$tmp/not_objects.json"
expect_err malformed_messages 2 'messages-file.*not valid JSON' -- chat-template --tokenizer "$data/deepseek_v3_config" --messages-file "$tmp/truncated.json"
expect_err messages_not_array 2 'expected a JSON array' -- chat-template --tokenizer "$data/deepseek_v3_config" --messages-file "$tmp/object.json"
expect_err message_not_object 2 'message 0 is not a JSON object' -- chat-template --tokenizer "$data/deepseek_v3_config" --messages-file "$tmp/not_objects.json"
expect_err missing_messages 2 'cannot read' -- chat-template --tokenizer "$data/deepseek_v3_config" --messages-file "$tmp/nope.json"
expect_err malformed_tools 2 'tools-file.*not valid JSON' -- chat-template --tokenizer "$data/deepseek_v3_config" --messages-file "$msgs" --tools-file "$tmp/truncated.json"
expect_err no_tokenizer_option 2 'tokenizer' -- chat-template --messages-file "$msgs"

mkdir -p "$tmp/include" "$tmp/raises" "$tmp/syntax" "$tmp/empty"
printf '{"chat_template": "{%% for m in messages %%}{%% include \\"x.jinja\\" %%}{%% endfor %%}"}' >"$tmp/include/tokenizer_config.json"
printf '{"chat_template": "{{ raise_exception(\\"only user messages\\") }}"}' >"$tmp/raises/tokenizer_config.json"
printf '{"chat_template": "{%% if x %%}never closed"}' >"$tmp/syntax/tokenizer_config.json"
expect_err unsupported_tag 1 "chat template: 1:27: the 'include' tag is not supported" -- chat-template --tokenizer "$tmp/include" --messages-file "$msgs"
expect_err template_raises 1 'only user messages' -- chat-template --tokenizer "$tmp/raises" --messages-file "$msgs"
expect_err template_syntax 1 "1:23: unexpected end of template: expected '\{% endif %\}'" -- chat-template --tokenizer "$tmp/syntax" --messages-file "$msgs"
expect_err no_config 1 'no tokenizer_config.json' -- chat-template --tokenizer "$tmp/empty" --messages-file "$msgs"
# An undefined content (a message without "content") is jinja2's UndefinedError in the V3 template.
printf '[{"role": "user"}]' >"$tmp/no_content.json"
expect_err undefined_content 1 "'dict object' has no attribute 'content'" -- chat-template --tokenizer "$data/deepseek_v3_config" --messages-file "$tmp/no_content.json"

echo "cli_chat_template: $pass passed, $fail failed"
[ $fail -eq 0 ]
