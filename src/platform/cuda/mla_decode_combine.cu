// mla_decode_combine.cu — the split-KV combine of the MLA decode: each row's f32 partial outputs
// and natural-log LSEs of the splits (the workspace the decode kernels wrote) merged by LSE
// (gpu/softmax_state.cuh): o = Σ_s e^(lse_s − m) o_s / Σ_s e^(lse_s − m), lse = m + ln Σ.
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "platform/cuda/cuda_check.h"
#include "platform/cuda/mla_decode_launch.h"
#include "platform/cuda/sm90_host.h"
#include "platform/cuda/sm90.cuh"
#include "platform/gpu/softmax_state.cuh"

namespace mla::cuda::mla_decode {
namespace {

// grid (T·H rows, 4 / kVec column slices), 128 threads: kVec columns each. Each column adds the
// splits in split order whatever the slicing, so both slicings give the same bits.
template <int kVec>
__global__ void __launch_bounds__(128) mla_decode_combine(const float* __restrict__ ws_o,
                                                          const float* __restrict__ ws_lse, int splits,
                                                          int rows_total, void* o, int o_f32, float* lse) {
  static_assert(kVec == 2 || kVec == 4, "a thread takes 2 or 4 columns");
  using Vec = std::conditional_t<kVec == 4, float4, float2>;
  __shared__ float w[kMaxSplits];
  __shared__ float s_lse;
  const int row = blockIdx.x, tid = threadIdx.x;
  const int col = (blockIdx.y * 128 + tid) * kVec;
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
  // Splits in groups of kGroup: the group's loads go out together (one dependent load per split is
  // latency-bound at a few warps per SM), then they are added in split order, as one by one.
  constexpr int kGroup = 32 / kVec;
  float acc[kVec] = {};
  auto add = [&](float wt, const Vec& v) {
    if (wt > 0.f) {  // a split with no keys adds nothing (its partial is never read into the sum)
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
    for (int u = 0; u < kGroup; ++u) v[u] = __ldg(reinterpret_cast<const Vec*>(part + (s + u) * stride));
#pragma unroll
    for (int u = 0; u < kGroup; ++u) add(w[s + u], v[u]);
  }
  for (; s < splits; ++s) add(w[s], __ldg(reinterpret_cast<const Vec*>(part + s * stride)));
  if (o_f32) {
    float* dst = static_cast<float*>(o) + size_t(row) * kDv + col;
#pragma unroll
    for (int i = 0; i < kVec; ++i) dst[i] = acc[i];
  } else {
    __nv_bfloat16* dst = static_cast<__nv_bfloat16*>(o) + size_t(row) * kDv + col;
#pragma unroll
    for (int i = 0; i < kVec; i += 2) *reinterpret_cast<uint32_t*>(dst + i) = sm90::pack_bf16(acc[i], acc[i + 1]);
  }
  if (blockIdx.y == 0 && tid == 0 && lse) lse[row] = s_lse;
}

}  // namespace

void launch_combine(const KParams& kp, cudaStream_t stream, bool early) {
  // early: programmatic dependent launch; the CTAs start while the decode kernel runs and wait
  // (pdl_wait) for its end, so the launch latency hides under its tail.
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  // Few rows (one request): the columns in two slices, so twice the CTAs share the loads (h128 b1
  // s_k 16384, 64 splits: 32.5-35.1 -> 31.4-31.9 us; four slices of one column a thread gained no more).
  const int slices = kp.rows_total < 2 * device_sms() ? 2 : 1;
  cfg.gridDim = dim3(unsigned(kp.rows_total), unsigned(slices));
  cfg.blockDim = dim3(128);
  cfg.stream = stream;
  cfg.attrs = early ? &attr : nullptr;
  cfg.numAttrs = early ? 1 : 0;
  auto kernel = slices == 2 ? mla_decode_combine<2> : mla_decode_combine<4>;
  MLA_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, static_cast<const float*>(kp.ws_o),
                                    static_cast<const float*>(kp.ws_lse), kp.splits, kp.rows_total, kp.o,
                                    kp.o_f32, kp.lse));
}

}  // namespace mla::cuda::mla_decode
