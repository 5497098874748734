// moe_gemm.h — the CUDA platform's grouped expert GEMMs for bf16 (moe_gemm.cu): mma.sync with a
// cp.async pipeline for decode-sized tiles, wgmma with TMA for prefill, over the plan of
// platform/gpu/moe.h.
#pragma once
#include <cstdint>

#include "platform/gpu/moe.h"

namespace mla::cuda {

// Rows per tile the fast kernels take for n slots over E experts of I × hidden (16 at decode, 64 once
// experts average enough rows, 128 on sm_90a for prefill); the plan must be made with the same count.
int moe_fast_rows(int64_t n, int64_t E, int64_t I, int64_t hidden);
// Shapes the fast kernels take: I and hidden multiples of 64.
bool moe_fast_supports(int64_t I, int64_t hidden);

// h[row, :I] = silu(gate_e · x_t) ⊙ (up_e · x_t) (products rounded to bf16), x[T, hidden] bf16,
// gate / up [E, I, hidden] bf16, h [n = T·topk, I] bf16 by plan row; t = slot / topk.
void moe_gate_up_fast(const void* x, int64_t T, int topk, const gpu::MoePlan& plan, int64_t max_tiles, int bm,
                      const void* gate, const void* up, int64_t E, int64_t I, int64_t hidden, void* h, cudaStream_t s);
// y[row, :hidden] = down_e · h[row, :I], h [n, I], down [E, hidden, I] bf16, y [n, hidden] bf16.
void moe_down_fast(const void* h, int64_t n, const gpu::MoePlan& plan, int64_t max_tiles, int bm, const void* down,
                   int64_t E, int64_t I, int64_t hidden, void* y, cudaStream_t s);

}  // namespace mla::cuda
