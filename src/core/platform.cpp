// Platform names (what is built and present is the platform registry's: src/platform/registry.cpp).
#include "mla/platform.h"

#include "mla/error.h"

namespace mla {

std::string_view platform_name(Platform p) {
  switch (p) {
    case Platform::CPU: return "cpu";
    case Platform::CUDA: return "cuda";
    case Platform::ROCM: return "rocm";
  }
  return "?";
}

const std::vector<Platform>& all_platforms() {
  static const std::vector<Platform> all{Platform::CPU, Platform::CUDA, Platform::ROCM};
  return all;
}

Platform parse_platform(std::string_view s) {
  for (Platform p : all_platforms())
    if (s == platform_name(p)) return p;
  fail("unknown platform '{}' (known: cpu, cuda, rocm)", s);
}

}  // namespace mla
