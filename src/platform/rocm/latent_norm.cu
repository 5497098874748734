// Both latent-path RMSNorms (q_a_layernorm on the q_lora rows, kv_a_layernorm on the c_kv part of
// the new latent rows) in one launch: block (t, 0) normalizes kva row t, block (t, 1) qa row t.
#include "platform/gpu/gpu_check.h"
#include "platform/gpu/norm.cuh"
#include "platform/rocm/kernels.h"

namespace mla::rocm {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) latent_rmsnorm_k(LatentNormParams p) {
  const size_t t = blockIdx.x;
  if (blockIdx.y == 0)
    gpu::rmsnorm_row(p.kva, p.kva_elem, t * size_t(p.kv_ld), p.kv_n, p.kv_w, p.kv_w_elem, p.eps);
  else
    gpu::rmsnorm_row(p.qa, p.qa_elem, t * size_t(p.q_ld), p.q_n, p.q_w, p.q_w_elem, p.eps);
}

}  // namespace

void latent_rmsnorm(const LatentNormParams& p) {
  if (p.T == 0) return;
  latent_rmsnorm_k<<<dim3(unsigned(p.T), p.qa ? 2u : 1u), kThreads, 0, p.stream>>>(p);
  MLA_GPU_LAUNCH_CHECK();
}

}  // namespace mla::rocm
