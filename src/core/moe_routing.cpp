// moe_routing.cpp — MoE routing, as transformers computes it: V3 (sigmoid scores,
// e_score_correction_bias for the choice only, groups scored by the sum of their top-2, noaux_tc)
// and V2 (softmax scores, greedy or group_limited_greedy with the group max; norm_topk_prob
// ignored, as transformers' V2 router does). Pure host code on the router logits; the device
// routers (Ops::moe_route) make the same choice.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "mla/error.h"
#include "mla/moe.h"

namespace mla {
namespace {

// Indices of the k largest values (ties: the lower index first).
std::vector<int32_t> top_k(const std::vector<double>& v, int64_t k) {
  std::vector<int32_t> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
    return v[size_t(a)] > v[size_t(b)] || (v[size_t(a)] == v[size_t(b)] && a < b);
  });
  idx.resize(size_t(k));
  return idx;
}

}  // namespace

void MoeRouting::validate() const {
  if (n_routed_experts <= 0 || num_experts_per_tok <= 0 || num_experts_per_tok > n_routed_experts)
    fail("moe routing: num_experts_per_tok {} of n_routed_experts {}", num_experts_per_tok, n_routed_experts);
  if (n_group <= 0 || n_routed_experts % n_group != 0 || topk_group <= 0 || topk_group > n_group)
    fail("moe routing: n_group {} / topk_group {} do not divide {} experts", n_group, topk_group, n_routed_experts);
  if (scoring_func != "softmax" && scoring_func != "sigmoid")
    fail("moe routing: scoring_func \"{}\" (softmax, sigmoid)", scoring_func);
  if (topk_method != "greedy" && topk_method != "group_limited_greedy" && topk_method != "noaux_tc")
    fail("moe routing: topk_method \"{}\" (greedy, group_limited_greedy, noaux_tc)", topk_method);
  if (topk_method != "greedy" && topk_group * (n_routed_experts / n_group) < num_experts_per_tok)
    fail("moe routing: {} kept groups of {} experts cannot give {} experts", topk_group,
         n_routed_experts / n_group, num_experts_per_tok);
}

Routing route_tokens(const MoeRouting& c, const std::vector<float>& router_logits,
                     const std::vector<float>& bias, int64_t T) {
  c.validate();
  const int64_t E = c.n_routed_experts, K = c.num_experts_per_tok, G = c.n_group;
  const int64_t per_group = E / G;
  if (int64_t(router_logits.size()) != T * E) fail("routing: {} logits for {} tokens × {} experts", router_logits.size(), T, E);
  if (!bias.empty() && int64_t(bias.size()) != E) fail("routing: bias has {} values for {} experts", bias.size(), E);
  const bool sigmoid = c.scoring_func == "sigmoid";
  Routing r;
  r.expert.reserve(size_t(T * K));
  r.weight.reserve(size_t(T * K));
  std::vector<double> scores(static_cast<size_t>(E)), choice(static_cast<size_t>(E)), group(static_cast<size_t>(G));
  for (int64_t t = 0; t < T; ++t) {
    const float* l = &router_logits[size_t(t * E)];
    if (sigmoid) {
      for (int64_t e = 0; e < E; ++e) scores[size_t(e)] = 1.0 / (1.0 + std::exp(-double(l[e])));
    } else {
      const double m = *std::max_element(l, l + E);
      double sum = 0;
      for (int64_t e = 0; e < E; ++e) sum += (scores[size_t(e)] = std::exp(double(l[e]) - m));
      for (double& s : scores) s /= sum;
    }
    for (int64_t e = 0; e < E; ++e) choice[size_t(e)] = scores[size_t(e)] + (bias.empty() ? 0.0 : double(bias[size_t(e)]));
    if (c.topk_method == "noaux_tc" || c.topk_method == "group_limited_greedy") {
      for (int64_t g = 0; g < G; ++g) {
        auto first = choice.begin() + g * per_group, last = first + per_group;
        if (c.topk_method == "noaux_tc") {  // sum of the group's top-2
          std::vector<double> v(first, last);
          std::partial_sort(v.begin(), v.begin() + std::min<int64_t>(2, per_group), v.end(), std::greater<>());
          group[size_t(g)] = v[0] + (per_group > 1 ? v[1] : 0.0);
        } else {  // the group's max
          group[size_t(g)] = *std::max_element(first, last);
        }
      }
      std::vector<bool> keep(size_t(G), false);
      for (int32_t g : top_k(group, c.topk_group)) keep[size_t(g)] = true;
      for (int64_t e = 0; e < E; ++e)
        if (!keep[size_t(e / per_group)])  // transformers masks with -inf in V3, 0.0 in V2
          choice[size_t(e)] = c.topk_method == "noaux_tc" ? -INFINITY : 0.0;
    }
    std::vector<int32_t> chosen = top_k(choice, K);
    double sum = 0;
    for (int32_t e : chosen) sum += scores[size_t(e)];
    for (int32_t e : chosen) {
      double w = scores[size_t(e)];
      if (c.norm_topk_prob && sigmoid) w /= sum + 1e-20;  // transformers' V2 router ignores it
      r.expert.push_back(e);
      r.weight.push_back(float(w * c.routed_scaling_factor));
    }
  }
  return r;
}

}  // namespace mla
