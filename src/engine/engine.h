// src/engine/engine.h — the engine loop: requests with their token ids, batches through the model and
// the latent KV pool, prefill (optionally chunked) then decode.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "mla/kv_pool.h"
#include "mla/model.h"
#include "mla/sampling.h"

namespace mla {

struct EngineOptions {
  ForwardOptions forward;
  DType kv_dtype = DType::F32;
  int64_t page_size = 16;
  int64_t max_tokens = 4096;  // pool capacity in tokens, over all live requests
};

// One request's part of a batch: its new tokens, appended after what it already holds.
struct StepRequest {
  RequestId id = 0;
  std::vector<int32_t> ids;
};

struct StepResult {
  // [Σ new tokens, vocab_size], request after request; with last_only, [requests, vocab_size]:
  // the row of each request's last new token.
  std::vector<float> logits;
  // With greedy: instead of logits, each request's greedy token (argmax of its last row, computed
  // on the platform: only these ids leave it).
  std::vector<int32_t> greedy;
  // With sample rows: instead of logits, each request's token drawn by Ops::sample_rows from its
  // last row with its SampleRow (on the platform: only these ids leave it).
  std::vector<int32_t> sampled;
  ForwardMethod method = ForwardMethod::MLA;
};

class Engine {
 public:
  Engine(Model& model, const EngineOptions& opt);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;
  const KVPool& pool() const { return *pool_; }
  KVPool& pool() { return *pool_; }  // the scheduler and the prefix cache share pages through it
  Model& model() const { return model_; }
  const EngineOptions& options() const { return opt_; }
  // The method `b` would run by (the handlers and the resolution, exactly as step() chooses).
  ForwardMethod method_for(const Batch& b) const { return model_.choose_method(b, opt_.forward); }

  // Runs one batch. Checks everything first (ids, modes, pool space); on Error nothing changed.
  // `sample` (one SampleRow per request, with last_only, not with greedy): the platform draws each
  // request's token from its last row (StepResult::sampled) and no logits come back.
  StepResult step(ForwardMode mode, const std::vector<StepRequest>& reqs, bool last_only = false,
                  bool greedy = false, const std::vector<SampleRow>* sample = nullptr);
  // Decode with the host a step ahead of the device (tp 1). decode_launch checks, plans and issues
  // a DECODE step of one token per request, greedy or drawn with `sample`, and returns while the
  // platform runs it; finish() waits for its tokens. A request that gives no ids takes the token
  // `after` (a launched step, finished or not) drew for it, still on the device: so step N + 1 is
  // planned and issued before step N's tokens reach the host. Requests of `after` may be left out,
  // others join with their id. The requests' lengths count a step from its launch. An InFlight must
  // not outlive the engine.
  struct InFlight {
    std::vector<RequestId> requests;
    Tensor ids;                            // [requests] I32 on the platform: the step's tokens
    std::unique_ptr<Ops::HostCopy> copy;  // their way to the host (null once finished)
    ForwardMethod method = ForwardMethod::MLA;
  };
  InFlight decode_launch(const std::vector<StepRequest>& reqs, const InFlight* after = nullptr,
                         const std::vector<SampleRow>* sample = nullptr);
  std::vector<int32_t> finish(InFlight& f);
  // Whether decode_launch can take ids from a step before: tp 1 (the ranks' ids travel by host).
  bool decodes_ahead() const { return !send_ && model_.tp_size() == 1; }
  // Tokens request `id` holds (0 if unknown).
  int64_t length(RequestId id) const;
  void release(RequestId id);  // frees every slot of the request
  // Creates request `id` holding the whole pages `shared` (held by another request or the prefix
  // cache) as its first shared.size() · page_size tokens (KVPool::adopt).
  void adopt(RequestId id, const std::vector<int32_t>& shared);

  // One request, whole: prefill ids[0, decode_from) in chunks of `prefill_chunk` (0: one chunk)
  // in EXTEND mode, then ids[decode_from, ...) one at a time in DECODE mode. Returns the logits
  // of every position [ids.size(), vocab_size] and the method of each batch. Releases the request.
  struct Run {
    std::vector<float> logits;
    std::vector<ForwardMethod> methods;
  };
  Run run_sequence(const std::vector<int32_t>& ids, int64_t prefill_chunk, int64_t decode_from);

  // Tensor parallelism: every rank runs every forward, so their collectives meet. Rank 0's engine
  // (the one the scheduler drives) leads: it sends each forward it is about to run — token ids,
  // the whole plan (positions, cache slots, segments), the method it chose, the logit rows — through
  // `send` (a broadcast to the other ranks), and a last message when it is destroyed. The others
  // follow(): they run those forwards on their shards and their own pools, at the same slots
  // (their pools are only storage: page bookkeeping, the prefix cache and sampling live on rank 0).
  void lead(std::function<void(const std::string&)> send);
  // Runs the leader's forwards from `receive` until its last message; returns how many. Throws
  // Error when a forward cannot run here or this rank's handlers choose another method than the
  // leader's (ranks must agree; the caller ends the process, which takes the group down).
  int64_t follow(const std::function<std::string()>& receive);

 private:
  Model& model_;
  EngineOptions opt_;
  std::unique_ptr<KVPool> pool_;
  // Checks and plans a batch, runs the model on it, counts its tokens (step and decode_launch).
  ModelOutput forward(ForwardMode mode, const std::vector<StepRequest>& reqs, bool last_only,
                      const DeviceIds* device_ids);
  // Each row's token on the platform: drawn with `sample`, or the greedy one (null). [rows] I32.
  Tensor pick(const Tensor& logits, const std::vector<SampleRow>* sample);
  std::map<RequestId, int64_t> lengths_;
  std::function<void(const std::string&)> send_;  // lead(): to the other ranks
};

}  // namespace mla
