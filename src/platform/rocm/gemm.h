// The ROCm platform's GEMMs. ROCm builds have no hipBLAS/rocBLAS, so every projection (y = x·Wᵀ)
// and every per-head absorb GEMM of the ROCm platform runs through this one SIMT kernel family
// (gemm.cu: shared-memory tiles, f32 FMA accumulation, the same source for CUDA and HIP).
// Weights may be plain (f32/bf16), per-tensor fp8 (e4m3fn or e4m3fnuz) or MXFP4; activations may be
// quantized on the fly (fp8 per group of 128, or MXFP4 per block of 32) so that the result is the
// exact f32-accumulated product of the quantized operands.
// Plain pointers and strides in elements (bytes for MXFP4 weights); no host synchronization inside
// (capturable in a CUDA/HIP graph); no workspace.
#pragma once
#include <cstddef>
#include <cstdint>

#include "platform/gpu/attention_kernels.h"
#include "platform/gpu/gpu_runtime.h"

namespace mla::rocm {

enum class WeightFormat {
  PLAIN,  // w elements are f32 or bf16 (w_elem)
  FP8,    // per-tensor fp8 codes (w_elem FP8_E4M3FN or FP8_E4M3FNUZ) × w_scale
  MXFP4   // packed e2m1 pairs [b][n][K/2] (element 2i in the low nibble) + e8m0 scales [b][n][K/32]
};

enum class ActQuant {
  NONE,          // activations used as they are (f32 math)
  FP8_GROUP128,  // each activation row quantized per group of 128 k-values to fp8 of the weight's
                 // flavour: group scale = amax/fp8_max (1 if amax == 0), q = encode(x/scale);
                 // the last group of a row may be partial (K % 128 != 0)
  MXFP4          // each activation row quantized to MXFP4 per 32 k-values (fp::mxfp4_quantize_block)
};

// Batched GEMM: for b < batch, m < M, n < N:  Y[b][m][n] = Σ_k X̂[b][m][k] · Ŵ[b][n][k]  (f32 FMA
// accumulation), where X̂ is X (ActQuant NONE) or decode(q)·scale of its quantized form, and Ŵ is the
// plain weight, decode(code)·w_scale (FP8) or e2m1·2^e8m0 (MXFP4).
// X element (b,m,k) at x + b·x_bstride + m·x_ld + k; W (b,n,k) at w + b·w_bstride + n·w_ld + k (for
// MXFP4, strides count bytes of `packed`, and scales (b,n,g) at w_scales + b·s_bstride + n·s_ld + g);
// Y (b,m,n) at y + b·y_bstride + m·y_ld + n.
// Supported: x_elem F32 | BF16; y_elem F32 | BF16 (round to nearest even); and the pairs
//   PLAIN (w_elem F32 | BF16) + NONE;
//   FP8 (w_elem FP8_E4M3FN | FP8_E4M3FNUZ) + NONE or FP8_GROUP128 (activations quantized to the
//   weight's fp8 flavour: max 448 for fn, 240 for fnuz);
//   MXFP4 + MXFP4 (K % 32 == 0; w_elem, w_scale unused).
// w_scale is used by FP8 only; w_scales/s_ld/s_bstride by MXFP4 only.
// Limits: M ≤ 65536, N ≤ 32768, K ≤ 16384, batch ≤ 256; M, N or batch == 0 returns at once; K == 0
// writes zeros. Vectorized loads are used where the pointers and strides allow (16-byte aligned rows
// for f32/bf16, 8-byte for fp8, 4-byte for MXFP4); anything else takes a scalar, bounds-checked path.
struct GemmParams {
  const void* x;
  gpu::Elem x_elem;
  int64_t x_ld, x_bstride;
  const void* w;
  gpu::Elem w_elem;
  WeightFormat wf;
  int64_t w_ld, w_bstride;
  float w_scale;
  const uint8_t* w_scales;
  int64_t s_ld, s_bstride;
  void* y;
  gpu::Elem y_elem;
  int64_t y_ld, y_bstride;
  int64_t M, N, K, batch;
  ActQuant aq;
  cudaStream_t stream;
};

// Throws mla::Error (through gpu::gpu_fail) for an unsupported combination or out-of-range sizes.
void gemm(const GemmParams& p);

// out[i] = decode(codes[i]) · scale for i < n: fp8 codes (FP8_E4M3FN | FP8_E4M3FNUZ) → out_elem
// (BF16 | F32). The "dequantize the weight per call" fallback.
void dequantize_fp8(const void* codes, gpu::Elem code_elem, float scale, void* out, gpu::Elem out_elem,
                    size_t n, cudaStream_t s);

namespace detail {
// The tile configurations of the kernel family (for tests and benchmarks; gemm() picks by shape):
//   LARGE  128×128 block, 8×8 per thread, K-tile 16 (M ≥ 128 and enough blocks);
//   MEDIUM 64×64, 4×4, K-tile 32;  NARROW 32×64, 2×4, K-tile 32 (M ≤ 32);
//   SMALL  16×32, 2×1, K-tile 32 (M ≤ 16);
//   SKINNY 8 rows × 16 columns, each 32-lane group sweeping K for 2 columns (M ≤ 8, K ≥ 1024:
//          decode-time projections, bound by the weight's bandwidth).
enum class GemmTile { AUTO, LARGE, MEDIUM, NARROW, SMALL, SKINNY };
void gemm_tile(const GemmParams& p, GemmTile tile);
GemmTile pick_tile(const GemmParams& p);
// Every kernel variant compiled (the tiles above, some in two occupancy flavours), by index.
int num_variants();
const char* variant_name(int v);
void gemm_variant(const GemmParams& p, int variant);
}  // namespace detail

}  // namespace mla::rocm
