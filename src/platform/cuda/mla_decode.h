// Fast MLA decode attention (absorbed, paged latent cache) for bf16 queries on Hopper (sm_90a).
// Split-KV tensor-core kernel + LSE combine; graph-capturable (no host sync, no allocation).
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

// q [T, H, 576] bf16 · kv rows [slots, 576] (bf16 | fp8 × kv_scale) → o [T, H, 512], lse [T, H].
void mla_attention_fast(const MlaParams& p);

// Testing knobs: force_splits > 0 fixes the KV split count (clamped to the workspace); use_mma_sync
// runs the mma.sync (ldmatrix) variant instead of wgmma; variant selects experimental code paths
// (0 = production). Not thread-safe; tests and benchmarks only.
void mla_fast_set_debug(int32_t force_splits, bool use_mma_sync, int32_t variant = 0);
// Split count of the last mla_attention_fast call (tests and benchmarks).
int32_t mla_fast_debug_last_splits();

}  // namespace mla::cuda
