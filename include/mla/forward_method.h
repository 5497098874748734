// mla/forward_method.h — the ways of computing DeepSeek attention, and the one table that says
// what each is: its name, which generic method it computes, which platform owns it, and what it
// needs of a batch. Parsing, printing, the implementation registry's capability check and the
// platforms' resolution tables all derive from that table.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "mla/platform.h"

namespace mla {

struct Batch;

enum class ForwardMethod {
  MHA,                  // decompress the new tokens' rows; causal attention over new tokens only
  MHA_ONE_SHOT,         // decompress prefix + new rows from the cache; one causal attention
  MHA_CHUNKED_KV,       // new-token attention, then prefix chunks merged by LSE
  MLA,                  // weight-absorbed attention over latent rows (one KV head)
  MHA_ROCM,             // the ROCm twins
  MHA_ONE_SHOT_ROCM,
  MHA_CHUNKED_KV_ROCM,
  MLA_ROCM,
  MLA_FUSED_ROPE_ROCM,  // decode only: RoPE applied inside the decode attention kernel
};

// What a method needs of a batch (beyond what validate_batch checks for every method).
enum class MethodNeed {
  ANY_BATCH,
  NO_PREFIX,         // attends to the new tokens only (MHA and its twins)
  DECODE_ONE_TOKEN,  // DECODE mode, one new token per request
};

struct MethodInfo {
  ForwardMethod method;
  std::string_view name;            // the enum name, e.g. "MHA_ONE_SHOT"
  ForwardMethod generic;            // the generic method whose function it computes (itself if generic)
  std::optional<Platform> platform; // the platform that owns it; nullopt: generic, shared by all
  bool resolves_generic;            // the owner's resolution of `generic` (false for subtypes that
                                    // only a handler picks, like MLA_FUSED_ROPE_ROCM)
  MethodNeed need;
};

const std::vector<MethodInfo>& method_table();  // enum order
const MethodInfo& method_info(ForwardMethod m);

std::string_view method_name(ForwardMethod m);  // the enum name, e.g. "MHA_ONE_SHOT"
ForwardMethod parse_method(std::string_view s);  // throws Error listing the known names
const std::vector<ForwardMethod>& all_methods();
const std::vector<ForwardMethod>& generic_methods();  // MHA, MHA_ONE_SHOT, MHA_CHUNKED_KV, MLA
bool is_generic(ForwardMethod m);  // MHA, MHA_ONE_SHOT, MHA_CHUNKED_KV, MLA
// The weight-absorbed methods (MLA and what computes it): they read w_kc / w_vc.
bool uses_absorbed_weights(ForwardMethod m);
// The capability check: nullopt when `m` can serve the batch, else why not (one line).
std::optional<std::string> method_cannot_serve(ForwardMethod m, const Batch& b);

}  // namespace mla
