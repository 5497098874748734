// RMSNorm of one row on the device, shared by the GPU kernels that normalize: the block (any
// multiple of 32 threads up to 1024) reduces Σx² over columns [0, n) of the row at element offset
// `row`, then writes x · rsqrt(mean + eps) · w in place.
#pragma once
#include <cstdint>

#include "platform/gpu/elem.cuh"

namespace mla::gpu {

__device__ __forceinline__ void rmsnorm_row(void* x, Elem e, size_t row, int64_t n, const void* w, Elem we,
                                            float eps) {
  float ss = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = load_elem(x, e, row + i);
    ss += v * v;
  }
  __shared__ float part[32];
  for (int o = 16; o > 0; o >>= 1) ss += shfl_xor(ss, o);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    ss = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.f;
    for (int o = 16; o > 0; o >>= 1) ss += shfl_xor(ss, o);
    if (threadIdx.x == 0) part[0] = ss;
  }
  __syncthreads();
  const float inv = rsqrtf(part[0] / float(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    store_elem(x, e, row + i, load_elem(x, e, row + i) * inv * load_elem(w, we, i));
}

}  // namespace mla::gpu
