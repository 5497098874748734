// Launchers of the ROCm platform's own step kernels (the fused steps its twin methods run). They
// are written with CUDA names through the runtime shim, so they compile for AMD GPUs (HIP) and
// for NVIDIA GPUs (rocm-on-cuda, how they are tested). Sizes in elements; pointers on the
// device; everything already checked by the caller; all launches on the given stream.
#pragma once
#include <cstdint>

#include "platform/gpu/attention_kernels.h"

namespace mla::rocm {

using gpu::Elem;

// ---- latent_norm.cu ---------------------------------------------------------------------------
// Both latent-path RMSNorms in one launch, in place: columns [0, q_n) of each row of
// qa[T, q_ld] (the q_lora rows; qa may be null when the model has no q_lora) and columns
// [0, kv_n) of each row of kva[T, kv_ld] (the c_kv part of the new latent rows).
struct LatentNormParams {
  void* qa;
  Elem qa_elem;
  int64_t q_ld, q_n;
  const void* q_w;
  Elem q_w_elem;
  void* kva;
  Elem kva_elem;
  int64_t kv_ld, kv_n;
  const void* kv_w;
  Elem kv_w_elem;
  int64_t T;
  float eps;
  cudaStream_t stream;
};
void latent_rmsnorm(const LatentNormParams& p);

// ---- rope_cache.cu ----------------------------------------------------------------------------
// How the new latent rows reach the cache: the latent part and the rope part written straight into
// the row as two parts (gfx950 style), or the row assembled in shared memory and written once
// (gfx942 style). The bytes are the same.
enum class CacheWrite { TWO_PART, ASSEMBLED };

// One launch per batch, a block per new token t:
//   q_pe: q_src[t, h, q_src_pe : +2·half] rotated (or only copied, rotate = false) into
//         q_dst[t, h, q_dst_pe : +2·half] — the [q_abs | q_pe] concat when q_dst is the MLA query;
//   k_pe: kva[t, L : D] rotated in place (or left, rotate = false);
//   row:  kva[t, :] written to pool[slots[t], :] (÷ pool_scale, in the pool's element type).
struct RopeCacheParams {
  const void* q_src;
  void* q_dst;  // may equal q_src (in place)
  Elem q_elem;  // q_src and q_dst share it
  int64_t heads, q_src_hd, q_src_pe, q_dst_hd, q_dst_pe;
  void* kva;
  Elem kva_elem;
  int64_t L, D;
  const int32_t* positions;  // [T]
  const double* inv_freq;    // [half]
  int64_t half;
  double attention_factor;
  bool interleave, rotate;
  void* pool;
  Elem pool_elem;
  float pool_scale;
  const int32_t* slots;  // [T]
  CacheWrite style;
  int64_t T;
  cudaStream_t stream;
};
void rope_concat_cache(const RopeCacheParams& p);

// ---- kv_build.cu ------------------------------------------------------------------------------
// The MHA K build with the cast in the same pass: kv[S, H·(dn+dv)] (decompressed) and
// rows[S, D] (k_pe at column L) → k[S, H, dn+dr] = [k_nope | k_pe], each value ÷ k_scale stored
// as k_elem (the cache's fp8 with its scale, or the activation type with 1), and v[S, H, dv] as
// v_elem (the activation type).
struct KvBuildParams {
  const void* kv;
  Elem kv_elem;
  const void* rows;
  Elem rows_elem;
  int64_t D, L, S, H, dn, dr, dv;
  void* k;
  void* v;
  Elem k_elem, v_elem;
  float k_scale;
  cudaStream_t stream;
};
void build_kv_cast(const KvBuildParams& p);

// ---- attention.cu -----------------------------------------------------------------------------
// MHA attention whose K is stored as k_elem × k_scale (q, v and o in p.elem).
void mha_attention_cast_k(const gpu::MhaParams& p, Elem k_elem, float k_scale);

// MLA decode with RoPE inside the kernel (MLA_FUSED_ROPE_ROCM): q[t, h, L : D] holds the
// unrotated q_pe and the cache row of the request's new token (its last key) the unrotated k_pe.
// Each block rotates q_pe; the new key's k_pe comes from kva[t, L : D] (unrotated), is rotated and
// rounded as the cache stores it, and the head-0 block writes it back into the cache row. No block
// reads the rope part of that row, so the write-back races with nothing.
struct FusedRopeDecodeParams {
  gpu::MlaParams mla;  // mla.kv is the pool buffer, written through kv_out
  void* kv_out;
  const void* kva;
  Elem kva_elem;
  const int32_t* positions;  // [T]
  const double* inv_freq;    // [half]
  int64_t half;
  double attention_factor;
  bool interleave;
};
void mla_decode_fused_rope(const FusedRopeDecodeParams& p);

// ---- layout.cu --------------------------------------------------------------------------------
// y[b, c, r] = x[b, r, c]   (B batches of an R × C matrix; same element type)
void transpose_last2(const void* x, Elem e, int64_t B, int64_t R, int64_t C, void* y, cudaStream_t s);

}  // namespace mla::rocm
