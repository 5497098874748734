// mla/registry.h — which (method, platform) pairs this build implements, and what each can serve.
// The single source of truth for "supported?".
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "mla/batch.h"
#include "mla/forward_method.h"
#include "mla/platform.h"

namespace mla {

struct MethodContext;

struct MethodImpl {
  ForwardMethod method;
  Platform platform;
  void (*prepare)(MethodContext& c);  // projections, norms, RoPE, cache write
  void (*core)(MethodContext& c);     // attention → per-head outputs [T, H, v_head_dim]
  // nullopt when the method can serve the batch, else the reason it cannot (method_cannot_serve).
  std::optional<std::string> cannot_serve(const Batch& b) const { return method_cannot_serve(method, b); }
};

// The registry is built from what each built platform registers (src/platform/registry.cpp).
// nullptr when this build does not implement (method, platform).
const MethodImpl* find_method_impl(ForwardMethod m, Platform p);
std::vector<const MethodImpl*> method_impls();
// The implementation of a forced method for this batch; throws Error naming the method and the
// platform when this build does not implement it or it cannot serve the batch.
const MethodImpl& require_method_impl(ForwardMethod m, Platform p, const Batch& b);

}  // namespace mla
