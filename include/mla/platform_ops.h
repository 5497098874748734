// mla/platform_ops.h — making a platform's Ops.
#pragma once
#include <memory>

#include "mla/ops.h"

namespace mla {

// Ops of `p` storing activations and weights in `act`. CPU: F64 (the float64 reference flavour),
// F32 or BF16 (the fast flavour, f32 accumulation). Throws Error naming the pair when this build
// has no such ops.
std::unique_ptr<Ops> make_ops(Platform p, DType act);

}  // namespace mla
