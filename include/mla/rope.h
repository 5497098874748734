// mla/rope.h — YaRN rotary frequencies and the rotation itself (interleaved pairs or NeoX halves).
#pragma once
#include <cstdint>
#include <vector>

#include "mla/config.h"

namespace mla {

// The frequencies of one RoPE head of qk_rope_head_dim, as DeepSeek's YaRN computes them.
struct RopeFrequencies {
  std::vector<double> inv_freq;    // [qk_rope_head_dim / 2]
  double attention_factor = 1.0;   // cos and sin are multiplied by it (YaRN mscale ratio)
  bool interleave = true;          // pairs (2i, 2i+1); false: (i, i + d/2)
};
RopeFrequencies rope_frequencies(const AttentionConfig& c);

// Rotates `x` in place: `x` holds `rows` rows of `rope_dim` values each, row r at x + r*stride,
// rotated by angle positions[r / rows_per_position] · inv_freq. Angles are computed in double.
template <typename T>
void apply_rope(T* x, int64_t rows, int64_t stride, int64_t rows_per_position,
                const int32_t* positions, const RopeFrequencies& f);

}  // namespace mla
