// mla_decode_combine.cu — the split-KV combine of the MLA decode: each row's f32 partial outputs
// and natural-log LSEs of the splits (the workspace the decode kernels wrote) merged by LSE
// (gpu/softmax_state.cuh): o = Σ_s e^(lse_s − m) o_s / Σ_s e^(lse_s − m), lse = m + ln Σ.
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "platform/cuda/cuda_check.h"
#include "platform/cuda/mla_decode_launch.h"
#include "platform/cuda/sm90.cuh"
#include "platform/gpu/softmax_state.cuh"

namespace mla::cuda::mla_decode {
namespace {

// grid T·H rows, 128 threads (4 columns each).
__global__ void __launch_bounds__(128) mla_decode_combine(const float* __restrict__ ws_o,
                                                          const float* __restrict__ ws_lse, int splits,
                                                          int rows_total, void* o, int o_f32, float* lse) {
  __shared__ float w[kMaxSplits];
  __shared__ float s_lse;
  const int row = blockIdx.x, tid = threadIdx.x;
  sm90::pdl_wait();  // launched early (launch_combine): the decode kernel's partials are complete
  if (tid < 32) {
    gpu::SoftmaxState st;
    for (int s = tid; s < splits; s += 32) st.m = fmaxf(st.m, ws_lse[size_t(s) * rows_total + row]);
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) st.m = fmaxf(st.m, __shfl_xor_sync(0xffffffffu, st.m, d));
    float sum = 0.f;
    for (int s = tid; s < splits; s += 32) {
      const float e = st.weight(ws_lse[size_t(s) * rows_total + row]);
      w[s] = e;
      sum += e;
    }
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, d);
    st.l = sum;
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    for (int s = tid; s < splits; s += 32) w[s] *= inv;
    if (tid == 0) s_lse = st.lse();
  }
  __syncthreads();
  // Splits in groups of 8: the group's loads go out together (one dependent load per split is
  // latency-bound at a few warps per SM), then they are added in split order, as one by one.
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  auto add = [&](float wt, const float4& v) {
    if (wt > 0.f) {  // a split with no keys adds nothing (its partial is never read into the sum)
      acc.x += wt * v.x;
      acc.y += wt * v.y;
      acc.z += wt * v.z;
      acc.w += wt * v.w;
    }
  };
  const float* part = ws_o + size_t(row) * kDv + tid * 4;  // split s: + s · rows_total · kDv
  const size_t stride = size_t(rows_total) * kDv;
  int s = 0;
  for (; s + 8 <= splits; s += 8) {
    float4 v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) v[u] = __ldg(reinterpret_cast<const float4*>(part + (s + u) * stride));
#pragma unroll
    for (int u = 0; u < 8; ++u) add(w[s + u], v[u]);
  }
  for (; s < splits; ++s) add(w[s], __ldg(reinterpret_cast<const float4*>(part + s * stride)));
  if (o_f32) {
    *reinterpret_cast<float4*>(static_cast<float*>(o) + size_t(row) * kDv + tid * 4) = acc;
  } else {
    uint2 packed = make_uint2(sm90::pack_bf16(acc.x, acc.y), sm90::pack_bf16(acc.z, acc.w));
    *reinterpret_cast<uint2*>(static_cast<__nv_bfloat16*>(o) + size_t(row) * kDv + tid * 4) = packed;
  }
  if (tid == 0 && lse) lse[row] = s_lse;
}

}  // namespace

void launch_combine(const KParams& kp, cudaStream_t stream, bool early) {
  // early: programmatic dependent launch; the CTAs start while the decode kernel runs and wait
  // (pdl_wait) for its end, so the launch latency hides under its tail.
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(kp.rows_total));
  cfg.blockDim = dim3(128);
  cfg.stream = stream;
  cfg.attrs = early ? &attr : nullptr;
  cfg.numAttrs = early ? 1 : 0;
  MLA_CUDA_CHECK(cudaLaunchKernelEx(&cfg, mla_decode_combine, static_cast<const float*>(kp.ws_o),
                                    static_cast<const float*>(kp.ws_lse), kp.splits, kp.rows_total, kp.o,
                                    kp.o_f32, kp.lse));
}

}  // namespace mla::cuda::mla_decode
