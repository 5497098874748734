#!/usr/bin/env bash
# Tensor parallelism through the CLI: `--tp N` starts N processes (rank 0 is the one started here; on
# the CPU the ranks meet over 127.0.0.1 sockets). Logits against transformers' and TP 1's, greedy ids,
# the server answering as with --tp 1, bad values, and a killed rank ending the run within seconds.
set -u
source "$(dirname "$0")/cli_lib.sh"
DATA=${MLA_TEST_DATA:-$(cd "$(dirname "$0")/data" && pwd)}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
PLATFORM=${MLA_TP_PLATFORM:-cpu}
TP_MAX=${MLA_TP_MAX:-4}  # on a GPU platform: the GPUs of this machine (one rank each)
M=$DATA/v3_tp
# JSON through node (here and in CI) or python3 (the GPU machine).
if command -v node >/dev/null; then
  ids_of() {  # ids_of FILE KEY SUBKEY: an id list of oracle.json (ids/2, greedy/prompt, greedy/ids)
    node -e 'const d = JSON.parse(require("fs").readFileSync(process.argv[1])); console.log(d[process.argv[2]][process.argv[3]].join(","))' "$@"
  }
  free_port() {  # a port nobody listens on now
    node -e 'const s = require("net").createServer().listen(0, "127.0.0.1", () => { console.log(s.address().port); s.close() })'
  }
  logprob_ids() {  # stdin: a completion; stdout: its token ids, from logprobs.tokens ("token_id:N")
    node -e 'let s = ""; process.stdin.on("data", d => s += d).on("end", () =>
      console.log(JSON.parse(s).choices[0].logprobs.tokens.map(t => t.replace("token_id:", "")).join(",")))'
  }
else
  ids_of() {
    python3 -c 'import json, sys; print(",".join(map(str, json.load(open(sys.argv[1]))[sys.argv[2]][sys.argv[3]])))' "$@"
  }
  free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
  }
  logprob_ids() {
    python3 -c 'import json, sys; print(",".join(t.replace("token_id:", "") for t in json.load(sys.stdin)["choices"][0]["logprobs"]["tokens"]))'
  }
fi
ids2=$(ids_of "$M/oracle.json" ids 2)
prompt=$(ids_of "$M/oracle.json" greedy prompt)
greedy=$(ids_of "$M/oracle.json" greedy ids)

# Logits of 61 tokens (chunked prefill, then decode) against transformers', at TP 2 and TP 4 (the
# vocabulary of 250 pads the last rank's shard at TP 4), and TP 2 against TP 1.
for tp in 1 2 4; do
  [ "$tp" -gt "$TP_MAX" ] && continue
  expect "tp${tp}_logits" 0 'vs logits.2: relative L2 .* PASS$' -- logits --model "$M" --platform "$PLATFORM" --tp $tp \
    --ids "$ids2" --prefill-chunk 16 --decode-from 50 --compare "$M/oracle.safetensors:logits.2" --tolerance 5e-6 \
    --out "$tmp/tp$tp.safetensors"
done
expect tp2_is_tp1 0 'PASS$' -- logits --model "$M" --platform "$PLATFORM" --ids "$ids2" --prefill-chunk 16 --decode-from 50 \
  --compare "$tmp/tp2.safetensors:logits" --tolerance 3e-6 --out "$tmp/again.safetensors"
# The ranks as threads of one process on one device (--tp-in-process): the same bits as the rank
# processes (f32 sums in rank order on both); and TP 8, one head a rank, past the GPUs present.
expect tp2_in_process 0 'PASS$' -- logits --model "$M" --platform "$PLATFORM" --tp 2 --tp-in-process --ids "$ids2" \
  --prefill-chunk 16 --decode-from 50 --compare "$M/oracle.safetensors:logits.2" --tolerance 5e-6 --out "$tmp/tp2ip.safetensors"
same tp2_in_process_bits "$tmp/tp2.safetensors" "$tmp/tp2ip.safetensors"
expect tp8_in_process 0 'PASS$' -- logits --model "$M" --platform "$PLATFORM" --tp 8 --tp-in-process --ids "$ids2" \
  --prefill-chunk 16 --decode-from 50 --compare "$M/oracle.safetensors:logits.2" --tolerance 5e-6 --out "$tmp/tp8.safetensors"
expect tp_in_process_nodes 2 'no --nnodes' -- logits --model "$M" --tp 2 --tp-in-process --nnodes 2 \
  --dist-init-addr 127.0.0.1:1 --ids 1 --out "$tmp/bad.safetensors"
# Transformers' greedy continuation, and the V2 shape (tied embeddings, no q_lora).
expect tp2_generate 0 "^$greedy\$" -- generate --model "$M" --platform "$PLATFORM" --tp 2 --ids "$prompt" --max-new-tokens 12
M2=$DATA/v2_tp
expect tp_generate_v2 0 "^$(ids_of "$M2/oracle.json" greedy ids)\$" -- \
  generate --model "$M2" --platform "$PLATFORM" --tp "$TP_MAX" --ids "$(ids_of "$M2/oracle.json" greedy prompt)" --max-new-tokens 12
expect tp2_random 0 '^[0-9]+(,[0-9]+){3}$' -- generate --random-weights deepseek-v2-lite:1 --platform "$PLATFORM" --tp 2 \
  --ids 1,2,3 --max-new-tokens 4 --dtype bf16 --kv-dtype bf16

# Two hosts on one: --nnodes 2, each "host" starting its own ranks and meeting at --dist-init-addr.
if [ "$PLATFORM" = cpu ]; then
  addr=127.0.0.1:$(free_port)
  "$MLA" logits --model "$M" --tp 4 --nnodes 2 --node-rank 1 --dist-init-addr "$addr" --ids "$ids2" \
    --out "$tmp/node1.safetensors" >"$tmp/node1.out" 2>"$tmp/node1.err" &
  node1=$!
  expect tp4_two_nodes 0 'vs logits.2: relative L2 .* PASS$' -- logits --model "$M" --tp 4 --nnodes 2 --node-rank 0 \
    --dist-init-addr "$addr" --ids "$ids2" --compare "$M/oracle.safetensors:logits.2" --tolerance 5e-6 --out "$tmp/node0.safetensors"
  if wait "$node1" && [ ! -s "$tmp/node1.out" ]; then pass=$((pass + 1)); else
    fail=$((fail + 1)); echo "FAIL tp4_node1: $(cat "$tmp/node1.err")"; fi
fi

# Bad values: usage errors (2) or the model's (1), one line, before any rank is started.
expect tp_zero 2 '--tp must be at least 1' -- logits --model "$M" --tp 0 --ids 1,2 --out "$tmp/bad.safetensors"
expect tp_nodes 2 'does not divide|nnodes' -- logits --model "$M" --tp 3 --nnodes 2 --dist-init-addr 127.0.0.1:1 --ids 1 --out "$tmp/bad.safetensors"
expect tp_addr 2 "host:port|'nowhere'" -- logits --model "$M" --tp 2 --dist-init-addr nowhere --ids 1 --out "$tmp/bad.safetensors"
expect tp_heads 1 'tensor parallel size 2 does not divide num_attention_heads = 3' -- \
  logits --model "$DATA/v3_tiny" --tp 2 --ids 1,2 --out "$tmp/bad.safetensors"
expect tp_width 1 'tensor parallel size 8 does not divide' -- logits --model "$M2" --tp 8 --ids 1,2 --out "$tmp/bad.safetensors"

# The server on rank 0: the same greedy ids as --tp 1 (no tokenizer: ids from the logprobs); then a
# rank killed ends it within seconds.
start_server() {  # start_server TP: `mla serve --tp TP` in the background ($spid), listening ($port)
  rm -f "$tmp/port"
  "$MLA" serve --model "$M" --platform "$PLATFORM" --tp "$1" --host 127.0.0.1 --port 0 --port-file "$tmp/port" \
    >"$tmp/serve.out" 2>"$tmp/serve.err" &
  spid=$!
  for _ in $(seq 600); do [ -s "$tmp/port" ] && break; sleep 0.05; done
  port=$(cat "$tmp/port" 2>/dev/null)
}
completion_ids() {
  curl -s "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
    -d "{\"model\": \"v3_tp\", \"prompt\": [${prompt}], \"max_tokens\": 12, \"temperature\": 0, \"logprobs\": 0}" | logprob_ids
}
start_server 1
one=$(completion_ids)
kill "$spid"; wait "$spid" 2>/dev/null
start_server 2
two=$(completion_ids)
if [ "$one" = "$greedy" ] && [ "$two" = "$greedy" ]; then pass=$((pass + 1)); else
  fail=$((fail + 1)); echo "FAIL tp2_serve: --tp 1 '$one', --tp 2 '$two', transformers '$greedy'"; fi
child=$(pgrep -P "$spid" | head -1)
if [ -n "$child" ]; then
  start=$(date +%s%N)
  kill -9 "$child"
  wait "$spid"
  rc=$?
  took_ms=$((($(date +%s%N) - start) / 1000000))
  if [ "$rc" -eq 3 ] && grep -qE 'tensor-parallel rank (1 exited \(signal 9\)|0: rank 1 \(pid [0-9]+\) is gone: .*); stopping' "$tmp/serve.err" &&
     [ "$took_ms" -lt 5000 ]; then
    pass=$((pass + 1))
  else
    fail=$((fail + 1)); echo "FAIL tp_killed_rank: rc=$rc after ${took_ms} ms; stderr: $(tail -3 "$tmp/serve.err")"
  fi
else
  kill "$spid" 2>/dev/null; fail=$((fail + 1)); echo "FAIL tp_killed_rank: no rank process under the server"
fi

echo "cli_tp: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
