// tests/test_step_plan.cpp — one device plan per forward step (Ops::begin_step): a decode step of
// a model copies its plan to the device once and never waits for the device; a layer gives the same
// bits with and without a step (the reference harness's shapes, CUDA and ROCm platforms); a bad
// plan opens no step. The GPU cases skip where the platform is not available.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <string>

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
