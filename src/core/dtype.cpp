// Element types: names, sizes and round-to-nearest-even conversions for the small floats.
#include "mla/dtype.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "mla/error.h"

namespace mla {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F64: case DType::I64: return 8;
    case DType::F32: case DType::I32: return 4;
    case DType::BF16: case DType::F16: return 2;
    case DType::F8_E4M3FN: case DType::F8_E4M3FNUZ: case DType::U8: return 1;
  }
  return 0;
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F64: return "f64";
    case DType::F32: return "f32";
    case DType::BF16: return "bf16";
    case DType::F16: return "f16";
    case DType::F8_E4M3FN: return "fp8_e4m3fn";
    case DType::F8_E4M3FNUZ: return "fp8_e4m3fnuz";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    case DType::U8: return "u8";
  }
  return "?";
}

DType parse_dtype(std::string_view s) {
  for (DType t : {DType::F64, DType::F32, DType::BF16, DType::F16, DType::F8_E4M3FN,
                  DType::F8_E4M3FNUZ, DType::I32, DType::I64, DType::U8})
    if (s == dtype_name(t)) return t;
  if (s == "fp8" || s == "fp8_e4m3") return DType::F8_E4M3FN;
  fail("unknown dtype '{}' (known: f32, bf16, f16, fp8_e4m3fn, fp8_e4m3fnuz)", s);
}

bool is_fp8(DType t) { return t == DType::F8_E4M3FN || t == DType::F8_E4M3FNUZ; }

double dtype_max(DType t) {
  switch (t) {
    case DType::F64: return std::numeric_limits<double>::max();
    case DType::F32: return std::numeric_limits<float>::max();
    case DType::BF16: return 3.38953138925153547590470800371487866880e38;
    case DType::F16: return 65504.0;
    case DType::F8_E4M3FN: return 448.0;
    case DType::F8_E4M3FNUZ: return 240.0;
    case DType::I32: return std::numeric_limits<int32_t>::max();
    case DType::I64: return 9.2233720368547758e18;
    case DType::U8: return 255.0;
  }
  return 0;
}

namespace {

// Rounds |x| (finite, >= 0) to the grid of a binary format with `mant_bits` fraction bits and
// smallest normal exponent `emin` (subnormals below it), ties to even. Unbounded above.
double round_to_grid(double x, int mant_bits, int emin) {
  if (x == 0) return 0;
  int e;
  std::frexp(x, &e);  // x = f * 2^e, f in [0.5, 1)
  int exp = e - 1;    // x = 1.m * 2^exp
  if (exp < emin) exp = emin;
  double quantum = std::ldexp(1.0, exp - mant_bits);
  return std::nearbyint(x / quantum) * quantum;  // default rounding mode: nearest even
}

// Packs a value already on the grid (finite, >= 0, <= max) into exponent and mantissa fields.
uint32_t pack_fields(double r, int mant_bits, int emin, int bias) {
  if (r == 0) return 0;
  int e;
  std::frexp(r, &e);
  int exp = e - 1;
  if (exp < emin) return uint32_t(r / std::ldexp(1.0, emin - mant_bits));  // subnormal
  uint32_t mant = uint32_t((r / std::ldexp(1.0, exp) - 1.0) * (1 << mant_bits));
  return (uint32_t(exp + bias) << mant_bits) | mant;
}

uint8_t encode_e4m3(double f, bool saturate, bool fnuz) {
  const int bias = fnuz ? 8 : 7;
  const int emin = 1 - bias;
  const double maxv = fnuz ? 240.0 : 448.0;
  const uint8_t nan = fnuz ? kFp8E4m3fnuzNaN : kFp8E4m3fnNaN;
  if (std::isnan(f)) return nan;
  const bool neg = std::signbit(f);
  double a = std::fabs(f);
  double r = std::isinf(a) ? std::numeric_limits<double>::infinity() : round_to_grid(a, 3, emin);
  if (r > maxv) {
    if (!saturate) return nan;
    r = maxv;
  }
  uint8_t code = uint8_t(pack_fields(r, 3, emin, bias));
  if (neg && !(fnuz && code == 0)) code |= 0x80;  // fnuz has no -0: it would be the NaN code
  return code;
}

float decode_e4m3(uint8_t code, bool fnuz) {
  const int bias = fnuz ? 8 : 7;
  if (fnuz ? code == kFp8E4m3fnuzNaN : (code & 0x7f) == 0x7f)
    return std::numeric_limits<float>::quiet_NaN();
  const int exp = (code >> 3) & 0xf, mant = code & 7;
  double v = exp == 0 ? std::ldexp(double(mant), 1 - bias - 3)
                      : std::ldexp(1.0 + mant / 8.0, exp - bias);
  return float((code & 0x80) ? -v : v);
}

}  // namespace

float fp8_e4m3fn_to_float(uint8_t code) { return decode_e4m3(code, false); }
float fp8_e4m3fnuz_to_float(uint8_t code) { return decode_e4m3(code, true); }
uint8_t float_to_fp8_e4m3fn(float f, bool saturate) { return encode_e4m3(f, saturate, false); }
uint8_t float_to_fp8_e4m3fnuz(float f, bool saturate) { return encode_e4m3(f, saturate, true); }

float f16_to_float(f16 v) {
  const uint32_t s = v.bits >> 15, e = (v.bits >> 10) & 0x1f, m = v.bits & 0x3ff;
  double r;
  if (e == 0x1f) r = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else if (e == 0) r = std::ldexp(double(m), -24);
  else r = std::ldexp(1.0 + m / 1024.0, int(e) - 15);
  return float(s ? -r : r);
}

namespace {
f16 double_to_f16(double f) {
  if (std::isnan(f)) return f16{0x7e00};
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  double a = std::fabs(f);
  double r = std::isinf(a) ? a : round_to_grid(a, 10, -14);
  if (r > 65504.0) return f16{uint16_t(sign | 0x7c00)};
  return f16{uint16_t(sign | pack_fields(r, 10, -14, 15))};
}

// One rounding from double (a double → float → bf16 chain would round twice).
bf16 double_to_bf16(double f) {
  if (std::isnan(f)) return bf16{0x7fc0};
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  double a = std::fabs(f);
  double r = std::isinf(a) ? a : round_to_grid(a, 7, -126);
  if (r > dtype_max(DType::BF16)) return bf16{uint16_t(sign | 0x7f80)};
  return bf16{uint16_t(sign | pack_fields(r, 7, -126, 127))};
}
}  // namespace

f16 float_to_f16(float f) { return double_to_f16(f); }

double load_as_double(const void* base, DType t, size_t i) {
  switch (t) {
    case DType::F64: return static_cast<const double*>(base)[i];
    case DType::F32: return static_cast<const float*>(base)[i];
    case DType::BF16: return bf16_to_float(static_cast<const bf16*>(base)[i]);
    case DType::F16: return f16_to_float(static_cast<const f16*>(base)[i]);
    case DType::F8_E4M3FN: return fp8_e4m3fn_to_float(static_cast<const uint8_t*>(base)[i]);
    case DType::F8_E4M3FNUZ: return fp8_e4m3fnuz_to_float(static_cast<const uint8_t*>(base)[i]);
    case DType::I32: return static_cast<const int32_t*>(base)[i];
    case DType::I64: return double(static_cast<const int64_t*>(base)[i]);
    case DType::U8: return static_cast<const uint8_t*>(base)[i];
  }
  return 0;
}

void store_from_double(void* base, DType t, size_t i, double v) {
  switch (t) {
    case DType::F64: static_cast<double*>(base)[i] = v; return;
    case DType::F32: static_cast<float*>(base)[i] = float(v); return;
    case DType::BF16: static_cast<bf16*>(base)[i] = double_to_bf16(v); return;
    case DType::F16: static_cast<f16*>(base)[i] = double_to_f16(v); return;
    case DType::F8_E4M3FN: static_cast<uint8_t*>(base)[i] = encode_e4m3(v, true, false); return;
    case DType::F8_E4M3FNUZ: static_cast<uint8_t*>(base)[i] = encode_e4m3(v, true, true); return;
    case DType::I32: static_cast<int32_t*>(base)[i] = int32_t(v); return;
    case DType::I64: static_cast<int64_t*>(base)[i] = int64_t(v); return;
    case DType::U8:  // truncated like the other integers, clamped to 0..255 (NaN → 0)
      static_cast<uint8_t*>(base)[i] = v >= 255.0 ? uint8_t(255) : v > 0.0 ? uint8_t(v) : uint8_t(0);
      return;
  }
}

void convert_elements(const void* src, DType from, void* dst, DType to, size_t n) {
  if (from == to) {
    std::memcpy(dst, src, n * dtype_size(from));
    return;
  }
  auto each = [&](auto load, auto store) {
    for (size_t i = 0; i < n; ++i) store(i, load(i));
  };
  const auto* f32 = static_cast<const float*>(src);
  const auto* b16 = static_cast<const bf16*>(src);
  if (from == DType::BF16 && to == DType::F32)
    return each([&](size_t i) { return bf16_to_float(b16[i]); }, [&](size_t i, float v) { static_cast<float*>(dst)[i] = v; });
  if (from == DType::BF16 && to == DType::F64)
    return each([&](size_t i) { return bf16_to_float(b16[i]); }, [&](size_t i, float v) { static_cast<double*>(dst)[i] = v; });
  if (from == DType::F32 && to == DType::F64)
    return each([&](size_t i) { return f32[i]; }, [&](size_t i, float v) { static_cast<double*>(dst)[i] = v; });
  if (from == DType::F32 && to == DType::BF16)  // one rounding, as double_to_bf16; NaN as it writes it
    return each([&](size_t i) { return f32[i]; }, [&](size_t i, float v) {
      static_cast<bf16*>(dst)[i] = std::isnan(v) ? bf16{0x7fc0} : float_to_bf16(v);
    });
  for (size_t i = 0; i < n; ++i) store_from_double(dst, to, i, load_as_double(src, from, i));
}

}  // namespace mla
