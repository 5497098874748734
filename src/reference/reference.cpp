// The float64 reference of one MLA attention layer: plain loops, straight from the definition.
// Independent of the methods, the ops and the KV pool on purpose, and of the engine's numeric
// helpers too: RoPE frequencies, YaRN, the softmax scale, the pair layout and the rounding of cached
// rows are written here again from transformers' definitions (docs/hf_conventions.md: RoPE, YaRN,
// "Attention (MLA)"), so a mistake in src/core cannot hide by being made twice.
#include "mla/reference.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "mla/error.h"

namespace mla {
namespace {

using Vec = std::vector<double>;
constexpr double kPi = 3.14159265358979323846;

// y[n] = Σ_k W[n, k] x[k] for W [N, K]
Vec matvec(const Vec& W, int64_t N, int64_t K, const double* x) {
  Vec y(size_t(N), 0.0);
  for (int64_t n = 0; n < N; ++n) {
    double s = 0;
    for (int64_t k = 0; k < K; ++k) s += W[size_t(n * K + k)] * x[k];
    y[size_t(n)] = s;
  }
  return y;
}

void rmsnorm(double* x, int64_t n, const Vec& w, double eps) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const double inv = 1.0 / std::sqrt(ss / double(n) + eps);
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] * inv * w[size_t(i)];
}

// transformers' yarn_get_mscale: 1 for scale <= 1, else 0.1·m·ln(scale) + 1.
double yarn_mscale(double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; }

// x[0, dr) rotated by position `pos`: adjacent pairs (2i, 2i+1) when rope_interleave (kept in place),
// NeoX halves (i, i + dr/2) otherwise; y0 = x0·cos − x1·sin, y1 = x1·cos + x0·sin, cos and sin times
// the YaRN attention factor.
void rotate(double* x, int64_t pos, const ReferenceRope& r, bool interleave) {
  const int64_t half = int64_t(r.inv_freq.size());
  for (int64_t i = 0; i < half; ++i) {
    const double a = double(pos) * r.inv_freq[size_t(i)];
    const double cs = std::cos(a) * r.cos_sin_factor, sn = std::sin(a) * r.cos_sin_factor;
    const int64_t i0 = interleave ? 2 * i : i, i1 = interleave ? 2 * i + 1 : i + half;
    const double x0 = x[i0], x1 = x[i1];
    x[i0] = x0 * cs - x1 * sn;
    x[i1] = x1 * cs + x0 * sn;
  }
}

// Nearest-even rounding to a float format with `mant` stored mantissa bits, smallest normal
// exponent `emin` (subnormals below it), largest finite value `max` (saturating) — on doubles.
double round_format(double v, int mant, int emin, double max, bool saturate) {
  if (v == 0 || !std::isfinite(v)) return v;
  const double a = std::fabs(v);
  int e2;
  std::frexp(a, &e2);  // a = m · 2^e2, m in [0.5, 1): the leading bit has weight 2^(e2 - 1)
  const int e = std::max(e2 - 1, emin);
  const double quantum = std::ldexp(1.0, e - mant);
  double r = std::nearbyint(a / quantum) * quantum;  // the default rounding mode: nearest even
  if (r > max) r = saturate ? max : std::numeric_limits<double>::infinity();
  return std::copysign(r, v);
}

struct Weights64 {
  Vec q_a, q_a_norm, q_b, q, kv_a, kv_a_norm, kv_b, o;
  explicit Weights64(const AttentionWeights& w) {
    auto get = [](const Tensor& t) { return t.defined() ? t.to_doubles() : Vec(); };
    q_a = get(w.q_a_proj), q_a_norm = get(w.q_a_layernorm), q_b = get(w.q_b_proj), q = get(w.q_proj);
    kv_a = get(w.kv_a_proj_with_mqa), kv_a_norm = get(w.kv_a_layernorm), kv_b = get(w.kv_b_proj);
    o = get(w.o_proj);
  }
};

Vec latent_row(const AttentionConfig& c, const Weights64& w, const double* x, int64_t pos, const ReferenceRope& r) {
  Vec row = matvec(w.kv_a, c.kv_lora_rank + c.qk_rope_head_dim, c.hidden_size, x);  // [r_kv + dr]
  rmsnorm(row.data(), c.kv_lora_rank, w.kv_a_norm, c.latent_norm_eps);  // k_pe is not normalized
  rotate(row.data() + c.kv_lora_rank, pos, r, c.rope_interleave);
  return row;
}

}  // namespace

ReferenceRope reference_rope(const AttentionConfig& c) {
  const int64_t dr = c.qk_rope_head_dim, half = dr / 2;
  const double theta = c.rope_theta;
  ReferenceRope r;
  r.inv_freq.resize(size_t(half));
  for (int64_t i = 0; i < half; ++i) r.inv_freq[size_t(i)] = 1.0 / std::pow(theta, double(2 * i) / double(dr));
  r.softmax_scale = 1.0 / std::sqrt(double(c.qk_nope_head_dim + c.qk_rope_head_dim));
  const RopeScaling& s = c.rope_scaling;
  if (s.type != "yarn") return r;
  // _compute_yarn_parameters (truncate = true).
  const double f = s.factor, L0 = double(s.original_max_position_embeddings);
  auto corr = [&](double rotations) { return double(dr) * std::log(L0 / (rotations * 2 * kPi)) / (2 * std::log(theta)); };
  const double low = std::max(std::floor(corr(s.beta_fast)), 0.0);
  double high = std::min(std::ceil(corr(s.beta_slow)), double(dr - 1));
  if (low == high) high += 0.001;
  for (int64_t i = 0; i < half; ++i) {
    const double ramp = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
    const double inv = r.inv_freq[size_t(i)];
    r.inv_freq[size_t(i)] = inv / f * ramp + inv * (1 - ramp);
  }
  r.cos_sin_factor = (s.mscale != 0 && s.mscale_all_dim != 0)
                         ? yarn_mscale(f, s.mscale) / yarn_mscale(f, s.mscale_all_dim)
                         : yarn_mscale(f, 1.0);
  if (s.mscale_all_dim != 0) {
    const double m = yarn_mscale(f, s.mscale_all_dim);
    r.softmax_scale *= m * m;
  }
  return r;
}

double reference_round(double v, DType dtype) {
  switch (dtype) {
    case DType::F64: return v;
    case DType::F32: return double(float(v));
    case DType::BF16: return round_format(v, 7, -126, 3.3895313892515355e38, false);
    case DType::F8_E4M3FN: return round_format(v, 3, -6, 448.0, true);
    case DType::F8_E4M3FNUZ: return round_format(v, 3, -7, 240.0, true);
    default: fail("reference: no rounding for cache dtype {}", dtype_name(dtype));
  }
}

std::vector<double> reference_fp8_per_tensor(const std::vector<double>& w) {
  double amax = 0;
  for (double v : w) amax = std::max(amax, std::fabs(v));
  const double scale = amax > 0 ? std::max(double(float(amax / 448.0)), std::ldexp(1.0, -126)) : 1.0;
  std::vector<double> q(w.size());
  for (size_t i = 0; i < w.size(); ++i) q[i] = reference_round(double(float(w[i] / scale)), DType::F8_E4M3FN) * scale;
  return q;
}

std::vector<double> reference_mxfp4(const std::vector<double>& w, int64_t K) {
  if (K <= 0 || K % 32 != 0 || w.size() % size_t(K) != 0) fail("reference_mxfp4: rows of {} values, not blocks of 32", K);
  std::vector<double> q(w.size());
  for (size_t b = 0; b < w.size(); b += 32) {
    double amax = 0;
    for (size_t i = b; i < b + 32; ++i) amax = std::max(amax, std::fabs(w[i]));
    if (amax == 0) continue;  // an all-zero block stays zero
    int e2;
    const double m = std::frexp(amax, &e2);  // amax = m · 2^e2, m in [0.5, 1)
    int x = (2 * m >= 1.75 ? e2 : e2 - 1) - 2;
    x = std::clamp(x, -127, 125);
    const double scale = std::ldexp(1.0, x);
    for (size_t i = b; i < b + 32; ++i) q[i] = round_format(w[i] / scale, 1, 0, 6.0, true) * scale;
  }
  return q;
}

std::vector<double> reference_latent_rows(const AttentionConfig& c, const AttentionWeights& w,
                                          const std::vector<double>& x, int64_t first_position) {
  const Weights64 w64(w);
  const ReferenceRope rope = reference_rope(c);
  const int64_t n = int64_t(x.size()) / c.hidden_size;
  Vec rows;
  for (int64_t t = 0; t < n; ++t) {
    Vec r = latent_row(c, w64, &x[size_t(t * c.hidden_size)], first_position + t, rope);
    rows.insert(rows.end(), r.begin(), r.end());
  }
  return rows;
}

ReferenceResult reference_attention(const AttentionConfig& c, const AttentionWeights& w,
                                    const std::vector<std::vector<double>>& x, const Batch& b,
                                    const CacheRounding& cache) {
  if (x.size() != b.requests.size()) fail("reference: {} inputs for {} requests", x.size(), b.requests.size());
  const Weights64 w64(w);
  const ReferenceRope rope = reference_rope(c);
  const int64_t H = c.num_attention_heads, dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim,
                dv = c.v_head_dim, dqk = dn + dr, L = c.kv_lora_rank, hid = c.hidden_size;
  const double scale = rope.softmax_scale;
  ReferenceResult res;
  for (size_t r = 0; r < b.requests.size(); ++r) {
    const int64_t P = b.requests[r].prefix_len, N = b.requests[r].new_len, S = P + N;
    if (int64_t(x[r].size()) != S * hid) fail("reference: request {} input has {} values, expected {}", r, x[r].size(), S * hid);
    // Keys of every token: k[j] [H, dqk], v[j] [H, dv] from the decompressed latent row.
    std::vector<Vec> K(static_cast<size_t>(S)), V(static_cast<size_t>(S));
    for (int64_t j = 0; j < S; ++j) {
      Vec row = latent_row(c, w64, &x[r][size_t(j * hid)], j, rope);
      Vec cached = row;  // the row as the cache gives it back
      for (double& v : cached) v = reference_round(v / cache.scale, cache.dtype) * cache.scale;
      if (j >= P) res.new_rows.insert(res.new_rows.end(), cached.begin(), cached.end());
      if (j < P || cache.new_rows_from_cache) row = cached;
      Vec kv = matvec(w64.kv_b, H * (dn + dv), L, row.data());  // [H, dn + dv]: per head k_nope then v
      K[size_t(j)].resize(size_t(H * dqk));
      V[size_t(j)].resize(size_t(H * dv));
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t d = 0; d < dn; ++d) K[size_t(j)][size_t(h * dqk + d)] = kv[size_t(h * (dn + dv) + d)];
        for (int64_t d = 0; d < dr; ++d) K[size_t(j)][size_t(h * dqk + dn + d)] = row[size_t(L + d)];
        for (int64_t d = 0; d < dv; ++d) V[size_t(j)][size_t(h * dv + d)] = kv[size_t(h * (dn + dv) + dn + d)];
      }
    }
    for (int64_t i = P; i < S; ++i) {
      const double* xi = &x[r][size_t(i * hid)];
      Vec q;
      if (c.q_lora_rank > 0) {
        Vec qa = matvec(w64.q_a, c.q_lora_rank, hid, xi);
        rmsnorm(qa.data(), c.q_lora_rank, w64.q_a_norm, c.latent_norm_eps);
        q = matvec(w64.q_b, H * dqk, c.q_lora_rank, qa.data());
      } else {
        q = matvec(w64.q, H * dqk, hid, xi);
      }
      Vec o(size_t(H * dv), 0.0);
      for (int64_t h = 0; h < H; ++h) {
        rotate(&q[size_t(h * dqk + dn)], i, rope, c.rope_interleave);
        Vec s(static_cast<size_t>(i + 1));
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j <= i; ++j) {  // causal: token i sees tokens 0..i
          double d = 0;
          for (int64_t e = 0; e < dqk; ++e) d += q[size_t(h * dqk + e)] * K[size_t(j)][size_t(h * dqk + e)];
          s[size_t(j)] = d * scale;
          m = std::max(m, s[size_t(j)]);
        }
        double sum = 0;
        for (double& v : s) sum += (v = std::exp(v - m));
        for (int64_t j = 0; j <= i; ++j)
          for (int64_t e = 0; e < dv; ++e) o[size_t(h * dv + e)] += s[size_t(j)] / sum * V[size_t(j)][size_t(h * dv + e)];
        res.lse.push_back(m + std::log(sum));
      }
      Vec y = matvec(w64.o, hid, H * dv, o.data());
      res.out.insert(res.out.end(), y.begin(), y.end());
    }
  }
  return res;
}

}  // namespace mla
