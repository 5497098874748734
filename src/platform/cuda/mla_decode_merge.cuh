// mla_decode_merge.cuh — one row's split-KV partials merged by LSE (gpu/softmax_state.cuh): the f32
// partial outputs o_s [splits][rows_total][512] and natural-log LSEs [splits][rows_total] that the
// decode kernels write to the workspace. One definition for the two places that merge them, the
// combine kernel (mla_decode_combine.cu) and the see-saw kernel's in-grid merge
// (mla_decode_seesaw.cu): the same operations in the same order, so both give the same bits.
//   o = Σ_s w_s o_s (split order),  w_s = e^(lse_s − m) / Σ_t e^(lse_t − m),  lse = m + ln Σ.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "platform/cuda/mla_decode_launch.h"
#include "platform/cuda/sm90.cuh"
#include "platform/gpu/softmax_state.cuh"

namespace mla::cuda::mla_decode {

// A workspace load: through the read-only path when the partials come from an earlier grid
// (kInGrid false), from the L2 when other CTAs of the same grid wrote them.
template <bool kInGrid, class T>
__device__ __forceinline__ T ws_load(const T* p) {
  if constexpr (kInGrid) return __ldcg(p);
  else return __ldg(p);
}

// One warp (lane 0..31): the row's split weights into w[0, splits) (shared memory) and its LSE,
// returned on every lane.
template <bool kInGrid>
__device__ __forceinline__ float split_weights(const float* __restrict__ ws_lse, int splits, int rows_total,
                                               int row, float* w, int lane) {
  gpu::SoftmaxState st;
  for (int s = lane; s < splits; s += 32) st.m = fmaxf(st.m, ws_load<kInGrid>(ws_lse + size_t(s) * rows_total + row));
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) st.m = fmaxf(st.m, __shfl_xor_sync(0xffffffffu, st.m, d));
  float sum = 0.f;
  for (int s = lane; s < splits; s += 32) {
    const float e = st.weight(ws_load<kInGrid>(ws_lse + size_t(s) * rows_total + row));
    w[s] = e;
    sum += e;
  }
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, d);
  st.l = sum;
  const float inv = sum > 0.f ? 1.f / sum : 0.f;
  for (int s = lane; s < splits; s += 32) w[s] *= inv;
  return st.lse();
}

// Columns [col, col + kVec) of the row: Σ_s w[s]·o_s in split order (a split of weight 0, no keys,
// is loaded but never added), written to o [rows_total, 512] (bf16 or f32). The splits' loads go out in groups
// of 32 / kVec (one dependent load per split is latency-bound at a few warps per SM), then they are
// added in split order, as one by one.
template <int kVec, bool kInGrid>
__device__ __forceinline__ void merge_columns(const float* __restrict__ ws_o, const float* w, int splits,
                                              int rows_total, int row, int col, void* o, int o_f32) {
  static_assert(kVec == 2 || kVec == 4, "a thread takes 2 or 4 columns");
  using Vec = std::conditional_t<kVec == 4, float4, float2>;
  constexpr int kGroup = 32 / kVec;
  float acc[kVec] = {};
  auto add = [&](float wt, const Vec& v) {
    if (wt > 0.f) {
      const float* e = reinterpret_cast<const float*>(&v);
#pragma unroll
      for (int i = 0; i < kVec; ++i) acc[i] += wt * e[i];
    }
  };
  const float* part = ws_o + size_t(row) * kDv + col;  // split s: + s · rows_total · kDv
  const size_t stride = size_t(rows_total) * kDv;
  int s = 0;
  for (; s + kGroup <= splits; s += kGroup) {
    Vec v[kGroup];
#pragma unroll
    for (int u = 0; u < kGroup; ++u) v[u] = ws_load<kInGrid>(reinterpret_cast<const Vec*>(part + (s + u) * stride));
#pragma unroll
    for (int u = 0; u < kGroup; ++u) add(w[s + u], v[u]);
  }
  for (; s < splits; ++s) add(w[s], ws_load<kInGrid>(reinterpret_cast<const Vec*>(part + s * stride)));
  if (o_f32) {
    float* dst = static_cast<float*>(o) + size_t(row) * kDv + col;
#pragma unroll
    for (int i = 0; i < kVec; ++i) dst[i] = acc[i];
  } else {
    __nv_bfloat16* dst = static_cast<__nv_bfloat16*>(o) + size_t(row) * kDv + col;
#pragma unroll
    for (int i = 0; i < kVec; i += 2) *reinterpret_cast<uint32_t*>(dst + i) = sm90::pack_bf16(acc[i], acc[i + 1]);
  }
}

}  // namespace mla::cuda::mla_decode
