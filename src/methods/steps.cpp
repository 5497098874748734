// The steps the forward methods share, written once against Ops.
#include "methods/method.h"

namespace mla::steps {

namespace {

// c.q [T, H, qk_head_dim] from x (q's RoPE not applied yet).
void project_q(MethodContext& c) {
  const AttentionConfig& cfg = c.cfg;
  Ops& ops = c.ops;
  const int64_t T = c.plan.num_tokens, H = cfg.num_attention_heads;
  const DType act = ops.act_dtype();
  c.q = ops.empty(act, {T, H, cfg.qk_head_dim()});
  if (cfg.has_q_lora()) {
    Tensor qa = ops.empty(act, {T, cfg.q_lora_rank});  // [T, q_lora_rank]
    ops.linear(c.x, c.w.q_a_proj, qa);
    ops.rmsnorm(qa, cfg.q_lora_rank, c.w.q_a_layernorm, cfg.latent_norm_eps);
    ops.linear(qa, c.w.q_b_proj, c.q);
  } else {
    ops.linear(c.x, c.w.q_proj, c.q);
  }
}

// c.kva [T, 576] = kv_a_proj_with_mqa(x), not normalized or rotated yet.
void project_kv(MethodContext& c) {
  c.kva = c.ops.empty(c.ops.act_dtype(), {c.plan.num_tokens, c.cfg.kv_row_dim()});
  c.ops.linear(c.x, c.w.kv_a_proj_with_mqa, c.kva);
}

}  // namespace

void prepare_latent(MethodContext& c) {
  const AttentionConfig& cfg = c.cfg;
  {
    // The latent projection in a side lane, beside q's: both only read x (the calls keep their
    // program order, so the bits do not change).
    SideLane lane(c.ops);
    project_kv(c);
    lane.main();
    project_q(c);
    lane.join();
  }
  c.ops.finish_latent(c.q, cfg.num_attention_heads, cfg.qk_nope_head_dim, c.kva, cfg.kv_lora_rank,
                      c.w.kv_a_layernorm, cfg.latent_norm_eps, c.plan.positions, c.rope, c.pool, c.layer,
                      c.plan.new_slots);
}

void prepare_absorbed(MethodContext& c) {
  const AttentionConfig& cfg = c.cfg;
  Ops& ops = c.ops;
  const int64_t T = c.plan.num_tokens, H = cfg.num_attention_heads;
  c.q_mla = ops.empty(ops.act_dtype(), {T, H, cfg.kv_row_dim()});  // [T, H, 576]
  if (!ops.absorb_q_rope_fused(T, c.w.w_kc, cfg.qk_rope_head_dim, c.rope)) {
    // q's RoPE would be a launch of its own: it goes with the latent rows' in finish_latent.
    prepare_latent(c);
    ops.absorb_q(c.q, c.w.w_kc, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, c.q_mla);
    return;
  }
  // The latent rows finished and cached in the side lane (their norm, RoPE and cache write need
  // nothing of q's); q's RoPE goes with the absorb (Ops::absorb_q_rope). The two lanes write
  // disjoint tensors, so the bits are those of prepare_latent then absorb_q.
  SideLane lane(ops);
  project_kv(c);
  ops.finish_latent(c.q, 0, cfg.qk_nope_head_dim, c.kva, cfg.kv_lora_rank, c.w.kv_a_layernorm, cfg.latent_norm_eps,
                    c.plan.positions, c.rope, c.pool, c.layer, c.plan.new_slots);
  lane.main();
  project_q(c);
  ops.absorb_q_rope(c.q, c.w.w_kc, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, c.plan.positions, c.rope, c.q_mla);
  lane.join();
}

void decompress(MethodContext& c, const Tensor& rows, Tensor& k, Tensor& v) {
  const AttentionConfig& cfg = c.cfg;
  Ops& ops = c.ops;
  const int64_t S = rows.dim(0), H = cfg.num_attention_heads;
  const DType act = ops.act_dtype();
  Tensor latent = ops.empty(act, {S, cfg.kv_lora_rank});  // [S, 512]
  ops.take_cols(rows, 0, latent);
  Tensor kv = ops.empty(act, {S, H * (cfg.qk_nope_head_dim + cfg.v_head_dim)});  // [S, H·256]
  ops.linear(latent, c.w.kv_b_proj, kv);
  k = ops.empty(act, {S, H, cfg.qk_head_dim()});  // [S, H, 192]
  v = ops.empty(act, {S, H, cfg.v_head_dim});     // [S, H, 128]
  ops.build_kv(kv, rows, cfg.kv_lora_rank, H, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim,
               cfg.v_head_dim, k, v);
}

void mha_attend(MethodContext& c, const Tensor& rows, const AttnSegments& seg, Tensor& o, Tensor& lse) {
  const int64_t T = c.plan.num_tokens, H = c.cfg.num_attention_heads;
  Tensor k, v;
  decompress(c, rows, k, v);
  o = c.ops.empty(c.ops.act_dtype(), {T, H, c.cfg.v_head_dim});  // [T, H, 128]
  lse = c.ops.empty(c.ops.lse_dtype(), {T, H});                  // [T, H]
  c.ops.attention(c.q, k, v, seg, c.cfg.softmax_scale(), o, lse);
}

Tensor read_rows(MethodContext& c, const std::vector<int32_t>& slots) {
  Tensor rows = c.ops.empty(c.ops.act_dtype(), {int64_t(slots.size()), c.cfg.kv_row_dim()});
  c.ops.cache_read(c.pool, c.layer, slots, rows);
  return rows;
}

}  // namespace mla::steps
