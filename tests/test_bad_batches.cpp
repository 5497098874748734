// Broken batches at the API, where a scheduler other than ours builds them: slots outside the
// pool (hand-made plans and direct cache calls), prefixes longer than what the cache holds or
// than the sequence, empty batches, duplicate and unknown requests. Each is one Error naming the
// problem, and the pool (rows and tables) and the engine are exactly as before.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>

#include "harness.h"
#include "mla/attention.h"
#include "engine/engine.h"
#include "mla/error.h"
#include "mla/model.h"
#include "mla/platform_ops.h"
#include "mla/registry.h"

namespace mla::test {
namespace {

AttentionConfig tiny_config() {
  AttentionConfig c = preset_config("deepseek-v3");
  c.hidden_size = 64, c.num_attention_heads = 3, c.q_lora_rank = 24, c.kv_lora_rank = 32;
  c.qk_nope_head_dim = 16, c.qk_rope_head_dim = 8, c.v_head_dim = 12;
  return c;
}

// The error `f` throws (one line, containing `needle`).
// A pool's rows and tables, to compare before and after a refused call.
struct PoolImage {
  std::string bytes;
  int64_t free_pages;
  std::vector<std::pair<RequestId, std::vector<int32_t>>> pages;
  bool operator==(const PoolImage&) const = default;
};
PoolImage image(Ops& ops, const KVPool& pool) {
  PoolImage im;
  Tensor h = ops.download(pool.buffer(0));
  im.bytes.assign(static_cast<const char*>(h.data()), h.nbytes());
  im.free_pages = pool.free_pages();
  for (RequestId id : pool.request_ids()) im.pages.emplace_back(id, pool.pages(id));
  return im;
}

// The per-platform tests run once per platform; one that is not here skips visibly.
class BadBatchesOn : public ::testing::TestWithParam<Platform> {
 protected:
  void SetUp() override {
    if (!platform_available(GetParam()))
      GTEST_SKIP() << "platform " << platform_name(GetParam()) << " is not available here";
  }
};

// One layer with a pool holding two requests: 10 (prefix 5, 3 new) and 11 (prefix 0, 4 new).
struct Layer {
  AttentionConfig cfg = tiny_config();
  std::unique_ptr<Ops> ops;
  std::unique_ptr<AttentionLayer> layer;
  std::unique_ptr<KVPool> pool;
  Batch batch{ForwardMode::EXTEND, {{10, 5, 3}, {11, 0, 4}}};
  explicit Layer(Platform p) {
    ops = make_ops(p, DType::F32);
    layer = std::make_unique<AttentionLayer>(cfg, random_attention_weights(cfg, 3, DType::F32),
                                             *ops);
    pool = std::make_unique<KVPool>(KVPoolConfig{1, cfg.kv_row_dim(), DType::BF16, 4, 8},
                                    [&](DType d, Shape s) { return ops->empty(d, s); });
    ops->fill(pool->buffer(0), 0.25);
    pool->reserve(10, 8);
    pool->reserve(11, 4);
  }
  Tensor x(int64_t tokens) {
    return ops->upload(Tensor::host_from(randn(size_t(tokens * cfg.hidden_size), 9), DType::F32,
                                         {tokens, cfg.hidden_size}));
  }
};

TEST_P(BadBatchesOn, SlotsOutsideThePoolAreRefusedByEveryMethod) {
  const Platform p = GetParam();
  int ran = 0;
  for (const MethodImpl* impl : method_impls()) {
      if (impl->platform != p) continue;
      SCOPED_TRACE(fmt::format("{} on {}", method_name(impl->method), platform_name(p)));
      Layer l(p);
      Batch fresh{ForwardMode::EXTEND, {{10, 0, 3}, {11, 0, 4}}};  // every method but the decode-only ones
      Batch decode{ForwardMode::DECODE, {{10, 0, 1}, {11, 0, 1}}};
      const BatchPlan good = plan_batch(impl->cannot_serve(fresh) ? decode : fresh, *l.pool);
      const PoolImage before = image(*l.ops, *l.pool);
      const int32_t n = int32_t(l.pool->num_slots());
      for (int32_t bad : {n, n + 100, -1, std::numeric_limits<int32_t>::min()}) {
        BatchPlan plan = good;  // a scheduler's hand-made plan: one new token's slot is wrong
        plan.new_slots[1] = bad;
        plan.kv_slots[1] = bad;
        expect_error([&] { l.layer->forward(l.x(good.num_tokens), plan, *l.pool, 0, impl->method); },
                     fmt::format("slot {} is outside the", bad));
        EXPECT_TRUE(image(*l.ops, *l.pool) == before) << "slot " << bad << " changed the pool";
      }
      ++ran;
    }
  EXPECT_GE(ran, 4) << "too few methods on " << platform_name(p);
}

TEST_P(BadBatchesOn, CacheCallsRefuseSlotsOutsideThePool) {
  {
    const Platform p = GetParam();
    Layer l(p);
    const PoolImage before = image(*l.ops, *l.pool);
    const int64_t D = l.cfg.kv_row_dim();
    Tensor rows = l.ops->upload(Tensor::host_from(std::vector<double>(size_t(2 * D), 1.0),
                                                  DType::F32, {2, D}));
    const int32_t n = int32_t(l.pool->num_slots());
    for (int32_t bad : {n, -1}) {
      expect_error([&] { l.ops->cache_write(*l.pool, 0, {0, bad}, rows); }, "outside the pool");
      expect_error([&] { l.ops->cache_read(*l.pool, 0, {bad, 0}, rows); }, "outside the pool");
    }
    expect_error([&] { l.ops->cache_write(*l.pool, 1, {0, 1}, rows); }, "layer 1 out of range");
    EXPECT_TRUE(image(*l.ops, *l.pool) == before);
  }
}

TEST(BadBatches, PlansRefuseWhatThePoolDoesNotHold) {
  Layer l(Platform::CPU);
  const PoolImage before = image(*l.ops, *l.pool);
  // Prefix + new beyond the request's reserved tokens: request 11 holds 4.
  expect_error([&] { plan_batch({ForwardMode::EXTEND, {{11, 3, 2}}}, *l.pool); },
               "needs 5 tokens reserved in the KV pool, has 4");
  expect_error([&] { plan_batch({ForwardMode::DECODE, {{11, 9, 1}}}, *l.pool); },
               "needs 10 tokens reserved");
  expect_error([&] { plan_batch({ForwardMode::EXTEND, {{12, 0, 1}}}, *l.pool); },
               "(id 12) is not in the KV pool");
  expect_error([&] { plan_batch({ForwardMode::EXTEND, {{10, 0, 1}, {10, 1, 1}}}, *l.pool); },
               "id duplicates request 0");
  expect_error([&] { plan_batch({ForwardMode::EXTEND, {{10, -1, 2}}}, *l.pool); },
               "prefix_len must be >= 0");
  expect_error([&] { plan_batch({ForwardMode::EXTEND, {{10, 2147483647, 1}}}, *l.pool); },
               "exceeds the int32 range");
  // Prefix longer than the sequence, as the dispatcher sees batches.
  expect_error([&] { dispatch(Batch::from_seq_lens(ForwardMode::EXTEND, {12}, {11}), {}, Platform::CPU); },
               "prefix_len 12 exceeds seq_len 11");
  EXPECT_TRUE(image(*l.ops, *l.pool) == before);
}

TEST(BadBatches, AnEmptyBatchIsRefusedOrHarmless) {
  Layer l(Platform::CPU);
  const PoolImage before = image(*l.ops, *l.pool);
  for (ForwardMethod m : generic_methods()) {
    const BatchPlan plan = plan_batch({ForwardMode::EXTEND, {}}, *l.pool);
    try {
      AttentionOutput o = l.layer->forward(l.x(0), plan, *l.pool, 0, m);
      EXPECT_EQ(o.out.numel(), 0) << method_name(m);
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    }
  }
  EXPECT_TRUE(image(*l.ops, *l.pool) == before);
}

// The engine, with a real model: a bad batch is refused before anything changes.
TEST(BadBatches, EngineRefusesBadBatchesAndChangesNothing) {
  std::unique_ptr<Ops> ops = make_ops(Platform::CPU, DType::F32);
  LoadedModel lm = load_model(std::string(MLA_TEST_DATA) + "/v3_tiny", *ops);
  EngineOptions opt;
  opt.page_size = 4;
  opt.max_tokens = 16;
  Engine e(*lm.model, opt);
  e.step(ForwardMode::EXTEND, {{1, {3, 4, 5}}});
  auto state = [&] {
    std::vector<std::pair<RequestId, std::vector<int32_t>>> v;
    for (RequestId id : e.pool().request_ids()) v.emplace_back(id, e.pool().pages(id));
    return std::pair{v, e.pool().free_pages()};
  };
  const auto before = state();
  expect_error([&] { e.step(ForwardMode::EXTEND, {}); }, "empty batch");
  expect_error([&] { e.step(ForwardMode::DECODE, {{1, {3, 4}}}); }, "new_len must be 1");
  expect_error([&] { e.step(ForwardMode::EXTEND, {{1, {3}}, {1, {4}}}); }, "id duplicates");
  expect_error([&] { e.step(ForwardMode::EXTEND, {{2, {3}}, {1, {512}}}); },
               "token id 512 is outside the vocabulary");
  expect_error([&] { e.step(ForwardMode::EXTEND, {{2, {3}}, {1, {-1}}}); },
               "token id -1 is outside the vocabulary");
  expect_error([&] { e.step(ForwardMode::EXTEND, {{2, std::vector<int32_t>(14, 1)}}); },
               "more pages");  // 16 tokens of room, request 1 holds 3 (one page of 4)
  expect_error([&] { e.step(ForwardMode::EXTEND, {{2, std::vector<int32_t>(513, 1)}}); },
               "past max_position_embeddings 512");
  EXPECT_EQ(state(), before);
  EXPECT_EQ(e.length(1), 3);
  EXPECT_EQ(e.length(2), 0);
  e.step(ForwardMode::DECODE, {{1, {6}}});  // and it still works
  EXPECT_EQ(e.length(1), 4);
}

INSTANTIATE_TEST_SUITE_P(Platforms, BadBatchesOn, ::testing::Values(Platform::CPU, Platform::CUDA, Platform::ROCM),
                         [](const auto& i) { return std::string(platform_name(i.param)); });

}  // namespace
}  // namespace mla::test
