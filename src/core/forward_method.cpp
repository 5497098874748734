// Forward methods: names, parsing and classification.
#include "mla/forward_method.h"

#include <string>

#include "mla/error.h"

namespace mla {

std::string_view method_name(ForwardMethod m) {
  switch (m) {
    case ForwardMethod::MHA: return "MHA";
    case ForwardMethod::MHA_ONE_SHOT: return "MHA_ONE_SHOT";
    case ForwardMethod::MHA_CHUNKED_KV: return "MHA_CHUNKED_KV";
    case ForwardMethod::MLA: return "MLA";
    case ForwardMethod::MHA_ROCM: return "MHA_ROCM";
    case ForwardMethod::MHA_ONE_SHOT_ROCM: return "MHA_ONE_SHOT_ROCM";
    case ForwardMethod::MHA_CHUNKED_KV_ROCM: return "MHA_CHUNKED_KV_ROCM";
    case ForwardMethod::MLA_ROCM: return "MLA_ROCM";
    case ForwardMethod::MLA_FUSED_ROPE_ROCM: return "MLA_FUSED_ROPE_ROCM";
  }
  return "?";
}

const std::vector<ForwardMethod>& all_methods() {
  // Enum order.
  static const std::vector<ForwardMethod> methods = {
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
  return methods;
}

ForwardMethod parse_method(std::string_view s) {
  for (ForwardMethod m : all_methods())
    if (s == method_name(m)) return m;
  std::string known;
  for (ForwardMethod m : all_methods()) {
    if (!known.empty()) known += ", ";
    known += method_name(m);
  }
  fail("unknown forward method '{}' (known: {})", s, known);
}

bool is_generic(ForwardMethod m) {
  return m == ForwardMethod::MHA || m == ForwardMethod::MHA_ONE_SHOT ||
         m == ForwardMethod::MHA_CHUNKED_KV || m == ForwardMethod::MLA;
}

bool uses_absorbed_weights(ForwardMethod m) {
  return m == ForwardMethod::MLA || m == ForwardMethod::MLA_ROCM || m == ForwardMethod::MLA_FUSED_ROPE_ROCM;
}

}  // namespace mla
