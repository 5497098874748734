// mla/attention.h — one DeepSeek MLA attention layer on a platform, run by a forward method.
#pragma once
#include <memory>
#include <optional>
#include <string>

#include "mla/batch.h"
#include "mla/config.h"
#include "mla/dispatch.h"
#include "mla/forward_method.h"
#include "mla/kv_pool.h"
#include "mla/ops.h"
#include "mla/rope.h"
#include "mla/weights.h"

namespace mla {

// The method chosen for a batch and whether this build can run it.
// Weights of a layer as they live on a platform: the projections plus the absorbed w_kc / w_vc.
struct DeviceAttentionWeights {
  Tensor q_a_proj, q_a_layernorm, q_b_proj, q_proj, kv_a_proj_with_mqa, kv_a_layernorm,
      kv_b_proj, o_proj;
  Tensor w_kc;  // [H, qk_nope_head_dim, kv_lora_rank]
  Tensor w_vc;  // [H, v_head_dim, kv_lora_rank]
  std::shared_ptr<const void> packed_absorbed;  // the platform's own form (Ops::pack_absorbed), or null
};

struct AttentionOutput {
  Tensor out;  // [T, hidden_size]
  Tensor lse;  // [T, H] natural-log LSE of the softmax over every key each query saw
  ForwardMethod method = ForwardMethod::MLA;
};

class AttentionLayer {
 public:
  // Validates the weights against the config and uploads them (in ops.act_dtype()).
  AttentionLayer(const AttentionConfig& cfg, const AttentionWeights& weights, Ops& ops);
  // Weights already on ops' platform in ops.act_dtype() (a model loader's), taken without a copy;
  // w_kc / w_vc are split from kv_b_proj there.
  static std::unique_ptr<AttentionLayer> on_platform(const AttentionConfig& cfg,
                                                     const AttentionWeights& weights, Ops& ops);

  const AttentionConfig& config() const { return cfg_; }
  Ops& ops() const { return ops_; }
  const DeviceAttentionWeights& weights() const { return w_; }

  // Runs `method` (a member this platform implements) on the batch: x[T, hidden_size] holds the
  // new tokens' hidden states, request after request. Writes the new tokens' latent rows to
  // `pool` layer `layer`. Everything is checked before anything is written: on Error (method not
  // implemented on the platform, a batch it cannot serve, shapes, pool) the pool is unchanged.
  AttentionOutput forward(const Tensor& x, const BatchPlan& plan, KVPool& pool, int64_t layer,
                          ForwardMethod method, const DispatchSettings& settings = {});
  // Dispatches first (handler of settings.backend, the platform's resolution), then runs.
  AttentionOutput forward(const Tensor& x, const BatchPlan& plan, KVPool& pool, int64_t layer,
                          const DispatchSettings& settings = {});

 private:
  AttentionLayer(const AttentionConfig& cfg, Ops& ops);
  AttentionConfig cfg_;
  Ops& ops_;
  DeviceAttentionWeights w_;
  RopeFrequencies rope_;
};

}  // namespace mla
