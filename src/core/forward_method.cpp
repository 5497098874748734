// Forward methods: the table, and everything derived from it.
#include "mla/forward_method.h"

#include <fmt/format.h>

#include "mla/batch.h"
#include "mla/error.h"

namespace mla {

namespace {
using FM = ForwardMethod;
constexpr std::optional<Platform> kShared = std::nullopt;
}  // namespace

const std::vector<MethodInfo>& method_table() {
  static const std::vector<MethodInfo> table = {
      // method                  name                   generic            owner           resolves  need
      {FM::MHA,                  "MHA",                 FM::MHA,            kShared,        true,  MethodNeed::NO_PREFIX},
      {FM::MHA_ONE_SHOT,         "MHA_ONE_SHOT",        FM::MHA_ONE_SHOT,   kShared,        true,  MethodNeed::ANY_BATCH},
      {FM::MHA_CHUNKED_KV,       "MHA_CHUNKED_KV",      FM::MHA_CHUNKED_KV, kShared,        true,  MethodNeed::ANY_BATCH},
      {FM::MLA,                  "MLA",                 FM::MLA,            kShared,        true,  MethodNeed::ANY_BATCH},
      {FM::MHA_ROCM,             "MHA_ROCM",            FM::MHA,            Platform::ROCM, true,  MethodNeed::ANY_BATCH},
      {FM::MHA_ONE_SHOT_ROCM,    "MHA_ONE_SHOT_ROCM",   FM::MHA_ONE_SHOT,   Platform::ROCM, true,  MethodNeed::ANY_BATCH},
      {FM::MHA_CHUNKED_KV_ROCM,  "MHA_CHUNKED_KV_ROCM", FM::MHA_CHUNKED_KV, Platform::ROCM, true,  MethodNeed::ANY_BATCH},
      {FM::MLA_ROCM,             "MLA_ROCM",            FM::MLA,            Platform::ROCM, true,  MethodNeed::ANY_BATCH},
      {FM::MLA_FUSED_ROPE_ROCM,  "MLA_FUSED_ROPE_ROCM", FM::MLA,            Platform::ROCM, false, MethodNeed::DECODE_ONE_TOKEN},
  };
  return table;
}

const MethodInfo& method_info(ForwardMethod m) {
  const auto& t = method_table();
  const size_t i = size_t(m);
  if (i >= t.size() || t[i].method != m) fail("unknown forward method value {}", int(m));
  return t[i];
}

std::string_view method_name(ForwardMethod m) { return method_info(m).name; }

const std::vector<ForwardMethod>& all_methods() {
  static const std::vector<ForwardMethod> methods = [] {
    std::vector<ForwardMethod> v;
    for (const MethodInfo& i : method_table()) v.push_back(i.method);
    return v;
  }();
  return methods;
}

const std::vector<ForwardMethod>& generic_methods() {
  static const std::vector<ForwardMethod> methods = [] {
    std::vector<ForwardMethod> v;
    for (const MethodInfo& i : method_table())
      if (i.generic == i.method) v.push_back(i.method);
    return v;
  }();
  return methods;
}

ForwardMethod parse_method(std::string_view s) {
  for (const MethodInfo& i : method_table())
    if (s == i.name) return i.method;
  std::string known;
  for (const MethodInfo& i : method_table()) known += fmt::format("{}{}", known.empty() ? "" : ", ", i.name);
  fail("unknown forward method '{}' (known: {})", s, known);
}

bool is_generic(ForwardMethod m) { return method_info(m).generic == m; }

bool uses_absorbed_weights(ForwardMethod m) { return method_info(m).generic == ForwardMethod::MLA; }

std::optional<std::string> method_cannot_serve(ForwardMethod m, const Batch& b) {
  const MethodInfo& info = method_info(m);
  switch (info.need) {
    case MethodNeed::ANY_BATCH: return std::nullopt;
    case MethodNeed::NO_PREFIX:
      for (const BatchRequest& r : b.requests)
        if (r.prefix_len > 0)
          return fmt::format("{} attends only to the new tokens, and request {} has a prefix of {} tokens",
                             info.name, r.id, r.prefix_len);
      return std::nullopt;
    case MethodNeed::DECODE_ONE_TOKEN:
      if (b.mode != ForwardMode::DECODE)
        return fmt::format("{} serves decode batches only, not {}", info.name, mode_name(b.mode));
      for (const BatchRequest& r : b.requests)
        if (r.new_len != 1)
          return fmt::format("{} decodes one token per request, and request {} has {}", info.name, r.id, r.new_len);
      return std::nullopt;
  }
  return std::nullopt;
}

}  // namespace mla
