// tests/test_step_plan.cpp — one device plan per forward step (Ops::begin_step): a decode step of
// a model copies its plan to the device once and never waits for the device; a layer gives the same
// bits with and without a step (the reference harness's shapes, CUDA and ROCm platforms); a bad
// plan opens no step. The GPU cases skip where the platform is not available.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <tuple>

#include "harness.h"
#include "method_cases.h"
#include "mla/model.h"
#include "mla/platform_ops.h"
#include "mla/reference_harness.h"
#include "mla/registry.h"

namespace mla::test {
namespace {

// Bit patterns equal (NaN included), element by element.
bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0);
}

// A model with DeepSeek-V3 attention head dims (kv_lora_rank 512, rope 64: the CUDA decode
// kernel's shape) at a small hidden size: one dense layer, then two MoE layers (V3 routing).
ModelConfig small_config() {
  ModelConfig c;
  c.attn = mid_config();  // 16 heads, hidden 256
  c.vocab_size = 96;
  c.num_hidden_layers = 3;
  c.intermediate_size = 128;
  c.first_k_dense_replace = 1;
  c.n_routed_experts = 8, c.num_experts_per_tok = 2, c.moe_intermediate_size = 64, c.n_shared_experts = 1;
  c.n_group = 2, c.topk_group = 1;
  c.scoring_func = "sigmoid", c.topk_method = "noaux_tc", c.norm_topk_prob = true, c.routed_scaling_factor = 2.5;
  return c;
}

class StepPlan : public ::testing::TestWithParam<Platform> {};

// A decode step through the whole model (MLA, dense MLP, MoE): the plan (positions, slots,
// segments, token ids, logit rows) goes to the device in one copy, nothing comes back and the host
// never waits inside Model::forward; the decode split schedule is computed once for the step's
// layers (CUDA's fast kernel).
TEST_P(StepPlan, DecodeStepCopiesThePlanOnceAndNeverWaits) {
  const Platform p = GetParam();
  if (!platform_available(p)) GTEST_SKIP() << "platform " << platform_name(p) << " is not available here";
  const ModelConfig cfg = small_config();
  std::unique_ptr<Ops> ops = make_ops(p, DType::BF16);
  LoadedModel lm = random_model(cfg, *ops, 3);
  Model& model = *lm.model;
  KVPool pool({cfg.num_hidden_layers, cfg.attn.kv_row_dim(), DType::BF16, 64, 40},
              [&](DType d, Shape s) { return ops->empty(d, std::move(s)); });
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) ops->fill(pool.buffer(l), 0.25);
  const std::vector<int64_t> prefix = {300, 17, 1000, 64, 5, 129};
  Batch b{ForwardMode::DECODE, {}};
  for (size_t r = 0; r < prefix.size(); ++r) {
    pool.reserve(RequestId(r), prefix[r] + 1);
    b.requests.push_back({RequestId(r), prefix[r], 1});
  }
  const BatchPlan plan = plan_batch(b, pool);
  const std::vector<int32_t> ids = {3, 90, 0, 41, 41, 7};
  ForwardOptions opt;
  if (p == Platform::CUDA) opt.method = ForwardMethod::MLA;  // the fast decode kernel; ROCm: dispatched
  opt.graphs = false;  // op by op: the step's own copies and schedule (StepGraphs replays them)

  // The first steps also upload the RoPE table (once per Ops) and size both pinned buffers.
  const std::vector<double> first = ops->download(model.forward(ids, plan, pool, opt).logits).to_doubles();
  model.forward(ids, plan, pool, opt);
  const StepCounters before = ops->counters();
  ModelOutput out = model.forward(ids, plan, pool, opt);
  const StepCounters step = ops->step_counters();
  const StepCounters forward = ops->counters() - before;
  EXPECT_EQ(step.h2d_copies, 1) << "host→device copies in a decode step";
  EXPECT_EQ(step.d2h_copies, 0);
  EXPECT_EQ(step.host_syncs, 0) << "host waits inside Model::forward";
  EXPECT_EQ(forward.h2d_copies, step.h2d_copies) << "Model::forward copies outside its step";
  EXPECT_EQ(forward.host_syncs, 0);
  if (p == Platform::CUDA) EXPECT_EQ(step.decode_schedules, 1) << "split schedule once per step, not per layer";
  // Same ids, same slots: the second step writes the same rows and gives the same logits.
  const std::vector<double> second = ops->download(out.logits).to_doubles();
  EXPECT_TRUE(same_bits(first, second));
  EXPECT_EQ(ops->step_counters().d2h_copies, 0) << "a closed step's counts stay as they were";
  // The logit rows a server asks for (the last token of each request) travel with the plan too.
  const std::vector<int32_t> rows = {5, 0, 2};
  const ModelOutput picked = model.forward(ids, plan, pool, opt, &rows);
  const StepCounters with_rows = ops->step_counters();
  EXPECT_EQ(with_rows.h2d_copies, 1) << "a step with logit rows";
  EXPECT_EQ(with_rows.host_syncs, 0);
  EXPECT_EQ(picked.logits.dim(0), 3);

  // One layer alone, no step: each call uploads its own arrays (today's path) — the difference the
  // step makes, and proof that the counters see per-layer copies.
  const Tensor x = ops->upload(random_tensor({plan.num_tokens, cfg.hidden_size()}, DType::BF16, 5));
  AttentionLayer layer(cfg.attn, random_attention_weights(cfg.attn, 7, DType::BF16), *ops);
  ops->synchronize();
  const StepCounters c0 = ops->counters();
  layer.forward(x, plan, pool, 0, out.method, opt.dispatch);
  const StepCounters alone = ops->counters() - c0;
  EXPECT_GT(alone.h2d_copies, 1);
  EXPECT_GT(alone.host_syncs, 0);
}

// A bad plan (a slot outside the pool) is an Error from begin_step that opens no step; a step
// cannot be opened twice; Model::forward's step closes when a layer throws.
TEST_P(StepPlan, BadPlansOpenNoStep) {
  const Platform p = GetParam();
  if (!platform_available(p)) GTEST_SKIP() << "platform " << platform_name(p) << " is not available here";
  std::unique_ptr<Ops> ops = make_ops(p, DType::F32);
  KVPool pool({1, 8, DType::F32, 4, 4}, [&](DType d, Shape s) { return ops->empty(d, std::move(s)); });
  pool.reserve(0, 6);
  BatchPlan plan = plan_batch(Batch::from_lengths(ForwardMode::EXTEND, {{2, 4}}), pool);
  BatchPlan bad = plan;
  bad.kv_slots[3] = int32_t(pool.num_slots());
  expect_error([&] { ops->begin_step(bad, pool); }, {"slot 16", "outside the KV pool of 16 slots"});
  EXPECT_FALSE(ops->step_checked(bad, pool));
  {
    StepScope s(*ops, plan, pool);
    EXPECT_TRUE(ops->step_checked(plan, pool));
    EXPECT_FALSE(ops->step_checked(bad, pool));
    expect_error([&] { ops->begin_step(plan, pool); }, "a step is already open");
  }
  EXPECT_FALSE(ops->step_checked(plan, pool));
  ops->begin_step(plan, pool);  // the failed calls left nothing open
  ops->end_step();
}

INSTANTIATE_TEST_SUITE_P(Gpu, StepPlan, ::testing::Values(Platform::CUDA, Platform::ROCM),
                         [](const auto& info) { return std::string(platform_name(info.param)); });

// ---- step graphs (Ops::begin_capture / replay, Model's decode graphs) ----

struct GraphCase {
  std::string name;
  DType act, kv;
  int64_t heads = 16;
  // Copies of the six requests: with 128 heads and six copies (72 row tiles of 64) CUDA's decode
  // takes the persistent see-saw grid at a low kv_fill and the unsplit one at a high one.
  int copies = 1;
};

class StepGraphs : public ::testing::TestWithParam<GraphCase> {};

// Decode steps of the whole model with graphs give the bits of the same steps op by op, step after
// step: requests of many lengths, the longest crossing a key tile inside its kv bucket (the split
// count must stay the graph's), then leaving (a new batch size and bucket: new graphs), the short
// requests replaced by long ones at the same batch size and bucket (another kv_fill: with many
// heads and requests, CUDA's persistent grid against the unsplit one, whose bits differ), logit
// rows, and the device plan growing (recorded graphs no longer fit and are recorded again).
// Replayed steps copy the plan once, never wait, and run no host code for the layers (no split
// schedule).
TEST_P(StepGraphs, DecodeGraphsGiveTheBitsOfTheOpByOpSteps) {
  const GraphCase& gc = GetParam();
  if (!platform_available(Platform::CUDA)) GTEST_SKIP() << "no CUDA device here";
  ModelConfig cfg = small_config();
  cfg.attn.num_attention_heads = gc.heads;
  std::unique_ptr<Ops> ops = make_ops(Platform::CUDA, gc.act);
  ASSERT_TRUE(ops->can_capture());
  LoadedModel lm = random_model(cfg, *ops, 3);
  Model& model = *lm.model;
  const KVPoolConfig pc{cfg.num_hidden_layers, cfg.attn.kv_row_dim(), gc.kv, 16, 200 * int64_t(gc.copies)};
  auto alloc = [&](DType d, Shape s) { return ops->empty(d, std::move(s)); };
  KVPool eager_pool(pc, alloc), graph_pool(pc, alloc);
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    ops->fill_random(eager_pool.buffer(l), 40 + uint64_t(l), 1.0);
    ops->fill_random(graph_pool.buffer(l), 40 + uint64_t(l), 1.0);
    if (gc.kv == DType::F8_E4M3FN) eager_pool.set_scale(l, 0.05), graph_pool.set_scale(l, 0.05);
  }
  // Copy c of the six requests: their lengths + c, but the longest (it crosses 5 · 64 keys after 10
  // steps) only in copy 0, 200 + c in the others.
  const int64_t six_len[] = {60, 17, 127, 310, 5, 129};
  const int32_t six_ids[] = {3, 90, 0, 41, 41, 7};
  std::vector<int64_t> len;
  std::vector<int32_t> ids;
  std::vector<RequestId> rid;
  for (int c = 0; c < gc.copies; ++c)
    for (int i = 0; i < 6; ++i) {
      len.push_back(i == 3 && c > 0 ? 200 + c : six_len[i] + c);
      ids.push_back(six_ids[i]);
      rid.push_back(RequestId(rid.size()));
    }
  RequestId next_id = RequestId(rid.size());
  ForwardOptions eager_opt, graph_opt;
  eager_opt.method = graph_opt.method = ForwardMethod::MLA;
  eager_opt.graphs = false;
  int replays = 0, captures = 0, steps = 0;
  std::set<int32_t> fills, classes;
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int32_t>, int> keys;  // Model's graph keys: steps
  for (int step = 0; step < 30; ++step) {
    if (step == 14) len.erase(len.begin() + 3), ids.erase(ids.begin() + 3), rid.erase(rid.begin() + 3);  // bucket 256
    if (step == 22)  // the requests under 100 keys leave, as many of 190 … 196 come: kv_fill 4 → 7 (3 → 6)
      for (size_t r = 0; r < len.size(); ++r)
        if (len[r] < 100) len[r] = 190 + int64_t(r % 7), rid[r] = next_id++;
    Batch b{ForwardMode::DECODE, {}};
    for (size_t r = 0; r < len.size(); ++r) {
      for (KVPool* pool : {&eager_pool, &graph_pool}) pool->reserve(rid[r], len[r] + 1);
      b.requests.push_back({rid[r], len[r], 1});
    }
    const BatchPlan pe = plan_batch(b, eager_pool), pg = plan_batch(b, graph_pool);
    fills.insert(pg.kv_fill());
    ASSERT_EQ(pe.kv_slots, pg.kv_slots);
    std::vector<int32_t> rows;  // every other step: the logit rows of the last tokens, reversed
    for (size_t r = len.size(); r-- > 0;) rows.push_back(int32_t(r));
    const std::vector<int32_t>* rp = step % 2 ? &rows : nullptr;
    const int32_t cls = ops->launch_class(pg, gc.heads);
    classes.insert(cls);
    ++keys[{pg.num_tokens, int64_t(len.size()), rp ? int64_t(rows.size()) : -1, pg.kv_bucket(), cls}];
    const std::vector<double> want = ops->download(model.forward(ids, pe, eager_pool, eager_opt, rp).logits).to_doubles();
    const StepCounters before = ops->counters();
    const ModelOutput out = model.forward(ids, pg, graph_pool, graph_opt, rp);
    const StepCounters st = ops->step_counters(), all = ops->counters() - before;
    const std::vector<double> got = ops->download(out.logits).to_doubles();
    ASSERT_TRUE(same_bits(want, got)) << "step " << step << ": the graph's logits differ from the op-by-op step";
    EXPECT_EQ(st.host_syncs, 0) << "step " << step;
    EXPECT_EQ(st.h2d_copies, 1) << "step " << step;
    if (st.graph_replays) {
      ++replays;
      if (!st.graph_captures) EXPECT_EQ(st.decode_schedules, 0) << "a replay runs no host code for the layers";
    }
    captures += int(st.graph_captures);
    EXPECT_EQ(all.host_syncs, 0);
    ++steps;
    // The next ids: the eager step's greedy choice of each request's row.
    const int64_t V = cfg.vocab_size;
    for (size_t r = 0; r < len.size(); ++r) {
      const size_t row = rp ? len.size() - 1 - r : r;
      const double* x = want.data() + row * size_t(V);
      ids[r] = int32_t(std::max_element(x, x + V) - x);
      ++len[r];
    }
  }
  // Each shape's first step runs op by op; shapes: 6 requests in bucket 512 (kv_fill 2; 3 only in
  // the last step), then 5 in bucket 256 at two fills, each with and without logit rows.
  const std::set<int32_t> want_fills = gc.copies == 1 ? std::set<int32_t>{2, 3, 4, 7} : std::set<int32_t>{2, 3, 6};
  EXPECT_EQ(fills, want_fills);
  // Only the 64-row kernels follow the fill: at 16 heads one class, so the fills share graphs; at
  // 128 heads the persistent grid (fills 2, 3) and the unsplit one (6).
  const std::set<int32_t> want_classes = gc.heads == 16 ? std::set<int32_t>{0} : std::set<int32_t>{0, 1};
  EXPECT_EQ(classes, want_classes);
  EXPECT_EQ(model.graphs_kept(), keys.size()) << "one graph (or shape seen once) for each key, no more";
  // A key's first step runs op by op, every later one replays (recording first where it must).
  int repeated = 0;
  for (const auto& [key, n] : keys) repeated += n > 1;
  EXPECT_GE(repeated, 4);
  EXPECT_GE(captures, repeated);
  EXPECT_EQ(replays, steps - int(keys.size()));
  EXPECT_LE(model.graphs_kept(), Model::kMaxGraphs);
}

INSTANTIATE_TEST_SUITE_P(Cuda, StepGraphs,
                         ::testing::Values(GraphCase{"bf16_kvbf16", DType::BF16, DType::BF16},
                                           GraphCase{"bf16_kvfp8", DType::BF16, DType::F8_E4M3FN},
                                           GraphCase{"f32_kvf32", DType::F32, DType::F32},
                                           GraphCase{"bf16_kvbf16_h128x6", DType::BF16, DType::BF16, 128, 6},
                                           GraphCase{"bf16_kvfp8_h128x6", DType::BF16, DType::F8_E4M3FN, 128, 6}),
                         [](const auto& info) { return info.param.name; });

// The timeline of a decode step names the model's sections in order, one attention and one MLP or
// MoE section a layer, with nonnegative times; on CUDA a replayed graph brings back its own marks,
// and a graph recorded without the timeline is recorded again with it.
TEST(StepTimeline, SectionsOfADecodeStepInOrder) {
  for (Platform p : {Platform::CPU, Platform::CUDA}) {
    if (!platform_available(p)) continue;
    const ModelConfig cfg = small_config();
    std::unique_ptr<Ops> ops = make_ops(p, DType::BF16);
    LoadedModel lm = random_model(cfg, *ops, 3);
    KVPool pool({cfg.num_hidden_layers, cfg.attn.kv_row_dim(), DType::BF16, 16, 8},
                [&](DType d, Shape s) { return ops->empty(d, std::move(s)); });
    pool.reserve(0, 30);
    const BatchPlan plan = plan_batch(Batch::from_lengths(ForwardMode::DECODE, {{29, 1}}), pool);
    ForwardOptions opt;
    opt.method = ForwardMethod::MLA;
    const std::vector<std::string> want = {"embed", "attention", "mlp", "attention", "moe", "attention", "moe", "head"};
    for (int step = 0; step < 5; ++step) {
      if (step == 2) ops->set_timeline(true);  // graphs of steps 1–2 were recorded without marks
      lm.model->forward({7}, plan, pool, opt);
      const auto t = ops->timeline();
      if (step < 2) {
        EXPECT_TRUE(t.empty()) << platform_name(p);
        continue;
      }
      std::vector<std::string> labels;
      for (const auto& [label, ms] : t) {
        labels.push_back(label);
        EXPECT_GE(ms, 0.0) << label;
      }
      EXPECT_EQ(labels, want) << platform_name(p) << " step " << step;
    }
    if (p == Platform::CUDA) EXPECT_GT(ops->counters().graph_replays, 1);
  }
}

// What cannot be recorded is an Error that leaves the platform running calls; a graph replays only
// into a step of its layout; platforms without graphs say so.
TEST(StepGraphCapture, FailuresLeaveTheOpsWorking) {
  for (Platform p : {Platform::CPU, Platform::ROCM})
    if (platform_available(p)) {
      std::unique_ptr<Ops> ops = make_ops(p, DType::F32);
      EXPECT_FALSE(ops->can_capture()) << platform_name(p);
      expect_error([&] { ops->begin_capture(); }, "cannot record step graphs");
    }
  if (!platform_available(Platform::CUDA)) GTEST_SKIP() << "no CUDA device here";
  std::unique_ptr<Ops> ops = make_ops(Platform::CUDA, DType::F32);
  KVPool pool({1, 8, DType::F32, 4, 400}, [&](DType d, Shape s) { return ops->empty(d, std::move(s)); });
  pool.reserve(0, 6);
  pool.reserve(1, 3);
  pool.reserve(2, 1501);
  const BatchPlan one = plan_batch(Batch::from_lengths(ForwardMode::DECODE, {{5, 1}}), pool);
  const BatchPlan two = plan_batch(Batch::from_lengths(ForwardMode::DECODE, {{5, 1}, {2, 1}}), pool);
  expect_error([&] { ops->begin_capture(); }, "begin_capture outside a step");
  Tensor host = Tensor::host(DType::F32, {4});
  std::unique_ptr<Ops::StepGraph> g;
  {
    StepScope s(*ops, one, pool);
    ops->begin_capture();
    expect_error([&] { ops->upload(host); }, "an upload cannot be recorded");
    expect_error([&] { ops->synchronize(); }, "a synchronization cannot be recorded");
    expect_error([&] { ops->end_capture(/*failed=*/true); }, "recording a step graph failed");
    // Running again: a copy and a download.
    Tensor d = ops->upload(host);
    ops->fill(d, 2.0);
    EXPECT_EQ(ops->download(d).to_doubles(), std::vector<double>(4, 2.0));
    ops->begin_capture();
    ops->fill(d, 3.0);
    g = ops->end_capture();
    EXPECT_EQ(ops->download(d).to_doubles(), std::vector<double>(4, 2.0)) << "recorded, not run";
    EXPECT_TRUE(ops->replay(*g));
    EXPECT_EQ(ops->download(d).to_doubles(), std::vector<double>(4, 3.0));
  }
  EXPECT_FALSE(ops->replay(*g)) << "outside a step";
  {
    StepScope s(*ops, two, pool);
    EXPECT_FALSE(ops->replay(*g)) << "a step of another layout";
  }
  {
    StepScope s(*ops, one, pool);
    EXPECT_TRUE(ops->replay(*g));
  }
  // One request as before, but 1501 cache slots: the device plan outgrows its buffer and moves.
  const BatchPlan longer = plan_batch(Batch{ForwardMode::DECODE, {{RequestId(2), 1500, 1}}}, pool);
  {
    StepScope s(*ops, longer, pool);
    EXPECT_FALSE(ops->replay(*g)) << "the device plan moved: the graph reads the old one";
  }
}

// Every method on the harness's shapes: a layer run inside a step (its arrays resolved to the
// device plan, its slots checked once) gives the bits of the same layer without one.
class StepBits : public ::testing::TestWithParam<LayerCase> {};

TEST_P(StepBits, SameBitsWithAndWithoutAStep) {
  const LayerCase& c = GetParam();
  if (!platform_available(c.platform)) GTEST_SKIP() << "platform " << platform_name(c.platform) << " is not available here";
  LayerFixture fx(c);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const Batch batch = Batch::from_lengths(c.mode, c.requests);
  int ran = 0;
  for (const MethodImpl* impl : method_impls()) {
    if (impl->platform != c.platform || impl->cannot_serve(batch)) continue;
    const ForwardMethod m = impl->method;
    const LayerRun a = fx.run(m, nan);
    const LayerRun s = fx.run(m, nan, true);
    const StepCounters k = fx.ops().step_counters();
    EXPECT_TRUE(same_bits(a.out, s.out)) << method_name(m) << ": output";
    EXPECT_TRUE(same_bits(a.lse, s.lse)) << method_name(m) << ": LSE";
    EXPECT_TRUE(same_bits(a.new_rows, s.new_rows)) << method_name(m) << ": cached rows";
    EXPECT_EQ(k.d2h_copies, 0) << method_name(m);
    // The chunked methods stage each prefix chunk's own slots, MHA_ROCM each request's prefix
    // slots: arrays of their own, not of the plan.
    const std::string name(method_name(m));
    if (name.find("CHUNKED") == std::string::npos && name != "MHA_ROCM") {
      EXPECT_EQ(k.h2d_copies, 1) << method_name(m) << ": copies inside the step";
      EXPECT_EQ(k.host_syncs, 0) << method_name(m) << ": host waits inside the step";
    }
    ++ran;
  }
  EXPECT_GE(ran, 3);
}

INSTANTIATE_TEST_SUITE_P(Cuda, StepBits, ::testing::ValuesIn(all_cases(Platform::CUDA)),
                         [](const auto& info) { return info.param.name; });
INSTANTIATE_TEST_SUITE_P(Rocm, StepBits, ::testing::ValuesIn(rocm_cases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace mla::test
