// mla/sampling.h — the sampling rule over a row of logits, one home for the host sampler and every
// platform's Ops::sample_rows: temperature, top-k, top-p, min-p, then the draw with a given
// uniform number. Greedy (temperature 0 or top-k 1) is greedy_index's choice (mla/greedy.h).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "mla/error.h"
#include "mla/greedy.h"

namespace mla {

// One row's sampling: the values validate_sampling accepts (src/engine/sampler.h) and the draw's
// uniform number.
struct SampleRow {
  double temperature = 1.0;  // 0: greedy
  double top_p = 1.0;        // (0, 1]
  double min_p = 0.0;        // [0, 1]
  double u = 0.0;            // the draw's uniform number in [0, 1)
  int64_t top_k = 0;         // 0: off
};

// Throws Error naming the first value the rule does not take.
inline void check_sample_row(const SampleRow& p) {
  if (!(std::isfinite(p.temperature) && p.temperature >= 0))
    fail("sampling: temperature must be finite and >= 0, got {}", p.temperature);
  if (!(p.top_p > 0 && p.top_p <= 1)) fail("sampling: top_p must be in (0, 1], got {}", p.top_p);
  if (!(p.min_p >= 0 && p.min_p <= 1)) fail("sampling: min_p must be in [0, 1], got {}", p.min_p);
  if (p.top_k < 0) fail("sampling: top_k must be >= 0 (0: off), got {}", p.top_k);
  if (!(p.u >= 0 && p.u < 1)) fail("sampling: the uniform number u must be in [0, 1), got {}", p.u);
}

inline bool sample_row_is_greedy(const SampleRow& p) { return p.temperature == 0 || p.top_k == 1; }

// Token ids by logit, best first, ties by the lower id (the token greedy picks comes first); the
// first `keep` of them.
inline std::vector<int32_t> order_by_logit(const float* logits, int64_t V, int64_t keep) {
  std::vector<int32_t> idx(static_cast<size_t>(V));
  for (int64_t i = 0; i < V; ++i) idx[size_t(i)] = int32_t(i);
  auto better = [logits](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  keep = std::min(keep, V);
  if (keep < V) {
    std::partial_sort(idx.begin(), idx.begin() + keep, idx.end(), better);
    idx.resize(size_t(keep));
  } else {
    std::sort(idx.begin(), idx.end(), better);
  }
  return idx;
}

// The probabilities the draw uses, over logits [V], as (token, probability) sorted by logit (best
// first, ties by id), renormalized:
//   1. candidates: the top_k best tokens (all when top_k is 0);
//   2. w = exp((logit − best) / temperature) in double (the best token has weight 1), sum over
//      the candidates;
//   3. top-p: the shortest head whose running sum of w (in that order) reaches top_p · sum;
//   4. min-p: of that head, the tokens with w ≥ min_p (w is non-increasing along the order);
//   5. each kept w divided by the kept total.
// Greedy (temperature 0 or top_k 1) is the single greedy token.
inline std::vector<std::pair<int32_t, double>> sampling_distribution(const float* logits, int64_t V,
                                                                     const SampleRow& p) {
  if (V <= 0) fail("sampler: empty logits");
  if (sample_row_is_greedy(p)) return {{int32_t(greedy_index(logits, V)), 1.0}};
  const std::vector<int32_t> order = order_by_logit(logits, V, p.top_k > 0 ? p.top_k : V);
  const double best = logits[order[0]];
  std::vector<double> w(order.size());
  double sum = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    w[i] = std::exp((double(logits[order[i]]) - best) / p.temperature);
    sum += w[i];
  }
  size_t n = order.size();
  if (p.top_p < 1) {
    double kept = 0;
    for (n = 0; n < order.size();) {
      kept += w[n++];
      if (kept >= p.top_p * sum) break;
    }
  }
  if (p.min_p > 0)
    while (n > 1 && w[n - 1] < p.min_p * w[0]) --n;
  double total = 0;
  for (size_t i = 0; i < n; ++i) total += w[i];
  std::vector<std::pair<int32_t, double>> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = {order[i], w[i] / total};
  return out;
}

// The token the row draws: greedy_index when greedy, else the first token of
// sampling_distribution whose running sum of probabilities exceeds u (the last one when u is
// within rounding of 1).
inline int32_t sample_index(const float* logits, int64_t V, const SampleRow& p) {
  if (V <= 0) fail("sampler: empty logits");
  if (sample_row_is_greedy(p)) return int32_t(greedy_index(logits, V));
  const auto dist = sampling_distribution(logits, V, p);
  double acc = 0;
  for (const auto& [tok, prob] : dist) {
    acc += prob;
    if (p.u < acc) return tok;
  }
  return dist.back().first;
}

}  // namespace mla
