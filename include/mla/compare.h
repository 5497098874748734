// mla/compare.h — random data and error measures for checking results against a reference.
#pragma once
#include <cstdint>
#include <vector>

#include "mla/tensor.h"

namespace mla {

// Normal(0, stddev) values, reproducible from the seed.
std::vector<double> randn(size_t n, uint64_t seed, double stddev = 1.0);
Tensor random_tensor(Shape shape, DType dtype, uint64_t seed, double stddev = 1.0);

// ‖a − b‖ / ‖b‖ over all elements; +inf if any element of a or b is NaN or inf, if a is all zero, or
// if b is (empty vectors: 0).
double rel_l2(const std::vector<double>& a, const std::vector<double>& b);
// max |a − b| and where.
struct WorstElement {
  double abs_err = 0;
  size_t index = 0;
  double got = 0, want = 0;
};
WorstElement worst_element(const std::vector<double>& a, const std::vector<double>& b);

}  // namespace mla
