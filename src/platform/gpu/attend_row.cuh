// The row-attention core of the SIMT attention kernels, shared by the general kernels
// (attention_generic.cu) and the ROCm platform's kernels: one block of kThreads per (query, head),
// online softmax over key chunks of kThreads, f32 math. Keys and values are reached through a
// `Keys` type: key(j, d) and val(j, d) for key j of the query's segment.
#pragma once
#include <cmath>

#include "platform/gpu/elem.cuh"
#include "platform/gpu/softmax_state.cuh"

namespace mla::gpu::attend {

constexpr int kThreads = 128;
constexpr int kMaxAcc = 8;  // Dv ≤ kThreads · kMaxAcc = 1024

__device__ __forceinline__ float block_reduce(float v, bool is_max, float* red) {
  for (int o = 16; o > 0; o >>= 1) {
    const float u = shfl_xor(v, o);
    v = is_max ? fmaxf(v, u) : v + u;
  }
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float r = red[0];
  for (int w = 1; w < kThreads / 32; ++w) r = is_max ? fmaxf(r, red[w]) : r + red[w];
  return r;
}

// Keys are reached through `Keys`: k(j) gives the element pointer base and element index of key
// j's row; values are the first Dv columns of a separate or the same row.
// Decompressed k[S, H, qk] (element type ke, each value × k_scale: 1 unless quantized) and
// v[S, H, dv] (element type ve).
struct MhaKeys {
  const void* k;
  const void* v;
  Elem ke, ve;
  float k_scale;
  int64_t H, h, qk, dv, k0;
  __device__ float key(int64_t j, int64_t d) const { return load_elem(k, ke, size_t(((k0 + j) * H + h) * qk + d)) * k_scale; }
  __device__ float val(int64_t j, int64_t d) const { return load_elem(v, ve, size_t(((k0 + j) * H + h) * dv + d)); }
};
// Latent rows of the pool kv[slots, D] (× the pool scale); values are the rows' first Dv columns.
struct MlaKeys {
  const void* kv;
  Elem e;
  float scale;
  const int32_t* slots;
  int64_t D, k0;
  __device__ float key(int64_t j, int64_t d) const { return load_elem(kv, e, size_t(slots[k0 + j]) * size_t(D) + size_t(d)) * scale; }
  __device__ float val(int64_t j, int64_t d) const { return key(j, d); }
};

template <typename Keys>
__device__ void attend_row(const Keys& keys, const float* q /*smem [qk]*/, int64_t qk, int64_t dv,
                           int64_t visible, float scale, void* o, Elem oe, size_t o_off, float* lse_out,
                           float* scores /*smem [kThreads]*/, float* red) {
  float acc[kMaxAcc];
  for (int a = 0; a < kMaxAcc; ++a) acc[a] = 0.f;
  SoftmaxState st;  // over the scores so far
  for (int64_t j0 = 0; j0 < visible; j0 += kThreads) {
    const int64_t j = j0 + threadIdx.x;
    float s = -INFINITY;
    if (j < visible) {
      float d = 0.f;
      for (int64_t c = 0; c < qk; ++c) d += q[c] * keys.key(j, c);
      s = d * scale;
    }
    const float cm = block_reduce(s, true, red);
    const float mn = fmaxf(st.m, cm);
    const float p = j < visible ? expf(s - mn) : 0.f;
    __syncthreads();
    scores[threadIdx.x] = p;
    const float ps = block_reduce(p, false, red);
    const float alpha = st.rescale(mn);
    st.l += ps;
    const int64_t n = visible - j0 < kThreads ? visible - j0 : kThreads;
    for (int a = 0; a < kMaxAcc; ++a) {
      const int64_t d = threadIdx.x + int64_t(a) * kThreads;
      if (d >= dv) break;
      float v = acc[a] * alpha;
      for (int64_t jj = 0; jj < n; ++jj) v += scores[jj] * keys.val(j0 + jj, d);
      acc[a] = v;
    }
    __syncthreads();
  }
  for (int a = 0; a < kMaxAcc; ++a) {
    const int64_t d = threadIdx.x + int64_t(a) * kThreads;
    if (d >= dv) break;
    store_elem(o, oe, o_off + size_t(d), visible > 0 ? acc[a] / st.l : 0.f);
  }
  if (threadIdx.x == 0) *lse_out = visible > 0 ? st.lse() : -INFINITY;
}

__device__ __forceinline__ bool query_of(const DeviceSegments& seg, int64_t& t, int64_t& visible, int64_t& k0) {
  const int r = blockIdx.z, i = blockIdx.x;
  const int64_t qlen = seg.q_len[r], klen = seg.k_len[r];
  if (i >= qlen) return false;
  t = seg.q_start[r] + i;
  k0 = seg.k_start[r];
  const int64_t last = klen - qlen + i + 1;
  visible = seg.causal ? (last < 0 ? 0 : (last > klen ? klen : last)) : klen;
  return true;
}

// One (query, head) block of MHA attention: q[t, h] against its segment's k, v (k stored as
// k_elem × k_scale; q, v and o in p.elem). Dynamic shared memory: qk_dim + kThreads + 32 floats.
__device__ __forceinline__ void mha_query_block(const MhaParams& p, Elem k_elem, float k_scale) {
  extern __shared__ float smem[];
  float *q = smem, *scores = smem + p.qk_dim, *red = scores + kThreads;
  int64_t t, visible, k0;
  if (!query_of(p.seg, t, visible, k0)) return;
  const int64_t h = blockIdx.y, H = p.num_heads;
  for (int64_t c = threadIdx.x; c < p.qk_dim; c += kThreads) q[c] = load_elem(p.q, p.elem, size_t((t * H + h) * p.qk_dim + c));
  __syncthreads();
  MhaKeys keys{p.k, p.v, k_elem, p.elem, k_scale, H, h, p.qk_dim, p.v_dim, k0};
  attend_row(keys, q, p.qk_dim, p.v_dim, visible, p.softmax_scale, p.o, p.elem, size_t((t * H + h) * p.v_dim),
             p.lse + t * H + h, scores, red);
}

}  // namespace mla::gpu::attend
