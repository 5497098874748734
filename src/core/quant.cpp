// Host-side weight quantization (quant.h): per-tensor fp8 e4m3fn / e4m3fnuz and MXFP4, built on the
// bit-level encoders of mla/fp_formats.h that the device kernels decode with.
#include "mla/quant.h"

#include <cfloat>
#include <cmath>
#include <string>

#include "mla/error.h"
#include "mla/fp_formats.h"
#include "mla/weights.h"

namespace mla {

namespace {

bool is_float_dtype(DType t) {
  return t == DType::F64 || t == DType::F32 || t == DType::BF16 || t == DType::F16;
}

// A flat element index of shape s as "[i, j, k]".
std::string index_str(const Shape& s, size_t flat) {
  Shape idx(s.size());
  for (size_t d = s.size(); d-- > 0;) {
    const uint64_t n = uint64_t(s[d]);
    idx[d] = n ? int64_t(flat % n) : 0;
    flat = n ? flat / n : 0;
  }
  return shape_str(idx);
}

void check_host_tensor(const Tensor& t, const char* what, const char* name) {
  if (!t.defined()) fail("{}: the {} tensor is undefined", what, name);
  if (t.platform() != Platform::CPU)
    fail("{}: the {} tensor must be on the host, got one on {}", what, name, platform_name(t.platform()));
}

// A defined host tensor of a float dtype.
void check_float_input(const Tensor& t, const char* what) {
  check_host_tensor(t, what, "weight");
  if (!is_float_dtype(t.dtype()))
    fail("{}: weight dtype must be f64, f32, bf16 or f16, got {}", what, dtype_name(t.dtype()));
}

void check_out_dtype(DType out, const char* what) {
  if (!is_float_dtype(out))
    fail("{}: output dtype must be f64, f32, bf16 or f16, got {}", what, dtype_name(out));
}

void check_scale(float scale, const char* what) {
  if (!(std::isfinite(scale) && scale > 0))
    fail("{}: scale must be positive and finite, got {}", what, scale);
}

// f(i, value) for every element of a host float tensor, in order.
template <typename F>
void for_each_value(const Tensor& t, F&& f) {
  const size_t n = size_t(t.numel());
  switch (t.dtype()) {
    case DType::F64: {
      const double* p = t.ptr<double>();
      for (size_t i = 0; i < n; ++i) f(i, p[i]);
      return;
    }
    case DType::F32: {
      const float* p = t.ptr<float>();
      for (size_t i = 0; i < n; ++i) f(i, double(p[i]));
      return;
    }
    case DType::BF16: {
      const bf16* p = t.ptr<bf16>();
      for (size_t i = 0; i < n; ++i) f(i, double(bf16_to_float(p[i])));
      return;
    }
    case DType::F16: {
      const f16* p = t.ptr<f16>();
      for (size_t i = 0; i < n; ++i) f(i, double(f16_to_float(p[i])));
      return;
    }
    default: fail("internal: {} is not a float dtype", dtype_name(t.dtype()));
  }
}

// t[i] = v, rounded once to t's float dtype.
inline void put(Tensor& t, size_t i, double v) {
  switch (t.dtype()) {
    case DType::F64: t.ptr<double>()[i] = v; return;
    case DType::F32: t.ptr<float>()[i] = float(v); return;
    default: store_from_double(t.data(), t.dtype(), i, v);
  }
}

}  // namespace

std::string_view fp8_flavor_name(Fp8Flavor f) {
  switch (f) {
    case Fp8Flavor::E4M3FN: return "e4m3fn";
    case Fp8Flavor::E4M3FNUZ: return "e4m3fnuz";
  }
  fail("unknown fp8 flavor {}", int(f));
}

DType fp8_dtype(Fp8Flavor f) {
  switch (f) {
    case Fp8Flavor::E4M3FN: return DType::F8_E4M3FN;
    case Fp8Flavor::E4M3FNUZ: return DType::F8_E4M3FNUZ;
  }
  fail("unknown fp8 flavor {}", int(f));
}

Fp8Weight quantize_fp8_per_tensor(const Tensor& w, Fp8Flavor f) {
  constexpr const char* what = "quantize_fp8_per_tensor";
  check_float_input(w, what);
  fp8_dtype(f);  // a valid flavor
  double amax = 0;
  for_each_value(w, [&](size_t i, double v) {
    if (!std::isfinite(v))
      fail("{}: weight {} holds a non-finite value {} at {}", what, shape_str(w.shape()), v,
           index_str(w.shape(), i));
    amax = std::fmax(amax, std::fabs(v));
  });
  float scale = 1.f;
  if (amax > 0) {
    const double s = amax / double(fp::kE4m3fnMax);
    if (s > double(FLT_MAX))
      fail("{}: weight amax {} needs a scale {} beyond the f32 range", what, amax, s);
    scale = std::fmax(float(s), FLT_MIN);  // a subnormal scale would lose precision
  }
  Tensor codes = Tensor::host(DType::F8_E4M3FN, w.shape());  // [same as w]
  uint8_t* q = codes.ptr<uint8_t>();
  const double s = scale;
  for_each_value(w, [&](size_t i, double v) { q[i] = fp::e4m3fn_encode(float(v / s)); });
  Fp8Weight out{codes, scale};
  if (f == Fp8Flavor::E4M3FNUZ) return normalize_fn_to_fnuz(out);
  return out;
}

Fp8Weight block_fp8_to_per_tensor(const Tensor& w, const Tensor& scale_inv, Fp8Flavor f,
                                  int64_t block) {
  constexpr const char* what = "block_fp8_to_per_tensor";
  check_host_tensor(w, what, "weight");
  check_host_tensor(scale_inv, what, "scale_inv");
  if (w.dtype() != DType::F8_E4M3FN)
    fail("{}: weight dtype must be fp8_e4m3fn, got {}", what, dtype_name(w.dtype()));
  fp8_dtype(f);
  Tensor d;  // [N, K] f64: code × block scale, exact
  try {
    d = dequantize_block_fp8(w, scale_inv, DType::F64, block);
  } catch (const Error& e) {
    fail("{}: {}", what, e.what());
  }
  const double* p = d.ptr<double>();
  for (size_t i = 0; i < size_t(d.numel()); ++i)
    if (!std::isfinite(p[i])) {
      const int64_t n = int64_t(i) / w.dim(1), k = int64_t(i) % w.dim(1);
      fail("{}: weight element [{}, {}] (code 0x{:02x}, block scale {}) dequantizes to {}", what, n,
           k, w.ptr<uint8_t>()[i], scale_inv.ptr<float>()[(n / block) * scale_inv.dim(1) + k / block],
           p[i]);
    }
  return quantize_fp8_per_tensor(d, f);
}

Fp8Weight normalize_fn_to_fnuz(const Fp8Weight& w) {
  constexpr const char* what = "normalize_fn_to_fnuz";
  check_host_tensor(w.codes, what, "codes");
  if (w.codes.dtype() != DType::F8_E4M3FN)
    fail("{}: codes must be fp8_e4m3fn, got {}", what, dtype_name(w.codes.dtype()));
  check_scale(w.scale, what);
  const float scale2 = w.scale * 2;
  if (!std::isfinite(scale2)) fail("{}: scale {} doubled overflows f32", what, w.scale);
  Tensor out = Tensor::host(DType::F8_E4M3FNUZ, w.codes.shape());  // [same as codes]
  const uint8_t* c = w.codes.ptr<uint8_t>();
  uint8_t* q = out.ptr<uint8_t>();
  for (size_t i = 0; i < size_t(out.numel()); ++i) {
    if ((c[i] & 0x7f) == 0x7f)
      fail("{}: NaN code 0x{:02x} at {} of {}", what, c[i], index_str(out.shape(), i),
           shape_str(out.shape()));
    q[i] = fp::e4m3fn_code_as_fnuz(c[i]);
  }
  return {out, scale2};
}

Tensor dequantize(const Fp8Weight& w, DType out) {
  constexpr const char* what = "dequantize (fp8)";
  check_host_tensor(w.codes, what, "codes");
  if (!is_fp8(w.codes.dtype()))
    fail("{}: codes must be fp8_e4m3fn or fp8_e4m3fnuz, got {}", what, dtype_name(w.codes.dtype()));
  check_out_dtype(out, what);
  check_scale(w.scale, what);
  const bool fnuz = w.codes.dtype() == DType::F8_E4M3FNUZ;
  Tensor r = Tensor::host(out, w.codes.shape());  // [same as codes]
  const uint8_t* c = w.codes.ptr<uint8_t>();
  const double s = w.scale;
  for (size_t i = 0; i < size_t(r.numel()); ++i) {
    const double v = fnuz ? fp::e4m3fnuz_decode(c[i]) : fp::e4m3fn_decode(c[i]);
    if (std::isnan(v))
      fail("{}: NaN code 0x{:02x} at {} of {}", what, c[i], index_str(r.shape(), i),
           shape_str(r.shape()));
    put(r, i, v * s);  // exact product (4 × 24 significant bits), one rounding
  }
  return r;
}

Mxfp4Weight quantize_mxfp4(const Tensor& w) {
  constexpr const char* what = "quantize_mxfp4";
  check_float_input(w, what);
  if (w.rank() < 1) fail("{}: weight must have rank >= 1, got shape {}", what, shape_str(w.shape()));
  const int64_t K = w.dim(-1);
  if (K % 32 != 0)
    fail("{}: the last dim K = {} of weight {} is not a multiple of 32", what, K,
         shape_str(w.shape()));
  Shape ps = w.shape(), ss = w.shape();
  ps.back() = K / 2;
  ss.back() = K / 32;
  Mxfp4Weight out{Tensor::host(DType::U8, ps), Tensor::host(DType::U8, ss), w.shape()};
  // Blocks of 32 run along the last dim and K % 32 == 0, so in flat order block g is elements
  // 32g .. 32g+31, packed bytes 16g .. 16g+15 and scale g.
  uint8_t* packed = out.packed.ptr<uint8_t>();
  uint8_t* scales = out.scales.ptr<uint8_t>();
  float blk[32];
  for_each_value(w, [&](size_t i, double v) {
    if (!(std::fabs(v) <= double(FLT_MAX)))
      fail("{}: weight {} holds {} at {}, not a finite f32 value", what, shape_str(w.shape()), v,
           index_str(w.shape(), i));
    blk[i % 32] = float(v);
    if (i % 32 == 31) scales[i / 32] = fp::mxfp4_quantize_block(blk, packed + 16 * (i / 32));
  });
  return out;
}

Tensor dequantize(const Mxfp4Weight& w, DType out) {
  constexpr const char* what = "dequantize (mxfp4)";
  check_host_tensor(w.packed, what, "packed");
  check_host_tensor(w.scales, what, "scales");
  if (w.packed.dtype() != DType::U8 || w.scales.dtype() != DType::U8)
    fail("{}: packed and scales must be u8, got {} and {}", what, dtype_name(w.packed.dtype()),
         dtype_name(w.scales.dtype()));
  check_out_dtype(out, what);
  if (w.shape.empty()) fail("{}: the weight shape must have rank >= 1, got []", what);
  const int64_t K = w.shape.back();
  if (K % 32 != 0)
    fail("{}: the last dim K = {} of shape {} is not a multiple of 32", what, K, shape_str(w.shape));
  Tensor r = Tensor::host(out, w.shape);  // [.., K]
  Shape ps = w.shape, ss = w.shape;
  ps.back() = K / 2;
  ss.back() = K / 32;
  if (w.packed.shape() != ps || w.scales.shape() != ss)
    fail("{}: packed {} and scales {} do not fit shape {} (expected {} and {})", what,
         shape_str(w.packed.shape()), shape_str(w.scales.shape()), shape_str(w.shape),
         shape_str(ps), shape_str(ss));
  const uint8_t* packed = w.packed.ptr<uint8_t>();
  const uint8_t* scales = w.scales.ptr<uint8_t>();
  for (size_t g = 0; g < size_t(w.scales.numel()); ++g) {
    if (scales[g] == 0xff)
      fail("{}: NaN scale code 0xff at {} of scales {}", what, index_str(ss, g), shape_str(ss));
    const double s = fp::e8m0_decode(scales[g]);
    for (size_t j = 0; j < 16; ++j) {
      const uint8_t b = packed[16 * g + j];
      put(r, 32 * g + 2 * j, double(fp::e2m1_decode(b & 0xf)) * s);
      put(r, 32 * g + 2 * j + 1, double(fp::e2m1_decode(b >> 4)) * s);
    }
  }
  return r;
}

}  // namespace mla
