// The implementation registry: (method, platform) → what can serve, prepare and core. A platform
// lists here exactly the methods it implements; dispatching elsewhere is an error naming both.
#include "mla/registry.h"

#include "methods/method.h"

namespace mla {

std::optional<std::string> methods::serves_all(const Batch&) { return std::nullopt; }

namespace {

std::vector<MethodImpl> build_registry() {
  std::vector<MethodImpl> r;
  // The shared methods: one step sequence, run through each built platform's Ops.
  for (Platform p : all_platforms()) {
    if (p == Platform::ROCM || !platform_built(p)) continue;  // ROCm runs its twins instead
    r.push_back({ForwardMethod::MHA, p, methods::mha_cannot_serve, steps::prepare_latent, methods::mha_core});
    r.push_back({ForwardMethod::MHA_ONE_SHOT, p, methods::serves_all, steps::prepare_latent, methods::mha_one_shot_core});
    r.push_back({ForwardMethod::MHA_CHUNKED_KV, p, methods::serves_all, steps::prepare_latent, methods::mha_chunked_kv_core});
    r.push_back({ForwardMethod::MLA, p, methods::serves_all, steps::prepare_latent, methods::mla_core});
  }
#ifdef MLA_WITH_ROCM
  rocm::add_twins(r);  // the ROCm platform's own methods (src/platform/rocm/twins.cpp)
#endif
  return r;
}

const std::vector<MethodImpl>& registry() {
  static const std::vector<MethodImpl> r = build_registry();
  return r;
}

}  // namespace

const MethodImpl* find_method_impl(ForwardMethod m, Platform p) {
  for (const MethodImpl& i : registry())
    if (i.method == m && i.platform == p) return &i;
  return nullptr;
}

std::vector<const MethodImpl*> method_impls() {
  std::vector<const MethodImpl*> v;
  for (const MethodImpl& i : registry()) v.push_back(&i);
  return v;
}

}  // namespace mla
