// mla/reference.h — the float64 judge: the attention layer computed straight from its definition
// (decompress every key, plain softmax), with no method, no cache and no platform. It derives the
// RoPE frequencies, the YaRN scaling, the softmax scale, the pair layout and the cache's rounding
// itself from the HF config fields (docs/hf_conventions.md), sharing no numeric code with the engine.
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

// How the cache stores a row: a row read back from a pool of `dtype` is the row divided by `scale`,
// rounded to `dtype` (nearest even; fp8 saturates at ±448), times `scale`. F64 leaves rows exact.
// Prefix rows always come back from the cache. The new tokens' own rows: `new_rows_from_cache` says
// whether attention sees them as the cache gives them back (MHA_ONE_SHOT, MLA read every row from the
// pool) or exact (MHA, MHA_CHUNKED_KV attend the new rows before they are stored). new_rows in the
// result is always the cached form.
struct CacheRounding {
  DType dtype = DType::F64;
  double scale = 1.0;
  bool new_rows_from_cache = true;
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

// The reference's own definitions, exposed for the tests that pin them to transformers' numbers.
struct ReferenceRope {
  std::vector<double> inv_freq;   // [qk_rope_head_dim / 2]
  double cos_sin_factor = 1.0;    // YaRN attention_factor: cos and sin are multiplied by it
  double softmax_scale = 0.0;     // qk_head_dim^-0.5 · mscale(factor, mscale_all_dim)²
};
ReferenceRope reference_rope(const AttentionConfig& c);
// v rounded to `dtype` (F64: v; F32, BF16, F8_E4M3FN, F8_E4M3FNUZ: nearest even, fp8 saturating).
double reference_round(double v, DType dtype);


// The quantized absorbed weights a platform should use, computed here independently of its packer
// (src/core/quant.cpp), as dequantized values:
//  - fp8 e4m3fn per tensor: scale = max(f32(amax / 448), 2^-126), w ≈ round_e4m3fn(w / scale) · scale
//    (e4m3fnuz weights made from these codes hold the same values);
//  - MXFP4 along the last dim (K values per row, K % 32 == 0), blocks of 32: scale 2^X with
//    X = floor(log2 amax') − 2, amax' = amax with its mantissa rounded up from 1.75 to the next binade,
//    X clamped to [−127, 125]; elements round to e2m1 (0, 0.5, 1, 1.5, 2, 3, 4, 6; nearest even,
//    saturating).
std::vector<double> reference_fp8_per_tensor(const std::vector<double>& w);
std::vector<double> reference_mxfp4(const std::vector<double>& w, int64_t K);

}  // namespace mla
