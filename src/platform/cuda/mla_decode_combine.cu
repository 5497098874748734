// mla_decode_combine.cu — the split-KV combine of the MLA decode: each row's f32 partial outputs
// and natural-log LSEs of the splits (the workspace the decode kernels wrote) merged by LSE
// (gpu/softmax_state.cuh): o = Σ_s e^(lse_s − m) o_s / Σ_s e^(lse_s − m), lse = m + ln Σ.
#include <cuda_bf16.h>

#include <cstdint>

#include "platform/cuda/cuda_check.h"
#include "platform/cuda/mla_decode_launch.h"
#include "platform/cuda/mla_decode_merge.cuh"
#include "platform/cuda/sm90_host.h"
#include "platform/cuda/sm90.cuh"

namespace mla::cuda::mla_decode {
namespace {

#ifdef MLA_SEESAW_TRACE
// Measurement builds only: each CTA's first thread stamps %globaltimer at its start, after its
// wait for the decode grid, and at its end (mla_decode_launch.h, combine_trace_take).
__device__ unsigned long long g_ctrace[kTraceCtas][3];
__device__ __forceinline__ void ctrace_mark(int point) {
  const int cta = blockIdx.x + gridDim.x * blockIdx.y;
  if (threadIdx.x != 0 || cta >= kTraceCtas) return;
  g_ctrace[cta][point] = sm90::globaltimer_ns();
}
#define MLA_CTRACE(point) ctrace_mark(point)
#else
#define MLA_CTRACE(point) ((void)0)
#endif

// grid (T·H rows, 4 / kVec column slices), 128 threads: kVec columns each. Each column adds the
// splits in split order whatever the slicing (mla_decode_merge.cuh), so both slicings give the same bits.
template <int kVec>
__global__ void __launch_bounds__(128) mla_decode_combine(const float* __restrict__ ws_o,
                                                          const float* __restrict__ ws_lse, int splits,
                                                          int rows_total, void* o, int o_f32, float* lse) {
  __shared__ float w[kMaxSplits];
  __shared__ float s_lse;
  const int row = blockIdx.x, tid = threadIdx.x;
  MLA_CTRACE(0);
  sm90::pdl_wait();  // launched early (launch_combine): the decode kernel's partials are complete
  MLA_CTRACE(1);
  if (tid < 32) {
    const float row_lse = split_weights<false>(ws_lse, splits, rows_total, row, w, tid);
    if (tid == 0) s_lse = row_lse;
  }
  __syncthreads();
  merge_columns<kVec, false>(ws_o, w, splits, rows_total, row, (blockIdx.y * 128 + tid) * kVec, o, o_f32);
  if (blockIdx.y == 0 && tid == 0 && lse) lse[row] = s_lse;
  MLA_CTRACE(2);
}

}  // namespace

#ifdef MLA_SEESAW_TRACE
int combine_trace_take(unsigned long long* out) {
  take_trace(g_ctrace, out);
  return kTraceCtas;
}
#endif

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
