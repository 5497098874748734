// tests/harness.h — what every test may use: random data, error measures, and expect_error.
#pragma once
#include <gtest/gtest.h>

#include <exception>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "mla/compare.h"
#include "mla/error.h"
#include "mla/platform_ops.h"

namespace mla::test {
using mla::randn;
using mla::random_tensor;
using mla::rel_l2;
using mla::worst_element;

// `f` must throw an mla::Error whose one-line message contains every needle; `ctx` names the case in
// failure messages. Any other exception, or none, fails the test.
inline void expect_error(const std::function<void()>& f, const std::vector<std::string>& needles,
                         const std::string& ctx = "") {
  const std::string where = ctx.empty() ? "" : ctx + ": ";
  try {
    f();
    ADD_FAILURE() << where << "no error, expected one containing '" << (needles.empty() ? "" : needles[0]) << "'";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& n : needles)
      EXPECT_NE(msg.find(n), std::string::npos) << where << "message: " << msg << "\nmissing: " << n;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << where << "multi-line: " << msg;
  } catch (const std::exception& e) {
    ADD_FAILURE() << where << "threw a non-mla exception: " << e.what();
  }
}
inline void expect_error(const std::function<void()>& f, std::initializer_list<std::string> needles,
                         const std::string& ctx = "") {
  expect_error(f, std::vector<std::string>(needles), ctx);
}
inline void expect_error(const std::function<void()>& f, const std::string& needle, const std::string& ctx = "") {
  expect_error(f, std::vector<std::string>{needle}, ctx);
}
// The CPU, then CUDA and ROCm where a device runs them.
inline std::vector<Platform> available_platforms() {
  std::vector<Platform> p{Platform::CPU};
  for (Platform q : {Platform::CUDA, Platform::ROCM})
    if (platform_available(q)) p.push_back(q);
  return p;
}

}  // namespace mla::test

namespace mla {
using test::expect_error;  // for the test files written in namespace mla
}  // namespace mla
