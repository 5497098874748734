// Exhaustive CPU tests of mla/fp_formats.h: every code of every format against formulas written here,
// rounding at every midpoint, saturation, NaN, agreement with dtype.cpp, and the MXFP4 block quantizer.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "mla/dtype.h"
#include "mla/fp_formats.h"

namespace mla {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// 2^e by repeated multiplication in double: independent of the header's exp2i.
double pow2(int e) {
  double r = 1;
  for (; e > 0; --e) r *= 2;
  for (; e < 0; ++e) r /= 2;
  return r;
}

bool same_value(double a, double b) {  // NaN equals NaN; the sign of zero matters
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return a == b && std::signbit(a) == std::signbit(b);
}

std::string hex(uint32_t v) {
  std::ostringstream s;
  s << "0x" << std::hex << v;
  return s.str();
}

// ---- the formats, from their definitions ---------------------------------------------------------

// e4m3: sign, 4 exponent bits, 3 mantissa bits; subnormals m·2^(1−bias−3).
double ref_e4m3(uint8_t c, int bias) {
  const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
  const double v = e == 0 ? m * pow2(1 - bias - 3) : (8 + m) * pow2(e - bias - 3);
  return s ? -v : v;
}
double ref_fn(uint8_t c) {  // OCP: NaN = S.1111.111, max 448
  return (c & 0x7f) == 0x7f ? kNaN : ref_e4m3(c, 7);
}
double ref_fnuz(uint8_t c) {  // AMD: NaN = 0x80 alone (the would-be −0), max 240
  return c == 0x80 ? kNaN : ref_e4m3(c, 8);
}
// e2m1: sign in bit 3, 2 exponent bits (bias 1), 1 mantissa bit; subnormal m·0.5.
double ref_e2m1(uint8_t n) {
  const int s = (n >> 3) & 1, e = (n >> 1) & 3, m = n & 1;
  const double v = e == 0 ? m * 0.5 : (2 + m) * pow2(e - 1 - 1);
  return s ? -v : v;
}
// bf16: the top half of an f32.
double ref_bf16(uint16_t c) {
  const int s = c >> 15, e = (c >> 7) & 0xff, m = c & 0x7f;
  double v;
  if (e == 0xff) v = m ? kNaN : std::numeric_limits<double>::infinity();
  else if (e == 0) v = m * pow2(-126 - 7);
  else v = (128 + m) * pow2(e - 127 - 7);
  return s ? -v : v;
}

// A format as code ↔ value functions; codes 0..max_code are the positive finite values, ascending.
struct Fp8 {
  const char* name;
  double (*ref)(uint8_t);
  float (*decode)(uint8_t);
  uint8_t (*encode)(float);
  float (*lib_decode)(uint8_t);  // dtype.cpp's
  uint8_t (*lib_encode)(float);
  uint8_t max_code;
  double max;
  bool fnuz;
};
uint8_t lib_fn_encode(float f) { return float_to_fp8_e4m3fn(f); }
uint8_t lib_fnuz_encode(float f) { return float_to_fp8_e4m3fnuz(f); }
const Fp8 kFn{"e4m3fn", ref_fn, fp::e4m3fn_decode, fp::e4m3fn_encode, fp8_e4m3fn_to_float,
              lib_fn_encode, 0x7e, 448.0, false};
const Fp8 kFnuz{"e4m3fnuz", ref_fnuz, fp::e4m3fnuz_decode, fp::e4m3fnuz_encode,
                fp8_e4m3fnuz_to_float, lib_fnuz_encode, 0x7f, 240.0, true};
const Fp8* const kFp8s[] = {&kFn, &kFnuz};

// The code a negative value of magnitude code c takes: fnuz has no −0.
uint8_t neg_code(const Fp8& f, uint8_t c) { return f.fnuz && c == 0 ? 0 : uint8_t(c | 0x80); }

// Nearest grid value index of a ≥ 0 (grid ascending, index = code), ties to the even index,
// saturated to the last.
size_t nearest_index(const std::vector<double>& grid, double a) {
  auto hi = std::upper_bound(grid.begin(), grid.end(), a);
  if (hi == grid.end()) return grid.size() - 1;
  if (hi == grid.begin()) return 0;
  const size_t h = size_t(hi - grid.begin()), l = h - 1;
  const double dl = a - grid[l], dh = grid[h] - a;
  return dl < dh ? l : dh < dl ? h : (l % 2 == 0 ? l : h);
}

// ---- e4m3fn / e4m3fnuz ------------------------------------------------------------------------

TEST(FpFormats, Fp8EveryCodeDecodes) {
  for (const Fp8* f : kFp8s) {
    std::vector<int> nans;
    for (int c = 0; c < 256; ++c) {
      const double want = f->ref(uint8_t(c));
      const float got = f->decode(uint8_t(c));
      if (std::isnan(got)) nans.push_back(c);
      EXPECT_TRUE(same_value(got, want)) << f->name << " " << hex(c) << ": " << got << " vs " << want;
      EXPECT_TRUE(same_value(got, f->lib_decode(uint8_t(c))))
          << f->name << " " << hex(c) << ": fp:: " << got << ", dtype.cpp " << f->lib_decode(uint8_t(c));
    }
    const std::vector<int> want_nans = f->fnuz ? std::vector<int>{0x80} : std::vector<int>{0x7f, 0xff};
    EXPECT_EQ(nans, want_nans) << f->name;
  }
  // Spot values from the specs.
  EXPECT_EQ(fp::e4m3fn_decode(0x7e), 448.0f);
  EXPECT_EQ(fp::e4m3fn_decode(0xfe), -448.0f);
  EXPECT_EQ(fp::e4m3fn_decode(0x38), 1.0f);
  EXPECT_EQ(fp::e4m3fn_decode(0x08), 0x1p-6f);
  EXPECT_EQ(fp::e4m3fn_decode(0x07), 7 * 0x1p-9f);
  EXPECT_EQ(fp::e4m3fn_decode(0x01), 0x1p-9f);
  EXPECT_TRUE(std::signbit(fp::e4m3fn_decode(0x80)) && fp::e4m3fn_decode(0x80) == 0.0f);
  EXPECT_EQ(fp::e4m3fnuz_decode(0x7f), 240.0f);
  EXPECT_EQ(fp::e4m3fnuz_decode(0xff), -240.0f);
  EXPECT_EQ(fp::e4m3fnuz_decode(0x40), 1.0f);
  EXPECT_EQ(fp::e4m3fnuz_decode(0x08), 0x1p-7f);
  EXPECT_EQ(fp::e4m3fnuz_decode(0x01), 0x1p-10f);
  EXPECT_FALSE(std::signbit(fp::e4m3fnuz_decode(0x00)));
  EXPECT_EQ(fp::kE4m3fnMax, 448.0f);
  EXPECT_EQ(fp::kE4m3fnuzMax, 240.0f);
}

TEST(FpFormats, Fp8EveryFiniteCodeRoundTrips) {
  for (const Fp8* f : kFp8s) {
    int finite = 0;
    for (int c = 0; c < 256; ++c) {
      const float v = f->decode(uint8_t(c));
      if (std::isnan(v)) continue;
      ++finite;
      EXPECT_EQ(f->encode(v), c) << f->name << " " << hex(c) << " value " << v;
    }
    EXPECT_EQ(finite, f->fnuz ? 255 : 254) << f->name;
  }
  EXPECT_EQ(fp::e4m3fn_encode(0.0f), 0x00);
  EXPECT_EQ(fp::e4m3fn_encode(-0.0f), 0x80);
  EXPECT_EQ(fp::e4m3fnuz_encode(0.0f), 0x00);
  EXPECT_EQ(fp::e4m3fnuz_encode(-0.0f), 0x00);  // no −0 in fnuz: 0x80 is its NaN
}

// For each pair of neighbouring positive values (a, b): the exact midpoint goes to the even code,
// the floats just below and above it to the nearer one; the same negated.
TEST(FpFormats, Fp8RoundToNearestEvenAtEveryMidpoint) {
  for (const Fp8* f : kFp8s) {
    int pairs = 0;
    for (int a = 0; a < f->max_code; ++a) {
      const int b = a + 1;
      const double va = f->ref(uint8_t(a)), vb = f->ref(uint8_t(b));
      ASSERT_LT(va, vb) << f->name;
      const float mid = float((va + vb) / 2);
      ASSERT_EQ(double(mid), (va + vb) / 2) << "midpoint not exact in f32";
      const uint8_t even = uint8_t(a % 2 == 0 ? a : b);
      const float below = std::nextafter(mid, 0.0f), above = std::nextafter(mid, kInf);
      EXPECT_EQ(f->encode(mid), even) << f->name << " midpoint " << mid;
      EXPECT_EQ(f->encode(below), a) << f->name << " below midpoint " << below;
      EXPECT_EQ(f->encode(above), b) << f->name << " above midpoint " << above;
      EXPECT_EQ(f->encode(-mid), neg_code(*f, even)) << f->name << " midpoint " << -mid;
      EXPECT_EQ(f->encode(-below), neg_code(*f, uint8_t(a))) << f->name << " " << -below;
      EXPECT_EQ(f->encode(-above), neg_code(*f, uint8_t(b))) << f->name << " " << -above;
      ++pairs;
    }
    EXPECT_EQ(pairs, f->max_code) << f->name;
  }
  // Named cases: out of the subnormals into the normals, across a binade.
  EXPECT_EQ(fp::e4m3fn_encode(7.5f * 0x1p-9f), 0x08);  // 7.5·2^-9: a tie between 7 (odd) and 8
  EXPECT_EQ(fp::e4m3fn_encode(1.9375f), 0x40);         // the tie of 1.875 and 2 → 2
  EXPECT_EQ(fp::e4m3fnuz_encode(7.5f * 0x1p-10f), 0x08);
  EXPECT_EQ(fp::e4m3fnuz_encode(0.96875f), 0x40);  // the tie of 0.9375 and 1 → 1
}

// Every f32 whose low 16 bits are one of a few patterns: the upper halves cover every sign,
// exponent and the top 7 mantissa bits, so every fp8 midpoint and its f32 neighbours are among them.
// The code must be the nearest value's (ties to even), saturated at ±max.
TEST(FpFormats, Fp8EncodeIsNearestOnStructuredSweep) {
  for (const Fp8* f : kFp8s) {
    std::vector<double> grid;  // positive finite values, index = code
    for (int c = 0; c <= f->max_code; ++c) grid.push_back(f->ref(uint8_t(c)));
    int64_t bad = 0, n = 0;
    std::string first;
    for (uint32_t hi = 0; hi < 0x10000u; ++hi) {
      for (uint32_t lo : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) {
        const float x = float_of(hi << 16 | lo);
        const uint8_t got = f->encode(x);
        uint8_t want;
        if (std::isnan(x)) {
          want = f->fnuz ? 0x80 : 0x7f;
        } else {
          const uint8_t m = uint8_t(nearest_index(grid, std::fabs(double(x))));
          want = std::signbit(x) ? neg_code(*f, m) : m;
        }
        ++n;
        if (got != want && bad++ == 0) first = hex(bits_of(x)) + ": got " + hex(got) + " want " + hex(want);
      }
    }
    EXPECT_EQ(bad, 0) << f->name << " of " << n << ", first " << first;
  }
}

TEST(FpFormats, Fp8SaturationNaNAndTinyValues) {
  for (const Fp8* f : kFp8s) {
    const float mx = float(f->max);
    for (float big : {mx * 1.5f, 1e30f, kInf, FLT_MAX, std::nextafter(mx, kInf), mx + 16, mx * 2}) {
      EXPECT_EQ(f->encode(big), f->max_code) << f->name << " " << big;
      EXPECT_EQ(f->encode(-big), f->max_code | 0x80) << f->name << " " << -big;
    }
    for (uint32_t nan : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu, 0xffa5a5a5u}) {
      const uint8_t c = f->encode(float_of(nan));
      EXPECT_EQ(c, f->fnuz ? 0x80 : 0x7f) << f->name << " " << hex(nan);
      EXPECT_TRUE(std::isnan(f->decode(c)));
    }
    // Tiny values: the smallest subnormal is 2^(-9) (fn) / 2^(-10) (fnuz); half of it ties to 0.
    const int lo = f->fnuz ? -10 : -9;
    const float half = float(pow2(lo - 1));
    EXPECT_EQ(f->encode(half), 0x00) << f->name;
    EXPECT_EQ(f->encode(std::nextafter(half, kInf)), 0x01) << f->name;
    EXPECT_EQ(f->encode(-std::nextafter(half, kInf)), 0x81) << f->name;
    EXPECT_EQ(f->encode(float(pow2(lo))), 0x01) << f->name;
    EXPECT_EQ(f->encode(float(pow2(lo)) * 1.5f), 0x02) << f->name;  // tie of 1 and 2 → 2
    EXPECT_EQ(f->encode(float(pow2(lo)) * 2.5f), 0x02) << f->name;  // tie of 2 and 3 → 2
    for (float tiny : {half, half / 2, 1e-20f, 1e-40f /* f32 subnormal */, FLT_TRUE_MIN, FLT_MIN}) {
      EXPECT_EQ(f->encode(tiny), 0x00) << f->name << " " << tiny;
      EXPECT_EQ(f->encode(-tiny), f->fnuz ? 0x00 : 0x80) << f->name << " " << -tiny;
    }
    // Every subnormal code and the smallest normal, from values a quarter quantum off.
    for (int c = 1; c <= 8; ++c) {
      const double v = f->ref(uint8_t(c)), q = pow2(lo);
      EXPECT_EQ(f->encode(float(v + q / 4)), c) << f->name;
      EXPECT_EQ(f->encode(float(v - q / 4)), c) << f->name;
      EXPECT_EQ(f->encode(float(-v - q / 4)), c | 0x80) << f->name;
    }
  }
}

// fp:: against dtype.cpp's independent implementations, bit for bit, on every 97th f32 pattern
// (the stride is odd, so every sign, exponent and low-bit pattern is visited), plus every
// structured pattern of the sweep above. fnuz never gives 0x80 for a non-NaN.
TEST(FpFormats, EncodersAgreeWithDtypeCpp) {
  int64_t n = 0, bad_fn = 0, bad_fnuz = 0, bad_bf16 = 0, fnuz_nan_from_number = 0;
  std::string first;
  auto check = [&](uint32_t u) {
    const float x = float_of(u);
    ++n;
    const uint8_t a = fp::e4m3fn_encode(x), b = float_to_fp8_e4m3fn(x);
    if (a != b && bad_fn++ == 0) first += " fn " + hex(u) + ": " + hex(a) + " vs " + hex(b);
    const uint8_t c = fp::e4m3fnuz_encode(x), d = float_to_fp8_e4m3fnuz(x);
    if (c != d && bad_fnuz++ == 0) first += " fnuz " + hex(u) + ": " + hex(c) + " vs " + hex(d);
    fnuz_nan_from_number += c == 0x80 && !std::isnan(x);
    const uint16_t e = fp::bf16_encode(x), g = float_to_bf16(x).bits;
    if (e != g && bad_bf16++ == 0) first += " bf16 " + hex(u) + ": " + hex(e) + " vs " + hex(g);
  };
  for (uint64_t u = 0; u < (uint64_t(1) << 32); u += 97) check(uint32_t(u));
  for (uint32_t hi = 0; hi < 0x10000u; ++hi)
    for (uint32_t lo : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) check(hi << 16 | lo);
  EXPECT_GT(n, 44'000'000);
  EXPECT_EQ(bad_fn, 0) << first;
  EXPECT_EQ(bad_fnuz, 0) << first;
  EXPECT_EQ(bad_bf16, 0) << first;
  EXPECT_EQ(fnuz_nan_from_number, 0);
}

// ---- bf16 -------------------------------------------------------------------------------------

TEST(FpFormats, Bf16EveryCodeAndRounding) {
  for (uint32_t c = 0; c < 0x10000u; ++c) {
    const float v = fp::bf16_decode(uint16_t(c));
    ASSERT_TRUE(same_value(v, ref_bf16(uint16_t(c)))) << hex(c);
    if (!std::isnan(v)) ASSERT_EQ(fp::bf16_encode(v), c) << hex(c);
  }
  // Round to nearest even by the low half, written out: the upper half plus one when the low
  // half is above 0x8000, or exactly 0x8000 with an odd upper half (overflow to inf included).
  for (uint32_t hi = 0; hi < 0x10000u; ++hi) {
    for (uint32_t lo : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) {
      const float x = float_of(hi << 16 | lo);
      if (std::isnan(x)) {
        const uint16_t c = fp::bf16_encode(x);
        ASSERT_TRUE(std::isnan(fp::bf16_decode(c))) << hex(hi << 16 | lo);  // never collapses to inf
        ASSERT_EQ(c & 0x8000, hi & 0x8000);
        continue;
      }
      const uint32_t want = hi + (lo > 0x8000u || (lo == 0x8000u && (hi & 1)));
      ASSERT_EQ(fp::bf16_encode(x), want) << hex(hi << 16 | lo);
    }
  }
  EXPECT_EQ(fp::bf16_encode(FLT_MAX), 0x7f80);  // rounds to inf
  EXPECT_EQ(fp::bf16_encode(-kInf), 0xff80);
  EXPECT_EQ(fp::bf16_encode(-0.0f), 0x8000);
}

// ---- e2m1 -------------------------------------------------------------------------------------

TEST(FpFormats, E2m1EveryCodeRoundTrips) {
  const double want[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  for (int c = 0; c < 16; ++c) {
    const float v = fp::e2m1_decode(uint8_t(c));
    EXPECT_TRUE(same_value(v, ref_e2m1(uint8_t(c)))) << hex(c);
    EXPECT_EQ(std::fabs(v), want[c & 7]) << hex(c);
    EXPECT_EQ(std::signbit(v), c >= 8) << hex(c);
    EXPECT_EQ(fp::e2m1_encode(v), c) << hex(c) << " value " << v;  // −0 → 0x8 included
  }
  EXPECT_EQ(fp::e2m1_encode(-0.0f), 0x8);
  EXPECT_EQ(fp::e2m1_encode(0.0f), 0x0);
  EXPECT_EQ(fp::kE2m1Max, 6.0f);
}

TEST(FpFormats, E2m1MidpointsAndSaturation) {
  for (int a = 0; a < 7; ++a) {
    const double va = ref_e2m1(uint8_t(a)), vb = ref_e2m1(uint8_t(a + 1));
    const float mid = float((va + vb) / 2);  // 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5
    const float below = std::nextafter(mid, 0.0f), above = std::nextafter(mid, kInf);
    const int even = a % 2 == 0 ? a : a + 1;
    for (int s : {0, 8}) {
      const float sg = s ? -1.0f : 1.0f;
      EXPECT_EQ(fp::e2m1_encode(sg * mid), even | s) << sg * mid;
      EXPECT_EQ(fp::e2m1_encode(sg * below), a | s) << sg * below;
      EXPECT_EQ(fp::e2m1_encode(sg * above), (a + 1) | s) << sg * above;
    }
  }
  EXPECT_EQ(fp::e2m1_encode(5.0f), 0x6);  // 4 (even) over 6
  EXPECT_EQ(fp::e2m1_encode(3.5f), 0x6);  // 4 (even) over 3
  EXPECT_EQ(fp::e2m1_encode(0.25f), 0x0);
  EXPECT_EQ(fp::e2m1_encode(-0.25f), 0x8);  // −0
  EXPECT_EQ(fp::e2m1_encode(-0.1f), 0x8);
  EXPECT_EQ(fp::e2m1_encode(1e-40f), 0x0);
  for (float big : {6.0f, 6.5f, 7.0f, std::nextafter(7.0f, kInf), 8.0f, 100.0f, 1e30f, FLT_MAX}) {
    EXPECT_EQ(fp::e2m1_encode(big), 0x7) << big;
    EXPECT_EQ(fp::e2m1_encode(-big), 0xf) << -big;
  }
  // Everything in between, densely: nearest of the 8 values, ties to the even code, at most 0xf.
  std::vector<double> grid;
  for (int c = 0; c < 8; ++c) grid.push_back(ref_e2m1(uint8_t(c)));
  for (uint32_t u = 0; u < 0x41000000u; u += 0x1001u) {  // [0, 8)
    const float x = float_of(u);
    const uint8_t m = uint8_t(nearest_index(grid, x));
    ASSERT_EQ(fp::e2m1_encode(x), m) << x;
    ASSERT_EQ(fp::e2m1_encode(-x), m | 8) << -x;
  }
}

// ---- e8m0 -------------------------------------------------------------------------------------

TEST(FpFormats, E8m0EveryCode) {
  for (int c = 0; c < 255; ++c) {
    const float v = fp::e8m0_decode(uint8_t(c));
    EXPECT_EQ(double(v), pow2(c - 127)) << c;
  }
  EXPECT_TRUE(std::isnan(fp::e8m0_decode(0xff)));
  EXPECT_EQ(bits_of(fp::e8m0_decode(0)), 0x00400000u);  // 2^-127, a subnormal, exactly
  EXPECT_EQ(bits_of(fp::e8m0_decode(1)), 0x00800000u);  // 2^-126
  EXPECT_EQ(fp::e8m0_decode(127), 1.0f);
  EXPECT_EQ(fp::e8m0_decode(254), 0x1p127f);
}

// ---- fn codes read as fnuz ------------------------------------------------------------------------

TEST(FpFormats, FnCodeAsFnuzHalvesTheValue) {
  int n = 0;
  for (int c = 0; c < 256; ++c) {
    const double fn = ref_fn(uint8_t(c));
    if (std::isnan(fn)) continue;
    ++n;
    const uint8_t z = fp::e4m3fn_code_as_fnuz(uint8_t(c));
    const float nuz = fp::e4m3fnuz_decode(z);
    EXPECT_FALSE(std::isnan(nuz)) << hex(c);
    EXPECT_EQ(double(nuz) * 2, fn) << hex(c);
    EXPECT_EQ(z, c == 0x80 ? 0 : c) << hex(c);
    if (fn == 0) EXPECT_FALSE(std::signbit(nuz)) << hex(c);  // −0 → +0
  }
  EXPECT_EQ(n, 254);
}

// ---- MXFP4 ------------------------------------------------------------------------------------

// The scale code the header documents, computed from frexp: X = floor(log2 amax) − 2, one more
// when the mantissa is ≥ 1.75, clamped to [−127, 125] (126 would make 4·2^126 = 2^128, not an
// f32; see the MXFP4 extreme-range test).
uint8_t want_scale_code(float amax) {
  if (amax == 0) return 0;
  int e;
  const double f = std::frexp(double(amax), &e);  // amax = f·2^e, f in [0.5, 1)
  int x = (e - 1) - 2 + (2 * f >= 1.75 ? 1 : 0);
  x = std::clamp(x, -127, 125);
  return uint8_t(x + 127);
}

TEST(FpFormats, Mxfp4ScaleCodeAtEveryBinade) {
  EXPECT_EQ(fp::mxfp4_scale_code(0.0f), 0);
  int n = 0;
  for (int e = -149; e <= 127; ++e) {
    for (double m : {1.0, 1.5, 1.74, 1.75, 1.99, 2.0 - 1e-7}) {
      const double v = m * pow2(e);
      if (v < pow2(-149) || v > FLT_MAX) continue;
      for (float amax : {float(v), std::nextafter(float(v), 0.0f), std::nextafter(float(v), kInf)}) {
        if (!(amax > 0) || !std::isfinite(amax)) continue;
        ++n;
        const uint8_t c = fp::mxfp4_scale_code(amax);
        ASSERT_EQ(c, want_scale_code(amax)) << "amax " << amax << " (" << hex(bits_of(amax)) << ")";
        ASSERT_LE(c, 252);  // within e8m0 and below the NaN code
        // Unclamped, amax lands in [3.5, 7)·scale: never clipped by more than 6 → 7.
        const double r = double(amax) / pow2(int(c) - 127);
        if (c > 0) ASSERT_LT(r, 8.0) << amax;
        if (c > 0 && double(amax) < 1.75 * pow2(127)) {
          ASSERT_GE(r, 3.5) << amax;
          ASSERT_LT(r, 7.0) << amax;
        }
      }
    }
  }
  EXPECT_GT(n, 4000);
  EXPECT_EQ(fp::mxfp4_scale_code(1.0f), 127 - 2);
  EXPECT_EQ(fp::mxfp4_scale_code(6.0f), 127);  // 1.5·2^2 → 2^0
  EXPECT_EQ(fp::mxfp4_scale_code(1.74f), 127 - 2);
  EXPECT_EQ(fp::mxfp4_scale_code(1.75f), 127 - 1);
  EXPECT_EQ(fp::mxfp4_scale_code(1e-40f), 0);  // f32 subnormal: clamped to 2^-127
  EXPECT_EQ(fp::mxfp4_scale_code(FLT_MIN), 0);
}

// Checks one quantized block against nearest-rounding of v / scale written out here.
void check_block(const float* v, const char* what) {
  uint8_t packed[16];
  const uint8_t code = fp::mxfp4_quantize_block(v, packed);
  float amax = 0;
  for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(v[i]));
  ASSERT_EQ(code, want_scale_code(amax)) << what << " amax " << amax;
  ASSERT_NE(code, 0xff);
  const float scale = fp::e8m0_decode(code);
  ASSERT_EQ(double(scale), pow2(int(code) - 127)) << what << ": the scale is 2^(code - 127)";
  std::vector<double> grid;
  for (int c = 0; c < 8; ++c) grid.push_back(ref_e2m1(uint8_t(c)));
  for (int i = 0; i < 32; ++i) {
    const uint8_t nib = (i % 2 == 0) ? packed[i / 2] & 0xf : packed[i / 2] >> 4;
    const double x = double(v[i]) / double(scale);  // exact: a power of two
    const uint8_t m = uint8_t(nearest_index(grid, std::fabs(x)));
    const uint8_t want = uint8_t(m | (std::signbit(v[i]) ? 8 : 0));
    ASSERT_EQ(nib, want) << what << " element " << i << " v " << v[i] << " v/scale " << x;
    const double deq = ref_e2m1(nib) * double(scale);
    ASSERT_LE(std::fabs(deq), 6.0 * double(scale)) << what;
    ASSERT_TRUE(std::isfinite(float(deq))) << what << " element " << i << " dequantizes to " << deq;
    // The f32 product the kernels compute is exact.
    ASSERT_EQ(double(fp::e2m1_decode(nib) * scale), deq) << what << " element " << i;
  }
}

TEST(FpFormats, Mxfp4BlocksAtEveryBinade) {
  float v[32] = {};
  uint8_t packed[16];
  EXPECT_EQ(fp::mxfp4_quantize_block(v, packed), 0);  // all zero: code 0, all nibbles +0
  for (uint8_t b : packed) EXPECT_EQ(b, 0);
  check_block(v, "zeros");

  std::mt19937 rng(17);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  int blocks = 0;
  for (int e = -140; e <= 127; ++e) {
    for (double m : {1.0, 1.5, 1.74, 1.75, 1.99}) {
      const double a = m * pow2(e);
      if (a > FLT_MAX) continue;
      const float amax = float(a);
      for (int i = 0; i < 32; ++i) v[i] = amax * u(rng);
      v[2 * (rng() % 16)] = (rng() & 1) ? amax : -amax;  // an even index: the ties below are odd
      // Exact ties of the scaled grid, where representable: 0.25, 2.5, 5 (× scale).
      const float scale = float(pow2(int(want_scale_code(amax)) - 127));
      int k = 0;
      for (float t : {0.25f, 0.75f, 2.5f, 3.5f, 5.0f, -1.25f, -5.0f}) {
        const float tv = t * scale;
        if (std::fabs(tv) <= amax && double(tv) == double(t) * double(scale)) v[k++ * 4 + 1] = tv;
      }
      check_block(v, ("binade " + std::to_string(e) + " mantissa " + std::to_string(m)).c_str());
      ++blocks;
    }
  }
  EXPECT_GT(blocks, 1300);
}

TEST(FpFormats, Mxfp4PackingLayout) {
  // Scale 1 (amax 6 = 1.5·2^2): elements are their own codes. Element 2i is the low nibble.
  const float vals[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  float v[32];
  for (int i = 0; i < 32; ++i) v[i] = vals[(i * 5) % 16];  // codes (5i) mod 16
  uint8_t packed[16];
  ASSERT_EQ(fp::mxfp4_quantize_block(v, packed), 127);
  for (int i = 0; i < 16; ++i) {
    const int lo = (10 * i) % 16, hi = (10 * i + 5) % 16;
    EXPECT_EQ(packed[i], uint8_t(hi << 4 | lo)) << "byte " << i;
  }
  EXPECT_EQ(packed[0], 0x50);
  EXPECT_EQ(packed[1], 0xfa);
}

// amax from the f32 subnormals to the top of the range: the scale stays in e8m0 (never the NaN
// code) and no dequantized element overflows f32. A block of 3e38 would round its scale up to
// 2^126 and dequantize to 4·2^126 = 2^128 = inf in f32 without the clamp at 2^125.
TEST(FpFormats, Mxfp4ExtremeRange) {
  for (float amax : {1e-40f, FLT_TRUE_MIN, FLT_MIN, 1e-38f, 3e38f, 0x1.c00000p127f, FLT_MAX}) {
    float v[32];
    for (int i = 0; i < 32; ++i) v[i] = amax * (float(i - 15) / 16);
    v[7] = amax;
    v[8] = -amax;
    check_block(v, ("amax " + std::to_string(amax)).c_str());
    uint8_t packed[16];
    const uint8_t code = fp::mxfp4_quantize_block(v, packed);
    EXPECT_LE(code, 252) << amax;
    const float top = fp::e2m1_decode(packed[3] >> 4) * fp::e8m0_decode(code);  // element 7
    EXPECT_TRUE(std::isfinite(top)) << amax;
    if (amax >= 1e-38f) {  // below, the block is under half the smallest step and quantizes to 0
      EXPECT_GT(top, 0) << amax;
      EXPECT_LE(std::fabs(top - amax), amax / 4) << amax;  // within 25%: not clipped away
    }
  }
}

}  // namespace
}  // namespace mla
