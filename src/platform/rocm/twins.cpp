// The ROCm twins of the forward methods, reached through the ROCm resolution table
// (MHA → MHA_ROCM, MHA_ONE_SHOT → MHA_ONE_SHOT_ROCM, MHA_CHUNKED_KV → MHA_CHUNKED_KV_ROCM,
// MLA → MLA_ROCM; MLA_FUSED_ROPE_ROCM for aiter's fused-RoPE decode). They reuse the shared
// schedules and steps where those are the same (src/methods) and run the ROCm platform's own
// fused steps where they differ:
//   prepare  both latent RMSNorms in one kernel; RoPE + [q_abs | q_pe] concat + cache write in one
//            kernel (two-part or assembled row, by target);
//   MHA      K built and cast to the cache dtype in one pass, attention over the cast K;
//            MHA_ROCM attends to prefix + new tokens itself (aiter sends every extend to MHA);
//   MLA      absorb GEMMs through the packed weights (act, fp8 w8a8, fp8 dequantized per call,
//            MXFP4); MLA_FUSED_ROPE_ROCM rotates q_pe and the new key inside the decode kernel.
#include <fmt/format.h>

#include "methods/method.h"
#include "mla/error.h"
#include "platform/rocm/rocm_ops.h"

namespace mla::rocm {
namespace {

const AbsorbPack& pack_of(const MethodContext& c) {
  const auto* p = static_cast<const AbsorbPack*>(c.w.packed_absorbed.get());
  if (!p) fail("the layer's absorbed weights were not packed for the ROCm platform");
  return *p;
}

// Projections and both latent norms (one kernel): c.q [T, H, qk_head_dim] and c.kva [T, row_dim],
// neither rotated yet.
void project(MethodContext& c) {
  const AttentionConfig& cfg = c.cfg;
  RocmOps& r = rocm_ops(c.ops);
  const int64_t T = c.plan.num_tokens, H = cfg.num_attention_heads;
  const DType act = r.act_dtype();
  c.q = r.empty(act, {T, H, cfg.qk_head_dim()});
  c.kva = r.empty(act, {T, cfg.kv_row_dim()});  // [T, 576]
  r.linear(c.x, c.w.kv_a_proj_with_mqa, c.kva);
  if (cfg.has_q_lora()) {
    Tensor qa = r.empty(act, {T, cfg.q_lora_rank});  // [T, q_lora_rank]
    r.linear(c.x, c.w.q_a_proj, qa);
    r.latent_norms(&qa, &c.w.q_a_layernorm, c.kva, cfg.kv_lora_rank, c.w.kv_a_layernorm, cfg.latent_norm_eps);
    r.linear(qa, c.w.q_b_proj, c.q);
  } else {
    r.linear(c.x, c.w.q_proj, c.q);
    r.latent_norms(nullptr, nullptr, c.kva, cfg.kv_lora_rank, c.w.kv_a_layernorm, cfg.latent_norm_eps);
  }
}

// MHA twins: RoPE on q (in place) and on the new rows, rows to the cache, in one kernel.
void prepare_mha(MethodContext& c) {
  project(c);
  const int64_t dn = c.cfg.qk_nope_head_dim;
  rocm_ops(c.ops).rope_concat_cache(c.q, dn, c.q, dn, c.kva, c.cfg.kv_lora_rank, c.plan.positions, c.rope, true, c.pool,
                                    c.layer, c.plan.new_slots);
}

// MLA twins: q_nope absorbed into c.q_mla[:, :, :L], then RoPE (or, for the fused-RoPE decode,
// only the moves) + the q_pe concat + the cache write in one kernel.
void prepare_mla(MethodContext& c, bool rotate) {
  project(c);
  RocmOps& r = rocm_ops(c.ops);
  const AttentionConfig& cfg = c.cfg;
  const int64_t T = c.plan.num_tokens, H = cfg.num_attention_heads;
  c.q_mla = r.empty(r.act_dtype(), {T, H, cfg.kv_row_dim()});  // [T, H, 576]
  r.absorb_q_packed(c.q, pack_of(c), cfg.qk_rope_head_dim, c.q_mla);
  r.rope_concat_cache(c.q, cfg.qk_nope_head_dim, c.q_mla, cfg.kv_lora_rank, c.kva, cfg.kv_lora_rank, c.plan.positions,
                      c.rope, rotate, c.pool, c.layer, c.plan.new_slots);
}
void prepare_mla_rocm(MethodContext& c) { prepare_mla(c, true); }
void prepare_mla_fused_rope(MethodContext& c) { prepare_mla(c, false); }

// Attention of c.q over latent rows: decompress, K built and cast to the cache dtype (fp8 ÷ the
// layer scale; otherwise the activation dtype) in one pass with V, attention over the cast K.
void attend(MethodContext& c, const Tensor& rows, const AttnSegments& seg, Tensor& o, Tensor& lse) {
  const AttentionConfig& cfg = c.cfg;
  RocmOps& r = rocm_ops(c.ops);
  const int64_t S = rows.dim(0), T = c.plan.num_tokens, H = cfg.num_attention_heads;
  const DType act = r.act_dtype(), cache = c.pool.config().dtype;
  const bool fp8 = is_fp8(cache);
  const DType kd = fp8 ? cache : act;
  const double k_scale = fp8 ? c.pool.scale(c.layer) : 1.0;
  Tensor latent = r.empty(act, {S, cfg.kv_lora_rank});  // [S, 512]
  r.take_cols(rows, 0, latent);
  Tensor kv = r.empty(act, {S, H * (cfg.qk_nope_head_dim + cfg.v_head_dim)});  // [S, H·256]
  r.linear(latent, c.w.kv_b_proj, kv);
  Tensor k = r.empty(kd, {S, H, cfg.qk_head_dim()});  // [S, H, 192]
  Tensor v = r.empty(act, {S, H, cfg.v_head_dim});    // [S, H, 128]
  r.build_kv_cast(kv, rows, cfg.kv_lora_rank, H, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim, k, v,
                  k_scale);
  o = r.empty(act, {T, H, cfg.v_head_dim});  // [T, H, 128]
  lse = r.empty(DType::F32, {T, H});         // [T, H]
  r.attention_cast_k(c.q, k, v, k_scale, seg, cfg.softmax_scale(), o, lse);
}

// MHA_ROCM: each request's prefix rows read from the cache, its new rows taken as computed, one
// causal attention over prefix + new.
void mha_rocm_core(MethodContext& c) {
  const BatchPlan& plan = c.plan;
  Ops& ops = c.ops;
  Tensor rows = ops.empty(ops.act_dtype(), {int64_t(plan.kv_slots.size()), c.cfg.kv_row_dim()});  // [Σ seq, 576]
  for (size_t i = 0; i < plan.batch.requests.size(); ++i) {
    const BatchRequest& req = plan.batch.requests[i];
    const int64_t k0 = plan.kv_start[i], q0 = plan.q_start[i];
    if (req.prefix_len > 0) {
      Tensor prefix = rows.rows(k0, k0 + req.prefix_len);
      const auto first = plan.kv_slots.begin() + k0;
      ops.cache_read(c.pool, c.layer, std::vector<int32_t>(first, first + req.prefix_len), prefix);
    }
    if (req.new_len > 0) {
      Tensor fresh = rows.rows(k0 + req.prefix_len, k0 + req.prefix_len + req.new_len);
      ops.copy(c.kva.rows(q0, q0 + req.new_len), fresh);
    }
  }
  attend(c, rows, plan.prefix_and_new(), c.o, c.lse);
}

void mha_one_shot_rocm_core(MethodContext& c) {
  attend(c, steps::read_rows(c, c.plan.kv_slots), c.plan.prefix_and_new(), c.o, c.lse);
}

void mha_chunked_kv_rocm_core(MethodContext& c) { steps::chunked_kv(c, attend); }

// The absorbed twins' core: `attend` fills o_lat [T, H, 512] and c.lse [T, H] from c.q_mla, then
// o = o_lat · w_vc through the packed weights.
template <typename Attend>
void absorbed_core(MethodContext& c, Attend&& attend) {
  const AttentionConfig& cfg = c.cfg;
  RocmOps& r = rocm_ops(c.ops);
  const int64_t T = c.plan.num_tokens, H = cfg.num_attention_heads;
  Tensor o_lat = r.empty(r.act_dtype(), {T, H, cfg.kv_lora_rank});  // [T, H, 512]
  c.lse = r.empty(DType::F32, {T, H});                               // [T, H]
  attend(r, o_lat);
  c.o = r.empty(r.act_dtype(), {T, H, cfg.v_head_dim});  // [T, H, 128]
  r.absorb_o_packed(o_lat, pack_of(c), c.o);
}

void mla_rocm_core(MethodContext& c) {
  absorbed_core(c, [&](RocmOps& r, Tensor& o_lat) {
    r.mla_attention(c.q_mla, c.pool, c.layer, c.plan.kv_slots, c.plan.prefix_and_new(), c.cfg.kv_lora_rank,
                    c.cfg.softmax_scale(), o_lat, c.lse);
  });
}

void mla_fused_rope_core(MethodContext& c) {
  absorbed_core(c, [&](RocmOps& r, Tensor& o_lat) {
    r.mla_decode_fused_rope(c.q_mla, c.kva, c.pool, c.layer, c.plan.kv_slots, c.plan.prefix_and_new(),
                            c.plan.positions, c.rope, c.cfg.kv_lora_rank, c.cfg.softmax_scale(), o_lat, c.lse);
  });
}

}  // namespace

void add_twins(std::vector<MethodImpl>& r) {
  const Platform p = Platform::ROCM;
  r.push_back({ForwardMethod::MHA_ROCM, p, prepare_mha, mha_rocm_core});
  r.push_back({ForwardMethod::MHA_ONE_SHOT_ROCM, p, prepare_mha, mha_one_shot_rocm_core});
  r.push_back({ForwardMethod::MHA_CHUNKED_KV_ROCM, p, prepare_mha, mha_chunked_kv_rocm_core});
  r.push_back({ForwardMethod::MLA_ROCM, p, prepare_mla_rocm, mla_rocm_core});
  r.push_back({ForwardMethod::MLA_FUSED_ROPE_ROCM, p, prepare_mla_fused_rope, mla_fused_rope_core});
}

}  // namespace mla::rocm
