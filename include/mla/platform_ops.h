// mla/platform_ops.h — making a platform's Ops, and the settings a platform takes.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "mla/ops.h"
#include "mla/quant.h"

namespace mla {

// ---- ROCm settings -----------------------------------------------------------------------------
// The AMD target the ROCm platform builds its steps for. What follows from it: the fp8 flavour
// (gfx950: OCP e4m3fn; gfx940/gfx942: e4m3fnuz; gfx90a: no fp8 arithmetic), MXFP4 (gfx950 only)
// and the cache-write style (gfx950: two parts straight into the row; others: one assembled row).
enum class RocmArch { GFX90A, GFX940, GFX942, GFX950 };
std::string_view rocm_arch_name(RocmArch a);  // "gfx90a", "gfx940", "gfx942", "gfx950"
RocmArch parse_rocm_arch(std::string_view s);  // throws Error listing the known names

// How the MLA twins hold the absorbed weights w_kc / w_vc:
//   act          in the activation dtype (no quantization);
//   fp8          per-tensor fp8 of the arch's flavour; activations quantized per group of 128
//                inside the batched GEMM (w8a8);
//   fp8-dequant  the same fp8 weights, dequantized (× scale) to the activation dtype per call;
//   mxfp4        MXFP4 weights; activations quantized to MXFP4 on the fly (gfx950).
enum class AbsorbFormat { ACT, FP8, FP8_DEQUANT, MXFP4 };
std::string_view absorb_format_name(AbsorbFormat f);  // "act", "fp8", "fp8-dequant", "mxfp4"
AbsorbFormat parse_absorb_format(std::string_view s);  // throws Error listing the known names

struct RocmSettings {
  RocmArch arch = RocmArch::GFX942;
  std::optional<Fp8Flavor> fp8;  // unset: the arch's own
  AbsorbFormat absorb = AbsorbFormat::ACT;

  Fp8Flavor fp8_flavor() const;       // fp8, else the arch's own
  bool two_part_cache_write() const;  // gfx950
  // Throws Error naming the conflict: an fp8 flavour the arch does not compute in, fp8 absorb
  // weights on gfx90a, MXFP4 before gfx950.
  void validate() const;
  std::string describe() const;  // e.g. "gfx942, fp8 e4m3fnuz, absorb act, cache write assembled"
};

// Settings of the platforms that take any (the CPU and CUDA take none yet).
struct PlatformOptions {
  RocmSettings rocm;
};

// Ops of `p` storing activations and weights in `act`. CPU: F64 (the float64 reference flavour),
// F32 or BF16 (the fast flavour, f32 accumulation). CUDA, ROCm: F32 or BF16. Throws Error naming
// the pair when this build has no such ops, or the settings that are invalid.
std::unique_ptr<Ops> make_ops(Platform p, DType act, const PlatformOptions& options = {});

}  // namespace mla
