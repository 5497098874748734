// mla_decode_narrow.cu — the narrow MLA decode kernel (sm_90a): requests of at most 32 packed
// (token, head) rows (e.g. 16 heads × 1–2 tokens). The rows go in the N dimension of the products
// (swap-AB, granularity 8), so no tensor work is spent on padding to 64 rows:
//   Sᵀ[64 keys][N] = K · Qᵀ      (wgmma m64nNk16; A = K tile, B = Q, both K-major)
//   Oᵀ[512][N]    += Vᵀ · Pᵀ     (8 × wgmma m64nNk16; A = the same K tile read MN-major, B = Pᵀ)
// One warpgroup per CTA; the same KV tiles (mla_decode_tile.cuh), masking and split scheme as the
// 64-row kernels.
//
// fp8 KV at 8 or 16 rows: no bf16 tile at all. The raw e4m3 rows stream into two shared-memory
// stages (raw_piece's layout, 36 KB each), and both products take the KV tile as their A operand
// from registers, each thread loading its own fragment:
//   Sᵀ = K · Qᵀ in e4m3 (wgmma m64nNk32, f32 sums): Q's rows are rounded to e4m3 once per CTA, each
//     after a power-of-two scale that puts its largest |q| in [2^7, 2^8) (the scale goes back with
//     the softmax scale). Thread (warp w, lane 4g + c) holds keys 16w + g + {0, 8}; its 16-byte piece
//     c of a 64-column chunk is, as it lies, its four fragment words of the chunk's two k32 steps
//     (step st: bytes 8st + [0, 4) are k 4c + [0, 4), bytes 8st + [4, 8) are k 16 + 4c + [0, 4)). Q is
//     stored in that permuted order, so the sums are the dot products over all 576 columns. Rounding
//     Q costs accuracy (o within ~3e-2 relative L2 of the bf16-Q result in mla_decode_test); it halves
//     the products of S (18 a tile instead of 36) and no K value is converted.
//   Oᵀ += Vᵀ · Pᵀ in f16 (e4m3 → f16 is exact, one cvt a pair): the 16 keys of step kk are permuted
//     (logical 2c, 2c + 1, 2c + 8, 2c + 9 = keys 16kk + c + {0, 4, 8, 12}), and the output rows too:
//     logical rows g, g + 8 of blocks 2B and 2B + 1 are the dims 128B + 32w + 4g + [0, 4). One 4-byte
//     load per key gives a thread four dims, and a byte permute pairs the keys. Pᵀ is written in the
//     permuted key order, as P·2^15 in f16 (mla_decode_tile.cuh), and the output comes back by 2^-15.
// So the tile passes through shared memory once each way instead of being widened into a 72 KB bf16
// tile that both products then read (the 16-bit A operands read ~140 KB a tile), and two CTAs fit an
// SM; the schedule counts the SM's two slots (narrow_ctas_per_sm).
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

// D[64×N] (+)= A[64×16] · B[16×N] for the row tile N = 8, 16 or 32; kTransA: A is MN-major; kF16:
// A and B are f16 (else bf16).
template <int N, int kTransA, bool kF16>
__device__ __forceinline__ void wgmma_narrow(float (&d)[N / 2], uint64_t da, uint64_t db, int scale_d) {
  if constexpr (N == 8) wgmma_m64n8k16_ss<kTransA, 0, kF16>(d, da, db, scale_d);
  else if constexpr (N == 16) wgmma_m64n16k16_ss<kTransA, 0, kF16>(d, da, db, scale_d);
  else wgmma_m64n32k16_ss<kTransA, 0, kF16>(d, da, db, scale_d);
}
// The same with A (f16) from registers, N = 8 or 16.
template <int N>
__device__ __forceinline__ void wgmma_narrow_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t db, int scale_d) {
  if constexpr (N == 8) wgmma_m64n8k16_rs<0, true>(d, a, db, scale_d);
  else wgmma_m64n16k16_rs<0, true>(d, a, db, scale_d);
}

// The same in e4m3 with k 32, N = 8 or 16 (Q·Kᵀ of the raw fp8 kernels).
template <int N>
__device__ __forceinline__ void wgmma_narrow_e4m3(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t db, int scale_d) {
  if constexpr (N == 8) wgmma_m64n8k32_rs_e4m3(d, a, db, scale_d);
  else wgmma_m64n16k32_rs_e4m3(d, a, db, scale_d);
}

// The row reductions over the tile's 64 keys, in two steps around a barrier: stage_rows reduces
// v[j][c] (this thread's value for its rows 8j + 2(lane & 3) + c) over the 8 lanes of the warp that
// share lane & 3 (the key dimension of the swap-AB fragments) and writes the warp's value of each
// row to red ([4 warps][N] f32); after a __syncthreads, row_total folds the 4 warps' values of one
// row into `init`. Max when kMax, else sum.
template <bool kMax, int N>
__device__ __forceinline__ void stage_rows(float (&v)[N / 8][2], uint32_t red, int wi, int lane) {
#pragma unroll
  for (int j = 0; j < N / 8; ++j)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      float x = v[j][c];
#pragma unroll
      for (int d = 4; d < 32; d <<= 1) {
        const float u = __shfl_xor_sync(0xffffffffu, x, d);
        x = kMax ? fmaxf(x, u) : x + u;
      }
      v[j][c] = x;
      if (lane < 4) st_shared_f32(red + (wi * N + 8 * j + 2 * lane + c) * 4, x);
    }
}
template <bool kMax, int N>
__device__ __forceinline__ float row_total(float init, uint32_t red, int row) {
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    const float u = ld_shared_f32(red + (w * N + row) * 4);
    init = kMax ? fmaxf(init, u) : init + u;
  }
  return init;
}

// grid (row tiles, splits, requests), 128 threads, NarrowSmem<N, kFp8>::kBytes dynamic smem.
constexpr int kNarrowThreads = 128;
// fp8 tiles as register A operands (see above) at N ≤ 16.
template <int N, bool kFp8>
constexpr bool kRawA = narrow_raw_fp8(N, kFp8);
template <int N, bool kFp8>
struct NarrowSmem {
  static constexpr int kQ = 0;             // Q [9][N rows][64] bf16, 128B-swizzled (kRawA: then e4m3, see q_to_e4m3)
  static constexpr int kKV = 9 * N * 128;  // the KV area: 2 bf16 stages, or 1 bf16 tile + 2 raw
                                           // stages, or (kRawA) 2 raw stages in one tile's bytes
  static constexpr int kP = kKV + (kRawA<N, kFp8> ? 1 : 2) * kTileBytes;  // Pᵀ [N][64] bf16 or f16
  static constexpr int kRed = kP + N * 128;          // f32 [4 warps][N] max, [4][N] sum
  static constexpr int kQScale = kRed + 2 * 4 * N * 4;  // f32 [N]: 2^-k of each Q row (kRawA)
  static constexpr int kBytes = kQScale + N * 4 + 1024;
};

// The e4m3 Q of the raw kernels (see the top): Q [9][N][64] bf16 at sQ → [9][N][64 bytes] e4m3 in
// place, 64B-swizzled, row r scaled by 2^k_r (its largest |q| into [2^7, 2^8)) and each k32 step's
// columns in the order the raw K fragments hold them: physical column 8·sub + e of a chunk (its bf16
// piece sub) is logical k 16·(e / 4) + 4·(sub / 2) + e mod 4 of step sub mod 2, i.e. byte 4·(sub / 2) +
// e mod 4 of 16-byte unit 2·(sub mod 2) + e / 4. 2^−k_r → sScale[r] (NaN for a row holding an
// infinity, which e4m3's saturation would otherwise hide). Eight threads a row (lanes of one warp).
template <int N>
__device__ __forceinline__ void q_to_e4m3(uint32_t sQ, uint32_t sScale, int tid) {
  static_assert(N <= 16, "one pass of 128 threads over the rows");
  const int row = tid >> 3, sub = tid & 7;
  const bool mine = row < N;  // whole warps
  uint4 v[9];
  float mx = 0.f;
  if (mine)
#pragma unroll
    for (int i = 0; i < 9; ++i) {
      v[i] = ld_shared_v4(sQ + i * (N * 128) + swz128(row, sub));
      mx = fmaxf(mx, fmaxf(fmaxf(bf16x2_absmax(v[i].x), bf16x2_absmax(v[i].y)),
                           fmaxf(bf16x2_absmax(v[i].z), bf16x2_absmax(v[i].w))));
    }
#pragma unroll
  for (int d = 1; d < 8; d <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, d));
  const int k = q_row_exponent(mx, 7);
  const float f = pow2(k);
  uint32_t w[9][2];
  if (mine)
#pragma unroll
    for (int i = 0; i < 9; ++i) {
      const auto lo = [&](uint32_t x) { return __uint_as_float(x << 16) * f; };
      const auto hi = [&](uint32_t x) { return __uint_as_float(x & 0xffff0000u) * f; };
      w[i][0] = e4m3x4(lo(v[i].x), hi(v[i].x), lo(v[i].y), hi(v[i].y));
      w[i][1] = e4m3x4(lo(v[i].z), hi(v[i].z), lo(v[i].w), hi(v[i].w));
    }
  __syncthreads();  // every bf16 row read before the packed e4m3 rows overwrite them
  if (mine) {
#pragma unroll
    for (int i = 0; i < 9; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        st_shared_u32(sQ + i * (N * 64) + swz64(row, 2 * (sub & 1) + h) + 4 * (sub >> 1), w[i][h]);
    if (sub == 0) st_shared_f32(sScale + row * 4, mx <= 3.4e38f ? pow2(-k) : __int_as_float(0x7fc00000));
  }
}

template <int N, bool kFp8>
__global__ void __launch_bounds__(kNarrowThreads, kRawA<N, kFp8> ? 2 : 1)
    mla_narrow_kernel(const KParams p) {
  using L = NarrowSmem<N, kFp8>;
  constexpr bool kRaw = kRawA<N, kFp8>;
  constexpr bool kF16 = kRaw;  // P·V in f16 (see the top)
  constexpr int J = N / 8;     // 8-row groups
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t sbase = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sQ = sbase + L::kQ;
  const uint32_t sKV = sbase + L::kKV;  // bf16: [2 stages][64 keys][576]; fp8: [64][576] + raw
  const uint32_t sRaw = kRaw ? sKV : sKV + kTileBytes;  // fp8: [2 stages][64 keys][576] e4m3
  const uint32_t sP = sbase + L::kP;
  const uint32_t sMax = sbase + L::kRed;   // [4 warps][N] f32
  const uint32_t sSum = sMax + 4 * N * 4;  // [4 warps][N] f32
  const uint32_t sQScale = sbase + L::kQScale;

  const int tid = threadIdx.x, wi = tid >> 5, lane = tid & 31, g = lane >> 2, cq = lane & 3;
  const int split = blockIdx.y, H = p.H;
  pdl_launch_dependents();  // the combine's CTAs may queue up (they wait for this grid's end)
  pdl_wait();  // launched by gpu::launch: every kernel before it in the stream has completed
  CtaWork cw;
  if (!cta_work(p, N, cw)) return;
  const auto [q_len, rows, row0, k_len, q_start, slots, t_begin, t_end] = cw;

  // This thread's rows 8j + 2(lane&3) + c and their key limits; its keys 16wi + lane/4 + {0, 8}.
  int lim[J][2];
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int qi = (row0 + 8 * j + 2 * (lane & 3) + c) / H;
      lim[j][c] = p.causal ? min(k_len, k_len - q_len + qi + 1) : k_len;
    }
  // Oᵀ block b: o[b][4j+e] = O[row 8j + 2(lane&3) + (e&1)][dim 64b + 16wi + lane/4 + 8(e>>1)]
  // (kRaw: dim 128(b>>1) + 32wi + 4(lane/4) + 2(b&1) + (e>>1); see the top)
  float o[8][N / 2];
#pragma unroll
  for (int b = 0; b < 8; ++b)
#pragma unroll
    for (int i = 0; i < N / 2; ++i) o[b][i] = 0.f;
  float m_run[J][2], l_run[J][2];
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      m_run[j][c] = -INFINITY;
      l_run[j][c] = 0.f;
    }

  using Tile = KvTile<kNarrowThreads, kFp8, kRaw>;
  const Tile tile{p.kv, slots, k_len, sKV, sRaw, tid};
  int sl[Tile::kPasses];  // slots of this thread's keys of the next tile
  float sc[J][2];         // S → log2 units, per row (kRaw: × 2^−k of its Q row)
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int c = 0; c < 2; ++c) sc[j][c] = p.scale_log2;

  if (t_begin < t_end) {
    {  // Q rows (zero past the request)
      const __nv_bfloat16* qbase = p.q + (size_t(q_start) * H + row0) * kD;
      const int sub = tid & 7;
      for (int row = tid >> 3; row < N; row += 16) {
        const bool valid = row0 + row < rows;
        const __nv_bfloat16* src = valid ? qbase + size_t(row) * kD + sub * 8 : p.q;
#pragma unroll
        for (int i = 0; i < 9; ++i)
          cp_async(sQ + i * (N * 128) + swz128(row, sub), valid ? src + i * 64 : p.q, valid);
      }
    }
    tile.start(t_begin, t_end, sl);  // Q lands with the first tile

    for (int t = t_begin; t < t_end; ++t) {
      const int stage = (t - t_begin) & 1;
      const bool more = t + 2 < t_end;
      if (more) tile.fetch(t + 2, sl);
      const uint32_t kv_tile = tile.wait(stage, more, sl);
      if constexpr (kRaw) {
        if (t == t_begin) {
          q_to_e4m3<N>(sQ, sQScale, tid);
          fence_proxy_async();
          __syncthreads();
#pragma unroll
          for (int j = 0; j < J; ++j)
#pragma unroll
            for (int c = 0; c < 2; ++c) sc[j][c] *= ld_shared_f32(sQScale + (8 * j + 2 * (lane & 3) + c) * 4);
        }
      }

      // ---- Sᵀ[64 keys][N rows] = K · Qᵀ
      float s[N / 2];
#pragma unroll
      for (int i = 0; i < N / 2; ++i) s[i] = 0.f;
      if constexpr (kRaw) {
        // chunk i: this thread's 16 bytes of each of its two keys are the k32 steps 2i, 2i + 1 as they
        // lie (words 2st, 2st + 1: k 4c + [0, 4) and 16 + 4c + [0, 4) of step st for key g or g + 8);
        // fragments double-buffered (chunk i + 1's bytes are loaded while chunk i's products are issued).
        // Each chunk's two products sum into a fresh accumulator sa[i & 1], added to s in f32 once
        // they complete, in chunk order: the tensor cores keep fewer bits of an e4m3 product chain's
        // running sum than f32 does, and over all 18 steps a row's S lost up to 1.6e-3 of its LSE.
        const uint64_t dq8 = sw64_desc(sQ, 512);
        uint32_t a[2][2][4];
        float sa[2][N / 2];
        uint4 kr[2];
        const auto add_chunk = [&](const float (&c)[N / 2]) {
#pragma unroll
          for (int x = 0; x < N / 2; ++x) s[x] += c[x];
        };
#pragma unroll
        for (int h = 0; h < 2; ++h) kr[h] = ld_shared_v4(kv_tile + raw_piece(16 * wi + g + 8 * h, cq));
#pragma unroll
        for (int i = 0; i < 9; ++i) {
          if (i >= 2) {  // chunk i − 2's products are done: a[i & 1] is free, sa[i & 1] holds its sums
            wgmma_wait<1>();
            reg_fence(sa[i & 1]);
            add_chunk(sa[i & 1]);
          }
          const uint32_t w0[4] = {kr[0].x, kr[0].y, kr[0].z, kr[0].w}, w1[4] = {kr[1].x, kr[1].y, kr[1].z, kr[1].w};
#pragma unroll
          for (int st = 0; st < 2; ++st) {
            a[i & 1][st][0] = w0[2 * st];
            a[i & 1][st][1] = w1[2 * st];
            a[i & 1][st][2] = w0[2 * st + 1];
            a[i & 1][st][3] = w1[2 * st + 1];
          }
          if (i < 8)
#pragma unroll
            for (int h = 0; h < 2; ++h) kr[h] = ld_shared_v4(kv_tile + raw_piece(16 * wi + g + 8 * h, 4 * (i + 1) + cq));
          wgmma_fence();
#pragma unroll
          for (int st = 0; st < 2; ++st)
            wgmma_narrow_e4m3<N>(sa[i & 1], a[i & 1][st], desc_add(dq8, i * (N * 64) + st * 32), st);
          wgmma_commit();
        }
        wgmma_wait<1>();
        reg_fence(sa[1]);
        add_chunk(sa[1]);  // chunk 7
        wgmma_wait<0>();
        reg_fence(sa[0]);
        add_chunk(sa[0]);  // chunk 8
      } else {
        wgmma_fence();
        const uint64_t dq = sw128_desc(sQ, 16, 1024);
        const uint64_t dk = sw128_desc(kv_tile, 16, 1024);
#pragma unroll
        for (int kk = 0; kk < 36; ++kk) {
          const uint32_t ka = (kk >> 2) * kChunkBytes + (kk & 3) * 32;
          const uint32_t qb = (kk >> 2) * (N * 128) + (kk & 3) * 32;
          wgmma_narrow<N, 0, kF16>(s, desc_add(dk, ka), desc_add(dq, qb), kk > 0);
        }
        wgmma_commit();
      }
      wgmma_wait<0>();
      reg_fence(s);

      // ---- online softmax over the key (M) dimension: in-thread pair, lanes (xor 4/8/16), warps (smem)
      const int kb = t * kKeys + 16 * wi + (lane >> 2);
      float mx[J][2];
#pragma unroll
      for (int j = 0; j < J; ++j)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float v0 = kb < lim[j][c] ? s[4 * j + c] * sc[j][c] : -INFINITY;
          const float v1 = kb + 8 < lim[j][c] ? s[4 * j + 2 + c] * sc[j][c] : -INFINITY;
          s[4 * j + c] = v0;
          s[4 * j + 2 + c] = v1;
          mx[j][c] = fmaxf(v0, v1);
        }
      stage_rows<true, N>(mx, sMax, wi, lane);
      __syncthreads();
      // Pᵀ[row][key]: keys 16wi + lane/4 (piece 2wi) and + 8 (piece 2wi + 1), element lane/4 of the
      // piece (kRaw: the permuted order, element 2(g mod 4) + g/4)
      const uint32_t p_elem = (kRaw ? 2 * (g & 3) + (g >> 2) : g) * 2;
      float alpha[J][2];
#pragma unroll
      for (int j = 0; j < J; ++j)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int row = 8 * j + 2 * (lane & 3) + c;
          const float m_new = fmaxf(m_run[j][c], row_total<true, N>(mx[j][c], sMax, row));
          const float base = m_new == -INFINITY ? 0.f : m_new;
          alpha[j][c] = ex2(m_run[j][c] - base);
          m_run[j][c] = m_new;
          const float p0 = ex2(s[4 * j + c] - base);
          const float p1 = ex2(s[4 * j + 2 + c] - base);
          l_run[j][c] = l_run[j][c] * alpha[j][c] + p0 + p1;
          const uint16_t b0 = kF16 ? f16_bits(p0 * kPScale) : bf16_bits(p0);
          const uint16_t b1 = kF16 ? f16_bits(p1 * kPScale) : bf16_bits(p1);
          st_shared_u16(sP + swz128(row, 2 * wi) + p_elem, b0);
          st_shared_u16(sP + swz128(row, 2 * wi + 1) + p_elem, b1);
        }
      // O's rows rescale only when a row's max moved (once the max settles, most tiles): the same
      // products, since α = 1 exactly otherwise. The vote keeps the branch uniform over the warp.
      bool moved = false;
#pragma unroll
      for (int j = 0; j < J; ++j) moved |= alpha[j][0] != 1.f || alpha[j][1] != 1.f;
      if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
        for (int j = 0; j < J; ++j)
#pragma unroll
          for (int c = 0; c < 2; ++c)
#pragma unroll
            for (int b = 0; b < 8; ++b) {
              o[b][4 * j + c] *= alpha[j][c];
              o[b][4 * j + 2 + c] *= alpha[j][c];
            }
      }
      fence_proxy_async();
      __syncthreads();

      // ---- Oᵀ[64b + (0..63)][N] += Vᵀ · Pᵀ, b = 0..7
      const uint64_t dp = sw128_desc(sP, 16, 1024);
      if constexpr (kRaw) {
        // step kk: word W[x] = dims 128B + 32wi + 4g + [0, 4) of key 16kk + c + 4x (x = 0..3: logical
        // k 2c, 2c + 1, 2c + 8, 2c + 9); byte pairs of keys (x, x + 1) → f16 pairs. Fragments
        // double-buffered over kk.
        // (step kk + 1's words are loaded while step kk's products are issued)
        uint32_t a[2][8][4], vw[4][4];
        const auto load_v = [&](int kk) {
#pragma unroll
          for (int B = 0; B < 4; ++B)
#pragma unroll
            for (int x = 0; x < 4; ++x)
              vw[B][x] = ld_shared_u32(kv_tile + raw_piece(16 * kk + cq + 4 * x, 8 * B + 2 * wi + (g >> 2)) + 4 * (g & 3));
        };
        load_v(0);
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          if (kk >= 2) wgmma_wait<1>();  // step kk − 2's products no longer read a[kk & 1]
#pragma unroll
          for (int B = 0; B < 4; ++B) {
            const uint32_t(&w)[4] = vw[B];
            const uint32_t lo01 = prmt(w[0], w[1], 0x5140), hi01 = prmt(w[0], w[1], 0x7362);
            const uint32_t lo23 = prmt(w[2], w[3], 0x5140), hi23 = prmt(w[2], w[3], 0x7362);
            uint32_t(&ae)[4] = a[kk & 1][2 * B];
            uint32_t(&ao)[4] = a[kk & 1][2 * B + 1];
            fp8x4_to_f16x2x2(lo01, ae[0], ae[1]);  // dims +0, +1; keys x = 0, 1
            fp8x4_to_f16x2x2(lo23, ae[2], ae[3]);  // keys x = 2, 3
            fp8x4_to_f16x2x2(hi01, ao[0], ao[1]);  // dims +2, +3
            fp8x4_to_f16x2x2(hi23, ao[2], ao[3]);
          }
          if (kk < 3) load_v(kk + 1);
          wgmma_fence();
#pragma unroll
          for (int b = 0; b < 8; ++b) wgmma_narrow_rs<N>(o[b], a[kk & 1][b], desc_add(dp, kk * 32), 1);
          wgmma_commit();
        }
      } else {
        wgmma_fence();
        const uint64_t dv = sw128_desc(kv_tile, p.v_lbo, p.v_sbo);
#pragma unroll
        for (int b = 0; b < 8; ++b)
#pragma unroll
          for (int kk = 0; kk < 4; ++kk)
            wgmma_narrow<N, 1, kF16>(o[b], desc_add(dv, b * kChunkBytes + kk * 2048), desc_add(dp, kk * 32), 1);
        wgmma_commit();
      }
      wgmma_wait<0>();
#pragma unroll
      for (int b = 0; b < 8; ++b) reg_fence(o[b]);
      __syncthreads();  // stage, Pᵀ and the row maxima may be overwritten now
      tile.release(stage, more, sl);
    }
  }

  // ---- epilogue
  stage_rows<false, N>(l_run, sSum, wi, lane);
  __syncthreads();
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int row = 8 * j + 2 * (lane & 3) + c;
      const int prow = row0 + row;
      if (prow >= rows) continue;
      const float l = row_total<false, N>(0.f, sSum, row);  // over all keys
      const float inv = l > 0.f ? p.out_scale / l * (kF16 ? 1.f / kPScale : 1.f) : 0.f;
      const float lse = l > 0.f ? (m_run[j][c] + log2f(l)) * 0.69314718055994531f : -INFINITY;
      const size_t grow = size_t(q_start) * H + prow;
      const bool write_lse = wi == 0 && (lane >> 2) == 0;
      const size_t prow_ws = size_t(split) * p.rows_total + grow;
      // f32 (the output or the split's partial) or bf16
      float* of = p.splits > 1 ? p.ws_o + prow_ws * kDv : p.o_f32 ? static_cast<float*>(p.o) + grow * kDv : nullptr;
      __nv_bfloat16* ob = of ? nullptr : static_cast<__nv_bfloat16*>(p.o) + grow * kDv;
      if constexpr (kRaw) {  // four neighbouring dims per block pair
        const int d0 = 32 * wi + 4 * g;
#pragma unroll
        for (int B = 0; B < 4; ++B) {
          const float v[4] = {o[2 * B][4 * j + c] * inv, o[2 * B][4 * j + 2 + c] * inv,
                              o[2 * B + 1][4 * j + c] * inv, o[2 * B + 1][4 * j + 2 + c] * inv};
          if (of) *reinterpret_cast<float4*>(of + d0 + 128 * B) = make_float4(v[0], v[1], v[2], v[3]);
          else *reinterpret_cast<uint2*>(ob + d0 + 128 * B) = make_uint2(pack_bf16(v[0], v[1]), pack_bf16(v[2], v[3]));
        }
      } else {
        const int d0 = 16 * wi + (lane >> 2);
#pragma unroll
        for (int b = 0; b < 8; ++b)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float v = o[b][4 * j + 2 * e + c] * inv;
            if (of) of[d0 + 64 * b + 8 * e] = v;
            else ob[d0 + 64 * b + 8 * e] = __float2bfloat16_rn(v);
          }
      }
      if (write_lse) {
        if (p.splits > 1) p.ws_lse[prow_ws] = lse;
        else if (p.lse) p.lse[grow] = lse;
      }
    }
}

template <int N, bool kFp8>
void launch(const KParams& kp, dim3 grid, cudaStream_t stream) {
  auto* fn = mla_narrow_kernel<N, kFp8>;
  static bool smem_set[64] = {};
  set_smem_limit_once(fn, NarrowSmem<N, kFp8>::kBytes, smem_set);
  gpu::launch(fn, grid, kNarrowThreads, NarrowSmem<N, kFp8>::kBytes, stream, kp);
}

}  // namespace

void launch_narrow(const KParams& kp, dim3 grid, cudaStream_t stream, int tile_rows, bool fp8) {
  if (tile_rows == 8) fp8 ? launch<8, true>(kp, grid, stream) : launch<8, false>(kp, grid, stream);
  else if (tile_rows == 16) fp8 ? launch<16, true>(kp, grid, stream) : launch<16, false>(kp, grid, stream);
  else fp8 ? launch<32, true>(kp, grid, stream) : launch<32, false>(kp, grid, stream);
}

}  // namespace mla::cuda::mla_decode
