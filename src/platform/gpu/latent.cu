// latent.cu — the end of the latent path for the new tokens in one kernel (the shared steps'
// prepare_latent): the kv_a RMSNorm of each latent row, RoPE on q's rope columns of every head and
// on the row's k_pe, and the row written to the pool. Each piece computes what the kernel it
// replaces computes (rmsnorm, rope, cache_write), in the same order, so the bits are theirs.
//
// Two bodies. Decode batches (fewer than kRowsTokens tokens): latent_token_k, a block per token,
// the shortest chain for one token. Prefill: latent_rows_k, a block per kTokens tokens and a group of
// kHeadGroup of q's heads (grid: token blocks × head groups); its threads compute the tokens' cos/sin
// into shared memory (the one barrier), rotate the group's q pairs with every load of a batch issued
// before its stores, and, in the first head group, each 32-lane group normalizes one token's latent
// row, rotates its k_pe and writes the row to the pool from its own registers (no lane reads what
// another wrote, so no warp barrier: a 32-lane group is half a wavefront on AMD). A block per token
// there took 43 µs a layer at 4096 tokens (V2-Lite), its blocks waiting on their barriers.
#include <algorithm>

#include "platform/gpu/gpu_check.h"
#include "platform/gpu/launch.cuh"
#include "platform/gpu/latent.h"
#include "platform/gpu/norm.cuh"
#include "platform/gpu/rope.cuh"

namespace mla::gpu {
namespace {

constexpr int kRowsTokens = 1024;           // tokens from which latent_rows_k runs
constexpr int kTokens = kNormThreads / 32;  // tokens a block: one per 32-lane group
constexpr int kHeadGroup = 16;              // q heads a block rotates
constexpr int kMaxHalf = 128;               // rotated pairs a head (shared memory: kTokens · kMaxHalf · 8 B)
constexpr int kBatch = 8;                   // (token, head) items a lane loads before it stores

// Element i of x: bf16 read and written directly when kBf16 (the kernel's small body for bf16 models),
// else through the generic element code.
template <bool kBf16>
__device__ __forceinline__ float ld(const void* x, Elem e, size_t i) {
  if constexpr (kBf16) return fp::bf16_decode(static_cast<const uint16_t*>(x)[i]);
  else return load_elem(x, e, i);
}
template <bool kBf16>
__device__ __forceinline__ void st(void* x, Elem e, size_t i, float v) {
  if constexpr (kBf16) static_cast<uint16_t*>(x)[i] = fp::bf16_encode(v);
  else store_elem(x, e, i, v);
}
template <bool kBf16>
__device__ __forceinline__ float rounded(float v, Elem e) {  // v as x of type e holds it
  if constexpr (kBf16) return fp::bf16_decode(fp::bf16_encode(v));
  else return round_as(v, e);
}

// Token t's kv latent row: RMSNorm over [0, lora), RoPE on [lora, lora + 2·half), the row to the
// pool. One group of 32 lanes; cs / sn: the token's cos / sin. kBf16: a bf16 row the norm reads in
// 16-byte chunks (norm_rows_vectorized).
template <bool kBf16>
__device__ void finish_row(const LatentFinishParams& p, int64_t t, const float* cs, const float* sn) {
  const int lane = threadIdx.x & 31;
  const size_t row = size_t(t) * size_t(p.row_dim), dst = size_t(p.slots[t]) * size_t(p.row_dim);
  // The pool takes an element as the latent row holds it (v: already of the row's type), over the
  // scale; with the same type and scale 1 that is the element itself.
  auto to_pool = [&](int64_t c, float v) {
    if (p.copy16) st<kBf16>(p.pool, p.pool_elem, dst + c, v);
    else store_elem(p.pool, p.pool_elem, dst + c, v * p.inv_scale);
  };
  // Σx² as the norm kernel's block of kNormThreads threads sums it: lane l stands in for thread
  // 32·w + l of each warp w in turn (warps with nothing to add are skipped: they add zeros).
  const int64_t n = p.lora;
  float total = 0.f;
  if constexpr (kBf16) {
    if (p.row_short) {  // at most 64 chunks and 32 pairs: every load of the row first, one round trip
      const uint4* r = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p.kva) + row);
      const uint4* wr = static_cast<const uint4*>(p.norm_w);
      const int chunks = int(n / 8), half = int(p.half);
      const bool c0 = lane < chunks, c1 = lane + 32 < chunks, pr = lane < half;
      const uint4 zero = make_uint4(0, 0, 0, 0);
      const uint4 u0 = c0 ? r[lane] : zero, u1 = c1 ? r[lane + 32] : zero;
      const uint4 w0 = c0 ? wr[lane] : zero, w1 = c1 ? wr[lane + 32] : zero;
      const size_t i0 = row + size_t(n) + rope_first(lane, half, p.interleave);
      const size_t i1 = row + size_t(n) + rope_second(lane, half, p.interleave);
      const float k0 = pr ? ld<true>(p.kva, p.kva_elem, i0) : 0.f, k1 = pr ? ld<true>(p.kva, p.kva_elem, i1) : 0.f;
      float v0[8], v1[8], wv[8], ss = 0.f;
      unpack_bf16x8(u0, v0);
      unpack_bf16x8(u1, v1);
#pragma unroll
      for (int j = 0; j < 8; ++j) ss += v0[j] * v0[j];  // a thread without a chunk adds zeros: ss stays 0
      block_sum_lane_part(ss, 0, total);
      if (chunks > 32) {
        ss = 0.f;
#pragma unroll
        for (int j = 0; j < 8; ++j) ss += v1[j] * v1[j];
        block_sum_lane_part(ss, 1, total);
      }
      const float inv = rsqrtf(block_sum_lane_total(total) / float(n) + p.eps);
      uint4* x = reinterpret_cast<uint4*>(static_cast<uint16_t*>(p.kva) + row);
      uint4* pool = reinterpret_cast<uint4*>(static_cast<uint16_t*>(p.pool) + dst);
      auto put = [&](int k, const float (&v)[8], const uint4& w) {
        unpack_bf16x8(w, wv);
        const uint4 o = normed_bf16x8(v, inv, wv);
        x[k] = o;
        if (p.copy16) {
          pool[k] = o;
        } else {
          float ov[8];
          unpack_bf16x8(o, ov);
#pragma unroll 1
          for (int j = 0; j < 8; ++j) to_pool(8 * k + j, ov[j]);
        }
      };
      if (c0) put(lane, v0, w0);
      if (c1) put(lane + 32, v1, w1);
      if (pr) {
        float y0, y1;
        rope_rotate(k0, k1, cs[lane], sn[lane], y0, y1);
        st<true>(p.kva, p.kva_elem, i0, y0);
        st<true>(p.kva, p.kva_elem, i1, y1);
        to_pool(int64_t(i0 - row), rounded<true>(y0, p.kva_elem));
        to_pool(int64_t(i1 - row), rounded<true>(y1, p.kva_elem));
      }
      return;
    }
    const int64_t chunks = n / 8;
    const uint4* r = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p.kva) + row);
#pragma unroll 1
    for (int w = 0; w < kNormThreads / 32 && 32 * w < chunks; ++w) {
      float ss = 0.f;
#pragma unroll 1
      for (int64_t k = 32 * w + lane; k < chunks; k += kNormThreads) {
        float v[8];
        unpack_bf16x8(r[k], v);
#pragma unroll
        for (int j = 0; j < 8; ++j) ss += v[j] * v[j];
      }
      block_sum_lane_part(ss, w, total);
    }
    const float inv = rsqrtf(block_sum_lane_total(total) / float(n) + p.eps);
    uint4* x = reinterpret_cast<uint4*>(static_cast<uint16_t*>(p.kva) + row);
#pragma unroll 1
    for (int64_t k = lane; k < chunks; k += 32) {
      float v[8];
      unpack_bf16x8(x[k], v);
      const uint4 o = normed_bf16x8(v, inv, p.norm_w, p.norm_elem, k);
      x[k] = o;
      if (p.copy16) {
        reinterpret_cast<uint4*>(static_cast<uint16_t*>(p.pool) + dst)[k] = o;
      } else {
        unpack_bf16x8(o, v);
#pragma unroll 1
        for (int j = 0; j < 8; ++j) to_pool(8 * k + j, v[j]);
      }
    }
  } else {
#pragma unroll 1
    for (int w = 0; w < kNormThreads / 32 && 32 * w < n; ++w) {
      float ss = 0.f;
#pragma unroll 1
      for (int64_t i = 32 * w + lane; i < n; i += kNormThreads) {
        const float v = load_elem(p.kva, p.kva_elem, row + i);
        ss += v * v;
      }
      block_sum_lane_part(ss, w, total);
    }
    const float inv = rsqrtf(block_sum_lane_total(total) / float(n) + p.eps);
#pragma unroll 1
    for (int64_t i = lane; i < n; i += 32) {
      const float o = load_elem(p.kva, p.kva_elem, row + i) * inv * load_elem(p.norm_w, p.norm_elem, i);
      store_elem(p.kva, p.kva_elem, row + i, o);
      to_pool(i, round_as(o, p.kva_elem));
    }
  }
  // k_pe: the columns after the latent, which the norm does not touch.
  const int64_t rot = p.lora;
#pragma unroll 1
  for (int i = lane; i < p.half; i += 32) {
    const size_t i0 = row + rot + rope_first(i, p.half, p.interleave), i1 = row + rot + rope_second(i, p.half, p.interleave);
    float y0, y1;
    rope_rotate(ld<kBf16>(p.kva, p.kva_elem, i0), ld<kBf16>(p.kva, p.kva_elem, i1), cs[i], sn[i], y0, y1);
    st<kBf16>(p.kva, p.kva_elem, i0, y0);
    st<kBf16>(p.kva, p.kva_elem, i1, y1);
    to_pool(int64_t(i0 - row), rounded<kBf16>(y0, p.kva_elem));
    to_pool(int64_t(i1 - row), rounded<kBf16>(y1, p.kva_elem));
  }
  // Columns past the rotated ones (none in DeepSeek's rows) go as they are.
#pragma unroll 1
  for (int64_t c = rot + 2 * p.half + lane; c < p.row_dim; c += 32) to_pool(c, load_elem(p.kva, p.kva_elem, row + c));
}

__global__ void __launch_bounds__(kNormThreads) latent_token_k(LatentFinishParams p) {
  pdl_enter();
  __shared__ float cs[2][kNormThreads];  // this token's cos / sin of each rotated pair
  const int64_t t = blockIdx.x, half = p.half;
  const size_t row = size_t(t) * size_t(p.row_dim);
  if (threadIdx.x < half) rope_cos_sin(p.positions[t], p.inv_freq[threadIdx.x], p.af, cs[0][threadIdx.x], cs[1][threadIdx.x]);
  // The latent columns [0, lora) of the row (block_sum's barriers publish cs too).
  rmsnorm_row_as_launched(p.kva, p.kva_elem, row, p.lora, p.norm_w, p.norm_elem, p.eps, p.norm_vec);
  __syncthreads();
  // Pairs of q's heads, then of the row's k_pe (head `heads`): columns the norm does not touch. The
  // indices in 32 bits (heads ≤ 128, half ≤ the block): 64-bit divisions were most of this loop.
  const int nh = int(half), pairs = (int(p.heads) + 1) * nh;
  for (int idx = threadIdx.x; idx < pairs; idx += blockDim.x) {
    const int h = idx / nh, i = idx - h * nh;
    void* x = h < p.heads ? p.q : p.kva;
    const Elem e = h < p.heads ? p.q_elem : p.kva_elem;
    const size_t base = h < p.heads ? size_t((t * p.heads + h) * p.q_head_dim + p.q_rot) : row + size_t(p.lora);
    const size_t i0 = base + rope_first(i, half, p.interleave), i1 = base + rope_second(i, half, p.interleave);
    float y0, y1;
    rope_rotate(load_elem(x, e, i0), load_elem(x, e, i1), cs[0][i], cs[1][i], y0, y1);
    store_elem(x, e, i0, y0);
    store_elem(x, e, i1, y1);
  }
  __syncthreads();
  const size_t dst = size_t(p.slots[t]) * size_t(p.row_dim);
  if (p.copy16) {  // the pool holds the row's own elements unscaled: 16-byte copies
    const uint4* src = reinterpret_cast<const uint4*>(static_cast<const char*>(p.kva) + row * elem_size(p.kva_elem));
    uint4* out = reinterpret_cast<uint4*>(static_cast<char*>(p.pool) + dst * elem_size(p.pool_elem));
    for (int c = threadIdx.x; c < p.copy16; c += blockDim.x) out[c] = src[c];
    return;
  }
  for (int64_t c = threadIdx.x; c < p.row_dim; c += blockDim.x)
    store_elem(p.pool, p.pool_elem, dst + c, load_elem(p.kva, p.kva_elem, row + c) * p.inv_scale);
}

template <bool kBf16>
__global__ void __launch_bounds__(kNormThreads) latent_rows_k(LatentFinishParams p) {
  pdl_enter();
  __shared__ float cs[2][kTokens][kMaxHalf];  // each token's cos / sin of each rotated pair
  const int half = int(p.half);
  const int64_t t0 = int64_t(blockIdx.x) * kTokens;
  const int tokens = int(min(int64_t(kTokens), p.T - t0));
#pragma unroll 1
  for (int k = threadIdx.x; k < tokens * half; k += blockDim.x) {
    const int t = k / half, i = k - t * half;
    rope_cos_sin(p.positions[t0 + t], p.inv_freq[i], p.af, cs[0][t][i], cs[1][t][i]);
  }
  __syncthreads();
  // q's pairs of this head group: 32-lane group g takes the (token, head) items g, g + groups, …,
  // kBatch of them loaded before any is stored; lane l takes pairs l, l + 32, … of each.
  const int g = int(threadIdx.x >> 5), lane = int(threadIdx.x & 31), groups = int(blockDim.x >> 5);
  const int h0 = int(blockIdx.y) * kHeadGroup, nh = min(kHeadGroup, int(p.heads) - h0), items = tokens * nh;
  // The block's q rows from its first token on: item offsets in 32 bits (kTokens · heads · q_head_dim).
  void* const qb = static_cast<char*>(p.q) + size_t(t0 * p.heads) * size_t(p.q_head_dim) * elem_size(p.q_elem);
#pragma unroll 1
  for (int j0 = g; j0 < items; j0 += kBatch * groups) {
    uint32_t at[kBatch];  // item j0 + b·groups: its first rope column in qb
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int it = j0 + b * groups, t = it / nh;
      at[b] = uint32_t((t * int(p.heads) + h0 + it - t * nh) * int(p.q_head_dim) + int(p.q_rot));
    }
#pragma unroll 1
    for (int i = lane; i < half; i += 32) {
      const size_t f = rope_first(i, half, p.interleave), s = rope_second(i, half, p.interleave);
      float x0[kBatch], x1[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        if (j0 + b * groups >= items) break;
        if (kBf16 && p.q_pair32) {  // the pair's two bf16 side by side: one 32-bit load
          const uint32_t v = *reinterpret_cast<const uint32_t*>(static_cast<const uint16_t*>(qb) + at[b] + f);
          x0[b] = fp::bf16_decode(uint16_t(v)), x1[b] = fp::bf16_decode(uint16_t(v >> 16));
        } else {
          x0[b] = ld<kBf16>(qb, p.q_elem, at[b] + f), x1[b] = ld<kBf16>(qb, p.q_elem, at[b] + s);
        }
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        if (j0 + b * groups >= items) break;
        const int t = (j0 + b * groups) / nh;
        float y0, y1;
        rope_rotate(x0[b], x1[b], cs[0][t][i], cs[1][t][i], y0, y1);
        if (kBf16 && p.q_pair32) {
          *reinterpret_cast<uint32_t*>(static_cast<uint16_t*>(qb) + at[b] + f) =
              uint32_t(fp::bf16_encode(y0)) | (uint32_t(fp::bf16_encode(y1)) << 16);
        } else {
          st<kBf16>(qb, p.q_elem, at[b] + f, y0);
          st<kBf16>(qb, p.q_elem, at[b] + s, y1);
        }
      }
    }
  }
  if (blockIdx.y == 0 && g < tokens) finish_row<kBf16>(p, t0 + g, cs[0][g], cs[1][g]);
}

}  // namespace

bool latent_finish_fits(int64_t half) { return half >= 0 && half <= kMaxHalf; }  // both bodies

void latent_finish(const LatentFinishParams& params, cudaStream_t s) {
  if (params.T == 0) return;
  LatentFinishParams p = params;
  const size_t bytes = size_t(p.row_dim) * elem_size(p.kva_elem);
  p.copy16 = p.kva_elem == p.pool_elem && p.inv_scale == 1.f && bytes % 16 == 0 && aligned16(p.kva) && aligned16(p.pool)
                 ? int(bytes / 16)
                 : 0;
  if (p.T < kRowsTokens) return launch(latent_token_k, unsigned(p.T), kNormThreads, 0, s, p);
  p.row_short = p.norm_vec && p.norm_elem == Elem::BF16 && aligned16(p.norm_w) && p.lora <= 512 && p.half <= 32 &&
                p.row_dim == p.lora + 2 * p.half;
  p.q_pair32 = p.interleave && p.q_elem == Elem::BF16 && p.q_head_dim % 2 == 0 && p.q_rot % 2 == 0 &&
               reinterpret_cast<uintptr_t>(p.q) % 4 == 0;
  const dim3 grid(unsigned((p.T + kTokens - 1) / kTokens),
                  unsigned(std::max<int64_t>(1, (p.heads + kHeadGroup - 1) / kHeadGroup)));
  if (p.norm_vec && p.q_elem == Elem::BF16) launch(latent_rows_k<true>, grid, kNormThreads, 0, s, p);
  else launch(latent_rows_k<false>, grid, kNormThreads, 0, s, p);
}

}  // namespace mla::gpu
