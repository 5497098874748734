// src/engine/service.cpp — the Service: one scheduler thread over a Scheduler; submit, abort,
// flush and shutdown enqueue commands that the thread applies between steps.
#include <atomic>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>
#include <omp.h>

#include "engine/service_impl.h"
#include "mla/error.h"
#include "mla/platform_ops.h"

namespace mla::engine {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::STOP: return "stop";
    case FinishReason::LENGTH: return "length";
    case FinishReason::ABORT: return "abort";
    case FinishReason::NONE: break;
  }
  return "";
}

namespace {

class ServiceImpl : public Service {
 public:
  ServiceImpl(Engine& engine, const SchedulerOptions& opt) : sched_(engine, opt) {
    publish();
    thread_ = std::thread([this] { loop(); });
  }
  ~ServiceImpl() override { shutdown(false); }

  RequestHandle submit(GenerateRequest req, std::function<void(const RequestUpdate&)> on_update) override {
    sched_.validate(req);  // reads only what never changes
    std::lock_guard lk(mu_);
    if (stopping_) fail("the engine is shutting down");
    if (int64_t(pending_.size()) + waiting_ >= sched_.options().max_queue)
      throw QueueFullError(fmt::format("the request queue is full ({} waiting)", sched_.options().max_queue));
    const RequestHandle h = next_handle_++;
    pending_.push_back({h, std::move(req), std::move(on_update)});
    cv_.notify_all();
    return h;
  }
  void abort(RequestHandle h) override {
    std::lock_guard lk(mu_);
    aborts_.push_back(h);
    cv_.notify_all();
  }
  MetricsSnapshot metrics() const override {
    std::lock_guard lk(mu_);
    MetricsSnapshot m = snapshot_;
    m.requests_waiting += int64_t(pending_.size());
    return m;
  }
  std::shared_future<int64_t> flush_cache() override {
    std::lock_guard lk(mu_);
    std::promise<int64_t> done;
    std::shared_future<int64_t> f = done.get_future().share();
    if (stopped_) {
      done.set_value(0);
      return f;
    }
    flushes_.push_back(std::move(done));
    cv_.notify_all();
    return f;
  }
  void shutdown(bool drain) override {
    {
      std::lock_guard lk(mu_);
      if (!stopping_) {
        stopping_ = true;
        drain_ = drain;
      } else if (!drain) {
        drain_ = false;  // a later shutdown(false) turns a drain into an abort
      }
      cv_.notify_all();
    }
    std::lock_guard join_lk(join_mu_);
    if (thread_.joinable()) thread_.join();
  }
  int64_t vocab_size() const override { return sched_.engine().model().config().vocab_size; }
  int64_t max_context() const override { return sched_.max_context(); }
  int32_t eos_token_id() const override { return sched_.options().eos_token_id; }

 private:
  struct Pending {
    RequestHandle h;
    GenerateRequest req;
    std::function<void(const RequestUpdate&)> cb;
  };

  void publish() {  // under mu_ or before the thread starts
    const SchedulerStats& st = sched_.stats();
    MetricsSnapshot m;
    m.requests_running = sched_.running_sequences();
    m.requests_waiting = sched_.waiting_requests();
    m.kv_cache_usage = sched_.kv_cache_usage();
    m.prefix_cache_queries = st.prefix_cache_queries;
    m.prefix_cache_hits = st.prefix_cache_hits;
    m.prompt_tokens = st.prompt_tokens;
    m.generation_tokens = st.generation_tokens;
    m.steps_per_method = st.steps_per_method;
    m.decode_ahead_steps = st.ahead_batches;
    const Model& model = sched_.engine().model();
    const StepCounters c = model.ops().counters();
    m.step_graph_captures = c.graph_captures;
    m.step_graph_replays = c.graph_replays;
    m.step_graphs_kept = int64_t(model.graphs_kept());
    m.host_syncs = c.host_syncs;
    m.time_to_first_token = st.time_to_first_token;
    m.inter_token_latency = st.inter_token_latency;
    snapshot_ = std::move(m);
    waiting_ = snapshot_.requests_waiting;
  }

  void loop() {
    if (sched_.options().cpu_threads > 0) omp_set_num_threads(int(sched_.options().cpu_threads));
    for (;;) {
      std::vector<Pending> add;
      std::vector<RequestHandle> aborts;
      std::vector<std::promise<int64_t>> flushes;
      bool stop = false, drain = true;
      {
        std::unique_lock lk(mu_);
        cv_.wait(lk, [&] {
          return !pending_.empty() || !aborts_.empty() || !flushes_.empty() || stopping_ || !sched_.idle();
        });
        add.swap(pending_);
        aborts.swap(aborts_);
        flushes.swap(flushes_);
        stop = stopping_;
        drain = drain_;
      }
      for (Pending& p : add) {
        try {
          sched_.add(p.h, std::move(p.req), p.cb);
        } catch (const std::exception& e) {  // validated at submit; kept for safety
          RequestUpdate u;
          u.finished = true;
          u.error = e.what();
          if (p.cb) p.cb(u);
        }
      }
      for (RequestHandle h : aborts) sched_.abort(h);
      if (stop && !drain) sched_.abort_all();
      const int64_t released = flushes.empty() ? 0 : sched_.flush_cache();
      try {
        sched_.step();
      } catch (const std::exception& e) {
        // A scheduler fault fails every request rather than leaving clients waiting.
        sched_.abort_all();
      }
      {
        std::lock_guard lk(mu_);
        publish();
        for (std::promise<int64_t>& f : flushes) f.set_value(released);
        if (stop && sched_.idle() && pending_.empty()) {
          stopped_ = true;  // flushes asked from now on are answered at once
          for (std::promise<int64_t>& f : flushes_) f.set_value(0);
          flushes_.clear();
          return;
        }
      }
    }
  }

  Scheduler sched_;
  mutable std::mutex mu_;
  std::mutex join_mu_;
  std::condition_variable cv_;
  std::vector<Pending> pending_;
  std::vector<RequestHandle> aborts_;
  std::vector<std::promise<int64_t>> flushes_;  // flush_cache calls the thread has not taken yet
  bool stopping_ = false, drain_ = true, stopped_ = false;
  int64_t waiting_ = 0;
  RequestHandle next_handle_ = 1;
  MetricsSnapshot snapshot_;
  std::thread thread_;
};

// A Service that owns its platform, model and engine.
class OwningService : public Service {
 public:
  OwningService(std::unique_ptr<Ops> ops, LoadedModel lm, const EngineOptions& eo, const SchedulerOptions& so)
      : ops_(std::move(ops)), lm_(std::move(lm)), engine_(*lm_.model, eo), inner_(make_service(engine_, so)) {}
  ~OwningService() override { inner_->shutdown(false); }
  RequestHandle submit(GenerateRequest req, std::function<void(const RequestUpdate&)> cb) override {
    return inner_->submit(std::move(req), std::move(cb));
  }
  void abort(RequestHandle h) override { inner_->abort(h); }
  MetricsSnapshot metrics() const override { return inner_->metrics(); }
  std::shared_future<int64_t> flush_cache() override { return inner_->flush_cache(); }
  void shutdown(bool drain) override { inner_->shutdown(drain); }
  int64_t vocab_size() const override { return inner_->vocab_size(); }
  int64_t max_context() const override { return inner_->max_context(); }
  int32_t eos_token_id() const override { return inner_->eos_token_id(); }

 private:
  std::unique_ptr<Ops> ops_;
  LoadedModel lm_;
  Engine engine_;
  std::unique_ptr<Service> inner_;
};

}  // namespace

int32_t read_eos_token_id(const std::string& dir, int64_t vocab_size) {
  for (const char* f : {"/generation_config.json", "/config.json"}) {
    std::ifstream in(dir + f);
    if (!in) continue;
    nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object() || !j.contains("eos_token_id")) continue;
    const nlohmann::json& e = j["eos_token_id"];
    int64_t id = -1;
    if (e.is_number_integer()) id = e.get<int64_t>();
    else if (e.is_array() && !e.empty() && e[0].is_number_integer()) id = e[0].get<int64_t>();
    return id >= 0 && id < vocab_size ? int32_t(id) : -1;
  }
  return -1;
}

std::unique_ptr<Service> make_service(Engine& engine, const SchedulerOptions& opt) {
  return std::make_unique<ServiceImpl>(engine, opt);
}

std::unique_ptr<Service> open_service(const std::string& model_dir, const ServiceOptions& o) {
  const Platform p = parse_platform(o.platform);
  const DType act = parse_dtype(o.dtype), kv = parse_dtype(o.kv_dtype);
  EngineOptions eo;
  eo.kv_dtype = kv;
  eo.page_size = o.page_size > 0 ? o.page_size : p == Platform::CUDA ? 64 : 16;
  eo.max_tokens = o.kv_tokens;
  if (o.method != "auto") eo.forward.method = parse_method(o.method);
  eo.forward.dispatch.backend = o.backend;
  if (!o.backend.empty()) select_method({}, eo.forward.dispatch, p);  // an unknown backend throws here
  SchedulerOptions so;
  so.token_budget = o.token_budget;
  so.prefill_chunk = o.prefill_chunk;
  so.max_running = o.max_running;
  so.max_queue = o.max_queue;
  so.prefix_cache = o.prefix_cache;
  so.policy = parse_policy(o.policy);
  std::unique_ptr<Ops> ops = make_ops(p, act);
  LoadedModel lm = load_model(model_dir, *ops);
  so.eos_token_id = read_eos_token_id(model_dir, lm.config.vocab_size);
  return std::make_unique<OwningService>(std::move(ops), std::move(lm), eo, so);
}

}  // namespace mla::engine
