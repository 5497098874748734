// The general attention kernels (SIMT cores, f32 math, any dims): one block per (query, head),
// online softmax over key chunks. The exact path for f32 activations and odd shapes; the fast
// tensor-core kernels live in mha_prefill.cu and mla_decode.cu.
#include "platform/gpu/attend_row.cuh"
#include "platform/gpu/gpu_check.h"
#include "platform/gpu/launch.cuh"

namespace mla::gpu {
namespace {

using namespace attend;

__global__ void __launch_bounds__(kThreads) mha_generic_k(MhaParams p) {
  pdl_enter(); mha_query_block(p, p.elem, 1.f); }

__global__ void __launch_bounds__(kThreads) mla_generic_k(MlaParams p) {
  pdl_enter();
  extern __shared__ float smem[];
  float *q = smem, *scores = smem + p.head_dim, *red = scores + kThreads;
  int64_t t, visible, k0;
  if (!query_of(p.seg, t, visible, k0)) return;
  const int64_t h = blockIdx.y, H = p.num_heads;
  for (int64_t c = threadIdx.x; c < p.head_dim; c += kThreads) q[c] = load_elem(p.q, p.q_elem, size_t((t * H + h) * p.head_dim + c));
  __syncthreads();
  MlaKeys keys{p.kv, p.kv_elem, p.kv_scale, p.kv_slots, p.head_dim, k0};
  attend_row(keys, q, p.head_dim, p.v_dim, visible, p.softmax_scale, p.o, p.o_elem, size_t((t * H + h) * p.v_dim),
             p.lse + t * H + h, scores, red);
}

}  // namespace

void mha_attention_generic(const MhaParams& p) {
  if (p.seg.num_requests == 0 || p.seg.max_q_len == 0) return;
  const size_t smem = sizeof(float) * (p.qk_dim + kThreads + 32);
  launch(mha_generic_k, dim3(unsigned(p.seg.max_q_len), unsigned(p.num_heads), unsigned(p.seg.num_requests)), kThreads, smem, p.stream, p);
}

void mla_attention_generic(const MlaParams& p) {
  if (p.seg.num_requests == 0 || p.seg.max_q_len == 0) return;
  const size_t smem = sizeof(float) * (p.head_dim + kThreads + 32);
  launch(mla_generic_k, dim3(unsigned(p.seg.max_q_len), unsigned(p.num_heads), unsigned(p.seg.num_requests)), kThreads, smem, p.stream, p);
}

}  // namespace mla::gpu
