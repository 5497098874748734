// moe.cu — the shared MoE kernels (CUDA and HIP from this one source): the router's logits (fused
// with the routing up to 64 tokens, a tiled kernel with the same bits per row up to 256), the
// routing (one block per token, in double like route_tokens so the choice is the same), the plan
// grouping slots by expert into row tiles, the portable grouped GEMMs (plain CUDA, no tensor
// cores: the ROCm platform's path and every dtype's fallback) and the combine. No host round trip:
// grids come from host-known bounds, the routing-dependent counts stay on the device.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "platform/gpu/elem.cuh"
#include "platform/gpu/gpu_check.h"
#include "platform/gpu/launch.cuh"
#include "platform/gpu/moe.h"
#include "platform/gpu/norm.cuh"

namespace mla::gpu {
namespace {

constexpr int kRouteThreads = 256;

// Rank of v[i] in the order route_tokens' top_k uses: larger first, ties the lower index first.
__device__ __forceinline__ int rank_of(const double* v, int n, int i) {
  const double x = v[i];
  int r = 0;
#pragma unroll 8
  for (int j = 0; j < n; ++j) r += (v[j] > x || (v[j] == x && j < i)) ? 1 : 0;
  return r;
}

// Shared memory of a token's routing: scores[E], choice[E], group[G] (double), keep[G], chosen[K]
// (int), rounded up to 8 bytes.
__host__ __device__ inline size_t route_smem_bytes(const MoeRouteParams& p) {
  return (sizeof(double) * size_t(2 * p.E + p.n_group) + sizeof(int) * size_t(p.n_group + p.K) + 7) / 8 * 8;
}

// The routing of token t from its logits l[E], by the whole block (moe_route_k's body).
__device__ void route_token(const MoeRouteParams& p, int t, const float* l, double* sm) {
  const int E = p.E, G = p.n_group, K = p.K, tid = threadIdx.x;
  double* scores = sm;
  double* choice = scores + E;
  double* group = choice + E;
  int* keep = reinterpret_cast<int*>(group + G);
  int* chosen = keep + G;
  __shared__ double red;
  for (int k = tid; k < K; k += blockDim.x) chosen[k] = -1;  // stays −1 only under NaN logits
  if (p.sigmoid) {
    for (int e = tid; e < E; e += blockDim.x) scores[e] = 1.0 / (1.0 + exp(-double(l[e])));
    __syncthreads();
  } else {
    // The host's max: l[0], then each later l[e] above it (NaN never is). So the maximum of the
    // values that are not NaN, unless l[0] is NaN. Each thread, then the warps, then the 8 warp
    // maxima (a maximum is the same whatever the order; ±0 only differ in sign, and exp(l − ±0)
    // is the same).
    __shared__ float warp_max[kRouteThreads / 32];
    float m = -INFINITY;
    for (int e = tid; e < E; e += blockDim.x) m = l[e] > m ? l[e] : m;
    for (int o = 16; o > 0; o >>= 1) {
      const float u = shfl_xor(m, o);
      m = u > m ? u : m;
    }
    if ((tid & 31) == 0) warp_max[tid >> 5] = m;
    __syncthreads();
    if (tid == 0) {
      float mm = l[0];
      for (int w = 0; w < int(blockDim.x >> 5); ++w) mm = warp_max[w] > mm ? warp_max[w] : mm;
      red = double(mm);
    }
    __syncthreads();
    for (int e = tid; e < E; e += blockDim.x) scores[e] = exp(double(l[e]) - red);
    __syncthreads();
    if (tid == 0) {  // in index order, as the host sums (the loads unrolled ahead of the adds)
      double sum = 0;
#pragma unroll 8
      for (int e = 0; e < E; ++e) sum += scores[e];
      red = sum;
    }
    __syncthreads();
    for (int e = tid; e < E; e += blockDim.x) scores[e] /= red;
    __syncthreads();
  }
  for (int e = tid; e < E; e += blockDim.x) choice[e] = scores[e] + (p.bias ? double(p.bias[e]) : 0.0);
  __syncthreads();
  if (p.method != MoeTopk::Greedy) {
    const int per = E / G;
    for (int g = tid; g < G; g += blockDim.x) {
      const double* v = choice + g * per;
      if (p.method == MoeTopk::NoauxTc) {  // the sum of the group's top-2
        double m1 = -INFINITY, m2 = -INFINITY;
        for (int i = 0; i < per; ++i) {
          if (v[i] > m1) m2 = m1, m1 = v[i];
          else if (v[i] > m2) m2 = v[i];
        }
        group[g] = m1 + (per > 1 ? m2 : 0.0);
      } else {  // the group's max
        double m = v[0];
        for (int i = 1; i < per; ++i) m = v[i] > m ? v[i] : m;
        group[g] = m;
      }
    }
    __syncthreads();
    for (int g = tid; g < G; g += blockDim.x) keep[g] = rank_of(group, G, g) < p.topk_group;
    __syncthreads();
    for (int e = tid; e < E; e += blockDim.x)
      if (!keep[e / per]) choice[e] = p.method == MoeTopk::NoauxTc ? -INFINITY : 0.0;  // as transformers masks
    __syncthreads();
  }
  for (int e = tid; e < E; e += blockDim.x) {
    const int r = rank_of(choice, E, e);
    if (r < K) chosen[r] = e;
  }
  __syncthreads();
  if (tid == 0) {
    double sum = 0;
    for (int k = 0; k < K; ++k) sum += chosen[k] >= 0 ? scores[chosen[k]] : 0.0;
    for (int k = 0; k < K; ++k) {
      const int e = chosen[k];
      double w = e >= 0 ? scores[e] : 0.0;
      if (p.norm_topk_prob && p.sigmoid) w /= sum + 1e-20;
      p.expert[size_t(t) * K + k] = e;
      p.weight[size_t(t) * K + k] = float(w * p.routed_scaling_factor);
    }
  }
}

__global__ void moe_route_k(MoeRouteParams p) {
  pdl_enter();
  extern __shared__ double sm[];
  route_token(p, blockIdx.x, p.logits + size_t(blockIdx.x) * p.E, sm);
}

// One 4-wide chunk of a router logit's sum, for both router kernels. The FMAs are spelled out: left
// to the compiler, a[0]·b.x + a[1]·b.y contracted into fma(a0, bx, a1·by) in one kernel and
// fma(a1, by, a0·bx) in the other, and the two kernels' logits differed in the last bit.
__device__ __forceinline__ float dot4(const float (&a)[4], float4 b) {
  return __fmaf_rn(a[3], b.w, __fmaf_rn(a[2], b.z, __fmaf_rn(a[1], b.y, __fmul_rn(a[0], b.x))));
}
// Router weights 4j .. 4j + 3 of a row, f32 or bf16 (widened exactly: the same sums either way).
template <bool kWBf16>
__device__ __forceinline__ float4 router_w4(const void* row, int j) {
  if constexpr (!kWBf16) return static_cast<const float4*>(row)[j];
  else {
    const uint2 u = static_cast<const uint2*>(row)[j];
    return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u), __uint_as_float(u.y << 16),
                       __uint_as_float(u.y & 0xffff0000u));
  }
}
// The router's logits and the routing in one launch: block (t, e) sums x[t] · w[e] (each thread
// its 4-wide chunks in index order, then block_sum's fixed tree), and the last of token t's blocks
// to finish routes it from the logits the others wrote. That block sets the token's counter back to
// zero for the next launch.
template <bool kWBf16>
__global__ void __launch_bounds__(kRouteThreads)
    moe_router_k(const void* x, Elem xe, const void* w, int hidden, bool vec, MoeRouteParams p, unsigned* done) {
  pdl_enter();
  extern __shared__ double sm[];
  __shared__ bool last;
  const int t = blockIdx.x, e = blockIdx.y;
  float* logits = const_cast<float*>(p.logits);
  const size_t xrow = size_t(t) * size_t(hidden), wrow = size_t(e) * size_t(hidden);
  float acc = 0.f;
  if (vec) {  // hidden a multiple of 4, w rows 16-byte (f32) or 8-byte (bf16) aligned: all loads issued first
    const void* wr = static_cast<const char*>(w) + wrow * (kWBf16 ? 2 : 4);
    constexpr int kIn = 4;  // chunks a thread loads before it adds
    for (int j0 = threadIdx.x; j0 < hidden / 4; j0 += kIn * kRouteThreads) {
      float4 b[kIn];
      float a[kIn][4];
#pragma unroll
      for (int u = 0; u < kIn; ++u) {
        const int j = j0 + u * kRouteThreads;
        b[u] = j < hidden / 4 ? router_w4<kWBf16>(wr, j) : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int c = 0; c < 4; ++c) a[u][c] = j < hidden / 4 ? load_elem(x, xe, xrow + size_t(4 * j + c)) : 0.f;
      }
#pragma unroll
      for (int u = 0; u < kIn; ++u) acc += dot4(a[u], b[u]);
    }
  } else {
    for (int k = threadIdx.x; k < hidden; k += kRouteThreads)
      acc += load_elem(x, xe, xrow + k) * load_elem(w, kWBf16 ? Elem::BF16 : Elem::F32, wrow + k);
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) {
    logits[size_t(t) * p.E + e] = acc;
    __threadfence();
    last = atomicAdd(&done[t], 1u) == gridDim.y - 1;
    if (last) done[t] = 0;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  // The token's logits into shared memory past the routing's arrays (volatile: past the L1).
  float* l = reinterpret_cast<float*>(reinterpret_cast<char*>(sm) + route_smem_bytes(p));
  const volatile float* src = logits + size_t(t) * p.E;
  for (int i = threadIdx.x; i < p.E; i += blockDim.x) l[i] = src[i];
  __syncthreads();
  route_token(p, t, l, sm);
}

// The router's logits for larger batches (vec layouts only), each logit with moe_router_k's bits.
// Block (token tile, expert tile) of kRouteThreads threads: thread v sums, for each of the tile's
// kLogitTokens × kLogitExperts logits, what moe_router_k's thread v sums for that logit (its chunks
// v, v + kRouteThreads, … in order; the zero chunks past the row change nothing, a thread's sum never
// being −0), then block_sum's two stages per logit (the warp butterfly, then the 8 warp sums in its
// second-stage tree). A thread's x and weight chunks serve the whole tile, so a weight row streams
// once per token tile, an x row once per expert tile.
constexpr int kLogitTokens = 8, kLogitExperts = 8, kLogitTile = kLogitTokens * kLogitExperts;
static_assert(kRouteThreads == 256 && kLogitTile <= kRouteThreads, "block_sum's second stage over 8 warps");
template <bool kBf16, bool kWBf16>
__global__ void __launch_bounds__(kRouteThreads)
    moe_logits_k(const void* x, const void* w, int hidden, int T, int E, float* logits) {
  pdl_enter();
  using XChunk = std::conditional_t<kBf16, uint2, float4>;  // 4 values of x
  __shared__ float part[kLogitTile][kRouteThreads / 32];
  const int v = threadIdx.x, lane = v & 31;
  const int t0 = blockIdx.x * kLogitTokens, nt = min(kLogitTokens, T - t0);
  const int e0 = blockIdx.y * kLogitExperts, ne = min(kLogitExperts, E - e0);
  const int chunks = hidden / 4;
  const XChunk* x4 = static_cast<const XChunk*>(x) + size_t(t0) * size_t(chunks);
  const size_t wrow = size_t(hidden) * (kWBf16 ? 2 : 4);
  const char* wt = static_cast<const char*>(w) + size_t(e0) * wrow;
  float acc[kLogitTokens][kLogitExperts];
#pragma unroll
  for (int t = 0; t < kLogitTokens; ++t)
#pragma unroll
    for (int e = 0; e < kLogitExperts; ++e) acc[t][e] = 0.f;
  for (int j = v; j < chunks; j += kRouteThreads) {
    float4 b[kLogitExperts];
    XChunk xv[kLogitTokens];
#pragma unroll
    for (int e = 0; e < kLogitExperts; ++e)
      b[e] = e < ne ? router_w4<kWBf16>(wt + size_t(e) * wrow, j) : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int t = 0; t < kLogitTokens; ++t) xv[t] = t < nt ? x4[size_t(t) * chunks + j] : XChunk{};
#pragma unroll
    for (int t = 0; t < kLogitTokens; ++t) {
      float a[4];
      if constexpr (kBf16) {
        a[0] = __uint_as_float(xv[t].x << 16), a[1] = __uint_as_float(xv[t].x & 0xffff0000u);
        a[2] = __uint_as_float(xv[t].y << 16), a[3] = __uint_as_float(xv[t].y & 0xffff0000u);
      } else {
        a[0] = xv[t].x, a[1] = xv[t].y, a[2] = xv[t].z, a[3] = xv[t].w;
      }
#pragma unroll
      for (int e = 0; e < kLogitExperts; ++e) acc[t][e] += dot4(a, b[e]);
    }
  }
#pragma unroll
  for (int t = 0; t < kLogitTokens; ++t)
#pragma unroll
    for (int e = 0; e < kLogitExperts; ++e) {
      float s = acc[t][e];
      for (int o = 16; o > 0; o >>= 1) s += shfl_xor(s, o);
      if (lane == 0) part[t * kLogitExperts + e][v >> 5] = s;
    }
  __syncthreads();
  if (v < kLogitTile) {
    const int t = v / kLogitExperts, e = v % kLogitExperts;
    const float* G = part[v];
    if (t < nt && e < ne)
      logits[size_t(t0 + t) * size_t(E) + e0 + e] = ((G[0] + G[4]) + (G[2] + G[6])) + ((G[1] + G[5]) + (G[3] + G[7]));
  }
}

constexpr int kAlignThreads = 1024;
static_assert(kAlignThreads >= kMoeMaxExperts, "moe_align_k takes a thread per expert");

// Every expert's first row and tile from its row count `mine` (thread e < E holds expert e's): inclusive
// scans over the experts, a thread each (Hillis–Steele). Returns thread e's first row (0 past E).
// With `write`, the plan's offsets, tile count and tiles, in expert order, as a pass over the experts
// in order would write them. rows, tiles: [E] shared scratch.
__device__ int place_experts(int mine, int E, int bm, int* rows, int* tiles, const MoePlan& plan, bool write) {
  const int tid = threadIdx.x, my_tiles = (mine + bm - 1) / bm;
  if (tid < E) rows[tid] = mine, tiles[tid] = my_tiles;
  __syncthreads();
  for (int d = 1; d < E; d <<= 1) {
    int r = 0, t = 0;
    if (tid < E && tid >= d) r = rows[tid - d], t = tiles[tid - d];
    __syncthreads();
    if (tid < E) rows[tid] += r, tiles[tid] += t;
    __syncthreads();
  }
  int off = 0;
  if (tid < E) {
    off = rows[tid] - mine;
    const int t0 = tiles[tid] - my_tiles;
    if (write) {
      plan.offsets[tid] = off;
      for (int j = 0; j < my_tiles; ++j) plan.tiles[2 * (t0 + j)] = tid, plan.tiles[2 * (t0 + j) + 1] = off + j * bm;
      if (tid == E - 1) {
        plan.offsets[E] = rows[tid], *plan.num_tiles = tiles[tid];
        for (int j = 0; j < 4; ++j) plan.jobs[j] = 0;
      }
    }
  }
  __syncthreads();
  return off;
}

// Slots [i0, i1) counted per expert into cnt[E] (shared, zeroed here).
__device__ void count_experts(const int32_t* expert, int i0, int i1, int E, int* cnt) {
  for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
  __syncthreads();
  for (int i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
    const int e = expert[i];
    if (e >= 0 && e < E) atomicAdd(&cnt[e], 1);
  }
  __syncthreads();
}

// Slots [i0, i1) to their rows: cursor[e] (shared) is the next row of expert e.
__device__ void place_slots(const int32_t* expert, int i0, int i1, int E, int* cursor, const MoePlan& plan) {
  for (int i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
    const int e = expert[i];
    int r = -1;
    if (e >= 0 && e < E) {
      r = atomicAdd(&cursor[e], 1);
      plan.rows[r] = i;
    }
    plan.pos[i] = r;
  }
}

// One block (n ≤ kMoeAlignChunk): counts per expert, the experts' places, then each slot's row.
__global__ void __launch_bounds__(kAlignThreads) moe_align_k(const int32_t* expert, int n, int E, int bm, MoePlan plan) {
  pdl_enter();
  extern __shared__ int cnt[];  // [E] counts, [E] row ends then cursors, [E] tile ends
  int* rows = cnt + E;
  count_experts(expert, 0, n, E, cnt);
  const int off = place_experts(threadIdx.x < E ? cnt[threadIdx.x] : 0, E, bm, rows, rows + E, plan, true);
  if (threadIdx.x < E) rows[threadIdx.x] = off;  // each expert's cursor starts at its offset
  __syncthreads();
  place_slots(expert, 0, n, E, rows, plan);
}

// Many blocks, kMoeAlignChunk slots each: block b counts its slots per expert into plan.counts[b].
__global__ void __launch_bounds__(kAlignThreads) moe_count_k(const int32_t* expert, int n, int E, MoePlan plan) {
  pdl_enter();
  extern __shared__ int cnt[];  // [E]
  const int i0 = int(blockIdx.x) * int(kMoeAlignChunk);
  count_experts(expert, i0, min(n, i0 + int(kMoeAlignChunk)), E, cnt);
  for (int e = threadIdx.x; e < E; e += blockDim.x) plan.counts[size_t(blockIdx.x) * E + e] = cnt[e];
}

// Then each block: every expert's total and the slots of the blocks before it, the experts' places
// (block 0 writes them to the plan), and its own slots' rows after those of the blocks before.
__global__ void __launch_bounds__(kAlignThreads) moe_place_k(const int32_t* expert, int n, int E, int bm, MoePlan plan) {
  pdl_enter();
  extern __shared__ int cur[];  // [E] cursors, [E] row ends, [E] tile ends
  const int tid = threadIdx.x, b = int(blockIdx.x);
  int total = 0, before = 0;
  if (tid < E)
    for (int k = 0; k < int(gridDim.x); ++k) {
      const int c = plan.counts[size_t(k) * E + tid];
      total += c, before += k < b ? c : 0;
    }
  const int off = place_experts(total, E, bm, cur + E, cur + 2 * E, plan, b == 0);
  if (tid < E) cur[tid] = off + before;
  __syncthreads();
  const int i0 = b * int(kMoeAlignChunk);
  place_slots(expert, i0, min(n, i0 + int(kMoeAlignChunk)), E, cur, plan);
}

// The portable grouped GEMM: a block computes kMoeGenericRows rows × kGenN columns of one tile;
// thread (r, c) sums its products over the reduction dimension in index order (f32).
constexpr int kGenN = 64, kGenK = 32, kGenThreads = 256;
constexpr int kGenCols = kGenN * kMoeGenericRows / kGenThreads;  // columns per thread (4)

template <bool kGated>
__global__ void moe_gemm_generic_k(const void* a, Elem ae, int topk, MoePlan plan, const void* w0, const void* w1,
                                   Elem we, int64_t N, int64_t Kd, void* out, Elem oe) {
  pdl_enter();
  const int tile = blockIdx.x;
  if (tile >= *plan.num_tiles) return;
  constexpr int BM = kMoeGenericRows;
  __shared__ float As[BM][kGenK];
  __shared__ float Bs[kGated ? 2 : 1][kGenN][kGenK + 1];
  const int e = plan.tiles[2 * tile], r0 = plan.tiles[2 * tile + 1];
  const int nrows = min(BM, plan.offsets[e + 1] - r0);
  const int64_t n0 = int64_t(blockIdx.y) * kGenN;
  const int tid = threadIdx.x, r = tid / (kGenN / kGenCols), c0 = tid % (kGenN / kGenCols);
  float acc[2][kGenCols] = {};
  for (int64_t k0 = 0; k0 < Kd; k0 += kGenK) {
    for (int i = tid; i < BM * kGenK; i += kGenThreads) {
      const int rr = i / kGenK, kk = i % kGenK;
      float v = 0.f;
      if (rr < nrows && k0 + kk < Kd) {
        const int64_t row = kGated ? plan.rows[r0 + rr] / topk : r0 + rr;  // x by token, h by plan row
        v = load_elem(a, ae, size_t(row * Kd + k0 + kk));
      }
      As[rr][kk] = v;
    }
    for (int i = tid; i < kGenN * kGenK; i += kGenThreads) {
      const int nn = i / kGenK, kk = i % kGenK;
      const bool ok = n0 + nn < N && k0 + kk < Kd;
      const size_t at = size_t((int64_t(e) * N + n0 + nn) * Kd + k0 + kk);
      Bs[0][nn][kk] = ok ? load_elem(w0, we, at) : 0.f;
      if constexpr (kGated) Bs[1][nn][kk] = ok ? load_elem(w1, we, at) : 0.f;
    }
    __syncthreads();
    for (int kk = 0; kk < kGenK; ++kk) {
      const float x = As[r][kk];
#pragma unroll
      for (int j = 0; j < kGenCols; ++j) {
        acc[0][j] += x * Bs[0][c0 + j * (kGenN / kGenCols)][kk];
        if constexpr (kGated) acc[1][j] += x * Bs[1][c0 + j * (kGenN / kGenCols)][kk];
      }
    }
    __syncthreads();
  }
  if (r >= nrows) return;
#pragma unroll
  for (int j = 0; j < kGenCols; ++j) {
    const int64_t n = n0 + c0 + j * (kGenN / kGenCols);
    if (n >= N) continue;
    float v = acc[0][j];
    if constexpr (kGated) {  // the products as the activation dtype stores them, then silu · up
      const float g = round_as(v, oe), u = round_as(acc[1][j], oe);
      v = silu_times(g, u);
    }
    store_elem(out, oe, size_t(int64_t(r0 + r) * N + n), v);
  }
}

__global__ void moe_combine_k(const void* y, Elem ye, const int32_t* pos, const float* weight, int64_t T, int K,
                              int64_t hidden, void* out, Elem oe, const void* add, Elem ae) {
  pdl_enter();
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= size_t(T * hidden)) return;
  const int64_t t = int64_t(i / hidden), c = int64_t(i % hidden);
  float acc = 0.f;
  for (int k = 0; k < K; ++k) {
    const int p = pos[t * K + k];
    if (p >= 0) acc += weight[t * K + k] * load_elem(y, ye, size_t(int64_t(p) * hidden + c));
  }
  if (add) acc = round_as(acc, oe) + load_elem(add, ae, i);
  store_elem(out, oe, i, acc);
}

// The same sums for bf16 y and out, 8 columns a thread (16-byte loads and stores). Up to
// kCombineSlots slots a token, every slot's row is requested before the first is added (one round
// trip to memory instead of K in a row); the adds stay in k order.
constexpr int kCombineSlots = 8;
__global__ void moe_combine_bf16x8_k(const uint4* y, const int32_t* pos, const float* weight, int64_t T, int K,
                                     int64_t hidden8, const uint4* plus, uint4* out) {
  pdl_enter();
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= size_t(T * hidden8)) return;
  const int64_t t = int64_t(i / hidden8), c = int64_t(i % hidden8);
  float acc[8] = {};
  auto add = [&](float w, const uint4& u) {
    float v[8];
    unpack_bf16x8(u, v);
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[j] += w * v[j];
  };
  if (K <= kCombineSlots) {
    int p[kCombineSlots];
    uint4 u[kCombineSlots];
#pragma unroll
    for (int k = 0; k < kCombineSlots; ++k) p[k] = k < K ? pos[t * K + k] : -1;
#pragma unroll
    for (int k = 0; k < kCombineSlots; ++k)
      if (p[k] >= 0) u[k] = y[size_t(p[k]) * hidden8 + c];
#pragma unroll
    for (int k = 0; k < kCombineSlots; ++k)
      if (p[k] >= 0) add(weight[t * K + k], u[k]);
  } else {
    for (int k = 0; k < K; ++k) {
      const int p = pos[t * K + k];
      if (p >= 0) add(weight[t * K + k], y[size_t(p) * hidden8 + c]);
    }
  }
  if (plus) {  // the sum as bf16 holds it, plus the added row (the add kernel's bits)
    const uint4 a = plus[i];
    float v[8];
    unpack_bf16x8(a, v);
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[j] = fp::bf16_decode(fp::bf16_encode(acc[j])) + v[j];
  }
  out[i] = pack_bf16x8(acc);
}

}  // namespace

void moe_route(const MoeRouteParams& p, cudaStream_t s) {
  if (p.T == 0) return;
  // A warp per 32 experts (at most kRouteThreads): the routing's loops go over the experts, and a
  // block of 256 threads for V2's 64 experts spent its time in barriers (27 us a layer at 4096 tokens).
  const int threads = std::min(kRouteThreads, std::max(32, (p.E + 31) / 32 * 32));
  launch(moe_route_k, p.T, threads, route_smem_bytes(p), s, p);
}

namespace {
// Rows of 4-value chunks: hidden % 4 == 0 and p aligned to a chunk (16 bytes f32, 8 bf16).
bool chunked(const void* p, Elem e, int64_t hidden) {
  return hidden % 4 == 0 && (reinterpret_cast<uintptr_t>(p) & (e == Elem::BF16 ? 7 : 15)) == 0;
}
}  // namespace

void moe_router(const void* x, Elem xe, const void* w, Elem we, int64_t hidden, const MoeRouteParams& p,
                unsigned* done, cudaStream_t s) {
  if (p.T == 0) return;
  const bool vec = chunked(w, we, hidden);
  const size_t smem = route_smem_bytes(p) + sizeof(float) * size_t(p.E);
  const dim3 grid(unsigned(p.T), unsigned(p.E));
  if (we == Elem::BF16) launch(moe_router_k<true>, grid, kRouteThreads, smem, s, x, xe, w, int(hidden), vec, p, done);
  else launch(moe_router_k<false>, grid, kRouteThreads, smem, s, x, xe, w, int(hidden), vec, p, done);
}

bool moe_logits_fits(const void* x, Elem xe, const void* w, Elem we, int64_t hidden) {
  return (xe == Elem::BF16 || xe == Elem::F32) && (we == Elem::BF16 || we == Elem::F32) && chunked(x, xe, hidden) &&
         chunked(w, we, hidden);
}

void moe_logits(const void* x, Elem xe, const void* w, Elem we, int64_t hidden, int64_t T, int64_t E, float* logits,
                cudaStream_t s) {
  if (T == 0) return;
  const dim3 grid(unsigned((T + kLogitTokens - 1) / kLogitTokens), unsigned((E + kLogitExperts - 1) / kLogitExperts));
  auto go = [&](auto kernel) { launch(kernel, grid, kRouteThreads, 0, s, x, w, int(hidden), int(T), int(E), logits); };
  if (xe == Elem::BF16) we == Elem::BF16 ? go(moe_logits_k<true, true>) : go(moe_logits_k<true, false>);
  else we == Elem::BF16 ? go(moe_logits_k<false, true>) : go(moe_logits_k<false, false>);
}

MoePlan moe_plan_at(int32_t* words, int64_t n, int64_t E, int64_t bm) {
  MoePlan p;
  p.offsets = words;
  p.rows = p.offsets + (E + 1);
  p.pos = p.rows + n;
  p.tiles = p.pos + n;
  p.num_tiles = p.tiles + 2 * moe_max_tiles(n, E, bm);
  p.jobs = p.num_tiles + 1;
  p.counts = p.jobs + 4;
  return p;
}

void moe_align(const int32_t* expert, int64_t n, int E, int bm, const MoePlan& plan, cudaStream_t s) {
  const int64_t blocks = moe_align_blocks(n);
  if (blocks > 1) {  // prefill: one block over 24 576 slots took 32 µs (V2-Lite, 4096 tokens)
    launch(moe_count_k, unsigned(blocks), kAlignThreads, sizeof(int) * size_t(E), s, expert, int(n), E, plan);
    launch(moe_place_k, unsigned(blocks), kAlignThreads, sizeof(int) * size_t(3 * E), s, expert, int(n), E, bm, plan);
    return;
  }
  // A thread per expert at least, one per slot up to the block's bound: a decode batch's few slots
  // take a block of E threads, whose scans and barriers are shorter than 1024 threads'.
  const int64_t want = std::max<int64_t>(E, std::min<int64_t>(n, kAlignThreads));
  const unsigned threads = unsigned((want + 31) / 32 * 32);
  launch(moe_align_k, 1, threads, sizeof(int) * size_t(3 * E), s, expert, int(n), E, bm, plan);
}

void moe_gate_up_generic(const void* x, Elem xe, int topk, const MoePlan& plan, int64_t max_tiles, const void* gate,
                         const void* up, Elem we, int64_t I, int64_t hidden, void* h, Elem he, cudaStream_t s) {
  if (max_tiles == 0 || I == 0) return;
  const dim3 grid(unsigned(max_tiles), unsigned((I + kGenN - 1) / kGenN));
  launch(moe_gemm_generic_k<true>, grid, kGenThreads, 0, s, x, xe, topk, plan, gate, up, we, I, hidden, h, he);
}

void moe_down_generic(const void* h, Elem he, const MoePlan& plan, int64_t max_tiles, const void* down, Elem we,
                      int64_t I, int64_t hidden, void* y, Elem ye, cudaStream_t s) {
  if (max_tiles == 0 || hidden == 0) return;
  const dim3 grid(unsigned(max_tiles), unsigned((hidden + kGenN - 1) / kGenN));
  launch(moe_gemm_generic_k<false>, grid, kGenThreads, 0, s, h, he, 1, plan, down, nullptr, we, hidden, I, y, ye);
}

void moe_combine(const void* y, Elem ye, const int32_t* pos, const float* weight, int64_t T, int64_t K, int64_t hidden,
                 void* out, Elem oe, const void* add, Elem ae, cudaStream_t s) {
  const size_t n = size_t(T * hidden);
  if (n == 0) return;
  const bool aligned = ((reinterpret_cast<uintptr_t>(y) | reinterpret_cast<uintptr_t>(out) |
                         reinterpret_cast<uintptr_t>(add)) & 15) == 0;
  if (ye == Elem::BF16 && oe == Elem::BF16 && (!add || ae == Elem::BF16) && hidden % 8 == 0 && aligned)
    launch(moe_combine_bf16x8_k, blocks_for(n / 8, 256), 256, 0, s, static_cast<const uint4*>(y), pos, weight, T, int(K),
           hidden / 8, static_cast<const uint4*>(add), static_cast<uint4*>(out));
  else
    launch(moe_combine_k, blocks_for(n, 256), 256, 0, s, y, ye, pos, weight, T, int(K), hidden, out, oe, add, ae);
}

}  // namespace mla::gpu
