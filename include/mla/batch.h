// mla/batch.h — a batch of requests for one forward pass, and its plan against the KV pool.
#pragma once
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "mla/kv_pool.h"

namespace mla {

enum class ForwardMode { EXTEND, DECODE, TARGET_VERIFY, DRAFT_EXTEND, IDLE };
std::string_view mode_name(ForwardMode m);  // "extend", "decode", ...
ForwardMode parse_mode(std::string_view s);  // throws Error listing the known names

struct BatchRequest {
  RequestId id = 0;
  int64_t prefix_len = 0;  // tokens already in the cache
  int64_t new_len = 0;     // tokens computed in this batch, at positions prefix_len + i
};

struct Batch {
  ForwardMode mode = ForwardMode::EXTEND;
  std::vector<BatchRequest> requests;

  int64_t num_tokens() const;   // Σ new_len
  int64_t sum_prefix() const;   // Σ prefix_len
  int64_t sum_seq() const;      // Σ (prefix_len + new_len)
  std::vector<int64_t> prefix_lens() const;
  std::vector<int64_t> seq_lens() const;

  // The one constructor from lengths: requests 0, 1, ... with (prefix_len, new_len) each. Throws
  // Error naming the request when a length is negative.
  static Batch from_lengths(ForwardMode mode, const std::vector<std::pair<int64_t, int64_t>>& prefix_and_new);
  // The same from prefix and sequence (prefix + new) lengths, as handlers and the CLI state them;
  // also an Error when the lists differ in length or a prefix exceeds its sequence.
  static Batch from_seq_lens(ForwardMode mode, const std::vector<int64_t>& prefix_lens,
                             const std::vector<int64_t>& seq_lens);
};

// Checks a batch alone: lengths >= 0, unique ids, and per mode: DECODE has one new token per
// request, TARGET_VERIFY the same number (>= 1) for all, IDLE no tokens. Throws Error naming the
// request and field at fault.
void validate_batch(const Batch& b);

// Ragged attention segments: request r's queries [q_start, q_start + q_len) attend keys
// [k_start, k_start + k_len). Causal masks align bottom-right: query i sees keys j <= k_len - q_len + i.
struct AttnSegments {
  std::vector<int64_t> q_start, q_len, k_start, k_len;
  bool causal = true;
  int64_t num_requests() const { return int64_t(q_len.size()); }
  int64_t total_q() const;
  int64_t total_k() const;
};

// Everything the methods need about a batch, computed once from the batch and the pool.
struct BatchPlan {
  Batch batch;
  int64_t num_tokens = 0;              // T = Σ new_len
  std::vector<int64_t> q_start;        // per request: first row of its new tokens in [T, ...]
  std::vector<int32_t> positions;      // [T] prefix_len + i
  std::vector<int32_t> new_slots;      // [T] cache slots of the new tokens
  std::vector<int32_t> kv_slots;       // [Σ seq] slots of prefix + new tokens, request after request
  std::vector<int64_t> kv_start;       // per request: offset into kv_slots
  // The two segment sets, built once by plan_batch: the same objects every layer (a platform that
  // uploaded them for a step recognises them).
  AttnSegments seg_new_only;           // new tokens attend to new tokens (causal)
  AttnSegments seg_prefix_and_new;     // new tokens attend to prefix + new (causal, bottom-right)
  const AttnSegments& new_only() const { return seg_new_only; }
  const AttnSegments& prefix_and_new() const { return seg_prefix_and_new; }
  // The longest request (prefix + new tokens) rounded up to a power of two, and how full the
  // batch's rectangle of keys is (kv_fill below): the two lengths a platform's launch choices for
  // the step may depend on (Ops step graphs: the fill through Ops::launch_class).
  int64_t kv_bucket() const;
  int32_t kv_fill() const;
};

int64_t kv_bucket(int64_t longest);  // the power of two ≥ longest (1 for 0)
// The keys of `requests` requests (`keys` in all, the longest `longest`) over requests × longest,
// in eighths rounded down, at least 1: 8 when every request is as long as the longest, 4 for
// lengths spread evenly from 0 to the longest, 1 for one long request among many short. 8 for an
// empty batch.
int32_t kv_fill(int64_t keys, int64_t requests, int64_t longest);

// Validates the batch and its fit in the pool (every request reserved for prefix + new tokens).
BatchPlan plan_batch(const Batch& b, const KVPool& pool);
// The same plan from the requests' cache pages (pages[i]: request i's, page_size slots each, in
// token order), as a tensor-parallel follower rebuilds it from rank 0's step message: plan_batch
// is this on the pool's page tables. Error when a request's pages hold fewer tokens than it needs.
BatchPlan plan_batch_on_pages(const Batch& b, int64_t page_size, const std::vector<const std::vector<int32_t>*>& pages);

}  // namespace mla
