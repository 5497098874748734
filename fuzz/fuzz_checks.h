// fuzz/fuzz_checks.h — what each fuzz target runs on one input, shared by the libFuzzer targets
// (fuzz/*.cpp) and the corpus replay in tests/test_fuzz_regressions.cpp. The rule everywhere: a
// parser either succeeds, and then what it returns is consistent and fully readable, or throws
// mla::Error (the CLI's UsageError) with a one-line message. Anything else — another exception,
// a sanitizer report, a broken requirement (abort) — is a crash.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "../tools/cli_util.h"
#include "mla/config.h"
#include "mla/error.h"
#include "mla/model_config.h"
#include "mla/safetensors.h"
#include "text/chat_template.h"
#include "text/jinja.h"

#define MLA_FUZZ_REQUIRE(cond) ::mla::fuzz::require((cond), #cond, __FILE__, __LINE__)

namespace mla::fuzz {

inline void require(bool ok, const char* what, const char* file, int line) {
  if (ok) return;
  std::fprintf(stderr, "%s:%d: requirement failed: %s\n", file, line, what);
  std::abort();
}

inline void check_one_line(const char* what) {
  MLA_FUZZ_REQUIRE(what && *what && !std::strchr(what, '\n') && !std::strchr(what, '\r'));
}

// Safetensors bytes: on success every listed tensor lies inside the bytes and reads back.
inline void safetensors_bytes(const uint8_t* data, size_t size) {
  try {
    SafetensorsFile f = SafetensorsFile::from_bytes(data, size, "fuzz.safetensors");
    MLA_FUZZ_REQUIRE(f.names().size() == f.size());
    for (const std::string& name : f.names()) {
      const SafetensorsFile::Info& i = f.info(name);
      MLA_FUZZ_REQUIRE(i.offset >= 8 && i.offset <= size && i.nbytes <= size - i.offset);
      try {
        Tensor t = f.view(name);
        MLA_FUZZ_REQUIRE(t.nbytes() == i.nbytes && t.shape() == i.shape);
        const auto* p = static_cast<const uint8_t*>(t.data());
        unsigned sum = 0;
        for (size_t k = 0; k < t.nbytes(); ++k) sum += p[k];  // every byte must be readable
        Tensor c = f.tensor(name);
        MLA_FUZZ_REQUIRE(c.nbytes() == i.nbytes);
        (void)sum;
      } catch (const Error& e) {  // only a dtype mla does not hold may refuse to read
        check_one_line(e.what());
        MLA_FUZZ_REQUIRE(!i.dtype.has_value());
      }
    }
  } catch (const Error& e) {
    check_one_line(e.what());
  }
}

// The folder the index target works in: two valid shards, a.safetensors (x F32 [2, 2], y BF16
// [2]) and b.safetensors (z I64 [3]).
inline void make_index_folder(const std::string& dir) {
  write_safetensors(dir + "/a.safetensors",
                    {{"x", Tensor::host_from({1, 2, 3, 4}, DType::F32, {2, 2})},
                     {"y", Tensor::host_from({5, 6}, DType::BF16, {2})}});
  write_safetensors(dir + "/b.safetensors", {{"z", Tensor::host_from({7, 8, 9}, DType::I64, {3})}});
}

// `data` as dir/model.safetensors.index.json, opened as a checkpoint folder.
inline void checkpoint_index(const std::string& dir, const uint8_t* data, size_t size) {
  const std::string index = dir + "/model.safetensors.index.json";
  FILE* f = std::fopen(index.c_str(), "wb");
  MLA_FUZZ_REQUIRE(f != nullptr);
  MLA_FUZZ_REQUIRE(std::fwrite(data, 1, size, f) == size);
  std::fclose(f);
  try {
    Checkpoint c = Checkpoint::open(dir);
    MLA_FUZZ_REQUIRE(c.names().size() == c.size());
    for (const std::string& name : c.names()) {
      Tensor t = c.tensor(name);  // the shards hold only readable dtypes
      MLA_FUZZ_REQUIRE(t.nbytes() == c.info(name).nbytes);
    }
  } catch (const Error& e) {
    check_one_line(e.what());
  }
}

// config.json text: the attention reader and the model reader must agree, and a config they
// accept must validate again and give positive, finite derived sizes (or refuse them cleanly).
inline void config_text(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  bool attn_ok = false;
  AttentionConfig a;
  try {
    a = parse_attention_config_text(text);
    a.validate();
    MLA_FUZZ_REQUIRE(std::isfinite(a.softmax_scale()) && a.softmax_scale() > 0);
    MLA_FUZZ_REQUIRE(a.qk_head_dim() > 0 && a.kv_row_dim() > 0);
    attn_ok = true;
  } catch (const Error& e) {
    check_one_line(e.what());
  }
  try {
    ModelConfig m = parse_model_config_text(text);
    m.validate();
    MLA_FUZZ_REQUIRE(attn_ok && m.attn.hidden_size == a.hidden_size &&
                     m.attn.kv_row_dim() == a.kv_row_dim());
    for (int64_t l = 0; l < std::min<int64_t>(m.num_hidden_layers, 4); ++l) (void)m.is_moe_layer(l);
    for (int64_t es : {1, 2, 4, 8}) {
      try {
        MLA_FUZZ_REQUIRE(m.kv_bytes_per_token(es) > 0);
      } catch (const Error& e) {
        check_one_line(e.what());
      }
    }
  } catch (const Error& e) {
    check_one_line(e.what());
  }
}

// The CLI's text parsers on one string: --ids lists, --requests lists, prompt-file text.
inline void cli_text(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const size_t commas = size_t(std::count(text.begin(), text.end(), ','));
  try {
    std::vector<int64_t> v = cli::parse_int_list(text, "--ids");
    MLA_FUZZ_REQUIRE(text.empty() ? v.empty() : v.size() == commas + 1);
    for (int64_t x : v) MLA_FUZZ_REQUIRE(x >= 0);
  } catch (const cli::UsageError& e) {
    check_one_line(e.what());
  }
  try {
    auto r = cli::parse_requests(text);
    MLA_FUZZ_REQUIRE(r.size() == commas + 1);
    for (auto [p, n] : r) MLA_FUZZ_REQUIRE(p >= 0 && n >= 0);
  } catch (const cli::UsageError& e) {
    check_one_line(e.what());
  }
  try {
    for (int64_t x : cli::parse_id_text(text, "--prompt-file")) MLA_FUZZ_REQUIRE(x >= 0);
  } catch (const cli::UsageError& e) {
    check_one_line(e.what());
  }
}

// A chat template's text: it parses, or fails with a one-line mla::Error; a parsed template renders
// a fixed conversation (system, user, an assistant turn with tool calls and no content, two tool
// results, reasoning, tools given) with and without the generation prompt, or fails the same way.
inline void chat_template_text(const uint8_t* data, size_t size) {
  static const nlohmann::ordered_json messages = nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
      "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "content": "{\"temp\": 21}", "tool_call_id": "c1"},
    {"role": "tool", "content": "sunny"},
    {"role": "assistant", "content": "<think>warm</think>21 °C, sunny.", "reasoning_content": "warm"},
    {"role": "user", "content": "Thanks! 日本語 🙂"}])");
  static const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(R"([{"type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])");
  const std::string source(reinterpret_cast<const char*>(data), size);
  try {
    const text::ChatTemplate t(source, "<s>", "</s>");
    for (bool agp : {false, true}) {
      try {
        const std::string out = t.render(messages, agp, tools, nlohmann::ordered_json{{"thinking", agp}});
        MLA_FUZZ_REQUIRE(out.size() <= (size_t(64) << 20));
      } catch (const Error& e) {
        check_one_line(e.what());
      }
    }
  } catch (const Error& e) {
    check_one_line(e.what());
  }
}

}  // namespace mla::fuzz
