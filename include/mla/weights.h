// mla/weights.h — the attention layer's weights, as HF names and shapes them.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "mla/config.h"
#include "mla/tensor.h"

namespace mla {

// Host tensors, [out_features, in_features] like torch Linear. Float dtypes (f64, f32, bf16, f16);
// fp8 checkpoints are dequantized on load.
struct AttentionWeights {
  Tensor q_a_proj;            // [q_lora_rank, hidden_size]                      (q_lora_rank set)
  Tensor q_a_layernorm;       // [q_lora_rank]                                   (q_lora_rank set)
  Tensor q_b_proj;            // [H * qk_head_dim, q_lora_rank]                   (q_lora_rank set)
  Tensor q_proj;              // [H * qk_head_dim, hidden_size]                   (q_lora_rank null)
  Tensor kv_a_proj_with_mqa;  // [kv_lora_rank + qk_rope_head_dim, hidden_size]
  Tensor kv_a_layernorm;      // [kv_lora_rank]
  Tensor kv_b_proj;           // [H * (qk_nope_head_dim + v_head_dim), kv_lora_rank]
  Tensor o_proj;              // [hidden_size, H * v_head_dim]

  // Throws Error naming the first missing or misshapen tensor.
  void validate(const AttentionConfig& c) const;
  // Every tensor converted to `dtype` (absent ones stay absent).
  AttentionWeights to(DType dtype) const;
};

// One weight of the layer: its HF name (without ".weight"), member, expected shape, and whether
// this config uses it. Order is the order of validation, loading and random generation.
struct AttentionWeightSlot {
  const char* name;
  Tensor AttentionWeights::*member;
  Shape shape;
  bool used;
  bool norm;  // a layernorm weight (1-D), not a projection
};
std::vector<AttentionWeightSlot> attention_weight_slots(const AttentionConfig& c);

// Random weights with unit-scale activations (normal, std 1/sqrt(fan_in); norms near 1).
AttentionWeights random_attention_weights(const AttentionConfig& c, uint64_t seed,
                                          DType dtype = DType::F32);

// Looks a tensor up by its full name; nullopt when absent.
using TensorLookup = std::function<std::optional<Tensor>(const std::string&)>;

// Loads `<prefix>q_a_proj.weight`, ... (prefix e.g. "model.layers.0.self_attn."). An fp8 e4m3fn
// weight must come with `<name>_scale_inv` (f32 [ceil(N/128), ceil(K/128)]) and is dequantized to
// `dtype`. Throws Error naming a missing or misshapen tensor.
AttentionWeights load_attention_weights(const AttentionConfig& c, const TensorLookup& get,
                                        const std::string& prefix, DType dtype = DType::F32);

// One tensor by its full name, of the expected shape, as `dtype`: float tensors are converted,
// an fp8 e4m3fn tensor is dequantized with its `<name>_scale_inv` 128×128 block scales. Throws
// Error naming a missing, misshapen or wrongly typed tensor.
Tensor load_weight(const TensorLookup& get, const std::string& name, const Shape& shape,
                   DType dtype);

// The checks load_weight makes before converting: Error naming a missing or misshapen tensor, one
// not on the host, or one neither float nor fp8. Returns *t.
const Tensor& check_weight(const std::optional<Tensor>& t, const std::string& name, const Shape& shape);

// w[N, K] fp8 · scale_inv[ceil(N/block), ceil(K/block)] per block → dtype. Edge blocks are partial.
Tensor dequantize_block_fp8(const Tensor& w, const Tensor& scale_inv, DType dtype,
                            int64_t block = 128);

// kv_b_proj [H·(dn+dv), kv_lora_rank] → w_kc [H, dn, kv_lora_rank] (rows 0..dn-1 of each head's
// block) and w_vc [H, dv, kv_lora_rank] (the next dv rows); and back.
struct AbsorbedWeights {
  Tensor w_kc;  // [H, qk_nope_head_dim, kv_lora_rank]
  Tensor w_vc;  // [H, v_head_dim, kv_lora_rank]
};
AbsorbedWeights split_kv_b_proj(const AttentionConfig& c, const Tensor& kv_b_proj);
Tensor merge_kv_b_proj(const AttentionConfig& c, const AbsorbedWeights& a);

}  // namespace mla
