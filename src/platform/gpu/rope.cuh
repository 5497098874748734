// RoPE on the device, shared by the GPU kernels that rotate: the angle pos · inv_freq[i] and its
// cos/sin in double (as the reference computes them), then × attention_factor in f32; pair i is
// columns (2i, 2i+1) when interleaved (DeepSeek's rope_interleave) or (i, i + half) (NeoX halves).
#pragma once
#include <cstdint>

namespace mla::gpu {

__device__ __forceinline__ void rope_cos_sin(int32_t pos, double inv_freq, double attention_factor, float& c,
                                             float& s) {
  double sn, cs;
  sincos(double(pos) * inv_freq, &sn, &cs);
  c = float(cs * attention_factor), s = float(sn * attention_factor);
}
// Pair (x0, x1) rotated by the angle whose cos/sin are (c, s), with every rounding spelled out: left
// to itself the compiler contracts x0·s + x1·c into an fma on either product, by context (a fused
// kernel and the plain one came out different), so every RoPE kernel rotates through this.
__device__ __forceinline__ void rope_rotate(float x0, float x1, float c, float s, float& y0, float& y1) {
  y0 = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
  y1 = __fmaf_rn(x0, s, __fmul_rn(x1, c));
}
__device__ __forceinline__ int64_t rope_first(int64_t i, int64_t half, bool interleave) {
  return interleave ? 2 * i : i;
}
__device__ __forceinline__ int64_t rope_second(int64_t i, int64_t half, bool interleave) {
  return interleave ? 2 * i + 1 : i + half;
}

}  // namespace mla::gpu
