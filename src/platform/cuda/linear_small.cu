// linear_small.cu — y [M ≤ 16, N] = x [M, K] · W [N, K]ᵀ in bf16 (f32 accumulate) for decode steps, and
// the MLP's gate/up pair y = silu(x · gateᵀ) · (x · upᵀ) in one launch.
// At M = 1 cuBLAS's kernels take 64-column tiles (48 blocks for V2-Lite's q_proj on 132 SMs) and
// spend ~9 µs streaming 12.6 MB; here a block takes 8 output columns, so the weights stream through
// every SM (384 blocks for q_proj, a few an SM).
//
// Block: 128 threads (4 warps), columns [8·blockIdx.x, +8). The reduction goes in stages of 256
// (kStages deep, cp.async, 128B-swizzled like moe_gemm.cu's tiles): a stage holds x's 16 rows
// (rows past M zero-filled, never read) and the 8 weight rows, four 64-wide chunks of each; warp w
// multiplies chunk w of every stage (4 k16 steps of mma.sync m16n8k16, in index order, into one
// accumulator). The four warps' partials are then added in warp order. Nothing of that depends on
// M, so a row's bits are the same alone and in any batch up to 16 rows.
#include <cuda_bf16.h>

#include "platform/cuda/linear_small.h"
#include "platform/cuda/sm90.cuh"
#include "platform/gpu/gpu_check.h"
#include "platform/gpu/gpu_runtime.h"
#include "platform/gpu/launch.cuh"

namespace mla::cuda {
namespace {

using namespace sm90;

constexpr int kThreads = 128, kWarps = 4;
constexpr int kBN = 8;                      // output columns a block
constexpr int kRows = 16;                   // x rows a stage holds (an m16 tile)
constexpr int kChunks = 4;                  // 64-wide reduction chunks a stage: one a warp
constexpr int kStageK = 64 * kChunks;       // 256
constexpr int kABytes = kRows * kStageK * 2;  // 8 KB

// Gated (the MLP's gate and up projections, silu(gate) · up): a block takes the same 8 columns of
// both weights, 16 weight rows a stage, and one stage fewer so that it stays in 48 KB.
template <bool kGated>
struct Cfg {
  static constexpr int kBRows = kBN * (kGated ? 2 : 1);
  static constexpr int kStages = kGated ? 3 : 4;
  static constexpr int kStageBytes = kABytes + kBRows * kStageK * 2;
  static constexpr int kSmemBytes = kStages * kStageBytes;  // 48 KB either way: no opt-in needed
  static_assert(kSmemBytes <= 48 * 1024, "linear_small's shared memory exceeds the default 48 KB");
};

// 16-byte chunk c (0 .. 8·kChunks) of row r of an operand of R rows: its 64-wide chunk's own
// swizzled [R][64] tile.
__device__ __forceinline__ uint32_t at(int R, int r, int c) { return uint32_t((c / 8) * R * 128) + swz128(r, c % 8); }

// y = x · wᵀ, or (kGated) y = silu(x · wᵀ) · (x · w2ᵀ) with each product rounded to bf16 first, as
// two linear calls and silu_mul would store them.
template <bool kGated>
__global__ void __launch_bounds__(kThreads) linear_small_k(const __nv_bfloat16* x, const __nv_bfloat16* w,
                                                           const __nv_bfloat16* w2, __nv_bfloat16* y, int M, int N,
                                                           int K) {
  using C = Cfg<kGated>;
  constexpr int kStages = C::kStages, kBRows = C::kBRows, kStageBytes = C::kStageBytes;
  gpu::pdl_enter();
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t s0 = smem_u32(smem);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int kc = K / 64;                          // 64-wide chunks of the reduction
  const int nst = (kc + kChunks - 1) / kChunks;   // stages (the last may be partial)
  constexpr int kRowChunks = kStageK / 8;         // 16-byte chunks of a row in a stage: 32
  const int n0 = blockIdx.x * kBN;
  auto load_stage = [&](int stage, int st) {
    const uint32_t base = s0 + stage * kStageBytes;
    const int k0 = st * kStageK;
#pragma unroll
    for (int i = 0; i < kRows * kRowChunks / kThreads; ++i) {  // x: 4 a thread
      const int idx = tid + i * kThreads, r = idx / kRowChunks, c = idx % kRowChunks;
      const bool ok = r < M && k0 + c * 8 < K;
      cp_async(base + at(kRows, r, c), ok ? x + size_t(r) * K + k0 + c * 8 : x, ok);
    }
#pragma unroll
    for (int i = 0; i < kBRows * kRowChunks / kThreads; ++i) {  // weights: 2 (4 gated) a thread
      const int idx = tid + i * kThreads, r = idx / kRowChunks, c = idx % kRowChunks;
      const bool ok = k0 + c * 8 < K;
      const __nv_bfloat16* row = r < kBN ? w + size_t(n0 + r) * K : w2 + size_t(n0 + r - kBN) * K;
      cp_async(base + kABytes + at(kBRows, r, c), ok ? row + k0 + c * 8 : w, ok);
    }
  };

  // rows lane/4 and lane/4 + 8, columns 2·(lane%4) + {0, 1}; [1]: the up projection (gated)
  float acc[kGated ? 2 : 1][4] = {};
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < nst) load_stage(st, st);
    cp_async_commit();
  }
  for (int st = 0; st < nst; ++st) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    if (st + kStages - 1 < nst) load_stage((st + kStages - 1) % kStages, st + kStages - 1);
    cp_async_commit();
    if (st * kChunks + warp >= kc) continue;  // past K (the last stage's missing chunks)
    const uint32_t base = s0 + (st % kStages) * kStageBytes;
    const uint32_t a0 = base + warp * kRows * 128, b0 = base + kABytes + warp * kBRows * 128;
#pragma unroll
    for (int g = 0; g < (kGated ? 2 : 1); ++g) {
      uint32_t bf[2][4];  // the chunk's 4 k16 steps of 8 weight rows, two steps a load
#pragma unroll
      for (int h = 0; h < 2; ++h) ldmatrix_x4(bf[h], b0 + swz128(g * kBN + (lane & 7), 4 * h + (lane >> 3)));
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        uint32_t af[4];
        ldmatrix_x4(af, a0 + swz128(lane & 15, 2 * kk + (lane >> 4)));
        mma_bf16(acc[g], af, bf[kk / 2][2 * (kk % 2)], bf[kk / 2][2 * (kk % 2) + 1]);
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with the stages: stage 0 holds the partials now

  // red [warp][16 rows][kBRows columns] f32 (gated: the up projection's in columns 8–15)
  float* red = reinterpret_cast<float*>(smem);
  const int gr = lane >> 2, c2 = 2 * (lane & 3);
#pragma unroll
  for (int g = 0; g < (kGated ? 2 : 1); ++g) {
    float* rw = red + warp * kRows * kBRows + g * kBN + c2;
    rw[gr * kBRows] = acc[g][0];
    rw[gr * kBRows + 1] = acc[g][1];
    rw[(gr + 8) * kBRows] = acc[g][2];
    rw[(gr + 8) * kBRows + 1] = acc[g][3];
  }
  __syncthreads();
  const int r = tid / kBN, c = tid % kBN;  // 128 threads: 16 rows × 8 columns
  if (r < M) {
    auto sum = [&](int col) {  // the four warps' partials in warp order
      float v = red[r * kBRows + col];
#pragma unroll
      for (int i = 1; i < kWarps; ++i) v += red[(i * kRows + r) * kBRows + col];
      return v;
    };
    float v = sum(c);
    if constexpr (kGated) v = silu_mul_bf16(v, sum(kBN + c));
    y[size_t(r) * N + n0 + c] = __float2bfloat16_rn(v);
  }
}

template <bool kGated>
void launch_small(const void* x, const void* w, const void* w2, void* y, int64_t M, int64_t N, int64_t K,
                  cudaStream_t s) {
  gpu::launch(linear_small_k<kGated>, dim3(unsigned(N / kBN)), kThreads, Cfg<kGated>::kSmemBytes, s,
              static_cast<const __nv_bfloat16*>(x), static_cast<const __nv_bfloat16*>(w),
              static_cast<const __nv_bfloat16*>(w2), static_cast<__nv_bfloat16*>(y), int(M), int(N), int(K));
}

}  // namespace

bool linear_small_supports(int64_t M, int64_t N, int64_t K, const void* x, const void* w, const void* y) {
  return M >= 1 && M <= kLinearSmallRows && K % 64 == 0 && K > 0 && N % kBN == 0 && N > 0 && N <= 16384 &&
         gpu::aligned16(x) && gpu::aligned16(w) && (reinterpret_cast<uintptr_t>(y) & 1) == 0;
}

void linear_small(const void* x, const void* w, void* y, int64_t M, int64_t N, int64_t K, cudaStream_t s) {
  launch_small<false>(x, w, nullptr, y, M, N, K, s);
}

void linear_small_gated(const void* x, const void* gate, const void* up, void* y, int64_t M, int64_t N, int64_t K,
                        cudaStream_t s) {
  launch_small<true>(x, gate, up, y, M, N, K, s);
}

}  // namespace mla::cuda
