// rope.cpp — YaRN frequencies (as HF transformers' _compute_yarn_parameters) and the rotation.
#include "mla/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "mla/dtype.h"
#include "mla/error.h"

namespace mla {
namespace {

double get_mscale(double scale, double mscale = 1.0) {
  return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

// The dimension index at which a frequency makes `num_rotations` turns over `max_pos` positions.
double find_correction_dim(double num_rotations, double dim, double base, double max_pos) {
  return dim * std::log(max_pos / (num_rotations * 2.0 * std::numbers::pi)) /
         (2.0 * std::log(base));
}

// Element access: compute in double, store T (bf16 goes through float).
template <typename T>
inline double load(const T& v) {
  return double(v);
}
template <>
inline double load<bf16>(const bf16& v) {
  return double(bf16_to_float(v));
}
template <typename T>
inline T store(double v) {
  return T(v);
}
template <>
inline bf16 store<bf16>(double v) {
  return float_to_bf16(float(v));
}

}  // namespace

RopeFrequencies rope_frequencies(const AttentionConfig& c) {
  c.validate();
  const int64_t dim = c.qk_rope_head_dim;
  const int64_t half = dim / 2;
  const double base = c.rope_theta;
  RopeFrequencies f;
  f.interleave = c.rope_interleave;
  f.inv_freq.resize(size_t(half));
  if (c.rope_scaling.type != "yarn") {
    for (int64_t i = 0; i < half; ++i)
      f.inv_freq[size_t(i)] = 1.0 / std::pow(base, double(2 * i) / double(dim));
    f.attention_factor = 1.0;
    return f;
  }

  const RopeScaling& rs = c.rope_scaling;
  const double factor = rs.factor;
  if (rs.mscale != 0 && rs.mscale_all_dim != 0)
    f.attention_factor = get_mscale(factor, rs.mscale) / get_mscale(factor, rs.mscale_all_dim);
  else
    f.attention_factor = get_mscale(factor);

  // Correction range [low, high] in dimension units, truncated and clamped to [0, dim - 1].
  const double orig = double(rs.original_max_position_embeddings);
  double low = std::floor(find_correction_dim(rs.beta_fast, double(dim), base, orig));
  double high = std::ceil(find_correction_dim(rs.beta_slow, double(dim), base, orig));
  low = std::max(low, 0.0);
  high = std::min(high, double(dim - 1));
  if (low == high) high += 0.001;

  for (int64_t i = 0; i < half; ++i) {
    const double pos_freq = std::pow(base, double(2 * i) / double(dim));
    const double extrap = 1.0 / pos_freq;
    const double interp = 1.0 / (factor * pos_freq);
    const double ramp = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
    const double extrap_factor = 1.0 - ramp;
    f.inv_freq[size_t(i)] = interp * (1.0 - extrap_factor) + extrap * extrap_factor;
  }
  return f;
}

namespace {

// Rotates the rows of positions [p0, p1); `cs` is scratch for 2·half doubles.
template <typename T, bool Interleave>
void rotate_positions(T* x, int64_t rows, int64_t stride, int64_t rpp, const int32_t* positions,
                      const double* inv_freq, int64_t half, double af, int64_t p0, int64_t p1,
                      double* __restrict cs) {
  double* __restrict cos_ = cs;
  double* __restrict sin_ = cs + half;
  for (int64_t p = p0; p < p1; ++p) {
    const double pos = double(positions[p]);
    for (int64_t i = 0; i < half; ++i) {
      const double a = pos * inv_freq[i];
      cos_[i] = std::cos(a) * af;
      sin_[i] = std::sin(a) * af;
    }
    const int64_t r_end = std::min(rows, (p + 1) * rpp);
    for (int64_t r = p * rpp; r < r_end; ++r) {
      T* __restrict row = x + r * stride;
      // Interleaved: pairs (2i, 2i+1); NeoX: halves (i, i + d/2).
      T* __restrict a0 = row;
      T* __restrict a1 = Interleave ? row + 1 : row + half;
      constexpr int64_t step = Interleave ? 2 : 1;
      for (int64_t i = 0; i < half; ++i) {
        const double x0 = load(a0[step * i]), x1 = load(a1[step * i]);
        a0[step * i] = store<T>(x0 * cos_[i] - x1 * sin_[i]);
        a1[step * i] = store<T>(x0 * sin_[i] + x1 * cos_[i]);
      }
    }
  }
}

}  // namespace

template <typename T>
void apply_rope(T* x, int64_t rows, int64_t stride, int64_t rows_per_position,
                const int32_t* positions, const RopeFrequencies& f) {
  const int64_t half = int64_t(f.inv_freq.size());
  const int64_t d = 2 * half;
  if (rows < 0) fail("apply_rope: rows must be >= 0 (got {})", rows);
  if (rows == 0 || half == 0) return;
  if (rows_per_position <= 0)
    fail("apply_rope: rows_per_position must be positive (got {})", rows_per_position);
  if (rows > 1 && stride < d)
    fail("apply_rope: stride {} is smaller than the rope dimension {}", stride, d);
  if (!x || !positions) fail("apply_rope: null pointer argument");

  const int64_t rpp = rows_per_position;
  const int64_t n_pos = (rows + rpp - 1) / rpp;
  auto run = [&](int64_t p0, int64_t p1, double* cs) {
    if (f.interleave)
      rotate_positions<T, true>(x, rows, stride, rpp, positions, f.inv_freq.data(), half,
                                f.attention_factor, p0, p1, cs);
    else
      rotate_positions<T, false>(x, rows, stride, rpp, positions, f.inv_freq.data(), half,
                                 f.attention_factor, p0, p1, cs);
  };

  // Small calls (a decode step) stay on the calling thread, without a team or an allocation.
  constexpr int64_t kStackHalf = 128;
  if (n_pos == 1 || rows * d < (int64_t(1) << 14)) {
    if (half <= kStackHalf) {
      double cs[2 * kStackHalf];
      run(0, n_pos, cs);
    } else {
      std::vector<double> cs(size_t(2 * half));
      run(0, n_pos, cs.data());
    }
    return;
  }
#pragma omp parallel
  {
    std::vector<double> cs(size_t(2 * half));
#pragma omp for schedule(static)
    for (int64_t p = 0; p < n_pos; ++p) run(p, p + 1, cs.data());
  }
}

template void apply_rope<double>(double*, int64_t, int64_t, int64_t, const int32_t*,
                                 const RopeFrequencies&);
template void apply_rope<float>(float*, int64_t, int64_t, int64_t, const int32_t*,
                                const RopeFrequencies&);
template void apply_rope<bf16>(bf16*, int64_t, int64_t, int64_t, const int32_t*,
                               const RopeFrequencies&);

}  // namespace mla
