// Attention weights: validation, random weights, loading (with block-fp8 checkpoints), the
// w_kc / w_vc split.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <string>

#include "harness.h"
#include "mla/error.h"
#include "mla/weights.h"

namespace mla {
namespace {

// V3's structure (q_lora, dn != dv in the small one) at test sizes.
AttentionConfig small_v3() {
  AttentionConfig c;
  c.model_type = "deepseek_v3";
  c.hidden_size = 72;
  c.num_attention_heads = 3;
  c.q_lora_rank = 40;
  c.kv_lora_rank = 32;
  c.qk_nope_head_dim = 16;
  c.qk_rope_head_dim = 8;
  c.v_head_dim = 12;
  return c;
}

// V2-Lite's structure: no q_lora, a single q_proj.
AttentionConfig small_v2_lite() {
  AttentionConfig c = small_v3();
  c.model_type = "deepseek_v2";
  c.q_lora_rank = 0;
  c.v_head_dim = 16;
  return c;
}

// V3's real per-head dims with few heads.
AttentionConfig v3_dims_two_heads() {
  AttentionConfig c;
  c.hidden_size = 256;
  c.num_attention_heads = 2;
  c.q_lora_rank = 1536;
  c.kv_lora_rank = 512;
  c.qk_nope_head_dim = 128;
  c.qk_rope_head_dim = 64;
  c.v_head_dim = 128;
  return c;
}

bool bit_equal(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

TEST(Weights, RandomWeightsHaveHFShapesAndValidate) {
  const AttentionConfig c = small_v3();
  AttentionWeights w = random_attention_weights(c, 7);
  w.validate(c);
  EXPECT_EQ(w.q_a_proj.shape(), (Shape{40, 72}));
  EXPECT_EQ(w.q_a_layernorm.shape(), (Shape{40}));
  EXPECT_EQ(w.q_b_proj.shape(), (Shape{3 * 24, 40}));
  EXPECT_FALSE(w.q_proj.defined());
  EXPECT_EQ(w.kv_a_proj_with_mqa.shape(), (Shape{40, 72}));
  EXPECT_EQ(w.kv_a_layernorm.shape(), (Shape{32}));
  EXPECT_EQ(w.kv_b_proj.shape(), (Shape{3 * 28, 32}));
  EXPECT_EQ(w.o_proj.shape(), (Shape{72, 36}));
  EXPECT_EQ(w.o_proj.dtype(), DType::F32);

  const AttentionConfig l = small_v2_lite();
  AttentionWeights v = random_attention_weights(l, 7);
  v.validate(l);
  EXPECT_EQ(v.q_proj.shape(), (Shape{3 * 24, 72}));
  EXPECT_FALSE(v.q_a_proj.defined());
  EXPECT_FALSE(v.q_a_layernorm.defined());
  EXPECT_FALSE(v.q_b_proj.defined());

  // Fails for a dtype weights cannot have.
  expect_error([&] { random_attention_weights(c, 1, DType::F8_E4M3FN); }, {"fp8_e4m3fn"});
}

TEST(Weights, RandomWeightsStatisticsAndSeeds) {
  const AttentionConfig c = v3_dims_two_heads();
  const AttentionWeights w = random_attention_weights(c, 11);
  auto stats = [](const Tensor& t) {
    double s = 0, s2 = 0;
    const auto v = t.to_doubles();
    for (double x : v) s += x, s2 += x * x;
    const double mean = s / double(v.size());
    return std::pair{mean, std::sqrt(s2 / double(v.size()) - mean * mean)};
  };
  // Projections: std 1/sqrt(in_features).
  for (const Tensor* t : {&w.q_a_proj, &w.q_b_proj, &w.kv_a_proj_with_mqa, &w.kv_b_proj,
                          &w.o_proj}) {
    auto [mean, sd] = stats(*t);
    const double want = 1.0 / std::sqrt(double(t->dim(1)));
    EXPECT_NEAR(sd / want, 1.0, 0.05) << shape_str(t->shape());
    EXPECT_NEAR(mean / want, 0.0, 0.05) << shape_str(t->shape());
  }
  // Norm weights: 1 + 0.1·N(0, 1).
  for (const Tensor* t : {&w.q_a_layernorm, &w.kv_a_layernorm}) {
    auto [mean, sd] = stats(*t);
    EXPECT_NEAR(mean, 1.0, 0.02);
    EXPECT_NEAR(sd, 0.1, 0.015);
  }
  // Reproducible from the seed; another seed differs; dtype only changes the storage.
  EXPECT_TRUE(bit_equal(random_attention_weights(c, 11).kv_b_proj, w.kv_b_proj));
  EXPECT_FALSE(bit_equal(random_attention_weights(c, 12).kv_b_proj, w.kv_b_proj));
  const AttentionWeights b = random_attention_weights(c, 11, DType::BF16);
  EXPECT_EQ(b.o_proj.dtype(), DType::BF16);
  EXPECT_TRUE(bit_equal(b.o_proj, w.o_proj.to(DType::BF16)));
  const AttentionWeights d = random_attention_weights(c, 11, DType::F64);
  EXPECT_TRUE(bit_equal(d.q_b_proj.to(DType::F32), w.q_b_proj));
}

TEST(Weights, ToConvertsEveryPresentTensor) {
  const AttentionConfig c = small_v2_lite();
  const AttentionWeights w = random_attention_weights(c, 3);
  const AttentionWeights b = w.to(DType::BF16);
  b.validate(c);
  EXPECT_FALSE(b.q_a_proj.defined());
  for (const Tensor* t : {&b.q_proj, &b.kv_a_proj_with_mqa, &b.kv_a_layernorm, &b.kv_b_proj,
                          &b.o_proj})
    EXPECT_EQ(t->dtype(), DType::BF16);
  EXPECT_TRUE(bit_equal(b.q_proj, w.q_proj.to(DType::BF16)));
  // A deep copy: changing the converted weights leaves the source alone.
  AttentionWeights f = w.to(DType::F32);
  f.o_proj.set(0, 123.0);
  EXPECT_NE(w.o_proj.at(0), 123.0);
}

TEST(Weights, ValidateNamesTheFirstBadTensor) {
  const AttentionConfig c = small_v3();
  {
    AttentionWeights w = random_attention_weights(c, 1);
    w.q_b_proj = Tensor::host(DType::F32, {10, 3});
    expect_error([&] { w.validate(c); },
                 {"attention weights: q_b_proj has shape [10, 3], expected [72, 40]"});
  }
  {
    AttentionWeights w = random_attention_weights(c, 1);
    w.kv_a_layernorm = Tensor();
    expect_error([&] { w.validate(c); }, {"kv_a_layernorm", "missing", "[32]"});
  }
  {
    AttentionWeights w = random_attention_weights(c, 1);
    w.q_proj = Tensor::host(DType::F32, {72, 72});
    expect_error([&] { w.validate(c); }, {"q_proj", "absent", "q_lora_rank"});
  }
  {
    AttentionWeights w = random_attention_weights(c, 1);
    w.o_proj = Tensor::host(DType::F8_E4M3FN, {72, 36});
    expect_error([&] { w.validate(c); }, {"o_proj", "fp8_e4m3fn"});
  }
  {
    AttentionWeights w = random_attention_weights(c, 1);
    w.kv_b_proj = w.kv_b_proj.reshaped({3, 28, 32});
    expect_error([&] { w.validate(c); }, {"kv_b_proj", "[3, 28, 32]", "[84, 32]"});
  }
  const AttentionConfig l = small_v2_lite();
  {
    AttentionWeights w = random_attention_weights(l, 1);
    w.q_proj = Tensor();
    expect_error([&] { w.validate(l); }, {"q_proj", "missing", "[72, 72]"});
  }
  {
    AttentionWeights w = random_attention_weights(l, 1);
    w.q_a_layernorm = Tensor::host(DType::F32, {40});
    expect_error([&] { w.validate(l); }, {"q_a_layernorm", "absent"});
  }
}

TEST(Weights, SplitAndMergeKvBProjAreExact) {
  for (const AttentionConfig& c : {small_v3(), small_v2_lite(), v3_dims_two_heads()}) {
    const int64_t H = c.num_attention_heads, dn = c.qk_nope_head_dim, dv = c.v_head_dim;
    const int64_t R = c.kv_lora_rank;
    for (DType t : {DType::F32, DType::BF16}) {
      const Tensor kvb = test::random_tensor({H * (dn + dv), R}, t, 99);
      const AbsorbedWeights a = split_kv_b_proj(c, kvb);
      ASSERT_EQ(a.w_kc.shape(), (Shape{H, dn, R}));
      ASSERT_EQ(a.w_vc.shape(), (Shape{H, dv, R}));
      EXPECT_EQ(a.w_kc.dtype(), t);
      // Element by element: w_kc[h][i] = row h·(dn+dv) + i, w_vc[h][i] = row h·(dn+dv) + dn + i.
      for (int64_t h = 0; h < H; ++h)
        for (int64_t r = 0; r < R; ++r) {
          for (int64_t i = 0; i < dn; ++i)
            ASSERT_EQ(a.w_kc.at(size_t((h * dn + i) * R + r)),
                      kvb.at(size_t((h * (dn + dv) + i) * R + r)));
          for (int64_t i = 0; i < dv; ++i)
            ASSERT_EQ(a.w_vc.at(size_t((h * dv + i) * R + r)),
                      kvb.at(size_t((h * (dn + dv) + dn + i) * R + r)));
        }
      EXPECT_TRUE(bit_equal(merge_kv_b_proj(c, a), kvb));
    }
  }
}

TEST(Weights, SplitAndMergeCheckShapes) {
  const AttentionConfig c = small_v3();
  expect_error([&] { split_kv_b_proj(c, Tensor::host(DType::F32, {84, 31})); },
               {"kv_b_proj", "[84, 31]", "[84, 32]"});
  expect_error([&] { split_kv_b_proj(c, Tensor()); }, {"kv_b_proj"});
  AbsorbedWeights a = split_kv_b_proj(c, test::random_tensor({84, 32}, DType::F32, 1));
  AbsorbedWeights bad = a;
  bad.w_vc = Tensor::host(DType::F32, {3, 16, 32});
  expect_error([&] { merge_kv_b_proj(c, bad); }, {"w_vc", "[3, 16, 32]", "[3, 12, 32]"});
  bad = a;
  bad.w_kc = Tensor();
  expect_error([&] { merge_kv_b_proj(c, bad); }, {"w_kc"});
  bad = a;
  bad.w_kc = a.w_kc.to(DType::BF16);
  expect_error([&] { merge_kv_b_proj(c, bad); }, {"bf16", "f32"});
}

// An fp8 tensor from codes.
Tensor fp8_from_codes(const std::vector<uint8_t>& codes, DType t, Shape shape) {
  Tensor w = Tensor::host(t, std::move(shape));
  std::memcpy(w.data(), codes.data(), codes.size());
  return w;
}

TEST(Weights, DequantizeBlockFp8EdgeBlocks) {
  struct Case {
    int64_t N, K, block;
    DType wt, out;
  };
  for (Case cs : {Case{300, 200, 128, DType::F8_E4M3FN, DType::F32},
                  Case{300, 200, 128, DType::F8_E4M3FNUZ, DType::F32},
                  Case{129, 257, 128, DType::F8_E4M3FN, DType::BF16},
                  Case{37, 50, 16, DType::F8_E4M3FN, DType::F64},
                  Case{128, 128, 128, DType::F8_E4M3FN, DType::F16}}) {
    const int64_t nb = (cs.N + cs.block - 1) / cs.block, kb = (cs.K + cs.block - 1) / cs.block;
    std::vector<uint8_t> codes(size_t(cs.N * cs.K));
    std::mt19937_64 rng(5);
    auto decode = [&](uint8_t q) {
      return cs.wt == DType::F8_E4M3FN ? fp8_e4m3fn_to_float(q) : fp8_e4m3fnuz_to_float(q);
    };
    for (uint8_t& q : codes) {
      do q = uint8_t(rng());
      while (std::isnan(decode(q)));  // every finite code, no NaN
    }
    const Tensor w = fp8_from_codes(codes, cs.wt, {cs.N, cs.K});
    std::vector<double> sv(size_t(nb * kb));
    for (size_t i = 0; i < sv.size(); ++i) sv[i] = std::ldexp(1.0 + 0.37 * double(i), -7);
    const Tensor s = Tensor::host_from(sv, DType::F32, {nb, kb});
    const Tensor out = dequantize_block_fp8(w, s, cs.out, cs.block);
    ASSERT_EQ(out.shape(), (Shape{cs.N, cs.K}));
    ASSERT_EQ(out.dtype(), cs.out);
    for (int64_t n = 0; n < cs.N; ++n)
      for (int64_t k = 0; k < cs.K; ++k) {
        const uint8_t q = codes[size_t(n * cs.K + k)];
        const float v = decode(q);
        const float sc = s.ptr<float>()[(n / cs.block) * kb + k / cs.block];
        Tensor want = Tensor::host_from({double(v) * double(sc)}, cs.out, {1});
        ASSERT_EQ(out.at(size_t(n * cs.K + k)), want.at(0)) << "n " << n << " k " << k;
      }
  }
}

TEST(Weights, DequantizeBlockFp8ChecksInputs) {
  const Tensor w = Tensor::host(DType::F8_E4M3FN, {300, 200});
  const Tensor s = Tensor::host(DType::F32, {3, 2});
  dequantize_block_fp8(w, s, DType::F32);
  expect_error([&] { dequantize_block_fp8(w, Tensor::host(DType::F32, {2, 2}), DType::F32); },
               {"scale_inv", "[2, 2]", "[3, 2]"});
  expect_error([&] { dequantize_block_fp8(w, Tensor::host(DType::BF16, {3, 2}), DType::F32); },
               {"scale_inv", "bf16"});
  expect_error([&] { dequantize_block_fp8(Tensor::host(DType::BF16, {300, 200}), s, DType::F32); },
               {"weight", "bf16"});
  expect_error([&] { dequantize_block_fp8(Tensor::host(DType::F8_E4M3FN, {60000}), s,
                                          DType::F32); },
               {"2-D"});
  expect_error([&] { dequantize_block_fp8(w, s, DType::F32, 0); }, {"block"});
  expect_error([&] { dequantize_block_fp8(w, s, DType::I32); }, {"i32"});
}

using Checkpoint = std::map<std::string, Tensor>;

TensorLookup lookup(const Checkpoint& ck) {
  return [&ck](const std::string& name) -> std::optional<Tensor> {
    auto it = ck.find(name);
    if (it == ck.end()) return std::nullopt;
    return it->second;
  };
}

// Block-quantizes w [N, K] like DeepSeek's fp8 checkpoints: per 128×128 block, scale_inv =
// amax / 448, codes = w / scale_inv.
std::pair<Tensor, Tensor> quantize_fp8(const Tensor& w) {
  const int64_t N = w.dim(0), K = w.dim(1), nb = (N + 127) / 128, kb = (K + 127) / 128;
  Tensor q = Tensor::host(DType::F8_E4M3FN, {N, K});
  Tensor s = Tensor::host(DType::F32, {nb, kb});
  for (int64_t bn = 0; bn < nb; ++bn)
    for (int64_t bk = 0; bk < kb; ++bk) {
      double amax = 0;
      for (int64_t n = bn * 128; n < std::min(N, bn * 128 + 128); ++n)
        for (int64_t k = bk * 128; k < std::min(K, bk * 128 + 128); ++k)
          amax = std::max(amax, std::fabs(w.at(size_t(n * K + k))));
      const float sc = float(amax / 448.0);
      s.ptr<float>()[bn * kb + bk] = sc;
      for (int64_t n = bn * 128; n < std::min(N, bn * 128 + 128); ++n)
        for (int64_t k = bk * 128; k < std::min(K, bk * 128 + 128); ++k)
          q.ptr<uint8_t>()[n * K + k] = float_to_fp8_e4m3fn(float(w.at(size_t(n * K + k)) / sc));
    }
  return {q, s};
}

const char* kPrefix = "model.layers.0.self_attn.";

// An HF-style checkpoint of the layer: projections in fp8 with scales (when fp8), norms in bf16.
Checkpoint make_checkpoint(const AttentionConfig& c, bool fp8, AttentionWeights* ref) {
  const AttentionWeights w = random_attention_weights(c, 21, DType::BF16);
  AttentionWeights r = w.to(DType::F32);
  Checkpoint ck;
  auto add = [&](const std::string& name, const Tensor& t, Tensor AttentionWeights::*m,
                 bool norm) {
    if (!t.defined()) return;
    if (fp8 && !norm) {
      auto [q, s] = quantize_fp8(t);
      ck[kPrefix + name + ".weight"] = q;
      ck[kPrefix + name + ".weight_scale_inv"] = s;
      r.*m = dequantize_block_fp8(q, s, DType::F32);
    } else {
      ck[kPrefix + name + ".weight"] = t;
    }
  };
  add("q_a_proj", w.q_a_proj, &AttentionWeights::q_a_proj, false);
  add("q_a_layernorm", w.q_a_layernorm, &AttentionWeights::q_a_layernorm, true);
  add("q_b_proj", w.q_b_proj, &AttentionWeights::q_b_proj, false);
  add("q_proj", w.q_proj, &AttentionWeights::q_proj, false);
  add("kv_a_proj_with_mqa", w.kv_a_proj_with_mqa, &AttentionWeights::kv_a_proj_with_mqa, false);
  add("kv_a_layernorm", w.kv_a_layernorm, &AttentionWeights::kv_a_layernorm, true);
  add("kv_b_proj", w.kv_b_proj, &AttentionWeights::kv_b_proj, false);
  add("o_proj", w.o_proj, &AttentionWeights::o_proj, false);
  // Something else of the model that the loader must ignore.
  ck["model.layers.0.mlp.gate_proj.weight"] = Tensor::host(DType::I32, {2});
  if (ref) *ref = r;
  return ck;
}

void expect_same_weights(const AttentionWeights& a, const AttentionWeights& b) {
  for (auto m : {&AttentionWeights::q_a_proj, &AttentionWeights::q_a_layernorm,
                 &AttentionWeights::q_b_proj, &AttentionWeights::q_proj,
                 &AttentionWeights::kv_a_proj_with_mqa, &AttentionWeights::kv_a_layernorm,
                 &AttentionWeights::kv_b_proj, &AttentionWeights::o_proj}) {
    ASSERT_EQ((a.*m).defined(), (b.*m).defined());
    if ((a.*m).defined()) EXPECT_TRUE(bit_equal(a.*m, b.*m)) << shape_str((a.*m).shape());
  }
}

TEST(Weights, LoadBf16V3AndV2Lite) {
  for (const AttentionConfig& c : {small_v3(), small_v2_lite()}) {
    AttentionWeights ref;
    const Checkpoint ck = make_checkpoint(c, false, &ref);
    const AttentionWeights w = load_attention_weights(c, lookup(ck), kPrefix);
    expect_same_weights(w, ref);
    EXPECT_EQ(c.has_q_lora(), w.q_a_proj.defined());
    EXPECT_EQ(!c.has_q_lora(), w.q_proj.defined());
    const AttentionWeights wb = load_attention_weights(c, lookup(ck), kPrefix, DType::BF16);
    expect_same_weights(wb, ref.to(DType::BF16));
  }
}

TEST(Weights, LoadFp8WithScales) {
  for (const AttentionConfig& c : {v3_dims_two_heads(), small_v2_lite()}) {
    AttentionWeights ref;
    const Checkpoint ck = make_checkpoint(c, true, &ref);
    EXPECT_EQ(ck.at(std::string(kPrefix) + "kv_b_proj.weight").dtype(), DType::F8_E4M3FN);
    const AttentionWeights w = load_attention_weights(c, lookup(ck), kPrefix);
    w.validate(c);
    EXPECT_EQ(w.kv_b_proj.dtype(), DType::F32);
    expect_same_weights(w, ref);
    // Close to the unquantized weights (e4m3 has 3 mantissa bits).
    const AttentionWeights orig = random_attention_weights(c, 21, DType::BF16);
    EXPECT_LT(test::rel_l2(w.kv_b_proj.to_doubles(), orig.kv_b_proj.to_doubles()), 0.05);
    EXPECT_LT(test::rel_l2(w.o_proj.to_doubles(), orig.o_proj.to_doubles()), 0.05);
  }
}

TEST(Weights, LoadErrorsNameTheTensor) {
  const AttentionConfig c = v3_dims_two_heads();
  const Checkpoint full = make_checkpoint(c, true, nullptr);
  const std::string p = kPrefix;
  {
    Checkpoint ck = full;
    ck.erase(p + "q_b_proj.weight");
    expect_error([&] { load_attention_weights(c, lookup(ck), kPrefix); },
                 {"'model.layers.0.self_attn.q_b_proj.weight'", "missing"});
  }
  {
    Checkpoint ck = full;
    ck.erase(p + "kv_b_proj.weight_scale_inv");
    expect_error([&] { load_attention_weights(c, lookup(ck), kPrefix); },
                 {"'model.layers.0.self_attn.kv_b_proj.weight_scale_inv'", "missing"});
  }
  {
    Checkpoint ck = full;
    ck[p + "o_proj.weight_scale_inv"] = Tensor::host(DType::F32, {2, 3});
    expect_error([&] { load_attention_weights(c, lookup(ck), kPrefix); },
                 {"'model.layers.0.self_attn.o_proj.weight_scale_inv'", "[2, 3]", "[2, 2]"});
  }
  {
    Checkpoint ck = full;
    ck[p + "o_proj.weight_scale_inv"] = Tensor::host(DType::BF16, {2, 2});
    expect_error([&] { load_attention_weights(c, lookup(ck), kPrefix); },
                 {"o_proj.weight_scale_inv", "bf16"});
  }
  {
    Checkpoint ck = full;
    ck[p + "kv_a_proj_with_mqa.weight"] = Tensor::host(DType::BF16, {576, 255});
    expect_error([&] { load_attention_weights(c, lookup(ck), kPrefix); },
                 {"'model.layers.0.self_attn.kv_a_proj_with_mqa.weight'", "[576, 255]",
                  "[576, 256]"});
  }
  {
    Checkpoint ck = full;
    ck[p + "kv_a_layernorm.weight"] = Tensor::host(DType::I64, {512});
    expect_error([&] { load_attention_weights(c, lookup(ck), kPrefix); },
                 {"kv_a_layernorm.weight", "i64"});
  }
  // A V2-Lite config against a V3 checkpoint: q_proj is missing.
  AttentionConfig lite = c;
  lite.q_lora_rank = 0;
  expect_error([&] { load_attention_weights(lite, lookup(full), kPrefix); },
               {"'model.layers.0.self_attn.q_proj.weight'"});
  // The wrong prefix.
  expect_error([&] { load_attention_weights(c, lookup(full), "model.layers.1.self_attn."); },
               {"'model.layers.1.self_attn.q_a_proj.weight'"});
}

}  // namespace
}  // namespace mla
