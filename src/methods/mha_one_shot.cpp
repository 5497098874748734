// MHA_ONE_SHOT: read prefix + new rows back from the cache, decompress them all, one causal
// attention aligned bottom-right (query t of a request sees keys 0 .. prefix + t).
#include "methods/method.h"

namespace mla::methods {

void mha_one_shot_core(MethodContext& c) {
  Tensor rows = steps::read_rows(c, c.plan.kv_slots);  // [Σ seq, 576]
  steps::mha_attend(c, rows, c.plan.prefix_and_new(), c.o, c.lse);
}

}  // namespace mla::methods
