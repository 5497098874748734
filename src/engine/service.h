// src/engine/service.h — the engine as the server sees it: requests in, token events out.
//
// The contract between the engine wing (src/engine: request state, sampler, scheduler, radix
// prefix cache) and the HTTP server (src/server). The server includes this header and nothing
// else of the engine; the engine knows nothing of HTTP or of text (stop strings reach it as a
// callback, evaluated on the scheduler thread).
//
// Threads: one scheduler thread owns the model, the pool and the cache, and runs steps. submit(),
// abort(), metrics(), flush_cache() and shutdown() may be called from any thread and never wait for
// a step to finish (they enqueue and return; flush_cache's future tells when the flush is done).
// Callbacks run on the scheduler thread: they must be quick and must not call back into the
// Service except abort().
#pragma once
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mla/error.h"

namespace mla::engine {

// submit() when the waiting queue is at its bound: the server answers 503.
class QueueFullError : public Error {
 public:
  using Error::Error;
};

enum class FinishReason { NONE, STOP, LENGTH, ABORT };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "abort" ("" for NONE)

struct SamplingParams {
  double temperature = 1.0;  // 0: greedy
  double top_p = 1.0;        // (0, 1]
  int64_t top_k = 0;         // 0: off
  double min_p = 0.0;        // [0, 1]
  std::optional<uint64_t> seed;  // same seed, same prompt → same output
  double frequency_penalty = 0.0, presence_penalty = 0.0;  // [-2, 2], OpenAI semantics
  int64_t max_tokens = 16;   // new tokens, >= 1
  std::vector<int32_t> stop_token_ids;  // finish with STOP when one is sampled (it is reported)
  bool ignore_eos = false;   // eos_token_id of the model does not stop the request
  int64_t top_logprobs = -1; // -1: no logprobs; 0..20: the chosen token's logprob and this many
};

struct GenerateRequest {
  std::vector<int32_t> prompt;  // token ids, each in [0, vocab_size)
  SamplingParams params;
  int64_t n = 1;                // choices; they share the prompt's pages
  // Called after each sampled token of choice `index` with every token of that choice so far;
  // returns how many trailing tokens to drop from the reported output if it decides to stop
  // (a stop string matched), or -1 to go on. Optional. Tokens are reported as they are sampled,
  // so only the token just sampled can still be dropped: a drop reaching into tokens reported in
  // earlier updates leaves those reported (the caller holds back text that may start a stop
  // string). completion_tokens counts the reported tokens.
  std::function<int64_t(int64_t index, const std::vector<int32_t>& tokens)> stop_check;
};

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  // the top_logprobs alternatives, best first
};

// What one choice of a request did since the last update.
struct ChoiceUpdate {
  int64_t index = 0;
  std::vector<int32_t> new_tokens;
  std::vector<TokenLogprob> logprobs;  // one per new token when requested
  FinishReason finish = FinishReason::NONE;  // set once, on the choice's last update
};

struct RequestUpdate {
  std::vector<ChoiceUpdate> choices;
  bool finished = false;     // every choice has finished; no more updates follow
  std::string error;         // non-empty: the request failed (finished is true)
  int64_t prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0;  // totals so far
};

using RequestHandle = int64_t;

struct MetricsSnapshot {
  int64_t requests_running = 0, requests_waiting = 0;
  double kv_cache_usage = 0;  // used pages / all pages, in [0, 1]
  int64_t prefix_cache_queries = 0, prefix_cache_hits = 0;  // tokens queried, tokens hit
  int64_t prompt_tokens = 0, generation_tokens = 0;
  std::map<std::string, int64_t> steps_per_method;  // forward method name → steps
  int64_t decode_ahead_steps = 0;  // DECODE batches issued before the last one's tokens reached the host
  // The platform's step graphs (Ops::counters, Model::graphs_kept; zeros where it records none): a
  // capture costs a step's host time again, and a load whose batch sizes wander keeps recording.
  int64_t step_graph_captures = 0, step_graph_replays = 0, step_graphs_kept = 0;
  int64_t host_syncs = 0;  // waits of the host for the device (Ops StepCounters::host_syncs)
  // Histograms: bucket upper bounds (seconds) and cumulative counts, Prometheus style.
  struct Histogram {
    std::vector<double> bounds;
    std::vector<int64_t> counts;  // counts[i]: observations <= bounds[i]; one more for +Inf
    double sum = 0;
    int64_t count = 0;
  };
  Histogram time_to_first_token, inter_token_latency;
};

class Service {
 public:
  virtual ~Service() = default;
  // Queues the request. Throws Error (one line) when it is invalid (ids outside the vocabulary,
  // prompt + max_tokens past the context, bad sampling values) or the queue is full
  // (QueueFullError); nothing is queued then. `on_update` gets every update of this request.
  virtual RequestHandle submit(GenerateRequest req, std::function<void(const RequestUpdate&)> on_update) = 0;
  // Aborts the request within one step; its last update has finish ABORT and finished true.
  // Unknown or finished handles are ignored.
  virtual void abort(RequestHandle h) = 0;
  virtual MetricsSnapshot metrics() const = 0;
  // Drops every unlocked page of the prefix cache. The scheduler thread does it between two steps;
  // the future is ready once it is done and metrics() shows it, with the pages released (0 once
  // the thread has stopped).
  virtual std::shared_future<int64_t> flush_cache() = 0;
  // Stops taking requests; drain: finish what runs, else abort it. Returns when the scheduler
  // thread has stopped.
  virtual void shutdown(bool drain) = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int64_t max_context() const = 0;  // prompt + output tokens a request may reach
  virtual int32_t eos_token_id() const = 0;
};

// How the engine behind a Service runs (docs/engine.md).
struct ServiceOptions {
  std::string platform = "cpu";  // cpu | cuda | rocm
  std::string dtype = "f32";     // activations and weights: f32 | bf16 (| f64 on the CPU)
  std::string kv_dtype = "f32";  // latent KV pool: f32 | bf16 | fp8_e4m3fn
  std::string method = "auto";   // auto (the backend's handler per batch) or a method forced for all
  std::string backend;           // attention backend rules; empty: the platform's default
  int64_t page_size = 0;         // KV pool page; 0: the platform's (64 on cuda, which its kernels take; 16)
  int64_t kv_tokens = 65536;     // KV pool capacity in tokens, over all requests and the cache
  int64_t token_budget = 2048;   // tokens per scheduler step
  int64_t prefill_chunk = 512;   // chunked prefill (0: a prompt in one chunk)
  int64_t max_running = 64;      // sequences running at once
  int64_t max_queue = 1024;      // requests waiting; submit() past it throws QueueFullError
  bool prefix_cache = true;      // the radix prefix cache
  std::string policy = "fcfs";   // fcfs | lpm (longest prefix match first)
};

// Loads the HF checkpoint in `model_dir` (eos_token_id from generation_config.json, else
// config.json) and starts the scheduler thread. Throws Error (one line) for a bad option or model.
std::unique_ptr<Service> open_service(const std::string& model_dir, const ServiceOptions& opt);

// eos_token_id of the model folder's generation_config.json, else config.json (an id or a list:
// the first); -1 when neither names one inside [0, vocab_size).
int32_t read_eos_token_id(const std::string& model_dir, int64_t vocab_size);

}  // namespace mla::engine
