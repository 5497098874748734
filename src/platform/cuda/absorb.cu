// absorb.cu — the MLA method's two per-head GEMMs for bf16 decode batches (absorb.h), one kernel
// each; both take 16 tokens a block, on mma.sync m16n8k16 with both operands in shared memory
// (cp.async), f32 sums rounded to bf16. Each output sums its products in fixed k-steps, so a row's
// bits do not depend on the batch (up to kAbsorbFastTokens; cuBLAS takes larger batches).
//
// absorb_q: a block takes one head and 64 output columns: w_kc[h]'s 128 × 64 slice (k-major, so
// through ldmatrix.trans) and the tokens' nope columns. The blocks of the first column slice also
// copy the tokens' rope columns — rotated on the way when a RoPE is given (absorb_q_rope: the rope
// kernel's angles and rounding, rope.cuh, so q_pe gets the bits rope-then-copy gives it). It replaces
// a batched cuBLAS GEMM (~7 µs at one token on the H200, latency-bound for 2 MB of weights) and the
// copy kernel after it.
//
// absorb_o: a block takes one head and 16 output columns: w_vc[h]'s 16 rows (512 long) and the
// tokens' latent rows; warp w sums l in [128w, 128w + 128), and the four partial sums are added
// as ((w0 + w1) + (w2 + w3)).
#include <cuda_bf16.h>

#include <cstdint>

#include "platform/cuda/absorb.h"
#include "mla/fp_formats.h"
#include "platform/cuda/sm90.cuh"
#include "platform/gpu/launch.cuh"
#include "platform/gpu/rope.cuh"

namespace mla::cuda {
namespace {

using namespace sm90;
using bf16 = __nv_bfloat16;

constexpr int kDn = 128;    // qk_nope_head_dim of every DeepSeek model
constexpr int kCols = 64;   // output columns a block
constexpr int kPad = 8;     // bf16 of padding a shared row: ldmatrix's 8 rows fall on distinct banks
constexpr int kThreads = 128;

// grid (L / kCols, H, ceil(T / 16)); the four warps split the 64 columns, 16 each. kRope: q_pe is
// rotated by rope (its pairs: dr / 2 of them) into q_mla.
template <bool kRope>
__global__ void __launch_bounds__(kThreads)
    absorb_q_k(const bf16* __restrict__ q, const bf16* __restrict__ w, bf16* __restrict__ out, int T, int H, int dr,
               int L, AbsorbRope rope) {
  gpu::pdl_enter();
  constexpr int BM = 16, kWarpCols = 16, kTiles = kWarpCols / 8;  // n8 tiles a warp
  __shared__ __align__(16) bf16 ws[kDn][kCols + kPad];  // w_kc[h][:, c0 : c0 + 64)
  __shared__ __align__(16) bf16 qs[BM][kDn + kPad];     // the tokens' nope columns
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int c0 = blockIdx.x * kCols, h = blockIdx.y, t0 = blockIdx.z * BM;
  const size_t qld = size_t(kDn + dr), old = size_t(L + dr);  // a head's row in q and in q_mla
  for (int i = tid; i < kDn * kCols / 8; i += kThreads) {
    const int d = i / (kCols / 8), j = i % (kCols / 8);
    cp_async(smem_u32(&ws[d][8 * j]), w + (size_t(h) * kDn + d) * size_t(L) + c0 + 8 * j, true);
  }
  for (int i = tid; i < BM * kDn / 8; i += kThreads) {
    const int r = i / (kDn / 8), j = i % (kDn / 8), t = t0 + r;
    cp_async(smem_u32(&qs[r][8 * j]), q + (size_t(t < T ? t : 0) * H + h) * qld + 8 * j, t < T);
  }
  cp_async_commit();
  if (blockIdx.x == 0) {  // the rope columns while the copies land: 32 bits at a time, or rotated pairs
    const int pairs = dr / 2;
    for (int i = tid; i < BM * pairs; i += kThreads) {
      const int r = i / pairs, j = i % pairs, t = t0 + r;
      if (t >= T) continue;
      const bf16* src = q + (size_t(t) * H + h) * qld + kDn;
      bf16* dst = out + (size_t(t) * H + h) * old + L;
      if constexpr (kRope) {
        const auto* s16 = reinterpret_cast<const uint16_t*>(src);
        auto* d16 = reinterpret_cast<uint16_t*>(dst);
        const int64_t i0 = gpu::rope_first(j, pairs, rope.interleave), i1 = gpu::rope_second(j, pairs, rope.interleave);
        float c, sn, y0, y1;
        gpu::rope_cos_sin(rope.positions[t], rope.inv_freq[j], rope.attention_factor, c, sn);
        gpu::rope_rotate(fp::bf16_decode(s16[i0]), fp::bf16_decode(s16[i1]), c, sn, y0, y1);
        d16[i0] = fp::bf16_encode(y0), d16[i1] = fp::bf16_encode(y1);
      } else {
        reinterpret_cast<uint32_t*>(dst)[j] = reinterpret_cast<const uint32_t*>(src)[j];
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();
  const int wc = kWarpCols * warp;  // the warp's first column in the slice
  float acc[kTiles][4] = {};
#pragma unroll
  for (int kk = 0; kk < kDn / 16; ++kk) {
    uint32_t a[4];
    ldmatrix_x4(a, smem_u32(&qs[lane & 15][16 * kk + 8 * (lane >> 4)]));
#pragma unroll
    for (int n = 0; n < kTiles; n += 2) {
      uint32_t b[4];  // k 0–7 and 8–15 of n8 tiles n and n + 1
      ldmatrix_x4_trans(b, smem_u32(&ws[16 * kk + (lane & 7) + 8 * ((lane >> 3) & 1)][wc + 8 * n + 8 * (lane >> 4)]));
      mma_bf16(acc[n], a, b[0], b[1]);
      mma_bf16(acc[n + 1], a, b[2], b[3]);
    }
  }
  // The accumulator fragment: rows g and g + 8, columns 2·(lane mod 4) + {0, 1} of each n8 tile.
  const int g = lane >> 2, cc = 2 * (lane & 3);
#pragma unroll
  for (int hi = 0; hi < 2; ++hi) {
    const int t = t0 + g + 8 * hi;
    if (t >= T) continue;
    bf16* row = out + (size_t(t) * H + h) * old + c0 + wc + cc;
#pragma unroll
    for (int n = 0; n < kTiles; ++n)
      *reinterpret_cast<uint32_t*>(row + 8 * n) = pack_bf16(acc[n][2 * hi], acc[n][2 * hi + 1]);
  }
}

constexpr int kL = 512;    // kv_lora_rank of every DeepSeek model
constexpr int kDv = 128;   // v_head_dim
constexpr int kOCols = 16; // output columns a block of absorb_o

// grid (dv / kOCols, H, ceil(T / 16)).
__global__ void __launch_bounds__(kThreads)
    absorb_o_k(const bf16* __restrict__ o_lat, const bf16* __restrict__ w, bf16* __restrict__ out, int T, int H) {
  gpu::pdl_enter();
  __shared__ __align__(16) bf16 ws[kOCols][kL + kPad];  // w_vc[h][d0 : d0 + 16, :]
  __shared__ __align__(16) bf16 xs[16][kL + kPad];      // the tokens' latent rows of head h
  __shared__ float part[4][16][kOCols];                 // each warp's partial sums
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int d0 = blockIdx.x * kOCols, h = blockIdx.y, t0 = blockIdx.z * 16;
  for (int i = tid; i < kOCols * kL / 8; i += kThreads) {
    const int r = i / (kL / 8), j = i % (kL / 8);
    cp_async(smem_u32(&ws[r][8 * j]), w + (size_t(h) * kDv + d0 + r) * kL + 8 * j, true);
  }
  for (int i = tid; i < 16 * kL / 8; i += kThreads) {
    const int r = i / (kL / 8), j = i % (kL / 8), t = t0 + r;
    cp_async(smem_u32(&xs[r][8 * j]), o_lat + (size_t(t < T ? t : 0) * H + h) * kL + 8 * j, t < T);
  }
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  float acc[2][4] = {};
#pragma unroll
  for (int kk = 0; kk < kL / 4 / 16; ++kk) {
    const int k0 = warp * (kL / 4) + 16 * kk;
    uint32_t a[4], b[4];  // b: k 0–7 and 8–15 of columns 0–7, then of columns 8–15
    ldmatrix_x4(a, smem_u32(&xs[lane & 15][k0 + 8 * (lane >> 4)]));
    ldmatrix_x4(b, smem_u32(&ws[(lane & 7) + 8 * (lane >> 4)][k0 + 8 * ((lane >> 3) & 1)]));
    mma_bf16(acc[0], a, b[0], b[1]);
    mma_bf16(acc[1], a, b[2], b[3]);
  }
  const int g = lane >> 2, cc = 2 * (lane & 3);
#pragma unroll
  for (int n = 0; n < 2; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) part[warp][g + 8 * (i >> 1)][8 * n + cc + (i & 1)] = acc[n][i];
  __syncthreads();
  for (int i = tid; i < 16 * kOCols; i += kThreads) {
    const int r = i / kOCols, c = i % kOCols, t = t0 + r;
    if (t < T)
      out[(size_t(t) * H + h) * kDv + d0 + c] =
          __float2bfloat16_rn((part[0][r][c] + part[1][r][c]) + (part[2][r][c] + part[3][r][c]));
  }
}

}  // namespace

bool absorb_q_fast_supports(int64_t T, int64_t dn, int64_t dr, int64_t L, const void* q, const void* w_kc,
                            const void* q_mla) {
  return T <= kAbsorbFastTokens && dn == kDn && dr >= 0 && dr % 8 == 0 && L > 0 && L % kCols == 0 &&
         gpu::aligned16(q) && gpu::aligned16(w_kc) && gpu::aligned16(q_mla);
}

void absorb_q_fast(const void* q, const void* w_kc, int64_t T, int64_t H, int64_t dn, int64_t dr, int64_t L,
                   void* q_mla, const AbsorbRope* rope, cudaStream_t s) {
  if (T == 0 || H == 0) return;
  const auto* qb = static_cast<const bf16*>(q);
  const auto* wb = static_cast<const bf16*>(w_kc);
  auto* ob = static_cast<bf16*>(q_mla);
  const dim3 grid(unsigned(L / kCols), unsigned(H), unsigned((T + 15) / 16));
  if (rope) gpu::launch(absorb_q_k<true>, grid, kThreads, 0, s, qb, wb, ob, int(T), int(H), int(dr), int(L), *rope);
  else gpu::launch(absorb_q_k<false>, grid, kThreads, 0, s, qb, wb, ob, int(T), int(H), int(dr), int(L), AbsorbRope{});
}

bool absorb_o_fast_supports(int64_t T, int64_t dv, int64_t L, const void* o_lat, const void* w_vc, const void* o) {
  return T <= kAbsorbFastTokens && dv == kDv && L == kL && gpu::aligned16(o_lat) && gpu::aligned16(w_vc) &&
         gpu::aligned16(o);
}

void absorb_o_fast(const void* o_lat, const void* w_vc, int64_t T, int64_t H, void* o, cudaStream_t s) {
  if (T == 0 || H == 0) return;
  gpu::launch(absorb_o_k, dim3(unsigned(kDv / kOCols), unsigned(H), unsigned((T + 15) / 16)), kThreads, 0, s,
              static_cast<const bf16*>(o_lat), static_cast<const bf16*>(w_vc), static_cast<bf16*>(o), int(T), int(H));
}

}  // namespace mla::cuda
