// mla/dtype.h — element types and their round-to-nearest-even conversions.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace mla {

enum class DType : uint8_t {
  F64,          // host reference only
  F32,
  BF16,
  F16,
  F8_E4M3FN,    // OCP e4m3: bias 7, no inf, NaN = S.1111.111, max 448
  F8_E4M3FNUZ,  // AMD gfx942 e4m3: bias 8, no inf, no -0, NaN = 0x80, max 240
  I32,
  I64,
  U8,           // raw bytes (packed fp4 elements, e8m0 scales): an unsigned integer 0..255
};

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);  // "f32", "bf16", "fp8_e4m3fn", ...
DType parse_dtype(std::string_view s);  // accepts our names; throws Error naming the value
bool is_fp8(DType t);
double dtype_max(DType t);  // largest finite value

// ---- bf16 -------------------------------------------------------------------------------------
struct bf16 {
  uint16_t bits;
};
inline float bf16_to_float(bf16 v) {
  uint32_t u = uint32_t(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline bf16 float_to_bf16(float f) {  // round to nearest even; NaN stays a (quiet) NaN
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{uint16_t((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{uint16_t(u >> 16)};
}

// ---- f16 --------------------------------------------------------------------------------------
struct f16 {
  uint16_t bits;
};
float f16_to_float(f16 v);
f16 float_to_f16(float f);  // round to nearest even, overflow to inf

// ---- fp8 e4m3 ---------------------------------------------------------------------------------
// Decoding is exact. Encoding rounds to nearest even. With `saturate` (the default, as KV-cache
// and weight quantizers do) values beyond the largest finite value clamp to ±max; without it they
// become NaN (neither format has an infinity). NaN always encodes to the format's NaN.
float fp8_e4m3fn_to_float(uint8_t code);
float fp8_e4m3fnuz_to_float(uint8_t code);
uint8_t float_to_fp8_e4m3fn(float f, bool saturate = true);
uint8_t float_to_fp8_e4m3fnuz(float f, bool saturate = true);
inline constexpr uint8_t kFp8E4m3fnNaN = 0x7f;
inline constexpr uint8_t kFp8E4m3fnuzNaN = 0x80;

// Generic scalar access by dtype (slow path: tests, loaders, reference).
double load_as_double(const void* base, DType t, size_t index);
void store_from_double(void* base, DType t, size_t index, double v);
// dst[0, n) = src[0, n) converted: the same values store_from_double(load_as_double(...)) gives,
// with fast paths for the weight conversions (same dtype, bf16 → f32/f64, f32 → bf16/f64).
void convert_elements(const void* src, DType from, void* dst, DType to, size_t n);

}  // namespace mla
