// Fast MLA decode attention (absorbed, paged latent cache) for bf16 queries on Hopper (sm_90a).
// Split-KV tensor-core kernels + LSE combine; graph-capturable (no host sync, no allocation).
// The host side (mla_decode.cpp) picks the kernel and the split count; the kernels are
// mla_decode_seesaw.cu, mla_decode_wide.cu, mla_decode_narrow.cu and mla_decode_combine.cu.
#pragma once
#include <cstddef>
#include <cstdint>

#include "platform/gpu/attention_kernels.h"

namespace mla::cuda {

// The shared GPU types (platform/gpu) these CUDA-only kernels take.
using gpu::DeviceSegments;
using gpu::Elem;
using gpu::MhaParams;
using gpu::MlaParams;
using gpu::Workspace;

// Bytes of p.ws the fast kernel may use for a batch of total_q query tokens (f32 partial outputs
// and LSE of the KV splits); 0 when it never splits. num_sms: the device's multiprocessor count.
size_t mla_fast_workspace_bytes(int32_t total_q, int32_t num_heads, int32_t num_sms);

// True when mla_attention_fast handles p: bf16 q, bf16 or fp8 e4m3fn KV, D = 576, Dv = 512,
// 1..128 heads, bf16 or f32 output, 16-byte aligned q / kv. Otherwise use the generic kernel.
bool mla_fast_supports(const MlaParams& p);

// Launch choices for tests and benchmarks; the default is the production dispatch.
struct MlaDecodeTuning {
  int32_t force_splits = 0;   // > 0: this KV split count (clamped to the workspace); 0: heuristic
  bool use_mma_sync = false;  // the 64-row kernel with mma.sync (ldmatrix) products, not wgmma
  // Bit 3 (8): 64-row tiles even for ≤ 32 rows; bit 4 (16): the split-S 64-row kernel, not the
  // see-saw one; bit 5 (32): the combine launched plainly, not early; bit 6 (64): the combine kernel
  // even where the see-saw grid would merge its split partials itself (MlaParams::grid_counters);
  // bit 7 (128): the persistent see-saw grid wherever it can run (MlaDecodeSchedule::parts), bit 8
  // (256): never. Debugging aids (bf16 KV): bit 1 (2) wgmma for S only, bit 2 (4) for
  // P·V only (both split-S); bit 0 (1) swaps the V descriptor strides (a wrong layout).
  int32_t variant = 0;
};

// The launch plan of a batch: kernel, row tile and KV split count. It depends only on the host
// fields of p.seg (requests, total and longest query and key lengths), the head count, the
// workspace size and the tuning, so a step computes it once for all its layers.
struct MlaDecodeSchedule {
  bool narrow = false;  // swap-AB kernel (≤ 32 packed rows per request); else 64-row tiles
  int32_t tile_rows = 0;
  int32_t row_tiles = 0;  // 0: nothing to launch
  int32_t splits = 1;
  int32_t key_tiles = 0;  // of the longest request, as kv_bucket() rounds it
  // > 0: the persistent see-saw grid (row_tiles, parts), splits 1: the batch's KV tiles spread
  // evenly over the parts, a unit cut between parts merged by the part holding its first tiles.
  int32_t parts = 0;
};
MlaDecodeSchedule mla_fast_schedule(const MlaParams& p, const MlaDecodeTuning& tuning = {});
// What of a batch beyond its shapes the default schedule follows (CudaOps::launch_class): 1 where
// it takes the persistent grid for `requests` requests of at most max_q_len query tokens, `heads`
// heads, at kv_fill `k_fill` (mla/batch.h) on this device; else 0.
int32_t mla_fast_launch_class(int64_t max_q_len, int64_t requests, int64_t heads, int32_t k_fill);

// Whether the launch `s` rounds Q to e4m3 for Q·Kᵀ (fp8 KV in the narrow kernel at ≤ 16 rows): each
// packed row times 2^k, k = 7 − ⌊log2 of its largest |q|⌋ (0 for a row of zeros; clamped to ±100), to
// the nearest e4m3fn value (ties to even, saturating), times 2^−k; a row holding an infinity comes
// out NaN. The other launches multiply the bf16 Q as it is.
bool mla_fast_rounds_q_to_e4m3(const MlaParams& p, const MlaDecodeSchedule& s);

// q [T, H, 576] bf16 · kv rows [slots, 576] (bf16 | fp8 × kv_scale) → o [T, H, 512], lse [T, H].
// `s` must be mla_fast_schedule(p, tuning) for p's segment host fields, heads and workspace.
// Returns the KV split count it launched (1: no combine; 0: nothing to do).
int32_t mla_attention_fast(const MlaParams& p, const MlaDecodeSchedule& s, const MlaDecodeTuning& tuning = {});
inline int32_t mla_attention_fast(const MlaParams& p, const MlaDecodeTuning& tuning = {}) {
  return mla_attention_fast(p, mla_fast_schedule(p, tuning), tuning);
}

}  // namespace mla::cuda
