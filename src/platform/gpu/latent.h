// The fused end of the latent path (latent.cu): kv_a RMSNorm + RoPE of q and k_pe + cache write.
#pragma once
#include <cstdint>

#include "platform/gpu/attention_kernels.h"

namespace mla::gpu {

struct LatentFinishParams {
  void* q;                      // [T, heads, q_head_dim]: RoPE on columns [q_rot, q_rot + 2·half)
  Elem q_elem;
  int64_t heads, q_head_dim, q_rot;
  void* kva;                    // [T, row_dim]: RMSNorm over [0, lora), RoPE on [lora, lora + 2·half)
  Elem kva_elem;
  int64_t row_dim, lora;
  const void* norm_w;           // [lora]
  Elem norm_elem;
  float eps;
  bool norm_vec;                // norm_rows_vectorized(kva, …): the norm's bits as gpu::rmsnorm gives them
  const int32_t* positions;     // [T]
  const double* inv_freq;       // [half]
  int64_t half;
  double af;                    // attention_factor
  bool interleave;
  void* pool;                   // the layer's rows [slots, row_dim]
  Elem pool_elem;
  const int32_t* slots;         // [T]
  float inv_scale;              // 1 / the layer's scale
  int64_t T;
  int copy16 = 0;               // set by latent_finish: 16-byte chunks of a row when the write is a copy
  bool row_short = false;       // set by latent_finish: a bf16 row of ≤ 512 + 64 columns, bf16 norm weights
  bool q_pair32 = false;        // set by latent_finish: each q pair is two adjacent bf16 at a 4-byte boundary
};

// Whether the kernels hold a token's cos/sin in shared memory (half ≤ 128).
bool latent_finish_fits(int64_t half);
// The same bits as rmsnorm(kva, lora), rope(q), rope(kva, 1 head), cache_write(kva).
void latent_finish(const LatentFinishParams& p, cudaStream_t s);

}  // namespace mla::gpu
