// RoPE, the [q_abs | q_pe] concat and the latent cache write in one kernel (the ROCm twins'
// prepare). A block per new token: q_pe of every head rotated from q_src into q_dst, the token's
// k_pe rotated in its latent row, and the row written to the pool — as two parts straight into the
// row (gfx950 style) or assembled in shared memory and written once (gfx942 style).
#include "platform/gpu/elem.cuh"
#include "platform/gpu/gpu_check.h"
#include "platform/gpu/rope.cuh"
#include "platform/rocm/kernels.h"

namespace mla::rocm {
namespace {

using gpu::load_elem;
using gpu::store_elem;

constexpr int kThreads = 128;

__global__ void __launch_bounds__(kThreads) rope_concat_cache_k(RopeCacheParams p) {
  extern __shared__ float row[];  // [D]: the finished latent row (both styles stage k_pe here)
  const int64_t t = blockIdx.x, half = p.half;
  const int32_t pos = p.positions[t];
  // q_pe of every head.
  for (int64_t idx = threadIdx.x; idx < p.heads * half; idx += kThreads) {
    const int64_t h = idx / half, i = idx % half;
    const size_t src = size_t((t * p.heads + h) * p.q_src_hd + p.q_src_pe);
    const size_t dst = size_t((t * p.heads + h) * p.q_dst_hd + p.q_dst_pe);
    const int64_t a = gpu::rope_first(i, half, p.interleave), b = gpu::rope_second(i, half, p.interleave);
    const float x0 = load_elem(p.q_src, p.q_elem, src + a), x1 = load_elem(p.q_src, p.q_elem, src + b);
    if (p.rotate) {
      float c, s;
      gpu::rope_cos_sin(pos, p.inv_freq[i], p.attention_factor, c, s);
      store_elem(p.q_dst, p.q_elem, dst + a, x0 * c - x1 * s);
      store_elem(p.q_dst, p.q_elem, dst + b, x0 * s + x1 * c);
    } else {
      store_elem(p.q_dst, p.q_elem, dst + a, x0);
      store_elem(p.q_dst, p.q_elem, dst + b, x1);
    }
  }
  // k_pe: rotated into the activation row (rounded as it stores) and staged for the cache.
  const size_t kr = size_t(t * p.D);
  for (int64_t i = threadIdx.x; i < half; i += kThreads) {
    const int64_t a = p.L + gpu::rope_first(i, half, p.interleave), b = p.L + gpu::rope_second(i, half, p.interleave);
    float x0 = load_elem(p.kva, p.kva_elem, kr + a), x1 = load_elem(p.kva, p.kva_elem, kr + b);
    if (p.rotate) {
      float c, s;
      gpu::rope_cos_sin(pos, p.inv_freq[i], p.attention_factor, c, s);
      const float y0 = x0 * c - x1 * s, y1 = x0 * s + x1 * c;
      store_elem(p.kva, p.kva_elem, kr + a, y0);
      store_elem(p.kva, p.kva_elem, kr + b, y1);
      x0 = gpu::round_as(y0, p.kva_elem), x1 = gpu::round_as(y1, p.kva_elem);
    }
    row[a] = x0, row[b] = x1;
  }
  const size_t pr = size_t(p.slots[t]) * size_t(p.D);
  const float inv = 1.f / p.pool_scale;
  if (p.style == CacheWrite::TWO_PART) {
    // Part one, the latent: straight from the activation row into the cache row.
    for (int64_t c = threadIdx.x; c < p.L; c += kThreads)
      store_elem(p.pool, p.pool_elem, pr + c, load_elem(p.kva, p.kva_elem, kr + c) * inv);
    __syncthreads();
    // Part two, the rotated k_pe.
    for (int64_t c = p.L + threadIdx.x; c < p.D; c += kThreads) store_elem(p.pool, p.pool_elem, pr + c, row[c] * inv);
  } else {
    for (int64_t c = threadIdx.x; c < p.L; c += kThreads) row[c] = load_elem(p.kva, p.kva_elem, kr + c);
    __syncthreads();
    for (int64_t c = threadIdx.x; c < p.D; c += kThreads) store_elem(p.pool, p.pool_elem, pr + c, row[c] * inv);
  }
}

}  // namespace

void rope_concat_cache(const RopeCacheParams& p) {
  if (p.T == 0) return;
  rope_concat_cache_k<<<unsigned(p.T), kThreads, sizeof(float) * size_t(p.D), p.stream>>>(p);
  MLA_GPU_LAUNCH_CHECK();
}

}  // namespace mla::rocm
