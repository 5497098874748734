// mla_decode_wide.cu — the split-S MLA decode kernel (sm_90a): requests of more than 32 packed
// (token, head) rows, in 64-row tiles, two warpgroups; kept beside the see-saw kernel
// (mla_decode_seesaw.cu, production) as its comparison and, with mma.sync products, the reference
// path. Per KV tile of 64 keys, warpgroup w computes
//   S = Q·Kᵀ for keys [32w, 32w+32)      (wgmma m64n32k16, K = 576)
// the warpgroups exchange row maxima, write P (bf16) to shared memory, and warpgroup w accumulates
//   O[:, 256w, +256) += P·V               (wgmma m64n256k16)
// V is the first 512 columns of the same K tile, read by the tensor cores as an MN-major operand:
// never loaded twice. Online softmax in log2 units; each (row tile, split) CTA writes o + natural-log
// LSE, or its split's f32 partial to the workspace. A mma.sync (ldmatrix) variant is kept as a
// reference path (MlaDecodeTuning::use_mma_sync).
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "platform/cuda/mla_decode_launch.h"
#include "platform/gpu/launch.cuh"
#include "platform/cuda/mla_decode_tile.cuh"
#include "platform/cuda/sm90.cuh"

namespace mla::cuda::mla_decode {
namespace {

using namespace sm90;

constexpr int kThreads = 256;                 // two warpgroups
constexpr int kOffQ = 0;                      // Q tile
constexpr int kOffKV = kTileBytes;            // bf16 KV: 2 stages; fp8 KV: bf16 tile + 2 raw stages
constexpr int kOffP = 3 * kTileBytes;         // P [64][64] bf16, swizzled
constexpr int kOffRed = kOffP + 8192;         // f32 row max [2][64], row sum [2][64]
constexpr int kSmemBytes = kOffRed + 4 * 64 * 4 + 1024;  // + slack to align the base to 1 KiB

// grid (row tiles, splits, requests), 256 threads, kSmemBytes dynamic smem, one CTA per SM.
// kWgS / kWgPV: wgmma (else mma.sync) for S = Q·Kᵀ / O += P·V (mixed only as a debug aid).
template <bool kWgS, bool kWgPV, bool kFp8>
__global__ void __launch_bounds__(kThreads, 1) mla_wide_kernel(const KParams p) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t sbase = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sQ = sbase + kOffQ;    // [64 rows][576] bf16 as 9 swizzled [64][64] chunks
  const uint32_t sKV = sbase + kOffKV;  // bf16: [2 stages][64 keys][576]; fp8: [64][576] + raw
  const uint32_t sRaw = sKV + kTileBytes;  // fp8 only: [2 stages][64 keys][576] e4m3
  const uint32_t sP = sbase + kOffP;    // [64 rows][64 keys] bf16, swizzled
  const uint32_t sMax = sbase + kOffRed;          // [2 WG][64 rows] f32
  const uint32_t sSum = sMax + 2 * 64 * 4;        // [2 WG][64 rows] f32

  const int tid = threadIdx.x, wg = tid >> 7, wi = (tid >> 5) & 3, lane = tid & 31;
  pdl_launch_dependents();  // the combine's CTAs may queue up (they wait for this grid's end)
  pdl_wait();  // launched by gpu::launch: every kernel before it in the stream has completed
  CtaWork cw;
  if (!cta_work(p, kRows, cw)) return;
  const int k_len = cw.k_len, t_begin = cw.t_begin, t_end = cw.t_end;
  const int32_t* slots = cw.slots;

  int rr[2], lim[2];  // this thread's accumulator rows and the keys each one sees
  tile_rows_of_thread(p, cw, wi, lane, rr, lim);

  float o[128];  // O[64 rows][256w, +256) in the wgmma / mma.sync accumulator layout
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY};  // running max, log2 units
  float l_run[2] = {0.f, 0.f};              // running sum (this thread's keys)

  KvTile<kThreads, kFp8> tile{p.kv, slots, k_len, sKV, sRaw, tid};
  int sl[KvTile<kThreads, kFp8>::kPasses];  // slots of this thread's keys of the next tile

  if (t_begin < t_end) {
    // ---- prologue: Q (zero rows past the request) + the first two tiles
    load_q_tile(p, cw, sQ, tid);
    tile.start(t_begin, t_end, sl);

    for (int t = t_begin; t < t_end; ++t) {
      const int stage = (t - t_begin) & 1;
      const bool more = t + 2 < t_end;
      if (more) tile.fetch(t + 2, sl);  // in flight during this tile's math
      const uint32_t kv_tile = tile.wait(stage, more, sl);

      // ---- S[64 rows][32 keys of this WG] = Q · Kᵀ
      float s[16];
#pragma unroll
      for (int i = 0; i < 16; ++i) s[i] = 0.f;
      if constexpr (kWgS) {
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 36; ++kk) {
          const uint32_t off = (kk >> 2) * kChunkBytes + (kk & 3) * 32;
          wgmma_m64n32k16_ss<0, 0>(s, sw128_desc(sQ + off, 16, 1024),
                              sw128_desc(kv_tile + wg * 4096 + off, 16, 1024), kk > 0);
        }
        wgmma_commit();
        wgmma_wait<0>();
        reg_fence(s);
      } else {
#pragma unroll 4
        for (int kk = 0; kk < 36; ++kk) {
          const uint32_t coff = (kk >> 2) * kChunkBytes;
          const int sub = kk & 3;
          uint32_t a[4];
          ldmatrix_x4(a, sQ + coff + swz128(16 * wi + (lane & 15), 2 * sub + (lane >> 4)));
#pragma unroll
          for (int jj = 0; jj < 2; ++jj) {
            const int mi = lane >> 3;
            uint32_t b[4];
            ldmatrix_x4(b, kv_tile + coff +
                               swz128(32 * wg + 16 * jj + (mi >> 1) * 8 + (lane & 7), 2 * sub + (mi & 1)));
            mma_bf16(&s[8 * jj], a, b[0], b[1]);
            mma_bf16(&s[8 * jj + 4], a, b[2], b[3]);
          }
        }
      }

      // ---- online softmax (log2 domain); row maxima exchanged between the two WGs
      const int kbase = t * kKeys + 32 * wg + 2 * (lane & 3);
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int h = e >> 1;
          const float v = kbase + 8 * j + (e & 1) < lim[h] ? s[4 * j + e] * p.scale_log2 : -INFINITY;
          s[4 * j + e] = v;
          mx[h] = fmaxf(mx[h], v);
        }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
        if ((lane & 3) == 0) st_shared_f32(sMax + (wg * 64 + rr[h]) * 4, mx[h]);
      }
      named_bar_sync(1, kThreads);
      float alpha[2], base[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float other = ld_shared_f32(sMax + ((wg ^ 1) * 64 + rr[h]) * 4);
        const float m_new = fmaxf(m_run[h], fmaxf(mx[h], other));
        base[h] = m_new == -INFINITY ? 0.f : m_new;
        alpha[h] = ex2(m_run[h] - base[h]);
        m_run[h] = m_new;
      }
      float sum[2] = {0.f, 0.f};
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float pv = ex2(s[4 * j + e] - base[e >> 1]);
          s[4 * j + e] = pv;
          sum[e >> 1] += pv;
        }
#pragma unroll
      for (int h = 0; h < 2; ++h) l_run[h] = l_run[h] * alpha[h] + sum[h];
      // P (bf16) → smem: row rr[h], keys 32wg + 8j + 2(lane&3) + {0,1}
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          st_shared_u32(sP + swz128(rr[h], 4 * wg + j) + (lane & 3) * 4,
                        pack_bf16(s[4 * j + 2 * h], s[4 * j + 2 * h + 1]));
      scale_rows(o, alpha);
      fence_proxy_async();
      named_bar_sync(1, kThreads);

      // ---- O[64][256w, +256) += P[64][64] · V[64 keys][256w, +256)
      if constexpr (kWgPV) {
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
          wgmma_m64n256k16_ss<0, 1>(o, sw128_desc(sP + kk * 32, 16, 1024),
                              sw128_desc(kv_tile + wg * 4 * kChunkBytes + kk * 2048, p.v_lbo, p.v_sbo), 1);
        wgmma_commit();
        wgmma_wait<0>();
        reg_fence(o);
      } else {
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          uint32_t a[4];
          ldmatrix_x4(a, sP + swz128(16 * wi + (lane & 15), 2 * kk + (lane >> 4)));
          const int mi = lane >> 3;
          const int key = kk * 16 + (mi & 1) * 8 + (lane & 7);
#pragma unroll
          for (int jp = 0; jp < 16; ++jp) {
            const int dim = 256 * wg + 16 * jp + (mi >> 1) * 8;
            uint32_t b[4];
            ldmatrix_x4_trans(b, kv_tile + (dim >> 6) * kChunkBytes + swz128(key, (dim >> 3) & 7));
            mma_bf16(&o[8 * jp], a, b[0], b[1]);
            mma_bf16(&o[8 * jp + 4], a, b[2], b[3]);
          }
        }
      }
      __syncthreads();  // this stage (and P, the row maxima) may be overwritten now
      tile.release(stage, more, sl);
    }
  }

  // ---- epilogue: total row sums, normalize, write o + lse (or the split's partial)
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 1);
    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 2);
    if ((lane & 3) == 0) st_shared_f32(sSum + (wg * 64 + rr[h]) * 4, l_run[h]);
  }
  __syncthreads();
  float m[2], l[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    m[h] = m_run[h];
    l[h] = ld_shared_f32(sSum + rr[h] * 4) + ld_shared_f32(sSum + (64 + rr[h]) * 4);
  }
  store_o_rows(p, cw, o, rr, m, l, wg, lane);
}

template <bool kWgS, bool kWgPV, bool kFp8>
void launch(const KParams& kp, dim3 grid, cudaStream_t stream) {
  auto* fn = mla_wide_kernel<kWgS, kWgPV, kFp8>;
  static bool smem_set[64] = {};
  set_smem_limit_once(fn, kSmemBytes, smem_set);
  gpu::launch(fn, grid, kThreads, kSmemBytes, stream, kp);
}

}  // namespace

bool launch_wide(const KParams& kp, dim3 grid, cudaStream_t stream, bool fp8, WideProducts products,
                 int split_tiles, int* grid_counters, const PersistParams& pp) {
  switch (products) {
    case WideProducts::kMmaSync:
      if (fp8) launch<false, false, true>(kp, grid, stream);
      else launch<false, false, false>(kp, grid, stream);
      return false;
    case WideProducts::kWgmmaSMmaPV:
      if (!fp8) {
        launch<true, false, false>(kp, grid, stream);
        return false;
      }
      break;
    case WideProducts::kMmaSWgmmaPV:
      if (!fp8) {
        launch<false, true, false>(kp, grid, stream);
        return false;
      }
      break;
    case WideProducts::kWgmma: return launch_seesaw(kp, grid, stream, fp8, split_tiles, grid_counters, pp);
    case WideProducts::kSplitS: break;
  }
  if (fp8) launch<true, true, true>(kp, grid, stream);
  else launch<true, true, false>(kp, grid, stream);
  return false;
}

}  // namespace mla::cuda::mla_decode
