// moe_gemm.cu — grouped expert GEMMs on tensor cores (bf16 in, f32 accumulate): a block takes one
// row tile of one expert (16 or 64 rows, platform/gpu/moe.h's plan) and 64 output columns, and
// streams that expert's weights through a 4-stage cp.async pipeline (64-wide reduction steps,
// 128B-swizzled shared memory, ldmatrix, mma.sync m16n8k16). The gate/up kernel reads both
// projections and applies SiLU-and-multiply in its epilogue. Each output element sums its
// reduction in one fixed order (no split-K), so a token's row never depends on the batch.
#include <cuda_bf16.h>

#include "platform/cuda/moe_gemm.h"
#include "platform/cuda/sm90.cuh"
#include "platform/gpu/gpu_check.h"

namespace mla::cuda {
namespace {

using namespace sm90;

constexpr int kBN = 64, kBK = 64, kStages = 4, kThreads = 128;  // 4 warps × 16 columns

template <int BM, bool kGated>
constexpr int smem_bytes() {
  return kStages * (BM + (kGated ? 2 : 1) * kBN) * kBK * 2;
}

// A: the activations (x by token for gate/up, h by plan row for down); W0 (and W1 = up): [E, N, Kd].
template <int BM, bool kGated>
__global__ void __launch_bounds__(kThreads) moe_gemm_k(const __nv_bfloat16* a, int topk, gpu::MoePlan plan,
                                                       const __nv_bfloat16* w0, const __nv_bfloat16* w1, int N, int Kd,
                                                       __nv_bfloat16* out) {
  const int tile = blockIdx.x;
  if (tile >= *plan.num_tiles) return;
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int kB = kGated ? 2 : 1;
  constexpr int kStageBytes = (BM + kB * kBN) * kBK * 2;
  const uint32_t s0 = smem_u32(smem);
  const int e = plan.tiles[2 * tile], r0 = plan.tiles[2 * tile + 1];
  const int nrows = min(BM, plan.offsets[e + 1] - r0);
  const int n0 = blockIdx.y * kBN;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  // This thread's A rows (at most BM·8 chunks / 128 threads of them) and their sources.
  constexpr int kAChunks = BM * 8 / kThreads > 0 ? BM * 8 / kThreads : 1;
  const __nv_bfloat16* asrc[kAChunks];
  bool aok[kAChunks];
#pragma unroll
  for (int i = 0; i < kAChunks; ++i) {
    const int idx = tid + i * kThreads, r = idx / 8;
    aok[i] = idx < BM * 8 && r < nrows;
    const int row = aok[i] ? (kGated ? plan.rows[r0 + r] / topk : r0 + r) : 0;
    asrc[i] = a + size_t(row) * Kd + (idx % 8) * 8;
  }
  const size_t wbase = (size_t(e) * N + n0) * Kd;
  auto load_stage = [&](int stage, int kt) {
    const uint32_t base = s0 + stage * kStageBytes;
    const int k0 = kt * kBK;
#pragma unroll
    for (int i = 0; i < kAChunks; ++i) {
      const int idx = tid + i * kThreads;
      if (idx < BM * 8) cp_async(base + swz128(idx / 8, idx % 8), asrc[i] + k0, aok[i]);
    }
#pragma unroll
    for (int b = 0; b < kB; ++b) {
      const __nv_bfloat16* w = (b == 0 ? w0 : w1) + wbase + k0;
      const uint32_t bb = base + BM * kBK * 2 + b * kBN * kBK * 2;
#pragma unroll
      for (int i = 0; i < kBN * 8 / kThreads; ++i) {
        const int idx = tid + i * kThreads, r = idx / 8, c = idx % 8;
        cp_async(bb + swz128(r, c), w + size_t(r) * Kd + c * 8, true);
      }
    }
  };

  constexpr int MT = BM / 16;
  float acc[kB][MT][2][4] = {};
  const int nk = Kd / kBK;
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < nk) load_stage(st, st);
    cp_async_commit();
  }
  for (int kt = 0; kt < nk; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    if (kt + kStages - 1 < nk) load_stage((kt + kStages - 1) % kStages, kt + kStages - 1);
    cp_async_commit();
    const uint32_t base = s0 + (kt % kStages) * kStageBytes;
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      uint32_t af[MT][4];
#pragma unroll
      for (int m = 0; m < MT; ++m) ldmatrix_x4(af[m], base + swz128(m * 16 + (lane & 15), kk * 2 + (lane >> 4)));
#pragma unroll
      for (int b = 0; b < kB; ++b) {
        uint32_t bf[4];
        const uint32_t bb = base + BM * kBK * 2 + b * kBN * kBK * 2;
        ldmatrix_x4(bf, bb + swz128(warp * 16 + (lane & 7) + ((lane >> 4) << 3), kk * 2 + ((lane >> 3) & 1)));
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          mma_bf16(acc[b][m][0], af[m], bf[0], bf[1]);
          mma_bf16(acc[b][m][1], af[m], bf[2], bf[3]);
        }
      }
    }
  }
  cp_async_wait<0>();

  // Epilogue: fragment c[0..1] is row lane/4, c[2..3] row lane/4 + 8; columns 2·(lane%4) + {0, 1}.
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = m * 16 + (lane >> 2) + half * 8;
      if (r >= nrows) continue;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        float v0 = acc[0][m][nt][2 * half], v1 = acc[0][m][nt][2 * half + 1];
        if constexpr (kGated) {  // the products as bf16 stores them, then silu(gate) · up
          const float g0 = __bfloat162float(__float2bfloat16_rn(v0)), g1 = __bfloat162float(__float2bfloat16_rn(v1));
          const float u0 = __bfloat162float(__float2bfloat16_rn(acc[kB - 1][m][nt][2 * half]));
          const float u1 = __bfloat162float(__float2bfloat16_rn(acc[kB - 1][m][nt][2 * half + 1]));
          v0 = g0 / (1.f + expf(-g0)) * u0;
          v1 = g1 / (1.f + expf(-g1)) * u1;
        }
        const int col = n0 + warp * 16 + nt * 8 + 2 * (lane & 3);
        *reinterpret_cast<uint32_t*>(out + size_t(r0 + r) * N + col) = pack_bf16(v0, v1);
      }
    }
}

template <int BM, bool kGated>
void launch(const void* a, int topk, const gpu::MoePlan& plan, int64_t max_tiles, const void* w0, const void* w1,
            int64_t N, int64_t Kd, void* out, cudaStream_t s) {
  if (max_tiles == 0) return;
  constexpr int smem = smem_bytes<BM, kGated>();
  static bool attr = false;  // per instantiation, once
  if (!attr) {
    MLA_GPU_CHECK(cudaFuncSetAttribute(moe_gemm_k<BM, kGated>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    attr = true;
  }
  const dim3 grid(unsigned(max_tiles), unsigned(N / kBN));
  moe_gemm_k<BM, kGated><<<grid, kThreads, smem, s>>>(
      static_cast<const __nv_bfloat16*>(a), topk, plan, static_cast<const __nv_bfloat16*>(w0),
      static_cast<const __nv_bfloat16*>(w1), int(N), int(Kd), static_cast<__nv_bfloat16*>(out));
  MLA_GPU_LAUNCH_CHECK();
}

}  // namespace

int moe_fast_rows(int64_t n, int64_t E) { return n >= 48 * E ? 64 : 16; }

bool moe_fast_supports(int64_t I, int64_t hidden) { return I > 0 && hidden > 0 && I % 64 == 0 && hidden % 64 == 0; }

void moe_gate_up_fast(const void* x, int topk, const gpu::MoePlan& plan, int64_t max_tiles, int bm, const void* gate,
                      const void* up, int64_t I, int64_t hidden, void* h, cudaStream_t s) {
  if (bm == 64) launch<64, true>(x, topk, plan, max_tiles, gate, up, I, hidden, h, s);
  else launch<16, true>(x, topk, plan, max_tiles, gate, up, I, hidden, h, s);
}

void moe_down_fast(const void* h, const gpu::MoePlan& plan, int64_t max_tiles, int bm, const void* down, int64_t I,
                   int64_t hidden, void* y, cudaStream_t s) {
  if (bm == 64) launch<64, false>(h, 1, plan, max_tiles, down, nullptr, hidden, I, y, s);
  else launch<16, false>(h, 1, plan, max_tiles, down, nullptr, hidden, I, y, s);
}

}  // namespace mla::cuda
