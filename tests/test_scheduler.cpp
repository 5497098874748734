// The scheduler: continuous batching gives each request the tokens and logits it gets alone
// (batch invariance on the CPU), with and without the prefix cache, with chunked prefill, under
// retraction, for n choices and both policies.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>

#include "engine/scheduler.h"
#include "mla/platform_ops.h"

namespace mla::engine {
namespace {

struct Solo {
  std::vector<int32_t> ids;
  std::vector<float> logits;  // of every sampled position
};

// Greedy generation of one request alone, by hand through Engine::step: prefill in chunks of
// `chunk` tokens, then decode one token at a time.
Solo solo(Model& m, const std::vector<int32_t>& prompt, int64_t max_new, int64_t chunk, int64_t ps) {
  EngineOptions eo;
  eo.page_size = ps;
  eo.max_tokens = 1024;
  Engine e(m, eo);
  const int64_t V = m.config().vocab_size;
  std::vector<float> last;
  for (size_t b = 0; b < prompt.size(); b += size_t(chunk)) {
    const size_t end = std::min(prompt.size(), b + size_t(chunk));
    StepResult r = e.step(ForwardMode::EXTEND, {{1, std::vector<int32_t>(prompt.begin() + b, prompt.begin() + end)}});
    last.assign(r.logits.end() - V, r.logits.end());
  }
  Solo s;
  for (;;) {
    s.logits.insert(s.logits.end(), last.begin(), last.end());
    s.ids.push_back(int32_t(std::max_element(last.begin(), last.end()) - last.begin()));
    if (int64_t(s.ids.size()) == max_new) break;
    last = e.step(ForwardMode::DECODE, {{1, {s.ids.back()}}}).logits;
  }
  return s;
}

struct Case {
  std::vector<int32_t> prompt;
  int64_t max_new;
};

// 16 prompts over three shared prefixes (lengths 20-45) with distinct tails.
std::vector<Case> cases(int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int32_t>> bases;
  for (int b = 0; b < 3; ++b) {
    std::vector<int32_t> t(size_t(20 + rng() % 26));
    for (auto& x : t) x = int32_t(2 + rng() % uint64_t(vocab - 2));
    bases.push_back(t);
  }
  std::vector<Case> out;
  for (int i = 0; i < 16; ++i) {
    std::vector<int32_t> p = bases[size_t(i % 3)];
    if (i % 5 == 4) p.resize(size_t(5 + rng() % 10));  // a short one
    for (int k = 0, n = int(1 + rng() % 14); k < n; ++k) p.push_back(int32_t(2 + rng() % uint64_t(vocab - 2)));
    out.push_back({p, int64_t(3 + rng() % 10)});
  }
  return out;
}

struct Result {
  std::vector<std::vector<int32_t>> ids;
  std::vector<std::vector<float>> logits;
  SchedulerStats stats;
  int64_t free_after = 0, cached_after = 0;
};

// with_logits: a hook collects every sampled row (the host sampler path); without, plain greedy
// requests take the token the platform picks (Engine::step with greedy).
Result run_all(Model& m, const std::vector<Case>& cs, const SchedulerOptions& so, int64_t ps, int64_t pool_tokens,
               bool with_logits = true) {
  EngineOptions eo;
  eo.page_size = ps;
  eo.max_tokens = pool_tokens;
  Engine e(m, eo);
  Result res;
  res.ids.resize(cs.size());
  res.logits.resize(cs.size());
  {
    Scheduler s(e, so);
    for (size_t i = 0; i < cs.size(); ++i) {
      GenerateRequest r;
      r.prompt = cs[i].prompt;
      r.params.temperature = 0;
      r.params.max_tokens = cs[i].max_new;
      r.params.ignore_eos = true;
      s.add(RequestHandle(i), r,
            [&res, i](const RequestUpdate& u) {
              EXPECT_TRUE(u.error.empty()) << u.error;
              for (const auto& c : u.choices) res.ids[i].insert(res.ids[i].end(), c.new_tokens.begin(), c.new_tokens.end());
            },
            with_logits ? LogitsHook([&res, i](int64_t, const float* l, int64_t V) {
              res.logits[i].insert(res.logits[i].end(), l, l + V);
            })
                        : LogitsHook());
    }
    int64_t steps = 0;
    while (s.step()) EXPECT_LT(++steps, 5000) << "no progress";
    res.stats = s.stats();
    res.cached_after = s.cache() ? s.cache()->cached_pages() : 0;
    res.free_after = e.pool().free_pages();
    EXPECT_EQ(res.free_after + res.cached_after, e.pool().config().num_pages) << "pages leaked";
    if (s.cache()) s.cache()->check();
  }
  EXPECT_EQ(e.pool().free_pages(), e.pool().config().num_pages) << "the scheduler left pages behind";
  return res;
}

double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]), den += double(b[i]) * b[i];
  return std::sqrt(num / den);
}

class SchedulerTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    // The CPU ops give the same results on any thread count; one thread keeps hundreds of tiny
    // steps fast on a busy machine (threads spinning at every barrier cost more than the work).
    omp_set_num_threads(1);
    ops = make_ops(Platform::CPU, DType::F32);
    lm = load_model(std::string(MLA_TEST_DATA) + "/" + GetParam(), *ops);
    cs = cases(lm.config.vocab_size, 11);
  }
  std::vector<Solo> solos(int64_t chunk, int64_t ps) {
    std::vector<Solo> out;
    for (const Case& c : cs) out.push_back(solo(*lm.model, c.prompt, c.max_new, chunk, ps));
    return out;
  }
  std::unique_ptr<Ops> ops;
  LoadedModel lm;
  std::vector<Case> cs;
};

// Chunks of one page: every prefix-cache hit falls on a chunk boundary, so with the cache on too
// each request computes exactly what it computes alone: identical ids and bit-identical logits.
TEST_P(SchedulerTest, SixteenRequestsMatchEachAloneBitForBit) {
  const int64_t ps = 16, chunk = 16;
  const std::vector<Solo> want = solos(chunk, ps);
  for (bool cache : {false, true}) {
    SCOPED_TRACE(cache ? "cache on" : "cache off");
    SchedulerOptions so;
    so.prefill_chunk = chunk;
    so.token_budget = 48;
    so.prefix_cache = cache;
    Result r = run_all(*lm.model, cs, so, ps, 2048);
    for (size_t i = 0; i < cs.size(); ++i) {
      ASSERT_EQ(r.ids[i], want[i].ids) << "request " << i;
      ASSERT_EQ(r.logits[i].size(), want[i].logits.size());
      EXPECT_EQ(std::memcmp(r.logits[i].data(), want[i].logits.data(), r.logits[i].size() * sizeof(float)), 0)
          << "request " << i << ": logits differ (relative " << rel_err(r.logits[i], want[i].logits) << ")";
    }
    EXPECT_EQ(r.stats.retractions, 0);
    if (cache) EXPECT_GT(r.stats.prefix_cache_hits, 100);
    else EXPECT_EQ(r.stats.prefix_cache_hits, 0);
    // Without a logits hook the platform picks the greedy tokens: the same ids.
    const Result g = run_all(*lm.model, cs, so, ps, 2048, /*with_logits=*/false);
    for (size_t i = 0; i < cs.size(); ++i) EXPECT_EQ(g.ids[i], want[i].ids) << "request " << i << " (greedy on the platform)";
    // Batches of several methods ran (fresh prefills, continued chunks, decodes).
    EXPECT_GE(r.stats.steps_per_method.size(), 2u);
    std::printf("  cache %-3s: %ld steps, %ld hit tokens;", cache ? "on" : "off", long(r.stats.steps),
                long(r.stats.prefix_cache_hits));
    for (const auto& [m, n] : r.stats.steps_per_method) std::printf(" %s %ld", m.c_str(), long(n));
    std::printf("\n");
  }
}

// Chunks of 24 tokens over pages of 16: a hit can start a request off its cold chunk grid, so
// the logits differ from the cold run's in rounding only; the ids are the same.
TEST_P(SchedulerTest, ChunksOffThePageGridMatchWithinRounding) {
  const int64_t ps = 16, chunk = 24;
  const std::vector<Solo> want = solos(chunk, ps);
  SchedulerOptions so;
  so.prefill_chunk = chunk;
  so.token_budget = 64;
  Result r = run_all(*lm.model, cs, so, ps, 2048);
  double worst = 0;
  for (size_t i = 0; i < cs.size(); ++i) {
    EXPECT_EQ(r.ids[i], want[i].ids) << "request " << i;
    worst = std::max(worst, rel_err(r.logits[i], want[i].logits));
  }
  std::printf("  worst relative L2 against the cold run: %.2e\n", worst);
  EXPECT_LT(worst, 1e-5);  // the method tests' f32 tolerance on the same models
  EXPECT_GT(r.stats.prefix_cache_hits, 100);
}

// A pool of 8 pages for 8 requests of up to 95 tokens: decode runs out of pages, requests are
// retracted and resume (through the cache when it is on); every request gets its ids.
TEST_P(SchedulerTest, RetractionFinishesEveryRequestWithTheSameIds) {
  const int64_t ps = 16, chunk = 16;
  cs.resize(8);
  for (Case& c : cs) c.max_new += 24;  // decodes cross pages
  const std::vector<Solo> want = solos(chunk, ps);
  for (bool cache : {false, true}) {
    SCOPED_TRACE(cache ? "cache on" : "cache off");
    SchedulerOptions so;
    so.prefill_chunk = chunk;
    so.token_budget = 64;
    so.prefix_cache = cache;
    so.decode_reserve = 0;
    Result r = run_all(*lm.model, cs, so, ps, 128);
    for (size_t i = 0; i < cs.size(); ++i) EXPECT_EQ(r.ids[i], want[i].ids) << "request " << i;
    EXPECT_GT(r.stats.retractions, 0);
    // Greedy on the platform, a step ahead: sequences retracted while their next token is still
    // on the platform drop it and draw it again on resumption.
    const Result g = run_all(*lm.model, cs, so, ps, 128, /*with_logits=*/false);
    for (size_t i = 0; i < cs.size(); ++i) EXPECT_EQ(g.ids[i], want[i].ids) << "request " << i << " (a step ahead)";
    EXPECT_GT(g.stats.retractions, 0);
    EXPECT_GT(g.stats.ahead_batches, 0);
    std::printf("  cache %-3s: %ld retractions in %ld steps\n", cache ? "on" : "off", long(r.stats.retractions),
                long(r.stats.steps));
  }
}

TEST_P(SchedulerTest, LongestPrefixMatchPolicyGivesTheSameIds) {
  const std::vector<Solo> want = solos(16, 16);
  SchedulerOptions so;
  so.prefill_chunk = 16;
  so.token_budget = 32;
  so.max_running = 4;
  so.policy = Policy::LPM;
  Result r = run_all(*lm.model, cs, so, 16, 2048);
  for (size_t i = 0; i < cs.size(); ++i) EXPECT_EQ(r.ids[i], want[i].ids) << "request " << i;
}

// n choices share the prompt's whole pages; greedy choices are all the solo ids, sampled ones
// follow their own streams and repeat with the seed.
TEST_P(SchedulerTest, ChoicesShareThePromptPages) {
  const Case& c = cs[0];
  const Solo want = solo(*lm.model, c.prompt, c.max_new, 16, 16);
  EngineOptions eo;
  eo.page_size = 16;
  eo.max_tokens = 1024;
  Engine e(*lm.model, eo);
  auto run = [&](double temperature, uint64_t seed) {
    Scheduler s(e, SchedulerOptions{.prefill_chunk = 16, .prefix_cache = false});
    GenerateRequest r;
    r.prompt = c.prompt;
    r.n = 4;
    r.params.temperature = temperature;
    r.params.seed = seed;
    r.params.max_tokens = c.max_new;
    r.params.ignore_eos = true;
    std::vector<std::vector<int32_t>> out(4);
    int64_t most_used = 0;
    bool finished = false;
    s.add(1, r, [&](const RequestUpdate& u) {
      for (const auto& ch : u.choices) out[size_t(ch.index)].insert(out[size_t(ch.index)].end(), ch.new_tokens.begin(), ch.new_tokens.end());
      finished = u.finished;
    });
    while (s.step()) {
      int64_t used = e.pool().config().num_pages - e.pool().free_pages();
      most_used = std::max(most_used, used);
    }
    EXPECT_TRUE(finished);
    // Four private copies of the prompt would take 4 · ceil(len / 16) pages at the end.
    const int64_t full = int64_t(c.prompt.size()) / 16;
    EXPECT_LE(most_used, 4 * ((int64_t(c.prompt.size()) + c.max_new + 15) / 16) - 3 * full + 0);
    EXPECT_EQ(e.pool().free_pages(), e.pool().config().num_pages);
    return out;
  };
  for (const auto& o : run(0, 1)) EXPECT_EQ(o, want.ids);
  const auto a = run(1.0, 5), b = run(1.0, 5), d = run(1.0, 6);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, d);
  EXPECT_NE(a[0], a[1]);
}

// Decoding a step ahead gives what step-by-step decoding gives, for requests that stop early (stop
// ids, the model's eos, a stop check that drops a token), run out of max_tokens, sample on the
// platform (n = 2), want logprobs (their batches run step by step) or are aborted while a step of
// theirs is still on the platform.
TEST_P(SchedulerTest, DecodingAheadGivesTheTokensOfStepByStep) {
  const std::vector<Solo> want = solos(16, 16);
  const int32_t eos = want[1].ids[2];  // request 1 stops at its third token
  struct Out {
    std::map<std::pair<int64_t, int64_t>, std::vector<int32_t>> tokens;  // (request, choice)
    std::map<std::pair<int64_t, int64_t>, FinishReason> finish;
    std::map<std::pair<int64_t, int64_t>, std::vector<float>> logprobs;
    SchedulerStats stats;
    int64_t decode_tokens = 0;  // rows of the DECODE batches issued
  };
  auto run = [&](bool ahead) -> Out {
    EngineOptions eo;
    eo.page_size = 16;
    eo.max_tokens = 2048;
    Engine e(*lm.model, eo);
    Out out;
    SchedulerOptions so;
    so.prefill_chunk = 16;
    so.token_budget = 48;
    so.eos_token_id = eos;
    so.decode_ahead = ahead;
    so.on_batch = [&out](ForwardMode m, ForwardMethod, int64_t n) {
      if (m == ForwardMode::DECODE) out.decode_tokens += n;
    };
    {
      Scheduler s(e, so);
      for (size_t i = 0; i < cs.size(); ++i) {
        GenerateRequest r;
        r.prompt = cs[i].prompt;
        r.params.max_tokens = cs[i].max_new + 6;
        r.params.temperature = i % 3 == 0 ? 0.0 : 0.8;
        r.params.seed = 40 + i;
        r.params.ignore_eos = i != 1;
        if (i % 4 == 2) r.params.stop_token_ids = {want[i].ids[std::min<size_t>(3, want[i].ids.size() - 1)]};
        if (i % 5 == 3) r.n = 2;
        if (i == 7) r.params.top_logprobs = 2, r.params.max_tokens = 5;
        if (i % 4 == 1)  // a stop check: stop when the choice's tokens sum to a multiple of 5, drop that token
          r.stop_check = [](int64_t, const std::vector<int32_t>& t) {
            int64_t sum = 0;
            for (int32_t x : t) sum += x;
            return t.size() > 2 && sum % 5 == 0 ? int64_t(1) : int64_t(-1);
          };
        s.add(RequestHandle(i), r, [&out, i](const RequestUpdate& u) {
          EXPECT_TRUE(u.error.empty()) << u.error;
          for (const auto& c : u.choices) {
            const auto key = std::make_pair(int64_t(i), c.index);
            out.tokens[key].insert(out.tokens[key].end(), c.new_tokens.begin(), c.new_tokens.end());
            for (const TokenLogprob& l : c.logprobs) out.logprobs[key].push_back(l.logprob);
            if (c.finish != FinishReason::NONE) out.finish[key] = c.finish;
          }
        });
      }
      // One more request, aborted after a few decode steps: its pages come back.
      GenerateRequest r;
      r.prompt = cs[0].prompt;
      r.params.max_tokens = 40;
      r.params.temperature = 0;
      FinishReason aborted = FinishReason::NONE;
      s.add(99, r, [&](const RequestUpdate& u) {
        for (const auto& c : u.choices)
          if (c.finish != FinishReason::NONE) aborted = c.finish;
      });
      int64_t steps = 0;
      while (s.step()) {
        if (++steps == 12) s.abort(99);
        if (steps == 5000) {
          ADD_FAILURE() << "no progress";
          break;
        }
      }
      EXPECT_EQ(aborted, FinishReason::ABORT);
      out.stats = s.stats();
      if (s.cache()) s.cache()->check();
      EXPECT_EQ(e.pool().free_pages() + s.cache()->cached_pages(), e.pool().config().num_pages) << "pages leaked";
    }
    EXPECT_EQ(e.pool().free_pages(), e.pool().config().num_pages) << "the scheduler left pages behind";
    return out;
  };
  const Out step = run(false), ahead = run(true);
  EXPECT_EQ(step.stats.ahead_batches, 0);
  EXPECT_GT(ahead.stats.ahead_batches, 0);
  EXPECT_EQ(ahead.tokens, step.tokens);
  EXPECT_EQ(ahead.finish, step.finish);
  EXPECT_EQ(ahead.logprobs, step.logprobs);
  int64_t stops = 0, lengths = 0;
  for (const auto& [k, f] : step.finish) stops += f == FinishReason::STOP, lengths += f == FinishReason::LENGTH;
  EXPECT_EQ(step.finish.size(), 16u + 3u);  // n = 2 for requests 3, 8 and 13
  EXPECT_GE(stops, 4);
  EXPECT_GE(lengths, 4);
  // A step ahead computes one token more only for a choice that stops (or the aborted request):
  // none for one whose token in flight is its last.
  EXPECT_GE(ahead.decode_tokens, step.decode_tokens);
  EXPECT_LE(ahead.decode_tokens, step.decode_tokens + stops + 1);
  std::printf("  %zu choices: %ld stopped, %ld at max_tokens; %ld of %ld steps issued a step ahead\n",
              step.finish.size(), long(stops), long(lengths), long(ahead.stats.ahead_batches), long(ahead.stats.steps));
}

INSTANTIATE_TEST_SUITE_P(Models, SchedulerTest, ::testing::Values("v3_tiny", "v2_greedy"));

// What holds on CUDA: cuBLAS picks its GEMM kernels by the batch's row count and the MLA decode
// splits keys by the batch, so a request inside a batch may round differently than alone. The
// greedy ids hold on these models and the logits agree to the activation dtype's rounding.
class CudaSchedulerTest : public ::testing::TestWithParam<std::tuple<const char*, DType>> {};

TEST_P(CudaSchedulerTest, SixteenRequestsMatchEachAloneWithinRounding) {
  if (!platform_available(Platform::CUDA)) GTEST_SKIP() << "no CUDA device";
  const auto [model, act] = GetParam();
  auto ops = make_ops(Platform::CUDA, act);
  LoadedModel lm = load_model(std::string(MLA_TEST_DATA) + "/" + model, *ops);
  const std::vector<Case> cs = cases(lm.config.vocab_size, 11);
  const int64_t ps = 64, chunk = 64;  // the page size the CUDA kernels take
  std::vector<Solo> want;
  for (const Case& c : cs) want.push_back(solo(*lm.model, c.prompt, c.max_new, chunk, ps));
  SchedulerOptions so;
  so.prefill_chunk = chunk;
  so.token_budget = 256;
  const Result r = run_all(*lm.model, cs, so, ps, 4096);
  const Result g = run_all(*lm.model, cs, so, ps, 4096, /*with_logits=*/false);
  double worst = 0;
  for (size_t i = 0; i < cs.size(); ++i) {
    EXPECT_EQ(r.ids[i], want[i].ids) << "request " << i;
    EXPECT_EQ(g.ids[i], want[i].ids) << "request " << i << " (greedy on the platform)";
    worst = std::max(worst, rel_err(r.logits[i], want[i].logits));
  }
  std::printf("  %s %s: worst relative L2 of a request's logits in a batch against alone: %.2e\n", model,
              std::string(dtype_name(act)).c_str(), worst);
  // Measured on the H200: 8.3e-7 (f32), 0 (bf16: the same bits as alone).
  EXPECT_LT(worst, act == DType::BF16 ? 1e-6 : 5e-6);
}

INSTANTIATE_TEST_SUITE_P(Models, CudaSchedulerTest,
                         ::testing::Combine(::testing::Values("v3_tiny", "v2_greedy"),
                                            ::testing::Values(DType::F32, DType::BF16)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param)) + "_" +
                                  std::string(dtype_name(std::get<1>(info.param)));
                         });

}  // namespace
}  // namespace mla::engine

namespace mla::engine {
namespace {

// Seeded sampled requests through the scheduler: the tokens drawn on the platform (Ops::sample_rows,
// only ids come back) are the host sampler's, on every platform present. Batches mix sampled
// requests of every cut, a greedy one, and prefill chunks that sample nothing.
TEST(DeviceSampling, SeededRequestsDrawTheHostSamplersTokens) {
  omp_set_num_threads(1);
  for (Platform pl : {Platform::CPU, Platform::CUDA}) {
    if (!platform_available(pl)) continue;
    auto ops = make_ops(pl, DType::F32);
    LoadedModel lm = load_model(std::string(MLA_TEST_DATA) + "/v3_tiny", *ops);
    const std::vector<Case> cs = cases(lm.config.vocab_size, 23);
    const int64_t ps = pl == Platform::CPU ? 16 : 64;
    auto run = [&](bool device, int64_t* batches, int64_t* d2h) {
      EngineOptions eo;
      eo.page_size = ps;
      eo.max_tokens = 4096;
      Engine e(*lm.model, eo);
      SchedulerOptions so;
      so.prefill_chunk = ps;
      so.token_budget = 3 * ps;
      so.device_sampling = device;
      std::vector<std::vector<int32_t>> ids(cs.size() * 2);
      const StepCounters c0 = ops->counters();
      {
        Scheduler s(e, so);
        for (size_t i = 0; i < cs.size(); ++i) {
          GenerateRequest r;
          r.prompt = cs[i].prompt;
          r.n = 2;
          r.params.max_tokens = cs[i].max_new + 8;
          r.params.ignore_eos = true;
          r.params.seed = 100 + i;
          r.params.temperature = i == 3 ? 0.0 : 0.3 + 0.15 * double(i % 8);
          r.params.top_k = i % 4 == 1 ? int64_t(5 + i) : 0;
          r.params.top_p = i % 3 == 2 ? 0.8 : 1.0;
          r.params.min_p = i % 5 == 4 ? 0.05 : 0.0;
          s.add(RequestHandle(i), r, [&ids, i](const RequestUpdate& u) {
            EXPECT_TRUE(u.error.empty()) << u.error;
            for (const auto& c : u.choices)
              ids[2 * i + size_t(c.index)].insert(ids[2 * i + size_t(c.index)].end(), c.new_tokens.begin(),
                                                  c.new_tokens.end());
          });
        }
        int64_t steps = 0;
        while (s.step()) EXPECT_LT(++steps, 5000) << "no progress";
        *batches = 0;
        for (const auto& [m, n] : s.stats().steps_per_method) *batches += n;
      }
      *d2h = (ops->counters() - c0).d2h_copies;
      return ids;
    };
    int64_t host_batches = 0, host_d2h = 0, dev_batches = 0, dev_d2h = 0;
    const auto host = run(false, &host_batches, &host_d2h);
    const auto dev = run(true, &dev_batches, &dev_d2h);
    int64_t tokens = 0;
    for (size_t i = 0; i < host.size(); ++i) {
      EXPECT_EQ(dev[i], host[i]) << platform_name(pl) << " request " << i / 2 << " choice " << i % 2;
      tokens += int64_t(host[i].size());
    }
    EXPECT_NE(host[0], host[1]) << "the two choices of a sampled request differ";
    // One copy to the host per batch: the ids (or the host path's logits), nothing more.
    if (pl != Platform::CPU) {
      EXPECT_EQ(dev_d2h, dev_batches);
      EXPECT_EQ(host_d2h, host_batches);
    }
    std::printf("  %s: %ld tokens of %zu choices, %ld batches\n", std::string(platform_name(pl)).c_str(), long(tokens),
                host.size(), long(dev_batches));
  }
}

}  // namespace
}  // namespace mla::engine
