// model_config.cpp — the whole-model part of a DeepSeek-V2/V3 HF config.json. Absent MoE fields
// take the defaults of transformers' DeepseekV2Config / DeepseekV3Config.
#include "mla/model_config.h"

#include "core/json_fields.h"

namespace mla {

using detail::Fields;
using detail::json;

bool ModelConfig::is_moe_layer(int64_t layer) const {
  // transformers (V2 and V3) ignores moe_layer_freq: every layer from first_k_dense_replace on.
  return n_routed_experts > 0 && layer >= first_k_dense_replace;
}

int64_t ModelConfig::kv_bytes_per_token(int64_t element_size) const {
  int64_t n = 0;
  if (__builtin_mul_overflow(num_hidden_layers, attn.kv_row_dim(), &n) ||
      __builtin_mul_overflow(n, element_size, &n))
    fail("model config: {} layers × {} values × {} bytes per token overflow int64",
         num_hidden_layers, attn.kv_row_dim(), element_size);
  return n;
}

void ModelConfig::validate() const {
  attn.validate();
  static constexpr int64_t kMax = detail::Fields::kMaxInt;
  auto positive = [](const char* name, int64_t v) {
    if (v <= 0) fail("model config: field '{}' must be a positive integer (got {})", name, v);
    if (v > kMax) fail("model config: field '{}' must be at most {} (got {})", name, kMax, v);
  };
  auto at_most = [](const char* name, int64_t v) {
    if (v > kMax) fail("model config: field '{}' must be at most {} (got {})", name, kMax, v);
  };
  at_most("n_routed_experts", n_routed_experts);
  at_most("n_shared_experts", n_shared_experts);
  at_most("first_k_dense_replace", first_k_dense_replace);
  positive("vocab_size", vocab_size);
  positive("num_hidden_layers", num_hidden_layers);
  positive("intermediate_size", intermediate_size);
  if (n_routed_experts > 0) {
    positive("moe_intermediate_size", moe_intermediate_size);
    positive("num_experts_per_tok", num_experts_per_tok);
    positive("n_group", n_group);
    positive("topk_group", topk_group);
    positive("moe_layer_freq", moe_layer_freq);
    if (n_routed_experts % n_group != 0)
      fail("model config: n_routed_experts {} is not a multiple of n_group {}", n_routed_experts, n_group);
    if (topk_group > n_group)
      fail("model config: topk_group {} exceeds n_group {}", topk_group, n_group);
    if (num_experts_per_tok > n_routed_experts)
      fail("model config: num_experts_per_tok {} exceeds n_routed_experts {}", num_experts_per_tok, n_routed_experts);
    const bool grouped = topk_method == "noaux_tc" || topk_method == "group_limited_greedy";
    if (grouped && num_experts_per_tok > topk_group * (n_routed_experts / n_group))
      fail("model config: num_experts_per_tok {} exceeds the {} experts of topk_group {} groups",
           num_experts_per_tok, topk_group * (n_routed_experts / n_group), topk_group);
    if (model_type() == "deepseek_v3" && n_group > 1 && n_routed_experts / n_group < 2)
      fail("model config: deepseek_v3 group scoring needs at least 2 experts per group");
    if (scoring_func != "sigmoid" && scoring_func != "softmax")
      fail("model config: field 'scoring_func' must be \"sigmoid\" or \"softmax\" (got \"{}\")", scoring_func);
    if (topk_method != "noaux_tc" && topk_method != "greedy" && topk_method != "group_limited_greedy")
      fail("model config: field 'topk_method' must be noaux_tc, greedy or group_limited_greedy (got \"{}\")",
           topk_method);
  }
  if (n_shared_experts < 0) fail("model config: field 'n_shared_experts' must be >= 0 (got {})", n_shared_experts);
  if (first_k_dense_replace < 0)
    fail("model config: field 'first_k_dense_replace' must be >= 0 (got {})", first_k_dense_replace);
}

ModelConfig parse_model_config_text(std::string_view text, const std::string& src) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail("{}: not valid JSON: {}", src, e.what());
  }
  ModelConfig m;
  m.attn = parse_attention_config(j);  // names the field; re-label errors with the file
  Fields f(j, src, "");
  const bool v3 = m.attn.model_type == "deepseek_v3";
  auto count = [&](const char* key, int64_t dflt) {  // null or absent → default; else >= 0
    const json* v = f.find(key);
    if (!v) return dflt;
    int64_t x = f.integer(key, *v, "a non-negative integer");
    if (x < 0) f.bad(key, "a non-negative integer", *v);
    return x;
  };
  m.vocab_size = f.positive_int("vocab_size");
  m.num_hidden_layers = f.positive_int("num_hidden_layers");
  m.intermediate_size = f.positive_int("intermediate_size");
  m.moe_intermediate_size = count("moe_intermediate_size", v3 ? 2048 : 1407);
  m.n_routed_experts = count("n_routed_experts", v3 ? 256 : 0);
  m.n_shared_experts = count("n_shared_experts", v3 ? 1 : 0);
  m.num_experts_per_tok = count("num_experts_per_tok", v3 ? 8 : 0);
  m.n_group = count("n_group", v3 ? 8 : 1);
  m.topk_group = count("topk_group", v3 ? 4 : 1);
  m.first_k_dense_replace = count("first_k_dense_replace", v3 ? 3 : 0);
  m.moe_layer_freq = count("moe_layer_freq", 1);
  m.routed_scaling_factor = f.number("routed_scaling_factor", v3 ? 2.5 : 1.0);
  m.norm_topk_prob = f.boolean("norm_topk_prob", v3);
  m.tie_word_embeddings = f.boolean("tie_word_embeddings", false);
  m.initializer_range = f.number("initializer_range", 0.02);
  if (!(m.initializer_range > 0)) f.bad("initializer_range", "a positive number", *f.find("initializer_range"));
  // As transformers: V3 always scores with a sigmoid and picks by noaux_tc; V2 always scores with
  // a softmax (scoring_func is ignored) and reads topk_method.
  m.scoring_func = v3 ? "sigmoid" : "softmax";
  m.topk_method = v3 ? "noaux_tc" : (f.has("topk_method") ? f.string("topk_method") : "greedy");
  if (f.has("hidden_act") && f.string("hidden_act") != "silu")
    fail("{}: field 'hidden_act' must be \"silu\" (got \"{}\")", src, f.string("hidden_act"));
  try {
    m.validate();
  } catch (const Error& e) {
    fail("{}: {}", src, e.what());
  }
  return m;
}

ModelConfig load_model_config(const std::string& path) {
  auto [text, file] = detail::read_config_text(path);
  try {
    return parse_model_config_text(text, file);
  } catch (const Error& e) {
    std::string msg = e.what();
    if (msg.rfind(file, 0) == 0) throw;
    fail("{}: {}", file, msg.rfind("config.json: ", 0) == 0 ? msg.substr(13) : msg);
  }
}

}  // namespace mla
