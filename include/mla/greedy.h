// mla/greedy.h — the greedy choice over a row of logits, one rule for the host sampler and every
// platform's Ops::argmax_rows: the first index of the largest value; NaN never wins (a row of NaN
// gives 0).
#pragma once
#include <cmath>
#include <cstdint>

namespace mla {

inline int64_t greedy_index(const float* row, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 0; i < n; ++i)
    if (row[i] > row[best] || (std::isnan(row[best]) && !std::isnan(row[i]))) best = i;
  return best;
}

}  // namespace mla
