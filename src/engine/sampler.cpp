// src/engine/sampler.cpp — the sampler: penalties, temperature, top-k, top-p, min-p, logprobs.
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "mla/error.h"
#include "mla/greedy.h"

namespace mla::engine {

void validate_sampling(const SamplingParams& p) {
  if (!std::isfinite(p.temperature) || p.temperature < 0 || p.temperature > 100)
    fail("temperature must be in [0, 100], got {}", p.temperature);
  if (!(p.top_p > 0 && p.top_p <= 1)) fail("top_p must be in (0, 1], got {}", p.top_p);
  if (p.top_k < 0) fail("top_k must be >= 0 (0: off), got {}", p.top_k);
  if (!(p.min_p >= 0 && p.min_p <= 1)) fail("min_p must be in [0, 1], got {}", p.min_p);
  if (!(p.frequency_penalty >= -2 && p.frequency_penalty <= 2))
    fail("frequency_penalty must be in [-2, 2], got {}", p.frequency_penalty);
  if (!(p.presence_penalty >= -2 && p.presence_penalty <= 2))
    fail("presence_penalty must be in [-2, 2], got {}", p.presence_penalty);
  if (p.max_tokens < 1) fail("max_tokens must be >= 1, got {}", p.max_tokens);
  if (p.top_logprobs < -1 || p.top_logprobs > 20)
    fail("top_logprobs must be in [0, 20] (or -1: no logprobs), got {}", p.top_logprobs);
}

void apply_penalties(std::vector<float>& logits, const std::unordered_map<int32_t, int64_t>& counts,
                     double frequency_penalty, double presence_penalty) {
  if (frequency_penalty == 0 && presence_penalty == 0) return;
  for (const auto& [tok, n] : counts) {
    if (n <= 0 || tok < 0 || size_t(tok) >= logits.size()) continue;
    logits[size_t(tok)] = float(double(logits[size_t(tok)]) - double(n) * frequency_penalty - presence_penalty);
  }
}

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Token ids by logit, best first, ties by the lower id (the token greedy picks comes first).
std::vector<int32_t> order_by_logit(const float* logits, int64_t V, int64_t keep) {
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

int32_t argmax(const float* logits, int64_t V) { return int32_t(greedy_index(logits, V)); }

}  // namespace

double stream_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  const uint64_t h = splitmix64(splitmix64(splitmix64(seed) ^ stream) ^ index);
  return double(h >> 11) * 0x1.0p-53;
}

std::vector<std::pair<int32_t, double>> sampling_distribution(const float* logits, int64_t V,
                                                              const SamplingParams& p) {
  if (V <= 0) fail("sampler: empty logits");
  if (p.temperature == 0 || p.top_k == 1) return {{argmax(logits, V), 1.0}};
  const std::vector<int32_t> order = order_by_logit(logits, V, p.top_k > 0 ? p.top_k : V);
  // Softmax of logits / temperature over the candidates (in double; the best has weight 1).
  const double best = logits[order[0]];
  std::vector<double> w(order.size());
  double sum = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    w[i] = std::exp((double(logits[order[i]]) - best) / p.temperature);
    sum += w[i];
  }
  // top-p: the shortest head whose mass reaches top_p (at least one token).
  size_t n = order.size();
  if (p.top_p < 1) {
    double kept = 0;
    for (n = 0; n < order.size();) {
      kept += w[n++];
      if (kept >= p.top_p * sum) break;
    }
  }
  // min-p: tokens at least min_p times the best one's probability.
  if (p.min_p > 0)
    while (n > 1 && w[n - 1] < p.min_p * w[0]) --n;
  double total = 0;
  for (size_t i = 0; i < n; ++i) total += w[i];
  std::vector<std::pair<int32_t, double>> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = {order[i], w[i] / total};
  return out;
}

int32_t sample_token(const float* logits, int64_t V, const SamplingParams& p, double u) {
  if (p.temperature == 0 || p.top_k == 1) return argmax(logits, V);
  const auto dist = sampling_distribution(logits, V, p);
  double acc = 0;
  for (const auto& [tok, prob] : dist) {
    acc += prob;
    if (u < acc) return tok;
  }
  return dist.back().first;  // u within rounding of 1
}

TokenLogprob token_logprobs(const float* logits, int64_t V, int32_t chosen, int64_t top) {
  if (chosen < 0 || chosen >= V) fail("sampler: token {} outside the vocabulary [0, {})", chosen, V);
  const double m = *std::max_element(logits, logits + V);
  double sum = 0;
  for (int64_t i = 0; i < V; ++i) sum += std::exp(double(logits[i]) - m);
  const double lse = m + std::log(sum);
  TokenLogprob t;
  t.id = chosen;
  t.logprob = float(double(logits[chosen]) - lse);
  if (top > 0)
    for (int32_t id : order_by_logit(logits, V, top)) t.top.emplace_back(id, float(double(logits[id]) - lse));
  return t;
}

}  // namespace mla::engine
