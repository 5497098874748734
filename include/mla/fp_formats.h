// mla/fp_formats.h — the narrow number formats as bit-level functions usable on the host and in
// GPU kernels (CUDA and HIP) alike: one implementation, tested exhaustively on the CPU
// (tests/test_fp_formats.cpp) and run unchanged by the device kernels.
//   bf16      1-8-7, round to nearest even.
//   e4m3fn    OCP fp8: bias 7, no infinity, NaN = S.1111.111, max 448.
//   e4m3fnuz  AMD gfx942 fp8: bias 8, no infinity, no −0, NaN = 0x80 alone, max 240.
//   e2m1      OCP fp4 (MXFP4 elements): bias 1, values 0, 0.5, 1, 1.5, 2, 3, 4, 6; no NaN/inf.
//   e8m0      OCP MX scale: 2^(code − 127), code 0xFF = NaN.
// Encoders round to nearest even and saturate to ±max (the quantizers' convention); NaN encodes to
// the format's NaN (e2m1 has none: NaN → +0 is never asked of it; callers check finiteness).
#pragma once
#include <cstdint>

#if defined(__HIPCC__)
#include <hip/hip_runtime.h>
#define MLA_HD __host__ __device__ __forceinline__
#elif defined(__CUDACC__)
#define MLA_HD __host__ __device__ __forceinline__
#else
#define MLA_HD inline
#endif

namespace mla::fp {

MLA_HD uint32_t f32_bits(float f) {
  union {
    float f;
    uint32_t u;
  } v{f};
  return v.u;
}
MLA_HD float bits_f32(uint32_t u) {
  union {
    uint32_t u;
    float f;
  } v{u};
  return v.f;
}
// 2^e for −149 ≤ e ≤ 127, exactly (subnormal powers included).
MLA_HD float exp2i(int e) {
  if (e >= -126) return bits_f32(uint32_t(e + 127) << 23);
  return bits_f32(1u << (e + 149));
}

// ---- bf16 -------------------------------------------------------------------------------------
MLA_HD float bf16_decode(uint16_t b) { return bits_f32(uint32_t(b) << 16); }
MLA_HD uint16_t bf16_encode(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

// ---- small float encode/decode, shared by e4m3 and e2m1 ----------------------------------------
// Magnitude |f| (finite, ≥ 0) → the code of a format with `mbits` mantissa bits, exponent bias
// `bias`, rounded to nearest even, saturated to `max_code` (the largest finite magnitude's code).
// Subnormals have exponent field 0.
MLA_HD uint32_t encode_magnitude(float a, int mbits, int bias, uint32_t max_code) {
  const int min_exp = 1 - bias;  // exponent of the smallest normal
  // The quantum (spacing) at a's binade, never below the subnormal quantum.
  const uint32_t ua = f32_bits(a);
  int e = int((ua >> 23) & 0xff) - 127;
  if (a == 0.0f) return 0;
  if (e < min_exp) e = min_exp;
  const float quantum = exp2i(e - mbits);
  // a / quantum is exact (a power-of-two division within range); round to nearest even.
  const float q = a / quantum;  // exact; below 2^(mbits+1) unless a is past the format's range
  if (q >= float(4u << mbits)) return max_code;
  uint32_t n = uint32_t(q);  // floor
  const float frac = q - float(n);  // exact
  if (frac > 0.5f || (frac == 0.5f && (n & 1u))) ++n;  // to nearest, ties to even
  // Assemble: value = n · quantum. If n reached 2^(mbits+1) the exponent steps up.
  uint32_t code;
  if (e == min_exp && n < (1u << mbits)) {
    code = n;  // subnormal
  } else {
    int ee = e;
    if (n >= (2u << mbits)) {
      n >>= 1;
      ++ee;
    }
    code = (uint32_t(ee + bias) << mbits) | (n & ((1u << mbits) - 1));
  }
  return code > max_code ? max_code : code;
}
MLA_HD float decode_magnitude(uint32_t code, int mbits, int bias) {
  const uint32_t m = code & ((1u << mbits) - 1), ef = code >> mbits;
  if (ef == 0) return float(m) * exp2i(1 - bias - mbits);
  return float((1u << mbits) | m) * exp2i(int(ef) - bias - mbits);
}

// ---- fp8 e4m3fn / e4m3fnuz --------------------------------------------------------------------
inline constexpr float kE4m3fnMax = 448.0f;
inline constexpr float kE4m3fnuzMax = 240.0f;
MLA_HD float e4m3fn_decode(uint8_t c) {
  if ((c & 0x7f) == 0x7f) return bits_f32(0x7fc00000u);
  const float a = decode_magnitude(c & 0x7fu, 3, 7);
  return (c & 0x80) ? -a : a;
}
MLA_HD uint8_t e4m3fn_encode(float f) {
  const uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7f;
  const float a = bits_f32(u & 0x7fffffffu);
  const uint32_t m = a > kE4m3fnMax ? 0x7eu : encode_magnitude(a, 3, 7, 0x7eu);
  return uint8_t(m | ((u >> 24) & 0x80u));
}
MLA_HD float e4m3fnuz_decode(uint8_t c) {
  if (c == 0x80) return bits_f32(0x7fc00000u);
  const float a = decode_magnitude(c & 0x7fu, 3, 8);
  return (c & 0x80) ? -a : a;
}
MLA_HD uint8_t e4m3fnuz_encode(float f) {
  const uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x80;
  const float a = bits_f32(u & 0x7fffffffu);
  const uint32_t m = a > kE4m3fnuzMax ? 0x7fu : encode_magnitude(a, 3, 8, 0x7fu);
  if (m == 0) return 0;  // no negative zero
  return uint8_t(m | ((u >> 24) & 0x80u));
}
// An e4m3fn code read as e4m3fnuz: the same bits mean half the value (bias 8 instead of 7), so a
// per-tensor scale doubles; the fn code of −0 (0x80) is fnuz's NaN and becomes +0. fn NaN codes
// (0x7f, 0xff) have no fnuz twin and are not expected (quantized weights are finite).
MLA_HD uint8_t e4m3fn_code_as_fnuz(uint8_t c) { return c == 0x80 ? uint8_t(0) : c; }

// ---- fp4 e2m1 (two per byte: element 2i in the low nibble, 2i+1 in the high nibble) ------------
inline constexpr float kE2m1Max = 6.0f;
MLA_HD float e2m1_decode(uint8_t nibble) {
  const float a = decode_magnitude(nibble & 0x7u, 1, 1);
  return (nibble & 0x8) ? -a : a;
}
MLA_HD uint8_t e2m1_encode(float f) {  // finite f
  const uint32_t u = f32_bits(f);
  const float a = bits_f32(u & 0x7fffffffu);
  const uint32_t m = a > kE2m1Max ? 0x7u : encode_magnitude(a, 1, 1, 0x7u);
  return uint8_t(m | ((u >> 28) & 0x8u));
}

// ---- e8m0 scales ------------------------------------------------------------------------------
MLA_HD float e8m0_decode(uint8_t c) {
  if (c == 0xff) return bits_f32(0x7fc00000u);
  return exp2i(int(c) - 127);  // codes 0 and 1 (2^-127, 2^-126) are exact in f32
}

// The MXFP4 shared scale of a block whose largest magnitude is `amax` (finite): 2^X with
// X = floor(log2(amax')) − 2, where amax' is amax with its mantissa rounded up at 0.75 (so a block
// whose top value would need more than 1.75·2^(X+2) moves one binade up instead of clipping hard at
// 6·2^X; the OCP spec's rule plus the rounding that production MXFP4 quantizers apply). X is clamped
// to [−127, 125], inside e8m0's [−127, 127]: the round-up would give amax ≥ 1.75·2^127 the scale
// 2^126, whose element 4 dequantizes to 2^128 = inf in f32; such a block saturates at 6·2^125
// instead. An all-zero block gets code 0.
MLA_HD uint8_t mxfp4_scale_code(float amax) {
  if (!(amax > 0.0f)) return 0;
  const uint32_t r = (f32_bits(amax) + 0x200000u) & 0xff800000u;
  int x = int((r >> 23) & 0xff) - 127 - 2;  // subnormal amax: treated as its binade floor, clamped
  if (x < -127) x = -127;
  if (x > 125) x = 125;  // 4·2^126 is not an f32
  return uint8_t(x + 127);
}

// Quantize one block of 32 values → 16 bytes of e2m1 pairs + 1 e8m0 code. Dequantized value i is
// e2m1_decode(nibble i) · e8m0_decode(code).
MLA_HD uint8_t mxfp4_quantize_block(const float* v, uint8_t* packed /*16*/) {
  float amax = 0.0f;
  for (int i = 0; i < 32; ++i) {
    const float a = v[i] < 0 ? -v[i] : v[i];
    amax = a > amax ? a : amax;
  }
  const uint8_t code = mxfp4_scale_code(amax);
  const float inv = 1.0f / e8m0_decode(code);  // exact: a power of two (2^127 at most)
  for (int i = 0; i < 16; ++i)
    packed[i] = uint8_t(e2m1_encode(v[2 * i] * inv) | (e2m1_encode(v[2 * i + 1] * inv) << 4));
  return code;
}

}  // namespace mla::fp
