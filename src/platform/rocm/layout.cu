// Layout changes the ROCm ops need: the batched transpose that turns w_kc [H, dn, L] into the
// K-contiguous [H, L, dn] the absorb GEMM reads.
#include "platform/gpu/elem.cuh"
#include "platform/gpu/gpu_check.h"
#include "platform/rocm/kernels.h"

namespace mla::rocm {
namespace {

constexpr int kThreads = 256;

__global__ void transpose_last2_k(const void* x, Elem e, int64_t B, int64_t R, int64_t C, void* y) {
  const size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= size_t(B * R * C)) return;
  const int64_t r = int64_t(idx % R), bc = int64_t(idx / R), c = bc % C, b = bc / C;  // idx walks y[b, c, r]
  gpu::store_elem(y, e, idx, gpu::load_elem(x, e, size_t((b * R + r) * C + c)));
}

}  // namespace

void transpose_last2(const void* x, Elem e, int64_t B, int64_t R, int64_t C, void* y, cudaStream_t s) {
  const size_t n = size_t(B * R * C);
  if (n == 0) return;
  transpose_last2_k<<<gpu::blocks_for(n, kThreads), kThreads, 0, s>>>(x, e, B, R, C, y);
  MLA_GPU_LAUNCH_CHECK();
}

}  // namespace mla::rocm
