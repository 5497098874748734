// latent.cu — the end of the latent path for the new tokens in one kernel (the shared steps'
// prepare_latent): the kv_a RMSNorm of each latent row, RoPE on q's rope columns of every head and
// on the row's k_pe, and the row written to the pool. A block per token; each piece is the device
// code of the kernel it replaces (rmsnorm, rope, cache_write), so the bits are theirs.
#include "platform/gpu/gpu_check.h"
#include "platform/gpu/launch.cuh"
#include "platform/gpu/latent.h"
#include "platform/gpu/norm.cuh"
#include "platform/gpu/rope.cuh"

namespace mla::gpu {
namespace {

__global__ void __launch_bounds__(kNormThreads) latent_finish_k(LatentFinishParams p) {
  pdl_enter();
  __shared__ float cs[2][kNormThreads];  // this token's cos / sin of each rotated pair
  const int64_t t = blockIdx.x, half = p.half;
  const size_t row = size_t(t) * size_t(p.row_dim);
  if (threadIdx.x < half) rope_cos_sin(p.positions[t], p.inv_freq[threadIdx.x], p.af, cs[0][threadIdx.x], cs[1][threadIdx.x]);
  // The latent columns [0, lora) of the row (block_sum's barriers publish cs too).
  rmsnorm_row_as_launched(p.kva, p.kva_elem, row, p.lora, p.norm_w, p.norm_elem, p.eps, p.norm_vec);
  __syncthreads();
  // Pairs of q's heads, then of the row's k_pe (head `heads`): columns the norm does not touch. The
  // indices in 32 bits (heads ≤ 128, half ≤ the block): 64-bit divisions were most of this loop.
  const int nh = int(half), pairs = (int(p.heads) + 1) * nh;
  for (int idx = threadIdx.x; idx < pairs; idx += blockDim.x) {
    const int h = idx / nh, i = idx - h * nh;
    void* x = h < p.heads ? p.q : p.kva;
    const Elem e = h < p.heads ? p.q_elem : p.kva_elem;
    const size_t base = h < p.heads ? size_t((t * p.heads + h) * p.q_head_dim + p.q_rot) : row + size_t(p.lora);
    const size_t i0 = base + rope_first(i, half, p.interleave), i1 = base + rope_second(i, half, p.interleave);
    const float c = cs[0][i], s = cs[1][i];
    const float x0 = load_elem(x, e, i0), x1 = load_elem(x, e, i1);
    store_elem(x, e, i0, x0 * c - x1 * s);
    store_elem(x, e, i1, x0 * s + x1 * c);
  }
  __syncthreads();
  const size_t dst = size_t(p.slots[t]) * size_t(p.row_dim);
  if (p.copy16) {  // the pool holds the row's own elements unscaled: 16-byte copies
    const uint4* src = reinterpret_cast<const uint4*>(static_cast<const char*>(p.kva) + row * elem_size(p.kva_elem));
    uint4* out = reinterpret_cast<uint4*>(static_cast<char*>(p.pool) + dst * elem_size(p.pool_elem));
    for (int c = threadIdx.x; c < p.copy16; c += blockDim.x) out[c] = src[c];
    return;
  }
  for (int64_t c = threadIdx.x; c < p.row_dim; c += blockDim.x)
    store_elem(p.pool, p.pool_elem, dst + c, load_elem(p.kva, p.kva_elem, row + c) * p.inv_scale);
}

}  // namespace

bool latent_finish_fits(int64_t half) { return half >= 0 && half <= kNormThreads; }

void latent_finish(const LatentFinishParams& params, cudaStream_t s) {
  if (params.T == 0) return;
  LatentFinishParams p = params;
  const size_t bytes = size_t(p.row_dim) * elem_size(p.kva_elem);
  p.copy16 = p.kva_elem == p.pool_elem && p.inv_scale == 1.f && bytes % 16 == 0 && aligned16(p.kva) && aligned16(p.pool)
                 ? int(bytes / 16)
                 : 0;
  launch(latent_finish_k, unsigned(p.T), kNormThreads, 0, s, p);
}

}  // namespace mla::gpu
