#!/usr/bin/env bash
# End-to-end tests of the mla CLI: results on stdout, one-line errors on stderr, exit codes.
set -u
source "$(dirname "$0")/cli_lib.sh"

expect version 0 '^mla [0-9]+\.[0-9]+\.[0-9]+$' -- --version
expect help 0 'dispatch' -- --help
expect no_subcommand 2 'subcommand' --

# The handler table through the CLI (JSON: exactly one object).
expect fa3_prefill 0 '^\{"method":"MHA_ONE_SHOT","platform":"cpu","resolved":"MHA_ONE_SHOT","implemented":true,"serves":true,"reason":""\}$' -- \
  dispatch --backend fa3 --mode extend --seq-lens 100,20 --json
expect fa3_short_prefix 0 '"method":"MLA"' -- dispatch --backend fa3 --mode extend --seq-lens 100,20 --prefix-lens 50,0 --json
expect fa3_long_prefix 0 '"method":"MHA_ONE_SHOT"' -- dispatch --backend fa3 --mode extend --seq-lens 9000 --prefix-lens 8192 --json
expect fa3_over_capacity 0 '"method":"MHA_CHUNKED_KV"' -- dispatch --backend fa3 --mode extend --seq-lens 140000 --prefix-lens 9000 --json
expect fa3_chunked_off 0 '"method":"MLA"' -- dispatch --backend fa3 --mode extend --seq-lens 9000 --prefix-lens 8192 --disable-chunked-prefix-cache --json
expect fa3_deterministic 0 '"method":"MLA"' -- dispatch --backend fa3 --mode extend --seq-lens 10 --deterministic --json
expect cutlass_prefill 0 '"method":"MHA_CHUNKED_KV"' -- dispatch --backend cutlass_mla --mode extend --seq-lens 10 --json
expect fa3_decode 0 '"method":"MLA"' -- dispatch --backend fa3 --mode decode --seq-lens 10,20 --prefix-lens 9,19 --json
expect fa4_decode 0 '"method":"MHA_CHUNKED_KV"' -- dispatch --backend fa4 --mode decode --seq-lens 10 --prefix-lens 9 --json
expect triton_prefill 0 '"method":"MHA"' -- dispatch --backend triton --mode extend --seq-lens 10 --json
expect triton_prefix 0 '"method":"MLA"' -- dispatch --backend triton --mode extend --seq-lens 10 --prefix-lens 3 --json
expect trtllm 0 '"method":"MHA_CHUNKED_KV"' -- dispatch --backend trtllm_mla --mode extend --seq-lens 10 --prefix-lens 3 --json
expect verify_is_not_extend 0 '"method":"MLA"' -- dispatch --backend fa3 --mode target_verify --seq-lens 10 --prefix-lens 7 --json
expect rocm_default_aiter 0 '"method":"MHA","platform":"rocm".*"resolved":"MHA_ROCM"' -- \
  dispatch --platform rocm --mode extend --seq-lens 10 --prefix-lens 3 --json
expect rocm_fused_rope 0 '"method":"MLA_FUSED_ROPE_ROCM".*"resolved":"MLA_FUSED_ROPE_ROCM"' -- \
  dispatch --platform rocm --mode decode --seq-lens 10 --prefix-lens 9 --fused-decode-rope --json
# Built (a CUDA build carries the ROCm platform as rocm-on-cuda; a HIP build is the real one) or not.
case " ${MLA_BUILT_PLATFORMS:-cpu} " in
  *" rocm "*)
    for m in "extend --seq-lens 10 --prefix-lens 3:MHA_ROCM" "decode --seq-lens 10 --prefix-lens 9:MLA_ROCM" \
             "decode --seq-lens 10 --prefix-lens 9 --fused-decode-rope:MLA_FUSED_ROPE_ROCM" \
             "extend --seq-lens 9000 --prefix-lens 8192 --backend fa3:MHA_ONE_SHOT_ROCM" \
             "extend --seq-lens 10 --backend cutlass_mla:MHA_CHUNKED_KV_ROCM"; do
      # shellcheck disable=SC2086
      expect "rocm_twin_${m##*:}" 0 "\"resolved\":\"${m##*:}\",\"implemented\":true,\"serves\":true" -- \
        dispatch --platform rocm --mode ${m%%:*} --json
    done ;;
  *) expect rocm_not_built 0 '"implemented":false' -- dispatch --platform rocm --mode decode --seq-lens 10 --prefix-lens 9 --json ;;
esac
expect cpu_mha_with_prefix 0 '"method":"MHA".*"implemented":true,"serves":false,"reason":"MHA attends only' -- \
  dispatch --backend aiter --mode extend --seq-lens 10 --prefix-lens 3 --json
expect text_output 0 '^resolved: +MHA_ONE_SHOT$' -- dispatch --mode extend --seq-lens 5

# Bad values: exit 2, one line on stderr naming the problem, nothing on stdout.
expect unknown_backend 2 "unknown attention backend 'flash'.*fa3" -- dispatch --backend flash --seq-lens 5
expect unknown_mode 2 "unknown forward mode|mode 'prefill'" -- dispatch --mode prefill --seq-lens 5
expect unknown_platform 2 "unknown platform 'tpu'" -- dispatch --platform tpu --seq-lens 5
expect bad_list 2 "--seq-lens: 'x' is not a non-negative integer" -- dispatch --seq-lens 5,x
expect empty_item 2 "--seq-lens: '' is not" -- dispatch --seq-lens 5,,6
expect negative 2 "--prefix-lens: '-1'" -- dispatch --seq-lens 5 --prefix-lens -1
expect prefix_too_long 2 "prefix 9 is longer than its sequence 5" -- dispatch --seq-lens 5 --prefix-lens 9
expect lens_mismatch 2 "--prefix-lens has 2 values, --seq-lens has 1" -- dispatch --seq-lens 5 --prefix-lens 1,2
expect zero_capacity 2 "chunk-capacity must be positive" -- dispatch --seq-lens 5 --chunk-capacity 0
expect unknown_option 2 "--frobnicate" -- dispatch --frobnicate

# One layer against the float64 reference.
expect attn_mla 0 'PASS' -- attn --preset deepseek-v2-lite --requests 0:5,9:3 --method MLA
expect attn_auto 0 '^method MHA_ONE_SHOT' -- attn --preset deepseek-v2-lite --requests 0:4 --dtype bf16
expect attn_chunked 0 '"pass":true' -- attn --requests 40:3,0:2 --method MHA_CHUNKED_KV --chunk-capacity 8 --kv-dtype fp8_e4m3fn --json
expect attn_mha_prefix 1 'MHA.*cannot serve.*prefix' -- attn --requests 5:2 --method MHA
expect attn_rocm_twin 1 'MLA_ROCM is not implemented on platform cpu' -- attn --requests 0:2 --method MLA_ROCM
expect attn_bad_requests 2 "--requests: '5' is not PREFIX:NEW" -- attn --requests 5
expect attn_bad_preset 2 "unknown preset" -- attn --preset llama
expect attn_bad_dtype 2 "unknown dtype 'f8'" -- attn --dtype f8
expect attn_missing_config 2 "nonexistent.json" -- attn --config /nonexistent.json
expect attn_decode_two 2 "new_len must be 1 in decode mode" -- attn --mode decode --requests 3:2

# Models: logits, generate, inspect, demo on the committed HF checkpoints.
DATA=${DATA:-$(dirname "$0")/data}
M=$DATA/v3_tiny
expect logits 0 '^wrote .*logits \[5, 512\]; methods MHA_ONE_SHOT$' -- logits --model "$M" --ids 24,105,145,195,83 --out "$tmp/l.safetensors"
[ -s "$tmp/l.safetensors" ] && pass=$((pass + 1)) || { fail=$((fail + 1)); echo "FAIL logits_file"; }
# Values, not only files: the logits against transformers' own (oracle.safetensors: f32;
# oracle_bf16.safetensors: transformers in bf16), through --compare (an all-zero result never passes).
ids0=$(sed -n '/"ids": {/,/]/p' "$M/oracle.json" | grep -oE '[0-9]+' | tail -n +2 | paste -sd, -)
expect logits_values 0 'vs logits.0: relative L2 .* PASS$' -- logits --model "$M" --ids "$ids0" --compare "$M/oracle.safetensors:logits.0" --tolerance 5e-6 --out "$tmp/v.safetensors"
expect logits_values_decode 0 'methods MHA_ONE_SHOT,MLA,MLA; vs logits.0: .* PASS$' -- logits --model "$M" --ids "$ids0" --prefill-chunk 2 --decode-from 4 --compare "$M/oracle.safetensors:logits.0" --tolerance 5e-6 --out "$tmp/v2.safetensors"
expect logits_values_bf16 0 'PASS$' -- logits --model "$M" --ids "$ids0" --dtype bf16 --kv-dtype fp8_e4m3fn --compare "$M/oracle_bf16.safetensors:logits.0" --tolerance 0.1 --out "$tmp/v3.safetensors"
expect logits_chunked 0 'methods MHA_ONE_SHOT,MLA,MLA$' -- logits --model "$M" --ids 24,105,145,195,83 --prefill-chunk 2 --decode-from 4 --out "$tmp/l2.safetensors"
expect logits_forced 0 'methods MHA_CHUNKED_KV' -- logits --model "$M" --ids 24,105,145 --method MHA_CHUNKED_KV --out "$tmp/l3.safetensors"
expect logits_sharded 0 'logits \[3, 256\]' -- logits --model "$DATA/v3_norope_scaling" --ids 1,2,3 --out "$tmp/l4.safetensors"
expect generate 0 '^15,99,85,274,18,10,198,134,208,99,453,381$' -- generate --model "$M" --ids 313,482,298,474,414,405,94,97,305 --max-new-tokens 12
expect generate_json 0 '^\{"ids":\[15,99,85,274\],"methods":\["MHA_ONE_SHOT","MLA","MLA","MLA"\],"tokens_per_s":' -- \
  generate --model "$M" --ids 313,482,298,474,414,405,94,97,305 --max-new-tokens 4 --json
# The whole-model benchmark: decode rows per batch size and a prefill row, each against its roofline.
expect bench_model 0 '"x_roofline"' -- bench-model --model "$M" --batch 1,3 --context 8 --steps 2 --prefill 16,2x8 --reps 1
grep -c '"kind": "decode"' "$tmp/out" | grep -q '^2$' && grep -q '"kind": "prefill"' "$tmp/out" &&
  grep -c '"warmup_ms"' "$tmp/out" | grep -q '^2$' && pass=$((pass + 1)) ||
  { fail=$((fail + 1)); echo "FAIL bench_model_rows"; }
# With --temperature: decode steps draw sampled tokens and Ops::sample_rows is timed alone;
# --host-sampling without it is refused.
expect bench_model_sampled 0 '"kind": "sample_rows"' -- bench-model --model "$M" --batch 1,3 --context 8 --steps 2 --prefill 0 --reps 1 --temperature 0.8
grep -q '"sampling": "platform"' "$tmp/out" && pass=$((pass + 1)) || { fail=$((fail + 1)); echo "FAIL bench_model_sampled_rows"; }
expect bench_model_host_sampling_alone 2 'need --temperature' -- bench-model --model "$M" --host-sampling
# --context-spread: each request's context drawn from context·(1 ± S), the same draw every run.
expect bench_model_spread 0 '"context_max": 24' -- bench-model --model "$M" --batch 4 --context 16 --context-spread 0.5 --steps 2 --prefill 0 --reps 1
expect bench_model_spread_bad 2 'context-spread must be in \[0, 1\]' -- bench-model --model "$M" --context-spread 1.5
# --overlap: decode a step ahead (the tokens stay on the platform between steps), greedy and sampled.
expect bench_model_overlap 0 '"overlap": true' -- bench-model --model "$M" --batch 1,3 --context 8 --steps 3 --prefill 0 --reps 1 --overlap
expect bench_model_overlap_sampled 0 '"sampling": "platform"' -- bench-model --model "$M" --batch 3 --context 8 --steps 3 --prefill 0 --reps 1 --overlap --temperature 0.8
expect bench_model_overlap_host 2 'no --host-sampling' -- bench-model --model "$M" --overlap --temperature 0.8 --host-sampling
# --activity needs the device's own record of its work (CUPTI on CUDA): refused on the CPU.
expect bench_model_activity_cpu 1 'keeps no record of device activity' -- bench-model --model "$M" --batch 1 --context 8 --steps 2 --prefill 0 --reps 1 --activity
printf '313 482 298\n474,414 405\n94 97 305\n' >"$tmp/prompt.txt"
expect generate_file 0 '^15,99,85$' -- generate --model "$M" --prompt-file "$tmp/prompt.txt" --max-new-tokens 3
"$MLA" generate --model "$M" --ids 5,6,7 --max-new-tokens 8 --temperature 0.8 --top-p 0.9 --seed 3 >"$tmp/s1" 2>/dev/null
expect sampled_repeatable 0 "^$(cat "$tmp/s1")\$" -- generate --model "$M" --ids 5,6,7 --max-new-tokens 8 --temperature 0.8 --top-p 0.9 --seed 3
# The engine's sampler: top-k 1 and min-p 1 keep only the best token (greedy); seeds differ.
expect sampled_top_k1 0 '^15,99,85,274,18,10$' -- generate --model "$M" --ids 313,482,298,474,414,405,94,97,305 --max-new-tokens 6 --temperature 1.5 --top-k 1 --seed 9
expect sampled_min_p1 0 '^15,99,85,274,18,10$' -- generate --model "$M" --ids 313,482,298,474,414,405,94,97,305 --max-new-tokens 6 --temperature 1.5 --min-p 1 --seed 9
"$MLA" generate --model "$M" --ids 5,6,7 --max-new-tokens 8 --temperature 1.5 --seed 4 >"$tmp/s2" 2>/dev/null
"$MLA" generate --model "$M" --ids 5,6,7 --max-new-tokens 8 --temperature 1.5 --seed 5 >"$tmp/s3" 2>/dev/null
cmp -s "$tmp/s2" "$tmp/s3" && { fail=$((fail + 1)); echo "FAIL seeds_differ"; } || pass=$((pass + 1))
# Text in, text out through the model folder's own tokenizer and chat template: the ids of
# --prompt are the tokenizer's (with its BOS), and the output equals generate --ids of those ids.
ids=$("$MLA" tokenize --tokenizer "$M" --text "The quick brown fox" --add-special-tokens 2>/dev/null | tr -d '[] ')
expect text_prompt_ids 0 '^\[0,' -- tokenize --tokenizer "$M" --text "The quick brown fox" --add-special-tokens
"$MLA" generate --model "$M" --ids "$ids" --max-new-tokens 6 >"$tmp/g_ids" 2>/dev/null
"$MLA" generate --model "$M" --prompt "The quick brown fox" --max-new-tokens 6 --ignore-eos --json >"$tmp/g_text" 2>/dev/null
if grep -q "\"prompt_ids\":\[$ids\]" "$tmp/g_text" && grep -q "\"ids\":\[$(cat "$tmp/g_ids")\]" "$tmp/g_text" &&
   grep -q '"text":"' "$tmp/g_text"; then pass=$((pass + 1)); else
  fail=$((fail + 1)); echo "FAIL text_prompt: $(cat "$tmp/g_text") vs ids $ids -> $(cat "$tmp/g_ids")"; fi
printf '[{"role": "user", "content": "Hi!"}]' >"$tmp/chat.json"
chat_ids=$("$MLA" chat-template --tokenizer "$M" --messages-file "$tmp/chat.json" --add-generation-prompt --json 2>/dev/null |
           sed 's/.*"ids":\[\([0-9,]*\)\].*/\1/')
expect chat_prompt 0 "\"prompt_ids\":\[$chat_ids\]" -- generate --model "$M" --messages-file "$tmp/chat.json" --max-new-tokens 3 --json
expect text_prompt_no_tokenizer 1 "tokenizer.json" -- generate --model "$DATA/v2_greedy" --prompt "Hi"
expect inspect 0 '^139 tensors, 371664 parameters' -- inspect --model "$M"
expect inspect_kv 0 'kv cache per token: 144 values' -- inspect --model "$M"
expect demo 0 '^OK: same tokens, same logits.$' -- demo

# Bad input: one line, the documented exit code, no output file.
bad() {  # bad NAME RC PATTERN -- ARGS (an --out of $tmp/bad.safetensors must not appear)
  rm -f "$tmp/bad.safetensors"
  expect "$@"
  if [ -e "$tmp/bad.safetensors" ] || ls "$tmp"/bad.safetensors.* >/dev/null 2>&1; then
    fail=$((fail + 1)); echo "FAIL $1: left an output file"
  fi
}
bad logits_values_differ 1 "logits differ from logits.0 .*relative L2" -- logits --model "$M" --ids "$(echo "$ids0" | tr ',' '\n' | tac | paste -sd, -)" --compare "$M/oracle.safetensors:logits.0" --out "$tmp/bad.safetensors"
bad logits_compare_shape 1 "has [0-9]+ values, the logits [0-9]+ \\(\\[3, " -- logits --model "$M" --ids 1,2,3 --compare "$M/oracle.safetensors:logits.0" --out "$tmp/bad.safetensors"
bad logits_compare_form 2 "expected FILE:TENSOR" -- logits --model "$M" --ids 1,2,3 --compare "$M/oracle.safetensors" --out "$tmp/bad.safetensors"
bad id_outside_vocab 2 "id 512 at index 1 is outside the vocabulary \\[0, 512\\)" -- logits --model "$M" --ids 3,512 --out "$tmp/bad.safetensors"
bad decode_from_past 2 "--decode-from 9 is past the 2 ids" -- logits --model "$M" --ids 3,4 --decode-from 9 --out "$tmp/bad.safetensors"
bad missing_out 2 "--out is required" -- logits --model "$M" --ids 3,4
bad missing_model 1 "model folder '/nonexistent' does not exist" -- logits --model /nonexistent --ids 3 --out "$tmp/bad.safetensors"
bad mha_with_prefix 1 "MHA.*cannot serve.*prefix" -- logits --model "$M" --ids 3,4,5 --prefill-chunk 1 --method MHA --out "$tmp/bad.safetensors"
bad unknown_method 2 "unknown forward method 'FAST'" -- logits --model "$M" --ids 3 --method FAST --out "$tmp/bad.safetensors"
bad unknown_backend 2 "unknown attention backend 'x'" -- logits --model "$M" --ids 3 --backend x --out "$tmp/bad.safetensors"
mk() { rm -rf "$tmp/$1"; cp -r "$M" "$tmp/$1"; }
mk trunc; head -c 300000 "$M/model.safetensors" >"$tmp/trunc/model.safetensors"
bad truncated 1 "model.safetensors.*(past the end|beyond)" -- logits --model "$tmp/trunc" --ids 3 --out "$tmp/bad.safetensors"
mk badtype; sed -i 's/"model_type": "deepseek_v3"/"model_type": "llama"/' "$tmp/badtype/config.json"
bad unknown_model_type 1 "model_type.*llama" -- logits --model "$tmp/badtype" --ids 3 --out "$tmp/bad.safetensors"
mk layers; sed -i 's/"num_hidden_layers": 3/"num_hidden_layers": 4/' "$tmp/layers/config.json"
bad missing_tensor 1 "missing tensor 'model.layers.3.input_layernorm.weight'" -- logits --model "$tmp/layers" --ids 3 --out "$tmp/bad.safetensors"
mk shape; sed -i 's/"intermediate_size": 96/"intermediate_size": 97/' "$tmp/shape/config.json"
bad wrong_shape 1 "tensor 'model.layers.0.mlp.gate_proj.weight' has shape \\[96, 64\\], expected \\[97, 64\\]" -- logits --model "$tmp/shape" --ids 3 --out "$tmp/bad.safetensors"
mk zero; sed -i 's/"kv_lora_rank": 32/"kv_lora_rank": 0/' "$tmp/zero/config.json"
bad zero_dim 1 "kv_lora_rank.*positive" -- logits --model "$tmp/zero" --ids 3 --out "$tmp/bad.safetensors"
mkdir -p "$tmp/noconfig"
bad no_config 1 "cannot open config" -- generate --model "$tmp/noconfig" --ids 3
bad generate_bad_ids 2 "--ids: 'x' is not" -- generate --model "$M" --ids 3,x
bad generate_both 2 "excludes|--prompt-file" -- generate --model "$M" --ids 3 --prompt-file "$tmp/prompt.txt"
bad generate_bad_top_k 2 "--top-k must be >= 0" -- generate --model "$M" --ids 3 --top-k -1

echo "cli: $pass passed, $fail failed"
[ $fail -eq 0 ]
