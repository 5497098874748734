// The natural-log LSE merge: identity with an empty part, commutative, associative, and two
// halves of the keys merged equal attention over all of them.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "harness.h"
#include "mla/platform_ops.h"

namespace mla::test {
namespace {

constexpr int64_t T = 5, H = 3, D = 8, S = 23;

struct Part {
  Tensor o, lse;
};

class Merge : public ::testing::TestWithParam<DType> {
 protected:
  std::unique_ptr<Ops> ops = make_ops(Platform::CPU, GetParam());
  double tol() const { return GetParam() == DType::F64 ? 1e-13 : 2e-6; }
  Part random_part(uint64_t seed) {
    return {random_tensor({T, H, D}, ops->act_dtype(), seed), random_tensor({T, H}, ops->lse_dtype(), seed + 1, 3.0)};
  }
  Part copy(const Part& p) { return {p.o.clone(), p.lse.clone()}; }
  Part merged(Part a, const Part& b) {
    ops->merge(a.o, a.lse, b.o, b.lse);
    return a;
  }
  void expect_near(const Part& a, const Part& b) {
    EXPECT_LE(rel_l2(a.o.to_doubles(), b.o.to_doubles()), tol());
    EXPECT_LE(rel_l2(a.lse.to_doubles(), b.lse.to_doubles()), tol());
  }
};

TEST_P(Merge, EmptyPartIsTheIdentity) {
  Part a = random_part(1);
  Part empty{random_tensor({T, H, D}, ops->act_dtype(), 9),
             Tensor::host_from(std::vector<double>(T * H, -INFINITY), ops->lse_dtype(), {T, H})};
  Part left = merged(copy(a), empty), right = merged(copy(empty), a);
  EXPECT_EQ(left.o.to_doubles(), a.o.to_doubles());
  EXPECT_EQ(left.lse.to_doubles(), a.lse.to_doubles());
  EXPECT_EQ(right.o.to_doubles(), a.o.to_doubles());
  EXPECT_EQ(right.lse.to_doubles(), a.lse.to_doubles());
  Part both = merged(copy(empty), empty);  // empty ∘ empty stays empty
  for (double v : both.lse.to_doubles()) EXPECT_EQ(v, -INFINITY);
}

TEST_P(Merge, Commutative) {
  Part a = random_part(1), b = random_part(3);
  expect_near(merged(copy(a), b), merged(copy(b), a));
}

TEST_P(Merge, Associative) {
  Part a = random_part(1), b = random_part(3), c = random_part(5);
  expect_near(merged(merged(copy(a), b), c), merged(copy(a), merged(copy(b), c)));
}

TEST_P(Merge, TwoHalvesEqualTheWhole) {
  Tensor q = random_tensor({T, H, D}, ops->act_dtype(), 11), k = random_tensor({S, H, D}, ops->act_dtype(), 12),
         v = random_tensor({S, H, D}, ops->act_dtype(), 13);
  auto attend = [&](int64_t k0, int64_t n) {
    AttnSegments seg{{0}, {T}, {k0}, {n}, false};
    Part p{ops->empty(ops->act_dtype(), {T, H, D}), ops->empty(ops->lse_dtype(), {T, H})};
    ops->attention(q, k, v, seg, 0.3, p.o, p.lse);
    return p;
  };
  for (int64_t split : {0, 1, 11, 22, 23}) expect_near(merged(attend(0, split), attend(split, S - split)), attend(0, S));
}

INSTANTIATE_TEST_SUITE_P(Cpu, Merge, ::testing::Values(DType::F64, DType::F32),
                         [](const auto& i) { return std::string(dtype_name(i.param)); });

}  // namespace
}  // namespace mla::test
