// MLA (weight-absorbed): q_abs[h] = q_nope[h] · w_kc[h]; attention of [q_abs | q_pe] against the
// latent rows (one KV head for all query heads) → o_lat [T, H, 512]; o[h] = o_lat[h] · w_vc[h]ᵀ.
#include "methods/method.h"

namespace mla::methods {

void mla_core(MethodContext& c) {
  const AttentionConfig& cfg = c.cfg;
  Ops& ops = c.ops;
  const int64_t T = c.plan.num_tokens, H = cfg.num_attention_heads;
  const DType act = ops.act_dtype();
  const Tensor& q_mla = c.q_mla;  // [T, H, 576], made by prepare_absorbed
  Tensor o_lat = ops.empty(act, {T, H, cfg.kv_lora_rank});   // [T, H, 512]
  c.lse = ops.empty(ops.lse_dtype(), {T, H});                // [T, H]
  ops.mla_attention(q_mla, c.pool, c.layer, c.plan.kv_slots, c.plan.prefix_and_new(),
                    cfg.kv_lora_rank, cfg.softmax_scale(), o_lat, c.lse);
  c.o = ops.empty(act, {T, H, cfg.v_head_dim});              // [T, H, 128]
  ops.absorb_o(o_lat, c.w.w_vc, c.o);
}

}  // namespace mla::methods
