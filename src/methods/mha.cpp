// MHA: decompress the new tokens' rows; causal attention over the new tokens only (no prefix).
#include "methods/method.h"

namespace mla::methods {

void mha_core(MethodContext& c) { steps::mha_attend(c, c.kva, c.plan.new_only(), c.o, c.lse); }

}  // namespace mla::methods
