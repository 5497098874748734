// MHA_CHUNKED_KV (and the schedule its ROCm twin shares): causal attention over the new tokens, then the prefix in chunks of
// chunk_capacity / num_requests tokens per request, each attended without a mask and merged by
// the natural-log LSE merge. Memory stays bounded by the chunk capacity.
#include <algorithm>

#include "methods/method.h"

namespace mla {

void steps::chunked_kv(MethodContext& c, AttendFn attend) {
  const BatchPlan& plan = c.plan;
  attend(c, c.kva, plan.new_only(), c.o, c.lse);
  const auto& reqs = plan.batch.requests;
  if (reqs.empty()) return;
  const int64_t chunk = std::max<int64_t>(1, c.settings.chunk_capacity / int64_t(reqs.size()));
  int64_t longest = 0;
  for (const BatchRequest& r : reqs) longest = std::max(longest, r.prefix_len);
  for (int64_t begin = 0; begin < longest; begin += chunk) {
    AttnSegments seg;
    seg.causal = false;
    std::vector<int32_t> slots;
    for (size_t i = 0; i < reqs.size(); ++i) {
      const int64_t b = std::min(begin, reqs[i].prefix_len);
      const int64_t e = std::min(begin + chunk, reqs[i].prefix_len);  // empty once the prefix ran out
      seg.q_start.push_back(plan.q_start[i]);
      seg.q_len.push_back(reqs[i].new_len);
      seg.k_start.push_back(int64_t(slots.size()));
      seg.k_len.push_back(e - b);
      auto first = plan.kv_slots.begin() + plan.kv_start[i];
      slots.insert(slots.end(), first + b, first + e);
    }
    Tensor rows = steps::read_rows(c, slots);  // [Σ chunk, 576]
    Tensor o_chunk, lse_chunk;
    attend(c, rows, seg, o_chunk, lse_chunk);
    c.ops.merge(c.o, c.lse, o_chunk, lse_chunk);
  }
}

void methods::mha_chunked_kv_core(MethodContext& c) { steps::chunked_kv(c, steps::mha_attend); }

}  // namespace mla
