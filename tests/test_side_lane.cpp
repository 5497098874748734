// Ops side lanes (Ops::side_begin / side_end / side_join, SideLane): the joined result is the
// result of the calls in program order, calls out of order fail, and an error inside a lane leaves
// the platform working. On CUDA the lane is a second stream: the side lane below starts with one
// long single-block call, leaving the SMs free to the main lane's calls, so a join that does not
// wait shows up as other bits.
#include <gtest/gtest.h>

#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "mla/error.h"
#include "harness.h"
#include "mla/platform_ops.h"

namespace mla {
namespace {

std::vector<Platform> platforms() { return test::available_platforms(); }

bool same_bits(const Tensor& a, const Tensor& b) { return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0; }

TEST(SideLane, TheJoinedResultIsTheOrderedOne) {
  for (Platform p : platforms()) {
    auto ops = make_ops(p, DType::BF16);
    const int64_t M = 256, K = 1024, N = 256;
    Tensor x = ops->empty(DType::BF16, {M, K}), w = ops->empty(DType::BF16, {N, K}), y = ops->empty(DType::BF16, {M, N});
    ops->fill_random(x, 1, 1.0);
    ops->fill_random(w, 2, 0.02);
    ops->fill_random(y, 4, 0.5);
    Tensor wide = ops->empty(DType::F32, {1, int64_t(1) << 24}), ids = ops->empty(DType::I32, {1});
    ops->fill_random(wide, 5, 1.0);
    auto run = [&](bool lane) {
      Tensor s = ops->empty(DType::BF16, {M, N}), out = ops->empty(DType::BF16, {M, N});
      std::optional<SideLane> l;
      if (lane) l.emplace(*ops);
      ops->argmax_rows(wide, ids);  // the side lane's work: one block over 2²⁴ values (long, few SMs),
      ops->linear(x, w, s);         // then a GEMM (its own cuBLAS handle) and a chain
      for (int i = 0; i < 4; ++i) ops->add(s, y);
      if (lane) l->main();
      ops->fill_random(out, 3, 1.0);  // the main lane's, alongside
      if (lane) l->join();
      ops->add(out, s);  // reads the side lane's result after the join
      return std::pair{ops->download(s), ops->download(out)};
    };
    const auto [s0, out0] = run(false);
    for (int rep = 0; rep < 3; ++rep) {
      const auto [s1, out1] = run(true);
      EXPECT_TRUE(same_bits(s0, s1)) << platform_name(p) << ": the side lane's own result";
      EXPECT_TRUE(same_bits(out0, out1)) << platform_name(p) << ": the result after the join";
    }
  }
}

TEST(SideLane, CallsOutOfOrderFailAndLeaveTheLanesWorking) {
  for (Platform p : platforms()) {
    if (p == Platform::CPU) continue;  // the CPU runs the calls in order and checks nothing
    auto ops = make_ops(p, DType::BF16);
    EXPECT_THROW(ops->side_end(), Error);
    EXPECT_THROW(ops->side_join(), Error);
    ops->side_begin();
    EXPECT_THROW(ops->side_begin(), Error);
    EXPECT_THROW(ops->synchronize(), Error);
    EXPECT_THROW(ops->side_join(), Error);  // not ended yet
    ops->side_end();
    EXPECT_THROW(ops->side_end(), Error);
    ops->side_join();
    ops->synchronize();
    // An error inside a lane: SideLane's destructor ends and joins it.
    Tensor a = ops->empty(DType::BF16, {4, 8}), b = ops->empty(DType::BF16, {8, 8}), bad = ops->empty(DType::BF16, {4, 3});
    try {
      SideLane l(*ops);
      ops->linear(a, b, bad);
      ADD_FAILURE() << "a linear into the wrong shape did not throw";
    } catch (const Error&) {
    }
    ops->synchronize();  // no lane is open
    SideLane l(*ops);
    l.join();
  }
}

}  // namespace
}  // namespace mla
