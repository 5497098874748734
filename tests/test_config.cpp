// test_config.cpp — HF config.json parsing, checks, presets and the softmax scale.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "mla/config.h"
#include "mla/error.h"

namespace mla {
namespace {

using json = nlohmann::json;

// The attention-relevant part of DeepSeek-V3's config.json, old RoPE form, with some unrelated
// fields kept to show they are ignored.
const char* kV3Old = R"({
  "architectures": ["DeepseekV3ForCausalLM"],
  "model_type": "deepseek_v3",
  "hidden_size": 7168,
  "intermediate_size": 18432,
  "num_attention_heads": 128,
  "num_key_value_heads": 128,
  "q_lora_rank": 1536,
  "kv_lora_rank": 512,
  "qk_nope_head_dim": 128,
  "qk_rope_head_dim": 64,
  "v_head_dim": 128,
  "rms_norm_eps": 1e-06,
  "max_position_embeddings": 163840,
  "rope_theta": 10000,
  "rope_scaling": {
    "beta_fast": 32,
    "beta_slow": 1,
    "factor": 40,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "original_max_position_embeddings": 4096,
    "type": "yarn"
  },
  "torch_dtype": "bfloat16"
})";

// The same in transformers 5's form.
const char* kV3New = R"({
  "model_type": "deepseek_v3",
  "hidden_size": 7168,
  "num_attention_heads": 128,
  "q_lora_rank": 1536,
  "kv_lora_rank": 512,
  "qk_nope_head_dim": 128,
  "qk_rope_head_dim": 64,
  "v_head_dim": 128,
  "rms_norm_eps": 1e-06,
  "max_position_embeddings": 163840,
  "rope_interleave": true,
  "rope_parameters": {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 40.0,
    "original_max_position_embeddings": 4096,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 1.0
  }
})";

// DeepSeek-V2-Lite's config.json (attention part).
const char* kV2Lite = R"({
  "model_type": "deepseek_v2",
  "hidden_size": 2048,
  "num_attention_heads": 16,
  "q_lora_rank": null,
  "kv_lora_rank": 512,
  "qk_nope_head_dim": 128,
  "qk_rope_head_dim": 64,
  "v_head_dim": 128,
  "rms_norm_eps": 1e-06,
  "max_position_embeddings": 163840,
  "rope_theta": 10000,
  "rope_scaling": {
    "beta_fast": 32,
    "beta_slow": 1,
    "factor": 40,
    "mscale": 0.707,
    "mscale_all_dim": 0.707,
    "original_max_position_embeddings": 4096,
    "type": "yarn"
  }
})";

void expect_same(const AttentionConfig& a, const AttentionConfig& b) {
  EXPECT_EQ(a.model_type, b.model_type);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.num_attention_heads, b.num_attention_heads);
  EXPECT_EQ(a.q_lora_rank, b.q_lora_rank);
  EXPECT_EQ(a.kv_lora_rank, b.kv_lora_rank);
  EXPECT_EQ(a.qk_nope_head_dim, b.qk_nope_head_dim);
  EXPECT_EQ(a.qk_rope_head_dim, b.qk_rope_head_dim);
  EXPECT_EQ(a.v_head_dim, b.v_head_dim);
  EXPECT_EQ(a.rms_norm_eps, b.rms_norm_eps);
  EXPECT_EQ(a.max_position_embeddings, b.max_position_embeddings);
  EXPECT_EQ(a.rope_interleave, b.rope_interleave);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.rope_scaling.type, b.rope_scaling.type);
  EXPECT_EQ(a.rope_scaling.factor, b.rope_scaling.factor);
  EXPECT_EQ(a.rope_scaling.original_max_position_embeddings,
            b.rope_scaling.original_max_position_embeddings);
  EXPECT_EQ(a.rope_scaling.beta_fast, b.rope_scaling.beta_fast);
  EXPECT_EQ(a.rope_scaling.beta_slow, b.rope_scaling.beta_slow);
  EXPECT_EQ(a.rope_scaling.mscale, b.rope_scaling.mscale);
  EXPECT_EQ(a.rope_scaling.mscale_all_dim, b.rope_scaling.mscale_all_dim);
  EXPECT_EQ(a.softmax_scale(), b.softmax_scale());
}

// The message of the Error that `f` throws; fails the test if it throws none (or another type).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_EQ(m.find('\n'), std::string::npos) << "multi-line error: " << m;
    EXPECT_FALSE(m.empty());
    return m;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-mla::Error: " << e.what();
    return "";
  }
  ADD_FAILURE() << "no error thrown";
  return "";
}

std::string parse_error(const json& j) {
  return error_of([&] { parse_attention_config(j); });
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// ---- softmax scale and presets ------------------------------------------------------------------

TEST(Config, SoftmaxScalePinned) {
  EXPECT_NEAR(preset_config("deepseek-v3").softmax_scale(), 0.135234, 1e-6);
  EXPECT_NEAR(preset_config("deepseek-v2-lite").softmax_scale(), 0.114721, 1e-6);
  // From the formula: 192^-0.5 · (0.1·ln 40 + 1)².
  const double m = 0.1 * std::log(40.0) + 1.0;
  EXPECT_DOUBLE_EQ(preset_config("deepseek-v3").softmax_scale(), m * m / std::sqrt(192.0));
}

TEST(Config, SoftmaxScaleWithoutYarnIsPlain) {
  AttentionConfig c = preset_config("deepseek-v3");
  c.rope_scaling = RopeScaling{};  // none
  EXPECT_DOUBLE_EQ(c.softmax_scale(), 1.0 / std::sqrt(192.0));
  c = preset_config("deepseek-v3");
  c.rope_scaling.mscale_all_dim = 0;  // no mscale on the scale
  EXPECT_DOUBLE_EQ(c.softmax_scale(), 1.0 / std::sqrt(192.0));
  c = preset_config("deepseek-v3");
  c.rope_scaling.factor = 1.0;  // no scaling
  EXPECT_DOUBLE_EQ(c.softmax_scale(), 1.0 / std::sqrt(192.0));
}

TEST(Config, PresetV3) {
  AttentionConfig c = preset_config("deepseek-v3");
  EXPECT_EQ(c.model_type, "deepseek_v3");
  EXPECT_EQ(c.hidden_size, 7168);
  EXPECT_EQ(c.num_attention_heads, 128);
  EXPECT_EQ(c.q_lora_rank, 1536);
  EXPECT_TRUE(c.has_q_lora());
  EXPECT_EQ(c.kv_lora_rank, 512);
  EXPECT_EQ(c.qk_head_dim(), 192);
  EXPECT_EQ(c.kv_row_dim(), 576);
  EXPECT_EQ(c.v_head_dim, 128);
  EXPECT_EQ(c.max_position_embeddings, 163840);
  EXPECT_TRUE(c.rope_interleave);
  EXPECT_EQ(c.rope_scaling.type, "yarn");
  EXPECT_EQ(c.rope_scaling.factor, 40.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 4096);
  EXPECT_EQ(c.rope_scaling.mscale, 1.0);
  EXPECT_EQ(c.rope_scaling.mscale_all_dim, 1.0);
  EXPECT_NO_THROW(c.validate());
}

TEST(Config, PresetsMatchTheirConfigJson) {
  expect_same(preset_config("deepseek-v3"), parse_attention_config_text(kV3Old));
  AttentionConfig lite = preset_config("deepseek-v2-lite");
  EXPECT_FALSE(lite.has_q_lora());
  expect_same(lite, parse_attention_config_text(kV2Lite));
}

TEST(Config, PresetNamesAndUnknownPreset) {
  auto names = preset_names();
  ASSERT_EQ(names.size(), 2u);
  for (const auto& n : names) EXPECT_NO_THROW(preset_config(n));
  std::string m = error_of([] { preset_config("deepseek-v4"); });
  EXPECT_TRUE(contains(m, "deepseek-v4")) << m;
  EXPECT_TRUE(contains(m, "deepseek-v3")) << m;
  EXPECT_TRUE(contains(m, "deepseek-v2-lite")) << m;
}

// ---- parsing ------------------------------------------------------------------------------------

TEST(Config, OldAndNewRopeFormsAgree) {
  AttentionConfig a = parse_attention_config_text(kV3Old);
  AttentionConfig b = parse_attention_config_text(kV3New);
  expect_same(a, b);
  EXPECT_EQ(a.rope_theta, 10000.0);
  EXPECT_EQ(a.rope_scaling.type, "yarn");
  EXPECT_NEAR(a.softmax_scale(), 0.135234, 1e-6);
}

TEST(Config, RopeTypeKeyEitherName) {
  json j = json::parse(kV3Old);
  j["rope_scaling"].erase("type");
  j["rope_scaling"]["rope_type"] = "yarn";
  expect_same(parse_attention_config(j), parse_attention_config_text(kV3Old));
  j["rope_scaling"]["type"] = "linear";
  std::string m = parse_error(j);
  EXPECT_TRUE(contains(m, "rope_type")) << m;
}

TEST(Config, NullQLoraRank) {
  json j = json::parse(kV3Old);
  j["q_lora_rank"] = nullptr;
  EXPECT_EQ(parse_attention_config(j).q_lora_rank, 0);
  j.erase("q_lora_rank");
  EXPECT_EQ(parse_attention_config(j).q_lora_rank, 0);
  EXPECT_FALSE(parse_attention_config(j).has_q_lora());
}

TEST(Config, RopeInterleave) {
  json j = json::parse(kV3Old);
  EXPECT_TRUE(parse_attention_config(j).rope_interleave);  // absent → true
  j["rope_interleave"] = false;
  EXPECT_FALSE(parse_attention_config(j).rope_interleave);
  j["rope_interleave"] = true;
  EXPECT_TRUE(parse_attention_config(j).rope_interleave);
  j["rope_interleave"] = "no";
  EXPECT_TRUE(contains(parse_error(j), "'rope_interleave'"));
}

TEST(Config, Defaults) {
  json j = json::parse(kV3Old);
  j.erase("rms_norm_eps");
  j.erase("rope_theta");
  j["rope_scaling"].erase("beta_fast");
  j["rope_scaling"].erase("beta_slow");
  j["rope_scaling"].erase("mscale");
  j["rope_scaling"].erase("mscale_all_dim");
  j["rope_scaling"].erase("original_max_position_embeddings");
  AttentionConfig c = parse_attention_config(j);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.rope_scaling.beta_fast, 32.0);
  EXPECT_EQ(c.rope_scaling.beta_slow, 1.0);
  EXPECT_EQ(c.rope_scaling.mscale, 1.0);
  EXPECT_EQ(c.rope_scaling.mscale_all_dim, 0.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 163840);  // max_position_embeddings
  EXPECT_DOUBLE_EQ(c.softmax_scale(), 1.0 / std::sqrt(192.0));
}

TEST(Config, NoRopeScaling) {
  json j = json::parse(kV3Old);
  j["rope_scaling"] = nullptr;
  AttentionConfig c = parse_attention_config(j);
  EXPECT_EQ(c.rope_scaling.type, "none");
  EXPECT_DOUBLE_EQ(c.softmax_scale(), 1.0 / std::sqrt(192.0));
  j.erase("rope_scaling");
  EXPECT_EQ(parse_attention_config(j).rope_scaling.type, "none");
  j["rope_scaling"] = json{{"type", "default"}};
  EXPECT_EQ(parse_attention_config(j).rope_scaling.type, "none");
  j["rope_scaling"] = json::object();
  EXPECT_EQ(parse_attention_config(j).rope_scaling.type, "none");

  json n = json::parse(kV3New);
  n["rope_parameters"] = json{{"rope_type", "default"}, {"rope_theta", 50000.0}};
  AttentionConfig d = parse_attention_config(n);
  EXPECT_EQ(d.rope_scaling.type, "none");
  EXPECT_EQ(d.rope_theta, 50000.0);
}

TEST(Config, NumbersWrittenAsFloats) {
  json j = json::parse(kV3Old);
  j["hidden_size"] = 7168.0;
  EXPECT_EQ(parse_attention_config(j).hidden_size, 7168);
  j["hidden_size"] = 7168.5;
  EXPECT_TRUE(contains(parse_error(j), "'hidden_size'"));
}

// ---- errors -------------------------------------------------------------------------------------

TEST(ConfigErrors, EveryRequiredFieldMissing) {
  const char* required[] = {"model_type",       "hidden_size",      "num_attention_heads",
                            "kv_lora_rank",     "qk_nope_head_dim", "qk_rope_head_dim",
                            "v_head_dim",       "max_position_embeddings"};
  for (const char* field : required) {
    SCOPED_TRACE(field);
    json j = json::parse(kV3Old);
    j.erase(field);
    std::string m = parse_error(j);
    EXPECT_TRUE(contains(m, std::string("'") + field + "'")) << m;
    EXPECT_TRUE(contains(m, "missing")) << m;
    EXPECT_TRUE(contains(m, "config.json")) << m;
    j[field] = nullptr;  // null is missing too
    m = parse_error(j);
    EXPECT_TRUE(contains(m, std::string("'") + field + "'")) << m;
  }
}

TEST(Config, YarnFactorFromContextLengths) {
  // As transformers 5: an absent factor is max_position_embeddings / original (163840 / 4096).
  json j = json::parse(kV3Old);
  j["rope_scaling"].erase("factor");
  expect_same(parse_attention_config(j), preset_config("deepseek-v3"));
  j["rope_scaling"]["original_max_position_embeddings"] = 327680;
  std::string m = parse_error(j);
  EXPECT_TRUE(contains(m, "'rope_scaling.factor'")) << m;
}

TEST(ConfigErrors, UnsupportedYarnVariants) {
  json j = json::parse(kV3New);
  j["rope_parameters"]["attention_factor"] = 1.2;
  EXPECT_TRUE(contains(parse_error(j), "'rope_parameters.attention_factor'"));
  j = json::parse(kV3New);
  j["rope_parameters"]["truncate"] = false;
  EXPECT_TRUE(contains(parse_error(j), "'rope_parameters.truncate'"));
  j["rope_parameters"]["truncate"] = true;
  EXPECT_NO_THROW(parse_attention_config(j));
  j["rope_parameters"]["partial_rotary_factor"] = 0.5;
  EXPECT_TRUE(contains(parse_error(j), "'rope_parameters.partial_rotary_factor'"));
  j["rope_parameters"]["partial_rotary_factor"] = 1.0;
  EXPECT_NO_THROW(parse_attention_config(j));
}

TEST(ConfigErrors, ExactMessages) {
  json j = json::parse(kV3Old);
  j.erase("kv_lora_rank");
  EXPECT_EQ(parse_error(j), "config.json: field 'kv_lora_rank' is missing");
  j = json::parse(kV3Old);
  j["num_attention_heads"] = -3;
  EXPECT_EQ(parse_error(j),
            "config.json: field 'num_attention_heads' must be a positive integer (got -3)");
}

TEST(ConfigErrors, NonPositiveDims) {
  const char* dims[] = {"hidden_size",      "num_attention_heads", "kv_lora_rank",
                        "qk_nope_head_dim", "qk_rope_head_dim",    "v_head_dim",
                        "max_position_embeddings"};
  for (const char* field : dims) {
    for (int v : {0, -1, -128}) {
      SCOPED_TRACE(std::string(field) + "=" + std::to_string(v));
      json j = json::parse(kV3Old);
      j[field] = v;
      std::string m = parse_error(j);
      EXPECT_TRUE(contains(m, std::string("'") + field + "'")) << m;
      EXPECT_TRUE(contains(m, "(got " + std::to_string(v) + ")")) << m;
    }
  }
  json j = json::parse(kV3Old);
  j["q_lora_rank"] = -1;
  EXPECT_TRUE(contains(parse_error(j), "'q_lora_rank'"));
  j["q_lora_rank"] = 0;  // 0 is null
  EXPECT_EQ(parse_attention_config(j).q_lora_rank, 0);
  j = json::parse(kV3Old);
  j["rms_norm_eps"] = 0;
  EXPECT_TRUE(contains(parse_error(j), "'rms_norm_eps'"));
  j = json::parse(kV3Old);
  j["rope_theta"] = -1;
  EXPECT_TRUE(contains(parse_error(j), "'rope_theta'"));
}

TEST(ConfigErrors, OddRopeDim) {
  json j = json::parse(kV3Old);
  j["qk_rope_head_dim"] = 63;
  std::string m = parse_error(j);
  EXPECT_TRUE(contains(m, "'qk_rope_head_dim'")) << m;
  EXPECT_TRUE(contains(m, "even")) << m;
}

TEST(ConfigErrors, WrongTypes) {
  struct Case {
    const char* field;
    json value;
  };
  const Case cases[] = {
      {"model_type", 3},
      {"hidden_size", "7168"},
      {"num_attention_heads", true},
      {"kv_lora_rank", json::array({512})},
      {"qk_nope_head_dim", 1.5},
      {"qk_rope_head_dim", json::object()},
      {"v_head_dim", "x"},
      {"max_position_embeddings", false},
      {"q_lora_rank", "1536"},
      {"rms_norm_eps", "1e-6"},
      {"rope_theta", "10000"},
      {"rope_interleave", 1},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.field);
    json j = json::parse(kV3Old);
    j[c.field] = c.value;
    std::string m = parse_error(j);
    EXPECT_TRUE(contains(m, std::string("'") + c.field + "'")) << m;
    EXPECT_TRUE(contains(m, "must be")) << m;
  }
  json j = json::parse(kV3Old);
  j["rope_scaling"]["factor"] = "40";
  EXPECT_TRUE(contains(parse_error(j), "'rope_scaling.factor'"));
  j = json::parse(kV3Old);
  j["rope_scaling"] = "yarn";
  EXPECT_TRUE(contains(parse_error(j), "'rope_scaling'"));
  j = json::parse(kV3New);
  j["rope_parameters"]["beta_fast"] = json::array();
  EXPECT_TRUE(contains(parse_error(j), "'rope_parameters.beta_fast'"));
  std::string m = error_of([] { parse_attention_config(json::array({1, 2})); });
  EXPECT_TRUE(contains(m, "object")) << m;
}

TEST(ConfigErrors, UnknownModelType) {
  json j = json::parse(kV3Old);
  j["model_type"] = "llama";
  std::string m = parse_error(j);
  EXPECT_TRUE(contains(m, "'model_type'")) << m;
  EXPECT_TRUE(contains(m, "llama")) << m;
  j["model_type"] = "deepseek_v2";
  EXPECT_EQ(parse_attention_config(j).model_type, "deepseek_v2");
}

TEST(ConfigErrors, UnknownRopeType) {
  for (const char* t : {"linear", "dynamic", "llama3", "longrope"}) {
    SCOPED_TRACE(t);
    json j = json::parse(kV3Old);
    j["rope_scaling"]["type"] = t;
    std::string m = parse_error(j);
    EXPECT_TRUE(contains(m, t)) << m;
    EXPECT_TRUE(contains(m, "rope_scaling.type")) << m;
    json n = json::parse(kV3New);
    n["rope_parameters"]["rope_type"] = t;
    m = parse_error(n);
    EXPECT_TRUE(contains(m, t)) << m;
    EXPECT_TRUE(contains(m, "rope_parameters.rope_type")) << m;
  }
}

TEST(ConfigErrors, YarnFactorBelowOne) {
  json j = json::parse(kV3Old);
  j["rope_scaling"]["factor"] = 0.5;
  std::string m = parse_error(j);
  EXPECT_TRUE(contains(m, "'rope_scaling.factor'")) << m;
  EXPECT_TRUE(contains(m, "0.5")) << m;
  j["rope_scaling"]["factor"] = 1;  // allowed: no scaling
  EXPECT_NO_THROW(parse_attention_config(j));
}

TEST(ConfigErrors, InvalidJson) {
  for (const char* text : {"", "{", "{\"model_type\": \"deepseek_v3\",\n\n}", "not json\n\n",
                           "{\"a\": 1} trailing"}) {
    SCOPED_TRACE(text);
    std::string m = error_of([&] { parse_attention_config_text(text); });
    EXPECT_TRUE(contains(m, "not valid JSON")) << m;
  }
}

TEST(ConfigErrors, ValidateNamesTheField) {
  AttentionConfig c = preset_config("deepseek-v3");
  c.kv_lora_rank = 0;
  EXPECT_TRUE(contains(error_of([&] { c.validate(); }), "'kv_lora_rank'"));
  c = preset_config("deepseek-v3");
  c.qk_rope_head_dim = 7;
  EXPECT_TRUE(contains(error_of([&] { c.validate(); }), "'qk_rope_head_dim'"));
  c = preset_config("deepseek-v3");
  c.q_lora_rank = -2;
  EXPECT_TRUE(contains(error_of([&] { c.validate(); }), "'q_lora_rank'"));
  c = preset_config("deepseek-v3");
  c.rms_norm_eps = 0;
  EXPECT_TRUE(contains(error_of([&] { c.validate(); }), "'rms_norm_eps'"));
  c = preset_config("deepseek-v3");
  c.model_type = "gpt2";
  EXPECT_TRUE(contains(error_of([&] { c.validate(); }), "'model_type'"));
  c = preset_config("deepseek-v3");
  c.rope_scaling.type = "ntk";
  EXPECT_TRUE(contains(error_of([&] { c.validate(); }), "ntk"));
  c = preset_config("deepseek-v3");
  c.rope_scaling.factor = 0.25;
  EXPECT_TRUE(contains(error_of([&] { c.validate(); }), "factor"));
  c = preset_config("deepseek-v2-lite");
  c.q_lora_rank = 0;
  EXPECT_NO_THROW(c.validate());
}

// ---- files --------------------------------------------------------------------------------------

TEST(ConfigFiles, LoadFromFileAndFolder) {
  auto dir = std::filesystem::temp_directory_path() /
             ("mla_test_config_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto file = dir / "config.json";
  {
    std::ofstream out(file);
    out << kV2Lite;
  }
  expect_same(load_attention_config(file.string()), preset_config("deepseek-v2-lite"));
  expect_same(load_attention_config(dir.string()), preset_config("deepseek-v2-lite"));
  {
    std::ofstream out(file);
    out << "{\"model_type\": \"deepseek_v3\"}";
  }
  std::string m = error_of([&] { load_attention_config(file.string()); });
  EXPECT_TRUE(contains(m, file.string())) << m;  // errors name the file
  EXPECT_TRUE(contains(m, "'hidden_size'")) << m;
  std::filesystem::remove_all(dir);
}

TEST(ConfigFiles, NonexistentPath) {
  const std::string path = "/nonexistent/mla/path/config.json";
  std::string m = error_of([&] { load_attention_config(path); });
  EXPECT_TRUE(contains(m, path)) << m;
}

}  // namespace
}  // namespace mla
