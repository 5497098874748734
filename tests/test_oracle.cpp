// HF transformers is the oracle: every committed checkpoint under tests/data, its float32 logits
// for several sequences and its greedy continuation, against the engine with every method,
// prefill chunking and decode split. See tests/data/README.md for how they were made.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "harness.h"
#include "oracle.h"
#include "engine/engine.h"
#include "mla/config.h"
#include "mla/reference.h"
#include "mla/platform_ops.h"
#include "mla/safetensors.h"

#ifndef MLA_TEST_DATA
#error "MLA_TEST_DATA must name tests/data"
#endif

namespace mla::test {
namespace {

const char* kModels[] = {"v3_tiny", "v3_noqlora", "v3_yarn_mscale", "v3_norope_scaling", "v2_greedy", "v2_group", "v3_tp", "v2_tp"};

// Tolerances per model (relative L2 of whole logit sequences), each within 10x of the worst error
// measured on the CPU over every run of the test that uses it (the value in the comment;
// `ctest -R HF/OracleTest -V` prints them). f32: the engine in f32 with an f32 cache against
// transformers in f32. bf16: the engine with bf16 activations and a bf16 or fp8 cache against
// transformers run in bf16 (oracle_bf16.safetensors); there the scale is set by the spread between
// transformers' own bf16 and f32 logits (spread.K, 1.2e-2 .. 2.9e-1: bf16 flips MoE routing choices),
// and the test also checks the engine's bf16 logits are no further from transformers' f32 logits than
// the bf16 spread allows. The GPU platforms use the CPU's f32 tolerances (unmeasured there) and do not
// run the bf16 cases.
struct ModelTol {
  const char* name;
  double f32;       // engine f32 vs transformers f32
  double bf16;      // engine bf16 activations + bf16 cache vs transformers bf16
  double bf16_fp8;  // engine bf16 activations + fp8 e4m3fn cache vs transformers bf16
};
const ModelTol kTols[] = {
    // name               f32     bf16   bf16_fp8    measured worst: f32 / bf16 / bf16_fp8
    {"v3_tiny",           5e-6,   0.2,   0.35},   // 1.1e-6 / 9.6e-2 / 1.7e-1
    {"v3_noqlora",        5e-6,   0.6,   1.5},    // 1.5e-6 / 2.9e-1 / 7.2e-1
    {"v3_yarn_mscale",    3e-6,   0.45,  0.75},   // 1.6e-6 / 2.1e-1 / 3.6e-1
    {"v3_norope_scaling", 4e-6,   0.15,  0.18},   // 8.4e-7 / 6.6e-2 / 8.8e-2
    {"v2_greedy",         4e-6,   0.06,  0.15},   // 9.7e-7 / 2.6e-2 / 7.5e-2
    {"v2_group",          5e-6,   0.12,  0.23},   // 1.2e-6 / 5.7e-2 / 1.1e-1
    {"v3_tp",             5e-6,   0.2,   0.5},    // 1.1e-6 / 7.9e-2 / 2.6e-1
    {"v2_tp",             5e-6,   0.06,  0.2},    // 1.0e-6 / 2.8e-2 / 8.9e-2
};
const ModelTol& tol_of(const std::string& name) {
  for (const ModelTol& t : kTols)
    if (name == t.name) return t;
  throw std::runtime_error("no tolerance for model " + name);
}

class OracleTest : public ::testing::TestWithParam<std::tuple<const char*, Platform>> {
 protected:
  void SetUp() override {
    const Platform p = std::get<1>(GetParam());
    if (!platform_available(p)) GTEST_SKIP() << "platform " << platform_name(p) << " is not available here";
    o = load_oracle(std::get<0>(GetParam()));
    ops = make_ops(p, DType::F32);
    lm = load_model(o.dir, *ops);
    tol = tol_of(std::get<0>(GetParam())).f32;
  }
  void TearDown() override {
    if (worst >= 0) std::printf("  measured %s f32 worst %.3e (tol %.2g)\n", std::get<0>(GetParam()), worst, tol);
  }
  // Relative L2 of the whole sequence's logits.
  double run(size_t k, std::optional<ForwardMethod> m, int64_t chunk, int64_t decode_from, int64_t capacity = 131072) {
    EngineOptions eo;
    eo.forward.method = m;
    eo.forward.dispatch.chunk_capacity = capacity;
    eo.max_tokens = 256;
    eo.page_size = 16;
    Engine e(*lm.model, eo);
    Engine::Run r = e.run_sequence(o.seqs[k], chunk, decode_from < 0 ? int64_t(o.seqs[k].size()) : decode_from);
    std::vector<double> got(r.logits.begin(), r.logits.end());
    const double err = rel_l2(got, o.logits[k]);
    std::printf("  seq %zu (len %zu) %-15s chunk %-3ld decode_from %-3ld err %.2e\n", k, o.seqs[k].size(),
                m ? std::string(method_name(*m)).c_str() : "auto", long(chunk), long(decode_from), err);
    return note(err);
  }
  double note(double err) {
    worst = std::max(worst, err);
    return err;
  }
  Platform p() const { return std::get<1>(GetParam()); }
  Oracle o;
  std::unique_ptr<Ops> ops;
  LoadedModel lm;
  double tol = 0, worst = -1;
};

TEST_P(OracleTest, EveryMethodMatchesTransformers) {
  for (size_t k = 0; k < o.seqs.size(); ++k) {
    // The platform's own methods: the shared ones, or their ROCm twins.
    EXPECT_LE(run(k, resolve_method(p(), ForwardMethod::MHA), 0, -1), tol);
    for (ForwardMethod g : {ForwardMethod::MHA_ONE_SHOT, ForwardMethod::MHA_CHUNKED_KV, ForwardMethod::MLA}) {
      const ForwardMethod m = resolve_method(p(), g);
      for (int64_t chunk : {0, 7})
        EXPECT_LE(run(k, m, chunk, -1, /*capacity*/ 5), tol) << method_name(m) << " chunk " << chunk;
    }
    if (p() == Platform::ROCM)  // the fused-RoPE decode: every token a decode step
      EXPECT_LE(run(k, ForwardMethod::MLA_FUSED_ROPE_ROCM, 0, 0), tol);
  }
}

TEST_P(OracleTest, PrefillChunksAndDecodeMatchTransformers) {
  for (size_t k = 0; k < o.seqs.size(); ++k) {
    const int64_t n = int64_t(o.seqs[k].size());
    for (int64_t chunk : {1, 7, 64}) EXPECT_LE(run(k, std::nullopt, chunk, -1), tol) << "chunk " << chunk;
    EXPECT_LE(run(k, std::nullopt, 0, n / 2), tol);      // decode from inside the prompt
    EXPECT_LE(run(k, std::nullopt, 3, n - 2), tol);      // chunked prefill, then decode
    EXPECT_LE(run(k, std::nullopt, 0, 0), tol);          // every token a decode step
  }
}

TEST_P(OracleTest, GreedyContinuationMatchesTransformers) {
  EngineOptions eo;
  eo.max_tokens = 128;
  Engine e(*lm.model, eo);
  const int64_t V = lm.config.vocab_size;
  StepResult r = e.step(ForwardMode::EXTEND, {{7, o.prompt}});
  std::vector<float> last(r.logits.end() - V, r.logits.end());
  std::vector<double> step_logits;
  for (size_t i = 0; i < o.greedy.size(); ++i) {
    step_logits.insert(step_logits.end(), last.begin(), last.end());
    const int32_t next = int32_t(std::max_element(last.begin(), last.end()) - last.begin());
    if (o.margin[i] > 1e-3) EXPECT_EQ(next, o.greedy[i]) << "step " << i << ", margin " << o.margin[i];
    // Feed transformers' token so a divergence (below the margin) does not compound.
    r = e.step(ForwardMode::DECODE, {{7, {o.greedy[i]}}});
    last = r.logits;
  }
  EXPECT_LE(note(rel_l2(step_logits, o.greedy_logits)), tol);
}

TEST_P(OracleTest, RaggedBatchOfRequestsMatchesSingleRequests) {
  // All sequences together in one EXTEND batch, then a DECODE batch of all of them.
  EngineOptions eo;
  eo.max_tokens = 512;
  eo.page_size = 5;
  Engine e(*lm.model, eo);
  std::vector<StepRequest> prefill, decode;
  for (size_t k = 0; k < o.seqs.size(); ++k) {
    const auto& s = o.seqs[k];
    prefill.push_back({RequestId(k), std::vector<int32_t>(s.begin(), s.end() - 1)});
    decode.push_back({RequestId(k), {s.back()}});
  }
  StepResult a = e.step(ForwardMode::EXTEND, prefill), b = e.step(ForwardMode::DECODE, decode);
  const int64_t V = lm.config.vocab_size;
  size_t row = 0;
  for (size_t k = 0; k < o.seqs.size(); ++k) {
    const size_t n = o.seqs[k].size();
    std::vector<double> got(a.logits.begin() + row * V, a.logits.begin() + (row + n - 1) * V);
    got.insert(got.end(), b.logits.begin() + k * V, b.logits.begin() + (k + 1) * V);
    row += n - 1;
    EXPECT_LE(note(rel_l2(got, o.logits[k])), tol) << "sequence " << k;
  }
  EXPECT_EQ(b.method, resolve_method(p(), ForwardMethod::MLA));
}

// bf16 activations with a bf16 and an fp8 cache, whole model, against transformers run in bf16: one
// prefill of all but the last two tokens, then two decode steps (MHA-family prefill, MLA decode).
// The f64 reference's own RoPE / YaRN / softmax scale against the numbers transformers computed for
// each model (oracle.json "rope": its float32 inv_freq buffer, the cos/sin factor, the softmax scale).
TEST(OracleRope, ReferenceDefinitionsMatchTransformers) {
  for (const char* name : kModels) {
    SCOPED_TRACE(name);
    const char* env = std::getenv("MLA_TEST_DATA");
    const std::string dir = std::string(env ? env : MLA_TEST_DATA) + "/" + name;
    const AttentionConfig c = load_attention_config(dir + "/config.json");
    std::ifstream f(dir + "/oracle.json");
    const nlohmann::json hf = nlohmann::json::parse(f).at("rope");
    const ReferenceRope r = reference_rope(c);
    const auto inv = hf.at("inv_freq").get<std::vector<double>>();
    ASSERT_EQ(r.inv_freq.size(), inv.size());
    for (size_t i = 0; i < inv.size(); ++i)  // transformers' buffer is float32
      EXPECT_NEAR(r.inv_freq[i], inv[i], 1e-6 * inv[i]) << "inv_freq " << i;
    EXPECT_NEAR(r.cos_sin_factor, hf.at("attention_scaling_on_cos_sin").get<double>(), 1e-12);
    EXPECT_NEAR(r.softmax_scale, hf.at("softmax_scale").get<double>(), 1e-12);
  }
}

class OracleBf16 : public OracleTest {};  // CPU only: its tolerances are measured there

TEST_P(OracleBf16, Bf16MatchesTransformersInBf16) {
  const ModelTol& t = tol_of(std::get<0>(GetParam()));
  std::unique_ptr<Ops> ops16 = make_ops(p(), DType::BF16);
  LoadedModel lm16 = load_model(o.dir, *ops16);
  for (auto [kv, kv_tol] : {std::pair{DType::BF16, t.bf16}, std::pair{DType::F8_E4M3FN, t.bf16_fp8}}) {
    double worst16 = 0;
    for (size_t k = 0; k < o.seqs.size(); ++k) {
      EngineOptions eo;
      eo.kv_dtype = kv;
      eo.max_tokens = 256;
      Engine e(*lm16.model, eo);
      const int64_t n = int64_t(o.seqs[k].size());
      Engine::Run r = e.run_sequence(o.seqs[k], 0, std::max<int64_t>(1, n - 2));
      std::vector<double> got(r.logits.begin(), r.logits.end());
      const double vs_bf16 = rel_l2(got, o.bf16_logits[k]), vs_f32 = rel_l2(got, o.logits[k]);
      std::printf("  seq %zu (len %ld) kv %-10s vs transformers bf16 %.3e, vs f32 %.3e (transformers bf16 vs f32 %.3e)\n",
                  k, long(n), std::string(dtype_name(kv)).c_str(), vs_bf16, vs_f32, o.bf16_spread[k]);
      EXPECT_LE(vs_bf16, kv_tol) << "sequence " << k << " kv " << dtype_name(kv);
      // bf16 noise on both sides: no further from f32 than the two bf16 runs' spreads together allow.
      EXPECT_LE(vs_f32, o.bf16_spread[k] + kv_tol) << "sequence " << k << " kv " << dtype_name(kv);
      worst16 = std::max(worst16, vs_bf16);
    }
    std::printf("  measured %s bf16 kv %s worst %.3e (tol %.2g)\n", std::get<0>(GetParam()),
                std::string(dtype_name(kv)).c_str(), worst16, kv_tol);
  }
}

INSTANTIATE_TEST_SUITE_P(HF, OracleTest,
                         ::testing::Combine(::testing::ValuesIn(kModels), ::testing::Values(Platform::CPU, Platform::CUDA, Platform::ROCM)),
                         [](const auto& i) {
                           return std::string(std::get<0>(i.param)) + "_" + std::string(platform_name(std::get<1>(i.param)));
                         });

INSTANTIATE_TEST_SUITE_P(HF, OracleBf16, ::testing::Combine(::testing::ValuesIn(kModels), ::testing::Values(Platform::CPU)),
                         [](const auto& i) { return std::string(std::get<0>(i.param)) + "_cpu"; });

}  // namespace
}  // namespace mla::test
