// Flash-style MHA prefill (bf16, tensor cores): ragged requests, causal (bottom-right) or no mask,
// o and natural-log LSE out. Two bodies (see mha_prefill.h):
//   mha_mma_kernel   — any instantiated dims: mma.sync.m16n8k16, ldmatrix, cp.async double buffer.
//   mha_wgmma_kernel — sm_90a, Dqk 192 / Dv 128: TMA producer warpgroup + two wgmma consumer ones,
//                      by default on a persistent grid (one CTA per SM, blocks from a counter).
// Both walk a request's key tiles from the last (the masked diagonal) to the first, skip tiles the
// causal mask hides entirely, and order blocks longest-first inside groups of heads that share L2.
#include "platform/cuda/mha_prefill.h"

#include <cuda.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "platform/cuda/cuda_check.h"
#include "platform/cuda/sm90.cuh"
#include "platform/cuda/sm90_host.h"

namespace mla::cuda {
namespace {

using bf16 = __nv_bfloat16;
constexpr float kLog2e = 1.4426950408889634f;

using namespace sm90;

// ---- Work decomposition (shared by both bodies) ---------------------------------------------
// Grid: x = m-blocks × heads, y = requests. Blocks start roughly in index order: heads go in
// groups of `group` (their K/V stay in L2 together); inside a group the last query tiles (the
// longest under a causal mask) come first.
struct Work {
  int r, h, m;
};
// Block L of request r's mblocks × H blocks.
__device__ __forceinline__ Work decode_item(int r, int L, int mblocks, int H, int group) {
  const int per_sec = mblocks * group;
  const int sec = L / per_sec;
  const int gs = min(group, H - sec * group);
  const int within = L - sec * per_sec;
  return {r, sec * group + within % gs, mblocks - 1 - within / gs};
}
__device__ __forceinline__ Work decode_block(int mblocks, int H, int group) {
  return decode_item(int(blockIdx.y), int(blockIdx.x), mblocks, H, group);
}

struct Req {
  int q0, qlen, k0, klen;
};
__device__ __forceinline__ Req load_req(const DeviceSegments& s, int r) {
  return {s.q_start[r], s.q_len[r], s.k_start[r], s.k_len[r]};
}
// Key tiles of width BN that query rows [m0, m0 + BM) of the request can see (later ones are
// hidden by the causal mask and skipped).
__device__ __forceinline__ int key_tiles(const Req& q, int m0, int BM, int BN, bool causal) {
  if (q.klen <= 0) return 0;
  int last = q.klen - 1;
  if (causal) last = min(last, q.klen - q.qlen + min(q.qlen - 1, m0 + BM - 1));
  return last < 0 ? 0 : last / BN + 1;
}
// Whether key tile n hides a key from some row in [m0, m0 + BM).
__device__ __forceinline__ bool tile_needs_mask(const Req& q, int n, int m0, int BN, bool causal) {
  return (n + 1) * BN > q.klen || (causal && (n + 1) * BN - 1 > q.klen - q.qlen + m0);
}

// o = 0, lse = −inf for query rows [m0, m0 + rows) of a request that sees no key.
template <int DV>
__device__ void write_empty_rows(const Req& q, int m0, int rows, int h, int H, bf16* o, float* lse,
                                 int tid, int nthreads) {
  const int n = min(rows, q.qlen - m0);
  for (int i = tid; i < n * DV; i += nthreads) {
    const int r = i / DV, c = i - r * DV;
    o[(int64_t(q.q0 + m0 + r) * H + h) * DV + c] = __float2bfloat16(0.f);
  }
  for (int r = tid; r < n; r += nthreads) lse[int64_t(q.q0 + m0 + r) * H + h] = -INFINITY;
}

// ---- Softmax on mma/wgmma accumulator fragments ---------------------------------------------
// A thread holds NB blocks of 8 key columns × 4 values: [0],[1] row r0 (cols 2·(lane%4) + 0/1),
// [2],[3] row r0 + 8. Four lanes (a quad) share a row.

// −inf where key j = key0 + col is outside [key_lo, klen) or after the causal diagonal. Branch-free:
// a thread's columns are 2·(lane % 4) plus constants, so each value takes one range test of a
// constant against two per-row bounds and a select (as per-value index arithmetic with a branch
// each, the diagonal tile's mask cost ~540 instructions a warp, more than the softmax after it).
template <int NB>
__device__ __forceinline__ void apply_mask(float (&s)[NB * 4], int lane, int key0, int key_lo, int klen,
                                           int qi0, int diag, bool causal) {
  const int base = key0 + (lane & 3) * 2;
  const int lo = key_lo - base;  // columns c in [lo, hi[r]] stay, c = 8·block + (0 or 1)
  int hi[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) hi[r] = (causal ? min(klen - 1, diag + qi0 + 8 * r) : klen - 1) - base;
#pragma unroll
  for (int i = 0; i < NB * 4; ++i) {
    const int c = (i / 4) * 8 + (i & 1);
    s[i] = c >= lo && c <= hi[(i >> 1) & 1] ? s[i] : -INFINITY;
  }
}

// One online-softmax step: raw scores s → p = exp(scale·s − running max) in place; mx, l (this
// thread's partial row sums) updated; alpha = factor for the running output of each row.
template <int NB>
__device__ __forceinline__ void softmax_tile(float (&s)[NB * 4], float (&mx)[2], float (&l)[2],
                                             float (&alpha)[2], float sl2) {
  float tmax[2] = {mx[0], mx[1]};
#pragma unroll
  for (int i = 0; i < NB * 4; ++i) tmax[(i >> 1) & 1] = fmaxf(tmax[(i >> 1) & 1], s[i]);
  float msc[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xffffffffu, tmax[r], 1));
    tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xffffffffu, tmax[r], 2));
    msc[r] = tmax[r] == -INFINITY ? 0.f : tmax[r] * sl2;  // a row with no key yet stays at 0
    alpha[r] = ex2(mx[r] * sl2 - msc[r]);                 // mx = −inf → 0
    mx[r] = tmax[r];
  }
  float sum[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < NB * 4; ++i) {
    const int r = (i >> 1) & 1;
    const float e = ex2(fmaf(s[i], sl2, -msc[r]));
    s[i] = e;
    sum[r] += e;
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) l[r] = l[r] * alpha[r] + sum[r];
}

// Normalizes and stores the two rows (qi0, qi0 + 8) a thread holds, where in [row_lo, qlen): o (NB
// blocks of 8 columns, Dv = DV) and lse.
template <int NB, int DV>
__device__ __forceinline__ void store_rows(const float (&acc)[NB * 4], const float (&mx)[2],
                                           const float (&l)[2], const Req& q, int qi0, int row_lo, int h,
                                           int H, float scale, int lane, bf16* o, float* lse) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float lt = l[r] + __shfl_xor_sync(0xffffffffu, l[r], 1);
    lt += __shfl_xor_sync(0xffffffffu, lt, 2);
    const int qi = qi0 + 8 * r;
    if (qi < row_lo || qi >= q.qlen) continue;
    const float inv = lt > 0.f ? 1.f / lt : 0.f;
    const int64_t row = int64_t(q.q0 + qi) * H + h;
    bf16* orow = o + row * DV;
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
      const int col = nb * 8 + (lane & 3) * 2;
      if (col < DV)
        *reinterpret_cast<__nv_bfloat162*>(orow + col) =
            __floats2bfloat162_rn(acc[nb * 4 + 2 * r] * inv, acc[nb * 4 + 2 * r + 1] * inv);
    }
    if ((lane & 3) == 0) lse[row] = lt > 0.f ? mx[r] * scale + logf(lt) : -INFINITY;
  }
}

// ==== Body 1: mma.sync (FA2 style), any instantiated dims ======================================
// 4 warps × 16 query rows = 64 rows; 64-key tiles; Q A-fragments stay in registers; K and V tiles
// double-buffered through cp.async; smem rows padded to an odd number of 16-byte units.
template <int DQK, int DV>
struct MmaCfg {
  static_assert(DV % 2 == 0, "bf16x2 output stores");
  static constexpr int BM = 64, BN = 64, kThreads = 128;
  static constexpr int DQKP = (DQK + 15) / 16 * 16, DVP = (DV + 15) / 16 * 16;
  static constexpr int SQ = DQKP + 8, SV = DVP + 8;  // row strides (elements)
  static constexpr int kSmemBytes = (BM * SQ + 2 * BN * SQ + 2 * BN * SV) * 2;
};

// rows [row0, row0 + ROWS) of head h of a [tokens, H, D] tensor → smem [ROWS][STRIDE]; rows past
// nvalid are zero-filled.
template <int D, int STRIDE, int ROWS, int NT>
__device__ __forceinline__ void load_rows_async(bf16* dst, const bf16* src, int64_t row0, int nvalid,
                                                int H, int h, int tid) {
  constexpr int VEC = D % 8 == 0 ? 8 : D % 4 == 0 ? 4 : 2;
  constexpr int CPR = D / VEC;
  for (int c = tid; c < ROWS * CPR; c += NT) {
    const int r = c / CPR, cc = c - r * CPR;
    const bool ok = r < nvalid;
    const bf16* g = src + ((row0 + (ok ? r : 0)) * H + h) * D + cc * VEC;
    cp_async<VEC * 2>(smem_u32(dst + r * STRIDE + cc * VEC), g, ok);
  }
}

template <int DQK, int DV>
__global__ void __launch_bounds__(128) mha_mma_kernel(const MhaParams p, int mblocks, int group) {
  using C = MmaCfg<DQK, DV>;
  constexpr int BM = C::BM, BN = C::BN, SQ = C::SQ, SV = C::SV, NT = C::kThreads;
  extern __shared__ __align__(16) uint8_t smem_mma[];
  bf16* sQ = reinterpret_cast<bf16*>(smem_mma);  // [BM][SQ]
  bf16* sK = sQ + BM * SQ;                       // [2][BN][SQ]
  bf16* sV = sK + 2 * BN * SQ;                   // [2][BN][SV]

  const int H = p.num_heads;
  const Work w = decode_block(mblocks, H, group);
  const Req q = load_req(p.seg, w.r);
  const int m0 = w.m * BM;
  if (m0 >= q.qlen) return;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const bool causal = p.seg.causal;
  const int n_tiles = key_tiles(q, m0, BM, BN, causal);
  bf16* o = static_cast<bf16*>(p.o);
  if (n_tiles == 0) {
    write_empty_rows<DV>(q, m0, BM, w.h, H, o, p.lse, tid, NT);
    return;
  }
  const bf16* gq = static_cast<const bf16*>(p.q);
  const bf16* gk = static_cast<const bf16*>(p.k);
  const bf16* gv = static_cast<const bf16*>(p.v);

  // Padding columns (dims not a multiple of 16) stay zero: cp.async never writes them.
  if constexpr (C::DQKP > DQK) {
    constexpr int P = C::DQKP - DQK;
    for (int i = tid; i < (BM + 2 * BN) * P; i += NT) sQ[(i / P) * SQ + DQK + i % P] = __float2bfloat16(0.f);
  }
  if constexpr (C::DVP > DV) {
    constexpr int P = C::DVP - DV;
    for (int i = tid; i < 2 * BN * P; i += NT) sV[(i / P) * SV + DV + i % P] = __float2bfloat16(0.f);
  }
  load_rows_async<DQK, SQ, BM, NT>(sQ, gq, q.q0 + m0, min(BM, q.qlen - m0), H, w.h, tid);
  auto load_kv = [&](int n, int buf) {
    const int nvalid = min(BN, q.klen - n * BN);
    load_rows_async<DQK, SQ, BN, NT>(sK + buf * BN * SQ, gk, q.k0 + n * BN, nvalid, H, w.h, tid);
    load_rows_async<DV, SV, BN, NT>(sV + buf * BN * SV, gv, q.k0 + n * BN, nvalid, H, w.h, tid);
  };
  load_kv(n_tiles - 1, 0);
  cp_async_commit();

  constexpr int NBO = C::DVP / 8, NBS = BN / 8, KQ = C::DQKP / 16;
  float acc[NBO * 4];
#pragma unroll
  for (int i = 0; i < NBO * 4; ++i) acc[i] = 0.f;
  float mx[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  uint32_t qf[KQ][4];
  const float sl2 = p.softmax_scale * kLog2e;
  const int qi0 = m0 + warp * 16 + (lane >> 2);
  const int diag = q.klen - q.qlen;

  for (int it = 0; it < n_tiles; ++it) {
    const int n = n_tiles - 1 - it, buf = it & 1;
    if (it + 1 < n_tiles) {
      load_kv(n - 1, buf ^ 1);  // that buffer was released by the previous iteration's barrier
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (it == 0) {
#pragma unroll
      for (int kk = 0; kk < KQ; ++kk)
        ldmatrix_x4(qf[kk], smem_u32(sQ + (warp * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * SQ +
                                     kk * 16 + (lane >> 4) * 8));
    }
    const bf16* ks = sK + buf * BN * SQ;
    const bf16* vs = sV + buf * BN * SV;

    // S[16 x BN] = Q Kᵀ
    float s[NBS * 4];
#pragma unroll
    for (int i = 0; i < NBS * 4; ++i) s[i] = 0.f;
#pragma unroll
    for (int kk = 0; kk < KQ; ++kk) {
#pragma unroll
      for (int nb2 = 0; nb2 < BN / 16; ++nb2) {
        uint32_t b[4];
        ldmatrix_x4(b, smem_u32(ks + (nb2 * 16 + (lane >> 4) * 8 + (lane & 7)) * SQ + kk * 16 +
                                ((lane >> 3) & 1) * 8));
        mma_bf16(&s[(2 * nb2) * 4], qf[kk], b[0], b[1]);
        mma_bf16(&s[(2 * nb2 + 1) * 4], qf[kk], b[2], b[3]);
      }
    }
    if (tile_needs_mask(q, n, m0, BN, causal))
      apply_mask<NBS>(s, lane, n * BN, n * BN, q.klen, qi0, diag, causal);
    float alpha[2];
    softmax_tile<NBS>(s, mx, l, alpha, sl2);
#pragma unroll
    for (int i = 0; i < NBO * 4; ++i) acc[i] *= alpha[(i >> 1) & 1];

    // O[16 x DVP] += P V, P straight from the S registers
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      const uint32_t a[4] = {pack_bf16(s[8 * kk + 0], s[8 * kk + 1]), pack_bf16(s[8 * kk + 2], s[8 * kk + 3]),
                             pack_bf16(s[8 * kk + 4], s[8 * kk + 5]),
                             pack_bf16(s[8 * kk + 6], s[8 * kk + 7])};
#pragma unroll
      for (int nb2 = 0; nb2 < C::DVP / 16; ++nb2) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, smem_u32(vs + (kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * SV + nb2 * 16 +
                                      (lane >> 4) * 8));
        mma_bf16(&acc[(2 * nb2) * 4], a, b[0], b[1]);
        mma_bf16(&acc[(2 * nb2 + 1) * 4], a, b[2], b[3]);
      }
    }
    __syncthreads();  // this buffer is refilled two iterations on
  }
  store_rows<NBO, DV>(acc, mx, l, q, qi0, m0, w.h, H, p.softmax_scale, lane, o, p.lse);
}

// ==== Body 2: wgmma + TMA (sm_90a), Dqk 192 / Dv 128 ==========================================
// 384 threads: warpgroup 0 is the TMA producer (one thread; its registers go to the others through
// setmaxnreg), warpgroups 1 and 2 the consumers (64 query rows each). Tiles: Q [128 x 192] once;
// K [128 x 192] and V [128 x 128] in two stages. Every tile is stored as [128 rows][64 cols] chunks
// of 128-byte rows with the 128-byte swizzle (the layout TMA writes and wgmma reads): K-major for Q
// and K, MN-major (keys as rows) for V. Per tile and warpgroup: S = Q Kᵀ (12 × m64n128k16, both
// from smem), online softmax in registers, O += P V (8 × m64n128k16, P from registers). With
// kOverlap the product Q K(n+1)ᵀ and P(n) V(n) run on the tensor cores while the softmax of tile
// n+1 runs (FA3's intra-warpgroup overlap); the two warpgroups already interleave without it, and
// on the H200 the plain loop measured faster.
namespace hopper {
constexpr int BM = 128, BN = 128, DQK = 192, DV = 128, kThreads = 384;
// Registers a thread of the producer warpgroup and of the two consumer warpgroups: 128 · 40 + 256 ·
// 232 = 384 · 168, the registers the block holds (ptxas's count; expect_register_pool checks it).
constexpr int kProducerRegs = 40, kConsumerRegs = 232;
constexpr int kChunk = 128 * 128;       // bytes of one [128][64] bf16 chunk
constexpr int kQBytes = 3 * kChunk;     // 49152
constexpr int kKBytes = 3 * kChunk;     // 49152
constexpr int kVBytes = 2 * kChunk;     // 32768
constexpr int kOWarpBytes = 16 * 128;  // a consumer warp's O rows on their way out: [16 rows][64], swizzled
// Barriers (8 bytes each): 0 Q full; 1,2 K full; 3,4 V full; 5,6 K stage empty; 7 Q empty; 8,9 V
// stage empty. A stage's K is released once its Q Kᵀ is done, its V once its P V is: the next K
// then loads while the softmax and P V of the tile before run (−1.6 % at causal s 4096 h128, −4.5 %
// at h16, against one release a stage after P V). Then the
// block (next_block) and its request's segment, 5 ints.
constexpr int kBarriers = 10;
constexpr int kSmemBytes =
    1024 /*alignment slack*/ + kQBytes + 2 * kKBytes + 2 * kVBytes + 8 * kOWarpBytes + 8 * kBarriers + 32;
static_assert(kSmemBytes <= 227 * 1024, "an H200 block holds 227 KB of shared memory");

// First key of tile n: the last tile ends at klen (it then overlaps the previous one; keys below
// n·BN are masked), so no TMA box reaches past the request's keys. Likewise the last query tile
// ends at qlen (rows below m0 are computed, then dropped).
__device__ __forceinline__ int tile_key0(const Req& q, int n) {
  return (n + 1) * BN > q.klen ? q.klen - BN : n * BN;
}
__device__ __forceinline__ int tile_query0(const Req& q, int m0) {
  return m0 + BM > q.qlen ? q.qlen - BM : m0;
}

// A consumer warp's 16 O rows (its m64n128 fragment, acc[4 nb + 2 r + {0, 1}] = row lane / 4 + 8 r,
// columns 8 nb + 2 (lane % 4) + {0, 1}), divided by their sums, out as bf16: through the warp's own
// 2 KB of shared memory, 64 columns a round (stmatrix, then 16-byte loads and stores, 8 lanes a row's
// 128 bytes), where 4-byte stores straight from the fragment filled half of each 32-byte sector.
// Rows outside [row_lo, qlen) are dropped. Same values as store_rows.
__device__ __forceinline__ void store_rows_staged(const float (&acc)[64], const float (&mx)[2], const float (&l)[2],
                                                  const Req& q, int qw, int row_lo, int h, int H, float scale,
                                                  int lane, uint32_t buf, bf16* o, float* lse) {
  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float lt = l[r] + __shfl_xor_sync(0xffffffffu, l[r], 1);
    lt += __shfl_xor_sync(0xffffffffu, lt, 2);
    inv[r] = lt > 0.f ? 1.f / lt : 0.f;
    const int qi = qw + (lane >> 2) + 8 * r;
    if ((lane & 3) == 0 && qi >= row_lo && qi < q.qlen)
      lse[int64_t(q.q0 + qi) * H + h] = lt > 0.f ? mx[r] * scale + logf(lt) : -INFINITY;
  }
  // stmatrix: lane gives row (lane & 7) + 8 ((lane >> 3) & 1) of 8-column block (lane >> 4) of a pair
  const int mrow = (lane & 7) + 8 * ((lane >> 3) & 1), mcol = lane >> 4;
#pragma unroll
  for (int rd = 0; rd < 2; ++rd) {
#pragma unroll
    for (int j = 0; j < 8; j += 2) {
      uint32_t r4[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int f = 4 * (8 * rd + j + (i >> 1)) + 2 * (i & 1);
        r4[i] = pack_bf16(acc[f] * inv[i & 1], acc[f + 1] * inv[i & 1]);
      }
      stmatrix_x4(buf + swz128(mrow, j + mcol), r4);
    }
    __syncwarp();
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const int rr = 4 * t + (lane >> 3), c = lane & 7, qi = qw + rr;
      const uint4 v = ld_shared_v4(buf + swz128(rr, c));
      if (qi >= row_lo && qi < q.qlen)
        *reinterpret_cast<uint4*>(o + (int64_t(q.q0 + qi) * H + h) * DV + 64 * rd + 8 * c) = v;
    }
    __syncwarp();
  }
}

// The blocks of the grid, in order: block I is request I / per_req's block I % per_req
// (decode_item). Plain grid: one block per CTA. Persistent grid (one CTA per SM): a CTA's first
// block is blockIdx.x, the next ones come from a counter, in the order the hardware would start
// them; sched[0] counts the blocks handed out past gridDim.x, sched[1] the CTAs done, and the last
// CTA to finish sets both back to 0 for the next launch.
template <bool kPersistent>
__device__ __forceinline__ int next_block(int* sched, int k, int per_req) {
  if constexpr (kPersistent) return k == 0 ? int(blockIdx.x) : int(gridDim.x) + atomicAdd(sched, 1);
  return k == 0 ? int(blockIdx.y) * per_req + int(blockIdx.x) : INT_MAX;
}

template <bool kOverlap, bool kPingpong, bool kPersistent>
__global__ void __launch_bounds__(kThreads, 1)
    mha_wgmma_kernel(const __grid_constant__ CUtensorMap tmq, const __grid_constant__ CUtensorMap tmk,
                     const __grid_constant__ CUtensorMap tmv, const MhaParams p, int mblocks, int group) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(!kPersistent || (!kOverlap && !kPingpong), "the persistent grid runs the plain loop");
  extern __shared__ uint8_t smem_wg[];
  const uint32_t base = (smem_u32(smem_wg) + 1023u) & ~1023u;
  const uint32_t sQ = base, sK = sQ + kQBytes, sV = sK + 2 * kKBytes, sO = sV + 2 * kVBytes,
                 bars = sO + 8 * kOWarpBytes;
  auto bar = [&](int i) { return bars + 8u * i; };
  // The block whose Q the Q buffer holds and its request's segment (written by the producer before
  // bar 0's arrival, read after its wait: the consumers load nothing from global memory per block).
  volatile int* s_block = reinterpret_cast<volatile int*>(smem_wg + (bar(kBarriers) - smem_u32(smem_wg)));
  volatile int* s_req = s_block + 1;  // q0, qlen, k0, klen

  const int H = p.num_heads, per_req = mblocks * H, total = p.seg.num_requests * per_req;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const bool causal = p.seg.causal;
  bf16* o = static_cast<bf16*>(p.o);
  // Block I's key tiles (0: its rows see no key; −1: it has no query rows).
  auto tiles_of = [&](const Req& q, int m0) { return m0 < q.qlen ? key_tiles(q, m0, BM, BN, causal) : -1; };
  auto work_of = [&](int I) { return decode_item(I / per_req, I % per_req, mblocks, H, group); };
  if (tid == 0) {
    mbar_init(bar(0), 1);
    for (int s = 0; s < 2; ++s) {
      mbar_init(bar(1 + s), 1);
      mbar_init(bar(3 + s), 1);
      mbar_init(bar(5 + s), 256);  // every consumer thread releases the stage's K
      mbar_init(bar(8 + s), 256);  // and its V
    }
    mbar_init(bar(7), 256);  // and the Q buffer, after its block's last Q Kᵀ
    fence_mbarrier_init();
  }
  __syncthreads();

  if (warp < 4) {  // ---- producer warpgroup
    setmaxnreg_dec<kProducerRegs>();
    if (warp == 0 && lane == 0) {
      int g = 0;  // key tiles issued, over all blocks (stage g & 1)
      auto issue_kv = [&](const Req& q, const Work& w, int n) {
        const int s = g & 1;
        if (g >= 2) mbar_wait(bar(5 + s), ((g >> 1) - 1) & 1);
        const int krow = q.k0 + tile_key0(q, n);
        mbar_expect_tx(bar(1 + s), kKBytes);
        for (int c = 0; c < 3; ++c) tma_load_3d(sK + s * kKBytes + c * kChunk, &tmk, bar(1 + s), c * 64, w.h, krow);
        if (g >= 2) mbar_wait(bar(8 + s), ((g >> 1) - 1) & 1);
        mbar_expect_tx(bar(3 + s), kVBytes);
        for (int c = 0; c < 2; ++c) tma_load_3d(sV + s * kVBytes + c * kChunk, &tmv, bar(3 + s), c * 64, w.h, krow);
        ++g;
      };
      for (int k = 0;; ++k) {
        // Claimed only now, with the last block's key tiles all issued (its consumers are two tiles
        // from done): a claim at the last block's start handed blocks out one block late, and with
        // ~4 blocks a CTA (16 heads, s 4096) the CTAs' ends spread over a third of the kernel.
        const int I = next_block<kPersistent>(p.sched, k, per_req);
        const Work w = I < total ? work_of(I) : Work{};
        const Req q = I < total ? load_req(p.seg, w.r) : Req{};
        const int m0 = w.m * BM;
        const int n_tiles = I < total ? tiles_of(q, m0) : -1;
        // The first key tile goes out while the previous block's last products still read Q.
        if (n_tiles > 0) issue_kv(q, w, n_tiles - 1);
        if (k > 0) mbar_wait(bar(7), (k - 1) & 1);
        *s_block = I;
        s_req[0] = q.q0;
        s_req[1] = q.qlen;
        s_req[2] = q.k0;
        s_req[3] = q.klen;
        if (n_tiles <= 0) {
          mbar_arrive(bar(0));
          if (I >= total) break;
          continue;
        }
        mbar_expect_tx(bar(0), kQBytes);
        for (int c = 0; c < 3; ++c)
          tma_load_3d(sQ + c * kChunk, &tmq, bar(0), c * 64, w.h, q.q0 + tile_query0(q, m0));
        for (int it = 1; it < n_tiles; ++it) issue_kv(q, w, n_tiles - 1 - it);
      }
      if constexpr (kPersistent) {
        __threadfence();  // this CTA's last counter fetch comes before its "done"
        if (atomicAdd(p.sched + 1, 1) == int(gridDim.x) - 1) {
          atomicExch(p.sched, 0);
          atomicExch(p.sched + 1, 0);
        }
      }
    }
  } else {
  // ---- consumers: warpgroup wg owns query rows [64·wg, +64) of the tile
  setmaxnreg_inc<kConsumerRegs>();
  const int wg = (warp >> 2) - 1, wl = warp & 3;
  const float sl2 = p.softmax_scale * kLog2e;
  const uint32_t qbase = sQ + wg * 64 * 128;
  int g = 0;  // key tiles consumed, over all blocks
  for (int k = 0;; ++k) {
  mbar_wait(bar(0), k & 1);
  const int I = *s_block;
  if (I >= total) break;
  const Work w = work_of(I);
  const Req q{s_req[0], s_req[1], s_req[2], s_req[3]};
  const int m0 = w.m * BM;
  const int n_tiles = tiles_of(q, m0);
  if (n_tiles == 0) write_empty_rows<DV>(q, m0, BM, w.h, H, o, p.lse, tid - 128, 256);
  if (n_tiles <= 0) {
    mbar_arrive(bar(7));
    continue;
  }
  const int qi0 = tile_query0(q, m0) + wg * 64 + wl * 16 + (lane >> 2);
  const int diag = q.klen - q.qlen;
  float acc[64], s[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = s[i] = 0.f;
  float mx[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  uint32_t pf[8][4];  // P as wgmma A fragments, 8 steps of 16 keys

  auto issue_qk = [&](int st) {  // S = Q K(st)ᵀ
    const uint64_t dq = sw128_desc(qbase, 16, 1024), dk = sw128_desc(sK + st * kKBytes, 16, 1024);
#pragma unroll
    for (int kk = 0; kk < 12; ++kk) {
      const uint32_t off = (kk >> 2) * kChunk + (kk & 3) * 32;
      wgmma_m64n128k16_ss<0, 0>(s, desc_add(dq, off), desc_add(dk, off), kk > 0);
    }
  };
  auto issue_pv = [&](int st) {  // O += P V(st)
    // MN-major: LBO = stride between the 64-column chunks, SBO = between 8-key groups
    const uint64_t dv = sw128_desc(sV + st * kVBytes, kChunk, 1024);
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) wgmma_m64n128k16_rs<1>(acc, pf[kk], desc_add(dv, kk * 2048));
  };
  auto softmax = [&](int it, float (&alpha)[2]) {
    const int n = n_tiles - 1 - it;
    if (tile_needs_mask(q, n, m0, BN, causal))
      apply_mask<16>(s, lane, tile_key0(q, n), n * BN, q.klen, qi0, diag, causal);
    softmax_tile<16>(s, mx, l, alpha, sl2);
  };
  auto to_p = [&]() {
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
      pf[kk][0] = pack_bf16(s[8 * kk + 0], s[8 * kk + 1]);
      pf[kk][1] = pack_bf16(s[8 * kk + 2], s[8 * kk + 3]);
      pf[kk][2] = pack_bf16(s[8 * kk + 4], s[8 * kk + 5]);
      pf[kk][3] = pack_bf16(s[8 * kk + 6], s[8 * kk + 7]);
    }
  };
  auto rescale = [&](const float (&alpha)[2]) {
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] *= alpha[(i >> 1) & 1];
  };
  // Stage and phase of this block's key tile it.
  auto stage = [&](int it) { return (g + it) & 1; };
  auto phase = [&](int it) { return ((g + it) >> 1) & 1; };
  auto k_free = [&](int st) { mbar_arrive(bar(5 + st)); };
  auto v_free = [&](int st) { mbar_arrive(bar(8 + st)); };
  // kPingpong: the two warpgroups take turns issuing their products (named barriers 1 and 2), so
  // one's softmax runs under the other's matrix work. Warpgroup 1 opens with a token for
  // warpgroup 0 and skips its last hand-over, so every barrier phase completes.
  auto turn_wait = [&] {
    if constexpr (kPingpong) named_bar_sync(1 + wg, 256);
  };
  auto turn_pass = [&] {
    if constexpr (kPingpong) named_bar_arrive(2 - wg, 256);
  };
  if (wg == 1) turn_pass();

  if constexpr (kOverlap) {
    mbar_wait(bar(1 + stage(0)), phase(0));
    turn_wait();
    wgmma_fence();
    issue_qk(stage(0));
    wgmma_commit();
    turn_pass();
    wgmma_wait<0>();
    reg_fence(s);
    k_free(stage(0));
    {
      float alpha[2];
      softmax(0, alpha);  // acc is still 0
    }
    to_p();
    for (int it = 1; it < n_tiles; ++it) {
      const int st = stage(it), pst = stage(it - 1);
      mbar_wait(bar(1 + st), phase(it));
      mbar_wait(bar(3 + pst), phase(it - 1));
      turn_wait();
      wgmma_fence();
      issue_qk(st);
      wgmma_commit();
      issue_pv(pst);
      wgmma_commit();
      turn_pass();
      wgmma_wait<1>();  // S(it) ready; P(it−1) V runs on
      reg_fence(s);
      k_free(st);
      float alpha[2];
      softmax(it, alpha);
      wgmma_wait<0>();
      reg_fence(acc);
      reg_fence(s);
      v_free(pst);
      rescale(alpha);
      to_p();
    }
    const int lst = stage(n_tiles - 1);
    mbar_wait(bar(3 + lst), phase(n_tiles - 1));
    turn_wait();
    wgmma_fence();
    issue_pv(lst);
    wgmma_commit();
    if (wg == 0) turn_pass();
    wgmma_wait<0>();
    reg_fence(acc);
    v_free(lst);
    mbar_arrive(bar(7));
  } else {
    for (int it = 0; it < n_tiles; ++it) {
      const int st = stage(it), ph = phase(it);
      mbar_wait(bar(1 + st), ph);
      wgmma_fence();
      issue_qk(st);
      wgmma_commit();
      wgmma_wait<0>();
      reg_fence(s);
      k_free(st);
      if (it == n_tiles - 1) mbar_arrive(bar(7));  // Q is read for the last time
      float alpha[2];
      softmax(it, alpha);
      rescale(alpha);
      to_p();
      mbar_wait(bar(3 + st), ph);
      wgmma_fence();
      issue_pv(st);
      wgmma_commit();
      wgmma_wait<0>();
      reg_fence(acc);
      v_free(st);
    }
  }
  g += n_tiles;
  store_rows_staged(acc, mx, l, q, qi0 - (lane >> 2), m0, w.h, H, p.softmax_scale, lane,
                    sO + (warp - 4) * kOWarpBytes, o, p.lse);
  }
  }
#else
  __trap();  // built without sm_90a: the host never picks this body then
#endif
}
}  // namespace hopper

// ---- Host side ------------------------------------------------------------------------------
// Heads per L2 group: their K/V (≈ max_k_len·(Dqk + Dv)·2 bytes each) fit in about 32 MB. The
// groups are as even as their count allows: a short last group (16 heads as 12 + 4) would start its
// longest query tiles only when the first group's are done, and run on past everything else
// (causal s 4096 h 16: 214–217 µs as 12 + 4, 202–206 as 8 + 8).
int head_group(const MhaParams& p) {
  const double per_head = double(p.seg.max_k_len) * (p.qk_dim + p.v_dim) * 2.0;
  int g = per_head > 0 ? int(32.0 * (1 << 20) / per_head) : 16;
  g = g < 1 ? 1 : g > 16 ? 16 : g;
  const int H = int(p.num_heads), groups = (H + g - 1) / g;
  return H > 0 ? (H + groups - 1) / groups : g;
}

template <int DQK, int DV>
void launch_mma(const MhaParams& p) {
  using C = MmaCfg<DQK, DV>;
  static const bool attr_set = [] {
    MLA_CUDA_CHECK(cudaFuncSetAttribute(mha_mma_kernel<DQK, DV>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        C::kSmemBytes));
    return true;
  }();
  (void)attr_set;
  const int mblocks = (p.seg.max_q_len + C::BM - 1) / C::BM;
  const dim3 grid(unsigned(mblocks * p.num_heads), unsigned(p.seg.num_requests));
  mha_mma_kernel<DQK, DV><<<grid, C::kThreads, C::kSmemBytes, p.stream>>>(p, mblocks, head_group(p));
  MLA_CUDA_LAUNCH_CHECK();
}

// [rows, H, D] bf16 → boxes of 128 rows × 1 head × 64 columns, 128-byte swizzle.
CUtensorMap head_tensor_map(const void* ptr, int H, int D, int64_t rows) {
  const uint64_t dims[3] = {uint64_t(D), uint64_t(H), uint64_t(rows)};
  const uint64_t strides[2] = {uint64_t(D) * 2, uint64_t(H) * D * 2};
  const uint32_t box[3] = {64, 1, 128};
  return bf16_tensor_map(const_cast<void*>(ptr), 3, dims, strides, box);
}

template <bool kOverlap, bool kPingpong, bool kPersistent>
void launch_wgmma(const MhaParams& p) {
  using namespace hopper;
  auto* kern = mha_wgmma_kernel<kOverlap, kPingpong, kPersistent>;
  static const bool attr_set = [&] {
    MLA_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
    expect_register_pool(reinterpret_cast<const void*>(kern), "mha_wgmma_kernel", kThreads,
                         128 * kProducerRegs + 256 * kConsumerRegs);
    return true;
  }();
  (void)attr_set;
  // Row bounds: none is known on the host for K/V (and q_start may leave gaps); boxes never pass
  // a request's last row (tile_key0, tile_query0), and rows below 0 are zero-filled.
  constexpr int64_t kAnyRows = int64_t(1) << 24;
  const CUtensorMap tq = head_tensor_map(p.q, p.num_heads, DQK, kAnyRows);
  const CUtensorMap tk = head_tensor_map(p.k, p.num_heads, DQK, kAnyRows);
  const CUtensorMap tv = head_tensor_map(p.v, p.num_heads, DV, kAnyRows);
  const int mblocks = (p.seg.max_q_len + BM - 1) / BM;
  dim3 grid(unsigned(mblocks * p.num_heads), unsigned(p.seg.num_requests));
  if constexpr (kPersistent)
    grid = dim3(unsigned(std::min<int64_t>(int64_t(grid.x) * grid.y, device_sms())));
  kern<<<grid, kThreads, kSmemBytes, p.stream>>>(tq, tk, tv, p, mblocks, head_group(p));
  MLA_CUDA_LAUNCH_CHECK();
}

// The sm_90a body exists in this build and the current device runs it.
bool wgmma_available() {
  static const bool ok = sm90a_runs(reinterpret_cast<const void*>(hopper::mha_wgmma_kernel<false, false, false>));
  return ok;
}

template <typename F>
bool dispatch_dims(int qk, int dv, F&& f) {
#define MLA_MHA_DIMS(A, B)                    \
  if (qk == A && dv == B) {                   \
    f(std::integral_constant<int, A>{}, std::integral_constant<int, B>{}); \
    return true;                              \
  }
  MLA_MHA_DIMS(192, 128)
  MLA_MHA_DIMS(128, 128)
  MLA_MHA_DIMS(96, 64)
  MLA_MHA_DIMS(64, 64)
  MLA_MHA_DIMS(48, 32)
  MLA_MHA_DIMS(40, 32)
  MLA_MHA_DIMS(32, 20)
#undef MLA_MHA_DIMS
  return false;
}

// The sm_90a body numbers its blocks (requests × heads × 128-row query tiles, empty ones of short
// requests included) in an int, and the persistent grid counts them in p.sched's ints.
bool wgmma_blocks_fit(const MhaParams& p) {
  const int64_t mblocks = (p.seg.max_q_len + hopper::BM - 1) / hopper::BM;
  return mblocks * p.num_heads * p.seg.num_requests <= INT32_MAX;
}

}  // namespace

bool mha_fast_supports(const MhaParams& p) {
  if (p.elem != Elem::BF16 || p.num_heads <= 0) return false;
  if (!gpu::aligned16(p.q) || !gpu::aligned16(p.k) || !gpu::aligned16(p.v) || !gpu::aligned16(p.o)) return false;
  return dispatch_dims(p.qk_dim, p.v_dim, [](auto, auto) {});
}

void mha_attention_fast_path(const MhaParams& p, MhaFastPath path) {
  if (p.seg.num_requests <= 0 || p.seg.max_q_len <= 0) return;
  const bool is_v3 = p.qk_dim == hopper::DQK && p.v_dim == hopper::DV;
  // Default sm_90a body: the plain (no intra-warpgroup overlap) one measured fastest at s ≥ 4096 on the
  // H200 (530 vs 510 TFLOP/s at causal s = 4096, 570 vs 495 at 16384; 2026-11-29).
  // Past 2^31 blocks (one very long request among many short ones) the mma.sync body, whose grid
  // is 2-D, takes the batch.
  if (path == MhaFastPath::Auto)
    path = !is_v3 || !wgmma_available() || !wgmma_blocks_fit(p) ? MhaFastPath::Mma
           : p.sched                                             ? MhaFastPath::WgmmaPersistent
                                                                 : MhaFastPath::WgmmaNoOverlap;
  if (is_v3 && path != MhaFastPath::Mma && !wgmma_blocks_fit(p))
    gpu::gpu_fail("mha prefill", "the sm_90a body takes at most 2^31 query blocks", "mha_attention_fast_path",
                  __FILE__, __LINE__);
  if (path == MhaFastPath::WgmmaPersistent && !p.sched)
    gpu::gpu_fail("mha prefill", "the persistent body needs MhaParams::sched", "mha_attention_fast_path",
                  __FILE__, __LINE__);
  if (is_v3 && path != MhaFastPath::Mma) {
    switch (path) {
      case MhaFastPath::WgmmaPersistent: launch_wgmma<false, false, true>(p); return;
      case MhaFastPath::WgmmaNoOverlap: launch_wgmma<false, false, false>(p); return;
      case MhaFastPath::WgmmaPingpong: launch_wgmma<true, true, false>(p); return;
      default: launch_wgmma<true, false, false>(p); return;
    }
  }
  dispatch_dims(p.qk_dim, p.v_dim,
                [&](auto a, auto b) { launch_mma<decltype(a)::value, decltype(b)::value>(p); });
}

void mha_attention_fast(const MhaParams& p) { mha_attention_fast_path(p, MhaFastPath::Auto); }

}  // namespace mla::cuda
