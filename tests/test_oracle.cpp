// HF transformers is the oracle: every committed checkpoint under tests/data, its float32 logits
// for several sequences and its greedy continuation, against the engine with every method,
// prefill chunking and decode split. See tests/data/README.md for how they were made.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "harness.h"
#include "engine/engine.h"
#include "mla/platform_ops.h"
#include "mla/safetensors.h"

#ifndef MLA_TEST_DATA
#error "MLA_TEST_DATA must name tests/data"
#endif

namespace mla::test {
namespace {

const char* kModels[] = {"v3_tiny", "v3_noqlora", "v3_yarn_mscale", "v3_norope_scaling", "v2_greedy", "v2_group"};
constexpr double kTol = 1e-4;

struct Oracle {
  std::string dir;
  std::vector<std::vector<int32_t>> seqs;
  std::vector<std::vector<double>> logits;
  std::vector<int32_t> prompt, greedy;
  std::vector<double> margin, greedy_logits;
};

std::vector<int32_t> ids_of(const Tensor& t) {
  std::vector<int32_t> v;
  for (double x : t.to_doubles()) v.push_back(int32_t(x));
  return v;
}

Oracle load_oracle(const std::string& name) {
  Oracle o;
  const char* env = std::getenv("MLA_TEST_DATA");  // where the tree moved (e.g. to a GPU machine)
  o.dir = std::string(env ? env : MLA_TEST_DATA) + "/" + name;
  SafetensorsFile f = SafetensorsFile::open(o.dir + "/oracle.safetensors");
  for (int k = 0; f.has(fmt::format("ids.{}", k)); ++k) {
    o.seqs.push_back(ids_of(f.tensor(fmt::format("ids.{}", k))));
    o.logits.push_back(f.tensor(fmt::format("logits.{}", k)).to_doubles());
  }
  o.prompt = ids_of(f.tensor("greedy.prompt"));
  o.greedy = ids_of(f.tensor("greedy.ids"));
  o.margin = f.tensor("greedy.margin").to_doubles();
  o.greedy_logits = f.tensor("greedy.logits").to_doubles();
  return o;
}

class OracleTest : public ::testing::TestWithParam<std::tuple<const char*, Platform>> {
 protected:
  void SetUp() override {
    const Platform p = std::get<1>(GetParam());
    if (!platform_available(p)) GTEST_SKIP() << "platform " << platform_name(p) << " is not available here";
    o = load_oracle(std::get<0>(GetParam()));
    ops = make_ops(p, DType::F32);
    lm = load_model(o.dir, *ops);
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
    return err;
  }
  Platform p() const { return std::get<1>(GetParam()); }
  Oracle o;
  std::unique_ptr<Ops> ops;
  LoadedModel lm;
};

TEST_P(OracleTest, EveryMethodMatchesTransformers) {
  for (size_t k = 0; k < o.seqs.size(); ++k) {
    // The platform's own methods: the shared ones, or their ROCm twins.
    EXPECT_LE(run(k, resolve_method(p(), ForwardMethod::MHA), 0, -1), kTol);
    for (ForwardMethod g : {ForwardMethod::MHA_ONE_SHOT, ForwardMethod::MHA_CHUNKED_KV, ForwardMethod::MLA}) {
      const ForwardMethod m = resolve_method(p(), g);
      for (int64_t chunk : {0, 7})
        EXPECT_LE(run(k, m, chunk, -1, /*capacity*/ 5), kTol) << method_name(m) << " chunk " << chunk;
    }
    if (p() == Platform::ROCM)  // the fused-RoPE decode: every token a decode step
      EXPECT_LE(run(k, ForwardMethod::MLA_FUSED_ROPE_ROCM, 0, 0), kTol);
  }
}

TEST_P(OracleTest, PrefillChunksAndDecodeMatchTransformers) {
  for (size_t k = 0; k < o.seqs.size(); ++k) {
    const int64_t n = int64_t(o.seqs[k].size());
    for (int64_t chunk : {1, 7, 64}) EXPECT_LE(run(k, std::nullopt, chunk, -1), kTol) << "chunk " << chunk;
    EXPECT_LE(run(k, std::nullopt, 0, n / 2), kTol);      // decode from inside the prompt
    EXPECT_LE(run(k, std::nullopt, 3, n - 2), kTol);      // chunked prefill, then decode
    EXPECT_LE(run(k, std::nullopt, 0, 0), kTol);          // every token a decode step
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
  EXPECT_LE(rel_l2(step_logits, o.greedy_logits), kTol);
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
    EXPECT_LE(rel_l2(got, o.logits[k]), kTol) << "sequence " << k;
  }
  EXPECT_EQ(b.method, resolve_method(p(), ForwardMethod::MLA));
}

INSTANTIATE_TEST_SUITE_P(HF, OracleTest,
                         ::testing::Combine(::testing::ValuesIn(kModels), ::testing::Values(Platform::CPU, Platform::CUDA, Platform::ROCM)),
                         [](const auto& i) {
                           return std::string(std::get<0>(i.param)) + "_" + std::string(platform_name(std::get<1>(i.param)));
                         });

}  // namespace
}  // namespace mla::test
