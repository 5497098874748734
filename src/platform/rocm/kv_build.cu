// The MHA twins' K/V build: decompressed kv and the rows' k_pe → k = [k_nope | k_pe broadcast],
// cast to the cache's element type (fp8 ÷ its scale) in the same pass, and v.
#include "platform/gpu/elem.cuh"
#include "platform/gpu/gpu_check.h"
#include "platform/rocm/kernels.h"

namespace mla::rocm {
namespace {

using gpu::load_elem;
using gpu::store_elem;

constexpr int kThreads = 256;

__global__ void build_kv_cast_k(KvBuildParams p, size_t nk, size_t nv) {
  const size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const float inv = 1.f / p.k_scale;
  const int64_t per = p.dn + p.dv;
  if (idx < nk) {
    const int64_t qk = p.dn + p.dr, c = int64_t(idx % qk), sh = int64_t(idx / qk), s = sh / p.H, h = sh % p.H;
    const float x = c < p.dn ? load_elem(p.kv, p.kv_elem, size_t(s * p.H * per + h * per + c))
                             : load_elem(p.rows, p.rows_elem, size_t(s * p.D + p.L + (c - p.dn)));
    store_elem(p.k, p.k_elem, idx, x * inv);
  } else if (idx < nk + nv) {
    const size_t i = idx - nk;
    const int64_t c = int64_t(i % p.dv), sh = int64_t(i / p.dv), s = sh / p.H, h = sh % p.H;
    store_elem(p.v, p.v_elem, i, load_elem(p.kv, p.kv_elem, size_t(s * p.H * per + h * per + p.dn + c)));
  }
}

}  // namespace

void build_kv_cast(const KvBuildParams& p) {
  const size_t nk = size_t(p.S * p.H * (p.dn + p.dr)), nv = size_t(p.S * p.H * p.dv);
  if (nk + nv == 0) return;
  build_kv_cast_k<<<gpu::blocks_for(nk + nv, kThreads), kThreads, 0, p.stream>>>(p, nk, nv);
  MLA_GPU_LAUNCH_CHECK();
}

}  // namespace mla::rocm
