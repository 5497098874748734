// sampling.cu — Ops::sample_rows on the GPU (CUDA and HIP from one source): the rule of
// mla/sampling.h, one block per row, without sorting the vocabulary. Every cut of the rule keeps a
// head of the order (logit descending, ties by the lower id), and so does the draw: each is found
// by a weighted radix select over the logit's order key (digits of 12, 10 and 10 bits, each a
// histogram of counts or of the weights w = exp((logit − best) / temperature) in double), then the
// place among equal logits by id. The sums run in another order than the host's, so a row may
// differ from the CPU's where u (or a top-p cut) lies within rounding of a cumulative boundary.
#include <cstdint>

#include "platform/gpu/gpu_check.h"
#include "platform/gpu/launch.cuh"
#include "platform/gpu/sampling.h"

namespace mla::gpu {
namespace {

constexpr int kThreads = 1024;
constexpr int kGroups = kThreads / 32;  // 32-lane groups (a warp; half a wave64)
constexpr int kBins0 = 4096;            // digit 0: key bits [20, 32)
constexpr int kBins = 1024;             // digits 1 and 2: bits [10, 20), [0, 10)
constexpr uint32_t kLastKey = 0xffffffffu;
constexpr int32_t kLastId = 0x7fffffff;

// The order key: smaller is better (a larger logit); −0 and +0 are one key; NaN is the worst.
__device__ __forceinline__ uint32_t key_of(float l) {
  if (l != l) return kLastKey;
  const uint32_t b = l == 0.f ? 0u : __float_as_uint(l);
  return (b & 0x80000000u) ? b : ~(b | 0x80000000u);
}
__device__ __forceinline__ float logit_of(uint32_t key) {
  return __uint_as_float((key & 0x80000000u) ? key : (~key & 0x7fffffffu));
}
__device__ __forceinline__ unsigned long long packed(uint32_t key, int32_t id) {
  return (static_cast<unsigned long long>(key) << 32) | uint32_t(id);
}

// A head of the order: the elements up to (key, id), inclusive.
struct Lim {
  uint32_t key;
  int32_t id;
};
__device__ __forceinline__ bool in_lim(uint32_t k, int32_t i, Lim L) { return k < L.key || (k == L.key && i <= L.id); }
__device__ __forceinline__ Lim lim_min(Lim a, Lim b) {
  return (b.key < a.key || (b.key == a.key && b.id < a.id)) ? b : a;
}

template <class T>
__device__ __forceinline__ T shfl_xor_t(T v, int o) {
#if defined(MLA_HIP)
  return __shfl_xor(v, o);
#else
  return __shfl_xor_sync(0xffffffffu, v, o);
#endif
}
template <class T>
__device__ __forceinline__ T shfl_up_t(T v, int d) {
#if defined(MLA_HIP)
  return __shfl_up(v, d, 32);
#else
  return __shfl_up_sync(0xffffffffu, v, d, 32);
#endif
}

struct Add {
  template <class T> __device__ T operator()(T a, T b) const { return a + b; }
};
struct Min {
  template <class T> __device__ T operator()(T a, T b) const { return b < a ? b : a; }
};
struct Max {
  template <class T> __device__ T operator()(T a, T b) const { return b > a ? b : a; }
};

// Every thread gets op over the block's values (the same order everywhere).
template <class T, class Op>
__device__ T block_reduce(T v, T* buf, Op op) {
  for (int o = 16; o > 0; o /= 2) v = op(v, shfl_xor_t(v, o));
  if (threadIdx.x % 32 == 0) buf[threadIdx.x / 32] = v;
  __syncthreads();
  T r = buf[0];
  for (int i = 1; i < kGroups; ++i) r = op(r, buf[i]);
  __syncthreads();
  return r;
}

// The sum of the values of the threads before this one; `total` the block's sum.
template <class T>
__device__ T block_exclusive_scan(T v, T* buf, T& total) {
  const int g = threadIdx.x / 32, lane = threadIdx.x % 32;
  T inc = v;
  for (int d = 1; d < 32; d *= 2) {
    const T o = shfl_up_t(inc, d);
    if (lane >= d) inc += o;
  }
  T ex = shfl_up_t(inc, 1);
  if (lane == 0) ex = T(0);
  if (lane == 31) buf[g] = inc;
  __syncthreads();
  T base = T(0), tot = T(0);
  for (int i = 0; i < kGroups; ++i) {
    if (i < g) base += buf[i];
    tot += buf[i];
  }
  __syncthreads();
  total = tot;
  return base + ex;
}

struct Smem {
  double h0[kBins0];  // digit 0 of the current head: counts or weights
  double h[kBins];    // digits 1 and 2
  double dred[kGroups];
  unsigned long long ured[kGroups];
  int ired[kGroups];
  double before;
  int32_t found, last;
};

struct Row {
  const float* x;
  int32_t V;
  double best, t;  // the largest logit, the temperature
};

// The host's weight (mla/sampling.h), NaN as 0.
__device__ __forceinline__ double weight(float l, const Row& r) {
  const double w = exp((double(l) - r.best) / r.t);
  return w == w ? w : 0.0;
}

enum class Mode { CountGE, WeightGE, WeightGT };  // running count ≥, running weight ≥, >

__device__ __forceinline__ bool reached(Mode m, double run, double target) {
  return m == Mode::WeightGT ? run > target : run >= target;
}

// sm.h0 ← digit 0's histogram of head L (counts, or weights); `sum` ← the weights' sum, `key_m` ←
// the worst key of L whose weight is ≥ min_p.
__device__ void hist0(const Row& r, Lim L, bool counts, Smem& sm, double min_p, double* sum, uint32_t* key_m) {
  for (int b = threadIdx.x; b < kBins0; b += kThreads) sm.h0[b] = 0;
  __syncthreads();
  double s = 0;
  unsigned long long km = 0;
  for (int32_t i = threadIdx.x; i < r.V; i += kThreads) {
    const float l = r.x[i];
    const uint32_t k = key_of(l);
    if (!in_lim(k, i, L)) continue;
    const double w = counts ? 1.0 : weight(l, r);
    atomicAdd(&sm.h0[k >> 20], w);
    s += w;
    if (w >= min_p && k > km) km = k;
  }
  __syncthreads();
  if (sum) *sum = block_reduce(s, sm.dred, Add{});
  if (key_m) *key_m = uint32_t(block_reduce(km, sm.ured, Max{}));
}

// The j-th (from 0) element of head L with key K, by id; the last one when there are fewer.
__device__ int32_t nth_of_key(const Row& r, Lim L, uint32_t K, int64_t j, Smem& sm) {
  if (threadIdx.x == 0) sm.found = -1, sm.last = -1;
  __syncthreads();
  int64_t seen = 0;
  for (int32_t base = 0; base < r.V; base += kThreads) {
    const int32_t i = base + int32_t(threadIdx.x);
    const int f = i < r.V && key_of(r.x[i]) == K && in_lim(K, i, L);
    int total = 0;
    const int rank = block_exclusive_scan(f, sm.ired, total);
    if (f && seen + rank == j) sm.found = i;
    if (f && rank == total - 1) sm.last = i;
    seen += total;
    if (seen > j) break;  // the same in every thread
  }
  __syncthreads();
  const int32_t id = sm.found >= 0 ? sm.found : sm.last;
  __syncthreads();
  return id;
}

struct Found {
  uint32_t key;
  int32_t id;
  bool ok;  // false: the running total never reached the target (it lies within rounding of the end)
};

// The first element of head L (in order) at which the running count (CountGE) or weight reaches
// `target`; sm.h0 holds digit 0's histogram of L in the same units.
__device__ Found select(const Row& r, Lim L, Mode m, double target, Smem& sm) {
  uint32_t prefix = 0;
  double before = 0;  // the count or weight of L before the current digit's bins
  for (int level = 0; level < 3; ++level) {
    const int nb = level == 0 ? kBins0 : kBins, shift = level == 0 ? 20 : level == 1 ? 10 : 0;
    double* h = level == 0 ? sm.h0 : sm.h;
    if (level > 0) {
      for (int b = threadIdx.x; b < kBins; b += kThreads) h[b] = 0;
      __syncthreads();
      for (int32_t i = threadIdx.x; i < r.V; i += kThreads) {
        const float l = r.x[i];
        const uint32_t k = key_of(l);
        if ((k >> (shift + 10)) != prefix || !in_lim(k, i, L)) continue;
        atomicAdd(&h[(k >> shift) & (kBins - 1)], m == Mode::CountGE ? 1.0 : weight(l, r));
      }
      __syncthreads();
    }
    const int per = nb / kThreads, b0 = int(threadIdx.x) * per;
    double s = 0;
    for (int j = 0; j < per; ++j) s += h[b0 + j];
    double tot = 0;
    double acc = block_exclusive_scan(s, sm.dred, tot);
    int mine = kLastId;
    double mine_before = 0;
    for (int j = 0; j < per; ++j) {
      const double v = h[b0 + j], prev = acc;
      acc += v;
      if (v > 0 && reached(m, before + acc, target)) {
        mine = b0 + j, mine_before = prev;
        break;
      }
    }
    const int bin = block_reduce(mine, sm.ired, Min{});
    if (bin == kLastId) return {0, 0, false};
    if (int(threadIdx.x) == bin / per) sm.before = mine_before;
    __syncthreads();
    before += sm.before;
    __syncthreads();
    prefix = level == 0 ? uint32_t(bin) : (prefix << 10) | uint32_t(bin);
  }
  // Every element of key `prefix` weighs the same: the place among them by id.
  const double wv = m == Mode::CountGE ? 1.0 : weight(logit_of(prefix), r);
  const double need = (target - before) / wv;
  int64_t j = 0;
  if (wv > 0 && need == need) {
    const double q = m == Mode::WeightGT ? floor(need) : ceil(need) - 1;
    j = q <= 0 ? 0 : q >= 4e9 ? int64_t(4e9) : int64_t(q);
  }
  return {prefix, nth_of_key(r, L, prefix, j, sm), true};
}

__global__ void __launch_bounds__(kThreads) sample_rows_k(const float* x, int64_t V, const double* params, int32_t* out) {
  pdl_enter();
  __shared__ Smem sm;
  const double* p = params + int64_t(blockIdx.x) * kSampleParams;
  const double t = p[0], top_p = p[1], min_p = p[2], u = p[3];
  const int64_t top_k = int64_t(p[4]);
  Row r{x + int64_t(blockIdx.x) * V, int32_t(V), 0.0, t};
  // The best element: greedy_index's choice (the first of the largest; NaN never wins).
  unsigned long long b = ~0ull;
  for (int32_t i = threadIdx.x; i < r.V; i += kThreads) b = Min{}(b, packed(key_of(r.x[i]), i));
  b = block_reduce(b, sm.ured, Min{});
  if (t == 0 || top_k == 1) {
    if (threadIdx.x == 0) out[blockIdx.x] = int32_t(uint32_t(b));
    return;
  }
  r.best = double(logit_of(uint32_t(b >> 32)));
  // Candidates: the top_k best.
  Lim L{kLastKey, kLastId};
  if (top_k > 1 && top_k < V) {
    hist0(r, L, true, sm, 0, nullptr, nullptr);
    const Found f = select(r, L, Mode::CountGE, double(top_k), sm);
    if (f.ok) L = {f.key, f.id};
  }
  double sum = 0;
  uint32_t key_m = kLastKey;
  hist0(r, L, false, sm, min_p, &sum, &key_m);
  // top-p: the shortest head whose weight reaches top_p · sum; min-p: w ≥ min_p (the best's is 1).
  Lim Lf = L;
  if (top_p < 1) {
    const Found f = select(r, L, Mode::WeightGE, top_p * sum, sm);
    if (f.ok) Lf = lim_min(Lf, {f.key, f.id});
  }
  if (min_p > 0) Lf = lim_min(Lf, {key_m, kLastId});
  double total = sum;
  if (Lf.key != L.key || Lf.id != L.id) hist0(r, Lf, false, sm, 0, &total, nullptr);
  // The draw: the first element whose running weight exceeds u · total (the last one of the head
  // when u is within rounding of 1).
  const Found f = select(r, Lf, Mode::WeightGT, u * total, sm);
  int32_t id = f.id;
  if (!f.ok) {
    if (Lf.id != kLastId) {
      id = Lf.id;
    } else {
      unsigned long long last = 0;
      for (int32_t i = threadIdx.x; i < r.V; i += kThreads) {
        const uint32_t k = key_of(r.x[i]);
        if (in_lim(k, i, Lf)) last = Max{}(last, packed(k, i));
      }
      id = int32_t(uint32_t(block_reduce(last, sm.ured, Max{})));
    }
  }
  if (threadIdx.x == 0) out[blockIdx.x] = id;
}

}  // namespace

void sample_rows(const float* x, int64_t R, int64_t V, const double* params, int32_t* out, cudaStream_t s) {
  if (R == 0) return;
  launch(sample_rows_k, unsigned(R), kThreads, 0, s, x, V, params, out);
}

}  // namespace mla::gpu
