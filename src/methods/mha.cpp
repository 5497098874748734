// MHA: decompress the new tokens' rows; causal attention over the new tokens only (no prefix).
#include <fmt/format.h>

#include "methods/method.h"

namespace mla::methods {

std::optional<std::string> mha_cannot_serve(const Batch& b) {
  for (const BatchRequest& r : b.requests)
    if (r.prefix_len > 0)
      return fmt::format("MHA attends only to the new tokens, and request {} has a prefix of {} tokens",
                         r.id, r.prefix_len);
  return std::nullopt;
}

void mha_core(MethodContext& c) { steps::mha_attend(c, c.kva, c.plan.new_only(), c.o, c.lse); }

}  // namespace mla::methods
