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
  // nullopt when the method can serve the batch, else the reason it cannot.
  std::optional<std::string> (*cannot_serve)(const Batch& b);
  void (*prepare)(MethodContext& c);  // projections, norms, RoPE, cache write
  void (*core)(MethodContext& c);     // attention → per-head outputs [T, H, v_head_dim]
};

// nullptr when this build does not implement (method, platform).
const MethodImpl* find_method_impl(ForwardMethod m, Platform p);
std::vector<const MethodImpl*> method_impls();

}  // namespace mla
