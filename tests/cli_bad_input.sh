#!/usr/bin/env bash
# Bad input everywhere a user can reach, through the mla CLI, table-driven: broken models (the
# safetensors file, the index, config.json), broken batches and unsupported method/platform
# pairs. Each case must exit with the documented code (1: the work failed; 2: bad command-line
# values), print exactly one line on stderr that names the problem, print nothing on stdout, not
# crash (no signal, no sanitizer report) and leave no output file. Cases tests/cli_tests.sh
# already covers (truncated file, unknown model_type, zero dimension, ...) are not repeated.
# The broken files are made here from a temp copy of tests/data/v3_tiny with bash, od, head and
# tail only.
set -u
source "$(dirname "$0")/cli_lib.sh"
DATA=${DATA:-$(dirname "$0")/data}
M=$DATA/v3_tiny
SHARDED=$DATA/v3_norope_scaling

# check NAME RC PATTERN -- ARGS...: runs mla ARGS; --out, where given, is $tmp/out.safetensors.
check() {
  local name=$1 want_rc=$2 pattern=$3
  shift 4
  rm -f "$tmp"/out.safetensors*
  "$MLA" "$@" >"$tmp/stdout" 2>"$tmp/stderr"
  local rc=$? why=""
  [ "$rc" -eq "$want_rc" ] || why="exit $rc, want $want_rc"
  [ -z "$why" ] && [ "$(wc -l <"$tmp/stderr")" -ne 1 ] && why="stderr is not one line"
  [ -z "$why" ] && ! grep -qE -- "$pattern" "$tmp/stderr" && why="stderr does not match '$pattern'"
  [ -z "$why" ] && [ -s "$tmp/stdout" ] && why="something on stdout"
  [ -z "$why" ] && ls "$tmp"/out.safetensors* >/dev/null 2>&1 && why="left an output file"
  if [ -z "$why" ]; then
    pass=$((pass + 1))
  else
    fail=$((fail + 1))
    echo "FAIL $name: $why"
    echo "  stdout: $(head -c 300 "$tmp/stdout")"
    echo "  stderr: $(head -c 600 "$tmp/stderr")"
  fi
}

# A broken model must fail the same way in every command that loads it.
model_case() {  # model_case NAME PATTERN DIR
  check "$1/logits" 1 "$2" -- logits --model "$3" --ids 3,4 --out "$tmp/out.safetensors"
  check "$1/generate" 1 "$2" -- generate --model "$3" --ids 3,4 --max-new-tokens 2 --json
}
# ... and the file-level breaks also in `inspect`, which reads only the headers.
file_case() {  # file_case NAME PATTERN DIR
  model_case "$@"
  check "$1/inspect" 1 "$2" -- inspect --model "$3"
}

# ---- safetensors surgery ------------------------------------------------------------------------
le64() {  # the 8 little-endian bytes of $1
  local i
  for i in 0 1 2 3 4 5 6 7; do printf "\\x$(printf %02x $((($1 >> (8 * i)) & 255)))"; done
}
hlen() { od -An -t u8 -N8 "$1" | tr -d ' '; }
header() { tail -c +9 "$1" | head -c "$(hlen "$1")"; }
data() { tail -c +$((9 + $(hlen "$1"))) "$1"; }
# rewrite FILE SED_EXPR: the header edited by sed (its length may change: offsets are relative to
# the data section), the data kept.
rewrite() {
  local f=$1 h
  header "$f" | LC_ALL=C sed "$2" >"$tmp/h"
  data "$f" >"$tmp/d"
  { le64 "$(stat -c %s "$tmp/h")"; cat "$tmp/h" "$tmp/d"; } >"$f"
}
copy() { rm -rf "$tmp/$1"; cp -r "$M" "$tmp/$1"; echo "$tmp/$1"; }
ST=model.safetensors
NORM='"model.layers.0.input_layernorm.weight":{"dtype":"BF16","shape":\[64\],"data_offsets":\[131200,131328\]}'
NORM_NEW() { echo "\"model.layers.0.input_layernorm.weight\":$1"; }

d=$(copy past_end)
rewrite "$d/$ST" "s/$NORM/$(NORM_NEW '{"dtype":"BF16","shape":[64],"data_offsets":[9999872,10000000]}')/"
file_case offsets_past_end "input_layernorm.weight.*data_offsets \\[9999872, 10000000\\] run past the end" "$d"

d=$(copy header_past_end)
{ le64 99999999; tail -c +9 "$M/$ST"; } >"$d/$ST"
file_case header_length_past_end "header length 99999999 runs past the end of the file" "$d"

d=$(copy overlap)
rewrite "$d/$ST" "s/$NORM/$(NORM_NEW '{"dtype":"BF16","shape":[64],"data_offsets":[131136,131264]}')/"
file_case overlapping_tensors "tensors 'model.embed_tokens.weight'.*and 'model.layers.0.input_layernorm.weight'.*overlap" "$d"

d=$(copy dtype_size)
rewrite "$d/$ST" "s/$NORM/$(NORM_NEW '{"dtype":"F32","shape":[64],"data_offsets":[131200,131328]}')/"
file_case dtype_size_mismatch "input_layernorm.weight.*do not match dtype F32 × shape \\[64\\] = 256 bytes" "$d"

d=$(copy dtype_unknown)
rewrite "$d/$ST" "s/$NORM/$(NORM_NEW '{"dtype":"Q4_K","shape":[64],"data_offsets":[131200,131328]}')/"
file_case dtype_unknown "input_layernorm.weight.*unknown dtype 'Q4_K'" "$d"

d=$(copy dtype_unsupported)
rewrite "$d/$ST" "s/$NORM/$(NORM_NEW '{"dtype":"I16","shape":[64],"data_offsets":[131200,131328]}')/"
model_case dtype_unsupported "input_layernorm.weight' has unsupported dtype I16" "$d"

d=$(copy shape)
rewrite "$d/$ST" "s/$NORM/$(NORM_NEW '{"dtype":"BF16","shape":[2,32],"data_offsets":[131200,131328]}')/"
model_case shape_mismatch "input_layernorm.weight' has shape \\[2, 32\\], expected \\[64\\]" "$d"

d=$(copy missing)
rewrite "$d/$ST" "s/input_layernorm.weight\"/input_layernorm.weighX\"/"
model_case missing_tensor "missing tensor 'model.layers.0.input_layernorm.weight'" "$d"

d=$(copy non_utf8)
rewrite "$d/$ST" "s/input_layernorm.weight\"/input_layernorm.weigh\\xff\"/"
file_case non_utf8_header "header is not valid JSON.*(UTF-8|utf-8)" "$d"

d=$(copy nul)
rewrite "$d/$ST" 's/"format":"pt"/"format":"p\x00"/'
file_case nul_in_header "a NUL byte at header offset" "$d"

d=$(copy not_json)
rewrite "$d/$ST" 's/^{/[/'
file_case header_not_json "header is not valid JSON" "$d"

d=$(copy huge_header)
{ le64 10737418240; tail -c +9 "$M/$ST"; } >"$d/$ST"
file_case header_length_10gb "header length 10737418240 exceeds the 100000000 byte limit" "$d"

d=$(copy negative_dim)
rewrite "$d/$ST" "s/$NORM/$(NORM_NEW '{"dtype":"BF16","shape":[-64],"data_offsets":[131200,131328]}')/"
file_case negative_shape "shape \\[-64\\] has a negative dimension" "$d"

d=$(copy short)
head -c 5 "$M/$ST" >"$d/$ST"
file_case five_byte_file "file is 5 bytes, too short for the 8-byte header length" "$d"

d=$(copy empty)
: >"$d/$ST"
file_case empty_file "file is 0 bytes" "$d"

d=$(copy cut_header)
head -c 4000 "$M/$ST" >"$d/$ST"
file_case cut_in_header "header length 15336 runs past the end of the file \\(4000 bytes" "$d"

d=$(copy no_weights)
rm "$d/$ST"
file_case no_safetensors "neither model.safetensors.index.json nor model.safetensors" "$d"

d=$(copy weights_dir)
rm "$d/$ST" && mkdir "$d/$ST"
file_case safetensors_is_a_folder "model.safetensors: not a regular file" "$d"

# ---- a sharded checkpoint's index ---------------------------------------------------------------
copy_sharded() { rm -rf "$tmp/$1"; cp -r "$SHARDED" "$tmp/$1"; echo "$tmp/$1"; }
IDX=model.safetensors.index.json
d=$(copy_sharded shard_missing)
rm "$d/model-00003-of-00005.safetensors"
file_case shard_missing "shard 'model-00003-of-00005.safetensors' .* does not exist" "$d"

d=$(copy_sharded shard_escape)
sed -i '0,/model-00001-of-00005.safetensors/s//..\/v3_tiny\/model.safetensors/' "$d/$IDX"
file_case shard_outside_folder "names shard '../v3_tiny/model.safetensors', which is not a file inside the folder" "$d"

d=$(copy_sharded shard_wrong)
sed -i '0,/"lm_head.weight": "model-0000[0-9]-of-00005.safetensors"/s//"lm_head.weight": "model-00005-of-00005.safetensors"/' "$d/$IDX"
if grep -q '"lm_head.weight": "model-00005-of-00005.safetensors"' "$d/$IDX"; then
  file_case shard_lacks_tensor "maps tensor 'lm_head.weight' to shard 'model-00005-of-00005.safetensors', which lacks it" "$d"
else
  fail=$((fail + 1)); echo "FAIL shard_lacks_tensor: could not edit the index"
fi

d=$(copy_sharded index_broken)
printf '{"weight_map": {"lm_head.weight": ' >"$d/$IDX"
file_case index_not_json "model.safetensors.index.json: not valid JSON" "$d"

# ---- config.json --------------------------------------------------------------------------------
cfg_case() {  # cfg_case NAME PATTERN SED_EXPR
  local d
  d=$(copy "cfg_$1")
  sed -i "$3" "$d/config.json"
  model_case "config_$1" "$2" "$d"
}
cfg_case negative_dim "field 'kv_lora_rank' must be a positive integer \\(got -32\\)" 's/"kv_lora_rank": 32/"kv_lora_rank": -32/'
cfg_case zero_heads "field 'num_attention_heads' must be a positive integer \\(got 0\\)" 's/"num_attention_heads": 3,/"num_attention_heads": 0,/'
cfg_case negative_vocab "field 'vocab_size' must be a positive integer \\(got -512\\)" 's/"vocab_size": 512/"vocab_size": -512/'
cfg_case huge_layers "field 'num_hidden_layers' must be at most 2147483647" 's/"num_hidden_layers": 3/"num_hidden_layers": 9223372036854775807/'
cfg_case float_dim "field 'hidden_size' must be a positive integer \\(got 64.5\\)" 's/"hidden_size": 64/"hidden_size": 64.5/'
cfg_case string_dim "field 'v_head_dim' must be a positive integer \\(got \"32\"\\)" 's/"v_head_dim": 32/"v_head_dim": "32"/'
cfg_case odd_rope "field 'qk_rope_head_dim' must be even" 's/"qk_rope_head_dim": 16/"qk_rope_head_dim": 15/'
cfg_case missing_field "field 'hidden_size' is missing" '/"hidden_size"/d'
cfg_case not_json "config.json: not valid JSON" 's/^{/{{/'
cfg_case non_utf8 "config.json: not valid JSON" 's/"silu"/"sil\xff"/'
cfg_case rope_type "unsupported rope type" 's/"rope_type": "yarn"/"rope_type": "dynamic"/'
cfg_case experts_per_tok "num_experts_per_tok 17 exceeds n_routed_experts 16" 's/"num_experts_per_tok": 4/"num_experts_per_tok": 17/'
cfg_case no_q_lora "missing tensor 'model.layers.0.self_attn.q_proj.weight'" 's/"q_lora_rank": 48/"q_lora_rank": null/'

# ---- broken batches -----------------------------------------------------------------------------
check dispatch_prefix_past_seq 2 "request 1: prefix 12 is longer than its sequence 11" -- dispatch --seq-lens 5,11 --prefix-lens 0,12
check dispatch_empty_batch 2 "--seq-lens: no requests" -- dispatch --mode extend
check dispatch_empty_list 2 "--seq-lens: no requests" -- dispatch --mode decode --seq-lens ""
check dispatch_verify_uneven 2 "new_len must equal request 0's" -- dispatch --mode target_verify --seq-lens 10,10 --prefix-lens 7,8
check dispatch_decode_two_new 2 "new_len must be 1 in decode mode" -- dispatch --mode decode --seq-lens 10 --prefix-lens 8
check dispatch_idle_tokens 2 "new_len must be 0 in idle mode" -- dispatch --mode idle --seq-lens 10 --prefix-lens 8
check dispatch_beyond_int32 2 "exceeds the int32 range" -- dispatch --seq-lens 2147483648
check dispatch_id_too_long 2 "--seq-lens: '12345678901234567890' is too large" -- dispatch --seq-lens 12345678901234567890
check dispatch_newline 2 "--seq-lens: '5\\\\x0a6' is not a non-negative integer" -- dispatch --seq-lens "$(printf '5\n6')"
check attn_past_context 2 "request 1 reaches 163841 tokens, past max_position_embeddings 163840" -- attn --requests 0:2,163840:1 --no-check
check attn_empty_requests 2 "--requests: '' is not PREFIX:NEW" -- attn --requests ""
check attn_pool_past_int32 1 "exceeds the int32 slot range" -- attn --requests 0:2 --page-size 4294967296
check attn_zero_page 2 "page-size|page_size" -- attn --requests 0:2 --page-size 0
check logits_empty_ids 2 "--ids: no token ids given" -- logits --model "$M" --ids "" --out "$tmp/out.safetensors"
check logits_negative_id 2 "--ids: '-3' is not a non-negative integer" -- logits --model "$M" --ids 1,-3 --out "$tmp/out.safetensors"
check logits_past_context 1 "past max_position_embeddings 512" -- logits --model "$M" --ids "$(printf '1,%.0s' $(seq 1 512))1" --out "$tmp/out.safetensors"
: >"$tmp/empty.txt"
check generate_empty_prompt_file 2 "holds no ids" -- generate --model "$M" --prompt-file "$tmp/empty.txt"
printf '1 2\n3 x\n' >"$tmp/bad_prompt.txt"
check generate_bad_prompt_file 2 "--prompt-file: 'x' is not a non-negative integer" -- generate --model "$M" --prompt-file "$tmp/bad_prompt.txt"
check generate_missing_prompt_file 2 "cannot open" -- generate --model "$M" --prompt-file "$tmp/nonexistent.txt"

# ---- unsupported method / platform pairs --------------------------------------------------------
# The ROCm platform: not built (CPU-only builds), or built without a device here (a CUDA build runs
# it as rocm-on-cuda; a HIP build needs an AMD GPU). MLA_BUILT_PLATFORMS comes from CMake.
no_rocm="platform rocm is not built into this mla"
case " ${MLA_BUILT_PLATFORMS:-cpu} " in *" rocm "*) no_rocm="rocm: no (CUDA|HIP) device is available" ;; esac
check attn_platform_rocm 1 "$no_rocm" -- attn --requests 0:2 --platform rocm
check logits_platform_rocm 1 "$no_rocm" -- logits --model "$M" --ids 3 --platform rocm --out "$tmp/out.safetensors"
check generate_platform_rocm 1 "$no_rocm" -- generate --model "$M" --ids 3 --platform rocm
check rocm_bad_arch 2 "unknown ROCm arch 'gfx1100'" -- attn --requests 0:2 --platform rocm --rocm-arch gfx1100
check rocm_mxfp4_needs_gfx950 2 "absorb weights mxfp4 need gfx950" -- attn --requests 0:2 --platform rocm --rocm-absorb mxfp4
check rocm_fp8_on_gfx90a 2 "gfx90a lacks" -- logits --model "$M" --ids 3 --platform rocm --rocm-arch gfx90a --rocm-absorb fp8 --out "$tmp/out.safetensors"
check rocm_flavour_mismatch 2 "fp8 flavour e4m3fn is not native on gfx942" -- generate --model "$M" --ids 3 --platform rocm --rocm-fp8 e4m3fn
check rocm_bad_absorb 2 "unknown absorb weight format 'int4'" -- attn --requests 0:2 --rocm-absorb int4
check logits_method_rocm 1 "forward method MLA_ROCM is not implemented on platform cpu" -- logits --model "$M" --ids 3 --method MLA_ROCM --out "$tmp/out.safetensors"
check generate_method_rocm 1 "forward method MHA_ROCM is not implemented on platform cpu" -- generate --model "$M" --ids 3 --method MHA_ROCM
check attn_fused_rope 1 "MLA_FUSED_ROPE_ROCM is not implemented on platform cpu" -- attn --requests 0:2 --method MLA_FUSED_ROPE_ROCM
check attn_unknown_platform 2 "unknown platform 'tpu'" -- attn --requests 0:2 --platform tpu
check logits_unknown_platform 2 "unknown platform 'metal'" -- logits --model "$M" --ids 3 --platform metal --out "$tmp/out.safetensors"
# Random weights: the shape must be known, the layer count in range; not with --model; a text
# prompt needs a tokenizer.
check random_unknown_shape 1 "unknown model shape 'deepseek-v9'" -- generate --random-weights deepseek-v9 --ids 1
check random_bad_layers 1 "the layer count after ':' must be 1..27" -- generate --random-weights deepseek-v2-lite:99 --ids 1
check random_and_model 2 "excludes" -- generate --random-weights deepseek-v2-lite --model "$M" --ids 1
check model_or_random 2 "give the model with --model DIR or --random-weights SHAPE" -- generate --ids 1
check random_text_prompt 2 "a text prompt needs --tokenizer" -- generate --random-weights deepseek-v2-lite:1 --prompt hi
check shape_unknown 1 "unknown model shape 'x'" -- shape x

echo "cli bad input: $pass passed, $fail failed"
[ $fail -eq 0 ]
