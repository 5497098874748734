// The sampler on a small model's logits: greedy limits, seeds, sampled frequencies against the
// softmax, OpenAI's penalties exactly, the top-k / top-p / min-p masks, and logprobs.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <set>

#include "engine/engine.h"
#include "engine/sampler.h"
#include "mla/error.h"
#include "mla/platform_ops.h"

namespace mla::engine {
namespace {

class SamplerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    omp_set_num_threads(1);
    auto ops = make_ops(Platform::CPU, DType::F32);
    LoadedModel lm = load_model(std::string(MLA_TEST_DATA) + "/v3_tiny", *ops);
    EngineOptions eo;
    Engine e(*lm.model, eo);
    V = lm.config.vocab_size;
    const std::vector<int32_t> prompt{121, 3, 1, 230, 62, 8, 145, 59, 214};
    Engine::Run r = e.run_sequence(prompt, 0, int64_t(prompt.size()));
    // The last position's logits, sharpened 2x so the distribution has a clear head and a tail.
    logits.assign(r.logits.end() - V, r.logits.end());
    for (float& x : logits) x *= 2;
  }
  static inline std::vector<float> logits;
  static inline int64_t V = 0;

  // softmax(logits / t) in double.
  static std::vector<double> softmax(double t) {
    const double m = *std::max_element(logits.begin(), logits.end());
    std::vector<double> p(static_cast<size_t>(V));
    double s = 0;
    for (int64_t i = 0; i < V; ++i) s += p[size_t(i)] = std::exp((logits[size_t(i)] - m) / t);
    for (double& x : p) x /= s;
    return p;
  }
  static int32_t argmax() { return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin()); }
};

TEST_F(SamplerTest, TemperatureZeroAndATinyTopPAreGreedy) {
  SamplingParams greedy;
  greedy.temperature = 0;
  SamplingParams tiny;
  tiny.temperature = 1.0;
  tiny.top_p = 1e-9;
  for (uint64_t i = 0; i < 200; ++i) {
    const double u = stream_uniform(1, 0, i);
    EXPECT_EQ(sample_token(logits.data(), V, greedy, u), argmax());
    EXPECT_EQ(sample_token(logits.data(), V, tiny, u), argmax());
  }
  // Ties go to the lower id, as argmax does.
  std::vector<float> tie(static_cast<size_t>(V), 0.f);
  tie[7] = tie[3] = 1.f;
  EXPECT_EQ(sample_token(tie.data(), V, greedy, 0.5), 3);
  EXPECT_EQ(sample_token(tie.data(), V, tiny, 0.99), 3);
}

TEST_F(SamplerTest, OneSeedReproducesAndSeedsDiffer) {
  SamplingParams p;
  p.temperature = 1.5;
  auto draw = [&](uint64_t seed, uint64_t stream) {
    std::vector<int32_t> out;
    for (uint64_t i = 0; i < 64; ++i) out.push_back(sample_token(logits.data(), V, p, stream_uniform(seed, stream, i)));
    return out;
  };
  EXPECT_EQ(draw(42, 0), draw(42, 0));
  EXPECT_NE(draw(42, 0), draw(43, 0));
  EXPECT_NE(draw(42, 0), draw(42, 1));  // choices of one request follow their own streams
  for (uint64_t i = 0; i < 1000; ++i) {
    const double u = stream_uniform(9, 2, i);
    ASSERT_TRUE(u >= 0 && u < 1);
  }
}

// Per-token binomial bound: |count − N·p| <= 6σ + 1 for every token (a false alarm in any of the
// V tokens has probability ~V · 2e-9).
void expect_frequencies(const std::vector<double>& p, const std::vector<int64_t>& count, int64_t n, int64_t min_tested) {
  int64_t tested = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double mean = double(n) * p[i], sd = std::sqrt(double(n) * p[i] * (1 - p[i]));
    EXPECT_LE(std::abs(double(count[i]) - mean), 6 * sd + 1) << "token " << i << ": p " << p[i];
    tested += p[i] > 1e-3;
  }
  EXPECT_GE(tested, min_tested);  // tokens of p > 1e-3: the bound means something
}

TEST_F(SamplerTest, SampledFrequenciesMatchTheSoftmax) {
  const int64_t n = 100'000;
  SamplingParams sp;
  sp.temperature = 0.7;
  std::vector<int64_t> count(static_cast<size_t>(V), 0);
  for (int64_t i = 0; i < n; ++i) ++count[size_t(sample_token(logits.data(), V, sp, stream_uniform(3, 0, uint64_t(i))))];
  expect_frequencies(softmax(0.7), count, n, 10);
}

TEST_F(SamplerTest, MasksKeepWhatTheyShould) {
  const std::vector<double> p = softmax(1.0);
  std::vector<int32_t> by_p(static_cast<size_t>(V));
  for (int64_t i = 0; i < V; ++i) by_p[size_t(i)] = int32_t(i);
  std::stable_sort(by_p.begin(), by_p.end(), [&](int32_t a, int32_t b) { return p[size_t(a)] > p[size_t(b)]; });
  auto ids = [](const std::vector<std::pair<int32_t, double>>& d) {
    std::set<int32_t> s;
    for (auto& [t, q] : d) s.insert(t);
    return s;
  };
  SamplingParams sp;
  sp.temperature = 1.0;
  sp.top_k = 5;
  EXPECT_EQ(ids(sampling_distribution(logits.data(), V, sp)), std::set<int32_t>(by_p.begin(), by_p.begin() + 5));
  // min-p: tokens with p >= min_p · p_max.
  sp.top_k = 0;
  sp.min_p = 0.1;
  std::set<int32_t> want;
  for (int64_t i = 0; i < V; ++i)
    if (p[size_t(i)] >= 0.1 * p[size_t(by_p[0])]) want.insert(int32_t(i));
  EXPECT_EQ(ids(sampling_distribution(logits.data(), V, sp)), want);
  EXPECT_LT(want.size(), size_t(V));
  // top-p: the shortest head whose mass reaches top_p.
  sp.min_p = 0;
  sp.top_p = 0.5;
  double mass = 0;
  size_t k = 0;
  while (mass < 0.5) mass += p[size_t(by_p[k++])];
  auto d = sampling_distribution(logits.data(), V, sp);
  EXPECT_EQ(ids(d), std::set<int32_t>(by_p.begin(), by_p.begin() + int64_t(k)));
  double total = 0;
  for (auto& [t, q] : d) {
    EXPECT_NEAR(q, p[size_t(t)] / mass, 1e-12);
    total += q;
  }
  EXPECT_NEAR(total, 1.0, 1e-12);
  // Sampling draws from the masked distribution.
  const int64_t n = 100'000;
  sp.top_p = 1.0;
  sp.top_k = 4;
  std::vector<int64_t> count(static_cast<size_t>(V), 0);
  for (int64_t i = 0; i < n; ++i) ++count[size_t(sample_token(logits.data(), V, sp, stream_uniform(5, 0, uint64_t(i))))];
  std::vector<double> q(static_cast<size_t>(V), 0.0);
  for (auto& [t, w] : sampling_distribution(logits.data(), V, sp)) q[size_t(t)] = w;
  expect_frequencies(q, count, n, 4);
  for (int64_t i = 4; i < V; ++i) EXPECT_EQ(count[size_t(by_p[size_t(i)])], 0);
}

TEST_F(SamplerTest, PenaltiesFollowOpenAI) {
  std::vector<float> l = logits;
  apply_penalties(l, {{3, 2}, {7, 1}, {9, 0}}, 0.5, 0.25);
  for (int64_t i = 0; i < V; ++i) {
    float want = logits[size_t(i)];
    if (i == 3) want = float(double(logits[3]) - 2 * 0.5 - 0.25);
    if (i == 7) want = float(double(logits[7]) - 1 * 0.5 - 0.25);
    EXPECT_EQ(l[size_t(i)], want) << "token " << i;
  }
  // A presence penalty alone lowers a repeated token once, whatever its count.
  std::vector<float> a = logits, b = logits;
  apply_penalties(a, {{3, 1}}, 0, 1.5);
  apply_penalties(b, {{3, 9}}, 0, 1.5);
  EXPECT_EQ(a[3], b[3]);
  EXPECT_EQ(a[3], float(double(logits[3]) - 1.5));
  // A penalty on the best token moves greedy to the next one.
  std::vector<float> g = logits;
  apply_penalties(g, {{argmax(), 1}}, 2.0, 2.0);
  SamplingParams greedy;
  greedy.temperature = 0;
  const float old = logits[size_t(argmax())];
  std::vector<float> rest = logits;
  rest[size_t(argmax())] = -INFINITY;
  const int32_t second = int32_t(std::max_element(rest.begin(), rest.end()) - rest.begin());
  EXPECT_EQ(sample_token(g.data(), V, greedy, 0), old - 4 > rest[size_t(second)] ? argmax() : second);
}

TEST_F(SamplerTest, LogprobsAreTheLogSoftmaxOfTheRawLogits) {
  const std::vector<double> p = softmax(1.0);
  TokenLogprob t = token_logprobs(logits.data(), V, 5, 3);
  EXPECT_NEAR(t.logprob, std::log(p[5]), 1e-4);
  ASSERT_EQ(t.top.size(), 3u);
  EXPECT_EQ(t.top[0].first, argmax());
  EXPECT_GE(t.top[0].second, t.top[1].second);
  EXPECT_GE(t.top[1].second, t.top[2].second);
  for (auto& [id, lp] : t.top) EXPECT_NEAR(lp, std::log(p[size_t(id)]), 1e-4);
  EXPECT_TRUE(token_logprobs(logits.data(), V, 5, 0).top.empty());
}

TEST_F(SamplerTest, BadValuesAreRefused) {
  auto bad = [](auto change) {
    SamplingParams p;
    change(p);
    EXPECT_THROW(validate_sampling(p), Error);
  };
  bad([](SamplingParams& p) { p.temperature = -1; });
  bad([](SamplingParams& p) { p.temperature = NAN; });
  bad([](SamplingParams& p) { p.top_p = 0; });
  bad([](SamplingParams& p) { p.top_p = 1.5; });
  bad([](SamplingParams& p) { p.top_k = -1; });
  bad([](SamplingParams& p) { p.min_p = 2; });
  bad([](SamplingParams& p) { p.frequency_penalty = 2.5; });
  bad([](SamplingParams& p) { p.presence_penalty = -3; });
  bad([](SamplingParams& p) { p.max_tokens = 0; });
  bad([](SamplingParams& p) { p.top_logprobs = 21; });
  EXPECT_NO_THROW(validate_sampling(SamplingParams{}));
}

}  // namespace
}  // namespace mla::engine

namespace mla::engine {
namespace {

// The platform's greedy pick (Engine::step with greedy) is the sampler's: the first of equal
// maxima; NaN never wins.
TEST(ArgmaxRows, IsTheSamplersGreedyTokenOnEveryPlatform) {
  // V: rows of 16-byte loads (several rounds of four in flight at 102400), and rows that are not.
  for (const int64_t V : {5000, 5003, 102400}) {
    const int64_t R = 7;
    std::vector<float> x(size_t(R * V));
    uint64_t h = 1;
    for (float& v : x) v = float(((h = h * 6364136223846793005ull + 1442695040888963407ull) >> 40) % 1000) / 7.f;
    x[size_t(1 * V + 17)] = 500.f, x[size_t(1 * V + V - 1000)] = 500.f;  // a tie across threads' strides
    x[size_t(2 * V + V - 1)] = 1e30f;                                      // the last element
    for (int64_t i = 0; i < V; ++i) x[size_t(3 * V + i)] = 1.f;            // all equal → 0
    x[size_t(4 * V + 0)] = NAN, x[size_t(4 * V + 9)] = 900.f;               // NaN first, then the max
    for (int64_t i = 0; i < V; ++i) x[size_t(5 * V + i)] = NAN;            // all NaN → 0
    x[size_t(6 * V + 300)] = -INFINITY;
    std::vector<int32_t> want(static_cast<size_t>(R));
    SamplingParams greedy;
    greedy.temperature = 0;
    for (int64_t r = 0; r < R; ++r) want[size_t(r)] = sample_token(&x[size_t(r * V)], V, greedy, 0.0);
    EXPECT_EQ(want[1], 17);
    EXPECT_EQ(want[2], V - 1);
    EXPECT_EQ(want[3], 0);
    EXPECT_EQ(want[4], 9);  // NaN never wins, first or anywhere
    EXPECT_EQ(want[5], 0);
    for (Platform p : {Platform::CPU, Platform::CUDA, Platform::ROCM}) {
      if (!platform_available(p)) continue;
      auto ops = make_ops(p, DType::F32);
      Tensor hx = Tensor::host(DType::F32, {R, V});
      std::memcpy(hx.data(), x.data(), x.size() * 4);
      Tensor dx = ops->upload(hx);
      Tensor out = ops->empty(DType::I32, {R});
      ops->argmax_rows(dx, out);
      Tensor got = ops->download(out);
      for (int64_t r = 0; r < R; ++r)
        EXPECT_EQ(got.ptr<int32_t>()[r], want[size_t(r)]) << platform_name(p) << " V " << V << " row " << r;
    }
  }
}

}  // namespace
}  // namespace mla::engine

namespace mla::engine {
namespace {

// Rows of logits with the parameters a server sees and the edges of the rule: greedy, top_k 1,
// top_k past V, a tiny top_p, min_p near 1, temperatures 0.1-2, and ties (a coarse grid of values,
// a whole row equal).
struct SampleCase {
  std::vector<float> x;  // [R, V]
  std::vector<SampleRow> rows;
};

SampleCase sample_case(int64_t R, int64_t V, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(0, 1);
  std::normal_distribution<float> normal(0, 1);
  SampleCase c;
  c.x.resize(size_t(R * V));
  for (int64_t r = 0; r < R; ++r) {
    float* row = &c.x[size_t(r * V)];
    const int kind = int(rng() % 6);
    const float scale = float(0.5 + 4 * unit(rng));
    for (int64_t i = 0; i < V; ++i) {
      row[i] = normal(rng) * scale;
      if (kind == 1) row[i] = std::round(row[i] * 2) / 2;  // many ties
      if (kind == 2) row[i] = 0.25f;                       // all equal
    }
    if (kind == 3)  // a tied head
      for (int k = 0; k < 5; ++k) row[rng() % uint64_t(V)] = 9 * scale;
    SampleRow p;
    p.temperature = rng() % 10 == 0 ? 0.0 : 0.1 + 1.9 * unit(rng);
    switch (rng() % 6) {
      case 0: p.top_k = 1; break;
      case 1: p.top_k = int64_t(2 + rng() % 60); break;
      case 2: p.top_k = V + int64_t(rng() % 3); break;
      default: p.top_k = 0;
    }
    switch (rng() % 5) {
      case 0: p.top_p = 1e-9; break;
      case 1: case 2: p.top_p = 0.05 + 0.94 * unit(rng); break;
      default: p.top_p = 1.0;
    }
    switch (rng() % 5) {
      case 0: p.min_p = 0.999; break;
      case 1: p.min_p = 0.3 * unit(rng); break;
      default: p.min_p = 0.0;
    }
    p.u = stream_uniform(seed, uint64_t(r), 7);
    c.rows.push_back(p);
  }
  return c;
}

// Whether the host's choice for `row` lies within `eps` of a boundary that summing in another
// order may move: u against a running sum of the draw, top_p · sum against the head's running
// weight, min_p against a weight.
bool near_boundary(const float* row, int64_t V, const SampleRow& p, double eps) {
  if (sample_row_is_greedy(p)) return false;
  const auto dist = sampling_distribution(row, V, p);
  double acc = 0;
  for (const auto& [tok, prob] : dist)
    if (std::abs((acc += prob) - p.u) < eps) return true;
  const std::vector<int32_t> order = order_by_logit(row, V, p.top_k > 0 ? p.top_k : V);
  std::vector<double> w(order.size());
  double sum = 0;
  for (size_t i = 0; i < order.size(); ++i) sum += w[i] = std::exp((double(row[order[i]]) - row[order[0]]) / p.temperature);
  double kept = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    kept += w[i];
    if (p.top_p < 1 && std::abs(kept / sum - p.top_p) < eps) return true;
    if (p.min_p > 0 && std::abs(w[i] - p.min_p) < eps) return true;
  }
  return false;
}

// Ops::sample_rows draws the host sampler's token: on the CPU bit for bit (the same code), on a
// GPU but where u or a cut lies within 1e-6 of a boundary.
TEST(SampleRows, DrawsTheHostSamplersTokenOnEveryPlatform) {
  struct Shape {
    int64_t R, V;
  };
  for (const Shape sh : {Shape{1, 1000}, Shape{128, 1000}, Shape{1, 129280}, Shape{24, 129280}, Shape{128, 129280}}) {
    const bool big = sh.R * sh.V > 4000000;  // the host sorts every row: the largest case on GPUs only
    const SampleCase c = sample_case(sh.R, sh.V, uint64_t(sh.R * 7 + sh.V));
    std::vector<int32_t> want(size_t(sh.R));
    int64_t near = 0, sampled = 0;
    std::vector<bool> is_near(size_t(sh.R));
    if (!big || platform_available(Platform::CUDA) || platform_available(Platform::ROCM))
      for (int64_t r = 0; r < sh.R; ++r) {
        const float* row = &c.x[size_t(r * sh.V)];
        const SampleRow& p = c.rows[size_t(r)];
        want[size_t(r)] = sample_token(row, sh.V,
                                       SamplingParams{.temperature = p.temperature, .top_p = p.top_p, .top_k = p.top_k,
                                                      .min_p = p.min_p},
                                       p.u);
        is_near[size_t(r)] = near_boundary(row, sh.V, p, 1e-6);
        near += is_near[size_t(r)];
        sampled += !sample_row_is_greedy(p);
      }
    for (Platform pl : {Platform::CPU, Platform::CUDA, Platform::ROCM}) {
      if (!platform_available(pl) || (big && pl == Platform::CPU)) continue;
      auto ops = make_ops(pl, DType::F32);
      Tensor hx = Tensor::host(DType::F32, {sh.R, sh.V});
      std::memcpy(hx.data(), c.x.data(), c.x.size() * 4);
      Tensor dx = ops->upload(hx);
      Tensor out = ops->empty(DType::I32, {sh.R});
      ops->sample_rows(dx, c.rows, out);
      const Tensor got = ops->download(out);
      int64_t differ = 0;
      for (int64_t r = 0; r < sh.R; ++r) {
        if (got.ptr<int32_t>()[r] == want[size_t(r)]) continue;
        ++differ;
        if (pl == Platform::CPU || !is_near[size_t(r)])
          ADD_FAILURE() << platform_name(pl) << " R " << sh.R << " V " << sh.V << " row " << r << ": "
                        << got.ptr<int32_t>()[r] << ", the host draws " << want[size_t(r)] << " (temperature "
                        << c.rows[size_t(r)].temperature << ", top_k " << c.rows[size_t(r)].top_k << ", top_p "
                        << c.rows[size_t(r)].top_p << ", min_p " << c.rows[size_t(r)].min_p << ", u "
                        << c.rows[size_t(r)].u << ")";
      }
      std::printf("  %-4s R %3ld V %6ld: %ld sampled rows, %ld near a boundary, %ld differ\n",
                  std::string(platform_name(pl)).c_str(), long(sh.R), long(sh.V), long(sampled), long(near),
                  long(differ));
    }
  }
}

// Decoding a step ahead (Engine::decode_launch: each step's input tokens read where the last step
// left them, on the platform) gives the tokens of step-by-step decoding, greedy and sampled, on
// every platform; a launch that does not follow its step is refused and changes nothing.
TEST(InFlightDecode, GivesTheTokensOfStepByStepDecoding) {
  const std::vector<std::vector<int32_t>> prompts{{121, 3, 1, 230}, {62, 8}, {145, 59, 214, 7, 9}};
  constexpr int kSteps = 6;
  for (Platform pl : {Platform::CPU, Platform::CUDA, Platform::ROCM}) {
    if (!platform_available(pl)) continue;
    auto ops = make_ops(pl, DType::F32);
    LoadedModel lm = load_model(std::string(MLA_TEST_DATA) + "/v3_tiny", *ops);
    for (const bool sampled : {false, true}) {
      SCOPED_TRACE(fmt::format("{} {}", platform_name(pl), sampled ? "sampled" : "greedy"));
      auto rows_of = [&](int step) {
        std::vector<SampleRow> rows;
        for (size_t r = 0; r < prompts.size(); ++r)
          rows.push_back(SampleRow{0.8, 0.9, 0.0, stream_uniform(7, r, uint64_t(step)), 0});
        return rows;
      };
      std::vector<std::vector<int32_t>> got[2];
      for (int ahead = 0; ahead < 2; ++ahead) {
        Engine e(*lm.model, EngineOptions{});
        std::vector<StepRequest> fill;
        for (size_t r = 0; r < prompts.size(); ++r) fill.push_back({RequestId(r + 1), prompts[r]});
        std::vector<int32_t> last = e.step(ForwardMode::EXTEND, fill, true, true).greedy;
        std::vector<StepRequest> first, after;
        for (size_t r = 0; r < prompts.size(); ++r)
          first.push_back({RequestId(r + 1), {last[r]}}), after.push_back({RequestId(r + 1), {}});
        if (!ahead) {
          for (int step = 0; step < kSteps; ++step) {
            const std::vector<SampleRow> rows = rows_of(step);
            const StepResult res = sampled ? e.step(ForwardMode::DECODE, first, true, false, &rows)
                                           : e.step(ForwardMode::DECODE, first, true, true);
            got[0].push_back(sampled ? res.sampled : res.greedy);
            for (size_t r = 0; r < prompts.size(); ++r) first[r].ids = {got[0].back()[r]};
          }
        } else {
          std::vector<SampleRow> rows = rows_of(0);
          Engine::InFlight cur = e.decode_launch(first, nullptr, sampled ? &rows : nullptr);
          for (int step = 1; step < kSteps; ++step) {
            rows = rows_of(step);
            Engine::InFlight next = e.decode_launch(after, &cur, sampled ? &rows : nullptr);
            got[1].push_back(e.finish(cur));
            cur = std::move(next);
          }
          // Refused, nothing changed: a request without an id that the step before did not have,
          // one with no step before; then a step finished twice.
          std::vector<StepRequest> stranger{after[0], {RequestId(9), {}}};
          EXPECT_THROW(e.decode_launch(stranger, &cur), Error);
          EXPECT_THROW(e.decode_launch(after, nullptr), Error);
          EXPECT_EQ(e.length(1), int64_t(prompts[0].size()) + kSteps);
          got[1].push_back(e.finish(cur));
          EXPECT_THROW(e.finish(cur), Error);
        }
        for (size_t r = 0; r < prompts.size(); ++r)
          EXPECT_EQ(e.length(RequestId(r + 1)), int64_t(prompts[r].size()) + kSteps);
      }
      EXPECT_EQ(got[0], got[1]);
    }
  }
}

// A step ahead takes the rows it needs from the step before, in any order, beside requests that
// give their id on the host and without the ones that stopped: the tokens of the same batches run
// step by step.
TEST(InFlightDecode, TakesAnyRowsOfTheStepBefore) {
  const std::vector<std::vector<int32_t>> prompts{{121, 3, 1, 230}, {62, 8}, {145, 59, 214, 7, 9}, {17, 200, 4}};
  // The batches: which requests, and whether each takes its token from the batch before (else the
  // host gives the token it got last).
  const std::vector<std::vector<std::pair<RequestId, bool>>> batches{
      {{1, false}, {2, false}, {3, false}},
      {{3, true}, {1, true}, {4, false}},
      {{4, true}, {2, false}, {3, true}},
      {{2, true}, {4, true}, {3, true}, {1, false}}};
  for (Platform pl : {Platform::CPU, Platform::CUDA, Platform::ROCM}) {
    if (!platform_available(pl)) continue;
    SCOPED_TRACE(platform_name(pl));
    auto ops = make_ops(pl, DType::F32);
    LoadedModel lm = load_model(std::string(MLA_TEST_DATA) + "/v3_tiny", *ops);
    std::vector<std::vector<int32_t>> got[2];
    for (int ahead = 0; ahead < 2; ++ahead) {
      Engine e(*lm.model, EngineOptions{});
      std::vector<StepRequest> fill;
      for (size_t r = 0; r < prompts.size(); ++r) fill.push_back({RequestId(r + 1), prompts[r]});
      const std::vector<int32_t> first = e.step(ForwardMode::EXTEND, fill, true, true).greedy;
      std::map<RequestId, int32_t> last;  // each request's latest token on the host
      for (size_t r = 0; r < prompts.size(); ++r) last[RequestId(r + 1)] = first[r];
      std::optional<Engine::InFlight> cur;
      std::vector<RequestId> cur_ids;
      for (const auto& b : batches) {
        std::vector<StepRequest> reqs;
        for (const auto& [id, from_before] : b)
          reqs.push_back({id, ahead && from_before ? std::vector<int32_t>{} : std::vector<int32_t>{last[id]}});
        if (!ahead) {
          got[0].push_back(e.step(ForwardMode::DECODE, reqs, true, true).greedy);
          for (size_t i = 0; i < b.size(); ++i) last[b[i].first] = got[0].back()[i];
          continue;
        }
        Engine::InFlight next = e.decode_launch(reqs, cur ? &*cur : nullptr);
        if (cur) {
          got[1].push_back(e.finish(*cur));
          for (size_t i = 0; i < cur_ids.size(); ++i) last[cur_ids[i]] = got[1].back()[i];
        }
        cur = std::move(next);
        cur_ids.clear();
        for (const auto& [id, _] : b) cur_ids.push_back(id);
      }
      if (ahead) got[1].push_back(e.finish(*cur));
      EXPECT_EQ(e.length(1), int64_t(prompts[0].size()) + 3);
      EXPECT_EQ(e.length(3), int64_t(prompts[2].size()) + 4);
    }
    EXPECT_EQ(got[0], got[1]);
  }
}

TEST(SampleRows, RefusesBadRows) {
  for (Platform pl : {Platform::CPU, Platform::CUDA, Platform::ROCM}) {
    if (!platform_available(pl)) continue;
    auto ops = make_ops(pl, DType::F32);
    Tensor x = ops->upload(Tensor::host(DType::F32, {2, 10}));
    Tensor out = ops->empty(DType::I32, {2});
    auto bad = [&](auto change, const char* what) {
      std::vector<SampleRow> rows(2);
      change(rows[1]);
      try {
        ops->sample_rows(x, rows, out);
        ADD_FAILURE() << platform_name(pl) << ": accepted " << what;
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
      }
    };
    bad([](SampleRow& p) { p.temperature = -1; }, "temperature");
    bad([](SampleRow& p) { p.top_p = 0; }, "top_p");
    bad([](SampleRow& p) { p.min_p = 1.5; }, "min_p");
    bad([](SampleRow& p) { p.top_k = -2; }, "top_k");
    bad([](SampleRow& p) { p.u = 1; }, "u must");
    EXPECT_THROW(ops->sample_rows(x, std::vector<SampleRow>(1), out), Error) << "rows of another count";
  }
}

}  // namespace
}  // namespace mla::engine
