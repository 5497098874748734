// Exhaustive checks of the element types: every fp8 / bf16 / f16 code against an independent
// decoding from the format definitions, round trips, round-to-nearest-even at every midpoint,
// saturation and NaN handling, names.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "mla/dtype.h"
#include "mla/error.h"

namespace mla {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// 2^e by repeated multiplication: independent of the library's ldexp use.
double pow2(int e) {
  double r = 1;
  for (; e > 0; --e) r *= 2;
  for (; e < 0; ++e) r /= 2;
  return r;
}

uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// ---- independent decoders from the format definitions -------------------------------------------

// OCP e4m3fn: bias 7, subnormals m·2^-9, NaN = S.1111.111, no inf, max 448.
double ref_e4m3fn(uint8_t c) {
  const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double v = e == 0 ? m * pow2(-9) : (8 + m) * pow2(e - 7 - 3);
  return s ? -v : v;
}

// e4m3fnuz: bias 8, subnormals m·2^-10, 0x80 the only NaN, no inf, no -0, max 240.
double ref_e4m3fnuz(uint8_t c) {
  if (c == 0x80) return std::numeric_limits<double>::quiet_NaN();
  const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
  const double v = e == 0 ? m * pow2(-10) : (8 + m) * pow2(e - 8 - 3);
  return s ? -v : v;
}

// IEEE-style binary16 / bfloat16 with `eb` exponent bits and `mb` mantissa bits.
double ref_ieee16(uint16_t c, int eb, int mb) {
  const int s = c >> 15, e = (c >> mb) & ((1 << eb) - 1), m = c & ((1 << mb) - 1);
  const int bias = (1 << (eb - 1)) - 1;
  double v;
  if (e == (1 << eb) - 1)
    v = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else if (e == 0)
    v = m * pow2(1 - bias - mb);
  else
    v = ((1 << mb) + m) * pow2(e - bias - mb);
  return s ? -v : v;
}

bool same_value(double a, double b) {  // NaN equals NaN; the sign of zero matters
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return a == b && std::signbit(a) == std::signbit(b);
}

// ---- a format under test, as functions on codes -------------------------------------------------

struct Format {
  const char* name;
  int bits;                                // 8 or 16
  std::function<double(uint32_t)> ref;     // independent decode
  std::function<float(uint32_t)> decode;   // library decode
  std::function<uint32_t(float)> encode;   // library encode (saturating for fp8)
  uint32_t max_code;                       // largest finite positive code
  uint32_t sign_bit;
};

Format fn_format() {
  return {"e4m3fn", 8, [](uint32_t c) { return ref_e4m3fn(uint8_t(c)); },
          [](uint32_t c) { return fp8_e4m3fn_to_float(uint8_t(c)); },
          [](float f) { return uint32_t(float_to_fp8_e4m3fn(f)); }, 0x7e, 0x80};
}
Format fnuz_format() {
  return {"e4m3fnuz", 8, [](uint32_t c) { return ref_e4m3fnuz(uint8_t(c)); },
          [](uint32_t c) { return fp8_e4m3fnuz_to_float(uint8_t(c)); },
          [](float f) { return uint32_t(float_to_fp8_e4m3fnuz(f)); }, 0x7f, 0x80};
}
Format bf16_format() {
  return {"bf16", 16, [](uint32_t c) { return ref_ieee16(uint16_t(c), 8, 7); },
          [](uint32_t c) { return bf16_to_float(bf16{uint16_t(c)}); },
          [](float f) { return uint32_t(float_to_bf16(f).bits); }, 0x7f7f, 0x8000};
}
Format f16_format() {
  return {"f16", 16, [](uint32_t c) { return ref_ieee16(uint16_t(c), 5, 10); },
          [](uint32_t c) { return f16_to_float(f16{uint16_t(c)}); },
          [](float f) { return uint32_t(float_to_f16(f).bits); }, 0x7bff, 0x8000};
}

std::vector<Format> all_formats() {
  return {fn_format(), fnuz_format(), bf16_format(), f16_format()};
}

TEST(Dtype, EveryCodeDecodesToTheFormatDefinition) {
  for (const Format& f : all_formats()) {
    int nans = 0;
    for (uint32_t c = 0; c < (1u << f.bits); ++c) {
      const double want = f.ref(c);
      const float got = f.decode(c);
      nans += std::isnan(want);
      ASSERT_TRUE(same_value(got, want)) << f.name << " code 0x" << std::hex << c << std::dec
                                         << ": got " << got << ", want " << want;
    }
    // NaN counts: fn 0x7f/0xff, fnuz 0x80 only, IEEE 2·(2^mb − 1).
    const int want_nans = std::string(f.name) == "e4m3fn"     ? 2
                          : std::string(f.name) == "e4m3fnuz" ? 1
                          : std::string(f.name) == "bf16"     ? 2 * 127
                                                              : 2 * 1023;
    EXPECT_EQ(nans, want_nans) << f.name;
  }
  // Spot values from the specs.
  EXPECT_EQ(fp8_e4m3fn_to_float(0x7e), 448.0f);
  EXPECT_EQ(fp8_e4m3fn_to_float(0xfe), -448.0f);
  EXPECT_EQ(fp8_e4m3fn_to_float(0x01), 0x1p-9f);
  EXPECT_EQ(fp8_e4m3fn_to_float(0x08), 0x1p-6f);
  EXPECT_EQ(fp8_e4m3fn_to_float(0x38), 1.0f);
  EXPECT_TRUE(std::isnan(fp8_e4m3fn_to_float(0x7f)));
  EXPECT_TRUE(std::isnan(fp8_e4m3fn_to_float(0xff)));
  EXPECT_TRUE(std::signbit(fp8_e4m3fn_to_float(0x80)));
  EXPECT_EQ(fp8_e4m3fnuz_to_float(0x7f), 240.0f);
  EXPECT_EQ(fp8_e4m3fnuz_to_float(0xff), -240.0f);
  EXPECT_EQ(fp8_e4m3fnuz_to_float(0x01), 0x1p-10f);
  EXPECT_EQ(fp8_e4m3fnuz_to_float(0x40), 1.0f);
  EXPECT_TRUE(std::isnan(fp8_e4m3fnuz_to_float(0x80)));
  EXPECT_EQ(f16_to_float(f16{0x7bff}), 65504.0f);
  EXPECT_EQ(f16_to_float(f16{0x0001}), 0x1p-24f);
  EXPECT_EQ(f16_to_float(f16{0x7c00}), kInf);
  EXPECT_EQ(dtype_max(DType::F8_E4M3FN), 448.0);
  EXPECT_EQ(dtype_max(DType::F8_E4M3FNUZ), 240.0);
  EXPECT_EQ(dtype_max(DType::F16), 65504.0);
  EXPECT_EQ(dtype_max(DType::BF16), double(bf16_to_float(bf16{0x7f7f})));
}

TEST(Dtype, EveryNonNaNCodeRoundTrips) {
  for (const Format& f : all_formats()) {
    for (uint32_t c = 0; c < (1u << f.bits); ++c) {
      const float v = f.decode(c);
      if (std::isnan(v)) {
        // NaN stays NaN (the payload may change).
        EXPECT_TRUE(std::isnan(f.decode(f.encode(v)))) << f.name << " code " << c;
        continue;
      }
      ASSERT_EQ(f.encode(v), c) << f.name << " code 0x" << std::hex << c;
    }
  }
  // fnuz has one zero: +0 and −0 both encode to 0x00.
  EXPECT_EQ(float_to_fp8_e4m3fnuz(0.0f), 0x00);
  EXPECT_EQ(float_to_fp8_e4m3fnuz(-0.0f), 0x00);
  EXPECT_EQ(float_to_fp8_e4m3fn(-0.0f), 0x80);
  EXPECT_EQ(float_to_bf16(-0.0f).bits, 0x8000);
  EXPECT_EQ(float_to_f16(-0.0f).bits, 0x8000);
}

// For every pair of adjacent finite codes (a, b): the midpoint goes to the even code, the floats
// just below and above it go to the nearer. Both signs.
TEST(Dtype, RoundToNearestEvenAtEveryMidpoint) {
  for (const Format& f : all_formats()) {
    int64_t pairs = 0;
    for (uint32_t a = 0; a < f.max_code; ++a) {
      const uint32_t b = a + 1;  // codes are monotonic in value for positive finite values
      const double va = f.ref(a), vb = f.ref(b);
      ASSERT_LT(va, vb);
      const float mid = float((va + vb) / 2);
      ASSERT_EQ(double(mid), (va + vb) / 2) << "midpoint not exact in float";
      const uint32_t even = (a % 2 == 0) ? a : b;
      const float below = std::nextafter(mid, -kInf), above = std::nextafter(mid, kInf);
      for (int sign : {1, -1}) {
        auto code = [&](uint32_t c) {
          // −0 does not exist in fnuz: negatives that round to zero give 0x00.
          if (sign > 0 || (c == 0 && std::string(f.name) == "e4m3fnuz")) return c;
          return c | f.sign_bit;
        };
        const float s = float(sign);
        ASSERT_EQ(f.encode(s * mid), code(even)) << f.name << " midpoint " << s * mid;
        ASSERT_EQ(f.encode(s * below), code(a)) << f.name << " below midpoint " << s * below;
        ASSERT_EQ(f.encode(s * above), code(b)) << f.name << " above midpoint " << s * above;
        ASSERT_EQ(f.encode(s * float(va)), code(a));
      }
      ++pairs;
    }
    EXPECT_EQ(pairs, int64_t(f.max_code));
  }
}

// Random floats of every magnitude: the encoded value is the nearer neighbour (ties to even).
TEST(Dtype, RandomFloatsRoundToTheNearest) {
  std::mt19937 rng(2024);
  for (const Format& f : all_formats()) {
    std::vector<double> grid;  // positive finite values, ascending, index = code
    for (uint32_t c = 0; c <= f.max_code; ++c) grid.push_back(f.ref(c));
    const double maxv = grid.back();
    // Exponents from below the smallest subnormal to above the largest finite value.
    const int e_lo = std::ilogb(grid[1]) - 2, e_hi = std::ilogb(maxv) + 1;
    for (int i = 0; i < 200000; ++i) {
      const float m = bits_float(0x3f800000u | (rng() & 0x7fffffu));  // [1, 2)
      const float x = std::ldexp(m, e_lo + int(rng() % uint32_t(e_hi - e_lo + 1)));
      if (!std::isfinite(x)) continue;
      const uint32_t got = f.encode(x);
      const double gv = f.ref(got);
      auto hi = std::upper_bound(grid.begin(), grid.end(), double(x));
      if (hi == grid.end()) {  // above max: saturates (fp8) or goes to inf / max (IEEE)
        if (f.bits == 8) {
          ASSERT_EQ(got, f.max_code) << f.name << " x " << x;
        } else {
          const double next = maxv + (maxv - grid[grid.size() - 2]);  // 2^(emax+1)
          ASSERT_EQ(gv, (double(x) < (maxv + next) / 2) ? maxv : double(kInf)) << f.name << x;
        }
        continue;
      }
      const double h = *hi, l = *(hi - 1);
      const double dl = double(x) - l, dh = h - double(x);
      const double want = dl < dh ? l : dh < dl ? h : ((hi - grid.begin()) % 2 == 0 ? h : l);
      ASSERT_EQ(gv, want) << f.name << " x " << x;
    }
  }
}

TEST(Dtype, Fp8SaturationAndNaN) {
  for (float big : {1e9f, 449.0f, kInf, 1e30f}) {
    EXPECT_EQ(float_to_fp8_e4m3fn(big, true), 0x7e) << big;
    EXPECT_EQ(float_to_fp8_e4m3fn(-big, true), 0xfe) << big;
    EXPECT_EQ(float_to_fp8_e4m3fnuz(big, true), 0x7f) << big;
    EXPECT_EQ(float_to_fp8_e4m3fnuz(-big, true), 0xff) << big;
    EXPECT_EQ(float_to_fp8_e4m3fnuz(big, false), kFp8E4m3fnuzNaN) << big;
    EXPECT_EQ(float_to_fp8_e4m3fnuz(-big, false), kFp8E4m3fnuzNaN) << big;
  }
  for (float big : {1e9f, kInf, 1e30f, 470.0f, 480.0f}) {
    EXPECT_EQ(float_to_fp8_e4m3fn(big, false) & 0x7f, 0x7f) << big;
    EXPECT_EQ(float_to_fp8_e4m3fn(-big, false) & 0x7f, 0x7f) << big;
  }
  // 449 is within rounding distance of 448, so it is 448 even without saturation.
  EXPECT_EQ(float_to_fp8_e4m3fn(449.0f, false), 0x7e);
  // 464 is the midpoint between 448 (even mantissa) and the NaN position 480: ties to 448.
  EXPECT_EQ(float_to_fp8_e4m3fn(464.0f, false), 0x7e);
  EXPECT_EQ(float_to_fp8_e4m3fn(-464.0f, false), 0xfe);
  EXPECT_EQ(float_to_fp8_e4m3fn(std::nextafter(464.0f, kInf), false), kFp8E4m3fnNaN);
  EXPECT_EQ(float_to_fp8_e4m3fn(std::nextafter(464.0f, kInf), true), 0x7e);
  // fnuz: 240 has an odd mantissa, so the midpoint 248 rounds up to 256 and overflows.
  EXPECT_EQ(float_to_fp8_e4m3fnuz(std::nextafter(248.0f, 0.0f), false), 0x7f);
  EXPECT_EQ(float_to_fp8_e4m3fnuz(248.0f, false), kFp8E4m3fnuzNaN);
  EXPECT_EQ(float_to_fp8_e4m3fnuz(248.0f, true), 0x7f);
  // NaN in, NaN out, whatever the sign or the saturation.
  for (bool sat : {true, false}) {
    for (float n : {kNaN, -kNaN, bits_float(0x7f800001u), bits_float(0xffc12345u)}) {
      EXPECT_EQ(float_to_fp8_e4m3fn(n, sat) & 0x7f, 0x7f);
      EXPECT_TRUE(std::isnan(fp8_e4m3fn_to_float(float_to_fp8_e4m3fn(n, sat))));
      EXPECT_EQ(float_to_fp8_e4m3fnuz(n, sat), kFp8E4m3fnuzNaN);
    }
  }
  // Zeros and tiny values.
  EXPECT_EQ(float_to_fp8_e4m3fn(0.0f), 0x00);
  EXPECT_EQ(float_to_fp8_e4m3fn(-0.0f), 0x80);
  EXPECT_EQ(float_to_fp8_e4m3fnuz(-0.0f), 0x00);
  EXPECT_EQ(float_to_fp8_e4m3fnuz(-0x1p-12f), 0x00);
  EXPECT_EQ(float_to_fp8_e4m3fnuz(-0x1p-11f), 0x00);  // a tie with 0 (even)
  EXPECT_EQ(float_to_fp8_e4m3fnuz(-0x1.000002p-11f), 0x81);
  EXPECT_EQ(float_to_fp8_e4m3fnuz(-1e-40f), 0x00);  // a float subnormal
  EXPECT_EQ(float_to_fp8_e4m3fn(-0x1p-11f), 0x80);
  EXPECT_EQ(float_to_fp8_e4m3fn(1e-40f), 0x00);
  // Rounding up out of the subnormals and across binades.
  EXPECT_EQ(float_to_fp8_e4m3fn(0x1.ep-7f), 0x08);  // 7.5·2^-9, a tie, → 2^-6
  EXPECT_EQ(float_to_fp8_e4m3fn(1.9375f), 0x40);    // midpoint of 1.875 and 2, ties to 2
}

TEST(Dtype, Bf16Specials) {
  EXPECT_EQ(float_to_bf16(kInf).bits, 0x7f80);
  EXPECT_EQ(float_to_bf16(-kInf).bits, 0xff80);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()).bits, 0x7f80);  // rounds to inf
  EXPECT_EQ(float_to_bf16(bits_float(0x7f7f7fffu)).bits, 0x7f7f);
  for (uint32_t n : {0x7f800001u, 0x7fc00000u, 0xff800001u, 0x7fffffffu, 0x7f80ffffu}) {
    const bf16 b = float_to_bf16(bits_float(n));
    EXPECT_TRUE(std::isnan(bf16_to_float(b))) << std::hex << n;  // never collapses to inf
    EXPECT_EQ(b.bits & 0x8000, (n >> 16) & 0x8000);
  }
  // Every float whose top half is a code c truncates or rounds by the low half exactly.
  std::mt19937 rng(7);
  for (int i = 0; i < 100000; ++i) {
    const uint32_t u = rng();
    const float x = bits_float(u);
    if (std::isnan(x)) continue;
    const uint32_t hi = u >> 16, lo = u & 0xffff;
    uint32_t want = hi;
    if (lo > 0x8000 || (lo == 0x8000 && (hi & 1))) ++want;
    ASSERT_EQ(float_to_bf16(x).bits, want) << std::hex << u;
  }
}

TEST(Dtype, F16Specials) {
  EXPECT_EQ(float_to_f16(kInf).bits, 0x7c00);
  EXPECT_EQ(float_to_f16(-kInf).bits, 0xfc00);
  EXPECT_EQ(float_to_f16(1e6f).bits, 0x7c00);
  EXPECT_EQ(float_to_f16(-1e6f).bits, 0xfc00);
  EXPECT_EQ(float_to_f16(65520.0f).bits, 0x7c00);  // midpoint 65504 / 65536: odd max, so inf
  EXPECT_EQ(float_to_f16(std::nextafter(65520.0f, 0.0f)).bits, 0x7bff);
  EXPECT_EQ(float_to_f16(-65519.0f).bits, 0xfbff);
  EXPECT_EQ(float_to_f16(0x1p-25f).bits, 0x0000);  // tie with 0
  EXPECT_EQ(float_to_f16(-0x1p-25f).bits, 0x8000);
  EXPECT_EQ(float_to_f16(0x1.8p-25f).bits, 0x0001);
  EXPECT_EQ(float_to_f16(0x1.ffcp-15f).bits, 0x0400);  // subnormal rounding up to the normals
  for (uint32_t n : {0x7f800001u, 0x7fc00000u, 0xffc00000u}) {
    EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(bits_float(n)))));
  }
}

// Generic access by dtype: every dtype stores and loads its own values exactly.
TEST(Dtype, LoadStoreByDtype) {
  const std::vector<double> vals{0.0, 1.0, -2.5, 0.375, -448.0, 240.0, 3.0};
  for (DType t : {DType::F64, DType::F32, DType::BF16, DType::F16, DType::F8_E4M3FN,
                  DType::F8_E4M3FNUZ, DType::I32, DType::I64}) {
    std::vector<unsigned char> buf(vals.size() * dtype_size(t));
    for (size_t i = 0; i < vals.size(); ++i) {
      double v = vals[i];
      if (t == DType::F8_E4M3FNUZ && v == -448.0) v = -240.0;
      if ((t == DType::I32 || t == DType::I64) && v != std::floor(v)) v = std::floor(v);
      store_from_double(buf.data(), t, i, v);
      EXPECT_EQ(load_as_double(buf.data(), t, i), v) << dtype_name(t) << " " << v;
    }
  }
  // Rounding on store is round-to-nearest-even.
  unsigned char b[2];
  store_from_double(b, DType::BF16, 0, 1.0 + 0x1p-8);
  EXPECT_EQ(load_as_double(b, DType::BF16, 0), 1.0);
  store_from_double(b, DType::BF16, 0, 1.0 + 3 * 0x1p-8);
  EXPECT_EQ(load_as_double(b, DType::BF16, 0), 1.0 + 0x1p-6);
  store_from_double(b, DType::F8_E4M3FN, 0, 1e9);
  EXPECT_EQ(load_as_double(b, DType::F8_E4M3FN, 0), 448.0);  // the generic path saturates
}

// Known issue: store_from_double rounds double → float → target, so a double just above a
// midpoint of the target grid can round twice and land on the wrong side (1 ulp off).
// Disabled until dtype.cpp rounds doubles directly; see the report.
TEST(Dtype, StoreFromDoubleRoundsOnce) {
  unsigned char b[2];
  store_from_double(b, DType::BF16, 0, 1.0 + 0x1p-8 + 0x1p-40);
  EXPECT_EQ(load_as_double(b, DType::BF16, 0), 1.0 + 0x1p-7);
  store_from_double(b, DType::F16, 0, 1.0 + 0x1p-11 + 0x1p-40);
  EXPECT_EQ(load_as_double(b, DType::F16, 0), 1.0 + 0x1p-10);
  store_from_double(b, DType::F8_E4M3FN, 0, 1.0 + 0x1p-4 + 0x1p-40);
  EXPECT_EQ(load_as_double(b, DType::F8_E4M3FN, 0), 1.125);
}

TEST(Dtype, NamesSizesAndParsing) {
  for (DType t : {DType::F64, DType::F32, DType::BF16, DType::F16, DType::F8_E4M3FN,
                  DType::F8_E4M3FNUZ, DType::I32, DType::I64})
    EXPECT_EQ(parse_dtype(dtype_name(t)), t) << dtype_name(t);
  EXPECT_EQ(dtype_name(DType::BF16), "bf16");
  EXPECT_EQ(dtype_name(DType::F8_E4M3FN), "fp8_e4m3fn");
  EXPECT_EQ(dtype_name(DType::F8_E4M3FNUZ), "fp8_e4m3fnuz");
  EXPECT_EQ(parse_dtype("fp8"), DType::F8_E4M3FN);
  EXPECT_EQ(parse_dtype("fp8_e4m3"), DType::F8_E4M3FN);
  for (const char* bad : {"float32", "", "BF16", "fp8_e5m2"}) {
    try {
      parse_dtype(bad);
      ADD_FAILURE() << "no error for '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("'") + bad + "'"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_EQ(dtype_size(DType::F64), 8u);
  EXPECT_EQ(dtype_size(DType::F32), 4u);
  EXPECT_EQ(dtype_size(DType::BF16), 2u);
  EXPECT_EQ(dtype_size(DType::F16), 2u);
  EXPECT_EQ(dtype_size(DType::F8_E4M3FN), 1u);
  EXPECT_EQ(dtype_size(DType::F8_E4M3FNUZ), 1u);
  EXPECT_EQ(dtype_size(DType::I32), 4u);
  EXPECT_EQ(dtype_size(DType::I64), 8u);
  EXPECT_TRUE(is_fp8(DType::F8_E4M3FN));
  EXPECT_TRUE(is_fp8(DType::F8_E4M3FNUZ));
  EXPECT_FALSE(is_fp8(DType::BF16));
  EXPECT_FALSE(is_fp8(DType::I32));
}

}  // namespace
}  // namespace mla
