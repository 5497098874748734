// mla/config.h — the attention part of a DeepSeek-V2/V3 HF config.json. Field names are HF's.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace mla {

struct RopeScaling {
  std::string type = "none";  // "none" or "yarn" (rope_scaling.type / rope_type)
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 1.0;
  double mscale_all_dim = 0.0;
};

struct AttentionConfig {
  std::string model_type = "deepseek_v3";  // deepseek_v2 | deepseek_v3
  int64_t hidden_size = 0;
  int64_t num_attention_heads = 0;
  int64_t q_lora_rank = 0;  // 0 means null: a single q_proj (V2-Lite)
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  double rms_norm_eps = 1e-6;     // decoder norms (input, post-attention, final)
  double latent_norm_eps = 1e-6;  // q_a_layernorm, kv_a_layernorm: fixed 1e-6, as in transformers
  int64_t max_position_embeddings = 0;
  bool rope_interleave = true;  // DeepSeek rotates adjacent pairs (2i, 2i+1); false: NeoX halves
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;

  bool has_q_lora() const { return q_lora_rank > 0; }
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }  // 192 for V3
  int64_t kv_row_dim() const { return kv_lora_rank + qk_rope_head_dim; }     // 576 for V3
  // qk_head_dim^-0.5 · m², m = 0.1·mscale_all_dim·ln(factor) + 1 for YaRN with factor > 1.
  double softmax_scale() const;

  // Throws Error naming the first field that is non-positive or inconsistent.
  void validate() const;
};

// Parses the attention part of an HF config.json (model_type deepseek_v2 / deepseek_v3). Accepts
// the old form (rope_theta + rope_scaling {type|rope_type, factor, ...}) and the new one
// (rope_parameters {rope_type, rope_theta, factor, ...}). Missing or inconsistent fields throw an
// Error naming the field.
AttentionConfig parse_attention_config(const nlohmann::json& j);
AttentionConfig parse_attention_config_text(std::string_view text);
AttentionConfig load_attention_config(const std::string& path);

// Built-in presets: "deepseek-v3" (also R1) and "deepseek-v2-lite".
AttentionConfig preset_config(std::string_view name);
std::vector<std::string> preset_names();

}  // namespace mla
