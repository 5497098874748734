// Element access for the CUDA kernels: f32, bf16 and fp8 e4m3fn, loaded and stored through float.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "platform/cuda/attention_kernels.h"

namespace mla::cuda {

__device__ __forceinline__ float load_elem(const void* p, Elem e, size_t i) {
  switch (e) {
    case Elem::F32: return static_cast<const float*>(p)[i];
    case Elem::BF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    default: return float(static_cast<const __nv_fp8_e4m3*>(p)[i]);
  }
}

// Round to nearest even; fp8 saturates to ±448 (as the KV quantizers do).
__device__ __forceinline__ void store_elem(void* p, Elem e, size_t i, float v) {
  switch (e) {
    case Elem::F32: static_cast<float*>(p)[i] = v; break;
    case Elem::BF16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v); break;
    default: static_cast<__nv_fp8_e4m3*>(p)[i] = __nv_fp8_e4m3(v); break;
  }
}

inline int blocks_for(size_t n, int threads) { return int((n + threads - 1) / threads); }

}  // namespace mla::cuda
