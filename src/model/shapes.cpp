// Named DeepSeek shapes: the HF config.json of each released model (weights not included), so a
// model of real size can be built with random weights and no checkpoint.
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "mla/error.h"
#include "mla/model.h"

namespace mla {
namespace {

struct NamedShape {
  const char* name;
  const char* config;
};

// deepseek-ai/DeepSeek-V2-Lite, DeepSeek-V2 and DeepSeek-V3 config.json (architecture fields).
constexpr NamedShape kShapes[] = {
    {"deepseek-v2-lite", R"({
  "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
  "vocab_size": 102400, "hidden_size": 2048, "intermediate_size": 10944, "moe_intermediate_size": 1408,
  "num_hidden_layers": 27, "num_attention_heads": 16, "num_key_value_heads": 16,
  "n_shared_experts": 2, "n_routed_experts": 64, "num_experts_per_tok": 6, "routed_scaling_factor": 1.0,
  "n_group": 1, "topk_group": 1, "topk_method": "greedy", "scoring_func": "softmax", "norm_topk_prob": false,
  "first_k_dense_replace": 1, "moe_layer_freq": 1, "kv_lora_rank": 512, "q_lora_rank": null,
  "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "hidden_act": "silu",
  "max_position_embeddings": 163840, "initializer_range": 0.02, "rms_norm_eps": 1e-06,
  "rope_theta": 10000, "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
    "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707},
  "attention_bias": false, "attention_dropout": 0.0, "tie_word_embeddings": false,
  "bos_token_id": 100000, "eos_token_id": 100001, "torch_dtype": "bfloat16"
})"},
    {"deepseek-v2", R"({
  "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
  "vocab_size": 102400, "hidden_size": 5120, "intermediate_size": 12288, "moe_intermediate_size": 1536,
  "num_hidden_layers": 60, "num_attention_heads": 128, "num_key_value_heads": 128,
  "n_shared_experts": 2, "n_routed_experts": 160, "num_experts_per_tok": 6, "routed_scaling_factor": 16.0,
  "n_group": 8, "topk_group": 3, "topk_method": "group_limited_greedy", "scoring_func": "softmax",
  "norm_topk_prob": false, "first_k_dense_replace": 1, "moe_layer_freq": 1, "kv_lora_rank": 512,
  "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "hidden_act": "silu",
  "max_position_embeddings": 163840, "initializer_range": 0.02, "rms_norm_eps": 1e-06,
  "rope_theta": 10000, "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
    "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707},
  "attention_bias": false, "attention_dropout": 0.0, "tie_word_embeddings": false,
  "bos_token_id": 100000, "eos_token_id": 100001, "torch_dtype": "bfloat16"
})"},
    {"deepseek-v3", R"({
  "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
  "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
  "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
  "n_shared_experts": 1, "n_routed_experts": 256, "num_experts_per_tok": 8, "routed_scaling_factor": 2.5,
  "n_group": 8, "topk_group": 4, "topk_method": "noaux_tc", "scoring_func": "sigmoid", "norm_topk_prob": true,
  "first_k_dense_replace": 3, "moe_layer_freq": 1, "kv_lora_rank": 512, "q_lora_rank": 1536,
  "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "hidden_act": "silu",
  "max_position_embeddings": 163840, "initializer_range": 0.02, "rms_norm_eps": 1e-06,
  "rope_theta": 10000, "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
    "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
  "attention_bias": false, "attention_dropout": 0.0, "tie_word_embeddings": false,
  "bos_token_id": 0, "eos_token_id": 1, "torch_dtype": "bfloat16"
})"},
};

}  // namespace

std::vector<std::string> named_model_shapes() {
  std::vector<std::string> v;
  for (const NamedShape& s : kShapes) v.push_back(s.name);
  return v;
}

std::string named_model_config_json(std::string_view spec) {
  const size_t colon = spec.find(':');
  const std::string_view name = spec.substr(0, colon);
  for (const NamedShape& s : kShapes) {
    if (name != s.name) continue;
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(s.config);
    if (colon != std::string_view::npos) {
      const std::string n(spec.substr(colon + 1));
      size_t used = 0;
      long layers = 0;
      try {
        layers = std::stol(n, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      const long all = j["num_hidden_layers"].get<long>();
      if (used != n.size() || layers < 1 || layers > all)
        fail("model shape '{}': the layer count after ':' must be 1..{} (got '{}')", spec, all, n);
      j["num_hidden_layers"] = layers;
    }
    return j.dump(2);
  }
  fail("unknown model shape '{}' (known: {}; NAME:N keeps N layers)", name, fmt::join(named_model_shapes(), ", "));
}

ModelConfig named_model_config(std::string_view spec) {
  return parse_model_config_text(named_model_config_json(spec), std::string(spec));
}

}  // namespace mla
