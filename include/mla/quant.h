// mla/quant.h — host-side weight quantization at load time: per-tensor fp8 (e4m3fn / e4m3fnuz) and MXFP4.
#pragma once
#include <cstdint>
#include <string_view>

#include "mla/dtype.h"
#include "mla/tensor.h"

namespace mla {

// The two fp8 e4m3 encodings: OCP (NVIDIA, most checkpoints) and AMD gfx942's.
enum class Fp8Flavor { E4M3FN, E4M3FNUZ };
std::string_view fp8_flavor_name(Fp8Flavor f);  // "e4m3fn", "e4m3fnuz"
DType fp8_dtype(Fp8Flavor f);                    // F8_E4M3FN / F8_E4M3FNUZ

// Per-tensor fp8: value = decode(codes[i]) * scale.
struct Fp8Weight {
  Tensor codes;  // [any shape], F8_E4M3FN or F8_E4M3FNUZ, host
  float scale = 1.f;
};

// Host float tensor (f64, f32, bf16, f16; any rank, finite values) → per-tensor e4m3fn with
// scale = amax / 448 (1 for an all-zero tensor; never below 2^-126, the smallest normal f32, so a
// tiny tensor gets no subnormal scale) and codes = fp::e4m3fn_encode(w / scale), nearest even.
// E4M3FNUZ quantizes as e4m3fn, then normalize_fn_to_fnuz (as sglang / aiter make fnuz weights):
// the values are those of the fn path, the scale twice its. Throws Error naming a bad input.
Fp8Weight quantize_fp8_per_tensor(const Tensor& w, Fp8Flavor f);

// Checkpoint block fp8 → per-tensor: w F8_E4M3FN [N, K], scale_inv f32 [ceil(N/block), ceil(K/block)]
// (edge blocks partial) is dequantized with its block scales (dequantize_block_fp8), then quantized
// by quantize_fp8_per_tensor. Throws Error naming a bad input.
Fp8Weight block_fp8_to_per_tensor(const Tensor& w, const Tensor& scale_inv, Fp8Flavor f,
                                  int64_t block = 128);

// e4m3fn codes reinterpreted as e4m3fnuz: code 0x80 (−0) → 0x00, other codes unchanged, scale × 2;
// the values are unchanged. Throws Error if the codes are not F8_E4M3FN or hold a NaN code.
Fp8Weight normalize_fn_to_fnuz(const Fp8Weight& w);

// codes × scale as a host tensor of `out` (f64, f32, bf16, f16), rounded once. Throws Error on a
// NaN code.
Tensor dequantize(const Fp8Weight& w, DType out);

// MXFP4 (OCP microscaling fp4) along the last dim, in blocks of 32: block b of row r is
// fp::mxfp4_quantize_block of w[r, 32b .. 32b+31].
struct Mxfp4Weight {
  Tensor packed;  // U8 [.., K/2]: e2m1 element 2i in the low nibble of byte i, 2i+1 in the high
  Tensor scales;  // U8 [.., K/32]: e8m0 codes, one per block of 32
  Shape shape;    // [.., K], the unquantized shape
};
// w: host float tensor [.., K] (rank >= 1, K % 32 == 0, finite values within f32 range).
Mxfp4Weight quantize_mxfp4(const Tensor& w);
// e2m1 element × e8m0 scale as a host tensor of `out` (f64, f32, bf16, f16) [.., K]. Throws Error
// on inconsistent shapes or dtypes, or a NaN scale code (0xff).
Tensor dequantize(const Mxfp4Weight& w, DType out);

}  // namespace mla
