// mla/model_config.h — a whole DeepSeek-V2/V3 model's HF config.json. Field names are HF's.
#pragma once
#include <cstdint>
#include <string>

#include "mla/config.h"

namespace mla {

struct ModelConfig {
  AttentionConfig attn;  // hidden_size, heads, ranks, RoPE, rms_norm_eps, model_type
  int64_t vocab_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t intermediate_size = 0;       // dense MLP width
  int64_t moe_intermediate_size = 0;   // routed and shared expert width
  int64_t n_routed_experts = 0;        // 0: every layer is dense
  int64_t n_shared_experts = 0;        // shared MLP width = moe_intermediate_size · n_shared_experts
  int64_t num_experts_per_tok = 0;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  int64_t first_k_dense_replace = 0;
  int64_t moe_layer_freq = 1;         // read but, as in transformers, not used
  double routed_scaling_factor = 1.0;
  bool norm_topk_prob = false;
  std::string scoring_func;  // "sigmoid" (V3) or "softmax" (V2)
  std::string topk_method;   // V3: "noaux_tc"; V2: "greedy" or "group_limited_greedy"
  bool tie_word_embeddings = false;
  double initializer_range = 0.02;  // the std of random weights (transformers' init)

  const std::string& model_type() const { return attn.model_type; }
  int64_t hidden_size() const { return attn.hidden_size; }
  bool is_moe_layer(int64_t layer) const;
  // KV-cache bytes per token: layers × (kv_lora_rank + qk_rope_head_dim) × element size.
  int64_t kv_bytes_per_token(int64_t element_size) const;
  void validate() const;  // Error naming the first bad field
};

// Reads config.json (or a folder's config.json). Errors name the file and the field.
ModelConfig load_model_config(const std::string& path);
ModelConfig parse_model_config_text(std::string_view text, const std::string& src = "config.json");

}  // namespace mla
