// The failure path of the GPU call checks (gpu_check.h), and the launch switch of launch.cuh.
#include "platform/gpu/gpu_check.h"

#include <cstdlib>
#include <string_view>

#include "mla/error.h"

namespace mla::gpu {

void gpu_fail(const char* kind, const char* what, const char* call, const char* file, int line) {
  fail("{} error: {} in {} ({}:{})", kind, what, call, file, line);
}

bool pdl_allowed() {
  static const bool allowed = [] {
    const char* v = std::getenv("MLA_PDL");
    return !(v && std::string_view(v) == "0");
  }();
  return allowed;
}

}  // namespace mla::gpu
