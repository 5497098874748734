// mla/moe.h — MoE routing parameters (HF config names) and the host reference of the router:
// which num_experts_per_tok experts each token goes to, and with what weight. The platforms'
// Ops::moe_route makes the same choice on the device.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mla {

struct MoeRouting {
  int64_t n_routed_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  std::string scoring_func = "softmax";  // "softmax" (V2) or "sigmoid" (V3)
  std::string topk_method = "greedy";    // "greedy", "group_limited_greedy" (V2), "noaux_tc" (V3)
  bool norm_topk_prob = false;           // V3 only: transformers' V2 router ignores it
  double routed_scaling_factor = 1.0;

  // Throws Error naming what is inconsistent (counts, groups, unknown names).
  void validate() const;
};

// Expert choice for T tokens: expert[t·k + j] and weight[t·k + j], k = num_experts_per_tok.
struct Routing {
  std::vector<int32_t> expert;
  std::vector<float> weight;
};
// router_logits [T, n_routed_experts] (f32, as HF computes them); bias [n_routed_experts] or empty.
Routing route_tokens(const MoeRouting& r, const std::vector<float>& router_logits,
                     const std::vector<float>& bias, int64_t T);

}  // namespace mla
