// KVPool: configuration checks, page accounting, slot arithmetic and the all-or-nothing rule.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>

#include "mla/error.h"
#include "mla/kv_pool.h"
#include "harness.h"

namespace mla {
namespace {

KVPool make_pool(int64_t page_size, int64_t num_pages, int64_t layers = 1, int64_t row_dim = 8,
                 DType dtype = DType::BF16) {
  KVPoolConfig c;
  c.num_layers = layers;
  c.row_dim = row_dim;
  c.dtype = dtype;
  c.page_size = page_size;
  c.num_pages = num_pages;
  return KVPool(c);
}

// The whole observable state of a pool.
struct State {
  int64_t free_pages;
  std::map<RequestId, std::pair<std::vector<int32_t>, int64_t>> requests;  // id → (pages, length)
  bool operator==(const State&) const = default;
};

State snapshot(const KVPool& p) {
  State s{p.free_pages(), {}};
  for (RequestId id : p.request_ids()) s.requests[id] = {p.pages(id), p.length(id)};
  return s;
}

// Every page is owned at most once, owned + free = total, pages match the length.
void check_invariants(const KVPool& p) {
  const int64_t ps = p.config().page_size, total = p.config().num_pages;
  std::vector<int> owner_count(size_t(total), 0);
  int64_t owned = 0;
  for (RequestId id : p.request_ids()) {
    const auto& pages = p.pages(id);
    for (int32_t pg : pages) {
      ASSERT_GE(pg, 0);
      ASSERT_LT(pg, total);
      ASSERT_EQ(++owner_count[size_t(pg)], 1) << "page " << pg << " owned twice";
    }
    owned += int64_t(pages.size());
    ASSERT_EQ(p.capacity(id), int64_t(pages.size()) * ps);
    ASSERT_EQ(int64_t(pages.size()), (p.length(id) + ps - 1) / ps) << "request " << id;
  }
  ASSERT_EQ(owned + p.free_pages(), total);
}

TEST(KVPool, BadConfigNamesTheField) {
  auto bad = [](auto mutate, const std::string& field) {
    KVPoolConfig c;
    c.num_pages = 4;
    mutate(c);
    expect_error([&] { KVPool p(c); }, field);
  };
  bad([](KVPoolConfig& c) { c.num_layers = 0; }, "num_layers");
  bad([](KVPoolConfig& c) { c.row_dim = 0; }, "row_dim");
  bad([](KVPoolConfig& c) { c.row_dim = -3; }, "row_dim");
  bad([](KVPoolConfig& c) { c.page_size = 0; }, "page_size");
  bad([](KVPoolConfig& c) { c.num_pages = -1; }, "num_pages");
  bad([](KVPoolConfig& c) { c.dtype = DType::F16; }, "dtype");
  bad([](KVPoolConfig& c) { c.dtype = DType::F64; }, "dtype");
  bad([](KVPoolConfig& c) { c.dtype = DType::I32; }, "dtype");
  bad([](KVPoolConfig& c) { c.page_size = 1 << 20; c.num_pages = 1 << 12; }, "num_pages");
}

TEST(KVPool, BuffersHaveTheRightShapeAndDtype) {
  for (DType t : {DType::F32, DType::BF16, DType::F8_E4M3FN, DType::F8_E4M3FNUZ}) {
    KVPool p = make_pool(16, 5, 3, 576, t);
    EXPECT_EQ(p.num_slots(), 80);
    for (int64_t l = 0; l < 3; ++l) {
      EXPECT_EQ(p.buffer(l).dtype(), t);
      EXPECT_EQ(p.buffer(l).shape(), (Shape{80, 576}));
      EXPECT_EQ(p.buffer(l).platform(), Platform::CPU);
      EXPECT_EQ(p.scale(l), 1.0);
    }
    EXPECT_NE(p.buffer(0).data(), p.buffer(1).data());
    expect_error([&] { p.buffer(3); }, "layer 3");
    expect_error([&] { p.buffer(-1); }, "layer -1");
  }
  // An empty pool is legal.
  KVPool empty = make_pool(4, 0);
  EXPECT_EQ(empty.num_slots(), 0);
  EXPECT_EQ(empty.buffer(0).shape(), (Shape{0, 8}));
  empty.reserve(1, 0);
  expect_error([&] { empty.reserve(1, 1); }, "1 more pages");
}

TEST(KVPool, CustomAllocatorIsUsedAndChecked) {
  KVPoolConfig c;
  c.num_layers = 2;
  c.row_dim = 4;
  c.page_size = 2;
  c.num_pages = 3;
  int calls = 0;
  KVPool p(c, [&](DType t, Shape s) {
    ++calls;
    return Tensor::host(t, s);
  });
  EXPECT_EQ(calls, 2);
  expect_error([&] { KVPool q(c, [](DType t, Shape) { return Tensor::host(t, {1, 1}); }); },
               "allocator");
}

TEST(KVPool, Scales) {
  KVPool p = make_pool(1, 4, 2, 8, DType::F8_E4M3FN);
  p.set_scale(1, 0.25);
  EXPECT_EQ(p.scale(0), 1.0);
  EXPECT_EQ(p.scale(1), 0.25);
  for (double bad : {0.0, -1.0, std::numeric_limits<double>::infinity(),
                     -std::numeric_limits<double>::infinity(),
                     std::numeric_limits<double>::quiet_NaN()})
    expect_error([&] { p.set_scale(0, bad); }, "scale of layer 0");
  EXPECT_EQ(p.scale(0), 1.0);
  expect_error([&] { p.set_scale(2, 1.0); }, "layer 2");
}

TEST(KVPool, FreshPoolHandsOutAscendingPages) {
  for (int64_t ps : {1, 5, 16, 64}) {
    KVPool p = make_pool(ps, 10);
    p.reserve(7, 3 * ps + 1);  // 4 pages
    EXPECT_EQ(p.pages(7), (std::vector<int32_t>{0, 1, 2, 3}));
    p.reserve(8, 1);
    EXPECT_EQ(p.pages(8), (std::vector<int32_t>{4}));
    check_invariants(p);
  }
}

TEST(KVPool, SlotArithmetic) {
  for (int64_t ps : {1, 5, 16, 64}) {
    KVPool p = make_pool(ps, 12);
    // Interleave two requests so their pages are not contiguous.
    for (int64_t step = 1; step <= 5; ++step) {
      p.reserve(1, step * ps);
      p.reserve(2, step * ps - (ps > 1 ? 1 : 0));
    }
    check_invariants(p);
    for (RequestId id : {1, 2}) {
      const int64_t len = p.length(id);
      std::vector<int32_t> s = p.slots(id, 0, len);
      ASSERT_EQ(int64_t(s.size()), len);
      for (int64_t t = 0; t < len; ++t)
        EXPECT_EQ(s[size_t(t)], p.pages(id)[size_t(t / ps)] * ps + t % ps) << "token " << t;
      // A sub-range matches the same slots, and the appending overload appends.
      std::vector<int32_t> out{-5};
      p.slots(id, len / 3, len - 1, out);
      ASSERT_EQ(int64_t(out.size()), 1 + (len - 1 - len / 3));
      EXPECT_EQ(out[0], -5);
      for (int64_t t = len / 3; t < len - 1; ++t)
        EXPECT_EQ(out[size_t(1 + t - len / 3)], s[size_t(t)]);
      EXPECT_TRUE(p.slots(id, len, len).empty());
    }
  }
}

TEST(KVPool, SlotRangeErrors) {
  KVPool p = make_pool(16, 4);
  p.reserve(3, 20);
  expect_error([&] { p.slots(3, 0, 21); }, "request 3");
  expect_error([&] { p.slots(3, -1, 2); }, "[-1, 2)");
  expect_error([&] { p.slots(3, 5, 4); }, "[5, 4)");
  expect_error([&] { p.slots(3, 0, 32); }, "20");  // beyond length even though within capacity
  expect_error([&] { p.slots(9, 0, 0); }, "request 9");
}

TEST(KVPool, GrowAcrossPageBoundariesAndNeverShrink) {
  for (int64_t ps : {1, 5, 16, 64}) {
    KVPool p = make_pool(ps, 40);
    std::vector<int32_t> before;
    for (int64_t n = 0; n <= 5 * ps + 2; ++n) {
      p.reserve(1, n);
      EXPECT_EQ(p.length(1), n);
      EXPECT_EQ(p.capacity(1), (n + ps - 1) / ps * ps);
      // Growing keeps the pages already held, as a prefix.
      const auto& now = p.pages(1);
      ASSERT_GE(now.size(), before.size());
      EXPECT_TRUE(std::equal(before.begin(), before.end(), now.begin()));
      before = now;
      check_invariants(p);
    }
    const State s = snapshot(p);
    p.reserve(1, 1);  // smaller: no change
    p.reserve(1, 0);
    EXPECT_EQ(snapshot(p), s);
    EXPECT_EQ(p.length(1), 5 * ps + 2);
    // Growth within the last page takes no page.
    p.reserve(1, p.capacity(1));
    EXPECT_EQ(p.pages(1), s.requests.at(1).first);
    EXPECT_EQ(p.length(1), p.capacity(1));
    EXPECT_EQ(p.free_pages(), s.free_pages);
  }
}

TEST(KVPool, FailedReservationChangesNothing) {
  for (int64_t ps : {1, 5, 16, 64}) {
    KVPool p = make_pool(ps, 6);
    p.reserve(1, 2 * ps);
    p.reserve(2, ps + 1);
    p.reserve(3, 0);
    check_invariants(p);
    ASSERT_EQ(p.free_pages(), 2);
    const State s = snapshot(p);
    // A new request that does not fit is not even created.
    expect_error([&] { p.reserve(7, 2 * ps + 1); },
                 "KV pool: request 7 needs 3 more pages of " + std::to_string(ps) +
                     " tokens, 2 free");
    EXPECT_FALSE(p.has(7));
    EXPECT_EQ(snapshot(p), s);
    // Growing an existing request beyond the pool keeps its pages and length.
    expect_error([&] { p.reserve(2, 5 * ps); }, "request 2 needs 3 more pages");
    EXPECT_EQ(snapshot(p), s);
    expect_error([&] { p.reserve(3, 100 * ps); }, "request 3 needs 100 more pages");
    EXPECT_EQ(snapshot(p), s);
    expect_error([&] { p.reserve(1, -1); }, "request 1");
    expect_error([&] { p.reserve(8, -1); }, "request 8");
    EXPECT_FALSE(p.has(8));
    EXPECT_EQ(snapshot(p), s);
    // Exactly the free pages still fit.
    p.reserve(2, 4 * ps);
    EXPECT_EQ(p.free_pages(), 0);
    check_invariants(p);
  }
}

TEST(KVPool, FreeReturnsEveryPage) {
  for (int64_t ps : {1, 5, 16, 64}) {
    KVPool p = make_pool(ps, 9);
    p.reserve(1, 3 * ps);
    p.reserve(2, 1);
    p.reserve(3, 3 * ps + 1);  // 4 pages
    p.reserve(4, 0);
    EXPECT_EQ(p.free_pages(), 1);
    p.free(2);
    EXPECT_FALSE(p.has(2));
    EXPECT_EQ(p.free_pages(), 2);
    check_invariants(p);
    expect_error([&] { p.free(2); }, "request 2");
    expect_error([&] { p.length(2); }, "request 2");
    expect_error([&] { p.pages(2); }, "request 2");
    expect_error([&] { p.capacity(2); }, "request 2");
    EXPECT_EQ(p.request_ids(), (std::vector<RequestId>{1, 3, 4}));
    p.free(1);
    p.free(3);
    p.free(4);
    EXPECT_TRUE(p.request_ids().empty());
    EXPECT_EQ(p.free_pages(), 9);
    // A new request can take every page, each exactly once.
    p.reserve(5, 9 * ps);
    std::vector<int32_t> pages = p.pages(5);
    std::sort(pages.begin(), pages.end());
    EXPECT_EQ(pages, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8}));
    check_invariants(p);
  }
}

TEST(KVPool, NoSlotOwnedTwice) {
  for (int64_t ps : {1, 5, 16}) {
    KVPool p = make_pool(ps, 40);
    std::mt19937_64 rng(42);
    for (RequestId id = 0; id < 8; ++id) p.reserve(id, int64_t(rng() % uint64_t(3 * ps + 1)));
    p.free(3);
    p.free(5);
    for (RequestId id : {0, 1, 2, 4}) p.reserve(id, p.length(id) + ps + 1);
    std::set<int32_t> seen;
    for (RequestId id : p.request_ids()) {
      for (int32_t s : p.slots(id, 0, p.length(id))) {
        EXPECT_GE(s, 0);
        EXPECT_LT(s, p.num_slots());
        EXPECT_TRUE(seen.insert(s).second) << "slot " << s << " owned twice";
      }
    }
  }
}

// ~100k random reserve / grow / free operations against a simple model, with all invariants
// checked after every step.
TEST(KVPool, RandomizedOperations) {
  struct Case {
    int64_t ps, pages;
  };
  for (Case cs : {Case{1, 48}, Case{5, 24}, Case{16, 16}, Case{64, 8}}) {
    KVPool p = make_pool(cs.ps, cs.pages);
    std::mt19937_64 rng(1234 + uint64_t(cs.ps));
    std::map<RequestId, int64_t> model;  // id → length
    int64_t failures = 0;
    for (int step = 0; step < 25000; ++step) {
      const RequestId id = RequestId(rng() % 12);
      const int op = int(rng() % 10);
      const bool known = model.count(id) != 0;
      if (op < 3 && known) {  // free
        p.free(id);
        model.erase(id);
      } else if (op == 3 && !known) {  // free of an unknown id
        const State s = snapshot(p);
        EXPECT_THROW(p.free(id), Error);
        ASSERT_EQ(snapshot(p), s);
      } else {  // reserve: a new request, a grow, or a smaller (no-op) reserve
        const int64_t cur = known ? model[id] : 0;
        const int64_t n = op < 6 ? cur + int64_t(rng() % 4)
                                 : int64_t(rng() % uint64_t(cs.ps * cs.pages / 3 + 2));
        const int64_t have = known ? int64_t(p.pages(id).size()) : 0;
        const int64_t need = std::max<int64_t>((n + cs.ps - 1) / cs.ps - have, 0);
        if (need > p.free_pages()) {
          const State s = snapshot(p);
          EXPECT_THROW(p.reserve(id, n), Error);
          ASSERT_EQ(snapshot(p), s) << "step " << step;
          ++failures;
        } else {
          p.reserve(id, n);
          model[id] = std::max(cur, n);
        }
      }
      // Invariants: lengths follow the model, pages are owned once, counts add up.
      ASSERT_EQ(int64_t(p.request_ids().size()), int64_t(model.size()));
      for (const auto& [rid, len] : model) ASSERT_EQ(p.length(rid), len) << "step " << step;
      check_invariants(p);
      if (testing::Test::HasFatalFailure()) return;
    }
    EXPECT_GT(failures, 0) << "the random walk never filled the pool";
    for (const auto& [rid, len] : model) p.free(rid);
    EXPECT_EQ(p.free_pages(), cs.pages);
  }
}

}  // namespace
}  // namespace mla
