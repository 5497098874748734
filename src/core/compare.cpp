// Random data and error measures.
#include "mla/compare.h"

#include <cmath>
#include <limits>
#include <random>

namespace mla {

std::vector<double> randn(size_t n, uint64_t seed, double stddev) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> dist(0.0, stddev);
  std::vector<double> v(n);
  for (double& x : v) x = dist(rng);
  return v;
}

Tensor random_tensor(Shape shape, DType dtype, uint64_t seed, double stddev) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return Tensor::host_from(randn(size_t(n), seed, stddev), dtype, std::move(shape));
}

double rel_l2(const std::vector<double>& a, const std::vector<double>& b) {
  constexpr double inf = std::numeric_limits<double>::infinity();
  if (a.size() != b.size()) return inf;
  if (a.empty()) return 0;
  double num = 0, den = 0, mass = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return inf;
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
    mass += a[i] * a[i];
  }
  // An all-zero result is never a match, not even of an all-zero reference: a method that wrote
  // nothing must not pass against a reference that computed nothing.
  if (mass == 0) return inf;
  if (den == 0) return inf;
  return std::sqrt(num / den);
}

WorstElement worst_element(const std::vector<double>& a, const std::vector<double>& b) {
  WorstElement w;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    double e = std::fabs(a[i] - b[i]);
    if (std::isnan(e)) e = std::numeric_limits<double>::infinity();
    if (e > w.abs_err || (i == 0)) w = {e, i, a[i], b[i]};
  }
  return w;
}

}  // namespace mla
