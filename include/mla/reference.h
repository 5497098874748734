// mla/reference.h — the float64 judge: the attention layer computed straight from its definition
// (decompress every key, plain softmax), with no method, no cache and no platform.
#pragma once
#include <vector>

#include "mla/batch.h"
#include "mla/config.h"
#include "mla/weights.h"

namespace mla {

struct ReferenceResult {
  std::vector<double> out;  // [T, hidden_size], the new tokens, request after request
  std::vector<double> lse;  // [T, H], natural log
  std::vector<double> new_rows;  // [T, kv_row_dim]: the latent rows the new tokens cache
};

// How the cache stores a row: attention sees (and new_rows holds) every latent row rounded to
// `dtype` after dividing by `scale`, times `scale` — what a pool of that dtype gives back. F64
// (the default) leaves rows exact.
struct CacheRounding {
  DType dtype = DType::F64;
  double scale = 1.0;
};

// x[r] holds request r's hidden states for ALL its tokens [prefix_len + new_len, hidden_size];
// positions are 0, 1, .... Weights are read as double.
ReferenceResult reference_attention(const AttentionConfig& c, const AttentionWeights& w,
                                    const std::vector<std::vector<double>>& x, const Batch& b,
                                    const CacheRounding& cache = {});

// The latent cache rows [n, kv_row_dim] of hidden states x[n, hidden_size] at positions
// first_position, first_position + 1, ...
std::vector<double> reference_latent_rows(const AttentionConfig& c, const AttentionWeights& w,
                                          const std::vector<double>& x, int64_t first_position);

}  // namespace mla
