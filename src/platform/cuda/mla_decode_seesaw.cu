// mla_decode_seesaw.cu — the 64-row MLA decode kernel (sm_90a, bf16 or fp8 KV): requests of more than 32
// packed (token, head) rows, e.g. 128 heads, where the products, not the KV bytes, set the time.
//
// Two warpgroups take KV tiles in pairs (t, t + 1) and see-saw between them. Each computes the whole
// S = Q·Kᵀ [64 rows][64 keys] of its own tile (wgmma m64n64k16: K = 576, Q from shared memory, its
// last 64 columns from registers), and each holds half of O [64 rows][512]:
//   WG0: S0 = Q·K_tᵀ        softmax(S0) → P0, O_L = O_L·α0 + P0·V_t[:, :256]        (P0 in registers)
//   WG1: S1 = Q·K_{t+1}ᵀ    softmax(S1) → P1, O_R = O_R·α0α1 + P1·V_{t+1}[:, 256:]  (P1 in registers)
//   WG0: O_L = O_L·α1 + P1·V_{t+1}[:, :256]   (P1 through shared memory)
//   WG1: O_R += (P0·α1)·V_t[:, 256:]          (P0, rescaled, through shared memory)
// where α0 / α1 rescale for the running max after tile t / t + 1 (one max per row, kept in shared
// memory). So one warpgroup's softmax runs while the other's products keep the tensor cores busy,
// and every product is m64n64 or m64n256. V is the first 512 columns of the K tile, read MN-major.
//
// KV tiles stream into two buffers (tile t → buffer t − t_begin mod 2), gathered row by row through
// the slot table with cp.async (any page size). A buffer is reloaded in halves, columns [0, 256)
// (chunks 0–3) and [256, 576) (chunks 4–8), each by the warpgroup that reads it last (WG0 the low
// halves, WG1 the high ones) as soon as it is free. Every 64-column chunk has its own mbarrier, on
// which the loading warpgroup's 128 threads arrive as their copies land, so S starts on the first
// chunk. Keys past the request are zero-filled, never NaN.
//
// fp8 KV (e4m3, × kv_scale folded into the softmax and output scales): a half's raw rows land in the
// top of its own 16-bit area (half its size) and the warpgroup computing S widens them in place,
// a pair of chunks at a time, just before its products on the pair. The fp8 kernel multiplies in f16
// (mla_decode_tile.cuh): e4m3 → f16 is exact and one cvt a pair; Q's rows are scaled into f16's
// range once, and P goes in as P·2^15.
// Chunks are widened in pairs (0, 1), (2, 3), (4, 5), (6, 7), then 8, with one barrier a pair
// before its products. Chunk c's 16-bit output covers only raw chunks widened in an earlier pair,
// except for chunks 3 (over raw 2 and 3), 7 (over raw 6) and 8 (over raw 8): there every thread
// reads its raw rows into registers, then a barrier, then the writes.
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "platform/cuda/mla_decode_launch.h"
#include "platform/gpu/launch.cuh"
#include "platform/cuda/mla_decode_merge.cuh"
#include "platform/cuda/mla_decode_parts.h"
#include "platform/cuda/mla_decode_tile.cuh"
#include "platform/cuda/sm90_host.h"
#include "platform/cuda/sm90.cuh"

namespace mla::cuda::mla_decode {
namespace {

using namespace sm90;

constexpr int kThreads = 256;  // two warpgroups
// Shared memory, from a 1 KiB-aligned base.
constexpr int kOffQ = 0;                        // Q [64 rows][576] as 9 swizzled chunks; chunk 8
                                                // holds P1 once Q's last 64 columns are in registers
constexpr int kOffK0 = kTileBytes;              // KV buffer 0 [64 keys][576]
constexpr int kOffK1 = 2 * kTileBytes;          // KV buffer 1
constexpr int kOffP0 = 3 * kTileBytes;          // P0 [64 rows][64 keys] bf16, swizzled
constexpr int kOffL = kOffP0;                   // f32 [2][64]: row sums, in P0's place at the end
constexpr int kOffM = kOffP0 + kChunkBytes;     // f32 [64]: running row max (log2 units)
constexpr int kOffA0 = kOffM + 256;             // f32 [64]: α0 of the current pair
constexpr int kOffA1 = kOffA0 + 256;            // f32 [64]: α1
constexpr int kOffBar = kOffA1 + 256;           // mbarriers [2 buffers][9 chunks]
constexpr int kOffQScale = kOffBar + 18 * 8;    // fp8, f32 [64]: 2^-k of each Q row
constexpr int kOffLoop = kOffQScale + 64 * 4;   // persistent: the piece loop's state (PieceLoop)
constexpr int kSmemBytes = kOffLoop + 64 + 1024;  // + slack to align the base to 1 KiB
static_assert(kSmemBytes <= 227 * 1024, "the see-saw kernel's shared memory exceeds the H200's 227 KiB");

// Named barriers (0 is __syncthreads): one warpgroup arrives, the other waits.
constexpr int kBarA0 = 1;     // α0 and the max after tile t are in shared memory (WG0 → WG1)
constexpr int kBarA1 = 2;     // α1 and the max after tile t + 1 (WG1 → WG0)
constexpr int kBarP0 = 3;     // P0·α1 is in shared memory (WG0 → WG1)
constexpr int kBarP1 = 4;     // P1 is in shared memory and WG1 issued its P0 product (WG1 → WG0)
constexpr int kBarWiden = 5;  // fp8, 5 + warpgroup: its threads widened (or read) a chunk

// The pair bodies' kAhead when the count of tiles ahead is known only at run time.
constexpr int kAheadAny = -1;

#ifdef MLA_SEESAW_TRACE
// Measurement builds only (-DMLA_SEESAW_TRACE; bench/NOTES.md, "Where a split CTA's time goes"):
// each warpgroup's first thread stamps %globaltimer and clock64 at fixed points of its CTA's work.
__device__ unsigned long long g_trace[kTraceCtas][kTraceSlots];
__device__ __forceinline__ void trace_mark(int point) {
  if ((threadIdx.x & 127) != 0) return;
  const int cta = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  if (cta >= kTraceCtas) return;
  const int slot = (threadIdx.x >> 7) * kTracePoints + point;
  g_trace[cta][2 * slot] = globaltimer_ns();
  g_trace[cta][2 * slot + 1] = static_cast<unsigned long long>(clock64());
  if (point == 0) {
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    g_trace[cta][kTraceSlots - 1] = smid + 1;
  }
}
#define MLA_TRACE(point) trace_mark(point)
#else
#define MLA_TRACE(point) ((void)0)
#endif

template <bool kFp8>
struct Seesaw {
  const KParams& p;
  const CtaWork& w;
  uint32_t sQ, sK[2], sP0, sP1, sM, sA0, sA1, bar;  // bar: [buffer][chunk] mbarriers
  int wt, wi, lane;                                  // thread in warpgroup, warp in warpgroup, lane
  int rr[2], lim[2];                                 // this thread's rows and their key limits
  float sc[2];                                       // fp8: S → log2 units for rows rr (× 2^-k)

  __device__ uint32_t barrier(int buf, int chunk) const { return bar + (9 * buf + chunk) * 8; }

  // Chunks [C0, C1) of KV tile t → buffer buf, by this warpgroup, 8 threads per key, 16 keys per
  // pass; its threads arrive on each chunk's barrier when their copies of it land.
  // fp8: raw chunk c [64 keys][64 bytes] in the top of its half's bf16 area.
  static constexpr uint32_t raw_offset(int c) { return c < 4 ? 16384 + 4096 * c : 53248 + 4096 * (c - 4); }

  template <int C0, int C1>
  __device__ __forceinline__ void load(int buf, int t) const {
    if constexpr (kFp8) {  // 4 threads per key, 32 keys per pass
      const uint8_t* src[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int kidx = t * kKeys + (wt >> 2) + 32 * i;
        src[i] = kidx < w.k_len ? p.kv + size_t(__ldg(w.slots + kidx)) * kD + (wt & 3) * 16 : nullptr;
      }
#pragma unroll
      for (int c = C0; c < C1; ++c) {
#pragma unroll
        for (int i = 0; i < 2; ++i)
          cp_async(sK[buf] + raw_offset(c) + ((wt >> 2) + 32 * i) * 64 + (wt & 3) * 16,
                   src[i] ? src[i] + c * 64 : p.kv, src[i] != nullptr);
        cp_async_mbar_arrive(barrier(buf, c));
      }
      return;
    }
    const int sub = wt & 7;
    const uint8_t* src[4];
#pragma unroll
    for (int h = 0; h < 4; ++h) {
      const int kidx = t * kKeys + (wt >> 3) + 16 * h;
      src[h] = kidx < w.k_len ? p.kv + size_t(__ldg(w.slots + kidx)) * (kD * 2) + sub * 16 : nullptr;
    }
#pragma unroll
    for (int c = C0; c < C1; ++c) {
#pragma unroll
      for (int h = 0; h < 4; ++h)
        cp_async(sK[buf] + c * kChunkBytes + swz128((wt >> 3) + 16 * h, sub), src[h] ? src[h] + c * 128 : p.kv,
                 src[h] != nullptr);
      cp_async_mbar_arrive(barrier(buf, c));
    }
  }

  // s (+)= Q[:, chunks C0..C1) · K[:, same]ᵀ from buffer buf, each chunk once it has landed; one
  // commit group. Chunk 8 (the RoPE columns) takes Q from registers.
  template <int C0, int C1, int kWg>
  __device__ __forceinline__ void qk(float (&s)[32], int buf, int phase, const uint32_t (&q8)[4][4],
                                     bool first) const {
    const uint64_t dk = sw128_desc(sK[buf], 16, 1024), dq = sw128_desc(sQ, 16, 1024);
    auto products = [&](int c) {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const uint32_t off = c * kChunkBytes + k * 32;
        const int acc = first && c == C0 && k == 0 ? 0 : 1;
        if (c < 8) wgmma_m64n64k16_ss<0, 0, kFp8>(s, desc_add(dq, off), desc_add(dk, off), acc);
        else wgmma_m64n64k16_rs<0, kFp8>(s, q8[k], desc_add(dk, off), acc);
      }
    };
#pragma unroll
    for (int c = C0; c < C1; ++c) {
      mbar_wait(barrier(buf, c), phase);
      if constexpr (kFp8) {  // chunks widened in pairs (c − 1, c), one barrier a pair
        widen<kWg>(buf, c);
        if (c % 2 == 1 || c == C1 - 1) {
          fence_proxy_async();
          named_bar_sync(kBarWiden + kWg, 128);  // all of the pair is f16
          wgmma_fence();
          if (c % 2 == 1 && c > C0) products(c - 1);
          products(c);
        }
      } else {
        fence_proxy_async();
        wgmma_fence();
        products(c);
      }
    }
    wgmma_commit();
  }

  // fp8: raw chunk c of buffer buf → f16 chunk c, by the warpgroup computing S (4 threads per key).
  template <int kWg>
  __device__ __forceinline__ void widen(int buf, int c) const {
    uint4 v[2];
#pragma unroll
    for (int i = 0; i < 2; ++i)
      v[i] = ld_shared_v4(sK[buf] + raw_offset(c) + ((wt >> 2) + 32 * i) * 64 + (wt & 3) * 16);
    if (c == 3 || c == 7 || c == 8) named_bar_sync(kBarWiden + kWg, 128);  // the raw rows it overlaps read
#pragma unroll
    for (int i = 0; i < 2; ++i)
      widen_fp8x16<true>(v[i], sK[buf] + c * kChunkBytes, (wt >> 2) + 32 * i, wt & 3);
  }

  // o += P · V[:, 256·half, +256) of buffer buf; P from registers (pb) or from shared memory (sp).
  __device__ __forceinline__ uint64_t vdesc(int buf, int half, int kk) const {
    return desc_add(sw128_desc(sK[buf], p.v_lbo, p.v_sbo), half * 4 * kChunkBytes + kk * 2048);
  }
  __device__ __forceinline__ void pv_regs(float (&o)[128], const uint32_t (&pb)[4][4], int buf, int half) const {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) wgmma_m64n256k16_rs<1, kFp8>(o, pb[kk], vdesc(buf, half, kk), 1);
    wgmma_commit();
  }
  __device__ __forceinline__ void pv_smem(float (&o)[128], uint32_t sp, int buf, int half) const {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      wgmma_m64n256k16_ss<0, 1, kFp8>(o, desc_add(sw128_desc(sp, 16, 1024), kk * 32), vdesc(buf, half, kk), 1);
    wgmma_commit();
  }

  // The row maxima of tile t in log2 units (over the quad of threads sharing a row). Keys past a
  // row's limit become −inf first; only a tile that reaches past the smaller limit has any.
  __device__ __forceinline__ void tile_max(float (&s)[32], int t, float (&mx)[2]) const {
    if ((t + 1) * kKeys > min(lim[0], lim[1])) {
      const int kbase = t * kKeys + 2 * (lane & 3);
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (kbase + 8 * j + (e & 1) >= lim[e >> 1]) s[4 * j + e] = -INFINITY;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float m = -INFINITY;
#pragma unroll
      for (int j = 0; j < 8; ++j) m = fmaxf(m, fmaxf(s[4 * j + 2 * h], s[4 * j + 2 * h + 1]));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
      mx[h] = m * (kFp8 ? sc[h] : p.scale_log2);
    }
  }
  // Folds the tile's maxima into the shared running max; returns the new max (0 for a row with no
  // key yet) in base and the factor for what was accumulated before in alpha, and stores alpha at sA.
  __device__ __forceinline__ void update_max(const float (&mx)[2], uint32_t sA, float (&base)[2],
                                             float (&alpha)[2]) const {
    float m_new[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float m_old = ld_shared_f32(sM + rr[h] * 4);
      m_new[h] = fmaxf(m_old, mx[h]);
      base[h] = m_new[h] == -INFINITY ? 0.f : m_new[h];
      alpha[h] = ex2(m_old - base[h]);
    }
    __syncwarp();  // the quad's reads of the old max come first
    if ((lane & 3) == 0)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        st_shared_f32(sM + rr[h] * 4, m_new[h]);
        st_shared_f32(sA + rr[h] * 4, alpha[h]);
      }
  }
  // s ← exp2(s · scale − base) (f32, kept; fp8: × 2^15), pb ← s as the A fragments of the P·V
  // product (bf16; fp8: f16); returns the row sums of this thread's keys.
  __device__ __forceinline__ void exponentiate(float (&s)[32], const float (&base)[2], uint32_t (&pb)[4][4],
                                               float (&sum)[2]) const {
    sum[0] = sum[1] = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float v = kFp8 ? ex2(fmaf(s[4 * j + e], sc[e >> 1], float(kPScaleLog2) - base[e >> 1]))
                             : ex2(fmaf(s[4 * j + e], p.scale_log2, -base[e >> 1]));
        s[4 * j + e] = v;
        sum[e >> 1] += v;
      }
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
      for (int r = 0; r < 4; ++r) pb[kk][r] = pack_p(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
  }
  static __device__ __forceinline__ uint32_t pack_p(float lo, float hi) {
    return kFp8 ? pack_f16(lo, hi) : pack_bf16(lo, hi);
  }
  // P [64 rows][64 keys] → shared memory at sp (swizzled, the A operand of pv_smem); scale per row.
  __device__ __forceinline__ void store_p(const float (&s)[32], uint32_t sp, const float (&scale)[2]) const {
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        st_shared_u32(sp + swz128(rr[h], j) + (lane & 3) * 4,
                      pack_p(s[4 * j + 2 * h] * scale[h], s[4 * j + 2 * h + 1] * scale[h]));
  }

  // One pair (t, t + 1) for warpgroup 0, S0 = S(t) in s. kAhead = how many of t + 1, t + 2, t + 3
  // exist (kAheadAny: ahead_rt says, at run time). Leaves S(t + 2) in s. Each reload is issued as
  // soon as the half it overwrites is free.
  template <int kAhead>
  __device__ __forceinline__ void wg0_pair(int t, int ahead_rt, int phase_next, float (&o)[128], float (&s)[32],
                                           float (&l)[2], const uint32_t (&q8)[4][4]) const {
    auto AH = [&](int n) { return kAhead == kAheadAny ? ahead_rt >= n : kAhead >= n; };
    float mx[2], base[2], alpha[2], sum[2];
    uint32_t pb[4][4];
    tile_max(s, t, mx);
    update_max(mx, sA0, base, alpha);
    named_bar_arrive(kBarA0, kThreads);  // WG1 needs only the max and α0
    scale_rows(o, alpha);
    exponentiate(s, base, pb, sum);
#pragma unroll
    for (int h = 0; h < 2; ++h) l[h] = l[h] * alpha[h] + sum[h];
    pv_regs(o, pb, 0, 0);  // O_L += P0 · V_t[:, :256]
    wgmma_wait<0>();
    reg_fence(o);
    if (!kFp8 && AH(2)) load<0, 4>(0, t + 2);  // buffer 0's low half is read by nobody now
    named_bar_sync(kBarA1, kThreads);
    float a1[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) a1[h] = ld_shared_f32(sA1 + rr[h] * 4);
    store_p(s, sP0, a1);
    fence_proxy_async();
    named_bar_arrive(kBarP0, kThreads);
    // fp8: the reload goes out after P0 is handed over, so the slot reads and copies do not delay
    // WG1's P0 product, which waits behind this warpgroup's widening (bf16 measured +1 % this way).
    if (kFp8 && AH(2)) load<0, 4>(0, t + 2);
    if (AH(1)) {
      named_bar_sync(kBarP1, kThreads);
      scale_rows(o, a1);
#pragma unroll
      for (int h = 0; h < 2; ++h) l[h] *= a1[h];
      pv_smem(o, sP1, 1, 0);  // O_L += P1 · V_{t+1}[:, :256]
    }
    if (AH(2)) {
      qk<0, 4, 0>(s, 0, phase_next, q8, true);
      if (AH(3)) {
        wgmma_wait<1>();  // the P1 product is done: buffer 1's low half is free
        load<0, 4>(1, t + 3);
      }
      qk<4, 9, 0>(s, 0, phase_next, q8, false);
    }
    wgmma_wait<0>();
    reg_fence(o);
    reg_fence(s);
  }

  // One pair for warpgroup 1, S1 = S(t + 1) in s (when it exists). Leaves S(t + 3) in s. sA0 stays
  // valid after the α1 arrival: WG0 rewrites it only after this warpgroup's P1 arrival.
  template <int kAhead>
  __device__ __forceinline__ void wg1_pair(int t, int ahead_rt, int phase_next, float (&o)[128], float (&s)[32],
                                           float (&l)[2], const uint32_t (&q8)[4][4]) const {
    auto AH = [&](int n) { return kAhead == kAheadAny ? ahead_rt >= n : kAhead >= n; };
    float mx[2] = {-INFINITY, -INFINITY}, base[2], alpha[2], sum[2] = {0.f, 0.f};
    uint32_t pb[4][4];
    if (AH(1)) tile_max(s, t + 1, mx);
    named_bar_sync(kBarA0, kThreads);
    update_max(mx, sA1, base, alpha);
    named_bar_arrive(kBarA1, kThreads);  // WG0 needs only α1
    float f[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) f[h] = alpha[h] * ld_shared_f32(sA0 + rr[h] * 4);
    // The run-time body exponentiates s whether or not tile t + 1 exists (the sums are dropped when
    // it does not): no branch around the register-heavy softmax.
    if (kAhead == kAheadAny || AH(1)) exponentiate(s, base, pb, sum);
    if (!AH(1)) sum[0] = sum[1] = 0.f;
    scale_rows(o, f);
#pragma unroll
    for (int h = 0; h < 2; ++h) l[h] = l[h] * f[h] + sum[h];
    if (AH(1)) {
      const float one[2] = {1.f, 1.f};
      store_p(s, sP1, one);
      fence_proxy_async();
      pv_regs(o, pb, 1, 1);  // O_R += P1 · V_{t+1}[:, 256:]
    }
    if (!kFp8 && AH(3)) {
      wgmma_wait<0>();  // the P1 product is done: buffer 1's high half is free
      load<4, 9>(1, t + 3);
    }
    // fp8: the P0 product queues behind the P1 product (the tensor cores do not wait for this
    // warpgroup's reloads); the reloads follow as each product completes.
    named_bar_sync(kBarP0, kThreads);
    pv_smem(o, sP0, 0, 1);  // O_R += (P0·α1) · V_t[:, 256:]
    if (AH(1)) named_bar_arrive(kBarP1, kThreads);
    if (kFp8 && AH(3)) {
      wgmma_wait<1>();  // the P1 product is done: buffer 1's high half is free
      reg_fence(pb);    // P1's A fragments stay untouched until then
      load<4, 9>(1, t + 3);
    }
    if (AH(2)) {
      wgmma_wait<0>();  // the P0 product is done: buffer 0's high half is free
      load<4, 9>(0, t + 2);
    }
    if (AH(3)) {
      qk<4, 9, 1>(s, 1, phase_next, q8, true);
      qk<0, 4, 1>(s, 1, phase_next, q8, false);
    }
    wgmma_wait<0>();
    reg_fence(o);
    reg_fence(s);
  }
};

// fp8: Q [64 rows][576] bf16 (9 swizzled chunks at sQ) → f16 in place, row r scaled by 2^k_r
// (mla_decode_tile.cuh); 2^−k_r → sScale[r]. Four threads a row (lanes of one warp), two 16-byte
// pieces of each chunk row each.
__device__ __forceinline__ void q_to_f16(uint32_t sQ, uint32_t sScale, int tid) {
  const int row = tid >> 2, x0 = 2 * (tid & 3);
  uint4 v[9][2];
  float mx = 0.f;
#pragma unroll
  for (int i = 0; i < 9; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      v[i][j] = ld_shared_v4(sQ + i * kChunkBytes + swz128(row, x0 + j));
      mx = fmaxf(mx, fmaxf(fmaxf(bf16x2_absmax(v[i][j].x), bf16x2_absmax(v[i][j].y)),
                           fmaxf(bf16x2_absmax(v[i][j].z), bf16x2_absmax(v[i][j].w))));
    }
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  const int k = q_row_exponent(mx, 14);
  const float f = pow2(k);
#pragma unroll
  for (int i = 0; i < 9; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j)
      st_shared_v4(sQ + i * kChunkBytes + swz128(row, x0 + j),
                   make_uint4(bf16x2_to_f16x2(v[i][j].x, f), bf16x2_to_f16x2(v[i][j].y, f),
                              bf16x2_to_f16x2(v[i][j].z, f), bf16x2_to_f16x2(v[i][j].w, f)));
  if ((tid & 3) == 0) st_shared_f32(sScale + row * 4, pow2(-k));
}

// The split partials of the whole grid merged by its own CTAs (kMerge; the grid's CTAs are all
// resident at once: at most one CTA an SM and no more CTAs than SMs, launch_seesaw). Each CTA counts
// its arrival in grid_counters[0] once its partials are written and waits for the others; then CTA c
// merges rows c, c + G, … (G CTAs; 256 threads, two columns each) as the combine kernel would
// (mla_decode_merge.cuh: the same bits), and the last CTA to finish puts both counters back to 0.
// w: shared memory for kMaxSplits + 1 floats. Not inlined: one copy of its code for the kernel's two
// exits, outside the pair loop's.
__device__ __noinline__ void merge_in_grid(const float* ws_o, const float* ws_lse, int splits, int rows_total,
                                           void* o, int o_f32, float* lse, int* grid_counters, float* w) {
  const int tid = int(threadIdx.x);
  const int G = int(gridDim.x * gridDim.y * gridDim.z);
  const int c = int(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
  __syncthreads();  // the CTA's partials are written
  if (tid == 0) {
    __threadfence();
    atomicAdd(grid_counters, 1);
    const uint64_t t0 = globaltimer_ns();
    while (ld_acquire_gpu(grid_counters) < G) {
      __nanosleep(32);
      // A grid that cannot be resident at once would wait forever: fail loudly instead.
      if (globaltimer_ns() - t0 > 10'000'000'000ull) __trap();
    }
  }
  __syncthreads();
  MLA_TRACE(kTraceArrived);
  for (int row = c; row < rows_total; row += G) {
    if (tid < 32) {
      const float row_lse = split_weights<true>(ws_lse, splits, rows_total, row, w, tid);
      if (tid == 0) w[kMaxSplits] = row_lse;
    }
    __syncthreads();
    merge_columns<2, true>(ws_o, w, splits, rows_total, row, 2 * tid, o, o_f32);
    if (tid == 0 && lse) lse[row] = w[kMaxSplits];
    __syncthreads();  // w is the next row's
  }
  if (tid == 0 && atomicAdd(grid_counters + 1, 1) == G - 1) {
    atomicExch(grid_counters, 0);
    atomicExch(grid_counters + 1, 0);
  }
  MLA_TRACE(kTraceMerged);
}

// The see-saw pointers and this thread's rows for one unit (row tile cw.row0 of a request).
template <bool kFp8>
__device__ __forceinline__ Seesaw<kFp8> seesaw_of(const KParams& p, const CtaWork& cw, uint32_t sbase, int tid) {
  Seesaw<kFp8> ss{p, cw};
  ss.sQ = sbase + kOffQ;
  ss.sK[0] = sbase + kOffK0;
  ss.sK[1] = sbase + kOffK1;
  ss.sP0 = sbase + kOffP0;
  ss.sP1 = ss.sQ + 8 * kChunkBytes;
  ss.sM = sbase + kOffM;
  ss.sA0 = sbase + kOffA0;
  ss.sA1 = sbase + kOffA1;
  ss.bar = sbase + kOffBar;
  ss.wt = tid & 127;
  ss.wi = (tid >> 5) & 3;
  ss.lane = tid & 31;
  tile_rows_of_thread(p, cw, ss.wi, ss.lane, ss.rr, ss.lim);
  return ss;
}

// One unit's KV tiles [cw.t_begin, cw.t_end) → this warpgroup's half of O (o, unnormalized), the
// rows' running max m (log2 units; fp8: P's 2^15 taken out) and their whole sums lt. ph: the parity
// this warpgroup's buffer's barriers are at (warpgroup 0 waits on buffer 0 only, 1 on buffer 1);
// the pieces before it in the CTA completed phases on them. Returns the parity after this piece.
// The caller initialized the barriers and, after an earlier piece, synchronized the CTA. (Issuing
// the next piece's Q and first tiles once a piece's products end measured 0.5-1 % slower: NOTES.)
template <bool kFp8, bool kGeneral>
__device__ __forceinline__ int seesaw_piece(const Seesaw<kFp8>& ss, const KParams& p, const CtaWork& cw,
                                            uint32_t sbase, int ph, float (&o)[128], float (&m)[2],
                                            float (&lt)[2]) {
  const int tid = threadIdx.x, wg = tid >> 7;
  const int t_begin = cw.t_begin, t_end = cw.t_end;

  // ---- prologue: the running max, Q, the first two tiles; Q's RoPE columns → registers
  if (tid < 64) st_shared_f32(ss.sM + tid * 4, -INFINITY);
  load_q_tile(p, cw, ss.sQ, tid);
  cp_async_commit();
  __syncthreads();  // barriers initialized
  if (t_begin < t_end) {
    if (wg == 0) {
      ss.template load<0, 4>(0, t_begin);
      if (t_begin + 1 < t_end) ss.template load<0, 4>(1, t_begin + 1);
    } else {
      ss.template load<4, 9>(0, t_begin);
      if (t_begin + 1 < t_end) ss.template load<4, 9>(1, t_begin + 1);
    }
  }
  cp_async_wait<0>();  // Q (the tiles' copies are in no commit group)
  fence_proxy_async();
  __syncthreads();
  if constexpr (kFp8) {
    q_to_f16(ss.sQ, sbase + kOffQScale, tid);
    fence_proxy_async();
    __syncthreads();
  }
  Seesaw<kFp8> sw = ss;  // the fp8 row scales are this piece's (its Q's)
  if constexpr (kFp8) {
#pragma unroll
    for (int h = 0; h < 2; ++h) sw.sc[h] = p.scale_log2 * ld_shared_f32(sbase + kOffQScale + ss.rr[h] * 4);
  }
  uint32_t q8[4][4];  // Q[:, 512 + 16k, +16) as A fragments
#pragma unroll
  for (int k = 0; k < 4; ++k)
    ldmatrix_x4(q8[k], sw.sQ + 8 * kChunkBytes + swz128(16 * sw.wi + (sw.lane & 15), 2 * k + (sw.lane >> 4)));
  __syncthreads();  // Q's chunk 8 now holds P1
  MLA_TRACE(kTraceQ);

#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float s[32];  // S of this warpgroup's current tile
  float l[2] = {0.f, 0.f};
  if (t_begin < t_end) {
    if (wg == 0) {
      sw.template qk<0, 4, 0>(s, 0, ph, q8, true);
      sw.template qk<4, 9, 0>(s, 0, ph, q8, false);
    } else if (t_begin + 1 < t_end) {
      sw.template qk<4, 9, 1>(s, 1, ph, q8, true);
      sw.template qk<0, 4, 1>(s, 1, ph, q8, false);
    }
    wgmma_wait<0>();
    reg_fence(s);
  }
  MLA_TRACE(kTraceFirstS);

  // ---- the pairs of tiles
  for (int t = t_begin; t < t_end; t += 2) {
    const int ahead = t_end - 1 - t, phase_next = ((((t - t_begin) >> 1) + 1) & 1) ^ ph;
    if constexpr (kGeneral) {
      if (wg == 0) sw.template wg0_pair<kAheadAny>(t, ahead, phase_next, o, s, l, q8);
      else sw.template wg1_pair<kAheadAny>(t, ahead, phase_next, o, s, l, q8);
    } else if (wg == 0) {
      if (ahead >= 3) sw.template wg0_pair<3>(t, 3, phase_next, o, s, l, q8);
      else if (ahead == 2) sw.template wg0_pair<2>(t, 2, phase_next, o, s, l, q8);
      else if (ahead == 1) sw.template wg0_pair<1>(t, 1, phase_next, o, s, l, q8);
      else sw.template wg0_pair<0>(t, 0, phase_next, o, s, l, q8);
    } else {
      if (ahead >= 3) sw.template wg1_pair<3>(t, 3, phase_next, o, s, l, q8);
      else if (ahead == 2) sw.template wg1_pair<2>(t, 2, phase_next, o, s, l, q8);
      else if (ahead == 1) sw.template wg1_pair<1>(t, 1, phase_next, o, s, l, q8);
      else sw.template wg1_pair<0>(t, 0, phase_next, o, s, l, q8);
    }
#ifdef MLA_SEESAW_TRACE
    if (((t - t_begin) >> 1) < kTracePairs) MLA_TRACE(kTracePair0 + ((t - t_begin) >> 1));
#endif
  }

  // ---- epilogue: both warpgroups' sums and the final max
  const uint32_t sL = sbase + kOffL;
  __syncthreads();  // sL is P0's place: WG1's last product may read P0 until here
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    if ((sw.lane & 3) == 0) st_shared_f32(sL + (wg * 64 + sw.rr[h]) * 4, l[h]);
  }
  __syncthreads();
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    m[h] = ld_shared_f32(sw.sM + sw.rr[h] * 4) - (kFp8 ? float(kPScaleLog2) : 0.f);  // fp8: l is Σ P·2^15
    lt[h] = ld_shared_f32(sL + sw.rr[h] * 4) + ld_shared_f32(sL + (64 + sw.rr[h]) * 4);
  }
  // Buffer 0 took the tiles t_begin, t_begin + 2, …; buffer 1 the others: one phase a tile.
  const int n = t_end - t_begin;
  return ph ^ ((wg == 0 ? (n + 1) >> 1 : n >> 1) & 1);
}

// The CTA's 18 chunk barriers: [buffer][chunk], 128 arrivals (the loading warpgroup's threads).
__device__ __forceinline__ void init_chunk_barriers(uint32_t bar) {
  if (threadIdx.x == 0) {
    for (int i = 0; i < 18; ++i) mbar_init(bar + 8 * i, 128);
    fence_mbarrier_init();
  }
}

// One CTA of the grid (row tiles, splits, requests), 256 threads, kSmemBytes dynamic smem, one CTA
// per SM. kGeneral: one pair body for every pair, which tiles exist decided at run time; else a body
// specialized for each count of tiles ahead (fewer instructions a pair, four times the code).
// kMerge: the split partials merged in the grid (merge_in_grid), no combine kernel after it.
template <bool kFp8, bool kGeneral, bool kMerge>
__device__ __forceinline__ void seesaw_cta(const KParams& p, int* grid_counters) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t sbase = (smem_u32(smem_raw) + 1023u) & ~1023u;
  float* merge_w = reinterpret_cast<float*>(smem_raw + (sbase - smem_u32(smem_raw)) + kOffK0);
  const int tid = threadIdx.x, wg = tid >> 7;
  MLA_TRACE(kTraceEntry);
  pdl_launch_dependents();  // the combine's CTAs may queue up (they wait for this grid's end)
  pdl_wait();  // launched by gpu::launch: every kernel before it in the stream has completed
  CtaWork cw;
  if (!cta_work(p, kRows, cw)) {
    if constexpr (kMerge) merge_in_grid(p.ws_o, p.ws_lse, p.splits, p.rows_total, p.o, p.o_f32, p.lse, grid_counters, merge_w);
    return;
  }
  MLA_TRACE(kTraceWork);
  const Seesaw<kFp8> ss = seesaw_of<kFp8>(p, cw, sbase, tid);
  init_chunk_barriers(ss.bar);
  float o[128];  // O[64 rows][256·wg, +256)
  float m[2], lt[2];
  seesaw_piece<kFp8, kGeneral>(ss, p, cw, sbase, 0, o, m, lt);
  MLA_TRACE(kTraceStore);
  store_o_rows(p, cw, o, ss.rr, m, lt, wg, ss.lane);
  MLA_TRACE(kTraceEnd);
  if constexpr (kMerge) merge_in_grid(p.ws_o, p.ws_lse, p.splits, p.rows_total, p.o, p.o_f32, p.lse, grid_counters, merge_w);
}

// ---- the persistent grid (PersistParams::parts > 0): the batch's KV tiles spread evenly over the SMs ----
// grid (row tiles x, parts y), at most one CTA an SM and no more CTAs than SMs (all resident). Which
// pieces of which units part y takes: mla_decode_parts.h. The CTAs of one part read the same KV
// tiles at about the same time (the L2 serves the other row tiles). A unit cut by part boundaries:
// each later part's piece (that part's first) stores its normalized f32 partial and log2-unit LSE in
// its CTA's workspace slot and raises its CTA's flag; the part holding the unit's first tiles (its
// last piece) waits for those flags, merges the partials (merge_head) and writes the rows. A part
// therefore never waits before its first piece is out, and waits run only towards later parts.

// The sum of v over the CTA's 256 threads, on every thread; red: 8 long longs of shared memory.
__device__ __forceinline__ long long cta_sum(long long v, long long* red) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(0xffffffffu, v, d);
  __syncthreads();  // red's last readers are done
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  long long s = 0;
#pragma unroll
  for (int i = 0; i < kThreads / 32; ++i) s += red[i];
  return s;
}

struct PartStart {
  long long a, b, n;  // the part's positions [a, b) of the n in all
  int r;              // the first request it meets
  long long pos;      // that request's first position
};

// Part `part` of `parts`: its range and its first request: the first r with P_r + n_r > a, or
// n_r = 0 and P_r = a (P_r: the positions before request r; true from that r on, as P grows).
__device__ PartStart part_start(const KParams& p, int requests, int part, int parts, long long* red) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  PartStart ps;
  long long n = 0;
  for (int r = tid; r < requests; r += kThreads) n += parts_tiles(__ldg(p.k_len + r));
  ps.n = cta_sum(n, red);
  ps.a = part_begin(ps.n, part, parts);
  ps.b = part_begin(ps.n, part + 1, parts);
  ps.r = 0;
  ps.pos = 0;
  long long carry = 0;  // positions of the chunks before
  for (int base = 0; base < requests; base += kThreads) {
    const int r = base + tid;
    const long long nr = r < requests ? parts_tiles(__ldg(p.k_len + r)) : 0;
    long long inc = nr;  // inclusive scan over the warp, then over the warps
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const long long y = __shfl_up_sync(0xffffffffu, inc, d);
      if (lane >= d) inc += y;
    }
    __syncthreads();
    if (lane == 31) red[warp] = inc;
    __syncthreads();
    long long before = 0, chunk = 0;
#pragma unroll
    for (int i = 0; i < kThreads / 32; ++i) {
      before += i < warp ? red[i] : 0;
      chunk += red[i];
    }
    const long long pr = carry + before + inc - nr;
    const bool met = r < requests && part_reached(pr, nr, ps.a);
    const bool passed = r < requests && !met;
    const long long counts = cta_sum((passed ? 1ll : 0ll) | (met ? 1ll << 32 : 0ll), red);
    ps.r += int(counts & 0xffffffffll);
    ps.pos += cta_sum(passed ? nr : 0, red);
    carry += chunk;
    if (counts >> 32) break;  // the first request met is in this chunk
  }
  return ps;
}

// Rows of this thread of a unit's partial: o / l (normalized, f32) and the log2-unit LSE, to slot.
__device__ __forceinline__ void store_partial(const KParams& p, int slot, const float (&o)[128], const int (&rr)[2],
                                              const float (&m)[2], const float (&l)[2], int wg, int lane) {
  const int c0 = 256 * wg + 2 * (lane & 3);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float inv = l[h] > 0.f ? 1.f / l[h] : 0.f;
    float* orow = p.ws_o + (size_t(slot) * kRows + rr[h]) * kDv + c0;
#pragma unroll
    for (int j = 0; j < 32; ++j)
      __stcg(reinterpret_cast<float2*>(orow + 8 * j), make_float2(o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv));
    if (wg == 0 && (lane & 3) == 0) p.ws_lse[size_t(slot) * kRows + rr[h]] = l[h] > 0.f ? m[h] + log2f(l[h]) : -INFINITY;
  }
}

// Waits for a slot's flag (set once its partial is written), then clears it for the next launch.
__device__ __forceinline__ void take_flag(int* flag) {
  if (threadIdx.x == 0) {
    const uint64_t t0 = globaltimer_ns();
    while (ld_acquire_gpu(flag) == 0) {
      __nanosleep(64);
      // A grid that cannot be resident at once would wait forever: fail loudly instead.
      if (globaltimer_ns() - t0 > 10'000'000'000ull) __trap();
    }
    *flag = 0;
  }
  __syncthreads();
}

// The unit's first piece: its own sums (o unnormalized, m, l; log2 units) merged with the partials of
// the later parts' pieces (slots first_slot, …, + count − 1) in that order, by LSE; the rows then
// written as store_o_rows writes a whole unit. The own rows go through shared memory (the KV
// buffers, free after the piece; [64][kMergeStride] f32, the LSEs in sA0's place), so the
// accumulators are dead before the partials come: merged in registers they spill. A warp takes 8
// rows, a lane 4 columns in each 128 (16-byte loads). o is kept normalized: merging a partial of LSE
// x into o of LSE L weighs o by 2^(L − M) / Σ and the partial by 2^(x − M) / Σ (M the larger, Σ the
// two weights); a piece without keys (LSE −inf) weighs 0.
constexpr int kMergeStride = kDv + 8;  // floats a row: 8 banks between rows
static_assert(kRows * kMergeStride * 4 <= 2 * kTileBytes, "the merge's rows exceed the KV buffers");

__device__ __forceinline__ void merge_head(const KParams& p, int* flags, const CtaWork& cw, int first_slot, int count,
                                           const float (&o)[128], const int (&rr)[2], const float (&m)[2],
                                           const float (&l)[2], uint32_t sbase, int wg, int lane) {
  const uint32_t sO = sbase + kOffK0, sLse = sbase + kOffA0;
  const int c0 = 256 * wg + 2 * (lane & 3);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float inv = l[h] > 0.f ? 1.f / l[h] : 0.f;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      const uint32_t at = sO + (rr[h] * kMergeStride + c0 + 8 * j) * 4;
      st_shared_f32(at, o[4 * j + 2 * h] * inv);
      st_shared_f32(at + 4, o[4 * j + 2 * h + 1] * inv);
    }
    if (wg == 0 && (lane & 3) == 0) st_shared_f32(sLse + rr[h] * 4, l[h] > 0.f ? m[h] + log2f(l[h]) : -INFINITY);
  }
  const int tid = int(threadIdx.x), warp = tid >> 5;
  __syncthreads();  // the own rows are in shared memory
  for (int k = 0; k < count; ++k) take_flag(flags + first_slot + k);
#pragma unroll 1
  for (int i = 0; i < 8; ++i) {  // row 8·warp + i
    const int row = 8 * warp + i;
    float lse = ld_shared_f32(sLse + row * 4);
    float4 acc[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const uint4 v = ld_shared_v4(sO + (row * kMergeStride + 128 * q + 4 * (tid & 31)) * 4);
      acc[q] = make_float4(__uint_as_float(v.x), __uint_as_float(v.y), __uint_as_float(v.z), __uint_as_float(v.w));
    }
    for (int k = 0; k < count; ++k) {
      const int slot = first_slot + k;
      const float other = __ldcg(p.ws_lse + size_t(slot) * kRows + row);
      const float mx = fmaxf(lse, other), base = mx == -INFINITY ? 0.f : mx;
      const float wa = ex2(lse - base), wb = ex2(other - base), sum = wa + wb;
      const float inv = sum > 0.f ? 1.f / sum : 0.f, fa = wa * inv, fb = wb * inv;
      const float* orow = p.ws_o + (size_t(slot) * kRows + row) * kDv + 4 * (tid & 31);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float4 v = __ldcg(reinterpret_cast<const float4*>(orow + 128 * q));
        acc[q] = make_float4(acc[q].x * fa + v.x * fb, acc[q].y * fa + v.y * fb, acc[q].z * fa + v.z * fb,
                             acc[q].w * fa + v.w * fb);
      }
      lse = sum > 0.f ? base + log2f(sum) : -INFINITY;
    }
    const int prow = cw.row0 + row;
    if (prow >= cw.rows) continue;
    const size_t grow = size_t(cw.q_start) * p.H + prow;  // row of o [T·H, 512]
    const float f = lse == -INFINITY ? 0.f : p.out_scale;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int col = 128 * q + 4 * (tid & 31);
      const float4 v = make_float4(acc[q].x * f, acc[q].y * f, acc[q].z * f, acc[q].w * f);
      if (p.o_f32) {
        *reinterpret_cast<float4*>(static_cast<float*>(p.o) + grow * kDv + col) = v;
      } else {
        *reinterpret_cast<uint2*>(static_cast<__nv_bfloat16*>(p.o) + grow * kDv + col) =
            make_uint2(pack_bf16(v.x, v.y), pack_bf16(v.z, v.w));
      }
    }
    if ((tid & 31) == 0 && p.lse) p.lse[grow] = lse * 0.69314718055994531f;
  }
}

// The piece loop's state in shared memory (kOffLoop), not in registers: the pairs hold ~250 of
// their 255 (values kept across them spill, and the spills serialize the wgmma pipeline).
// Byte offsets: the next request, the barrier parities of warpgroups 0 and 1, its first position,
// the part's range [a, b) and the positions in all.
enum PieceLoop : uint32_t { kLoopR = 0, kLoopPh = 4, kLoopPos = 16, kLoopA = 24, kLoopB = 32, kLoopN = 40 };

// The next unit part [a, b) of row tile rt takes, from request r at position pos on (requests
// without this row tile skipped): its CtaWork in w, r and pos moved to its request; false when the
// part passes its range first.
__device__ __forceinline__ bool next_unit(const KParams& p, int requests, int& r, long long& pos, long long a,
                                          long long b, bool last_part, int rt, CtaWork& w) {
  for (; r < requests; ++r) {
    const int k_len = __ldg(p.k_len + r);
    const long long nr = parts_tiles(k_len);
    if (part_passed(pos, nr, b, last_part)) return false;
    w.q_len = __ldg(p.q_len + r);
    w.rows = w.q_len * p.H;
    w.row0 = rt * kRows;
    if (w.row0 < w.rows) {
      const DecodePiece piece = part_piece(pos, nr, a, b);
      w.k_len = k_len;
      w.q_start = __ldg(p.q_start + r);
      w.slots = p.slots + __ldg(p.k_start + r);
      w.t_begin = piece.t_begin;
      w.t_end = piece.t_end;
      return true;
    }
    pos += nr;
  }
  return false;
}

template <bool kFp8>
__device__ __forceinline__ void seesaw_persistent_cta(const KParams& p, const PersistParams& q) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t sbase = (smem_u32(smem_raw) + 1023u) & ~1023u, sl = sbase + kOffLoop;
  long long* red = reinterpret_cast<long long*>(smem_raw + (sbase - smem_u32(smem_raw)) + kOffK1);
  const int tid = threadIdx.x, wg = tid >> 7;
  const int rt = int(blockIdx.x), part = int(blockIdx.y), parts = int(gridDim.y);
  pdl_launch_dependents();
  pdl_wait();
  {
    const PartStart ps = part_start(p, q.requests, part, parts, red);
    if (tid == 0) {
      st_shared_u32(sl + kLoopR, uint32_t(ps.r));
      st_shared_u32(sl + kLoopPh, 0u);
      st_shared_u32(sl + kLoopPh + 4, 0u);
      st_shared_u64(sl + kLoopPos, uint64_t(ps.pos));
      st_shared_u64(sl + kLoopA, uint64_t(ps.a));
      st_shared_u64(sl + kLoopB, uint64_t(ps.b));
      st_shared_u64(sl + kLoopN, uint64_t(ps.n));
    }
  }
  init_chunk_barriers(sbase + kOffBar);
  __syncthreads();
  for (;;) {
    // This piece's unit, from the state.
    int r = int(ld_shared_u32(sl + kLoopR));
    long long pos = (long long)ld_shared_u64(sl + kLoopPos);
    const long long a = (long long)ld_shared_u64(sl + kLoopA), b = (long long)ld_shared_u64(sl + kLoopB);
    const bool last_part = part == parts - 1;
    CtaWork cw;
    if (!next_unit(p, q.requests, r, pos, a, b, last_part, rt, cw)) break;
    __syncthreads();  // every thread read the state
    if (tid == 0) {  // the state after this piece: its request, the position after its unit
      st_shared_u32(sl + kLoopR, uint32_t(r + 1));
      st_shared_u64(sl + kLoopPos, uint64_t(pos + parts_tiles(cw.k_len)));
    }
    const Seesaw<kFp8> ss = seesaw_of<kFp8>(p, cw, sbase, tid);
    float o[128];
    float m[2], lt[2];
    const int ph = seesaw_piece<kFp8, true>(ss, p, cw, sbase, int(ld_shared_u32(sl + kLoopPh + 4 * wg)), o, m, lt);
    // What the piece is (from the unit again: nothing of it stayed in registers over the pairs).
    const int slot = rt * parts + part;
    const long long tiles = parts_tiles(cw.k_len);
    const PieceKind kind = part_piece(0, tiles, cw.t_begin, cw.t_end).kind;  // (in the unit's own positions)
    if (kind == PieceKind::kWhole) {
      store_o_rows(p, cw, o, ss.rr, m, lt, wg, ss.lane);  // the whole unit
    } else if (kind == PieceKind::kPartial) {  // a later part's piece of a cut unit: the partial, then the flag
      store_partial(p, slot, o, ss.rr, m, lt, wg, ss.lane);
      __syncthreads();  // every row of the partial is written
      if (tid == 0) {
        __threadfence();
        atomicExch(q.flags + slot, 1);
      }
    } else {  // the unit's first tiles: merge the later parts' partials (the state's position is past the unit)
      const int count = parts_after((long long)ld_shared_u64(sl + kLoopN), part, parts,
                                    (long long)ld_shared_u64(sl + kLoopPos));
      merge_head(p, q.flags, cw, slot + 1, count, o, ss.rr, m, lt, sbase, wg, ss.lane);
    }
    __syncthreads();  // every thread read the parities; the piece's shared memory reads are done
    if ((tid & 127) == 0) st_shared_u32(sl + kLoopPh + 4 * wg, uint32_t(ph));
    __syncthreads();
  }
}

template <bool kFp8, bool kGeneral>
__global__ void __launch_bounds__(kThreads, 1) mla_seesaw_kernel(const KParams p) {
  seesaw_cta<kFp8, kGeneral, false>(p, nullptr);
}
template <bool kFp8>
__global__ void __launch_bounds__(kThreads, 1) mla_seesaw_merge_kernel(const KParams p, int* grid_counters) {
  seesaw_cta<kFp8, true, true>(p, grid_counters);
}
template <bool kFp8>
__global__ void __launch_bounds__(kThreads, 1) mla_seesaw_persistent_kernel(const KParams p, const PersistParams q) {
  seesaw_persistent_cta<kFp8>(p, q);
}

}  // namespace

#ifdef MLA_SEESAW_TRACE
int seesaw_trace_take(unsigned long long* out) {
  take_trace(g_trace, out);
  return kTraceCtas;
}
#endif

bool launch_seesaw(const KParams& kp, dim3 grid, cudaStream_t stream, bool fp8, int split_tiles,
                   int* grid_counters, const PersistParams& pp) {
  // A CTA of few tiles runs each pair body about once and waits on its instructions: one run-time
  // body (89 KB of code against 152) is faster for split CTAs of up to 16 tiles (h128 b1 s_k 16384,
  // 4 tiles: -2.1 us; h128 b16 s_k 4096, 16 tiles: -1.5 us) and 1-5 % slower for more tiles or a
  // whole request a CTA (bench/NOTES.md, "One pair body for split CTAs").
  const bool general = kp.splits > 1 && split_tiles <= 16;
  // The in-grid merge waits for every CTA of the grid: only a grid the device holds at once (one
  // CTA an SM) may take it, and only with at most one row a CTA to merge: a CTA merges its rows one
  // after another (h128 b16 s_k 4096, 16 rows a CTA: 62 -> 78 us on an H100; h128 b1 s_k 16384,
  // one row a CTA: 32.8 -> 31.5; bench/NOTES.md, "Split partials merged by their own grid").
  const int64_t ctas = int64_t(grid.x) * grid.y * grid.z;
  const bool merge = general && grid_counters && ctas <= device_sms() && kp.rows_total <= ctas;
  static bool smem_set[8][64] = {};
  auto go = [&](auto kernel, bool (&set)[64], auto... extra) {
    set_smem_limit_once(kernel, kSmemBytes, set);
    gpu::launch(kernel, grid, kThreads, kSmemBytes, stream, kp, extra...);
  };
  if (pp.parts > 0) {  // the persistent grid (mla_fast_schedule: no more CTAs than SMs, all resident)
    if (fp8) go(mla_seesaw_persistent_kernel<true>, smem_set[7], pp);
    else go(mla_seesaw_persistent_kernel<false>, smem_set[6], pp);
    return false;
  }
  if (merge) {
    if (fp8) go(mla_seesaw_merge_kernel<true>, smem_set[5], grid_counters);
    else go(mla_seesaw_merge_kernel<false>, smem_set[4], grid_counters);
  } else if (fp8) {
    if (general) go(mla_seesaw_kernel<true, true>, smem_set[3]);
    else go(mla_seesaw_kernel<true, false>, smem_set[1]);
  } else {
    if (general) go(mla_seesaw_kernel<false, true>, smem_set[2]);
    else go(mla_seesaw_kernel<false, false>, smem_set[0]);
  }
  return merge;
}

}  // namespace mla::cuda::mla_decode
