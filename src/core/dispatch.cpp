// Choosing a forward method: one small pure handler per attention backend (after sglang's
// attention_backend_handler.py), found by name, then a resolution table per platform.
#include "mla/dispatch.h"

#include <array>
#include <cstddef>

#include "mla/error.h"

namespace mla {

int64_t BatchSummary::sum_prefix() const {
  int64_t s = 0;
  for (int64_t v : prefix_lens) s += v;
  return s;
}

int64_t BatchSummary::sum_seq() const {
  int64_t s = 0;
  for (int64_t v : seq_lens) s += v;
  return s;
}

BatchSummary BatchSummary::of(const Batch& b) {
  BatchSummary s;
  s.mode = b.mode;
  s.prefix_lens.reserve(b.requests.size());
  s.seq_lens.reserve(b.requests.size());
  for (const BatchRequest& r : b.requests) {
    s.prefix_lens.push_back(r.prefix_len);
    s.seq_lens.push_back(r.prefix_len + r.new_len);
  }
  return s;
}

namespace {

// What a handler sees: the batch, the settings, and the facts derived from them once.
struct HandlerInput {
  const BatchSummary& batch;
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
ForwardMethod mla_subtype(const HandlerInput& in) {
  if (in.platform == Platform::ROCM && in.settings.fused_decode_rope &&
      in.batch.mode == ForwardMode::DECODE && in.backend == "aiter")
    return ForwardMethod::MLA_FUSED_ROPE_ROCM;
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

void validate(const BatchSummary& b, const DispatchSettings& s) {
  if (b.prefix_lens.size() != b.seq_lens.size())
    fail("batch summary has {} prefix lengths but {} sequence lengths", b.prefix_lens.size(),
         b.seq_lens.size());
  for (size_t i = 0; i < b.prefix_lens.size(); ++i) {
    int64_t prefix = b.prefix_lens[i], seq = b.seq_lens[i];
    if (prefix < 0) fail("request {}: prefix_len {} is negative", i, prefix);
    if (seq < 0) fail("request {}: seq_len {} is negative", i, seq);
    if (prefix > seq) fail("request {}: prefix_len {} exceeds seq_len {}", i, prefix, seq);
  }
  if (s.chunked_prefix_threshold <= 0)
    fail("chunked_prefix_threshold must be positive, got {}", s.chunked_prefix_threshold);
  if (s.chunk_capacity <= 0) fail("chunk_capacity must be positive, got {}", s.chunk_capacity);
}

// Resolution tables, indexed by the ForwardMethod's value.
constexpr size_t kNumMethods = 9;
using MethodTable = std::array<ForwardMethod, kNumMethods>;

constexpr MethodTable kIdentity = {
    ForwardMethod::MHA,
    ForwardMethod::MHA_ONE_SHOT,
    ForwardMethod::MHA_CHUNKED_KV,
    ForwardMethod::MLA,
    ForwardMethod::MHA_ROCM,
    ForwardMethod::MHA_ONE_SHOT_ROCM,
    ForwardMethod::MHA_CHUNKED_KV_ROCM,
    ForwardMethod::MLA_ROCM,
    ForwardMethod::MLA_FUSED_ROPE_ROCM,
};

constexpr bool is_identity(const MethodTable& t) {
  for (size_t i = 0; i < t.size(); ++i)
    if (t[i] != ForwardMethod(i)) return false;
  return true;
}
static_assert(is_identity(kIdentity), "kIdentity must list ForwardMethod in enum order");
static_assert(size_t(ForwardMethod::MLA_FUSED_ROPE_ROCM) + 1 == kNumMethods,
              "resolution tables must cover every ForwardMethod");

constexpr MethodTable kCpuTable = kIdentity;
constexpr MethodTable kCudaTable = kIdentity;
constexpr MethodTable kRocmTable = {
    ForwardMethod::MHA_ROCM,             // MHA
    ForwardMethod::MHA_ONE_SHOT_ROCM,    // MHA_ONE_SHOT
    ForwardMethod::MHA_CHUNKED_KV_ROCM,  // MHA_CHUNKED_KV
    ForwardMethod::MLA_ROCM,             // MLA
    ForwardMethod::MHA_ROCM,             // the ROCm members map to themselves
    ForwardMethod::MHA_ONE_SHOT_ROCM,
    ForwardMethod::MHA_CHUNKED_KV_ROCM,
    ForwardMethod::MLA_ROCM,
    ForwardMethod::MLA_FUSED_ROPE_ROCM,
};

const MethodTable& resolution_table(Platform p) {
  switch (p) {
    case Platform::CPU: return kCpuTable;
    case Platform::CUDA: return kCudaTable;
    case Platform::ROCM: return kRocmTable;
  }
  fail("unknown platform value {}", int(p));
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

ForwardMethod select_method(const BatchSummary& b, const DispatchSettings& s, Platform p) {
  const std::string backend = s.backend.empty() ? default_backend(p) : s.backend;
  Handler handler = find_handler(backend);
  if (!handler)
    fail("unknown attention backend '{}' (known: {})", backend, joined_backend_names());
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
  const MethodTable& t = resolution_table(p);
  size_t i = size_t(m);
  if (i >= t.size()) fail("unknown forward method value {}", int(m));
  return t[i];
}

}  // namespace mla
