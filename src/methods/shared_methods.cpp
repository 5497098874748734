// The shared methods' entries for the registry: one step sequence each, run through the Ops of
// whichever platform registers them.
#include "methods/method.h"
#include "platform/registry.h"

namespace mla::methods {

void add_shared_methods(std::vector<MethodImpl>& r, Platform p) {
  r.push_back({ForwardMethod::MHA, p, steps::prepare_latent, mha_core});
  r.push_back({ForwardMethod::MHA_ONE_SHOT, p, steps::prepare_latent, mha_one_shot_core});
  r.push_back({ForwardMethod::MHA_CHUNKED_KV, p, steps::prepare_latent, mha_chunked_kv_core});
  r.push_back({ForwardMethod::MLA, p, steps::prepare_absorbed, mla_core});
}

}  // namespace mla::methods
