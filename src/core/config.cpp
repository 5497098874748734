// config.cpp — parsing and checking the attention part of a DeepSeek-V2/V3 HF config.json.
#include "mla/config.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/json_fields.h"
#include "mla/error.h"

namespace mla {
namespace {

using json = nlohmann::json;
using detail::Fields;
using detail::show;

// Reads a rope_scaling / rope_parameters object into `rs` (and rope_theta, for the new form).
void parse_rope(const json& obj, const std::string& src, const std::string& prefix,
                int64_t max_position_embeddings, bool new_form, AttentionConfig& c) {
  if (!obj.is_object())
    fail("{}: field '{}' must be an object or null (got {})", src,
         prefix.substr(0, prefix.size() - 1), show(obj));
  Fields f(obj, src, prefix);
  if (new_form) c.rope_theta = f.number("rope_theta", c.rope_theta);

  // The type: `rope_type` (newer) or `type` (older); absent means the default (no scaling).
  std::string type = "default";
  const char* type_key = "rope_type";
  if (f.has("rope_type")) {
    type = f.string("rope_type");
    if (f.has("type") && f.string("type") != type)
      fail("{}: fields '{}rope_type' ({}) and '{}type' ({}) disagree", src, prefix, type, prefix,
           f.string("type"));
  } else if (f.has("type")) {
    type = f.string("type");
    type_key = "type";
  }

  RopeScaling rs;
  if (type == "default" || type == "none") {
    rs.type = "none";
  } else if (type == "yarn") {
    rs.type = "yarn";
    rs.original_max_position_embeddings =
        f.optional_positive_int("original_max_position_embeddings", max_position_embeddings);
    // As transformers 5: an absent factor is the ratio of the context lengths.
    if (f.has("factor")) {
      rs.factor = f.number("factor", 1.0);
      if (!(rs.factor >= 1.0)) f.bad("factor", "a number >= 1", obj.at("factor"));
    } else {
      rs.factor = double(max_position_embeddings) / double(rs.original_max_position_embeddings);
      if (!(rs.factor >= 1.0))
        fail("{}: field '{}factor' is missing and max_position_embeddings / "
             "original_max_position_embeddings = {} is below 1", src, prefix, rs.factor);
    }
    rs.beta_fast = f.number("beta_fast", 32.0);
    rs.beta_slow = f.number("beta_slow", 1.0);
    rs.mscale = f.number("mscale", 1.0);
    rs.mscale_all_dim = f.number("mscale_all_dim", 0.0);
    if (!(rs.beta_fast > 0)) f.bad("beta_fast", "a positive number", obj.at("beta_fast"));
    if (!(rs.beta_slow > 0)) f.bad("beta_slow", "a positive number", obj.at("beta_slow"));
    // Variants of YaRN this engine does not implement: refuse rather than compute otherwise.
    if (f.has("attention_factor"))
      fail("{}: field '{}attention_factor' is not supported (the factor is derived from mscale "
           "and mscale_all_dim)", src, prefix);
    if (f.has("truncate") && !f.boolean("truncate", true))
      fail("{}: field '{}truncate' = false is not supported", src, prefix);
  } else {
    fail("{}: field '{}{}' is '{}', an unsupported rope type (supported: default, yarn)", src,
         prefix, type_key, type);
  }
  if (f.has("partial_rotary_factor") && f.number("partial_rotary_factor", 1.0) != 1.0)
    fail("{}: field '{}partial_rotary_factor' must be 1 (got {})", src, prefix,
         show(obj.at("partial_rotary_factor")));
  c.rope_scaling = rs;
}

void check(const AttentionConfig& c, const std::string& src) {
  static constexpr int64_t kMax = detail::Fields::kMaxInt;
  auto positive = [&](const char* name, int64_t v) {
    if (v <= 0) fail("{}: field '{}' must be a positive integer (got {})", src, name, v);
    if (v > kMax) fail("{}: field '{}' must be at most {} (got {})", src, name, kMax, v);
  };
  if (c.model_type != "deepseek_v2" && c.model_type != "deepseek_v3")
    fail("{}: field 'model_type' must be \"deepseek_v2\" or \"deepseek_v3\" (got \"{}\")", src,
         c.model_type);
  positive("hidden_size", c.hidden_size);
  positive("num_attention_heads", c.num_attention_heads);
  if (c.q_lora_rank < 0)
    fail("{}: field 'q_lora_rank' must be a non-negative integer or null (got {})", src,
         c.q_lora_rank);
  if (c.q_lora_rank > kMax)
    fail("{}: field 'q_lora_rank' must be at most {} (got {})", src, kMax, c.q_lora_rank);
  positive("kv_lora_rank", c.kv_lora_rank);
  positive("qk_nope_head_dim", c.qk_nope_head_dim);
  positive("qk_rope_head_dim", c.qk_rope_head_dim);
  if (c.qk_rope_head_dim % 2 != 0)
    fail("{}: field 'qk_rope_head_dim' must be even (got {})", src, c.qk_rope_head_dim);
  positive("v_head_dim", c.v_head_dim);
  positive("max_position_embeddings", c.max_position_embeddings);
  if (!(c.rms_norm_eps > 0) || !std::isfinite(c.rms_norm_eps))
    fail("{}: field 'rms_norm_eps' must be a positive number (got {})", src, c.rms_norm_eps);
  if (!(c.rope_theta > 0) || !std::isfinite(c.rope_theta))
    fail("{}: field 'rope_theta' must be a positive number (got {})", src, c.rope_theta);

  const RopeScaling& rs = c.rope_scaling;
  if (rs.type == "none") return;
  if (rs.type != "yarn")
    fail("{}: rope type '{}' is not supported (supported: none, yarn)", src, rs.type);
  // YaRN divides by ln(rope_theta) and by the betas.
  if (!(c.rope_theta > 1))
    fail("{}: field 'rope_theta' must be > 1 for yarn (got {})", src, c.rope_theta);
  if (!(rs.factor >= 1) || !std::isfinite(rs.factor))
    fail("{}: field 'rope_scaling.factor' must be a number >= 1 (got {})", src, rs.factor);
  if (rs.original_max_position_embeddings <= 0 || rs.original_max_position_embeddings > kMax)
    fail("{}: field 'rope_scaling.original_max_position_embeddings' must be a positive integer "
         "at most {} (got {})", src, kMax, rs.original_max_position_embeddings);
  if (!(rs.beta_fast > 0) || !std::isfinite(rs.beta_fast))
    fail("{}: field 'rope_scaling.beta_fast' must be a positive number (got {})", src,
         rs.beta_fast);
  if (!(rs.beta_slow > 0) || !std::isfinite(rs.beta_slow))
    fail("{}: field 'rope_scaling.beta_slow' must be a positive number (got {})", src,
         rs.beta_slow);
  if (!std::isfinite(rs.mscale))
    fail("{}: field 'rope_scaling.mscale' must be a finite number (got {})", src, rs.mscale);
  if (!std::isfinite(rs.mscale_all_dim))
    fail("{}: field 'rope_scaling.mscale_all_dim' must be a finite number (got {})", src,
         rs.mscale_all_dim);
}

AttentionConfig parse_impl(const json& j, const std::string& src) {
  if (!j.is_object()) fail("{}: the top level must be a JSON object (got {})", src, show(j));
  Fields f(j, src, "");
  AttentionConfig c;
  c.model_type = f.string("model_type");
  if (c.model_type != "deepseek_v2" && c.model_type != "deepseek_v3")
    fail("{}: field 'model_type' must be \"deepseek_v2\" or \"deepseek_v3\" (got \"{}\")", src,
         c.model_type);
  c.hidden_size = f.positive_int("hidden_size");
  c.num_attention_heads = f.positive_int("num_attention_heads");
  if (const json* v = f.find("q_lora_rank")) {
    const char* what = "a non-negative integer or null";
    c.q_lora_rank = f.integer("q_lora_rank", *v, what);
    if (c.q_lora_rank < 0) f.bad("q_lora_rank", what, *v);
  } else {
    c.q_lora_rank = 0;
  }
  c.kv_lora_rank = f.positive_int("kv_lora_rank");
  c.qk_nope_head_dim = f.positive_int("qk_nope_head_dim");
  c.qk_rope_head_dim = f.positive_int("qk_rope_head_dim");
  if (c.qk_rope_head_dim % 2 != 0) f.bad("qk_rope_head_dim", "even", j.at("qk_rope_head_dim"));
  c.v_head_dim = f.positive_int("v_head_dim");
  c.max_position_embeddings = f.positive_int("max_position_embeddings");
  c.rms_norm_eps = f.number("rms_norm_eps", 1e-6);
  if (!(c.rms_norm_eps > 0)) f.bad("rms_norm_eps", "a positive number", j.at("rms_norm_eps"));
  c.rope_interleave = f.boolean("rope_interleave", true);

  // RoPE: the new form (rope_parameters) wins over the old one (rope_theta + rope_scaling).
  c.rope_theta = f.number("rope_theta", 10000.0);
  if (const json* rp = f.find("rope_parameters")) {
    parse_rope(*rp, src, "rope_parameters.", c.max_position_embeddings, true, c);
  } else if (const json* rs = f.find("rope_scaling")) {
    parse_rope(*rs, src, "rope_scaling.", c.max_position_embeddings, false, c);
  }
  if (!(c.rope_theta > 0)) fail("{}: field 'rope_theta' must be a positive number (got {})", src,
                                c.rope_theta);
  check(c, src);
  return c;
}

AttentionConfig parse_text_impl(std::string_view text, const std::string& src) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail("{}: not valid JSON: {}", src, e.what());
  }
  return parse_impl(j, src);
}

}  // namespace

double AttentionConfig::softmax_scale() const {
  double m = 1.0;
  if (rope_scaling.type == "yarn" && rope_scaling.factor > 1.0 && rope_scaling.mscale_all_dim != 0)
    m = 0.1 * rope_scaling.mscale_all_dim * std::log(rope_scaling.factor) + 1.0;
  return m * m / std::sqrt(double(qk_head_dim()));
}

void AttentionConfig::validate() const { check(*this, "attention config"); }

AttentionConfig parse_attention_config(const json& j) { return parse_impl(j, "config.json"); }

AttentionConfig parse_attention_config_text(std::string_view text) {
  return parse_text_impl(text, "config.json");
}

AttentionConfig load_attention_config(const std::string& path) {
  auto [text, file] = detail::read_config_text(path);
  return parse_text_impl(text, file);
}

AttentionConfig preset_config(std::string_view name) {
  AttentionConfig c;
  if (name == "deepseek-v3") {
    c.model_type = "deepseek_v3";
    c.hidden_size = 7168;
    c.num_attention_heads = 128;
    c.q_lora_rank = 1536;
    c.rope_scaling.mscale = 1.0;
    c.rope_scaling.mscale_all_dim = 1.0;
  } else if (name == "deepseek-v2-lite") {
    c.model_type = "deepseek_v2";
    c.hidden_size = 2048;
    c.num_attention_heads = 16;
    c.q_lora_rank = 0;
    c.rope_scaling.mscale = 0.707;
    c.rope_scaling.mscale_all_dim = 0.707;
  } else {
    std::string known;
    for (const std::string& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
    fail("unknown preset '{}' (known: {})", name, known);
  }
  c.kv_lora_rank = 512;
  c.qk_nope_head_dim = 128;
  c.qk_rope_head_dim = 64;
  c.v_head_dim = 128;
  c.rms_norm_eps = 1e-6;
  c.max_position_embeddings = 163840;
  c.rope_interleave = true;
  c.rope_theta = 10000.0;
  c.rope_scaling.type = "yarn";
  c.rope_scaling.factor = 40.0;
  c.rope_scaling.original_max_position_embeddings = 4096;
  c.rope_scaling.beta_fast = 32.0;
  c.rope_scaling.beta_slow = 1.0;
  c.validate();
  return c;
}

std::vector<std::string> preset_names() { return {"deepseek-v3", "deepseek-v2-lite"}; }

}  // namespace mla

namespace mla::detail {

std::pair<std::string, std::string> read_config_text(const std::string& path) {
  std::string file = path;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    file = (std::filesystem::path(path) / "config.json").string();
  std::ifstream in(file, std::ios::binary);
  if (!in) fail("cannot open config '{}': {}", file, std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail("cannot read config '{}'", file);
  return {ss.str(), file};
}

}  // namespace mla::detail
