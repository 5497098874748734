// Choosing a forward method: one small pure handler per attention backend (after sglang's
// attention_backend_handler.py), found by name, then a resolution table per platform.
#include "mla/dispatch.h"

#include <array>
#include <cstddef>

#include <fmt/format.h>

#include "mla/error.h"
#include "mla/registry.h"

namespace mla {

namespace {

// What a handler sees: the batch, the settings, and the facts derived from them once.
struct HandlerInput {
  const Batch& batch;
  const DispatchSettings& settings;
  Platform platform;
  std::string_view backend;
  bool extend;  // mode EXTEND only: not TARGET_VERIFY or DRAFT_EXTEND
  int64_t sum_prefix;
  int64_t sum_seq;
  bool chunked_prefix_cache;  // after the backend's override
};

using Handler = ForwardMethod (*)(const HandlerInput&);

// MLA, except the fused-RoPE decode of aiter on ROCm.
// aiter's decode with fused RoPE: the platform's own MLA subtype that computes MLA with RoPE
// inside the decode kernel, where the method table lists one.
ForwardMethod mla_subtype(const HandlerInput& in) {
  if (in.settings.fused_decode_rope && in.batch.mode == ForwardMode::DECODE && in.backend == "aiter")
    for (const MethodInfo& m : method_table())
      if (m.platform == in.platform && m.generic == ForwardMethod::MLA && !m.resolves_generic &&
          m.need == MethodNeed::DECODE_ONE_TOKEN)
        return m.method;
  return ForwardMethod::MLA;
}

// fa3, flashinfer, flashmla, cutlass_mla: MHA for a fresh prefill or a long (chunk-cached)
// prefix; one shot when the backend has it and the whole batch fits one chunk.
ForwardMethod flash_family(const HandlerInput& in, bool has_one_shot) {
  bool long_prefix =
      in.chunked_prefix_cache && in.sum_prefix >= in.settings.chunked_prefix_threshold;
  if (!in.extend || !(in.sum_prefix == 0 || long_prefix)) return mla_subtype(in);
  if (has_one_shot && in.sum_seq <= in.settings.chunk_capacity) return ForwardMethod::MHA_ONE_SHOT;
  return ForwardMethod::MHA_CHUNKED_KV;
}

ForwardMethod handle_fa3(const HandlerInput& in) {
  if (in.settings.deterministic) return mla_subtype(in);
  return flash_family(in, /*has_one_shot=*/true);
}

ForwardMethod handle_flashinfer(const HandlerInput& in) { return flash_family(in, true); }
ForwardMethod handle_flashmla(const HandlerInput& in) { return flash_family(in, true); }
ForwardMethod handle_cutlass_mla(const HandlerInput& in) { return flash_family(in, false); }

ForwardMethod handle_trtllm_mla(const HandlerInput& in) {
  if (in.extend && (in.chunked_prefix_cache || in.sum_prefix == 0))
    return ForwardMethod::MHA_CHUNKED_KV;
  return mla_subtype(in);
}

ForwardMethod handle_fa4(const HandlerInput&) { return ForwardMethod::MHA_CHUNKED_KV; }

ForwardMethod handle_triton(const HandlerInput& in) {
  if (in.settings.deterministic) return mla_subtype(in);
  if (in.extend && in.sum_prefix == 0) return ForwardMethod::MHA;
  return mla_subtype(in);
}

ForwardMethod handle_aiter(const HandlerInput& in) {
  if (in.extend) return ForwardMethod::MHA;
  return mla_subtype(in);
}

struct BackendEntry {
  std::string_view name;
  Handler handler;
};

// The known backends, in the order they are listed to users.
constexpr std::array<BackendEntry, 8> kHandlers = {{
    {"fa3", handle_fa3},
    {"flashinfer", handle_flashinfer},
    {"flashmla", handle_flashmla},
    {"cutlass_mla", handle_cutlass_mla},
    {"trtllm_mla", handle_trtllm_mla},
    {"fa4", handle_fa4},
    {"triton", handle_triton},
    {"aiter", handle_aiter},
}};

Handler find_handler(std::string_view name) {
  for (const BackendEntry& e : kHandlers)
    if (e.name == name) return e.handler;
  return nullptr;
}

std::string joined_backend_names() {
  std::string s;
  for (const std::string& n : backend_names()) {
    if (!s.empty()) s += ", ";
    s += n;
  }
  return s;
}

void validate(const Batch& b, const DispatchSettings& s) {
  for (const BatchRequest& r : b.requests) {
    if (r.prefix_len < 0) fail("request {}: prefix_len {} is negative", r.id, r.prefix_len);
    if (r.new_len < 0) fail("request {}: new_len {} is negative", r.id, r.new_len);
  }
  if (s.chunked_prefix_threshold <= 0)
    fail("chunked_prefix_threshold must be positive, got {}", s.chunked_prefix_threshold);
  if (s.chunk_capacity <= 0) fail("chunk_capacity must be positive, got {}", s.chunk_capacity);
}

}  // namespace

const std::vector<std::string>& backend_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const BackendEntry& e : kHandlers) v.emplace_back(e.name);
    return v;
  }();
  return names;
}

std::string default_backend(Platform p) {
  switch (p) {
    case Platform::CPU: return "fa3";
    case Platform::CUDA: return "fa3";
    case Platform::ROCM: return "aiter";
  }
  fail("unknown platform value {}", int(p));
}

bool chunked_prefix_cache_enabled(const std::string& backend, const DispatchSettings& s) {
  if (backend == "triton" || backend == "aiter") return false;
  return s.chunked_prefix_cache.value_or(true);
}

void check_backend(std::string_view name) {
  if (!find_handler(name)) fail("unknown attention backend '{}' (known: {})", name, joined_backend_names());
}

ForwardMethod select_method(const Batch& b, const DispatchSettings& s, Platform p) {
  const std::string backend = s.backend.empty() ? default_backend(p) : s.backend;
  check_backend(backend);
  Handler handler = find_handler(backend);
  validate(b, s);
  const HandlerInput in{.batch = b,
                        .settings = s,
                        .platform = p,
                        .backend = backend,
                        .extend = b.mode == ForwardMode::EXTEND,
                        .sum_prefix = b.sum_prefix(),
                        .sum_seq = b.sum_seq(),
                        .chunked_prefix_cache = chunked_prefix_cache_enabled(backend, s)};
  return handler(in);
}

ForwardMethod resolve_method(Platform p, ForwardMethod m) {
  if (method_info(m).platform) return m;  // platform-specific members map to themselves
  for (const MethodInfo& t : method_table())
    if (t.platform == p && t.resolves_generic && t.generic == m) return t.method;
  return m;
}

DispatchResult dispatch(const Batch& b, const DispatchSettings& s, Platform p) {
  DispatchResult r;
  r.platform = p;
  r.method = select_method(b, s, p);
  r.resolved = resolve_method(p, r.method);
  const MethodImpl* impl = find_method_impl(r.resolved, p);
  r.implemented = impl != nullptr;
  if (!impl) {
    r.reason = platform_built(p)
                   ? fmt::format("{} is not implemented on platform {}", method_name(r.resolved), platform_name(p))
                   : fmt::format("platform {} is not built into this mla", platform_name(p));
    return r;
  }
  if (auto why = impl->cannot_serve(b)) {
    r.reason = *why;
    return r;
  }
  r.serves = true;
  return r;
}

}  // namespace mla
