// src/engine/sampler.cpp — the sampler: penalties, temperature, top-k, top-p, min-p, logprobs.
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "mla/error.h"
#include "mla/sampling.h"

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

}  // namespace

double stream_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  const uint64_t h = splitmix64(splitmix64(splitmix64(seed) ^ stream) ^ index);
  return double(h >> 11) * 0x1.0p-53;
}

SampleRow sample_row(const SamplingParams& p, double u) {
  SampleRow r;
  r.temperature = p.temperature, r.top_p = p.top_p, r.min_p = p.min_p, r.u = u, r.top_k = p.top_k;
  return r;
}

std::vector<std::pair<int32_t, double>> sampling_distribution(const float* logits, int64_t V,
                                                              const SamplingParams& p) {
  return mla::sampling_distribution(logits, V, sample_row(p, 0.0));
}

int32_t sample_token(const float* logits, int64_t V, const SamplingParams& p, double u) {
  return sample_index(logits, V, sample_row(p, u));
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
