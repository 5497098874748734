// tests/harness.h — what every test may use.
#pragma once
#include "mla/compare.h"

namespace mla::test {
using mla::randn;
using mla::random_tensor;
using mla::rel_l2;
using mla::worst_element;
}  // namespace mla::test
