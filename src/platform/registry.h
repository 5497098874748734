// src/platform/registry.h — what a platform tells the registry about itself. Each platform's
// folder defines its entry (cpu::platform_entry() in src/platform/cpu, ...); the registry
// (registry.cpp) is the only place that knows which platforms this build carries.
#pragma once
#include <memory>
#include <vector>

#include "mla/platform_ops.h"
#include "mla/registry.h"

namespace mla {

struct PlatformEntry {
  Platform platform;
  int (*device_count)();  // devices present on this machine (the CPU: 1); 0 when none
  // Ops storing activations and weights in `act`; throws Error for a dtype it has no flavour of.
  std::unique_ptr<Ops> (*make_ops)(DType act, const PlatformOptions& options);
  void (*add_methods)(std::vector<MethodImpl>& registry);  // the methods it implements
};

namespace methods {
// The four shared methods (src/methods), run through platform `p`'s Ops: for the platforms that
// run them as they are (the CPU, CUDA).
void add_shared_methods(std::vector<MethodImpl>& registry, Platform p);
}  // namespace methods

}  // namespace mla
