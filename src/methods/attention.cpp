// The attention layer: weights on the platform, and the method run.
#include <fmt/format.h>

#include "methods/method.h"
#include "mla/error.h"
#include "mla/registry.h"

namespace mla {

AttentionLayer::AttentionLayer(const AttentionConfig& cfg, Ops& ops)
    : cfg_(cfg), ops_(ops), rope_((cfg.validate(), rope_frequencies(cfg))) {}

AttentionLayer::AttentionLayer(const AttentionConfig& cfg, const AttentionWeights& weights, Ops& ops)
    : AttentionLayer(cfg, ops) {
  weights.validate(cfg);
  const DType act = ops.act_dtype();
  auto up = [&](const Tensor& t) { return t.defined() ? ops.upload(t.to(act)) : Tensor(); };
  w_.q_a_proj = up(weights.q_a_proj);
  w_.q_a_layernorm = up(weights.q_a_layernorm);
  w_.q_b_proj = up(weights.q_b_proj);
  w_.q_proj = up(weights.q_proj);
  w_.kv_a_proj_with_mqa = up(weights.kv_a_proj_with_mqa);
  w_.kv_a_layernorm = up(weights.kv_a_layernorm);
  w_.kv_b_proj = up(weights.kv_b_proj);
  w_.o_proj = up(weights.o_proj);
  AbsorbedWeights a = split_kv_b_proj(cfg, weights.kv_b_proj);
  w_.w_kc = up(a.w_kc);
  w_.w_vc = up(a.w_vc);
  w_.packed_absorbed = ops.pack_absorbed(a);
}

std::unique_ptr<AttentionLayer> AttentionLayer::on_platform(const AttentionConfig& cfg,
                                                            const AttentionWeights& weights, Ops& ops) {
  std::unique_ptr<AttentionLayer> l(new AttentionLayer(cfg, ops));
  weights.validate(cfg);
  const DType act = ops.act_dtype();
  for (const AttentionWeightSlot& s : attention_weight_slots(cfg)) {
    const Tensor& t = weights.*s.member;
    if (t.defined() && (t.platform() != ops.platform() || t.dtype() != act))
      fail("attention weights: {} is {} on {}, expected {} on {}", s.name, dtype_name(t.dtype()),
           platform_name(t.platform()), dtype_name(act), platform_name(ops.platform()));
  }
  DeviceAttentionWeights& w = l->w_;
  w.q_a_proj = weights.q_a_proj, w.q_a_layernorm = weights.q_a_layernorm, w.q_b_proj = weights.q_b_proj;
  w.q_proj = weights.q_proj, w.kv_a_proj_with_mqa = weights.kv_a_proj_with_mqa;
  w.kv_a_layernorm = weights.kv_a_layernorm, w.kv_b_proj = weights.kv_b_proj, w.o_proj = weights.o_proj;
  // kv_b_proj [H·(dn+dv), L] is [H, (dn+dv)·L] row-major: w_kc takes each head's first dn·L values.
  const int64_t H = cfg.num_attention_heads, dn = cfg.qk_nope_head_dim, dv = cfg.v_head_dim, L = cfg.kv_lora_rank;
  const Tensor per_head = w.kv_b_proj.reshaped({H, (dn + dv) * L});
  w.w_kc = ops.empty(act, {H, dn, L});
  w.w_vc = ops.empty(act, {H, dv, L});
  Tensor kc = w.w_kc.reshaped({H, dn * L}), vc = w.w_vc.reshaped({H, dv * L});
  ops.take_cols(per_head, 0, kc);
  ops.take_cols(per_head, dn * L, vc);
  if (ops.packs_absorbed())
    w.packed_absorbed = ops.pack_absorbed({ops.download(w.w_kc), ops.download(w.w_vc)});
  return l;
}

AttentionOutput AttentionLayer::forward(const Tensor& x, const BatchPlan& plan, KVPool& pool,
                                        int64_t layer, ForwardMethod method,
                                        const DispatchSettings& settings) {
  const Platform p = ops_.platform();
  const MethodImpl* impl = &require_method_impl(method, p, plan.batch);
  const int64_t T = plan.num_tokens;
  if (x.platform() != p || x.rank() != 2 || x.dim(0) != T || x.dim(1) != cfg_.hidden_size)
    fail("attention input is {} on {}, expected [{}, {}] on {}", shape_str(x.shape()),
         platform_name(x.platform()), T, cfg_.hidden_size, platform_name(p));
  if (x.dtype() != ops_.act_dtype())
    fail("attention input is {}, expected {}", dtype_name(x.dtype()), dtype_name(ops_.act_dtype()));
  if (pool.config().row_dim != cfg_.kv_row_dim())
    fail("KV pool rows have {} values, the config needs kv_lora_rank + qk_rope_head_dim = {}",
         pool.config().row_dim, cfg_.kv_row_dim());
  if (layer < 0 || layer >= pool.config().num_layers)
    fail("layer {} is outside the KV pool's {} layers", layer, pool.config().num_layers);
  if (pool.buffer(layer).platform() != p) fail("the KV pool lives on {}, not {}", platform_name(pool.buffer(layer).platform()), platform_name(p));
  if (!ops_.step_checked(plan, pool))  // a step over this plan checked its slots once
    for (int32_t s : plan.kv_slots)
      if (s < 0 || s >= pool.num_slots()) fail("batch slot {} is outside the KV pool of {} slots", s, pool.num_slots());
  if (settings.chunk_capacity <= 0) fail("chunk capacity must be positive (got {})", settings.chunk_capacity);

  MethodContext c{cfg_, w_, rope_, settings, ops_, pool, layer, plan, x, {}, {}, {}, {}};
  const int64_t H = cfg_.num_attention_heads;
  AttentionOutput out;
  out.method = method;
  out.out = ops_.empty(ops_.act_dtype(), {T, cfg_.hidden_size});
  if (T == 0) {
    out.lse = ops_.empty(ops_.lse_dtype(), {0, H});
    return out;
  }
  impl->prepare(c);
  impl->core(c);
  ops_.linear(c.o.reshaped({T, H * cfg_.v_head_dim}), w_.o_proj, out.out);
  out.lse = c.lse;
  return out;
}

AttentionOutput AttentionLayer::forward(const Tensor& x, const BatchPlan& plan, KVPool& pool,
                                        int64_t layer, const DispatchSettings& settings) {
  DispatchResult d = dispatch(plan.batch, settings, ops_.platform());
  if (!d.implemented || !d.serves)
    fail("dispatch chose {} (resolved {}) on {}: {}", method_name(d.method), method_name(d.resolved),
         platform_name(d.platform), d.reason);
  AttentionOutput out = forward(x, plan, pool, layer, d.resolved, settings);
  return out;
}

}  // namespace mla
