// The LSE algebra the GPU kernels share (platform/gpu/softmax_state.cuh), run on the host: merging
// two parts equals attention over all their keys, an empty part is the identity, the online
// softmax (rescale per chunk) equals the direct one, and large scores neither overflow nor lose
// the small part.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "platform/gpu/softmax_state.cuh"

namespace mla::gpu {
namespace {

constexpr float kInf = INFINITY;

struct Part {
  std::vector<double> o;  // softmax-weighted mean of the values
  double lse;             // natural log; −inf: no key
};

// Attention of one query over keys [b, e): scores s, values v[key][d], in f64.
Part direct(const std::vector<double>& s, const std::vector<std::vector<double>>& v, size_t b, size_t e) {
  const size_t dv = v[0].size();
  Part p{std::vector<double>(dv, 0.0), -kInf};
  if (b == e) return p;
  double m = -kInf;
  for (size_t j = b; j < e; ++j) m = std::max(m, s[j]);
  double l = 0;
  for (size_t j = b; j < e; ++j) {
    const double w = std::exp(s[j] - m);
    l += w;
    for (size_t d = 0; d < dv; ++d) p.o[d] += w * v[j][d];
  }
  for (double& x : p.o) x /= l;
  p.lse = m + std::log(l);
  return p;
}

// (o_a, s_a) ← merge((o_a, s_a), (o_b, s_b)), as the merge kernel applies lse_merge.
void merge_into(std::vector<float>& oa, float& sa, const std::vector<float>& ob, float sb) {
  if (sb == -kInf) return;
  const LseMerge w = lse_merge(sa, sb);
  for (size_t d = 0; d < oa.size(); ++d) {
    const float a = sa == -kInf ? 0.f : oa[d];
    oa[d] = (w.wa * a + w.wb * ob[d]) / w.sum;
  }
  sa = w.lse;
}

std::vector<float> to_f32(const std::vector<double>& x) { return {x.begin(), x.end()}; }

class SoftmaxStateTest : public ::testing::Test {
 protected:
  std::mt19937 rng{12345};
  std::vector<double> scores(size_t n, double spread, double offset = 0) {
    std::normal_distribution<double> g(offset, spread);
    std::vector<double> s(n);
    for (double& x : s) x = g(rng);
    return s;
  }
  std::vector<std::vector<double>> values(size_t n, size_t dv) {
    std::uniform_real_distribution<double> u(-1, 1);
    std::vector<std::vector<double>> v(n, std::vector<double>(dv));
    for (auto& row : v)
      for (double& x : row) x = u(rng);
    return v;
  }
};

TEST_F(SoftmaxStateTest, MergeOfTwoPartsIsAttentionOverAllKeys) {
  // Tolerances: about 4× the error measured at each offset (f32 rounding of the part LSEs, which
  // grows with their magnitude, and of e^x).
  struct Case {
    double offset, lse_tol, o_tol;
  };
  for (const Case& k : {Case{0, 3e-6, 3e-7}, Case{60, 8e-6, 2e-6}, Case{-60, 6e-6, 2e-6},
                        Case{3000, 8e-4, 2.5e-5}}) {
    const double offset = k.offset;
    for (size_t split : {1, 7, 19, 30}) {
      const size_t n = 31, dv = 9;
      const auto s = scores(n, 4.0, offset);
      const auto v = values(n, dv);
      const Part all = direct(s, v, 0, n), a = direct(s, v, 0, split), b = direct(s, v, split, n);
      std::vector<float> o = to_f32(a.o);
      float lse = float(a.lse);
      merge_into(o, lse, to_f32(b.o), float(b.lse));
      EXPECT_NEAR(lse, all.lse, k.lse_tol) << offset << " " << split;
      for (size_t d = 0; d < dv; ++d)
        EXPECT_NEAR(o[d], all.o[d], k.o_tol) << offset << " " << split << " " << d;
    }
  }
}

TEST_F(SoftmaxStateTest, EmptyPartIsTheIdentity) {
  const std::vector<float> o = {0.25f, -1.5f, 3.f};
  const std::vector<float> junk = {NAN, INFINITY, 7.f};  // never read: its part is empty
  {
    std::vector<float> x = o;
    float s = 1.75f;
    merge_into(x, s, junk, -kInf);
    EXPECT_EQ(x, o);
    EXPECT_EQ(s, 1.75f);
  }
  {
    std::vector<float> x = junk;
    float s = -kInf;
    merge_into(x, s, o, 1.75f);
    EXPECT_EQ(x, o);
    EXPECT_EQ(s, 1.75f);
  }
  const LseMerge none = lse_merge(-kInf, -kInf);
  EXPECT_EQ(none.wa, 0.f);
  EXPECT_EQ(none.wb, 0.f);
  EXPECT_EQ(none.lse, -kInf);
  EXPECT_EQ(SoftmaxState{}.lse(), -kInf);
}

TEST_F(SoftmaxStateTest, MergeIsCommutative) {
  for (float sa : {-3.f, 0.f, 40.f})
    for (float sb : {-2.5f, 0.f, 41.f}) {
      const LseMerge ab = lse_merge(sa, sb), ba = lse_merge(sb, sa);
      EXPECT_EQ(ab.lse, ba.lse);
      EXPECT_EQ(ab.wa, ba.wb);
      EXPECT_EQ(ab.wb, ba.wa);
    }
  for (float x : {-3.f, 0.f, 40.f}) EXPECT_NEAR(lse_merge(x, x).lse, x + std::log(2.f), 1e-5f);
}

// The online softmax as attend_row runs it: per chunk, the new max, rescale, add the chunk's weights.
TEST_F(SoftmaxStateTest, OnlineSoftmaxEqualsDirect) {
  struct Case {
    double offset, lse_tol, o_tol;  // about 4× the measured error
  };
  for (const Case& k : {Case{0, 1e-6, 1.2e-7}, Case{80, 1.5e-5, 1.2e-6}, Case{5000, 5e-5, 1e-6}}) {
    const double offset = k.offset;
    const size_t n = 100, dv = 5, chunk = 16;
    const auto s = scores(n, 6.0, offset);
    const auto v = values(n, dv);
    const Part all = direct(s, v, 0, n);
    SoftmaxState st;
    std::vector<float> acc(dv, 0.f);
    for (size_t j0 = 0; j0 < n; j0 += chunk) {
      const size_t e = std::min(n, j0 + chunk);
      float cm = -kInf;
      for (size_t j = j0; j < e; ++j) cm = std::max(cm, float(s[j]));
      const float mn = std::max(st.m, cm);
      std::vector<float> p(e - j0);
      float ps = 0;
      for (size_t j = j0; j < e; ++j) ps += p[j - j0] = std::exp(float(s[j]) - mn);
      const float alpha = st.rescale(mn);
      st.l += ps;
      for (size_t d = 0; d < dv; ++d) {
        float x = acc[d] * alpha;
        for (size_t j = j0; j < e; ++j) x += p[j - j0] * float(v[j][d]);
        acc[d] = x;
      }
    }
    EXPECT_NEAR(st.lse(), all.lse, k.lse_tol) << offset;
    for (size_t d = 0; d < dv; ++d) EXPECT_NEAR(acc[d] / st.l, all.o[d], k.o_tol) << offset << " " << d;
  }
}

TEST_F(SoftmaxStateTest, RescaleOfAnEmptyStateGivesZeroAndNaNStaysNaN) {
  SoftmaxState st;
  EXPECT_EQ(st.rescale(-kInf), 0.f);  // −inf − (−inf) never reaches exp
  EXPECT_EQ(st.rescale(2.f), 0.f);
  EXPECT_EQ(st.weight(-kInf), 0.f);
  EXPECT_EQ(st.weight(2.f), 1.f);
  st.l = NAN;
  EXPECT_TRUE(std::isnan(st.lse()));
}

}  // namespace
}  // namespace mla::gpu
