// The ROCm platform's attention kernels, on the shared row-attention core (gpu/attend_row.cuh):
// MHA over K stored in the cache's element type (× its scale), and the MLA decode kernel with
// RoPE inside it (MLA_FUSED_ROPE_ROCM).
#include "platform/gpu/attend_row.cuh"
#include "platform/gpu/gpu_check.h"
#include "platform/gpu/rope.cuh"
#include "platform/rocm/kernels.h"

namespace mla::rocm {
namespace {

using namespace gpu::attend;
using gpu::load_elem;
using gpu::round_as;
using gpu::store_elem;

__global__ void __launch_bounds__(kThreads) mha_cast_k_k(gpu::MhaParams p, Elem k_elem, float k_scale) {
  mha_query_block(p, k_elem, k_scale);
}

// The latent rows, except the rope part of the new key (the segment's last), which comes rotated
// from shared memory.
struct RopeKeys {
  MlaKeys rows;
  int64_t last, L;
  const float* k_pe;  // smem [D − L]
  __device__ float key(int64_t j, int64_t d) const { return j == last && d >= L ? k_pe[d - L] : rows.key(j, d); }
  __device__ float val(int64_t j, int64_t d) const { return rows.val(j, d); }  // values: d < L
};

__global__ void __launch_bounds__(kThreads) mla_decode_fused_rope_k(FusedRopeDecodeParams f) {
  const gpu::MlaParams& p = f.mla;
  extern __shared__ float smem[];
  const int64_t D = p.head_dim, L = p.v_dim, R = D - L;
  float *q = smem, *k_pe = q + D, *scores = k_pe + R, *red = scores + kThreads;
  int64_t t, visible, k0;
  if (!query_of(p.seg, t, visible, k0)) return;
  const int64_t h = blockIdx.y, H = p.num_heads, half = f.half, klen = p.seg.k_len[blockIdx.z];
  for (int64_t c = threadIdx.x; c < D; c += kThreads) q[c] = load_elem(p.q, p.q_elem, size_t((t * H + h) * D + c));
  __syncthreads();
  const int32_t pos = f.positions[t];
  for (int64_t i = threadIdx.x; i < half; i += kThreads) {
    float c, s;
    gpu::rope_cos_sin(pos, f.inv_freq[i], f.attention_factor, c, s);
    const int64_t a = gpu::rope_first(i, half, f.interleave), b = gpu::rope_second(i, half, f.interleave);
    // q_pe, rounded as the activations hold it (as the unfused twins' rotated q is).
    const float q0 = q[L + a], q1 = q[L + b];
    q[L + a] = round_as(q0 * c - q1 * s, p.q_elem), q[L + b] = round_as(q0 * s + q1 * c, p.q_elem);
    // The new key's k_pe, rounded as the activation row and then the cache row hold it.
    const size_t kr = size_t(t * D + L);
    const float k0v = load_elem(f.kva, f.kva_elem, kr + a), k1v = load_elem(f.kva, f.kva_elem, kr + b);
    k_pe[a] = round_as(round_as(k0v * c - k1v * s, f.kva_elem) / p.kv_scale, p.kv_elem) * p.kv_scale;
    k_pe[b] = round_as(round_as(k0v * s + k1v * c, f.kva_elem) / p.kv_scale, p.kv_elem) * p.kv_scale;
  }
  __syncthreads();
  if (h == 0 && klen > 0) {  // write the rotated k_pe back into the new key's cache row
    const size_t row = size_t(p.kv_slots[k0 + klen - 1]) * size_t(D);
    for (int64_t c = threadIdx.x; c < R; c += kThreads) store_elem(f.kv_out, p.kv_elem, row + L + c, k_pe[c] / p.kv_scale);
  }
  RopeKeys keys{MlaKeys{p.kv, p.kv_elem, p.kv_scale, p.kv_slots, D, k0}, klen - 1, L, k_pe};
  attend_row(keys, q, D, L, visible, p.softmax_scale, p.o, p.o_elem, size_t((t * H + h) * L), p.lse + t * H + h,
             scores, red);
}

}  // namespace

void mha_attention_cast_k(const gpu::MhaParams& p, Elem k_elem, float k_scale) {
  if (p.seg.num_requests == 0 || p.seg.max_q_len == 0) return;
  const size_t smem = sizeof(float) * (p.qk_dim + kThreads + 32);
  mha_cast_k_k<<<dim3(unsigned(p.seg.max_q_len), unsigned(p.num_heads), unsigned(p.seg.num_requests)), kThreads, smem,
                 p.stream>>>(p, k_elem, k_scale);
  MLA_GPU_LAUNCH_CHECK();
}

void mla_decode_fused_rope(const FusedRopeDecodeParams& f) {
  const gpu::MlaParams& p = f.mla;
  if (p.seg.num_requests == 0 || p.seg.max_q_len == 0) return;
  const size_t smem = sizeof(float) * (2 * p.head_dim - p.v_dim + kThreads + 32);
  mla_decode_fused_rope_k<<<dim3(unsigned(p.seg.max_q_len), unsigned(p.num_heads), unsigned(p.seg.num_requests)),
                            kThreads, smem, p.stream>>>(f);
  MLA_GPU_LAUNCH_CHECK();
}

}  // namespace mla::rocm
