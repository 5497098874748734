// Fuzzing's findings, kept: every input of the seed corpus (fuzz/corpus/<target>/, where each
// crash the fuzzers found is stored as regress_*) replayed through the same checks the libFuzzer
// targets run (fuzz/fuzz_checks.h) — in every `make test` and under the sanitizers — plus one
// test per bug with the message it must now give.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <string>

#include <unistd.h>

#include "../fuzz/fuzz_checks.h"
#include "mla/tensor.h"

namespace mla {
namespace {

namespace fs = std::filesystem;
const fs::path kCorpus = fs::path(MLA_TEST_DATA) / ".." / ".." / "fuzz" / "corpus";

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Runs `check` on every file of fuzz/corpus/<target>/; returns how many.
template <typename F>
int replay(const std::string& target, F check) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(kCorpus / target)) {
    if (!e.is_regular_file()) continue;
    SCOPED_TRACE(e.path().string());
    const std::string bytes = read_file(e.path());
    check(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    ++n;
  }
  return n;
}

TEST(FuzzCorpus, SafetensorsSeedsParseOrFailCleanly) {
  EXPECT_GE(replay("fuzz_safetensors", fuzz::safetensors_bytes), 5);
}

TEST(FuzzCorpus, IndexSeedsParseOrFailCleanly) {
  const fs::path dir =
      fs::temp_directory_path() / ("mla_fuzz_replay_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fuzz::make_index_folder(dir.string());
  EXPECT_GE(replay("fuzz_safetensors_index",
                   [&](const uint8_t* d, size_t n) { fuzz::checkpoint_index(dir.string(), d, n); }),
            5);
  std::error_code ec;
  fs::remove_all(dir, ec);
}

TEST(FuzzCorpus, ConfigSeedsParseOrFailCleanly) {
  EXPECT_GE(replay("fuzz_config", fuzz::config_text), 5);
}

TEST(FuzzCorpus, CliSeedsParseOrFailCleanly) {
  EXPECT_GE(replay("fuzz_cli_ids", fuzz::cli_text), 5);
}

TEST(FuzzCorpus, ChatTemplateSeedsParseOrFailCleanly) {
  EXPECT_GE(replay("fuzz_chat_template", fuzz::chat_template_text), 5);
}

// ---- one test per bug ----------------------------------------------------------------------

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  } catch (const cli::UsageError& e) {
    return e.what();
  }
  return "(no error)";
}

std::string tiny_config_with(const std::string& key, const std::string& value) {
  std::string text = read_file(fs::path(MLA_TEST_DATA) / "v3_tiny" / "config.json");
  const std::string k = "\"" + key + "\": ";
  const size_t at = text.find(k);
  EXPECT_NE(at, std::string::npos) << key;
  const size_t end = text.find_first_of(",\n", at + k.size());
  return text.substr(0, at + k.size()) + value + text.substr(end);
}

// Bug: config sizes were bounded only by int64, so kv_row_dim() (kv_lora_rank + qk_rope_head_dim)
// and kv_bytes_per_token() (layers × row × bytes) overflowed (UBSan: signed integer overflow).
// Every count and size is now at most INT32_MAX, and kv_bytes_per_token checks its products.
TEST(FuzzRegressions, ConfigSizesBeyondInt32AreRefused) {
  for (const char* key : {"num_hidden_layers", "kv_lora_rank", "hidden_size", "vocab_size",
                          "n_routed_experts", "max_position_embeddings"})
    for (const char* v : {"2147483648", "4611686018427387904", "9223372036854775807",
                          "18446744073709551615", "1e12", "3000000000.0"}) {
      const std::string m = error_of([&] { parse_model_config_text(tiny_config_with(key, v)); });
      EXPECT_NE(m.find(std::string("field '") + key + "' must be at most 2147483647"),
                std::string::npos)
          << key << " = " << v << ": " << m;
      EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    }
  EXPECT_NO_THROW(parse_model_config_text(tiny_config_with("num_hidden_layers", "2147483647")));

  ModelConfig big = parse_model_config_text(tiny_config_with("num_hidden_layers", "2147483647"));
  big.attn.kv_lora_rank = 2147483647;
  EXPECT_NE(error_of([&] { big.kv_bytes_per_token(8); }).find("overflow"), std::string::npos);
  EXPECT_EQ(big.kv_bytes_per_token(1), int64_t(2147483647) * (int64_t(2147483647) + 16));

  AttentionConfig a = preset_config("deepseek-v3");
  a.kv_lora_rank = int64_t(1) << 40;  // built in code, not parsed: validate() catches it
  EXPECT_NE(error_of([&] { a.validate(); }).find("'kv_lora_rank' must be at most"),
            std::string::npos);
}

// Bug (found while hardening the config): Tensor::host multiplied the shape without overflow
// checks, so a huge shape allocated a wrapped-around, far too small buffer.
TEST(FuzzRegressions, TensorShapesThatOverflowAreRefused) {
  const int64_t big = int64_t(1) << 40, huge = int64_t(1) << 62;
  for (const Shape& s : {Shape{big, big}, Shape{huge, 4}, Shape{huge, huge, 0},
                         Shape{std::numeric_limits<int64_t>::max(), 2}})
    EXPECT_NE(error_of([&] { Tensor::host(DType::F32, s); }).find("too large"), std::string::npos)
        << shape_str(s);
  EXPECT_EQ(Tensor::host(DType::F32, {0, huge}).numel(), 0);
}

// Bug (fuzz_cli_ids, first seconds): an id list item holding a newline was echoed raw, making
// a two-line error. Items are now shown with control bytes escaped, and long ones cut.
TEST(FuzzRegressions, CliListErrorsStayOnOneLine) {
  EXPECT_EQ(error_of([] { cli::parse_int_list("3\n4,5", "--ids"); }),
            "--ids: '3\\x0a4' is not a non-negative integer");
  EXPECT_EQ(error_of([] { cli::parse_requests("1:2,\r"); }),
            "--requests: '\\x0d' is not PREFIX:NEW");
  const std::string m = error_of([] { cli::parse_int_list(std::string(5000, 'x'), "--ids"); });
  EXPECT_LT(m.size(), 100u) << m;
  EXPECT_EQ(error_of([] { cli::parse_int_list("1234567890123456789", "--ids"); }),
            "--ids: '1234567890123456789' is too large (at most 18 digits)");
}

}  // namespace
}  // namespace mla
