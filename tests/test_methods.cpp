// The reference harness: every forward method × CPU ops flavour × dtype × shape against the
// float64 reference (out, LSE, the cached rows), with NaN in every unused cache row.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>

#include "harness.h"
#include "mla/config.h"
#include "mla/error.h"
#include "mla/quant.h"
#include "mla/reference_harness.h"
#include "mla/registry.h"
#include "method_cases.h"

namespace mla::test {
namespace {

class Methods : public ::testing::TestWithParam<LayerCase> {};

TEST_P(Methods, EveryMethodMatchesTheReference) {
  const LayerCase& c = GetParam();
  if (!platform_available(c.platform)) GTEST_SKIP() << "platform " << platform_name(c.platform) << " is not available here";
  LayerFixture fx(c);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const Batch batch = Batch::from_lengths(c.mode, c.requests);
  int ran = 0;
  // Every method the registry lists for the platform that serves this batch (MHA serves no prefix,
  // MLA_FUSED_ROPE_ROCM only decodes: their refusals are tested elsewhere).
  for (const MethodImpl* impl : method_impls()) {
    if (impl->platform != c.platform || impl->cannot_serve(batch)) continue;
    const ForwardMethod m = impl->method;
    const Tolerance tol = tolerance(c, m);
    LayerRun r = fx.run(m, nan);
    LayerErrors e = fx.errors(r);
    WorstElement w = worst_element(r.out, fx.reference(m).out);
    std::printf("  %-15s out %.2e  lse %.2e  rows %.2e  worst |%.4g - %.4g| at %zu  (tol %.0e %.0e %.0e)\n",
                std::string(method_name(m)).c_str(), e.out, e.lse, e.rows, w.got, w.want, w.index, tol.out, tol.lse,
                tol.rows);
    std::printf("  measured %s %s %s %s %.3e %.3e %.3e\n", std::string(platform_name(c.platform)).c_str(),
                std::string(method_name(m)).c_str(), std::string(dtype_name(c.act)).c_str(),
                std::string(dtype_name(c.kv)).c_str(), e.out, e.lse, e.rows);
    EXPECT_LE(e.out, tol.out) << method_name(m) << ": output";
    EXPECT_LE(e.lse, tol.lse) << method_name(m) << ": LSE";
    EXPECT_LE(e.rows, tol.rows) << method_name(m) << ": cached rows";
    // NaN in unused rows never travels: with finite garbage there, outputs are bit-identical.
    LayerRun g = fx.run(m, 3.0);
    EXPECT_EQ(g.out, r.out) << method_name(m) << ": output depends on unused cache rows";
    EXPECT_EQ(g.lse, r.lse) << method_name(m);
    ++ran;
  }
  EXPECT_GE(ran, 3);
  // The dispatched method (the platform's default backend) runs and matches too.
  LayerRun d = fx.run(std::nullopt, nan);
  EXPECT_TRUE(within(fx.errors(d), tolerance(c, d.method))) << "dispatched " << method_name(d.method);
}

INSTANTIATE_TEST_SUITE_P(Cpu, Methods, ::testing::ValuesIn(all_cases(Platform::CPU)),
                         [](const auto& info) { return info.param.name; });
// The same harness on the GPU (skipped where this build or machine has none).
INSTANTIATE_TEST_SUITE_P(Cuda, Methods, ::testing::ValuesIn(all_cases(Platform::CUDA)),
                         [](const auto& info) { return info.param.name; });
// The ROCm twins, on whatever GPU runs the ROCm platform (rocm-on-cuda on NVIDIA), across targets
// and absorb weight formats.
INSTANTIATE_TEST_SUITE_P(Rocm, Methods, ::testing::ValuesIn(rocm_cases()),
                         [](const auto& info) { return info.param.name; });

TEST(Methods, MhaRefusesAPrefixAndLeavesThePoolAlone) {
  LayerCase c;
  c.cfg = tiny_config();
  c.requests = {{5, 2}};
  LayerFixture fx(c);
  try {
    fx.run(ForwardMethod::MHA, 0.0);
    FAIL() << "MHA served a batch with a prefix";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("MHA"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("prefix"), std::string::npos) << e.what();
  }
}

TEST(Compare, AllZeroOrNonFiniteNeverMatches) {
  const std::vector<double> ref = {1.0, -2.0, 0.5}, zeros(3, 0.0), nans(3, std::nan(""));
  EXPECT_EQ(rel_l2(zeros, ref), INFINITY);
  EXPECT_EQ(rel_l2(zeros, zeros), INFINITY);  // a method that wrote nothing, a reference that computed nothing
  EXPECT_EQ(rel_l2(nans, ref), INFINITY);
  EXPECT_EQ(rel_l2(ref, nans), INFINITY);
  EXPECT_EQ(rel_l2({1.0, 2.0}, ref), INFINITY);
  EXPECT_EQ(rel_l2(ref, ref), 0.0);
  EXPECT_EQ(rel_l2({}, {}), 0.0);
  EXPECT_NEAR(rel_l2({1.0, -2.0, 0.0}, ref), 0.5 / std::sqrt(5.25), 1e-15);
}

// The reference's own quantizers of the absorbed weights give what src/core/quant.cpp gives (they
// are written separately so that a ROCm packer bug cannot hide in the reference).
TEST(Reference, QuantizersAgreeWithCoreQuant) {
  for (double stddev : {1.0, 3e-3, 40.0}) {
    const std::vector<double> w = randn(size_t(6 * 64), 17, stddev);
    const Tensor t = Tensor::host_from(w, DType::F32, {6, 64});
    const std::vector<double> w32 = t.to_doubles();
    const std::vector<double> fp8 = dequantize(quantize_fp8_per_tensor(t, Fp8Flavor::E4M3FN), DType::F64).to_doubles();
    EXPECT_EQ(reference_fp8_per_tensor(w32), fp8) << "stddev " << stddev;
    const std::vector<double> fnuz = dequantize(quantize_fp8_per_tensor(t, Fp8Flavor::E4M3FNUZ), DType::F64).to_doubles();
    EXPECT_EQ(reference_fp8_per_tensor(w32), fnuz) << "stddev " << stddev;
    const std::vector<double> mx = dequantize(quantize_mxfp4(t), DType::F64).to_doubles();
    EXPECT_EQ(reference_mxfp4(w32, 64), mx) << "stddev " << stddev;
    EXPECT_GT(rel_l2(mx, w32), 1e-2);  // it did quantize
  }
}

// The reference's rounding of cached rows against the engine's conversions, value by value.
TEST(Reference, CacheRoundingAgreesWithDtypeConversions) {
  const std::vector<double> v = randn(4096, 5, 30.0);
  for (DType d : {DType::BF16, DType::F8_E4M3FN, DType::F8_E4M3FNUZ}) {
    std::vector<uint8_t> cell(8);
    size_t differ = 0;
    for (double x : v) {
      store_from_double(cell.data(), d, 0, double(float(x)));
      if (load_as_double(cell.data(), d, 0) != reference_round(double(float(x)), d)) ++differ;
    }
    EXPECT_EQ(differ, 0u) << dtype_name(d);
  }
  EXPECT_EQ(reference_round(1000.0, DType::F8_E4M3FN), 448.0);  // saturates
  EXPECT_EQ(reference_round(-1000.0, DType::F8_E4M3FNUZ), -240.0);
}

TEST(Methods, RocmTwinsAreNotOnTheCpu) {
  LayerCase c;
  c.cfg = tiny_config();
  c.requests = {{0, 2}};
  LayerFixture fx(c);
  EXPECT_THROW(fx.run(ForwardMethod::MLA_ROCM, 0.0), Error);
}

}  // namespace
}  // namespace mla::test
