// moe.h — launchers of the shared MoE kernels (moe.cu, CUDA and HIP): the router, the plan that
// groups the (token, k) slots by expert into row tiles, the portable grouped GEMMs and the
// combine. Every size that depends on the routing stays on the device: grids are sized from
// host-known bounds (T·K slots, E experts) and blocks past the device-side tile count exit.
#pragma once
#include <cstdint>

#include "platform/gpu/attention_kernels.h"
#include "platform/gpu/moe_job.h"

namespace mla::gpu {

enum class MoeTopk : int { Greedy = 0, GroupLimitedGreedy = 1, NoauxTc = 2 };

// The router of mla/moe.h, one block per token, in double as the host computes it.
struct MoeRouteParams {
  const float* logits = nullptr;  // [T, E]
  const float* bias = nullptr;    // [E] or null
  int T = 0, E = 0, K = 0, n_group = 1, topk_group = 1;
  bool sigmoid = false, norm_topk_prob = false;
  MoeTopk method = MoeTopk::Greedy;
  double routed_scaling_factor = 1.0;
  int32_t* expert = nullptr;  // [T, K]
  float* weight = nullptr;    // [T, K]
};
constexpr int kMoeMaxExperts = 1024;  // shared-memory bound of the router and the plan
void moe_route(const MoeRouteParams& p, cudaStream_t s);
// The router's logits (p.logits, written: [T, E] = x[T, hidden] · w[E, hidden]ᵀ, f32 sums in a
// fixed order per row; w f32 or bf16, which widens exactly, so either holding the same values gives
// the same bits) and moe_route's choice from them, in one launch. done[T]: zero counters, zero again
// when the launch ends. For decode-sized T (kMoeRouterTokens at most).
constexpr int64_t kMoeRouterTokens = 64;
void moe_router(const void* x, Elem xe, const void* w, Elem we, int64_t hidden, const MoeRouteParams& p,
                unsigned* done, cudaStream_t s);
// The router's logits alone ([T, E] = x · wᵀ), each with moe_router's bits, for batches past
// kMoeRouterTokens: x and w bf16 or f32 rows of hidden % 4 == 0 values, aligned to 4 of them
// (moe_logits_fits). GpuOps uses it up to kMoeLogitsTokens (decode batches); past that the weights,
// streamed once per 8 tokens, cost more than the GEMM, and the GEMM makes the logits.
constexpr int64_t kMoeLogitsTokens = 256;
bool moe_logits_fits(const void* x, Elem xe, const void* w, Elem we, int64_t hidden);
void moe_logits(const void* x, Elem xe, const void* w, Elem we, int64_t hidden, int64_t T, int64_t E, float* logits,
                cudaStream_t s);

// The slots (t·K + k) grouped by expert: rows[offsets[e] .. offsets[e+1]) are expert e's slots
// (their order within an expert is unspecified: no result depends on it), pos[slot] is the slot's
// row in that order (−1 for an expert id outside [0, E): its output counts as zero). tiles[2j],
// tiles[2j+1]: the expert and first row of row tile j (at most bm rows, one expert), j < *num_tiles.
struct MoePlan {
  int32_t* offsets = nullptr;    // [E + 1]
  int32_t* rows = nullptr;       // [T·K]
  int32_t* pos = nullptr;        // [T·K]
  int32_t* tiles = nullptr;      // [2 · max_tiles]
  int32_t* num_tiles = nullptr;  // [1]
  int32_t* jobs = nullptr;       // [4]: the prefill GEMMs' job and done counters, gate/up then down (0 between launches)
  int32_t* counts = nullptr;     // [moe_align_blocks(T·K), E]: slots per block and expert (many-block plans)
};
// The most row tiles of bm rows that n slots over E experts can need.
inline int64_t moe_max_tiles(int64_t n, int64_t E, int64_t bm) {
  const int64_t a = (n + bm - 1) / bm + E;
  return n < a ? n : a;
}
// Slots a block of the plan takes: a plan of more slots (prefill) is built by that many blocks, in
// two launches (count, then place); a smaller one by one block in one launch.
constexpr int64_t kMoeAlignChunk = 2048;
inline int64_t moe_align_blocks(int64_t n) { return n > kMoeAlignChunk ? (n + kMoeAlignChunk - 1) / kMoeAlignChunk : 1; }
// Int32 words of device memory a plan for n slots, E experts, tiles of bm rows needs.
inline int64_t moe_plan_words(int64_t n, int64_t E, int64_t bm) {
  const int64_t blocks = moe_align_blocks(n);
  return (E + 1) + 2 * n + 2 * moe_max_tiles(n, E, bm) + 1 + 4 + (blocks > 1 ? blocks * E : 0);
}
MoePlan moe_plan_at(int32_t* words, int64_t n, int64_t E, int64_t bm);
void moe_align(const int32_t* expert, int64_t n, int E, int bm, const MoePlan& plan, cudaStream_t s);

// The portable grouped GEMMs (plain CUDA / HIP, any element type; tiles of kMoeGenericRows rows),
// f32 accumulation over the reduction dimension in index order, products rounded to `he` / `ye`.
//   h[row, :I] = silu(gate_e · x_t) ⊙ (up_e · x_t)   for each row of the plan: slot → token t = slot / K
//   y[row, :hidden] = down_e · h[row, :]
constexpr int kMoeGenericRows = 16;
void moe_gate_up_generic(const void* x, Elem xe, int topk, const MoePlan& plan, int64_t max_tiles,
                         const void* gate, const void* up, Elem we, int64_t I, int64_t hidden, void* h,
                         Elem he, cudaStream_t s);
void moe_down_generic(const void* h, Elem he, const MoePlan& plan, int64_t max_tiles, const void* down,
                      Elem we, int64_t I, int64_t hidden, void* y, Elem ye, cudaStream_t s);
// out[t, :] = Σ_{k<K} weight[t, k] · y[pos[t·K + k], :], summed in k order in f32; with `add` [T, hidden]
// (of type ae; null: none), that sum rounded to out's type plus add[t, :] (the bits of the add kernel
// after the plain sum).
void moe_combine(const void* y, Elem ye, const int32_t* pos, const float* weight, int64_t T, int64_t K,
                 int64_t hidden, void* out, Elem oe, const void* add, Elem ae, cudaStream_t s);

}  // namespace mla::gpu
