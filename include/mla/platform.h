// mla/platform.h — the platforms mla.cpp targets.
#pragma once
#include <string_view>
#include <vector>

namespace mla {

enum class Platform { CPU, CUDA, ROCM };

std::string_view platform_name(Platform p);  // "cpu", "cuda", "rocm"
Platform parse_platform(std::string_view s);  // throws Error listing the known names
const std::vector<Platform>& all_platforms();
// The platform registry (src/platform/registry.cpp) answers these.
bool platform_built(Platform p);      // compiled into this build?
bool platform_available(Platform p);  // built, and its device is present on this machine
int platform_device_count(Platform p);  // its devices on this machine (the CPU: 1); 0 when not built

}  // namespace mla
