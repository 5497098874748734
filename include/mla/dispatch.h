// mla/dispatch.h — choosing a forward method: a handler per attention backend (pure functions of
// the batch and the settings) and a resolution table per platform.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "mla/batch.h"
#include "mla/forward_method.h"
#include "mla/platform.h"

namespace mla {

struct DispatchSettings {
  std::string backend;  // empty: the platform's default (cpu, cuda: fa3; rocm: aiter)
  int64_t chunked_prefix_threshold = 8192;  // on Σ prefix_len
  int64_t chunk_capacity = 131072;          // tokens
  // Chunked-prefix cache: unset means the backend's default (on for fa3, flashinfer, flashmla,
  // cutlass_mla, trtllm_mla, fa4). triton and aiter force it off whatever is asked.
  std::optional<bool> chunked_prefix_cache;
  bool deterministic = false;
  bool fused_decode_rope = false;  // ROCm: MLA_FUSED_ROPE_ROCM for aiter decode
};

const std::vector<std::string>& backend_names();  // known handler names
// Throws Error for a name that is not one of backend_names(), listing them.
void check_backend(std::string_view name);
std::string default_backend(Platform p);
bool chunked_prefix_cache_enabled(const std::string& backend, const DispatchSettings& s);

// The generic (or MLA-subtype) method the backend's rules pick. Throws Error for an unknown
// backend, listing the known ones.
ForwardMethod select_method(const Batch& b, const DispatchSettings& s, Platform p);

// The platform's own method for a generic one (its twin in the method table, if it has one);
// platform-specific members map to themselves.
ForwardMethod resolve_method(Platform p, ForwardMethod m);

struct DispatchResult {
  ForwardMethod method = ForwardMethod::MLA;    // the handler's (generic) choice
  ForwardMethod resolved = ForwardMethod::MLA;  // the platform's own method
  Platform platform = Platform::CPU;
  bool implemented = false;  // this build has (resolved, platform)
  bool serves = false;       // ... and it can serve this batch
  std::string reason;        // why not, when either is false
};
// Handler → resolution → registry. Never throws for a valid batch; throws Error for bad
// settings (unknown backend) or a malformed batch.
DispatchResult dispatch(const Batch& b, const DispatchSettings& s, Platform p);

}  // namespace mla
