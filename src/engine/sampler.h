// src/engine/sampler.h — choosing the next token from a row of logits: penalties, temperature,
// top-k, top-p, min-p, a per-request random stream, and OpenAI-style logprobs.
#pragma once
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "engine/service.h"
#include "mla/sampling.h"

namespace mla::engine {

// Checks sampling values; throws Error naming the first bad one.
void validate_sampling(const SamplingParams& p);

// OpenAI's penalties on a copy of the logits: logit[j] -= count[j] · frequency_penalty
// + (count[j] > 0) · presence_penalty, count[j] = times token j was generated so far.
void apply_penalties(std::vector<float>& logits, const std::unordered_map<int32_t, int64_t>& counts,
                     double frequency_penalty, double presence_penalty);

// A uniform number in [0, 1) that is a pure function of (seed, stream, index): the choice's
// stream and the token's index within it. No state is shared between requests, so a request
// samples the same tokens whatever else is in its batch.
double stream_uniform(uint64_t seed, uint64_t stream, uint64_t index);

// The platform's sampling parameters of `p` (mla/sampling.h), with the draw's uniform u.
SampleRow sample_row(const SamplingParams& p, double u);

// The probabilities the sampler draws from after temperature, top-k, top-p and min-p, over the
// (already penalized) logits [V], as (token, probability) sorted by logit (best first, ties by id),
// renormalized. Greedy (temperature 0) is the single best token. The rule is mla/sampling.h's,
// which every platform's Ops::sample_rows follows.
std::vector<std::pair<int32_t, double>> sampling_distribution(const float* logits, int64_t V,
                                                              const SamplingParams& p);

// The next token: greedy when temperature is 0, else drawn from sampling_distribution with the
// uniform u.
int32_t sample_token(const float* logits, int64_t V, const SamplingParams& p, double u);

// log_softmax of the raw logits (before penalties and temperature, as OpenAI reports): the
// chosen token's logprob and the top `top` alternatives, best first (ties by id).
TokenLogprob token_logprobs(const float* logits, int64_t V, int32_t chosen, int64_t top);

}  // namespace mla::engine
