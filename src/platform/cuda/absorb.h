// absorb.h — the MLA method's per-head GEMMs on the CUDA platform for bf16 (absorb.cu): q's nope
// columns times each head's w_kc with q's rope columns copied beside them, and the latent output
// times each head's w_vc, for decode batches. Each output sums its products in an order that does
// not depend on T.
#pragma once
#include <cstdint>

#include "platform/gpu/gpu_runtime.h"

namespace mla::cuda {

// The batches the kernels take: up to 32 tokens. Past that cuBLAS's batched GEMMs are faster (on the
// H200, V2-Lite decode b128 took 0.21 ms a step longer with these kernels, b256 0.41 ms; b32 the
// same; b1 0.075 ms shorter, b8 0.05).
inline constexpr int64_t kAbsorbFastTokens = 32;

// Shapes absorb_q_fast takes: T ≤ kAbsorbFastTokens, dn = 128, L a multiple of 64, dr a multiple of
// 8, 16-byte aligned.
bool absorb_q_fast_supports(int64_t T, int64_t dn, int64_t dr, int64_t L, const void* q, const void* w_kc,
                            const void* q_mla);

// A RoPE for absorb_q_fast to rotate q's rope columns with as it copies them (dr / 2 pairs): the
// tokens' positions and the frequencies on the device, as the rope kernel takes them.
struct AbsorbRope {
  const int32_t* positions = nullptr;  // [T]
  const double* inv_freq = nullptr;    // [dr / 2]
  double attention_factor = 1.0;
  bool interleave = true;
};

// q_mla[t, h, :L] = q[t, h, :dn] · w_kc[h] (f32 sums over dn in index-block order, rounded to bf16),
// q_mla[t, h, L:L+dr] = q[t, h, dn:dn+dr], rotated by `rope` when given (the bits of the rope kernel
// on q, then the copy). q [T, H, dn + dr], w_kc [H, dn, L], q_mla [T, H, L + dr], all bf16. A row's
// bits do not depend on T.
void absorb_q_fast(const void* q, const void* w_kc, int64_t T, int64_t H, int64_t dn, int64_t dr, int64_t L,
                   void* q_mla, const AbsorbRope* rope, cudaStream_t s);

// Shapes absorb_o_fast takes: T ≤ kAbsorbFastTokens, dv = 128, L = 512, 16-byte aligned.
bool absorb_o_fast_supports(int64_t T, int64_t dv, int64_t L, const void* o_lat, const void* w_vc, const void* o);

// o[t, h, :] = o_lat[t, h, :] · w_vc[h]ᵀ (f32 sums, rounded to bf16). o_lat [T, H, 512], w_vc [H, 128, 512],
// o [T, H, 128], all bf16.
void absorb_o_fast(const void* o_lat, const void* w_vc, int64_t T, int64_t H, void* o, cudaStream_t s);

}  // namespace mla::cuda
