// MoE routing against hand-worked cases of transformers' rules.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "mla/model.h"

namespace mla {
namespace {

ModelConfig base(const char* type, int64_t E, int64_t K, int64_t G, int64_t TG) {
  ModelConfig c;
  c.attn.model_type = type;
  c.n_routed_experts = E, c.num_experts_per_tok = K, c.n_group = G, c.topk_group = TG;
  c.scoring_func = std::string(type) == "deepseek_v3" ? "sigmoid" : "softmax";
  c.topk_method = std::string(type) == "deepseek_v3" ? "noaux_tc" : "greedy";
  return c;
}

double logit(double p) { return std::log(p / (1 - p)); }  // sigmoid⁻¹

std::map<int, float> as_map(const Routing& r, int64_t t, int64_t K) {
  std::map<int, float> m;
  for (int64_t j = 0; j < K; ++j) m[r.expert[size_t(t * K + j)]] = r.weight[size_t(t * K + j)];
  return m;
}

TEST(Routing, V3GroupsBySumOfTopTwoBiasChoosesWeightsDoNot) {
  ModelConfig c = base("deepseek_v3", 8, 2, 4, 2);  // 4 groups of 2
  c.norm_topk_prob = true, c.routed_scaling_factor = 2.5;
  // sigmoid scores per expert; group sums (with bias): g0 .9+.1=1.0, g1 .5+.5=1.0(+bias .6 on e2 → 1.6),
  // g2 .8+.05=.85, g3 .3+.3=.6  → groups 1 and 0 kept.
  std::vector<double> p = {0.9, 0.1, 0.5, 0.5, 0.8, 0.05, 0.3, 0.3};
  std::vector<float> logits, bias(8, 0.0f);
  for (double v : p) logits.push_back(float(logit(v)));
  bias[2] = 0.6f;
  Routing r = route_tokens(moe_routing(c), logits, bias, 1);
  auto m = as_map(r, 0, 2);
  ASSERT_EQ(m.size(), 2u);
  ASSERT_TRUE(m.count(0) && m.count(2));  // choice: e2 = 1.1, e0 = .9 (e4 = .8 is in a dropped group)
  const double s0 = 1 / (1 + std::exp(-double(logits[0]))), s2 = 1 / (1 + std::exp(-double(logits[2])));
  EXPECT_NEAR(m[0], s0 / (s0 + s2) * 2.5, 1e-6);  // unbiased scores, renormalized, scaled
  EXPECT_NEAR(m[2], s2 / (s0 + s2) * 2.5, 1e-6);
}

TEST(Routing, V3MasksDroppedGroupsWithMinusInfinity) {
  // As transformers' V3 router: experts of dropped groups get choice -inf, so a kept expert with
  // a negative biased score still wins over them (with 0.0, as V2 masks, it would lose).
  ModelConfig c = base("deepseek_v3", 4, 2, 2, 1);  // 2 groups of 2, keep 1, choose 2
  std::vector<float> logits = {float(logit(0.9)), float(logit(0.8)), float(logit(0.1)), float(logit(0.1))};
  std::vector<float> bias = {0.0f, -0.85f, 0.0f, 0.0f};
  // choice = .9, -.05, .1, .1; groups: g0 .85, g1 .2 → keep g0 → experts 0 and 1
  Routing r = route_tokens(moe_routing(c), logits, bias, 1);
  auto m = as_map(r, 0, 2);
  EXPECT_TRUE(m.count(0) && m.count(1)) << "got " << r.expert[0] << ", " << r.expert[1];
}

TEST(Routing, V2GreedySoftmaxNeverRenormalizes) {
  ModelConfig c = base("deepseek_v2", 4, 2, 1, 1);
  c.routed_scaling_factor = 1.5;
  std::vector<float> logits = {1.0f, 3.0f, 2.0f, 0.0f};
  Routing r = route_tokens(moe_routing(c), logits, {}, 1);
  double z = std::exp(1.0) + std::exp(3.0) + std::exp(2.0) + 1.0;
  auto m = as_map(r, 0, 2);
  EXPECT_NEAR(m[1], std::exp(3.0) / z * 1.5, 1e-6);
  EXPECT_NEAR(m[2], std::exp(2.0) / z * 1.5, 1e-6);
  c.norm_topk_prob = true;  // transformers' V2 router ignores it
  m = as_map(route_tokens(moe_routing(c), logits, {}, 1), 0, 2);
  EXPECT_NEAR(m[1], std::exp(3.0) / z * 1.5, 1e-6);
}

TEST(Routing, V2GroupLimitedGreedyUsesTheGroupMax) {
  ModelConfig c = base("deepseek_v2", 6, 2, 3, 1);  // 3 groups of 2, keep 1
  c.topk_method = "group_limited_greedy";
  // softmax order = logit order. g0 max 5, g1 max 4.9 but g1 sum larger; max keeps g0.
  std::vector<float> logits = {5.0f, 0.0f, 4.9f, 4.8f, 1.0f, 1.0f};
  auto m = as_map(route_tokens(moe_routing(c), logits, {}, 1), 0, 2);
  EXPECT_TRUE(m.count(0) && m.count(1));
}

TEST(Routing, ManyTokensAreIndependent) {
  ModelConfig c = base("deepseek_v3", 8, 2, 4, 2);
  c.norm_topk_prob = true;
  std::vector<float> one = {0.1f, 2.f, -1.f, 0.5f, 1.5f, -2.f, 0.f, 0.3f}, two = {1.f, 0.f, 0.f, 3.f, -1.f, 0.f, 2.f, 0.5f};
  std::vector<float> both = one;
  both.insert(both.end(), two.begin(), two.end());
  Routing r = route_tokens(moe_routing(c), both, {}, 2), r1 = route_tokens(moe_routing(c), one, {}, 1), r2 = route_tokens(moe_routing(c), two, {}, 1);
  EXPECT_EQ(as_map(r, 0, 2), as_map(r1, 0, 2));
  EXPECT_EQ(as_map(r, 1, 2), as_map(r2, 0, 2));
}

}  // namespace
}  // namespace mla
