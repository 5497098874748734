// mla/forward_method.h — the ways of computing DeepSeek attention.
#pragma once
#include <string_view>
#include <vector>

namespace mla {

enum class ForwardMethod {
  MHA,                  // decompress the new tokens' rows; causal attention over new tokens only
  MHA_ONE_SHOT,         // decompress prefix + new rows from the cache; one causal attention
  MHA_CHUNKED_KV,       // new-token attention, then prefix chunks merged by LSE
  MLA,                  // weight-absorbed attention over latent rows (one KV head)
  MHA_ROCM,             // the ROCm twins (issue: ROCm platform)
  MHA_ONE_SHOT_ROCM,
  MHA_CHUNKED_KV_ROCM,
  MLA_ROCM,
  MLA_FUSED_ROPE_ROCM,  // decode only: RoPE applied inside the decode attention kernel
};

std::string_view method_name(ForwardMethod m);  // the enum name, e.g. "MHA_ONE_SHOT"
ForwardMethod parse_method(std::string_view s);  // throws Error listing the known names
const std::vector<ForwardMethod>& all_methods();
bool is_generic(ForwardMethod m);  // MHA, MHA_ONE_SHOT, MHA_CHUNKED_KV, MLA
// The weight-absorbed methods (MLA, MLA_ROCM, MLA_FUSED_ROPE_ROCM): they read w_kc / w_vc.
bool uses_absorbed_weights(ForwardMethod m);

}  // namespace mla
