// Forward modes, batch validation and plans against the KV pool.
#include <gtest/gtest.h>

#include <string>

#include "mla/batch.h"
#include "mla/error.h"
#include "harness.h"

namespace mla {
namespace {

Batch make(ForwardMode m, std::vector<BatchRequest> rs) { return Batch{m, std::move(rs)}; }

TEST(Batch, ModeNamesRoundTrip) {
  for (ForwardMode m : {ForwardMode::EXTEND, ForwardMode::DECODE, ForwardMode::TARGET_VERIFY,
                        ForwardMode::DRAFT_EXTEND, ForwardMode::IDLE})
    EXPECT_EQ(parse_mode(mode_name(m)), m);
  EXPECT_EQ(mode_name(ForwardMode::TARGET_VERIFY), "target_verify");
  EXPECT_EQ(mode_name(ForwardMode::DRAFT_EXTEND), "draft_extend");
  expect_error([] { parse_mode("prefill"); },
               {"'prefill'", "extend", "decode", "target_verify", "draft_extend", "idle"});
  expect_error([] { parse_mode("EXTEND"); }, {"'EXTEND'"});
}

TEST(Batch, Helpers) {
  Batch b = make(ForwardMode::EXTEND, {{1, 3, 2}, {2, 0, 5}, {3, 7, 0}});
  EXPECT_EQ(b.num_tokens(), 7);
  EXPECT_EQ(b.sum_prefix(), 10);
  EXPECT_EQ(b.sum_seq(), 17);
  EXPECT_EQ(b.prefix_lens(), (std::vector<int64_t>{3, 0, 7}));
  EXPECT_EQ(b.seq_lens(), (std::vector<int64_t>{5, 5, 7}));
  Batch empty;
  EXPECT_EQ(empty.num_tokens(), 0);
  EXPECT_EQ(empty.sum_seq(), 0);
  EXPECT_TRUE(empty.seq_lens().empty());
}

TEST(Batch, ValidationErrorsNameRequestAndField) {
  // Negative lengths, any mode.
  expect_error([] { validate_batch(make(ForwardMode::EXTEND, {{4, 0, 1}, {9, -1, 2}})); },
               {"request 1", "id 9", "prefix_len", "-1"});
  expect_error([] { validate_batch(make(ForwardMode::DRAFT_EXTEND, {{4, 0, -2}})); },
               {"request 0", "id 4", "new_len", "-2"});
  // Duplicate ids.
  expect_error([] { validate_batch(make(ForwardMode::EXTEND, {{4, 0, 1}, {5, 0, 1}, {4, 2, 1}})); },
               {"request 2", "id 4", "request 0"});
  // DECODE: one token each.
  expect_error([] { validate_batch(make(ForwardMode::DECODE, {{1, 5, 1}, {2, 3, 2}})); },
               {"request 1", "id 2", "new_len", "decode", "got 2"});
  expect_error([] { validate_batch(make(ForwardMode::DECODE, {{1, 5, 0}})); },
               {"request 0", "id 1", "new_len", "decode"});
  // TARGET_VERIFY: the same new_len >= 1 for all.
  expect_error([] { validate_batch(make(ForwardMode::TARGET_VERIFY, {{1, 5, 4}, {2, 3, 3}})); },
               {"request 1", "id 2", "new_len", "target_verify", "4", "got 3"});
  expect_error([] { validate_batch(make(ForwardMode::TARGET_VERIFY, {{1, 5, 0}, {2, 3, 0}})); },
               {"request 0", "id 1", "new_len", "target_verify"});
  // IDLE: no tokens.
  expect_error([] { validate_batch(make(ForwardMode::IDLE, {{1, 0, 0}, {6, 3, 1}})); },
               {"request 1", "id 6", "new_len", "idle"});
  // Positions must fit int32.
  expect_error([] { validate_batch(make(ForwardMode::EXTEND, {{1, int64_t(1) << 31, 1}})); },
               {"request 0", "id 1", "prefix_len"});

  // Valid batches.
  validate_batch(make(ForwardMode::EXTEND, {{1, 0, 0}, {2, 3, 7}}));
  validate_batch(make(ForwardMode::DRAFT_EXTEND, {{1, 4, 0}, {2, 0, 3}}));
  validate_batch(make(ForwardMode::DECODE, {{1, 9, 1}, {2, 0, 1}}));
  validate_batch(make(ForwardMode::TARGET_VERIFY, {{1, 9, 3}, {2, 0, 3}}));
  validate_batch(make(ForwardMode::IDLE, {}));
  validate_batch(make(ForwardMode::IDLE, {{1, 4, 0}}));
  validate_batch(make(ForwardMode::EXTEND, {}));
}

// The plan, recomputed independently from the pool's page table.
void check_plan(const Batch& b, const KVPool& pool) {
  const BatchPlan p = plan_batch(b, pool);
  const int64_t ps = pool.config().page_size;
  auto slot = [&](RequestId id, int64_t t) {
    const auto& pages = pool.pages(id);
    return int32_t(pages[size_t(t / ps)] * ps + t % ps);
  };
  const size_t R = b.requests.size();
  ASSERT_EQ(p.batch.requests.size(), R);
  ASSERT_EQ(p.q_start.size(), R);
  ASSERT_EQ(p.kv_start.size(), R);
  EXPECT_EQ(p.num_tokens, b.num_tokens());
  ASSERT_EQ(int64_t(p.positions.size()), b.num_tokens());
  ASSERT_EQ(int64_t(p.new_slots.size()), b.num_tokens());
  ASSERT_EQ(int64_t(p.kv_slots.size()), b.sum_seq());
  int64_t q = 0, kv = 0;
  for (size_t r = 0; r < R; ++r) {
    const BatchRequest& req = b.requests[r];
    EXPECT_EQ(p.q_start[r], q) << "request " << r;
    EXPECT_EQ(p.kv_start[r], kv) << "request " << r;
    for (int64_t i = 0; i < req.new_len; ++i) {
      EXPECT_EQ(p.positions[size_t(q + i)], req.prefix_len + i);
      EXPECT_EQ(p.new_slots[size_t(q + i)], slot(req.id, req.prefix_len + i));
    }
    for (int64_t t = 0; t < req.prefix_len + req.new_len; ++t)
      EXPECT_EQ(p.kv_slots[size_t(kv + t)], slot(req.id, t));
    // The new tokens' slots are the tail of the request's kv slots.
    for (int64_t i = 0; i < req.new_len; ++i)
      EXPECT_EQ(p.new_slots[size_t(q + i)], p.kv_slots[size_t(kv + req.prefix_len + i)]);
    q += req.new_len;
    kv += req.prefix_len + req.new_len;
  }

  const AttnSegments a = p.new_only();
  EXPECT_TRUE(a.causal);
  ASSERT_EQ(a.num_requests(), int64_t(R));
  EXPECT_EQ(a.total_q(), b.num_tokens());
  EXPECT_EQ(a.total_k(), b.num_tokens());
  for (size_t r = 0; r < R; ++r) {
    EXPECT_EQ(a.q_start[r], p.q_start[r]);
    EXPECT_EQ(a.q_len[r], b.requests[r].new_len);
    EXPECT_EQ(a.k_start[r], p.q_start[r]);
    EXPECT_EQ(a.k_len[r], b.requests[r].new_len);
  }
  const AttnSegments s = p.prefix_and_new();
  EXPECT_TRUE(s.causal);
  ASSERT_EQ(s.num_requests(), int64_t(R));
  EXPECT_EQ(s.total_q(), b.num_tokens());
  EXPECT_EQ(s.total_k(), b.sum_seq());
  for (size_t r = 0; r < R; ++r) {
    EXPECT_EQ(s.q_start[r], p.q_start[r]);
    EXPECT_EQ(s.q_len[r], b.requests[r].new_len);
    EXPECT_EQ(s.k_start[r], p.kv_start[r]);
    EXPECT_EQ(s.k_len[r], b.requests[r].prefix_len + b.requests[r].new_len);
  }
}

TEST(BatchPlan, RaggedExtendWithEmptyRequest) {
  for (int64_t ps : {1, 5, 16}) {
    KVPool pool(KVPoolConfig{1, 8, DType::F32, ps, 200});
    // Interleaved reservations so pages are not contiguous per request.
    pool.reserve(10, 3);
    pool.reserve(11, 17);
    pool.reserve(10, 13);
    pool.reserve(12, 4);
    pool.reserve(13, 40);
    pool.reserve(11, 31);
    Batch b = make(ForwardMode::EXTEND, {{11, 20, 11}, {12, 4, 0}, {10, 0, 13}, {13, 33, 7}});
    check_plan(b, pool);
    // Fixed expectations for page size 1 (slots equal pages).
    if (ps == 1) {
      BatchPlan p = plan_batch(b, pool);
      EXPECT_EQ(p.q_start, (std::vector<int64_t>{0, 11, 11, 24}));
      EXPECT_EQ(p.kv_start, (std::vector<int64_t>{0, 31, 35, 48}));
      EXPECT_EQ(p.positions[0], 20);
      EXPECT_EQ(p.positions[11], 0);
      EXPECT_EQ(p.positions[24], 33);
      EXPECT_EQ(p.kv_slots[0], 3);   // request 11 got pages 3..19 first
      EXPECT_EQ(p.kv_slots[35], 0);  // request 10 starts at page 0
      EXPECT_EQ(p.kv_slots[38], 20);  // then its pages 20.. after the grow
    }
    // A reservation longer than the batch needs is fine.
    check_plan(make(ForwardMode::EXTEND, {{13, 10, 5}}), pool);
  }
}

TEST(BatchPlan, DecodeVerifyDraftIdle) {
  for (int64_t ps : {1, 16}) {
    KVPool pool(KVPoolConfig{2, 8, DType::BF16, ps, 64});
    pool.reserve(1, 9);
    pool.reserve(2, 33);
    pool.reserve(3, 1);
    check_plan(make(ForwardMode::DECODE, {{1, 8, 1}, {2, 32, 1}, {3, 0, 1}}), pool);
    check_plan(make(ForwardMode::TARGET_VERIFY, {{1, 5, 4}, {2, 29, 4}}), pool);
    check_plan(make(ForwardMode::DRAFT_EXTEND, {{2, 30, 3}, {3, 0, 1}, {1, 9, 0}}), pool);
    check_plan(make(ForwardMode::IDLE, {}), pool);
    check_plan(make(ForwardMode::IDLE, {{2, 33, 0}}), pool);
    const BatchPlan idle = plan_batch(make(ForwardMode::IDLE, {}), pool);
    EXPECT_EQ(idle.num_tokens, 0);
    EXPECT_EQ(idle.new_only().num_requests(), 0);
  }
}

// kv_fill: the batch's keys over requests × longest, in eighths rounded down, 1 … 8, the plan's
// from prefix + new tokens, and the same as the platforms compute it from a segment set's lengths.
TEST(BatchPlan, KvFill) {
  EXPECT_EQ(kv_fill(0, 0, 0), 8);       // no request
  EXPECT_EQ(kv_fill(0, 3, 0), 8);       // no key
  EXPECT_EQ(kv_fill(300, 3, 100), 8);   // all as long as the longest
  EXPECT_EQ(kv_fill(299, 3, 100), 7);   // one key short: rounded down
  EXPECT_EQ(kv_fill(150, 3, 100), 4);   // half
  EXPECT_EQ(kv_fill(149, 3, 100), 3);
  EXPECT_EQ(kv_fill(101, 64, 100), 1);  // one long among empty ones: at least 1
  EXPECT_EQ(kv_fill(int64_t(1) << 40, 1 << 20, int64_t(1) << 20), 8);  // no overflow
  KVPool pool(KVPoolConfig{2, 8, DType::BF16, 16, 64});
  pool.reserve(1, 40), pool.reserve(2, 8), pool.reserve(3, 17);
  // keys 40 + 8 + 17 = 65 of 3 × 40: 8 · 65 / 120 = 4.33
  const BatchPlan p = plan_batch(make(ForwardMode::DECODE, {{1, 39, 1}, {2, 7, 1}, {3, 16, 1}}), pool);
  EXPECT_EQ(p.kv_fill(), 4);
  const AttnSegments& s = p.prefix_and_new();
  int64_t keys = 0, longest = 0;
  for (int64_t k : s.k_len) keys += k, longest = std::max(longest, k);
  EXPECT_EQ(kv_fill(keys, int64_t(s.k_len.size()), longest), p.kv_fill());
  EXPECT_EQ(plan_batch(make(ForwardMode::IDLE, {}), pool).kv_fill(), 8);
}

// A tensor-parallel follower has no page tables: it rebuilds the plan from the pages rank 0 sends
// (only those the tokens reach), and gets rank 0's plan exactly.
TEST(BatchPlan, OnPagesIsThePoolsPlan) {
  for (int64_t ps : {1, 5, 16}) {
    KVPool pool(KVPoolConfig{1, 8, DType::F32, ps, 200});
    pool.reserve(10, 3), pool.reserve(11, 17), pool.reserve(10, 13), pool.reserve(13, 40), pool.reserve(11, 31);
    const Batch b = make(ForwardMode::EXTEND, {{11, 20, 11}, {10, 0, 13}, {13, 33, 1}});
    std::vector<std::vector<int32_t>> pages;
    for (const BatchRequest& r : b.requests) {
      const std::vector<int32_t>& all = pool.pages(r.id);
      pages.emplace_back(all.begin(), all.begin() + (r.prefix_len + r.new_len + ps - 1) / ps);
    }
    std::vector<const std::vector<int32_t>*> of;
    for (const auto& p : pages) of.push_back(&p);
    const BatchPlan a = plan_batch(b, pool), c = plan_batch_on_pages(b, ps, of);
    EXPECT_EQ(c.positions, a.positions);
    EXPECT_EQ(c.new_slots, a.new_slots);
    EXPECT_EQ(c.kv_slots, a.kv_slots);
    EXPECT_EQ(c.kv_start, a.kv_start);
    EXPECT_EQ(c.q_start, a.q_start);
    EXPECT_EQ(c.prefix_and_new().k_start, a.prefix_and_new().k_start);
    EXPECT_EQ(c.prefix_and_new().k_len, a.prefix_and_new().k_len);
    pages[2].pop_back();  // request 2 is one page short
    expect_error([&] { plan_batch_on_pages(b, ps, of); }, {"request 2", "id 13", "34 tokens"});
  }
}

TEST(BatchPlan, PoolErrorsNameTheRequest) {
  KVPool pool(KVPoolConfig{1, 8, DType::F32, 16, 8});
  pool.reserve(1, 10);
  pool.reserve(2, 20);
  expect_error([&] { plan_batch(make(ForwardMode::EXTEND, {{1, 0, 10}, {7, 0, 1}}), pool); },
               {"request 1", "id 7", "KV pool"});
  expect_error([&] { plan_batch(make(ForwardMode::EXTEND, {{1, 0, 10}, {2, 15, 6}}), pool); },
               {"request 1", "id 2", "21", "20"});
  expect_error([&] { plan_batch(make(ForwardMode::DECODE, {{1, 10, 1}}), pool); },
               {"request 0", "id 1", "11", "10"});
  // Validation comes first.
  expect_error([&] { plan_batch(make(ForwardMode::DECODE, {{1, 0, 2}}), pool); },
               {"request 0", "id 1", "decode"});
}

}  // namespace
}  // namespace mla
