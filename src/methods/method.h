// The state a forward method works on, and the steps the methods share. Platform-neutral: every
// step goes through Ops.
#pragma once
#include "mla/attention.h"
#include "mla/ops.h"
#include "mla/registry.h"

namespace mla {

struct MethodContext {
  const AttentionConfig& cfg;
  const DeviceAttentionWeights& w;
  const RopeFrequencies& rope;
  const DispatchSettings& settings;
  Ops& ops;
  KVPool& pool;
  int64_t layer;
  const BatchPlan& plan;
  const Tensor& x;  // [T, hidden_size]
  // Filled by prepare:
  Tensor q;    // [T, H, qk_head_dim] = [q_nope | RoPE(q_pe)] per head (prepare_absorbed: q_pe maybe unrotated)
  Tensor kva;  // [T, kv_row_dim] = [RMSNorm(c_kv) | RoPE(k_pe)], the new latent rows
  Tensor q_mla;  // [T, H, kv_row_dim] = [q_nope · w_kc | q_pe]: the absorbed query, when prepare makes it
  // Filled by core:
  Tensor o;    // [T, H, v_head_dim]
  Tensor lse;  // [T, H]
};

namespace steps {
// The standard prepare: q and kva from x, written to the cache at the new tokens' slots.
void prepare_latent(MethodContext& c);
// The absorbed methods' prepare: kva as prepare_latent makes and caches it, and c.q_mla =
// [q_nope · w_kc | RoPE(q_pe)] (Ops::absorb_q_rope) instead of a rotated c.q.
void prepare_absorbed(MethodContext& c);
// Latent rows[S, kv_row_dim] → k[S, H, qk_head_dim], v[S, H, v_head_dim] through kv_b_proj.
void decompress(MethodContext& c, const Tensor& rows, Tensor& k, Tensor& v);
// Ragged MHA attention of c.q over decompressed rows → (o, lse) allocated here.
void mha_attend(MethodContext& c, const Tensor& rows, const AttnSegments& seg, Tensor& o, Tensor& lse);
// Rows of the given slots read from the cache → [S, kv_row_dim] in the activation dtype.
Tensor read_rows(MethodContext& c, const std::vector<int32_t>& slots);

// How an MHA method attends c.q to latent rows (decompress, build K/V, attention) → (o, lse).
using AttendFn = void (*)(MethodContext& c, const Tensor& rows, const AttnSegments& seg, Tensor& o, Tensor& lse);
// The chunked-prefix schedule: attention over the new tokens, then the prefix in chunks of
// chunk_capacity / num_requests tokens per request, merged by LSE. Every attention goes through `attend`.
void chunked_kv(MethodContext& c, AttendFn attend);
}  // namespace steps

// The shared methods (each in its own file).
namespace methods {
void mha_core(MethodContext& c);
void mha_one_shot_core(MethodContext& c);
void mha_chunked_kv_core(MethodContext& c);
void mla_core(MethodContext& c);
}  // namespace methods

}  // namespace mla
