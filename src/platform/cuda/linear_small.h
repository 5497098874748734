// linear_small.h — the CUDA platform's dense GEMM for decode batches of up to 16 rows (bf16):
// y = x · Wᵀ where cuBLAS's small-M kernels put a few dozen blocks on 132 SMs (linear_small.cu).
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

namespace mla::cuda {

// Rows the kernel takes at most: one m16 tile.
constexpr int64_t kLinearSmallRows = 16;

// Whether x [M, K] · w [N, K]ᵀ → y [M, N], all bf16, goes to linear_small: 1 ≤ M ≤ 16, K a multiple
// of 64, N a multiple of 8 and at most 16384 (lm_head stays on cuBLAS: every block re-reads x), rows
// 16-byte aligned.
bool linear_small_supports(int64_t M, int64_t N, int64_t K, const void* x, const void* w, const void* y);
// Each output sums its K products in one order that depends on K alone (k16 steps, dealt to four
// warps by 64-wide chunk, the warps' partials added in warp order), so a row has the same bits at
// every M up to 16.
void linear_small(const void* x, const void* w, void* y, int64_t M, int64_t N, int64_t K, cudaStream_t s);
// y = silu(x · gateᵀ) · (x · upᵀ), each product rounded to bf16 first: the bits of linear_small on
// both weights and then silu_mul (gate and up [N, K] as linear_small_supports takes w).
void linear_small_gated(const void* x, const void* gate, const void* up, void* y, int64_t M, int64_t N, int64_t K,
                        cudaStream_t s);

}  // namespace mla::cuda
