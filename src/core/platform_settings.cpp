// The platforms' settings (mla/platform_ops.h): names, defaults and the checks of the ROCm ones.
#include <fmt/format.h>

#include "mla/error.h"
#include "mla/platform_ops.h"

namespace mla {

std::string_view rocm_arch_name(RocmArch a) {
  switch (a) {
    case RocmArch::GFX90A: return "gfx90a";
    case RocmArch::GFX940: return "gfx940";
    case RocmArch::GFX942: return "gfx942";
    case RocmArch::GFX950: return "gfx950";
  }
  return "?";
}

RocmArch parse_rocm_arch(std::string_view s) {
  for (RocmArch a : {RocmArch::GFX90A, RocmArch::GFX940, RocmArch::GFX942, RocmArch::GFX950})
    if (rocm_arch_name(a) == s) return a;
  fail("unknown ROCm arch '{}' (known: gfx90a, gfx940, gfx942, gfx950)", s);
}

std::string_view absorb_format_name(AbsorbFormat f) {
  switch (f) {
    case AbsorbFormat::ACT: return "act";
    case AbsorbFormat::FP8: return "fp8";
    case AbsorbFormat::FP8_DEQUANT: return "fp8-dequant";
    case AbsorbFormat::MXFP4: return "mxfp4";
  }
  return "?";
}

AbsorbFormat parse_absorb_format(std::string_view s) {
  for (AbsorbFormat f : {AbsorbFormat::ACT, AbsorbFormat::FP8, AbsorbFormat::FP8_DEQUANT, AbsorbFormat::MXFP4})
    if (absorb_format_name(f) == s) return f;
  fail("unknown absorb weight format '{}' (known: act, fp8, fp8-dequant, mxfp4)", s);
}

Fp8Flavor RocmSettings::fp8_flavor() const {
  if (fp8) return *fp8;
  return arch == RocmArch::GFX950 ? Fp8Flavor::E4M3FN : Fp8Flavor::E4M3FNUZ;
}

bool RocmSettings::two_part_cache_write() const { return arch == RocmArch::GFX950; }

void RocmSettings::validate() const {
  const std::string_view a = rocm_arch_name(arch);
  if (fp8 && arch != RocmArch::GFX90A) {
    const Fp8Flavor native = arch == RocmArch::GFX950 ? Fp8Flavor::E4M3FN : Fp8Flavor::E4M3FNUZ;
    if (*fp8 != native)
      fail("fp8 flavour {} is not native on {} (it computes in {})", fp8_flavor_name(*fp8), a, fp8_flavor_name(native));
  }
  if (absorb == AbsorbFormat::FP8 && arch == RocmArch::GFX90A)
    fail("absorb weights fp8 need fp8 arithmetic, which gfx90a lacks (use fp8-dequant or act)");
  if (absorb == AbsorbFormat::MXFP4 && arch != RocmArch::GFX950)
    fail("absorb weights mxfp4 need gfx950 (MXFP4 arithmetic), not {}", a);
}

std::string RocmSettings::describe() const {
  return fmt::format("{}, fp8 {}, absorb {}, cache write {}", rocm_arch_name(arch), fp8_flavor_name(fp8_flavor()),
                     absorb_format_name(absorb), two_part_cache_write() ? "two-part" : "assembled");
}

}  // namespace mla
