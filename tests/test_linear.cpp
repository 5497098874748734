// Ops::linear on every platform against a double reference: a few rows (decode) and many; bf16 and
// f32 weights (the router's, with bf16 activations: mixed dtypes), N and K that are not multiples
// of 8, 16 or 64.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <tuple>
#include <utility>
#include <vector>

#include "harness.h"
#include "mla/platform_ops.h"

namespace mla {
namespace {

std::vector<Platform> platforms() { return test::available_platforms(); }

// Largest |got − want| over the largest |want|. Measured: f32 out 3.7e-7 on the CPU, 3.0e-6 on the
// H200 (cuBLAS, bf16 weights into f32 out); bf16 out 3.0e-3 (the output's own rounding, 2⁻⁹ of a
// value).
double tolerance(DType out) { return out == DType::F32 ? 1e-5 : 1e-2; }

TEST(Linear, FewAndManyRowsMatchTheReference) {
  double worst[2] = {0, 0};  // bf16 out, f32 out
  // (activations, weights, out): the layers' own; f32 weights with f32 out, as the router; bf16
  // weights with f32 out, as lm_head's logits.
  const std::vector<std::tuple<DType, DType, DType>> kinds{
      {DType::F32, DType::F32, DType::F32},   {DType::BF16, DType::BF16, DType::BF16},
      {DType::BF16, DType::F32, DType::F32},  {DType::BF16, DType::BF16, DType::F32}};
  for (Platform p : platforms())
    for (const auto& [act, wt, yt] : kinds) {
      auto ops = make_ops(p, act);
      for (auto [N, K] : {std::pair<int64_t, int64_t>{37, 1000}, {64, 2048}, {2051, 512}}) {
        Tensor w = ops->empty(wt, {N, K});
        ops->fill_random(w, 11, 1.0 / std::sqrt(double(K)));
        const std::vector<double> wd = ops->download(w).to_doubles();
        for (int64_t M : {1, 2, 3, 5, 8, 9, 33}) {
          SCOPED_TRACE(fmt::format("{} act {} w {} out {} M {} N {} K {}", platform_name(p), dtype_name(act),
                                   dtype_name(wt), dtype_name(yt), M, N, K));
          Tensor x = ops->empty(act, {M, K}), y = ops->empty(yt, {M, N});
          ops->fill_random(x, 12, 1.0);
          ops->linear(x, w, y);
          const std::vector<double> xd = ops->download(x).to_doubles();
          const std::vector<double> got = ops->download(y).to_doubles();
          double err = 0, scale = 0;
          for (int64_t m = 0; m < M; ++m)
            for (int64_t n = 0; n < N; ++n) {
              double want = 0;
              for (int64_t k = 0; k < K; ++k) want += xd[size_t(m * K + k)] * wd[size_t(n * K + k)];
              err = std::max(err, std::abs(got[size_t(m * N + n)] - want)), scale = std::max(scale, std::abs(want));
            }
          EXPECT_LE(err / scale, tolerance(yt));
          worst[yt == DType::F32] = std::max(worst[yt == DType::F32], err / scale);
        }
      }
    }
  std::cout << "[ linear ] worst max err / max |out|: bf16 out " << worst[0] << ", f32 out " << worst[1] << "\n";
}

}  // namespace
}  // namespace mla
