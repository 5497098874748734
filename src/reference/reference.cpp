// The float64 reference of one MLA attention layer: plain loops, straight from the definition.
// Independent of the methods, the ops and the KV pool on purpose.
#include "mla/reference.h"

#include <cmath>
#include <limits>

#include "mla/error.h"
#include "mla/rope.h"

namespace mla {
namespace {

using Vec = std::vector<double>;

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

void rotate(double* x, int64_t pos, const RopeFrequencies& f) {
  const int64_t half = int64_t(f.inv_freq.size());
  for (int64_t i = 0; i < half; ++i) {
    const double a = double(pos) * f.inv_freq[size_t(i)];
    const double c = std::cos(a) * f.attention_factor, s = std::sin(a) * f.attention_factor;
    double& x0 = f.interleave ? x[2 * i] : x[i];
    double& x1 = f.interleave ? x[2 * i + 1] : x[i + half];
    const double r0 = x0 * c - x1 * s, r1 = x0 * s + x1 * c;
    x0 = r0, x1 = r1;
  }
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

Vec latent_row(const AttentionConfig& c, const Weights64& w, const double* x, int64_t pos,
               const RopeFrequencies& f) {
  Vec row = matvec(w.kv_a, c.kv_row_dim(), c.hidden_size, x);
  rmsnorm(row.data(), c.kv_lora_rank, w.kv_a_norm, c.latent_norm_eps);
  rotate(row.data() + c.kv_lora_rank, pos, f);
  return row;
}

}  // namespace

std::vector<double> reference_latent_rows(const AttentionConfig& c, const AttentionWeights& w,
                                          const std::vector<double>& x, int64_t first_position) {
  const Weights64 w64(w);
  const RopeFrequencies f = rope_frequencies(c);
  const int64_t n = int64_t(x.size()) / c.hidden_size;
  Vec rows;
  for (int64_t t = 0; t < n; ++t) {
    Vec r = latent_row(c, w64, &x[size_t(t * c.hidden_size)], first_position + t, f);
    rows.insert(rows.end(), r.begin(), r.end());
  }
  return rows;
}

ReferenceResult reference_attention(const AttentionConfig& c, const AttentionWeights& w,
                                    const std::vector<std::vector<double>>& x, const Batch& b,
                                    const CacheRounding& cache) {
  if (x.size() != b.requests.size()) fail("reference: {} inputs for {} requests", x.size(), b.requests.size());
  const Weights64 w64(w);
  const RopeFrequencies f = rope_frequencies(c);
  const int64_t H = c.num_attention_heads, dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim,
                dv = c.v_head_dim, dqk = c.qk_head_dim(), L = c.kv_lora_rank,
                hid = c.hidden_size;
  const double scale = c.softmax_scale();
  ReferenceResult res;
  for (size_t r = 0; r < b.requests.size(); ++r) {
    const int64_t P = b.requests[r].prefix_len, N = b.requests[r].new_len, S = P + N;
    if (int64_t(x[r].size()) != S * hid) fail("reference: request {} input has {} values, expected {}", r, x[r].size(), S * hid);
    // Keys of every token: k[j] [H, dqk], v[j] [H, dv] from the decompressed latent row.
    std::vector<Vec> K(static_cast<size_t>(S)), V(static_cast<size_t>(S));
    for (int64_t j = 0; j < S; ++j) {
      Vec row = latent_row(c, w64, &x[r][size_t(j * hid)], j, f);
      if (cache.dtype != DType::F64) {  // the row as the cache gives it back
        std::vector<uint8_t> cell(8);
        for (double& v : row) {
          store_from_double(cell.data(), cache.dtype, 0, v / cache.scale);
          v = load_as_double(cell.data(), cache.dtype, 0) * cache.scale;
        }
      }
      if (j >= P) res.new_rows.insert(res.new_rows.end(), row.begin(), row.end());
      Vec kv = matvec(w64.kv_b, H * (dn + dv), L, row.data());  // [H, dn + dv]
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
      if (c.has_q_lora()) {
        Vec qa = matvec(w64.q_a, c.q_lora_rank, hid, xi);
        rmsnorm(qa.data(), c.q_lora_rank, w64.q_a_norm, c.latent_norm_eps);
        q = matvec(w64.q_b, H * dqk, c.q_lora_rank, qa.data());
      } else {
        q = matvec(w64.q, H * dqk, hid, xi);
      }
      Vec o(size_t(H * dv), 0.0);
      for (int64_t h = 0; h < H; ++h) {
        rotate(&q[size_t(h * dqk + dn)], i, f);
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
