// test_rope.cpp — YaRN frequencies and the rotation, against complex-number references.
#include <cmath>
#include <complex>
#include <numbers>
#include <vector>

#include <gtest/gtest.h>

#include "harness.h"
#include "mla/config.h"
#include "mla/dtype.h"
#include "mla/error.h"
#include "mla/rope.h"

namespace mla {
namespace {

using cd = std::complex<double>;
using test::randn;
using test::rel_l2;

// A V3 config whose YaRN attention factor is not 1 (mscale 1, mscale_all_dim 0).
AttentionConfig scaled_config() {
  AttentionConfig c = preset_config("deepseek-v3");
  c.rope_scaling.mscale = 1.0;
  c.rope_scaling.mscale_all_dim = 0.0;
  return c;
}

// The reference: pair i as a complex number, multiplied by af·e^{i·pos·θ_i}.
std::vector<double> reference(const std::vector<double>& x, int64_t rows, int64_t stride,
                              int64_t rpp, const std::vector<int32_t>& pos,
                              const RopeFrequencies& f) {
  std::vector<double> y = x;
  const int64_t half = int64_t(f.inv_freq.size());
  for (int64_t r = 0; r < rows; ++r) {
    const double p = pos[size_t(r / rpp)];
    for (int64_t i = 0; i < half; ++i) {
      const int64_t i0 = f.interleave ? 2 * i : i;
      const int64_t i1 = f.interleave ? 2 * i + 1 : i + half;
      const cd z(x[size_t(r * stride + i0)], x[size_t(r * stride + i1)]);
      const cd w = z * std::polar(f.attention_factor, p * f.inv_freq[size_t(i)]);
      y[size_t(r * stride + i0)] = w.real();
      y[size_t(r * stride + i1)] = w.imag();
    }
  }
  return y;
}

struct Case {
  int64_t rows, stride, rpp;
};

void check_against_complex(bool interleave, const AttentionConfig& cfg) {
  AttentionConfig c = cfg;
  c.rope_interleave = interleave;
  const RopeFrequencies f = rope_frequencies(c);
  ASSERT_EQ(f.interleave, interleave);
  const int64_t d = 2 * int64_t(f.inv_freq.size());
  // Odd row counts, rows not a multiple of rows_per_position, padded rows (stride > d), and
  // enough rows to take the threaded path.
  for (Case k : {Case{1, d, 1}, Case{7, d + 3, 1}, Case{13, 576, 5}, Case{128 * 3, d, 128},
                 Case{1031, d + 1, 1}}) {
    SCOPED_TRACE(::testing::Message() << "rows " << k.rows << " stride " << k.stride << " rpp "
                                      << k.rpp);
    const int64_t n_pos = (k.rows + k.rpp - 1) / k.rpp;
    std::vector<int32_t> pos(static_cast<size_t>(n_pos));
    for (int64_t p = 0; p < n_pos; ++p) pos[size_t(p)] = int32_t((p * 7919 + 3) % 163840);
    pos[0] = 0;
    if (n_pos > 1) pos[1] = 163839;
    std::vector<double> x = randn(size_t(k.rows * k.stride), 42 + uint64_t(k.rows));
    const std::vector<double> want = reference(x, k.rows, k.stride, k.rpp, pos, f);
    apply_rope(x.data(), k.rows, k.stride, k.rpp, pos.data(), f);
    EXPECT_LE(rel_l2(x, want), 1e-14);
    const auto worst = test::worst_element(x, want);
    EXPECT_LE(worst.abs_err, 1e-12) << "at " << worst.index;
  }
}

// ---- frequencies --------------------------------------------------------------------------------

TEST(RopeFrequencies, V3YarnPinned) {
  const AttentionConfig c = preset_config("deepseek-v3");
  const RopeFrequencies f = rope_frequencies(c);
  ASSERT_EQ(f.inv_freq.size(), 32u);
  EXPECT_TRUE(f.interleave);
  EXPECT_DOUBLE_EQ(f.attention_factor, 1.0);  // get_mscale(40, 1) / get_mscale(40, 1)

  // Independently: correction dims for beta_fast = 32 and beta_slow = 1 over 4096 positions.
  const double dim = 64, base = 10000, orig = 4096;
  auto corr = [&](double rot) {
    return dim * std::log(orig / (rot * 2 * std::numbers::pi)) / (2 * std::log(base));
  };
  EXPECT_NEAR(corr(32), 10.4729, 1e-3);
  EXPECT_NEAR(corr(1), 22.5130, 1e-3);
  const double low = 10, high = 23;  // floor and ceil of the above
  for (int i = 0; i < 32; ++i) {
    SCOPED_TRACE(i);
    const double extrap = std::pow(base, -2.0 * i / dim);
    const double interp = extrap / 40.0;
    const double ramp = std::min(1.0, std::max(0.0, (i - low) / (high - low)));
    const double want = interp * ramp + extrap * (1 - ramp);
    EXPECT_NEAR(f.inv_freq[size_t(i)], want, 1e-15 * want);
    if (i <= 10) EXPECT_NEAR(f.inv_freq[size_t(i)], extrap, 1e-15 * extrap);  // high frequencies
    if (i >= 23) EXPECT_NEAR(f.inv_freq[size_t(i)], interp, 1e-15 * interp);  // low: ÷ factor
  }
  EXPECT_EQ(f.inv_freq[0], 1.0);
  EXPECT_NEAR(f.inv_freq[31], std::pow(10000.0, -62.0 / 64.0) / 40.0, 1e-20);
  // Spot values: i = 16 is 6/13 of the way to interpolation.
  EXPECT_NEAR(f.inv_freq[16], 0.01 * (7.0 / 13 + 6.0 / 13 / 40), 1e-17);
  // Frequencies decrease monotonically.
  for (size_t i = 1; i < 32; ++i) EXPECT_LT(f.inv_freq[i], f.inv_freq[i - 1]);
}

TEST(RopeFrequencies, AttentionFactor) {
  EXPECT_DOUBLE_EQ(rope_frequencies(preset_config("deepseek-v3")).attention_factor, 1.0);
  EXPECT_DOUBLE_EQ(rope_frequencies(preset_config("deepseek-v2-lite")).attention_factor, 1.0);
  EXPECT_DOUBLE_EQ(rope_frequencies(scaled_config()).attention_factor,
                   0.1 * std::log(40.0) + 1.0);
  AttentionConfig c = preset_config("deepseek-v3");
  c.rope_scaling.mscale = 0.5;
  c.rope_scaling.mscale_all_dim = 2.0;
  EXPECT_DOUBLE_EQ(rope_frequencies(c).attention_factor,
                   (0.05 * std::log(40.0) + 1.0) / (0.2 * std::log(40.0) + 1.0));
  c.rope_scaling.factor = 1.0;  // no scaling: get_mscale(1, ·) = 1
  EXPECT_DOUBLE_EQ(rope_frequencies(c).attention_factor, 1.0);
}

TEST(RopeFrequencies, NoScaling) {
  AttentionConfig c = preset_config("deepseek-v3");
  c.rope_scaling = RopeScaling{};
  c.rope_theta = 50000;
  c.qk_rope_head_dim = 16;
  const RopeFrequencies f = rope_frequencies(c);
  ASSERT_EQ(f.inv_freq.size(), 8u);
  EXPECT_EQ(f.attention_factor, 1.0);
  for (int i = 0; i < 8; ++i)
    EXPECT_NEAR(f.inv_freq[size_t(i)], std::pow(50000.0, -2.0 * i / 16), 1e-16);
}

TEST(RopeFrequencies, YarnFactorOneIsNoScaling) {
  AttentionConfig c = preset_config("deepseek-v3");
  c.rope_scaling.factor = 1.0;
  const RopeFrequencies f = rope_frequencies(c);
  for (int i = 0; i < 32; ++i)
    EXPECT_NEAR(f.inv_freq[size_t(i)], std::pow(10000.0, -2.0 * i / 64), 1e-16);
}

TEST(RopeFrequencies, InterleaveFollowsConfig) {
  AttentionConfig c = preset_config("deepseek-v3");
  EXPECT_TRUE(rope_frequencies(c).interleave);
  c.rope_interleave = false;
  EXPECT_FALSE(rope_frequencies(c).interleave);
}

TEST(RopeFrequencies, InvalidConfigThrows) {
  AttentionConfig c = preset_config("deepseek-v3");
  c.qk_rope_head_dim = 0;
  EXPECT_THROW(rope_frequencies(c), Error);
}

// ---- rotation -----------------------------------------------------------------------------------

TEST(ApplyRope, InterleavedIsComplexMultiplication) {
  check_against_complex(true, preset_config("deepseek-v3"));
  check_against_complex(true, scaled_config());
}

TEST(ApplyRope, NeoxIsComplexMultiplication) {
  check_against_complex(false, preset_config("deepseek-v3"));
  check_against_complex(false, scaled_config());
}

TEST(ApplyRope, PaddingUntouched) {
  const RopeFrequencies f = rope_frequencies(preset_config("deepseek-v3"));
  const int64_t rows = 9, stride = 80;
  std::vector<double> x = randn(size_t(rows * stride), 5);
  const std::vector<double> before = x;
  std::vector<int32_t> pos = {3, 1000, 77};
  apply_rope(x.data(), rows, stride, 3, pos.data(), f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 64; j < stride; ++j)
      EXPECT_EQ(x[size_t(r * stride + j)], before[size_t(r * stride + j)]);
}

TEST(ApplyRope, PositionZeroIsIdentityTimesFactor) {
  for (const AttentionConfig& c : {preset_config("deepseek-v3"), scaled_config()}) {
    const RopeFrequencies f = rope_frequencies(c);
    std::vector<double> x = randn(64, 9);
    const std::vector<double> before = x;
    const int32_t pos = 0;
    apply_rope(x.data(), 1, 64, 1, &pos, f);
    for (size_t j = 0; j < 64; ++j) EXPECT_DOUBLE_EQ(x[j], before[j] * f.attention_factor);
  }
}

TEST(ApplyRope, PreservesPairNorms) {
  for (bool interleave : {true, false}) {
    for (const AttentionConfig& base : {preset_config("deepseek-v3"), scaled_config()}) {
      AttentionConfig c = base;
      c.rope_interleave = interleave;
      const RopeFrequencies f = rope_frequencies(c);
      const int64_t rows = 50, d = 64;
      std::vector<double> x = randn(size_t(rows * d), 11);
      const std::vector<double> before = x;
      std::vector<int32_t> pos(static_cast<size_t>(rows));
      for (int64_t r = 0; r < rows; ++r) pos[size_t(r)] = int32_t(r * r * 61);
      apply_rope(x.data(), rows, d, 1, pos.data(), f);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t i = 0; i < d / 2; ++i) {
          const int64_t i0 = interleave ? 2 * i : i, i1 = interleave ? 2 * i + 1 : i + d / 2;
          const double* a = before.data() + r * d;
          const double* b = x.data() + r * d;
          EXPECT_NEAR(std::hypot(b[i0], b[i1]), f.attention_factor * std::hypot(a[i0], a[i1]),
                      1e-13);
        }
      }
    }
  }
}

TEST(ApplyRope, DotProductDependsOnlyOnPositionDifference) {
  for (bool interleave : {true, false}) {
    AttentionConfig c = preset_config("deepseek-v3");
    c.rope_interleave = interleave;
    const RopeFrequencies f = rope_frequencies(c);
    ASSERT_EQ(f.attention_factor, 1.0);
    const std::vector<double> q0 = randn(64, 21), k0 = randn(64, 22);
    auto dot_at = [&](int32_t m, int32_t n) {
      std::vector<double> q = q0, k = k0;
      apply_rope(q.data(), 1, 64, 1, &m, f);
      apply_rope(k.data(), 1, 64, 1, &n, f);
      double s = 0;
      for (int j = 0; j < 64; ++j) s += q[size_t(j)] * k[size_t(j)];
      return s;
    };
    for (int32_t delta : {0, 1, 17, 4095, 100000}) {
      const double want = dot_at(delta, 0);
      for (int32_t shift : {1, 333, 50000, 60000}) {
        SCOPED_TRACE(::testing::Message() << "delta " << delta << " shift " << shift);
        EXPECT_NEAR(dot_at(delta + shift, shift), want, 1e-9);
      }
    }
    // And it does depend on the difference.
    EXPECT_GT(std::fabs(dot_at(5, 0) - dot_at(0, 0)), 1e-3);
  }
}

TEST(ApplyRope, FloatAndBf16AgreeWithDouble) {
  for (bool interleave : {true, false}) {
    AttentionConfig c = scaled_config();
    c.rope_interleave = interleave;
    const RopeFrequencies f = rope_frequencies(c);
    const int64_t rows = 128 * 5 + 3, stride = 70, rpp = 16;
    std::vector<int32_t> pos((rows + rpp - 1) / rpp);
    for (size_t p = 0; p < pos.size(); ++p) pos[p] = int32_t(p * 4001 % 163840);
    const std::vector<double> x = randn(size_t(rows * stride), 77);

    // float: inputs rounded to float, reference in double on the same inputs.
    std::vector<float> xf(x.size());
    std::vector<double> xf_d(x.size());
    for (size_t j = 0; j < x.size(); ++j) xf_d[j] = xf[j] = float(x[j]);
    apply_rope(xf.data(), rows, stride, rpp, pos.data(), f);
    apply_rope(xf_d.data(), rows, stride, rpp, pos.data(), f);
    std::vector<double> got(xf.begin(), xf.end());
    EXPECT_LE(rel_l2(got, xf_d), 1e-7);
    for (size_t j = 0; j < x.size(); ++j)
      ASSERT_NEAR(got[j], xf_d[j], 1e-7 * (std::fabs(xf_d[j]) + 1e-30)) << j;

    // bf16: one rounding of the double result (through float).
    std::vector<bf16> xb(x.size());
    std::vector<double> xb_d(x.size());
    for (size_t j = 0; j < x.size(); ++j) {
      xb[j] = float_to_bf16(float(x[j]));
      xb_d[j] = bf16_to_float(xb[j]);
    }
    apply_rope(xb.data(), rows, stride, rpp, pos.data(), f);
    apply_rope(xb_d.data(), rows, stride, rpp, pos.data(), f);
    std::vector<double> gotb(x.size());
    for (size_t j = 0; j < x.size(); ++j) gotb[j] = bf16_to_float(xb[j]);
    EXPECT_LE(rel_l2(gotb, xb_d), 4e-3);
    for (size_t j = 0; j < x.size(); ++j)
      ASSERT_NEAR(gotb[j], xb_d[j], std::ldexp(std::fabs(xb_d[j]), -8) + 1e-30) << j;
  }
}

TEST(ApplyRope, EmptyAndBadArguments) {
  const RopeFrequencies f = rope_frequencies(preset_config("deepseek-v3"));
  EXPECT_NO_THROW(apply_rope<float>(nullptr, 0, 64, 1, nullptr, f));
  std::vector<float> x(128);
  const int32_t pos[2] = {0, 1};
  EXPECT_THROW(apply_rope(x.data(), 2, 64, 0, pos, f), Error);
  EXPECT_THROW(apply_rope(x.data(), 2, 32, 1, pos, f), Error);
  EXPECT_THROW(apply_rope(x.data(), -1, 64, 1, pos, f), Error);
}

}  // namespace
}  // namespace mla
