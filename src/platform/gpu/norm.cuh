// RMSNorm of one row on the device, shared by the GPU kernels that normalize: the block (any
// multiple of 32 threads up to 1024) reduces Σx² over columns [0, n) of the row at element offset
// `row`, then writes x · rsqrt(mean + eps) · w in place.
#pragma once
#include <cstdint>

#include "platform/gpu/elem.cuh"

namespace mla::gpu {

// The block size of every row-norm launch: block_sum's order depends on it, so kernels that fuse a
// norm launch with it too to keep the norm's bits.
constexpr int kNormThreads = 256;

// Σ of `ss` over the block (lane groups of 32, then shared memory), in a fixed order.
__device__ __forceinline__ float block_sum(float ss) {
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
  return part[0];
}

// block_sum's value for a block of kNormThreads threads, computed by one group of 32 lanes that
// stands in for all of them: for each warp w in turn, block_sum_lane_part(ss, w, total) with ss as
// lane l's share as thread 32·w + l, then block_sum_lane_total(total). The same trees in the same
// order (a warp left out adds zeros, which cannot change a sum of squares).
__device__ __forceinline__ void block_sum_lane_part(float ss, int w, float& total) {
  for (int o = 16; o > 0; o >>= 1) ss += shfl_xor(ss, o);
  if ((threadIdx.x & 31) == w) total = ss;
}
__device__ __forceinline__ float block_sum_lane_total(float total) {
  for (int o = 16; o > 0; o >>= 1) total += shfl_xor(total, o);
  return total;
}

__device__ __forceinline__ void rmsnorm_row(void* x, Elem e, size_t row, int64_t n, const void* w, Elem we,
                                            float eps) {
  float ss = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = load_elem(x, e, row + i);
    ss += v * v;
  }
  const float inv = rsqrtf(block_sum(ss) / float(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    store_elem(x, e, row + i, load_elem(x, e, row + i) * inv * load_elem(w, we, i));
}

// ---- bf16 rows, 8 values (16 bytes) a load --------------------------------------------------
// Chunks of 8 a thread keeps in registers: rows of n ≤ kNormChunks · 8 · blockDim values.
constexpr int kNormChunks = 4;

// Chunk k of a row (values v) times inv and its weights: the output of every bf16 norm, with the
// weights read from w (each as it is used: the decode norms' code as measured) or given (wv, read
// ahead by a caller), the same product either way.
__device__ __forceinline__ uint4 normed_bf16x8(const float (&v)[8], float inv, const void* w, Elem we, int64_t k) {
  float o[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) o[j] = v[j] * inv * load_elem(w, we, size_t(k * 8 + j));
  return pack_bf16x8(o);
}
__device__ __forceinline__ uint4 normed_bf16x8(const float (&v)[8], float inv, const float (&wv)[8]) {
  float o[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) o[j] = v[j] * inv * wv[j];
  return pack_bf16x8(o);
}

// RMSNorm of a bf16 row held as chunks v[c] (chunk tid + c·blockDim of the row, c < chunks): the
// row's Σx² in chunk order per thread, then block_sum; x = v · inv · w written back.
__device__ __forceinline__ void rmsnorm_chunks_bf16(uint4* x, float (&v)[kNormChunks][8], int64_t chunks, int64_t n,
                                                    const void* w, Elem we, float eps) {
  float ss = 0;
#pragma unroll
  for (int c = 0; c < kNormChunks; ++c)
    if (threadIdx.x + c * int64_t(blockDim.x) < chunks)
#pragma unroll
      for (int j = 0; j < 8; ++j) ss += v[c][j] * v[c][j];
  const float inv = rsqrtf(block_sum(ss) / float(n) + eps);
#pragma unroll
  for (int c = 0; c < kNormChunks; ++c) {
    const int64_t k = threadIdx.x + c * int64_t(blockDim.x);
    if (k >= chunks) continue;
    x[k] = normed_bf16x8(v[c], inv, w, we, k);
  }
}

// A row's RMSNorm as gpu::rmsnorm and gpu::add_rmsnorm run it (`vec`: norm_rows_vectorized said
// yes for the tensor): kernels that fuse a norm call this to keep those bits.
__device__ __forceinline__ void rmsnorm_row_as_launched(void* x, Elem e, size_t row, int64_t n, const void* w, Elem we,
                                                        float eps, bool vec) {
  if (!vec) return rmsnorm_row(x, e, row, n, w, we, eps);
  uint4* r = reinterpret_cast<uint4*>(static_cast<uint16_t*>(x) + row);
  float v[kNormChunks][8];
#pragma unroll
  for (int c = 0; c < kNormChunks; ++c) {
    const int64_t k = threadIdx.x + c * int64_t(blockDim.x);
    if (k < n / 8) unpack_bf16x8(r[k], v[c]);
  }
  rmsnorm_chunks_bf16(r, v, n / 8, n, w, we, eps);
}

}  // namespace mla::gpu
