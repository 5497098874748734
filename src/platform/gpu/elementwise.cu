// The small GPU kernels (CUDA and HIP from this one source): memory-bound, one thread per element (or a block per row for norms),
// float math, element types chosen at run time.
#include <cmath>
#include <initializer_list>

#include "platform/gpu/gpu_check.h"
#include "platform/gpu/launch.cuh"
#include "mla/random.h"
#include "platform/gpu/elem.cuh"
#include "platform/gpu/elementwise.h"
#include "platform/gpu/norm.cuh"
#include "platform/gpu/rope.cuh"
#include "platform/gpu/softmax_state.cuh"

namespace mla::gpu {
namespace {

constexpr int kThreads = 256;

__global__ void fill_k(void* p, Elem e, size_t n, float v) {
  pdl_enter();
  size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) store_elem(p, e, i, v);
}

__global__ void fill_random_k(void* p, Elem e, size_t n, uint64_t seed, float scale) {
  pdl_enter();
  size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) store_elem(p, e, i, hash_normalish(seed, i, scale));
}

__global__ void convert_k(const void* src, Elem se, void* dst, Elem de, size_t n) {
  pdl_enter();
  size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) store_elem(dst, de, i, load_elem(src, se, i));
}

__global__ void rmsnorm_k(void* x, Elem e, int64_t ld, int64_t n, const void* w, Elem we, float eps) {
  pdl_enter();
  rmsnorm_row(x, e, size_t(blockIdx.x) * size_t(ld), n, w, we, eps);
}

__global__ void add_rmsnorm_k(void* h, Elem e, const void* y, Elem ye, void* x, int64_t n, const void* w, Elem we,
                              float eps) {
  pdl_enter();
  const size_t row = size_t(blockIdx.x) * size_t(n);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {  // the stride rmsnorm_row reads with: no sync
    store_elem(h, e, row + i, load_elem(h, e, row + i) + load_elem(y, ye, row + i));
    store_elem(x, e, row + i, load_elem(h, e, row + i));
  }
  rmsnorm_row(x, e, row, n, w, we, eps);
}

__global__ void rope_k(void* x, Elem e, int64_t T, int64_t heads, int64_t head_dim, int64_t off,
                       const int32_t* pos, const double* inv_freq, int64_t half, double af,
                       bool interleave) {
  pdl_enter();
  const size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x;  // one (token, pair): its angle once
  if (idx >= size_t(T * half)) return;
  const int64_t i = int64_t(idx % half), t = int64_t(idx / half);
  float c, s;
  rope_cos_sin(pos[t], inv_freq[i], af, c, s);
  for (int64_t h = 0; h < heads; ++h) {
    const size_t base = size_t(t * heads + h) * head_dim + off;
    const size_t i0 = base + rope_first(i, half, interleave), i1 = base + rope_second(i, half, interleave);
    float y0, y1;
    rope_rotate(load_elem(x, e, i0), load_elem(x, e, i1), c, s, y0, y1);
    store_elem(x, e, i0, y0);
    store_elem(x, e, i1, y1);
  }
}

__global__ void copy_cols_k(const void* src, Elem se, int64_t sld, int64_t s0, void* dst, Elem de,
                            int64_t dld, int64_t d0, int64_t M, int64_t n) {
  pdl_enter();
  const size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= size_t(M * n)) return;
  const int64_t m = int64_t(idx / n), c = int64_t(idx % n);
  store_elem(dst, de, size_t(m * dld + d0 + c), load_elem(src, se, size_t(m * sld + s0 + c)));
}

// Rows of 16-byte chunks, row m's chunks [0, n) from src + m·sld to dst + m·dld (the copy paths of
// copy_cols and cache_read: the same element type, no scale). slots: the source row of output row m
// (null: m itself).
__global__ void copy_rows16_k(const uint4* src, const int32_t* slots, int64_t sld, uint4* dst, int64_t dld,
                              int64_t M, int n) {
  pdl_enter();
  const size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= size_t(M) * size_t(n)) return;
  const int64_t m = int64_t(idx / size_t(n));
  const int c = int(idx % size_t(n));
  dst[m * dld + c] = src[(slots ? int64_t(slots[m]) : m) * sld + c];
}

__global__ void build_kv_k(const void* kv, const void* rows, Elem re, int64_t row_dim, Elem e,
                           int64_t S, int64_t H, int64_t L, int64_t dn, int64_t dr, int64_t dv,
                           void* k, void* v) {
  pdl_enter();
  const int64_t w = dn + dr + dv;  // outputs per (s, h)
  const size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= size_t(S * H * w)) return;
  const int64_t sh = int64_t(idx / w), c = int64_t(idx % w), s = sh / H;
  if (c < dn) store_elem(k, e, size_t(sh * (dn + dr) + c), load_elem(kv, e, size_t(sh * (dn + dv) + c)));
  else if (c < dn + dr) store_elem(k, e, size_t(sh * (dn + dr) + c), load_elem(rows, re, size_t(s * row_dim + L + c - dn)));
  else store_elem(v, e, size_t(sh * dv + c - dn - dr), load_elem(kv, e, size_t(sh * (dn + dv) + dn + c - dn - dr)));
}

__global__ void gather_rows_k(const void* table, Elem te, const int32_t* ids, int64_t n, int64_t d,
                              void* out, Elem oe) {
  pdl_enter();
  const size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= size_t(n * d)) return;
  const int64_t i = int64_t(idx / d), c = int64_t(idx % d);
  store_elem(out, oe, idx, load_elem(table, te, size_t(ids[i]) * size_t(d) + size_t(c)));
}

// One thread per column; entries in order, so repeated rows add deterministically.
__global__ void scatter_add_rows_k(const void* src, Elem se, const int32_t* rows, const float* w,
                                   int64_t n, int64_t d, void* out, Elem oe) {
  pdl_enter();
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= d) return;
  for (int64_t i = 0; i < n; ++i) {
    const size_t o = size_t(rows[i]) * size_t(d) + size_t(c);
    store_elem(out, oe, o, load_elem(out, oe, o) + w[i] * load_elem(src, se, size_t(i * d + c)));
  }
}

__global__ void add_k(void* x, Elem xe, const void* y, Elem ye, size_t n) {
  pdl_enter();
  size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) store_elem(x, xe, i, load_elem(x, xe, i) + load_elem(y, ye, i));
}

__global__ void silu_mul_k(const void* g, const void* u, Elem e, void* out, size_t n) {
  pdl_enter();
  size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float x = load_elem(g, e, i);
  store_elem(out, e, i, silu_times(x, load_elem(u, e, i)));
}

// ---- bf16 fast paths: 8 values (16 bytes) a load; the same per-element math as above ---------
// Rows of n bf16 values (the chunks a block's threads hold: n ≤ kNormChunks · 8 · kNormThreads).
__global__ void rmsnorm_bf16x8_k(uint16_t* x, int64_t ld, int64_t n, const void* w, Elem we, float eps) {
  pdl_enter();
  rmsnorm_row_as_launched(x, Elem::BF16, size_t(blockIdx.x) * size_t(ld), n, w, we, eps, true);
}

// x: bf16 rows of n (16-byte aligned); h (bf16) and y as vectors when h_vec / y_vec, else element
// by element.
__global__ void add_rmsnorm_bf16x8_k(void* h, bool h_vec, const void* y, Elem ye, bool y_vec, uint4* x, int64_t n,
                                     const void* w, Elem we, float eps) {
  pdl_enter();
  const int64_t chunks = n / 8;
  const size_t row = size_t(blockIdx.x) * size_t(chunks);
  float v[kNormChunks][8];
#pragma unroll
  for (int c = 0; c < kNormChunks; ++c) {
    const int64_t k = threadIdx.x + c * int64_t(blockDim.x);
    if (k >= chunks) continue;
    const size_t at = (row + k) * 8;
    float a[8], b[8];
    if (h_vec) unpack_bf16x8(static_cast<const uint4*>(h)[row + k], a);
    else
      for (int j = 0; j < 8; ++j) a[j] = load_elem(h, Elem::BF16, at + j);
    if (y_vec) unpack_bf16x8(static_cast<const uint4*>(y)[row + k], b);
    else
      for (int j = 0; j < 8; ++j) b[j] = load_elem(y, ye, at + j);
#pragma unroll
    for (int j = 0; j < 8; ++j) a[j] += b[j];
    const uint4 hv = pack_bf16x8(a);
    if (h_vec) static_cast<uint4*>(h)[row + k] = hv;
    unpack_bf16x8(hv, v[c]);  // x = h as stored
    if (!h_vec)
      for (int j = 0; j < 8; ++j) store_elem(h, Elem::BF16, at + j, v[c][j]);
  }
  rmsnorm_chunks_bf16(x + row, v, chunks, n, w, we, eps);
}

// build_kv in chunks of 8 (every width a multiple of 8): pure copies.
__global__ void build_kv_bf16x8_k(const uint4* kv, const uint4* rows, int64_t row8, int64_t S, int64_t H, int64_t L8,
                                  int64_t dn8, int64_t dr8, int64_t dv8, uint4* k, uint4* v) {
  pdl_enter();
  const int64_t w = dn8 + dr8 + dv8;
  const size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= size_t(S * H * w)) return;
  const int64_t sh = int64_t(idx / w), c = int64_t(idx % w), s = sh / H;
  if (c < dn8) k[sh * (dn8 + dr8) + c] = kv[sh * (dn8 + dv8) + c];
  else if (c < dn8 + dr8) k[sh * (dn8 + dr8) + c] = rows[s * row8 + L8 + c - dn8];
  else v[sh * dv8 + c - dn8 - dr8] = kv[sh * (dn8 + dv8) + c - dr8];
}

// out = a + b (kSilu false) or silu(a) · b (true), 8 bf16 values a thread.
template <bool kSilu>
__global__ void binary_bf16x8_k(const uint4* x, const uint4* y, uint4* out, size_t n8) {
  pdl_enter();
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n8) return;
  float a[8], b[8];
  unpack_bf16x8(x[i], a);
  unpack_bf16x8(y[i], b);
#pragma unroll
  for (int j = 0; j < 8; ++j) a[j] = kSilu ? silu_times(a[j], b[j]) : a[j] + b[j];
  out[i] = pack_bf16x8(a);
}

// (v, i) beats (w, j): larger, or equal and earlier; NaN loses to any number.
__device__ __forceinline__ bool beats(float v, int32_t i, float w, int32_t j) {
  if (isnan(w)) return !isnan(v) || i < j;
  if (isnan(v)) return false;
  return v > w || (v == w && i < j);
}

// One block per row: strided scans (16-byte loads, four in flight a thread, when the rows are
// aligned), then a tree over the block in shared memory. `beats` is a total order, so the scan's
// order does not change the winner.
constexpr int kArgmaxThreads = 1024;
__global__ void __launch_bounds__(kArgmaxThreads) argmax_rows_k(const float* x, int64_t V, bool vec, int32_t* out) {
  pdl_enter();
  const float* row = x + int64_t(blockIdx.x) * V;
  float best = NAN;
  int32_t at = 0x7fffffff;
  auto see = [&](float v, int64_t i) {
    if (beats(v, int32_t(i), best, at)) best = v, at = int32_t(i);
  };
  auto see4 = [&](const float4& v, int64_t i4) {
    see(v.x, 4 * i4), see(v.y, 4 * i4 + 1), see(v.z, 4 * i4 + 2), see(v.w, 4 * i4 + 3);
  };
  int64_t tail = 0;
  if (vec) {
    const float4* r4 = reinterpret_cast<const float4*>(row);
    const int64_t n4 = V / 4;
    int64_t i = threadIdx.x;
    for (; i + 3 * kArgmaxThreads < n4; i += 4 * kArgmaxThreads) {
      float4 a[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) a[u] = r4[i + u * kArgmaxThreads];
#pragma unroll
      for (int u = 0; u < 4; ++u) see4(a[u], i + u * kArgmaxThreads);
    }
    for (; i < n4; i += kArgmaxThreads) see4(r4[i], i);
    tail = 4 * n4;
  }
  for (int64_t i = tail + threadIdx.x; i < V; i += kArgmaxThreads) see(row[i], i);
  __shared__ float sv[kArgmaxThreads];
  __shared__ int32_t si[kArgmaxThreads];
  sv[threadIdx.x] = best, si[threadIdx.x] = at;
  __syncthreads();
  for (int w = kArgmaxThreads / 2; w > 0; w /= 2) {
    if (int(threadIdx.x) < w && beats(sv[threadIdx.x + w], si[threadIdx.x + w], sv[threadIdx.x], si[threadIdx.x]))
      sv[threadIdx.x] = sv[threadIdx.x + w], si[threadIdx.x] = si[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = si[0] == 0x7fffffff ? 0 : si[0];
}

__global__ void merge_k(void* o, Elem e, float* lse, const void* ob, const float* lseb, int64_t n, int64_t d) {
  pdl_enter();
  const int64_t r = blockIdx.x;
  const float sa = lse[r], sb = lseb[r];
  if (sb == -INFINITY) return;  // an empty part is the identity
  const LseMerge w = lse_merge(sa, sb);
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    const size_t i = size_t(r * d + c);
    const float a = sa == -INFINITY ? 0.f : load_elem(o, e, i);
    store_elem(o, e, i, (w.wa * a + w.wb * load_elem(ob, e, i)) / w.sum);
  }
  __syncthreads();
  if (threadIdx.x == 0) lse[r] = w.lse;
}

__global__ void cache_write_k(const void* rows, Elem re, void* pool, Elem pe, const int32_t* slots,
                              int64_t T, int64_t D, float inv_scale) {
  pdl_enter();
  const size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= size_t(T * D)) return;
  const int64_t t = int64_t(idx / D), c = int64_t(idx % D);
  store_elem(pool, pe, size_t(slots[t]) * size_t(D) + size_t(c), load_elem(rows, re, idx) * inv_scale);
}

__global__ void cache_read_k(const void* pool, Elem pe, const int32_t* slots, int64_t T, int64_t D,
                             float scale, void* rows, Elem re) {
  pdl_enter();
  const size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= size_t(T * D)) return;
  const int64_t t = int64_t(idx / D), c = int64_t(idx % D);
  store_elem(rows, re, idx, load_elem(pool, pe, size_t(slots[t]) * size_t(D) + size_t(c)) * scale);
}

}  // namespace

#define MLA_LAUNCH(kernel, n, stream, ...) \
  do {                                       \
    if ((n) > 0) launch(kernel, blocks_for(size_t(n), kThreads), kThreads, 0, stream, __VA_ARGS__); \
  } while (0)

void fill(void* p, Elem e, size_t n, float v, cudaStream_t s) { MLA_LAUNCH(fill_k, n, s, p, e, n, v); }
void fill_random(void* p, Elem e, size_t n, uint64_t seed, float scale, cudaStream_t s) {
  MLA_LAUNCH(fill_random_k, n, s, p, e, n, seed, scale);
}
void convert(const void* src, Elem se, void* dst, Elem de, size_t n, cudaStream_t s) {
  MLA_LAUNCH(convert_k, n, s, src, se, dst, de, n);
}

// Rows of n bf16 values every ld, starting 16-byte aligned, that one block holds as chunks of 8.
// rmsnorm and add_rmsnorm choose alike (on x), so add_rmsnorm keeps add + rmsnorm's bits.
bool norm_rows_vectorized(const void* x, Elem e, int64_t ld, int64_t n) {
  return e == Elem::BF16 && n % 8 == 0 && ld % 8 == 0 && n <= int64_t(kNormChunks) * 8 * kNormThreads && aligned16(x);
}

void rmsnorm(void* x, Elem e, int64_t M, int64_t ld, int64_t n, const void* w, Elem we, float eps, cudaStream_t s) {
  if (M == 0) return;
  if (norm_rows_vectorized(x, e, ld, n))
    launch(rmsnorm_bf16x8_k, unsigned(M), kNormThreads, 0, s, static_cast<uint16_t*>(x), ld, n, w, we, eps);
  else
    launch(rmsnorm_k, unsigned(M), kNormThreads, 0, s, x, e, ld, n, w, we, eps);
}
void add_rmsnorm(void* h, Elem e, const void* y, Elem ye, void* x, int64_t M, int64_t n, const void* w, Elem we,
                 float eps, cudaStream_t s) {
  if (M == 0) return;
  if (norm_rows_vectorized(x, e, n, n))
    launch(add_rmsnorm_bf16x8_k, unsigned(M), kNormThreads, 0, s, h, aligned16(h), y, ye, ye == Elem::BF16 && aligned16(y),
                                                          static_cast<uint4*>(x), n, w, we, eps);
  else
    launch(add_rmsnorm_k, unsigned(M), kNormThreads, 0, s, h, e, y, ye, x, n, w, we, eps);
}
void rope(void* x, Elem e, int64_t T, int64_t heads, int64_t head_dim, int64_t off, const int32_t* positions,
          const double* inv_freq, int64_t half, double af, bool interleave, cudaStream_t s) {
  MLA_LAUNCH(rope_k, T * half, s, x, e, T, heads, head_dim, off, positions, inv_freq, half, af, interleave);
}
// The 16-byte copy when src and dst hold the same elements at 16-byte row starts and widths.
static bool copy16_fits(Elem se, Elem de, const void* src, const void* dst, std::initializer_list<int64_t> elems) {
  if (se != de || !aligned16(src) || !aligned16(dst)) return false;
  for (int64_t v : elems)
    if (v * int64_t(elem_size(se)) % 16 != 0) return false;
  return true;
}
void copy_cols(const void* src, Elem se, int64_t sld, int64_t s0, void* dst, Elem de, int64_t dld, int64_t d0,
               int64_t M, int64_t n, cudaStream_t s) {
  if (copy16_fits(se, de, src, dst, {sld, s0, dld, d0, n})) {
    const int64_t per = 16 / int64_t(elem_size(se));  // elements a chunk
    MLA_LAUNCH(copy_rows16_k, M * (n / per), s, static_cast<const uint4*>(src) + s0 / per, nullptr, sld / per,
               static_cast<uint4*>(dst) + d0 / per, dld / per, M, int(n / per));
    return;
  }
  MLA_LAUNCH(copy_cols_k, M * n, s, src, se, sld, s0, dst, de, dld, d0, M, n);
}
void build_kv(const void* kv, const void* rows, Elem re, int64_t row_dim, Elem e, int64_t S, int64_t H, int64_t L,
              int64_t dn, int64_t dr, int64_t dv, void* k, void* v, cudaStream_t s) {
  const bool vec = e == Elem::BF16 && re == Elem::BF16 && (row_dim | L | dn | dr | dv) % 8 == 0 && aligned16(kv) &&
                   aligned16(rows) && aligned16(k) && aligned16(v);
  if (vec)
    MLA_LAUNCH(build_kv_bf16x8_k, S * H * (dn + dr + dv) / 8, s, static_cast<const uint4*>(kv),
               static_cast<const uint4*>(rows), row_dim / 8, S, H, L / 8, dn / 8, dr / 8, dv / 8, static_cast<uint4*>(k),
               static_cast<uint4*>(v));
  else
    MLA_LAUNCH(build_kv_k, S * H * (dn + dr + dv), s, kv, rows, re, row_dim, e, S, H, L, dn, dr, dv, k, v);
}
void gather_rows(const void* table, Elem te, const int32_t* ids, int64_t n, int64_t d, void* out, Elem oe,
                 cudaStream_t s) {
  MLA_LAUNCH(gather_rows_k, n * d, s, table, te, ids, n, d, out, oe);
}
void scatter_add_rows(const void* src, Elem se, const int32_t* rows, const float* w, int64_t n, int64_t d,
                      void* out, Elem oe, cudaStream_t s) {
  if (n > 0) MLA_LAUNCH(scatter_add_rows_k, d, s, src, se, rows, w, n, d, out, oe);
}
void add(void* x, Elem xe, const void* y, Elem ye, size_t n, cudaStream_t s) {
  if (xe == Elem::BF16 && ye == Elem::BF16 && n % 8 == 0 && aligned16(x) && aligned16(y))
    MLA_LAUNCH(binary_bf16x8_k<false>, n / 8, s, static_cast<const uint4*>(x), static_cast<const uint4*>(y),
               static_cast<uint4*>(x), n / 8);
  else
    MLA_LAUNCH(add_k, n, s, x, xe, y, ye, n);
}
void argmax_rows(const float* x, int64_t R, int64_t V, int32_t* out, cudaStream_t s) {
  if (R == 0) return;
  launch(argmax_rows_k, unsigned(R), kArgmaxThreads, 0, s, x, V, V % 4 == 0 && aligned16(x), out);
}
void silu_mul(const void* g, const void* u, Elem e, void* out, size_t n, cudaStream_t s) {
  if (e == Elem::BF16 && n % 8 == 0 && aligned16(g) && aligned16(u) && aligned16(out))
    MLA_LAUNCH(binary_bf16x8_k<true>, n / 8, s, static_cast<const uint4*>(g), static_cast<const uint4*>(u),
               static_cast<uint4*>(out), n / 8);
  else
    MLA_LAUNCH(silu_mul_k, n, s, g, u, e, out, n);
}
void merge(void* o, Elem e, float* lse, const void* ob, const float* lseb, int64_t n, int64_t d, cudaStream_t s) {
  if (n == 0) return;
  launch(merge_k, unsigned(n), 128, 0, s, o, e, lse, ob, lseb, n, d);
}
void cache_write(const void* rows, Elem re, void* pool, Elem pe, const int32_t* slots, int64_t T, int64_t D,
                 float scale, cudaStream_t s) {
  MLA_LAUNCH(cache_write_k, T * D, s, rows, re, pool, pe, slots, T, D, 1.f / scale);
}
void cache_read(const void* pool, Elem pe, const int32_t* slots, int64_t T, int64_t D, float scale, void* rows,
                Elem re, cudaStream_t s) {
  if (scale == 1.f && copy16_fits(pe, re, pool, rows, {D})) {
    const int64_t per = 16 / int64_t(elem_size(pe));
    MLA_LAUNCH(copy_rows16_k, T * (D / per), s, static_cast<const uint4*>(pool), slots, D / per,
               static_cast<uint4*>(rows), D / per, T, int(D / per));
    return;
  }
  MLA_LAUNCH(cache_read_k, T * D, s, pool, pe, slots, T, D, scale, rows, re);
}

}  // namespace mla::gpu
