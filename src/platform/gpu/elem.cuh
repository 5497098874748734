// Element access for the shared GPU kernels: f32, bf16, fp8 e4m3fn and e4m3fnuz, loaded and stored
// through float with the bit-level conversions of mla/fp_formats.h (the same code on CUDA and HIP,
// tested exhaustively on the CPU).
#pragma once
#include "mla/fp_formats.h"
#include "platform/gpu/attention_kernels.h"

namespace mla::gpu {

__device__ __forceinline__ float load_elem(const void* p, Elem e, size_t i) {
  switch (e) {
    case Elem::F32: return static_cast<const float*>(p)[i];
    case Elem::BF16: return fp::bf16_decode(static_cast<const uint16_t*>(p)[i]);
    case Elem::FP8_E4M3FN: return fp::e4m3fn_decode(static_cast<const uint8_t*>(p)[i]);
    default: return fp::e4m3fnuz_decode(static_cast<const uint8_t*>(p)[i]);
  }
}

// Round to nearest even; fp8 saturates to ±max (as the KV quantizers do).
__device__ __forceinline__ void store_elem(void* p, Elem e, size_t i, float v) {
  switch (e) {
    case Elem::F32: static_cast<float*>(p)[i] = v; break;
    case Elem::BF16: static_cast<uint16_t*>(p)[i] = fp::bf16_encode(v); break;
    case Elem::FP8_E4M3FN: static_cast<uint8_t*>(p)[i] = fp::e4m3fn_encode(v); break;
    default: static_cast<uint8_t*>(p)[i] = fp::e4m3fnuz_encode(v); break;
  }
}

// SiLU(g) · u: the one formula of every GPU kernel that applies it, fused into a GEMM or not, so a
// value's bits do not depend on the kernel that made it.
__device__ __forceinline__ float silu_times(float g, float u) { return g / (1.f + expf(-g)) * u; }

// v as element type e stores it (what a later load returns).
__device__ __forceinline__ float round_as(float v, Elem e) {
  if (e == Elem::F32) return v;
  uint32_t bits = 0;
  store_elem(&bits, e, 0, v);
  return load_elem(&bits, e, 0);
}

// Eight bf16 values (16 bytes, one vector load or store) ↔ floats.
__device__ __forceinline__ void unpack_bf16x8(const uint4& u, float (&f)[8]) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int j = 0; j < 8; ++j) f[j] = fp::bf16_decode(uint16_t(w[j / 2] >> (16 * (j % 2))));
}
__device__ __forceinline__ uint4 pack_bf16x8(const float (&f)[8]) {
  uint32_t w[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) w[j] = uint32_t(fp::bf16_encode(f[2 * j])) | (uint32_t(fp::bf16_encode(f[2 * j + 1])) << 16);
  return make_uint4(w[0], w[1], w[2], w[3]);
}

inline int blocks_for(size_t n, int threads) { return int((n + threads - 1) / threads); }

}  // namespace mla::gpu
