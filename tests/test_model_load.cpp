// Loading models: the staged checkpoint loader (any staging size gives the same model), its
// progress reports, random weights (deterministic per seed, the same on every platform), named
// shapes, the fast dtype conversion, and lm_head on the rows asked for only.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "engine/engine.h"
#include "harness.h"
#include "mla/error.h"
#include "mla/platform_ops.h"
#include "mla/random.h"

namespace mla {
namespace {

const std::string kTiny = std::string(MLA_TEST_DATA) + "/v3_tiny";
const std::vector<int32_t> kPrompt{121, 3, 1, 230, 62, 8, 145, 59, 214};

// Logits of every prompt position, one request alone.
std::vector<float> prompt_logits(Model& m) {
  Engine e(m, EngineOptions{});
  return e.run_sequence(kPrompt, 0, int64_t(kPrompt.size())).logits;
}

std::vector<Platform> platforms() { return test::available_platforms(); }

TEST(ModelLoad, AnyStagingSizeAndThreadCountGiveTheSameModel) {
  omp_set_num_threads(1);
  for (Platform p : platforms()) {
    for (DType act : {DType::F32, DType::BF16}) {
      auto ops = make_ops(p, act);
      const std::vector<float> ref = prompt_logits(*load_model(kTiny, *ops).model);
      for (auto [bytes, threads] : {std::pair<size_t, int>{64, 1}, {1000, 3}, {4096, 2}}) {
        LoadOptions lo;
        lo.staging_bytes = bytes;  // pieces far smaller than the tensors, edges not element-aligned
        lo.threads = threads;
        const std::vector<float> got = prompt_logits(*load_model(kTiny, *ops, lo).model);
        ASSERT_EQ(got.size(), ref.size());
        EXPECT_EQ(0, std::memcmp(got.data(), ref.data(), ref.size() * 4))
            << platform_name(p) << " " << dtype_name(act) << " staging " << bytes;
      }
    }
  }
}

TEST(ModelLoad, ProgressCountsEveryTensorAndByte) {
  auto ops = make_ops(Platform::CPU, DType::BF16);
  std::vector<LoadProgress> seen;
  LoadOptions lo;
  lo.progress = [&](const LoadProgress& p) { seen.push_back(p); };
  LoadedModel lm = load_model(kTiny, *ops, lo);
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.back().tensors, seen.back().tensors_total);
  EXPECT_EQ(seen.back().bytes, seen.back().bytes_total);
  EXPECT_EQ(int64_t(seen.size()), seen.back().tensors_total);
  for (size_t i = 1; i < seen.size(); ++i) {
    EXPECT_EQ(seen[i].tensors, seen[i - 1].tensors + 1);
    EXPECT_GT(seen[i].bytes, seen[i - 1].bytes);
    EXPECT_GE(seen[i].seconds, seen[i - 1].seconds);
  }
  // Every parameter is counted once: bf16 weights (the routers too) plus the f32 V3 biases.
  int64_t bias = 0;
  for (int64_t i = 0; i < lm.config.num_hidden_layers; ++i)
    if (lm.config.is_moe_layer(i)) bias += lm.config.n_routed_experts;
  EXPECT_EQ(seen.back().bytes_total, (lm.model->parameters() - bias) * 2 + bias * 4);
}

TEST(ModelLoad, EveryTensorIsUsedAndUnknownShapesAreNamed) {
  auto ops = make_ops(Platform::CPU, DType::F32);
  LoadedModel lm = load_model(kTiny, *ops);
  EXPECT_TRUE(lm.unused.empty()) << lm.unused.front();
  expect_error([&] { random_model(named_model_config("nope"), *ops); }, {"unknown model shape 'nope'"});
}

TEST(RandomModel, SameSeedSameModelOnEveryPlatform) {
  omp_set_num_threads(2);
  ModelConfig c = load_model_config(kTiny);
  auto cpu = make_ops(Platform::CPU, DType::F32);
  LoadedModel a = random_model(c, *cpu, 7);
  const std::vector<float> la = prompt_logits(*a.model);
  EXPECT_EQ(la, prompt_logits(*random_model(c, *cpu, 7).model));
  const std::vector<float> lb = prompt_logits(*random_model(c, *cpu, 8).model);
  ASSERT_EQ(la.size(), lb.size());
  double diff = 0;
  for (size_t i = 0; i < la.size(); ++i) diff = std::max(diff, double(std::fabs(la[i] - lb[i])));
  EXPECT_GT(diff, 1e-3) << "another seed must give other weights";
  EXPECT_EQ(a.model->parameters(), load_model(kTiny, *cpu).model->parameters());
  // As transformers initializes: the final RMSNorm (weight 1) leaves rows of RMS 1, so a logit is a
  // dot product of hidden_size terms of std initializer_range: std ≈ 0.02·√hidden.
  double s2 = 0;
  for (float x : la) s2 += double(x) * x;
  const double want = c.initializer_range * std::sqrt(double(c.hidden_size()));
  EXPECT_NEAR(std::sqrt(s2 / double(la.size())), want, 0.3 * want);
  for (Platform p : platforms()) {  // the weights are the same bits: logits agree to f32 GEMM order
    if (p == Platform::CPU) continue;
    auto ops = make_ops(p, DType::F32);
    const std::vector<float> lg = prompt_logits(*random_model(c, *ops, 7).model);
    ASSERT_EQ(lg.size(), la.size());
    for (size_t i = 0; i < la.size(); ++i) ASSERT_NEAR(lg[i], la[i], 1e-4) << platform_name(p) << " " << i;
  }
}

TEST(RandomModel, ValuesHaveTheInitializerStd) {
  auto ops = make_ops(Platform::CPU, DType::F32);
  Tensor t = ops->empty(DType::F32, {1 << 16});
  ops->fill_random(t, 3, 0.02);
  double s = 0, s2 = 0, mx = 0;
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double v = t.ptr<float>()[i];
    s += v, s2 += v * v, mx = std::max(mx, std::fabs(v));
    ASSERT_EQ(t.ptr<float>()[i], hash_normalish(3, uint64_t(i), 0.02f));
  }
  const double n = double(t.numel()), mean = s / n, sd = std::sqrt(s2 / n - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.02 * 0.02);
  EXPECT_NEAR(sd, 0.02, 0.02 * 0.01);
  EXPECT_LE(mx, 0.02 * 2 * std::sqrt(3.0) + 1e-9);
  Tensor b = ops->empty(DType::BF16, {1 << 10});  // bf16 storage rounds the same float once
  ops->fill_random(b, 3, 0.02);
  for (int64_t i = 0; i < b.numel(); ++i) ASSERT_EQ(b.at(size_t(i)), double(bf16_to_float(float_to_bf16(t.ptr<float>()[i]))));
}

TEST(NamedShapes, AreTheReleasedConfigs) {
  const ModelConfig lite = named_model_config("deepseek-v2-lite");
  EXPECT_EQ(lite.num_hidden_layers, 27);
  EXPECT_EQ(lite.n_routed_experts, 64);
  EXPECT_EQ(lite.attn.q_lora_rank, 0);
  EXPECT_FALSE(lite.attn.has_q_lora());
  const ModelConfig v3 = named_model_config("deepseek-v3:4");
  EXPECT_EQ(v3.num_hidden_layers, 4);
  EXPECT_EQ(v3.attn.num_attention_heads, 128);
  EXPECT_EQ(v3.topk_method, "noaux_tc");
  EXPECT_EQ(named_model_config("deepseek-v2").topk_method, "group_limited_greedy");
  for (const char* bad : {"deepseek-v3:0", "deepseek-v3:62", "deepseek-v3:x", "deepseek-v3:4x"})
    expect_error([&] { named_model_config(bad); }, {"the layer count after ':' must be 1..61"});
}

TEST(ConvertElements, FastPathsEqualTheGenericOne) {
  const float specials[] = {0.f, -0.f, 1.f, -1.5f, 1e-40f, -1e-45f, 3.4e38f, -3.4e38f,
                            std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                            1.00390625f /* a bf16 tie */, 1.01171875f, 0.1f, 65504.f, 3.14159f};
  std::vector<float> f(std::begin(specials), std::end(specials));
  for (uint32_t i = 0; i < 5000; ++i) {  // random bit patterns, every exponent
    uint32_t u = (i * 2654435761u) ^ (i << 7);
    float x;
    std::memcpy(&x, &u, 4);
    f.push_back(x);
  }
  const size_t n = f.size();
  for (DType from : {DType::F32, DType::BF16, DType::F64, DType::F16})
    for (DType to : {DType::F32, DType::BF16, DType::F64, DType::F16}) {
      std::vector<char> src(n * dtype_size(from)), fast(n * dtype_size(to)), slow(n * dtype_size(to));
      for (size_t i = 0; i < n; ++i) store_from_double(src.data(), from, i, f[i]);
      convert_elements(src.data(), from, fast.data(), to, n);
      for (size_t i = 0; i < n; ++i) store_from_double(slow.data(), to, i, load_as_double(src.data(), from, i));
      EXPECT_EQ(fast, slow) << dtype_name(from) << " → " << dtype_name(to);
    }
}

TEST(ModelForward, LogitRowsAreTheFullForwardsRows) {
  omp_set_num_threads(1);
  for (DType act : {DType::F32, DType::BF16}) {
    auto ops = make_ops(Platform::CPU, act);
    LoadedModel lm = load_model(kTiny, *ops);
    const int64_t V = lm.config.vocab_size;
    Engine all(*lm.model, EngineOptions{}), last(*lm.model, EngineOptions{});
    const std::vector<StepRequest> reqs{{1, {5, 6, 7, 8}}, {2, {9}}, {3, {10, 11}}};
    const StepResult ra = all.step(ForwardMode::EXTEND, reqs);
    const StepResult rl = last.step(ForwardMode::EXTEND, reqs, /*last_only=*/true);
    ASSERT_EQ(int64_t(ra.logits.size()), 7 * V);
    ASSERT_EQ(int64_t(rl.logits.size()), 3 * V);
    int64_t row = 0, k = 0;
    for (const auto& r : reqs) {
      row += int64_t(r.ids.size());
      EXPECT_EQ(0, std::memcmp(&rl.logits[size_t(k * V)], &ra.logits[size_t((row - 1) * V)], size_t(V) * 4))
          << dtype_name(act) << " request " << r.id;
      ++k;
    }
  }
}

}  // namespace
}  // namespace mla

namespace mla {
namespace {

// The fused end of the latent path a platform may have gives the bits of its four steps: the kv_a
// norm, RoPE of q and of k_pe, the cache write (bf16 and fp8 pools, pages out of order, positions
// far apart, 16 and 128 heads; 6 tokens, and 1100 for the GPUs' prefill body, which takes 8 tokens a
// block and q's heads in groups of 16).
TEST(FinishLatent, IsNormRopeRopeCacheWriteBitForBit) {
  const int64_t L = 512, R = 64, D = L + R, dn = 128, hd = dn + R;
  RopeFrequencies f;
  for (int64_t i = 0; i < R / 2; ++i) f.inv_freq.push_back(std::pow(10000.0, -2.0 * double(i) / double(R)));
  f.attention_factor = 1.17;
  for (const int64_t T : {6, 1100}) {
    std::vector<int32_t> positions{0, 1, 7, 4095, 40000, 163839}, slots{13, 2, 30, 31, 0, 17};
    const int64_t pages = T == 6 ? 8 : 300;  // 4 slots a page
    for (int64_t t = 6; t < T; ++t) {  // every slot once, out of order; positions spread to 163 839
      positions.push_back(int32_t((t * 7919) % 163840));
      slots.push_back(int32_t(32 + (t - 6) * 337 % (4 * pages - 32)));
    }
    for (Platform p : platforms())
      for (DType act : {DType::F32, DType::BF16})
        for (DType kv : {act, DType::F8_E4M3FN})
          for (int64_t H : {16, 128})
            for (bool interleave : {true, false}) {
              if (T > 6 && act == DType::F32 && H == 128) continue;  // the f32 body at 16 heads is enough
              f.interleave = interleave;
              auto ops = make_ops(p, act);
              auto pool_of = [&] {
                auto pool = std::make_unique<KVPool>(KVPoolConfig{2, D, kv, 4, pages},
                                                     [&](DType d, Shape s) { return ops->empty(d, s); });
                ops->fill(pool->buffer(1), 0.5);
                pool->set_scale(1, kv == act ? 1.0 : 0.03);
                return pool;
              };
              auto fused = pool_of(), steps = pool_of();
              Tensor q = ops->empty(act, {T, H, hd}), kva = ops->empty(act, {T, D}), w = ops->empty(act, {L});
              ops->fill_random(q, 1, 2.0);
              ops->fill_random(kva, 2, 3.0);
              ops->fill_random(w, 3, 1.0);
              Tensor q2 = ops->empty(act, {T, H, hd}), kva2 = ops->empty(act, {T, D});
              ops->copy(q, q2);
              ops->copy(kva, kva2);
              ops->finish_latent(q, H, dn, kva, L, w, 1e-6, positions, f, *fused, 1, slots);
              ops->rmsnorm(kva2, L, w, 1e-6);
              ops->rope(q2, H, hd, dn, positions, f);
              ops->rope(kva2, 1, D, L, positions, f);
              ops->cache_write(*steps, 1, slots, kva2);
              const std::string what = fmt::format("{} {} kv {} H {} interleave {}", platform_name(p), dtype_name(act),
                                                   dtype_name(kv), H, interleave);
              auto same = [&](const Tensor& a, const Tensor& b, const char* name) {
                const Tensor x = ops->download(a), y = ops->download(b);
                EXPECT_EQ(0, std::memcmp(x.data(), y.data(), x.nbytes())) << what << " " << name;
              };
              same(q, q2, "q");
              same(kva, kva2, "kva");
              same(fused->buffer(1), steps->buffer(1), "pool");
              if (H == 16) {  // no q (heads 0, as prepare_absorbed calls it): the same rows and pool
                auto rows_only = pool_of();
                Tensor kva3 = ops->empty(act, {T, D}), no_q;
                ops->fill_random(kva3, 2, 3.0);
                ops->finish_latent(no_q, 0, dn, kva3, L, w, 1e-6, positions, f, *rows_only, 1, slots);
                same(kva3, kva2, "kva without q");
                same(rows_only->buffer(1), steps->buffer(1), "pool without q");
              }
              const Tensor written = ops->download(fused->buffer(1)), untouched = ops->download(pool_of()->buffer(1));
              EXPECT_NE(0, std::memcmp(written.data(), untouched.data(), written.nbytes())) << what << ": nothing written";
            }
  }
}

// The fused residual add and RMSNorm a platform may have gives the bits of the three steps.
TEST(AddRmsnorm, IsAddCopyRmsnormBitForBit) {
  for (Platform p : platforms())
    for (DType act : {DType::F32, DType::BF16}) {
      auto ops = make_ops(p, act);
      const int64_t M = 5, n = 1000;  // n: not a multiple of the block
      Tensor h = ops->empty(act, {M, n}), y = ops->empty(act, {M, n}), w = ops->empty(act, {n});
      ops->fill_random(h, 1, 3.0);
      ops->fill_random(y, 2, 1.0);
      ops->fill_random(w, 3, 1.0);
      Tensor h2 = ops->empty(act, {M, n}), x = ops->empty(act, {M, n}), x2 = ops->empty(act, {M, n});
      ops->copy(h, h2);
      ops->add_rmsnorm(h, y, x, w, 1e-6);
      ops->add(h2, y);
      ops->copy(h2, x2);
      ops->rmsnorm(x2, n, w, 1e-6);
      const Tensor a = ops->download(h), b = ops->download(h2), c = ops->download(x), d = ops->download(x2);
      EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.nbytes())) << platform_name(p) << " " << dtype_name(act) << " h";
      EXPECT_EQ(0, std::memcmp(c.data(), d.data(), c.nbytes())) << platform_name(p) << " " << dtype_name(act) << " x";
    }
}

}  // namespace
}  // namespace mla
