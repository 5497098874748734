// Tensor parallelism in one process: TP ranks as threads of an InProcessGroup, each loading its
// shard of a committed HF test model (v3_tp, v2_tp: head counts and widths that 2 and 4 divide;
// v3_tp's vocabulary of 250 pads the last shard at TP 4). Every rank gets the same logits bits;
// they equal TP 1's within f32 rounding and transformers' within the oracle tolerance, with every
// method; transformers' greedy ids hold; random weights shard like the whole tensor; shapes that
// TP does not divide are clear errors on every rank.
#include <gtest/gtest.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include "engine/engine.h"
#include "engine/scheduler.h"
#include "harness.h"
#include "mla/communicator.h"
#include "mla/model.h"
#include "mla/platform_ops.h"
#include "mla/registry.h"
#include "oracle.h"

namespace mla::test {
namespace {

// One engine run of a sequence: the method (nullopt: dispatched), prefill chunk, first decode position.
struct SeqRun {
  std::vector<int32_t> ids;
  std::optional<ForwardMethod> method;
  int64_t chunk = 0, decode_from = 0;
};
using Logits = std::vector<float>;

// Each rank (a thread, its own Ops and communicator) loads its shard with `load` and returns the
// logits of every run; throws the first rank's error.
template <class Load>
std::vector<std::vector<Logits>> on_ranks(int tp, Platform p, Load load, const std::vector<SeqRun>& runs) {
  InProcessGroup g(tp);
  std::vector<std::vector<Logits>> out(static_cast<size_t>(tp));
  std::vector<std::string> errors(static_cast<size_t>(tp));
  std::vector<std::thread> threads;
  for (int r = 0; r < tp; ++r)
    threads.emplace_back([&, r] {
      try {
        std::unique_ptr<Ops> ops = make_ops(p, DType::F32);
        std::unique_ptr<Communicator> comm = g.communicator(r, *ops);
        LoadOptions lo;
        lo.tp = comm.get();
        LoadedModel lm = load(*ops, lo);
        EXPECT_EQ(lm.model->tp_size(), tp);
        for (const SeqRun& run : runs) {
          EngineOptions eo;
          eo.forward.method = run.method;
          eo.forward.dispatch.chunk_capacity = 5;  // MHA_CHUNKED_KV reads the prefix in several chunks
          eo.max_tokens = 256;
          Engine e(*lm.model, eo);
          out[size_t(r)].push_back(e.run_sequence(run.ids, run.chunk, run.decode_from).logits);
        }
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
        g.abort(fmt::format("rank {} failed", r));  // the others stop waiting for it
      }
    });
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < tp; ++r)
    if (!errors[size_t(r)].empty() && errors[size_t(r)].find("in-process group: rank") == std::string::npos)
      throw Error(fmt::format("rank {}: {}", r, errors[size_t(r)]));
  return out;
}

std::vector<double> doubles(const Logits& v) { return {v.begin(), v.end()}; }

// Worst relative L2 of TP n against TP 1 over every run, measured on the CPU: 5.4e-7
// (f32 sums of the partial products in another order). The oracle bound is test_oracle's for f32.
constexpr double kTpTol = 3e-6;
constexpr double kOracleTol = 5e-6;

class TpTest : public ::testing::TestWithParam<std::tuple<const char*, int, Platform>> {};

TEST_P(TpTest, EveryRankGetsTheOneGpuLogits) {
  const auto [name, tp, p] = GetParam();
  if (!platform_available(p)) GTEST_SKIP() << "platform " << platform_name(p) << " is not available here";
  const Oracle o = load_oracle(name);
  const std::vector<int32_t>& seq = o.seqs.back();  // 61 tokens
  const int64_t n = int64_t(seq.size());
  std::vector<SeqRun> runs{{seq, std::nullopt, 0, n}, {seq, std::nullopt, 7, n - 9}, {seq, std::nullopt, 0, 0}};
  for (ForwardMethod g : {ForwardMethod::MHA, ForwardMethod::MHA_ONE_SHOT, ForwardMethod::MHA_CHUNKED_KV,
                          ForwardMethod::MLA})
    runs.push_back({seq, resolve_method(p, g), g == ForwardMethod::MHA ? 0 : 7, n});
  std::vector<int32_t> teacher = o.prompt;  // the prompt, then transformers' greedy ids
  teacher.insert(teacher.end(), o.greedy.begin(), o.greedy.end() - 1);
  runs.push_back({teacher, std::nullopt, 0, int64_t(o.prompt.size())});
  auto load = [&](Ops& ops, const LoadOptions& lo) { return load_model(o.dir, ops, lo); };
  const std::vector<Logits> one = on_ranks(1, p, load, runs).at(0);
  const std::vector<std::vector<Logits>> ranks = on_ranks(tp, p, load, runs);
  const int64_t V = int64_t(one[0].size()) / n;
  double worst = 0;
  for (size_t k = 0; k < runs.size(); ++k) {
    for (int r = 1; r < tp; ++r) EXPECT_EQ(ranks[size_t(r)][k], ranks[0][k]) << "rank " << r << " run " << k;
    const double err = rel_l2(doubles(ranks[0][k]), doubles(one[k]));
    worst = std::max(worst, err);
    EXPECT_LE(err, kTpTol) << "run " << k;
    if (k + 1 < runs.size()) EXPECT_LE(rel_l2(doubles(ranks[0][k]), o.logits.back()), kOracleTol) << "run " << k;
  }
  // Greedy: the argmax of each row from the last prompt position is transformers' next id.
  const Logits& g = ranks[0].back();
  for (size_t i = 0; i < o.greedy.size(); ++i) {
    const size_t row = o.prompt.size() - 1 + i;
    const auto first = g.begin() + int64_t(row) * V;
    EXPECT_EQ(std::max_element(first, first + V) - first, o.greedy[i]) << "greedy step " << i;
  }
  std::printf("  measured %s TP %d vs TP 1: worst rel L2 %.2e (tol %.0e)\n", name, tp, worst, kTpTol);
}

INSTANTIATE_TEST_SUITE_P(Models, TpTest,
                         ::testing::Combine(::testing::Values("v3_tp", "v2_tp"), ::testing::Values(2, 4),
                                            ::testing::Values(Platform::CPU, Platform::CUDA)),
                         [](const auto& i) {
                           return fmt::format("{}_tp{}_{}", std::get<0>(i.param), std::get<1>(i.param),
                                              platform_name(std::get<2>(i.param)));
                         });

// Random weights index the whole tensor: a rank's shard holds the same values as that slice of the
// unsharded model, so TP 2 gives TP 1's logits.
TEST(Tp, RandomWeightsShardLikeTheWholeTensor) {
  const ModelConfig c = load_model_config(load_oracle("v3_tp").dir);
  std::vector<int32_t> seq;
  for (int i = 0; i < 40; ++i) seq.push_back(int32_t((i * 37 + 11) % c.vocab_size));
  const std::vector<SeqRun> runs{{seq, std::nullopt, 16, 30}};
  auto load = [&](Ops& ops, const LoadOptions& lo) { return random_model(c, ops, 7, lo); };
  const Logits one = on_ranks(1, Platform::CPU, load, runs).at(0).at(0);
  const std::vector<std::vector<Logits>> two = on_ranks(2, Platform::CPU, load, runs);
  EXPECT_EQ(two[1][0], two[0][0]);
  EXPECT_LE(rel_l2(doubles(two[0][0]), doubles(one)), kTpTol);
}

// Rank 0's messages to one follower, in order.
class Mailbox {
 public:
  void send(const std::string& m) {
    std::lock_guard<std::mutex> l(mu_);
    q_.push_back(m);
    cv_.notify_one();
  }
  std::string receive() {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return !q_.empty(); });
    std::string m = std::move(q_.front());
    q_.pop_front();
    return m;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> q_;
};

// Requests through rank 0's scheduler (prefix cache, chunked prefill, batched decode); the other
// ranks follow its engine. Returns each request's greedy ids, and the followers' step counts.
std::vector<std::vector<int32_t>> schedule(int tp, const std::string& dir, const std::vector<std::vector<int32_t>>& prompts,
                                           std::vector<int64_t>* followed = nullptr) {
  InProcessGroup g(tp);
  std::vector<Mailbox> boxes(static_cast<size_t>(tp));
  std::vector<std::vector<int32_t>> out(prompts.size());
  std::vector<int64_t> steps(static_cast<size_t>(tp), 0);
  std::vector<std::string> errors(static_cast<size_t>(tp));
  std::vector<std::thread> threads;
  for (int r = 0; r < tp; ++r)
    threads.emplace_back([&, r] {
      try {
        std::unique_ptr<Ops> ops = make_ops(Platform::CPU, DType::F32);
        std::unique_ptr<Communicator> comm = g.communicator(r, *ops);
        LoadOptions lo;
        lo.tp = comm.get();
        LoadedModel lm = load_model(dir, *ops, lo);
        EngineOptions eo;
        eo.max_tokens = 512;
        Engine e(*lm.model, eo);
        if (r > 0) {
          steps[size_t(r)] = e.follow([&] { return boxes[size_t(r)].receive(); });
          return;
        }
        e.lead([&](const std::string& m) {
          for (int k = 1; k < tp; ++k) boxes[size_t(k)].send(m);
          steps[0] += !m.empty();  // the last, empty message ends the followers
        });
        engine::SchedulerOptions so;
        so.prefill_chunk = 8;
        so.token_budget = 24;
        engine::Scheduler sched(e, so);
        for (size_t i = 0; i < prompts.size(); ++i) {
          engine::GenerateRequest req;
          req.prompt = prompts[i];
          req.params.temperature = 0;
          req.params.max_tokens = 10;
          sched.add(engine::RequestHandle(i + 1), std::move(req), [&, i](const engine::RequestUpdate& u) {
            for (const engine::ChoiceUpdate& c : u.choices)
              out[i].insert(out[i].end(), c.new_tokens.begin(), c.new_tokens.end());
          });
        }
        while (sched.step()) {
        }
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
        g.abort(fmt::format("rank {} failed", r));  // the others stop waiting for it
      }
    });
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < tp; ++r) EXPECT_EQ(errors[size_t(r)], "") << "rank " << r;
  if (followed) *followed = steps;
  return out;
}

TEST(Tp, FollowersRunTheScheduledSteps) {
  const Oracle o = load_oracle("v3_tp");
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) {  // the oracle's prompt, and three that share its first tokens
    std::vector<int32_t> p = o.prompt;
    if (i > 0) p.resize(size_t(3 + 2 * i)), p.push_back(int32_t(17 * i)), p.push_back(int32_t(40 + i));
    prompts.push_back(p);
  }
  const std::vector<std::vector<int32_t>> one = schedule(1, o.dir, prompts);
  std::vector<int64_t> steps;
  const std::vector<std::vector<int32_t>> two = schedule(2, o.dir, prompts, &steps);
  EXPECT_EQ(two, one);
  ASSERT_EQ(two[0].size(), 10u);
  EXPECT_EQ(two[0],
            std::vector<int32_t>(o.greedy.begin(), o.greedy.begin() + 10));
  EXPECT_GT(steps[0], 4);
  EXPECT_EQ(steps[1], steps[0]);  // every forward rank 0 ran, rank 1 ran
}

TEST(Tp, ShapesTpDoesNotDivideAreClearErrors) {
  auto load_dir = [](const std::string& name) {
    return [name](Ops& ops, const LoadOptions& lo) { return load_model(load_oracle(name).dir, ops, lo); };
  };
  expect_error([&] { on_ranks(2, Platform::CPU, load_dir("v3_tiny"), {}); },
               "rank 0: tensor parallel size 2 does not divide num_attention_heads = 3");
  ModelConfig c = load_model_config(load_oracle("v3_tp").dir);
  c.intermediate_size = 98;
  auto random = [&](Ops& ops, const LoadOptions& lo) { return random_model(c, ops, 0, lo); };
  expect_error([&] { on_ranks(4, Platform::CPU, random, {}); },
               "tensor parallel size 4 does not divide intermediate_size = 98");
  c.intermediate_size = 96;
  c.moe_intermediate_size = 18;
  expect_error([&] { on_ranks(4, Platform::CPU, random, {}); },
               "tensor parallel size 4 does not divide moe_intermediate_size = 18");
}

}  // namespace
}  // namespace mla::test
