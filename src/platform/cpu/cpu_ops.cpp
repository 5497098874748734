// The CPU platform's ops, in two flavours from one template: the float64 reference (storage and
// accumulation in double) and the fast path (f32 or bf16 storage, f32 accumulation). Loops are
// OpenMP-parallel over independent outputs, so every element is computed by one thread in a fixed
// order: results do not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "mla/error.h"
#include "mla/greedy.h"
#include "mla/random.h"
#include "mla/sampling.h"
#include "mla/platform_ops.h"
#include "platform/cpu/convert.h"
#include "platform/registry.h"

namespace mla {
namespace cpu {
namespace {

template <typename A>
constexpr int kLanes = 32 / sizeof(A);  // one 256-bit vector
template <typename A>
struct VecOf;
template <>
struct VecOf<float> {
  typedef float type __attribute__((vector_size(32)));
};
template <>
struct VecOf<double> {
  typedef double type __attribute__((vector_size(32)));
};
template <typename A>
using Vec = typename VecOf<A>::type;

template <typename A>
inline Vec<A> vload(const A* p) {
  Vec<A> v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <typename A>
inline A hsum(Vec<A> v) {
  A s = 0;
  for (int i = 0; i < kLanes<A>; ++i) s += v[i];
  return s;
}

// Σ a[i]·b[i]: four vector accumulators, then a fixed-order tail.
template <typename A>
inline A dot(const A* a, const A* b, int64_t n) {
  constexpr int L = kLanes<A>;
  Vec<A> s0{}, s1{}, s2{}, s3{};
  int64_t i = 0;
  for (; i + 4 * L <= n; i += 4 * L) {
    s0 += vload(a + i) * vload(b + i);
    s1 += vload(a + i + L) * vload(b + i + L);
    s2 += vload(a + i + 2 * L) * vload(b + i + 2 * L);
    s3 += vload(a + i + 3 * L) * vload(b + i + 3 * L);
  }
  for (; i + L <= n; i += L) s0 += vload(a + i) * vload(b + i);
  A s = hsum<A>((s0 + s1) + (s2 + s3));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Four dots sharing `a`: out[r] = Σ a[i]·b_r[i].
template <typename A>
inline void dot4(const A* a, const A* b0, const A* b1, const A* b2, const A* b3, int64_t n,
                 A* out) {
  constexpr int L = kLanes<A>;
  Vec<A> s0{}, s1{}, s2{}, s3{};
  int64_t i = 0;
  for (; i + L <= n; i += L) {
    Vec<A> x = vload(a + i);
    s0 += x * vload(b0 + i);
    s1 += x * vload(b1 + i);
    s2 += x * vload(b2 + i);
    s3 += x * vload(b3 + i);
  }
  A r0 = hsum<A>(s0), r1 = hsum<A>(s1), r2 = hsum<A>(s2), r3 = hsum<A>(s3);
  for (; i < n; ++i) {
    r0 += a[i] * b0[i];
    r1 += a[i] * b1[i];
    r2 += a[i] * b2[i];
    r3 += a[i] * b3[i];
  }
  out[0] = r0, out[1] = r1, out[2] = r2, out[3] = r3;
}

// y[i] += a · x[i]
template <typename A>
inline void axpy(A a, const A* x, A* y, int64_t n) {
  constexpr int L = kLanes<A>;
  int64_t i = 0;
  Vec<A> av = Vec<A>{} + a;
  for (; i + L <= n; i += L) {
    Vec<A> r = vload(y + i) + av * vload(x + i);
    std::memcpy(y + i, &r, sizeof r);
  }
  for (; i < n; ++i) y[i] += a * x[i];
}

int64_t rows_of(const Tensor& t) { return t.dim(-1) == 0 ? 0 : t.numel() / t.dim(-1); }

void expect(bool ok, const char* op, const std::string& what) {
  if (!ok) fail("cpu {}: {}", op, what);
}

// Attention of a block of query rows against one key/value sequence. Query i sees keys
// [0, visible[i]). Q, O, lse are accumulation-type buffers.
template <typename A>
void attend(int64_t nq, const A* Q, int64_t q_stride, const int64_t* visible, const A* K,
            int64_t k_stride, int64_t dqk, const A* V, int64_t v_stride, int64_t dv, A scale,
            A* O, int64_t o_stride, A* lse, std::vector<A>& scores) {
  int64_t nk = 0;
  for (int64_t i = 0; i < nq; ++i) nk = std::max(nk, visible[i]);
  scores.assign(size_t(nq * std::max<int64_t>(nk, 1)), A(0));
  for (int64_t j = 0; j < nk; ++j) {
    const A* kr = K + j * k_stride;
    for (int64_t i = 0; i < nq; ++i)
      if (j < visible[i]) scores[size_t(i * nk + j)] = dot(Q + i * q_stride, kr, dqk) * scale;
  }
  for (int64_t i = 0; i < nq; ++i) {
    A* o = O + i * o_stride;
    std::fill(o, o + dv, A(0));
    if (visible[i] == 0) {
      lse[i] = -std::numeric_limits<A>::infinity();
      continue;
    }
    A* s = scores.data() + i * nk;
    A m = *std::max_element(s, s + visible[i]);
    A sum = 0;
    for (int64_t j = 0; j < visible[i]; ++j) sum += (s[j] = std::exp(s[j] - m));
    lse[i] = m + std::log(sum);
    for (int64_t j = 0; j < visible[i]; ++j) s[j] /= sum;  // p_j
  }
  for (int64_t j = 0; j < nk; ++j) {
    const A* vr = V + j * v_stride;
    for (int64_t i = 0; i < nq; ++i)
      if (j < visible[i]) axpy(scores[size_t(i * nk + j)], vr, O + i * o_stride, dv);
  }
}

template <typename A>
class CpuOps final : public Ops {
 public:
  explicit CpuOps(DType act) : act_(act) {}
  Platform platform() const override { return Platform::CPU; }
  std::string name() const override {
    return act_ == DType::F64 ? "cpu-ref" : fmt::format("cpu-{}", dtype_name(act_));
  }
  DType act_dtype() const override { return act_; }
  DType lse_dtype() const override { return act_ == DType::F64 ? DType::F64 : DType::F32; }

  Tensor empty(DType dtype, Shape shape) override { return Tensor::host(dtype, std::move(shape)); }
  Tensor upload(const Tensor& host) override { return host.clone(); }
  Tensor download(const Tensor& t) override { return t.clone(); }
  void fill(Tensor& t, double value) override {
    const size_t n = size_t(t.numel());
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; ++i) t.set(i, value);
  }
  void fill_random(Tensor& t, uint64_t seed, double std) override {
    const size_t n = size_t(t.numel());
    const float scale = float(std);
    auto each = [&](auto store) {
#pragma omp parallel for schedule(static)
      for (size_t i = 0; i < n; ++i) store(i, hash_normalish(seed, i, scale));
    };
    // bf16 and f32 stores of a float round as store_from_double does (one rounding: exact widening)
    if (t.dtype() == DType::BF16) each([&](size_t i, float v) { t.ptr<bf16>()[i] = float_to_bf16(v); });
    else if (t.dtype() == DType::F32) each([&](size_t i, float v) { t.ptr<float>()[i] = v; });
    else each([&](size_t i, float v) { t.set(i, v); });
  }

  void linear(const Tensor& x, const Tensor& w, Tensor& y) override {
    const int64_t K = x.dim(-1), M = rows_of(x), N = w.dim(0);
    expect(w.rank() == 2 && w.dim(1) == K, "linear",
           fmt::format("weight {} does not match input {}", shape_str(w.shape()), shape_str(x.shape())));
    expect(y.numel() == M * N, "linear",
           fmt::format("output {} is not [{}, {}]", shape_str(y.shape()), M, N));
    std::vector<A> xa(static_cast<size_t>(M * K));
#pragma omp parallel for schedule(static)
    for (int64_t m = 0; m < M; ++m) load_row(x.data(), x.dtype(), size_t(m * K), size_t(K), &xa[size_t(m * K)]);
    constexpr int64_t NB = 4;
    const int64_t nblocks = (N + NB - 1) / NB;
#pragma omp parallel
    {
      std::vector<A> wb(static_cast<size_t>(NB * K)), out(static_cast<size_t>(NB));
      std::vector<A> yrow;
#pragma omp for schedule(dynamic, 4)
      for (int64_t b = 0; b < nblocks; ++b) {
        const int64_t n0 = b * NB, nb = std::min(NB, N - n0);
        for (int64_t r = 0; r < NB; ++r)
          if (r < nb) load_row(w.data(), w.dtype(), size_t((n0 + r) * K), size_t(K), &wb[size_t(r * K)]);
          else std::fill(wb.begin() + r * K, wb.begin() + (r + 1) * K, A(0));
        for (int64_t m = 0; m < M; ++m) {
          dot4(&xa[size_t(m * K)], &wb[0], &wb[size_t(K)], &wb[size_t(2 * K)], &wb[size_t(3 * K)], K,
               out.data());
          store_row(out.data(), size_t(nb), y.data(), y.dtype(), size_t(m * N + n0));
        }
      }
    }
  }

  void rmsnorm(Tensor& x, int64_t n, const Tensor& w, double eps) override {
    const int64_t ld = x.dim(-1), M = rows_of(x);
    expect(n <= ld && w.numel() == n, "rmsnorm", fmt::format("weight {} for {} of {} columns", shape_str(w.shape()), n, ld));
    std::vector<A> wa(static_cast<size_t>(n));
    load_row(w.data(), w.dtype(), 0, size_t(n), wa.data());
#pragma omp parallel
    {
      std::vector<A> r(static_cast<size_t>(n));
#pragma omp for schedule(static)
      for (int64_t m = 0; m < M; ++m) {
        load_row(x.data(), x.dtype(), size_t(m * ld), size_t(n), r.data());
        A ss = 0;
        for (int64_t i = 0; i < n; ++i) ss += r[size_t(i)] * r[size_t(i)];
        const A inv = A(1) / std::sqrt(ss / A(n) + A(eps));
        for (int64_t i = 0; i < n; ++i) r[size_t(i)] = r[size_t(i)] * inv * wa[size_t(i)];
        store_row(r.data(), size_t(n), x.data(), x.dtype(), size_t(m * ld));
      }
    }
  }

  void rope(Tensor& x, int64_t heads, int64_t head_dim, int64_t rot_offset,
            const std::vector<int32_t>& positions, const RopeFrequencies& f) override {
    const int64_t T = x.numel() / (heads * head_dim), rope_dim = int64_t(f.inv_freq.size()) * 2;
    expect(x.numel() == T * heads * head_dim && rot_offset + rope_dim <= head_dim, "rope",
           fmt::format("{} heads of {} with rope at {} do not fit {}", heads, head_dim, rot_offset, shape_str(x.shape())));
    expect(int64_t(positions.size()) == T, "rope", fmt::format("{} positions for {} rows", positions.size(), T));
    switch (x.dtype()) {
      case DType::F64: apply_rope(x.ptr<double>() + rot_offset, T * heads, head_dim, heads, positions.data(), f); break;
      case DType::F32: apply_rope(x.ptr<float>() + rot_offset, T * heads, head_dim, heads, positions.data(), f); break;
      case DType::BF16: apply_rope(x.ptr<bf16>() + rot_offset, T * heads, head_dim, heads, positions.data(), f); break;
      default: fail("cpu rope: unsupported dtype {}", dtype_name(x.dtype()));
    }
  }

  void copy_cols(const Tensor& src, int64_t s0, Tensor& dst, int64_t d0, int64_t n) override {
    const int64_t sld = src.dim(-1), dld = dst.dim(-1), M = rows_of(src);
    expect(s0 >= 0 && d0 >= 0 && n >= 0 && s0 + n <= sld && d0 + n <= dld && rows_of(dst) == M &&
               dst.dtype() == src.dtype(),
           "copy_cols", "shape or dtype mismatch");
    const size_t es = dtype_size(src.dtype());
    for (int64_t m = 0; m < M; ++m)
      std::memcpy(static_cast<char*>(dst.data()) + size_t(m * dld + d0) * es,
                  static_cast<const char*>(src.data()) + size_t(m * sld + s0) * es, size_t(n) * es);
  }

  void cache_write(KVPool& pool, int64_t layer, const std::vector<int32_t>& slots,
                   const Tensor& rows) override {
    const int64_t D = pool.config().row_dim;
    expect(rows.dim(-1) == D && rows_of(rows) == int64_t(slots.size()), "cache_write",
           fmt::format("rows {} for {} slots of width {}", shape_str(rows.shape()), slots.size(), D));
    check_slots(pool, slots, "cache_write");
    Tensor& buf = pool.buffer(layer);
    const double scale = pool.scale(layer);
#pragma omp parallel
    {
      std::vector<A> r(static_cast<size_t>(D));
#pragma omp for schedule(static)
      for (size_t t = 0; t < slots.size(); ++t) {
        load_row(rows.data(), rows.dtype(), t * size_t(D), size_t(D), r.data());
        store_row(r.data(), size_t(D), buf.data(), buf.dtype(), size_t(slots[t]) * size_t(D), scale);
      }
    }
  }

  void cache_read(const KVPool& pool, int64_t layer, const std::vector<int32_t>& slots,
                  Tensor& rows) override {
    const int64_t D = pool.config().row_dim;
    expect(rows.dim(-1) == D && rows_of(rows) == int64_t(slots.size()), "cache_read",
           fmt::format("rows {} for {} slots of width {}", shape_str(rows.shape()), slots.size(), D));
    check_slots(pool, slots, "cache_read");
    const Tensor& buf = pool.buffer(layer);
    const double scale = pool.scale(layer);
#pragma omp parallel
    {
      std::vector<A> r(static_cast<size_t>(D));
#pragma omp for schedule(static)
      for (size_t t = 0; t < slots.size(); ++t) {
        load_row(buf.data(), buf.dtype(), size_t(slots[t]) * size_t(D), size_t(D), r.data(), scale);
        store_row(r.data(), size_t(D), rows.data(), rows.dtype(), t * size_t(D));
      }
    }
  }

  void build_kv(const Tensor& kv, const Tensor& rows, int64_t kv_lora_rank, int64_t H, int64_t dn,
                int64_t dr, int64_t dv, Tensor& k, Tensor& v) override {
    const int64_t S = rows_of(rows), D = rows.dim(-1);
    expect(kv.numel() == S * H * (dn + dv) && k.numel() == S * H * (dn + dr) &&
               v.numel() == S * H * dv && kv_lora_rank + dr <= D,
           "build_kv", "shape mismatch");
    const size_t es = dtype_size(k.dtype());
    expect(kv.dtype() == k.dtype() && v.dtype() == k.dtype(), "build_kv", "dtype mismatch");
    std::vector<A> pe(static_cast<size_t>(dr));
    for (int64_t s = 0; s < S; ++s) {
      load_row(rows.data(), rows.dtype(), size_t(s * D + kv_lora_rank), size_t(dr), pe.data());
      for (int64_t h = 0; h < H; ++h) {
        const char* src = static_cast<const char*>(kv.data()) + size_t((s * H + h) * (dn + dv)) * es;
        char* kd = static_cast<char*>(k.data()) + size_t((s * H + h) * (dn + dr)) * es;
        std::memcpy(kd, src, size_t(dn) * es);
        store_row(pe.data(), size_t(dr), k.data(), k.dtype(), size_t((s * H + h) * (dn + dr) + dn));
        std::memcpy(static_cast<char*>(v.data()) + size_t((s * H + h) * dv) * es, src + size_t(dn) * es,
                    size_t(dv) * es);
      }
    }
  }

  void attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttnSegments& seg,
                 double scale, Tensor& o, Tensor& lse) override {
    expect(q.rank() == 3 && k.rank() == 3 && v.rank() == 3 && o.rank() == 3, "attention", "tensors must be [rows, H, d]");
    const int64_t H = q.dim(1), dqk = q.dim(2), dv = v.dim(2);
    expect(k.dim(1) == H && v.dim(1) == H && k.dim(2) == dqk && o.dim(2) == dv && k.dim(0) == v.dim(0),
           "attention", "head or dim mismatch");
    check_segments(seg, q.dim(0), k.dim(0), "attention");
    constexpr int64_t QB = 32;
    struct Task { int64_t r, h, q0, nq; };
    std::vector<Task> tasks;
    for (int64_t r = 0; r < seg.num_requests(); ++r)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t q0 = 0; q0 < seg.q_len[size_t(r)]; q0 += QB)
          tasks.push_back({r, h, q0, std::min(QB, seg.q_len[size_t(r)] - q0)});
#pragma omp parallel
    {
      std::vector<A> Q, K, V, O, L, scores;
      std::vector<int64_t> vis;
#pragma omp for schedule(dynamic)
      for (size_t ti = 0; ti < tasks.size(); ++ti) {
        const Task& t = tasks[ti];
        const size_t r = size_t(t.r);
        const int64_t klen = seg.k_len[r], qlen = seg.q_len[r];
        vis.resize(size_t(t.nq));
        for (int64_t i = 0; i < t.nq; ++i)
          vis[size_t(i)] = seg.causal ? std::clamp<int64_t>(klen - qlen + t.q0 + i + 1, 0, klen) : klen;
        const int64_t nk = *std::max_element(vis.begin(), vis.end());
        Q.resize(size_t(t.nq * dqk)), K.resize(size_t(nk * dqk)), V.resize(size_t(nk * dv));
        O.resize(size_t(t.nq * dv)), L.resize(size_t(t.nq));
        for (int64_t i = 0; i < t.nq; ++i)
          load_row(q.data(), q.dtype(), size_t(((seg.q_start[r] + t.q0 + i) * H + t.h) * dqk), size_t(dqk), &Q[size_t(i * dqk)]);
        for (int64_t j = 0; j < nk; ++j) {
          load_row(k.data(), k.dtype(), size_t(((seg.k_start[r] + j) * H + t.h) * dqk), size_t(dqk), &K[size_t(j * dqk)]);
          load_row(v.data(), v.dtype(), size_t(((seg.k_start[r] + j) * H + t.h) * dv), size_t(dv), &V[size_t(j * dv)]);
        }
        attend<A>(t.nq, Q.data(), dqk, vis.data(), K.data(), dqk, dqk, V.data(), dv, dv, A(scale),
                  O.data(), dv, L.data(), scores);
        for (int64_t i = 0; i < t.nq; ++i) {
          const int64_t row = (seg.q_start[r] + t.q0 + i) * H + t.h;
          store_row(&O[size_t(i * dv)], size_t(dv), o.data(), o.dtype(), size_t(row * dv));
          store_row(&L[size_t(i)], 1, lse.data(), lse.dtype(), size_t(row));
        }
      }
    }
  }

  void merge(Tensor& o, Tensor& lse, const Tensor& o_b, const Tensor& lse_b) override {
    const int64_t d = o.dim(-1), n = lse.numel();
    expect(o.numel() == n * d && o_b.numel() == n * d && lse_b.numel() == n, "merge", "shape mismatch");
#pragma omp parallel
    {
      std::vector<A> a(static_cast<size_t>(d)), b(static_cast<size_t>(d));
#pragma omp for schedule(static)
      for (int64_t i = 0; i < n; ++i) {
        const A sa = A(lse.at(size_t(i))), sb = A(lse_b.at(size_t(i)));
        const A ninf = -std::numeric_limits<A>::infinity();
        if (sb == ninf) continue;  // an empty part is the identity
        load_row(o_b.data(), o_b.dtype(), size_t(i * d), size_t(d), b.data());
        if (sa == ninf) {
          store_row(b.data(), size_t(d), o.data(), o.dtype(), size_t(i * d));
          lse.set(size_t(i), double(sb));
          continue;
        }
        load_row(o.data(), o.dtype(), size_t(i * d), size_t(d), a.data());
        const A m = std::max(sa, sb), wa = std::exp(sa - m), wb = std::exp(sb - m), ws = wa + wb;
        for (int64_t j = 0; j < d; ++j) a[size_t(j)] = (wa * a[size_t(j)] + wb * b[size_t(j)]) / ws;
        store_row(a.data(), size_t(d), o.data(), o.dtype(), size_t(i * d));
        lse.set(size_t(i), double(m + std::log(ws)));
      }
    }
  }

  void gather_rows(const Tensor& table, const std::vector<int32_t>& ids, Tensor& out) override {
    const int64_t d = table.dim(-1), n = int64_t(ids.size()), V = rows_of(table);
    expect(out.numel() == n * d, "gather_rows", fmt::format("output {} for {} rows of {}", shape_str(out.shape()), n, d));
    for (int32_t i : ids) expect(i >= 0 && i < V, "gather_rows", fmt::format("row {} outside [0, {})", i, V));
#pragma omp parallel
    {
      std::vector<A> r(static_cast<size_t>(d));
#pragma omp for schedule(static)
      for (int64_t i = 0; i < n; ++i) {
        load_row(table.data(), table.dtype(), size_t(ids[size_t(i)]) * size_t(d), size_t(d), r.data());
        store_row(r.data(), size_t(d), out.data(), out.dtype(), size_t(i * d));
      }
    }
  }

  void scatter_add_rows(const Tensor& src, const std::vector<int32_t>& rows,
                        const std::vector<float>& weights, Tensor& out) override {
    const int64_t d = out.dim(-1), n = int64_t(rows.size()), M = rows_of(out);
    expect(src.numel() == n * d && weights.size() == rows.size(), "scatter_add_rows", "shape mismatch");
    std::vector<A> s(static_cast<size_t>(d)), o(static_cast<size_t>(d));
    for (int64_t i = 0; i < n; ++i) {  // sequential: rows may repeat
      expect(rows[size_t(i)] >= 0 && rows[size_t(i)] < M, "scatter_add_rows", "row out of range");
      load_row(src.data(), src.dtype(), size_t(i * d), size_t(d), s.data());
      load_row(out.data(), out.dtype(), size_t(rows[size_t(i)]) * size_t(d), size_t(d), o.data());
      axpy(A(weights[size_t(i)]), s.data(), o.data(), d);
      store_row(o.data(), size_t(d), out.data(), out.dtype(), size_t(rows[size_t(i)]) * size_t(d));
    }
  }

  void add(Tensor& x, const Tensor& y) override {
    expect(x.numel() == y.numel(), "add", fmt::format("{} + {}", shape_str(x.shape()), shape_str(y.shape())));
    const int64_t d = x.dim(-1), M = rows_of(x);
#pragma omp parallel
    {
      std::vector<A> a(static_cast<size_t>(d)), b(static_cast<size_t>(d));
#pragma omp for schedule(static)
      for (int64_t m = 0; m < M; ++m) {
        load_row(x.data(), x.dtype(), size_t(m * d), size_t(d), a.data());
        load_row(y.data(), y.dtype(), size_t(m * d), size_t(d), b.data());
        for (int64_t i = 0; i < d; ++i) a[size_t(i)] += b[size_t(i)];
        store_row(a.data(), size_t(d), x.data(), x.dtype(), size_t(m * d));
      }
    }
  }

  void copy(const Tensor& src, Tensor& dst) override {
    expect(src.numel() == dst.numel(), "copy", "element counts differ");
    if (src.dtype() == dst.dtype()) {
      std::memcpy(dst.data(), src.data(), src.nbytes());
      return;
    }
    const size_t n = size_t(src.numel());
    std::vector<A> buf(n);
    load_row(src.data(), src.dtype(), 0, n, buf.data());
    store_row(buf.data(), n, dst.data(), dst.dtype(), 0);
  }

  void argmax_rows(const Tensor& x, Tensor& out) override {
    const int64_t V = x.dim(-1), R = rows_of(x);
    expect(x.dtype() == DType::F32 && out.dtype() == DType::I32 && out.numel() == R, "argmax_rows",
           "x must be f32 [R, V] and out i32 [R]");
    for (int64_t r = 0; r < R; ++r) out.ptr<int32_t>()[r] = int32_t(greedy_index(x.ptr<float>() + r * V, V));
  }

  void sample_rows(const Tensor& x, const std::vector<SampleRow>& rows, Tensor& out) override {
    const int64_t V = x.dim(-1), R = rows_of(x);
    expect(x.dtype() == DType::F32 && out.dtype() == DType::I32 && out.numel() == R && int64_t(rows.size()) == R &&
               (R == 0 || V > 0),
           "sample_rows", "x must be f32 [R, V] with V > 0, rows R entries and out i32 [R]");
    for (const SampleRow& p : rows) check_sample_row(p);
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t r = 0; r < R; ++r) out.ptr<int32_t>()[r] = sample_index(x.ptr<float>() + r * V, V, rows[size_t(r)]);
  }

  void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) override {
    expect(gate.numel() == up.numel() && out.numel() == gate.numel(), "silu_mul", "shape mismatch");
    const int64_t d = gate.dim(-1), M = rows_of(gate);
#pragma omp parallel
    {
      std::vector<A> g(static_cast<size_t>(d)), u(static_cast<size_t>(d));
#pragma omp for schedule(static)
      for (int64_t m = 0; m < M; ++m) {
        load_row(gate.data(), gate.dtype(), size_t(m * d), size_t(d), g.data());
        load_row(up.data(), up.dtype(), size_t(m * d), size_t(d), u.data());
        for (int64_t i = 0; i < d; ++i) {
          const A x = g[size_t(i)];
          g[size_t(i)] = x / (A(1) + std::exp(-x)) * u[size_t(i)];
        }
        store_row(g.data(), size_t(d), out.data(), out.dtype(), size_t(m * d));
      }
    }
  }

  void moe_route(const Tensor& router_logits, const Tensor& bias, const MoeRouting& r, Tensor& expert,
                 Tensor& weight) override {
    r.validate();
    const int64_t E = r.n_routed_experts, K = r.num_experts_per_tok, T = rows_of(router_logits);
    expect(router_logits.dtype() == DType::F32 && router_logits.dim(-1) == E, "moe_route",
           fmt::format("router logits {} {} are not [T, {}] f32", dtype_name(router_logits.dtype()),
                       shape_str(router_logits.shape()), E));
    expect(!bias.defined() || (bias.dtype() == DType::F32 && bias.numel() == E), "moe_route",
           fmt::format("bias is not [{}] f32", E));
    expect(expert.dtype() == DType::I32 && expert.numel() == T * K && weight.dtype() == DType::F32 &&
               weight.numel() == T * K,
           "moe_route", fmt::format("expert / weight are not [{}, {}] i32 / f32", T, K));
    const float* l = router_logits.ptr<float>();
    std::vector<float> b;
    if (bias.defined()) b.assign(bias.ptr<float>(), bias.ptr<float>() + E);
    const Routing c = route_tokens(r, std::vector<float>(l, l + T * E), b, T);
    std::copy(c.expert.begin(), c.expert.end(), expert.ptr<int32_t>());
    std::copy(c.weight.begin(), c.weight.end(), weight.ptr<float>());
  }

  // Per expert, the rows routed to it go through the same arithmetic as linear (dot4 over blocks
  // of four weight rows) and silu_mul, each product rounded to the activation dtype as those ops
  // store it; then every token sums its K outputs in k order. A row's result depends on its own
  // input only, whatever else the batch holds.
  void moe_experts(const Tensor& x, const Tensor& expert, const Tensor& weight, const Tensor& gate,
                   const Tensor& up, const Tensor& down, Tensor& out) override {
    const int64_t T = rows_of(x), Hd = x.dim(-1);
    expect(gate.rank() == 3 && up.shape() == gate.shape() && gate.dim(2) == Hd && down.rank() == 3 &&
               down.dim(0) == gate.dim(0) && down.dim(1) == Hd && down.dim(2) == gate.dim(1),
           "moe_experts",
           fmt::format("experts gate {} up {} down {} do not fit hidden {}", shape_str(gate.shape()),
                       shape_str(up.shape()), shape_str(down.shape()), Hd));
    const int64_t E = gate.dim(0), I = gate.dim(1), K = T == 0 ? expert.dim(-1) : expert.numel() / T;
    expect(expert.dtype() == DType::I32 && weight.dtype() == DType::F32 && expert.numel() == T * K &&
               weight.numel() == T * K && out.numel() == T * Hd,
           "moe_experts", fmt::format("expert {} / weight {} / out {} for {} tokens", shape_str(expert.shape()),
                                      shape_str(weight.shape()), shape_str(out.shape()), T));
    const int32_t* ex = expert.ptr<int32_t>();
    std::vector<std::vector<int64_t>> slots(static_cast<size_t>(E));  // (t·K + k) per expert
    for (int64_t i = 0; i < T * K; ++i) {
      expect(ex[i] >= 0 && ex[i] < E, "moe_experts", fmt::format("expert id {} outside [0, {})", ex[i], E));
      slots[size_t(ex[i])].push_back(i);
    }
    const DType act = out.dtype();
    std::vector<A> xa(static_cast<size_t>(T * Hd)), h(static_cast<size_t>(T * K * I)), y(static_cast<size_t>(T * K * Hd));
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; ++t) load_row(x.data(), x.dtype(), size_t(t * Hd), size_t(Hd), &xa[size_t(t * Hd)]);
    constexpr int64_t NB = 4;
    // One task: four output columns of one expert, for every row routed to it.
    auto run = [&](int64_t N, int64_t Kd, auto&& body) {
      const int64_t nblocks = (N + NB - 1) / NB;
#pragma omp parallel for schedule(dynamic, 4)
      for (int64_t task = 0; task < E * nblocks; ++task) {
        const int64_t e = task / nblocks, n0 = task % nblocks * NB;
        if (!slots[size_t(e)].empty()) body(e, n0, std::min(NB, N - n0), Kd);
      }
    };
    auto load_block = [](const Tensor& w, int64_t e, int64_t n0, int64_t nb, int64_t N, int64_t Kd, std::vector<A>& b) {
      b.resize(size_t(NB * Kd));
      for (int64_t r = 0; r < NB; ++r)
        if (r < nb) load_row(w.data(), w.dtype(), size_t((e * N + n0 + r) * Kd), size_t(Kd), &b[size_t(r * Kd)]);
        else std::fill(b.begin() + r * Kd, b.begin() + (r + 1) * Kd, A(0));
    };
    auto rounded = [act](A* v, int64_t n) {  // as a store in the activation dtype and a load back
      if (act == DType::BF16)
        for (int64_t i = 0; i < n; ++i) v[i] = A(bf16_to_float(float_to_bf16(float(v[i]))));
    };
    run(I, Hd, [&](int64_t e, int64_t n0, int64_t nb, int64_t Kd) {
      thread_local std::vector<A> wg, wu;
      load_block(gate, e, n0, nb, I, Kd, wg);
      load_block(up, e, n0, nb, I, Kd, wu);
      for (int64_t i : slots[size_t(e)]) {
        const A* xr = &xa[size_t(i / K * Hd)];
        A g[NB], u[NB];
        dot4(xr, &wg[0], &wg[size_t(Kd)], &wg[size_t(2 * Kd)], &wg[size_t(3 * Kd)], Kd, g);
        dot4(xr, &wu[0], &wu[size_t(Kd)], &wu[size_t(2 * Kd)], &wu[size_t(3 * Kd)], Kd, u);
        rounded(g, NB), rounded(u, NB);
        for (int64_t r = 0; r < NB; ++r) g[r] = g[r] / (A(1) + std::exp(-g[r])) * u[r];
        rounded(g, NB);
        std::copy(g, g + nb, &h[size_t(i * I + n0)]);
      }
    });
    run(Hd, I, [&](int64_t e, int64_t n0, int64_t nb, int64_t Kd) {
      thread_local std::vector<A> wd;
      load_block(down, e, n0, nb, Hd, Kd, wd);
      for (int64_t i : slots[size_t(e)]) {
        A o[NB];
        dot4(&h[size_t(i * I)], &wd[0], &wd[size_t(Kd)], &wd[size_t(2 * Kd)], &wd[size_t(3 * Kd)], Kd, o);
        rounded(o, NB);
        std::copy(o, o + nb, &y[size_t(i * Hd + n0)]);
      }
    });
    const float* w = weight.ptr<float>();
#pragma omp parallel
    {
      std::vector<A> acc(static_cast<size_t>(Hd));
#pragma omp for schedule(static)
      for (int64_t t = 0; t < T; ++t) {
        std::fill(acc.begin(), acc.end(), A(0));
        for (int64_t k = 0; k < K; ++k) axpy(A(w[t * K + k]), &y[size_t((t * K + k) * Hd)], acc.data(), Hd);
        store_row(acc.data(), size_t(Hd), out.data(), out.dtype(), size_t(t * Hd));
      }
    }
  }

  // No launches here: either prepare costs the same, and this one is the path a CUDA decode takes,
  // so the CPU's tests run it.
  bool absorb_q_rope_fused(int64_t, const Tensor&, int64_t, const RopeFrequencies&) const override { return true; }
  void absorb_q(const Tensor& q, const Tensor& w_kc, int64_t dn, int64_t dr, Tensor& q_mla) override {
    const int64_t H = w_kc.dim(0), L = w_kc.dim(2), T = q.numel() / (H * (dn + dr));
    expect(w_kc.dim(1) == dn && q.numel() == T * H * (dn + dr) && q_mla.numel() == T * H * (L + dr),
           "absorb_q", "shape mismatch");
#pragma omp parallel
    {
      std::vector<A> w(static_cast<size_t>(dn * L)), qa(static_cast<size_t>(dn + dr)), out(static_cast<size_t>(L + dr));
#pragma omp for schedule(dynamic)
      for (int64_t h = 0; h < H; ++h) {
        load_row(w_kc.data(), w_kc.dtype(), size_t(h * dn * L), size_t(dn * L), w.data());
        for (int64_t t = 0; t < T; ++t) {
          load_row(q.data(), q.dtype(), size_t((t * H + h) * (dn + dr)), size_t(dn + dr), qa.data());
          std::fill(out.begin(), out.begin() + L, A(0));
          for (int64_t d = 0; d < dn; ++d) axpy(qa[size_t(d)], &w[size_t(d * L)], out.data(), L);
          std::copy(qa.begin() + dn, qa.end(), out.begin() + L);
          store_row(out.data(), size_t(L + dr), q_mla.data(), q_mla.dtype(), size_t((t * H + h) * (L + dr)));
        }
      }
    }
  }

  void absorb_o(const Tensor& o_lat, const Tensor& w_vc, Tensor& o) override {
    const int64_t H = w_vc.dim(0), dv = w_vc.dim(1), L = w_vc.dim(2), T = o_lat.numel() / (H * L);
    expect(o_lat.numel() == T * H * L && o.numel() == T * H * dv, "absorb_o", "shape mismatch");
#pragma omp parallel
    {
      std::vector<A> w(static_cast<size_t>(dv * L)), x(static_cast<size_t>(L)), out(static_cast<size_t>(dv));
#pragma omp for schedule(dynamic)
      for (int64_t h = 0; h < H; ++h) {
        load_row(w_vc.data(), w_vc.dtype(), size_t(h * dv * L), size_t(dv * L), w.data());
        for (int64_t t = 0; t < T; ++t) {
          load_row(o_lat.data(), o_lat.dtype(), size_t((t * H + h) * L), size_t(L), x.data());
          for (int64_t e = 0; e < dv; ++e) out[size_t(e)] = dot(x.data(), &w[size_t(e * L)], L);
          store_row(out.data(), size_t(dv), o.data(), o.dtype(), size_t((t * H + h) * dv));
        }
      }
    }
  }

  void mla_attention(const Tensor& q, const KVPool& pool, int64_t layer,
                     const std::vector<int32_t>& kv_slots, const AttnSegments& seg,
                     int64_t kv_lora_rank, double scale, Tensor& o, Tensor& lse) override {
    const int64_t D = pool.config().row_dim, H = q.dim(1), L = kv_lora_rank;
    expect(q.rank() == 3 && q.dim(2) == D && o.dim(2) == L && o.dim(1) == H, "mla_attention",
           fmt::format("q {} / o {} do not match rows of {}", shape_str(q.shape()), shape_str(o.shape()), D));
    check_segments(seg, q.dim(0), int64_t(kv_slots.size()), "mla_attention");
    check_slots(pool, kv_slots, "mla_attention");
    const Tensor& buf = pool.buffer(layer);
    const double kscale = pool.scale(layer);
    // A task is a block of query tokens of one request, all heads: they share the latent rows.
    const int64_t TB = std::max<int64_t>(1, 64 / H);
    struct Task { int64_t r, t0, nt; };
    std::vector<Task> tasks;
    for (int64_t r = 0; r < seg.num_requests(); ++r)
      for (int64_t t0 = 0; t0 < seg.q_len[size_t(r)]; t0 += TB)
        tasks.push_back({r, t0, std::min(TB, seg.q_len[size_t(r)] - t0)});
#pragma omp parallel
    {
      std::vector<A> Q, K, O, Lse, scores;
      std::vector<int64_t> vis;
#pragma omp for schedule(dynamic)
      for (size_t ti = 0; ti < tasks.size(); ++ti) {
        const Task& t = tasks[ti];
        const size_t r = size_t(t.r);
        const int64_t klen = seg.k_len[r], qlen = seg.q_len[r], nq = t.nt * H;
        vis.resize(size_t(nq));
        for (int64_t i = 0; i < t.nt; ++i)
          for (int64_t h = 0; h < H; ++h)
            vis[size_t(i * H + h)] = seg.causal ? std::clamp<int64_t>(klen - qlen + t.t0 + i + 1, 0, klen) : klen;
        const int64_t nk = *std::max_element(vis.begin(), vis.end());
        Q.resize(size_t(nq * D)), K.resize(size_t(nk * D)), O.resize(size_t(nq * L)), Lse.resize(size_t(nq));
        load_row(q.data(), q.dtype(), size_t((seg.q_start[r] + t.t0) * H * D), size_t(nq * D), Q.data());
        for (int64_t j = 0; j < nk; ++j)
          load_row(buf.data(), buf.dtype(), size_t(kv_slots[size_t(seg.k_start[r] + j)]) * size_t(D), size_t(D),
                   &K[size_t(j * D)], kscale);
        attend<A>(nq, Q.data(), D, vis.data(), K.data(), D, D, K.data(), D, L, A(scale), O.data(), L,
                  Lse.data(), scores);
        const size_t row0 = size_t((seg.q_start[r] + t.t0) * H);
        store_row(O.data(), size_t(nq * L), o.data(), o.dtype(), row0 * size_t(L));
        store_row(Lse.data(), size_t(nq), lse.data(), lse.dtype(), row0);
      }
    }
  }

 private:
  DType act_;

  static void check_slots(const KVPool& pool, const std::vector<int32_t>& slots, const char* op) {
    for (int32_t s : slots)
      if (s < 0 || s >= pool.num_slots()) fail("cpu {}: slot {} is outside the pool of {} slots", op, s, pool.num_slots());
  }
  static void check_segments(const AttnSegments& seg, int64_t nq, int64_t nk, const char* op) {
    const size_t n = seg.q_len.size();
    if (seg.q_start.size() != n || seg.k_start.size() != n || seg.k_len.size() != n)
      fail("cpu {}: segment arrays differ in length", op);
    for (size_t r = 0; r < n; ++r)
      if (seg.q_start[r] < 0 || seg.q_len[r] < 0 || seg.q_start[r] + seg.q_len[r] > nq ||
          seg.k_start[r] < 0 || seg.k_len[r] < 0 || seg.k_start[r] + seg.k_len[r] > nk)
        fail("cpu {}: segment {} is outside {} queries / {} keys", op, r, nq, nk);
  }
};

}  // namespace

std::unique_ptr<Ops> make_cpu_ops(DType act) {
  switch (act) {
    case DType::F64: return std::make_unique<CpuOps<double>>(act);
    case DType::F32:
    case DType::BF16: return std::make_unique<CpuOps<float>>(act);
    default: fail("cpu ops: no flavour stores activations as {} (f64, f32, bf16)", dtype_name(act));
  }
}

PlatformEntry platform_entry() {
  return {Platform::CPU, [] { return 1; },
          [](DType act, const PlatformOptions&) { return make_cpu_ops(act); },
          [](std::vector<MethodImpl>& r) { methods::add_shared_methods(r, Platform::CPU); }};
}

}  // namespace cpu

}  // namespace mla
