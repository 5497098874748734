// The failure path of the GPU call checks (gpu_check.h).
#include "platform/gpu/gpu_check.h"

#include "mla/error.h"

namespace mla::gpu {

void gpu_fail(const char* kind, const char* what, const char* call, const char* file, int line) {
  fail("{} error: {} in {} ({}:{})", kind, what, call, file, line);
}

}  // namespace mla::gpu
