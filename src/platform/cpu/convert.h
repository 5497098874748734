// Bulk conversions between storage dtypes and the CPU accumulation types (double, float).
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>

#include "mla/dtype.h"
#include "mla/error.h"

namespace mla::cpu {

inline const std::array<float, 256>& fp8_table(DType t) {
  static const auto make = [](bool fnuz) {
    std::array<float, 256> a{};
    for (int c = 0; c < 256; ++c)
      a[size_t(c)] = fnuz ? fp8_e4m3fnuz_to_float(uint8_t(c)) : fp8_e4m3fn_to_float(uint8_t(c));
    return a;
  };
  static const std::array<float, 256> fn = make(false), fnuz = make(true);
  return t == DType::F8_E4M3FNUZ ? fnuz : fn;
}

// out[i] = base[offset + i] · scale for i < n
template <typename A>
void load_row(const void* base, DType t, size_t offset, size_t n, A* out, double scale = 1.0) {
  const A s = A(scale);
  switch (t) {
    case DType::F64: {
      const double* p = static_cast<const double*>(base) + offset;
      for (size_t i = 0; i < n; ++i) out[i] = A(p[i]) * s;
      return;
    }
    case DType::F32: {
      const float* p = static_cast<const float*>(base) + offset;
      for (size_t i = 0; i < n; ++i) out[i] = A(p[i]) * s;
      return;
    }
    case DType::BF16: {
      const bf16* p = static_cast<const bf16*>(base) + offset;
      for (size_t i = 0; i < n; ++i) out[i] = A(bf16_to_float(p[i])) * s;
      return;
    }
    case DType::F8_E4M3FN:
    case DType::F8_E4M3FNUZ: {
      const auto& lut = fp8_table(t);
      const uint8_t* p = static_cast<const uint8_t*>(base) + offset;
      for (size_t i = 0; i < n; ++i) out[i] = A(lut[p[i]]) * s;
      return;
    }
    default:
      for (size_t i = 0; i < n; ++i) out[i] = A(load_as_double(base, t, offset + i)) * s;
  }
}

// base[offset + i] = in[i] / scale, rounded to t (nearest even; fp8 saturates)
template <typename A>
void store_row(const A* in, size_t n, void* base, DType t, size_t offset, double scale = 1.0) {
  const A inv = A(1.0 / scale);
  switch (t) {
    case DType::F64: {
      double* p = static_cast<double*>(base) + offset;
      for (size_t i = 0; i < n; ++i) p[i] = double(in[i] * inv);
      return;
    }
    case DType::F32: {
      float* p = static_cast<float*>(base) + offset;
      for (size_t i = 0; i < n; ++i) p[i] = float(in[i] * inv);
      return;
    }
    case DType::BF16: {
      bf16* p = static_cast<bf16*>(base) + offset;
      for (size_t i = 0; i < n; ++i) p[i] = float_to_bf16(float(in[i] * inv));
      return;
    }
    default:
      for (size_t i = 0; i < n; ++i) store_from_double(base, t, offset + i, double(in[i] * inv));
  }
}

}  // namespace mla::cpu
