// The platform registry: the one place that knows which platforms this build carries, whether
// their devices are present, how their Ops are made, and which methods each implements.
#include "platform/registry.h"

#include "mla/error.h"

namespace mla {

namespace cpu {
PlatformEntry platform_entry();
}
#ifdef MLA_WITH_CUDA
namespace cuda {
PlatformEntry platform_entry();
}
#endif
#ifdef MLA_WITH_ROCM
namespace rocm {
PlatformEntry platform_entry();
}
#endif

namespace {

const std::vector<PlatformEntry>& built() {
  static const std::vector<PlatformEntry> entries = {
      cpu::platform_entry(),
#ifdef MLA_WITH_CUDA
      cuda::platform_entry(),
#endif
#ifdef MLA_WITH_ROCM
      rocm::platform_entry(),
#endif
  };
  return entries;
}

const PlatformEntry* entry(Platform p) {
  for (const PlatformEntry& e : built())
    if (e.platform == p) return &e;
  return nullptr;
}

const std::vector<MethodImpl>& implementations() {
  static const std::vector<MethodImpl> r = [] {
    std::vector<MethodImpl> v;
    for (const PlatformEntry& e : built()) e.add_methods(v);
    return v;
  }();
  return r;
}

}  // namespace

bool platform_built(Platform p) { return entry(p) != nullptr; }

bool platform_available(Platform p) { return platform_device_count(p) > 0; }

int platform_device_count(Platform p) {
  const PlatformEntry* e = entry(p);
  return e ? e->device_count() : 0;
}

std::unique_ptr<Ops> make_ops(Platform p, DType act, const PlatformOptions& options) {
  const PlatformEntry* e = entry(p);
  if (!e) fail("platform {} is not built into this mla", platform_name(p));
  return e->make_ops(act, options);
}

const MethodImpl* find_method_impl(ForwardMethod m, Platform p) {
  for (const MethodImpl& i : implementations())
    if (i.method == m && i.platform == p) return &i;
  return nullptr;
}

const MethodImpl& require_method_impl(ForwardMethod m, Platform p, const Batch& b) {
  const MethodImpl* impl = find_method_impl(m, p);
  if (!impl) fail("forward method {} is not implemented on platform {}", method_name(m), platform_name(p));
  if (auto why = impl->cannot_serve(b))
    fail("forward method {} on platform {} cannot serve this batch: {}", method_name(m), platform_name(p), *why);
  return *impl;
}

std::vector<const MethodImpl*> method_impls() {
  std::vector<const MethodImpl*> v;
  for (const MethodImpl& i : implementations()) v.push_back(&i);
  return v;
}

}  // namespace mla
