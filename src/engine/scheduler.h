// src/engine/scheduler.h — continuous batching over the Engine: request state, admission against
// the pool, chunked prefill, decode, retraction, the prefix cache, sampling and metrics.
//
// One step is one or more batches, each of one ForwardMode (the handlers and the resolution choose
// its method exactly as for a hand-built batch): first one DECODE batch of every sequence that has a
// token to decode, then EXTEND batches of prefill chunks within the step's token budget. A DECODE
// batch whose tokens the platform picks runs a step ahead (Engine::decode_launch): it is issued
// before the last one's tokens reach the host, and its sequences' tokens arrive in the next step.
// Extend items are grouped so that every item runs by the method it would run by alone (see
// docs/engine.md: what is batch-invariant). Single-threaded: the Service runs it on its scheduler
// thread; the CLI and the tests drive it directly.
#pragma once
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "engine/engine.h"
#include "engine/radix_cache.h"
#include "engine/service.h"

namespace mla::engine {

enum class Policy { FCFS, LPM };  // first come first served; longest prefix match first
Policy parse_policy(const std::string& s);  // "fcfs" | "lpm"

struct SchedulerOptions {
  int64_t token_budget = 2048;  // tokens per step: decodes + prefill chunks (one chunk may exceed it
                                // when no other chunk runs in the step, so every step progresses)
  int64_t prefill_chunk = 512;  // prefill chunk boundaries every this many tokens (0: whole prompt)
  int64_t max_running = 64;     // sequences admitted at once
  int64_t max_queue = 1024;     // requests waiting for admission (Service: QueueFullError past it)
  bool prefix_cache = true;
  Policy policy = Policy::FCFS;
  int64_t decode_reserve = 16;  // tokens past the prompt a sequence's admission reserves
  int32_t eos_token_id = -1;    // -1: none
  int64_t max_choices = 16;     // n per request
  // Sequences without penalties, logprobs or logits hook draw their tokens on the platform
  // (Ops::sample_rows) when every sequence sampling in the batch does; else the host samples.
  bool device_sampling = true;
  // DECODE batches whose tokens the platform picks (greedy or device_sampling) run a step ahead
  // (tp 1): the host plans and issues step N + 1 while step N runs. A sequence that stops then
  // finishes one step late, its extra token dropped; the tokens are those of step-by-step decoding.
  bool decode_ahead = true;
  int64_t cpu_threads = 0;      // Service: OpenMP threads of the scheduler thread (0: the default)
  // Called after every batch with its mode, method and new tokens (the CLI's method list).
  std::function<void(ForwardMode, ForwardMethod, int64_t)> on_batch;
};

// Called with the raw logits [vocab] of every position a choice samples from (tests, the CLI).
using LogitsHook = std::function<void(int64_t index, const float* logits, int64_t vocab)>;

struct SchedulerStats {
  int64_t prefix_cache_queries = 0, prefix_cache_hits = 0;
  int64_t prompt_tokens = 0, generation_tokens = 0;
  int64_t retractions = 0, steps = 0;
  int64_t ahead_batches = 0;  // DECODE batches issued a step ahead (of steps_per_method's)
  std::map<std::string, int64_t> steps_per_method;  // batches run by each method
  MetricsSnapshot::Histogram time_to_first_token, inter_token_latency;
};

class Scheduler {
 public:
  Scheduler(Engine& engine, const SchedulerOptions& opt);
  ~Scheduler();  // drops every request (no updates) and the cache
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Throws Error (one line) if the request is invalid: empty prompt, ids outside the vocabulary,
  // prompt + max_tokens past max_context(), a sequence the pool cannot hold, bad sampling values.
  // Thread-safe (reads only what never changes).
  void validate(const GenerateRequest& r) const;
  // Queues a request under `handle` (unique, chosen by the caller). Validates it first.
  void add(RequestHandle handle, GenerateRequest r, std::function<void(const RequestUpdate&)> on_update,
           LogitsHook hook = {});
  // Aborts now: pages freed, last update with ABORT. Unknown or finished handles are ignored.
  void abort(RequestHandle handle);
  void abort_all();
  // Runs one step (admission, batches, sampling, updates). Returns false if there was nothing to do.
  bool step();
  bool idle() const { return requests_.empty(); }
  int64_t flush_cache();  // evicts every unlocked page of the cache; returns the pages released

  int64_t waiting_requests() const;  // requests none of whose choices was admitted yet
  int64_t running_sequences() const { return int64_t(running_.size()); }
  const SchedulerStats& stats() const { return stats_; }
  const RadixCache* cache() const { return cache_.get(); }
  const Engine& engine() const { return engine_; }
  const SchedulerOptions& options() const { return opt_; }
  int64_t max_context() const;
  double kv_cache_usage() const;  // used pages / all pages

 private:
  using Clock = std::chrono::steady_clock;
  struct Request;
  enum class State { WAITING, FORK_PENDING, RUNNING, FINISHED };
  struct Seq {
    Request* req = nullptr;
    int64_t index = 0;
    RequestId pool_id = 0;
    State state = State::WAITING;
    std::vector<int32_t> tokens;  // prompt + generated
    int64_t prompt_len = 0, generated = 0, reported = 0;
    int64_t computed = 0;      // tokens whose KV is in the pool
    int64_t prefill_end = 0;   // tokens computed by EXTEND chunks (then DECODE one at a time)
    int64_t chunk_origin = 0;  // chunk boundaries at chunk_origin + k · prefill_chunk
    RadixCache::Node* lock = nullptr;
    uint64_t admit_order = 0;
    std::unordered_map<int32_t, int64_t> counts;
    FinishReason finish = FinishReason::NONE;
    Clock::time_point last_token;
    bool ahead = false;  // in ahead_: its next token is still on the platform (then computed == tokens.size())
  };
  struct Request {
    RequestHandle handle = 0;
    GenerateRequest r;
    std::function<void(const RequestUpdate&)> on_update;
    LogitsHook hook;
    uint64_t seed = 0;
    std::vector<std::unique_ptr<Seq>> seqs;
    int64_t cached_tokens = 0, finished = 0;
    bool admitted = false, first_token = false;
    std::string error;  // a batch of this request failed
    Clock::time_point submitted;
    std::map<int64_t, ChoiceUpdate> pending;  // this step's updates, by choice
  };
  struct Item {  // one sequence's part of a batch
    Seq* seq;
    int64_t begin, end;
  };
  struct Group {  // items that run as one batch, by `method`
    ForwardMethod method;
    std::vector<Item*> items;
  };
  struct Ahead {  // a DECODE batch issued a step ahead: its tokens are still on the platform
    Engine::InFlight f;
    std::vector<Seq*> seqs;  // its rows; null where the sequence left since (finished, retracted)
  };

  void admit(int64_t budget);  // admits while the step's prefill budget lasts
  void cache_progress(Seq& s);
  void fork_choices(Seq& parent);
  int64_t pages_to_hold(const Seq& s, int64_t tokens) const;  // more pages s needs to hold `tokens`
  int64_t chunk_end(const Seq& s) const;
  // Each item with the method it would run by alone, in groups that keep it (run_items' batches).
  std::vector<Group> group_items(ForwardMode mode, std::vector<Item>& items) const;
  void run_items(ForwardMode mode, std::vector<Item>& items);
  // Whether the DECODE items can run a step ahead, and then whether greedy (else sampled on the platform).
  bool decodes_ahead(std::vector<Item>& items, bool& greedy) const;
  void launch_ahead(std::vector<Item>& items, bool greedy);  // then takes the batch it follows
  void take(Ahead& a);     // waits for a's tokens; each sequence still running samples its own
  void drain_ahead();      // takes ahead_, if any
  void forget_ahead(Seq& s);  // s leaves ahead_: its token there is dropped
  void count_batch(ForwardMode mode, ForwardMethod method, int64_t tokens);
  void fail_request(Request& q, const std::string& why);  // a batch of q failed: every choice ends
  static bool wants_greedy_only(const Request& q);  // greedy, no penalties, no logprobs, no hook
  static bool wants_row_only(const Request& q);     // no penalties, no logprobs, no hook
  // The next token of `s` from its logits row, or (logits null) the token the platform chose.
  void sample(Seq& s, const float* logits, int32_t greedy_token = -1);
  void finish_seq(Seq& s, FinishReason why);
  void retract(Seq& s);
  void let_go(Seq& s);  // cache insert, unlock, pool release
  void flush_updates();
  Seq* newest_running();

  Engine& engine_;
  SchedulerOptions opt_;
  std::unique_ptr<RadixCache> cache_;
  int64_t vocab_ = 0, ps_ = 0;
  std::map<RequestHandle, std::unique_ptr<Request>> requests_;
  std::deque<Seq*> waiting_;
  std::vector<Seq*> running_;  // in admission order
  std::optional<Ahead> ahead_;
  RequestId next_pool_id_ = 1;
  uint64_t next_admit_ = 0;
  SchedulerStats stats_;
};

}  // namespace mla::engine
