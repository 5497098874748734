// The Service: requests through the scheduler thread; abort frees pages within a step,
// flush_cache empties the pool, the queue bound, shutdown with drain or abort, metrics.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>

#include "engine/service_impl.h"
#include "mla/platform_ops.h"

namespace mla::engine {
namespace {

using namespace std::chrono_literals;

// Everything one request reported, waitable.
struct Collector {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int32_t> ids;
  std::vector<FinishReason> finish;
  bool finished = false;
  std::string error;
  int64_t updates = 0;
  std::function<void(const RequestUpdate&)> fn() {
    return [this](const RequestUpdate& u) {
      std::lock_guard lk(mu);
      ++updates;
      for (const auto& c : u.choices) {
        ids.insert(ids.end(), c.new_tokens.begin(), c.new_tokens.end());
        if (c.finish != FinishReason::NONE) finish.push_back(c.finish);
      }
      finished = u.finished;
      error = u.error;
      cv.notify_all();
    };
  }
  bool wait_finished(std::chrono::seconds t = 60s) {
    std::unique_lock lk(mu);
    return cv.wait_for(lk, t, [&] { return finished; });
  }
  bool wait_tokens(size_t n) {
    std::unique_lock lk(mu);
    return cv.wait_for(lk, 60s, [&] { return ids.size() >= n || finished; });
  }
};

// Polls metrics until `ok` holds (the Service applies commands between steps).
template <typename F>
bool eventually(const Service& s, F ok) {
  for (int i = 0; i < 6000; ++i) {
    if (ok(s.metrics())) return true;
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

// The tiny V3 model on a platform, with an engine of 16-token pages and a 512-token context.
struct TinyEngine {
  std::unique_ptr<Ops> ops;
  LoadedModel lm;
  std::unique_ptr<Engine> engine;
  TinyEngine(Platform p, DType act) : ops(make_ops(p, act)), lm(load_model(std::string(MLA_TEST_DATA) + "/v3_tiny", *ops)) {
    EngineOptions eo;
    eo.page_size = 16;
    eo.max_tokens = 512;
    engine = std::make_unique<Engine>(*lm.model, eo);
  }
};

// A greedy request of 20 prompt tokens first, first + 1, … that ignores EOS.
GenerateRequest request(int64_t max_tokens, int32_t first = 5) {
  GenerateRequest r;
  for (int32_t i = 0; i < 20; ++i) r.prompt.push_back(first + i);
  r.params.temperature = 0;
  r.params.max_tokens = max_tokens;
  r.params.ignore_eos = true;
  return r;
}

class ServiceTest : public ::testing::Test, public TinyEngine {
 protected:
  ServiceTest() : TinyEngine(Platform::CPU, DType::F32) {}
  // One OpenMP thread on the scheduler thread: the tiny model's steps stay fast on a busy machine.
  static SchedulerOptions opts() {
    SchedulerOptions so;
    so.cpu_threads = 1;
    return so;
  }
};

TEST_F(ServiceTest, GeneratesAndReportsMetrics) {
  SchedulerOptions so = opts();
  so.prefill_chunk = 16;
  auto svc = make_service(*engine, so);
  EXPECT_EQ(svc->vocab_size(), lm.config.vocab_size);
  EXPECT_EQ(svc->max_context(), 512);
  Collector a, b;
  svc->submit(request(8), a.fn());
  ASSERT_TRUE(a.wait_finished());
  svc->submit(request(5), b.fn());  // the same prompt: its first page comes from the cache
  ASSERT_TRUE(b.wait_finished());
  EXPECT_EQ(b.ids, std::vector<int32_t>(a.ids.begin(), a.ids.begin() + 5));
  EXPECT_EQ(a.ids.size(), 8u);
  EXPECT_EQ(a.finish, std::vector<FinishReason>{FinishReason::LENGTH});
  EXPECT_EQ(b.ids.size(), 5u);
  ASSERT_TRUE(eventually(*svc, [](const MetricsSnapshot& m) { return m.requests_running == 0; }));
  MetricsSnapshot m = svc->metrics();
  EXPECT_EQ(m.generation_tokens, 13);
  EXPECT_EQ(m.prompt_tokens, 40);
  EXPECT_EQ(m.time_to_first_token.count, 2);
  EXPECT_EQ(m.time_to_first_token.counts.back(), 2);
  EXPECT_EQ(m.inter_token_latency.count, 11);
  EXPECT_GT(m.steps_per_method["MLA"], 0);
  EXPECT_EQ(m.prefix_cache_hits, 16);  // b had a's first page
  EXPECT_GT(m.kv_cache_usage, 0);    // the cache keeps the finished requests' pages
  EXPECT_EQ(m.step_graph_captures + m.step_graph_replays + m.step_graphs_kept, 0);  // the CPU records none
  // Bad requests are refused at submit, one line each.
  GenerateRequest bad = request(4);
  bad.prompt[3] = int32_t(lm.config.vocab_size);
  EXPECT_THROW(svc->submit(bad, {}), Error);
  EXPECT_THROW(svc->submit(request(600), {}), Error);
  svc->shutdown(true);
}

// On CUDA the metrics count the decode step graphs: a request's decode steps record their shape
// once and replay it from then on, and the counts are the Ops's own.
TEST(ServiceGraphs, MetricsCountTheStepGraphs) {
  if (!platform_available(Platform::CUDA)) GTEST_SKIP() << "no CUDA device here";
  TinyEngine t(Platform::CUDA, DType::BF16);
  auto svc = make_service(*t.engine, SchedulerOptions{});
  Collector a;
  svc->submit(request(24), a.fn());
  ASSERT_TRUE(a.wait_finished());
  ASSERT_TRUE(eventually(*svc, [](const MetricsSnapshot& m) { return m.requests_running == 0; }));
  const MetricsSnapshot m = svc->metrics();
  const StepCounters c = t.ops->counters();
  EXPECT_EQ(m.step_graph_captures, c.graph_captures);
  EXPECT_EQ(m.step_graph_replays, c.graph_replays);
  EXPECT_EQ(m.host_syncs, c.host_syncs);
  EXPECT_EQ(m.step_graphs_kept, int64_t(t.lm.model->graphs_kept()));
  // 23 decode steps of one request over 21 … 44 keys: two kv buckets (32, 64), each shape recorded
  // once or twice (a growing device plan records again), the other steps replayed.
  EXPECT_GE(m.step_graph_captures, 2);
  EXPECT_LE(m.step_graph_captures, 4);
  EXPECT_GE(m.step_graph_replays, 15);
  EXPECT_GE(m.step_graphs_kept, 1);
  svc->shutdown(true);
}

// Holds the scheduler thread inside a request's first update (after passing it on to `then`).
struct Gate {
  std::promise<void> entered, release;
  std::shared_future<void> go = release.get_future().share();
  bool first = true;
  std::function<void(const RequestUpdate&)> fn(std::function<void(const RequestUpdate&)> then = {}) {
    return [this, then](const RequestUpdate& u) {
      if (then) then(u);
      if (!first) return;
      first = false;
      entered.set_value();
      go.wait();
    };
  }
};

TEST_F(ServiceTest, AbortFreesPagesWithinAStepAndFlushEmptiesThePool) {
  SchedulerOptions so = opts();
  so.prefill_chunk = 16;
  auto svc = make_service(*engine, so);
  Collector a;
  Gate gate;
  const RequestHandle h = svc->submit(request(400), gate.fn(a.fn()));
  gate.entered.get_future().wait();  // the first token is out; the scheduler waits
  EXPECT_GT(svc->metrics().kv_cache_usage, 0);
  svc->abort(h);
  gate.release.set_value();
  ASSERT_TRUE(a.wait_finished());
  EXPECT_EQ(a.finish, std::vector<FinishReason>{FinishReason::ABORT});
  EXPECT_EQ(a.ids.size(), 1u);  // aborted before the next step
  svc->abort(h);  // finished: ignored
  svc->abort(12345);
  // Nothing runs: flushing the cache returns every page.
  ASSERT_TRUE(eventually(*svc, [](const MetricsSnapshot& m) { return m.requests_running == 0; }));
  EXPECT_GT(svc->metrics().kv_cache_usage, 0);  // the aborted request's pages went to the cache
  // The flush's future is ready once it is done and the metrics show it.
  EXPECT_GT(svc->flush_cache().get(), 0);
  EXPECT_EQ(svc->metrics().kv_cache_usage, 0);
  EXPECT_EQ(svc->flush_cache().get(), 0);  // nothing left to release
  svc->shutdown(true);
  // After the thread has stopped, a flush is answered at once.
  const std::shared_future<int64_t> late = svc->flush_cache();
  ASSERT_EQ(late.wait_for(std::chrono::seconds(0)), std::future_status::ready);
  EXPECT_EQ(late.get(), 0);
}

TEST_F(ServiceTest, AbortWithoutTheCacheFreesEveryPage) {
  SchedulerOptions so = opts();
  so.prefix_cache = false;
  auto svc = make_service(*engine, so);
  Collector a;
  Gate gate;
  const RequestHandle h = svc->submit(request(400), gate.fn(a.fn()));
  gate.entered.get_future().wait();
  svc->abort(h);
  gate.release.set_value();
  ASSERT_TRUE(a.wait_finished());
  EXPECT_TRUE(eventually(*svc, [](const MetricsSnapshot& m) { return m.kv_cache_usage == 0 && m.requests_running == 0; }));
  svc->shutdown(true);
  EXPECT_EQ(engine->pool().free_pages(), engine->pool().config().num_pages);
}

TEST_F(ServiceTest, QueueFullIsRefused) {
  SchedulerOptions so = opts();
  so.max_queue = 2;
  auto svc = make_service(*engine, so);
  Gate gate;
  svc->submit(request(20), gate.fn());
  gate.entered.get_future().wait();  // the scheduler thread waits in the first update
  Collector b, c;
  svc->submit(request(2), b.fn());
  svc->submit(request(2), c.fn());
  EXPECT_THROW(svc->submit(request(2), {}), QueueFullError);
  EXPECT_EQ(svc->metrics().requests_waiting, 2);
  gate.release.set_value();
  ASSERT_TRUE(b.wait_finished());
  ASSERT_TRUE(c.wait_finished());
  EXPECT_NO_THROW(svc->submit(request(2), {}));
  svc->shutdown(true);
}

TEST_F(ServiceTest, ShutdownDrainsOrAborts) {
  {
    auto svc = make_service(*engine, opts());
    Collector a, b;
    svc->submit(request(12), a.fn());
    svc->submit(request(7, 40), b.fn());
    svc->shutdown(/*drain=*/true);
    EXPECT_TRUE(a.finished && b.finished);
    EXPECT_EQ(a.ids.size(), 12u);
    EXPECT_EQ(b.ids.size(), 7u);
    EXPECT_EQ(a.finish, std::vector<FinishReason>{FinishReason::LENGTH});
    EXPECT_THROW(svc->submit(request(2), {}), Error);
  }
  {
    auto svc = make_service(*engine, opts());
    Gate gate;
    Collector b;
    svc->submit(request(300), gate.fn());
    gate.entered.get_future().wait();
    svc->submit(request(300, 40), b.fn());
    auto done = std::async(std::launch::async, [&] { svc->shutdown(/*drain=*/false); });
    std::this_thread::sleep_for(50ms);
    gate.release.set_value();
    done.get();
    EXPECT_TRUE(b.finished);
    EXPECT_EQ(b.finish, std::vector<FinishReason>{FinishReason::ABORT});
    EXPECT_TRUE(b.ids.empty());
  }
  EXPECT_EQ(engine->pool().request_ids().size(), 0u);
}

TEST_F(ServiceTest, StopCheckTrimsAndStops) {
  auto svc = make_service(*engine, opts());
  Collector full, cut;
  svc->submit(request(10), full.fn());
  ASSERT_TRUE(full.wait_finished());
  GenerateRequest r = request(10);
  // Stop when the fourth token arrives, dropping it and the one before: the third was reported
  // already, so three tokens stay.
  r.stop_check = [](int64_t, const std::vector<int32_t>& t) -> int64_t { return t.size() == 4 ? 2 : -1; };
  svc->submit(r, cut.fn());
  ASSERT_TRUE(cut.wait_finished());
  EXPECT_EQ(cut.finish, std::vector<FinishReason>{FinishReason::STOP});
  EXPECT_EQ(cut.ids, std::vector<int32_t>(full.ids.begin(), full.ids.begin() + 3));
  // Dropping the token just sampled reports nothing of it.
  Collector first;
  GenerateRequest f = request(10);
  f.stop_check = [](int64_t, const std::vector<int32_t>& t) -> int64_t { return t.size() == 2 ? 1 : -1; };
  svc->submit(f, first.fn());
  ASSERT_TRUE(first.wait_finished());
  EXPECT_EQ(first.ids, std::vector<int32_t>(full.ids.begin(), full.ids.begin() + 1));
  // A stop token id is reported and stops.
  Collector st;
  GenerateRequest s = request(10);
  s.params.stop_token_ids = {full.ids[1]};
  svc->submit(s, st.fn());
  ASSERT_TRUE(st.wait_finished());
  EXPECT_EQ(st.finish, std::vector<FinishReason>{FinishReason::STOP});
  EXPECT_EQ(st.ids.back(), full.ids[1]);
  EXPECT_LE(st.ids.size(), 2u);
  svc->shutdown(true);
}

TEST_F(ServiceTest, LogprobsComeWithEveryToken) {
  auto svc = make_service(*engine, opts());
  std::mutex mu;
  std::vector<int32_t> ids;
  std::vector<TokenLogprob> lps;
  std::promise<void> done;
  GenerateRequest r = request(6);
  r.params.top_logprobs = 3;
  svc->submit(r, [&](const RequestUpdate& u) {
    std::lock_guard lk(mu);
    for (const auto& c : u.choices) {
      EXPECT_EQ(c.logprobs.size(), c.new_tokens.size());
      ids.insert(ids.end(), c.new_tokens.begin(), c.new_tokens.end());
      lps.insert(lps.end(), c.logprobs.begin(), c.logprobs.end());
    }
    if (u.finished) done.set_value();
  });
  done.get_future().wait();
  ASSERT_EQ(lps.size(), 6u);
  for (size_t i = 0; i < lps.size(); ++i) {
    EXPECT_EQ(lps[i].id, ids[i]);
    ASSERT_EQ(lps[i].top.size(), 3u);
    EXPECT_EQ(lps[i].top[0].first, ids[i]);  // greedy: the chosen token is the most likely
    EXPECT_EQ(lps[i].top[0].second, lps[i].logprob);
    EXPECT_LT(lps[i].logprob, 0);
  }
  svc->shutdown(true);
}

}  // namespace
}  // namespace mla::engine
