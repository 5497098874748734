// Launchers of the small GPU kernels (norms, RoPE, copies, MoE gather/scatter, LSE merge, cache).
// Sizes in elements; pointers on the device; all launches on `s`.
#pragma once
#include <cstdint>

#include "platform/gpu/attention_kernels.h"

namespace mla::gpu {

void fill(void* p, Elem e, size_t n, float v, cudaStream_t s);
// Pseudo-random values (a hash of seed and index; roughly normal, std `scale`): benchmark data.
void fill_random(void* p, Elem e, size_t n, uint64_t seed, float scale, cudaStream_t s);
// dst[i] = src[i] converted (n elements)
void convert(const void* src, Elem se, void* dst, Elem de, size_t n, cudaStream_t s);
// x[M, ld]: RMSNorm over columns [0, n) of each row, in place; w[n]
void rmsnorm(void* x, Elem e, int64_t M, int64_t ld, int64_t n, const void* w, Elem we, float eps,
             cudaStream_t s);
// Whether rmsnorm / add_rmsnorm take rows of x[·, ld] (n normalized) as bf16 vectors of 8 (the
// sum of squares then runs in another order than the element-wise kernel's).
bool norm_rows_vectorized(const void* x, Elem e, int64_t ld, int64_t n);
// h[M, n] += y; x = h; x = RMSNorm(x) · w (one block per row: the same bits as add, convert, rmsnorm)
void add_rmsnorm(void* h, Elem e, const void* y, Elem ye, void* x, int64_t M, int64_t n, const void* w, Elem we,
                 float eps, cudaStream_t s);
// x[T, heads·head_dim]: rotate columns [off, off + 2·half) of every head; angles pos·inv_freq[i]
// in double; cos/sin × attention_factor; interleaved pairs or NeoX halves.
void rope(void* x, Elem e, int64_t T, int64_t heads, int64_t head_dim, int64_t off,
          const int32_t* positions, const double* inv_freq, int64_t half, double attention_factor,
          bool interleave, cudaStream_t s);
// dst[M, dld][:, d0 : d0 + n] = src[M, sld][:, s0 : s0 + n]
void copy_cols(const void* src, Elem se, int64_t sld, int64_t s0, void* dst, Elem de, int64_t dld,
               int64_t d0, int64_t M, int64_t n, cudaStream_t s);
// kv[S, H·(dn+dv)], rows[S, D] (k_pe at column L) → k[S, H, dn+dr], v[S, H, dv]
void build_kv(const void* kv, const void* rows, Elem re, int64_t row_dim, Elem e, int64_t S,
              int64_t H, int64_t L, int64_t dn, int64_t dr, int64_t dv, void* k, void* v,
              cudaStream_t s);
// out[i, :] = table[ids[i], :]
void gather_rows(const void* table, Elem te, const int32_t* ids, int64_t n, int64_t d, void* out,
                 Elem oe, cudaStream_t s);
// out[rows[i], :] += w[i] · src[i, :], in order (deterministic; rows may repeat)
void scatter_add_rows(const void* src, Elem se, const int32_t* rows, const float* w, int64_t n,
                      int64_t d, void* out, Elem oe, cudaStream_t s);
void add(void* x, Elem xe, const void* y, Elem ye, size_t n, cudaStream_t s);
// out[r] = the first index of the largest of x[r, 0..V) (NaN never wins; all NaN → 0)
void argmax_rows(const float* x, int64_t R, int64_t V, int32_t* out, cudaStream_t s);
void silu_mul(const void* gate, const void* up, Elem e, void* out, size_t n, cudaStream_t s);
// (o, lse) ← merge((o, lse), (ob, lseb)); o[n, d], lse[n]
void merge(void* o, Elem e, float* lse, const void* ob, const float* lseb, int64_t n, int64_t d,
           cudaStream_t s);
// pool[slots[t], :] = rows[t, :] / scale;   rows[t, :] = pool[slots[t], :] · scale
void cache_write(const void* rows, Elem re, void* pool, Elem pe, const int32_t* slots, int64_t T,
                 int64_t D, float scale, cudaStream_t s);
void cache_read(const void* pool, Elem pe, const int32_t* slots, int64_t T, int64_t D, float scale,
                void* rows, Elem re, cudaStream_t s);

}  // namespace mla::gpu
