// KV pool under load: a seeded, reproducible random walk of requests created, extended, decoded
// (grown by one token), shrunk (a no-op), queried and freed in random order, with page sizes 1, 16
// and 64 — over a million pool operations in all. After every step the whole pool is checked
// against a shadow model: no page (hence no slot) is owned twice, none is lost (free + owned =
// total), a freed request gives back every page, lengths and capacities are what was asked, and
// an allocation that cannot be met throws mla::Error and leaves the pool exactly as it was (the
// request table, the free count and, on a copy, the order the free pages will be handed out in).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "mla/error.h"
#include "mla/kv_pool.h"

namespace mla {
namespace {

constexpr RequestId kFree = std::numeric_limits<RequestId>::min();

// What the pool must hold.
struct Shadow {
  struct Req {
    std::vector<int32_t> pages;
    int64_t length = 0;
  };
  std::unordered_map<RequestId, Req> reqs;
  std::vector<RequestId> live;                   // ids, for picking one at random
  std::unordered_map<RequestId, size_t> where;  // id → index in live
  std::vector<RequestId> owner;                  // per page: its request, or kFree
  int64_t free = 0;

  void add(RequestId id) {
    where[id] = live.size();
    live.push_back(id);
    reqs[id];
  }
  void remove(RequestId id) {
    const size_t i = where.at(id);
    where[live.back()] = i;
    live[i] = live.back();
    live.pop_back();
    where.erase(id);
    reqs.erase(id);
  }
};

// The whole observable state of a pool, for "a failed call changes nothing".
struct State {
  int64_t free_pages = 0;
  std::map<RequestId, std::pair<std::vector<int32_t>, int64_t>> requests;
  bool operator==(const State&) const = default;
};
State snapshot(const KVPool& p) {
  State s{p.free_pages(), {}};
  for (RequestId id : p.request_ids()) s.requests[id] = {p.pages(id), p.length(id)};
  return s;
}

// Every free page, in the order the pool hands them out: reserve them all for a new request of a
// copy (the pool shares its buffers with the copy, the tables are the copy's own).
std::vector<int32_t> free_order(KVPool copy) {
  const RequestId probe = std::numeric_limits<RequestId>::max();
  copy.reserve(probe, copy.free_pages() * copy.config().page_size);
  return copy.pages(probe);
}

class Walk {
 public:
  Walk(int64_t page_size, int64_t num_pages, uint64_t seed)
      : ps_(page_size), total_(num_pages), rng_(seed), pool_(config(page_size, num_pages)) {
    sh_.owner.assign(size_t(num_pages), kFree);
    sh_.free = num_pages;
    stamp_.assign(size_t(num_pages), 0);
  }

  int64_t ops = 0, failed_allocs = 0, frees = 0, decodes = 0;

  // One random step, then the full check. Returns false after the first failed expectation.
  bool step() {
    const int r = int(rng_() % 100);
    if (r < 18 || sh_.live.empty()) create();
    else if (r < 43) grow(pick(), uniform(1, 3 * ps_));
    else if (r < 78) grow(pick(), 1), ++decodes;
    else if (r < 80) shrink(pick());
    else if (r < 95) release(pick());
    else if (r < 96) refused([&] { pool_.free(unused_id()); }, "unknown request");
    else if (r < 97) refused([&] { pool_.reserve(pick(), -uniform(1, 5)); }, "must be >= 0");
    else if (r < 98) huge();
    else if (r < 99) fill();
    else query(pick());
    ++ops;
    check();
    return !::testing::Test::HasFailure();
  }

  // Frees everything; the pool must be whole again, and hand out every page exactly once.
  void drain() {
    while (!sh_.live.empty()) release(sh_.live.back()), check();
    ASSERT_EQ(pool_.free_pages(), total_);
    std::vector<int32_t> all = free_order(pool_);
    std::sort(all.begin(), all.end());
    for (int64_t p = 0; p < total_; ++p) ASSERT_EQ(all[size_t(p)], p);
  }

 private:
  static KVPoolConfig config(int64_t page_size, int64_t num_pages) {
    KVPoolConfig c;
    c.num_layers = 1, c.row_dim = 1, c.dtype = DType::F32;  // the tables are under test
    c.page_size = page_size, c.num_pages = num_pages;
    return c;
  }
  int64_t uniform(int64_t lo, int64_t hi) {
    return lo + int64_t(rng_() % uint64_t(hi - lo + 1));
  }
  RequestId pick() { return sh_.live[size_t(rng_() % sh_.live.size())]; }
  RequestId unused_id() {
    RequestId id;
    do id = RequestId(rng_() >> 1) - (RequestId(1) << 61);
    while (sh_.reqs.count(id));
    return id;
  }
  static int64_t pages_for(int64_t tokens, int64_t ps) { return tokens / ps + (tokens % ps != 0); }

  // reserve(id, tokens) where the shadow says whether it must succeed; checks the outcome.
  void reserve(RequestId id, int64_t tokens) {
    const bool fresh = !sh_.reqs.count(id);
    const int64_t have = fresh ? 0 : int64_t(sh_.reqs[id].pages.size());
    const int64_t more = std::max<int64_t>(pages_for(tokens, ps_) - have, 0);
    if (more > sh_.free) {
      ++failed_allocs;
      refused([&] { pool_.reserve(id, tokens); }, "more pages");
      return;
    }
    try {
      pool_.reserve(id, tokens);
    } catch (const Error& e) {
      ADD_FAILURE() << "reserve(" << id << ", " << tokens << ") with " << sh_.free
                    << " free pages: " << e.what();
      return;
    }
    if (fresh) sh_.add(id);
    Shadow::Req& s = sh_.reqs[id];
    const std::vector<int32_t>& got = pool_.pages(id);
    ASSERT_EQ(int64_t(got.size()), have + more) << "request " << id;
    ASSERT_TRUE(std::equal(s.pages.begin(), s.pages.end(), got.begin()))
        << "request " << id << ": growing moved its existing pages";
    for (int64_t k = have; k < have + more; ++k) {
      const int32_t p = got[size_t(k)];
      ASSERT_TRUE(p >= 0 && p < total_) << "page " << p << " outside the pool";
      ASSERT_EQ(sh_.owner[size_t(p)], kFree)
          << "page " << p << " handed to request " << id << " is owned by "
          << sh_.owner[size_t(p)];
      sh_.owner[size_t(p)] = id;
      s.pages.push_back(p);
    }
    sh_.free -= more;
    s.length = std::max(s.length, tokens);
  }

  void create() {
    RequestId id = unused_id();
    if (!freed_.empty() && rng_() % 4 == 0) {  // reuse an id that was freed
      id = freed_[size_t(rng_() % freed_.size())];
      if (sh_.reqs.count(id)) id = unused_id();
    }
    reserve(id, rng_() % 8 == 0 ? 0 : uniform(1, 8 * ps_));
  }
  void grow(RequestId id, int64_t by) { reserve(id, sh_.reqs.at(id).length + by); }
  void shrink(RequestId id) { reserve(id, uniform(0, sh_.reqs.at(id).length)); }  // no-op
  void fill() { reserve(unused_id(), sh_.free * ps_); }  // exactly every free page

  void huge() {
    const int64_t asks[] = {std::numeric_limits<int64_t>::max(),
                            std::numeric_limits<int64_t>::max() - ps_ / 2,
                            (total_ + 1) * ps_, sh_.free * ps_ + 1};
    const int64_t tokens = asks[rng_() % 4];
    if (rng_() % 2 && !sh_.live.empty()) {
      const RequestId id = pick();
      if (pages_for(tokens, ps_) - int64_t(sh_.reqs[id].pages.size()) <= sh_.free)
        return reserve(id, tokens);  // it fits after all (the last ask, for a long request)
      ++failed_allocs;
      refused([&] { pool_.reserve(id, tokens); }, "more pages");
    } else {
      ++failed_allocs;
      refused([&] { pool_.reserve(unused_id(), tokens); }, "more pages");
    }
  }

  void release(RequestId id) {
    const Shadow::Req s = sh_.reqs.at(id);
    const int64_t before = pool_.free_pages();
    pool_.free(id);
    ASSERT_FALSE(pool_.has(id)) << "request " << id << " survived free";
    ASSERT_EQ(pool_.free_pages(), before + int64_t(s.pages.size()))
        << "request " << id << " did not give back all of its " << s.pages.size() << " pages";
    for (int32_t p : s.pages) {
      ASSERT_EQ(sh_.owner[size_t(p)], id);
      sh_.owner[size_t(p)] = kFree;
    }
    sh_.free += int64_t(s.pages.size());
    sh_.remove(id);
    ++frees;
    if (freed_.size() < 64) freed_.push_back(id);
    else freed_[size_t(rng_() % freed_.size())] = id;
  }

  // Slots of a random token range: page · page_size + offset; past the length is an Error.
  void query(RequestId id) {
    const Shadow::Req& s = sh_.reqs.at(id);
    const int64_t b = uniform(0, s.length), e = uniform(b, s.length);
    const std::vector<int32_t> slots = pool_.slots(id, b, e);
    ASSERT_EQ(int64_t(slots.size()), e - b);
    for (int64_t t = b; t < e; ++t)
      ASSERT_EQ(slots[size_t(t - b)], int64_t(s.pages[size_t(t / ps_)]) * ps_ + t % ps_);
    refused([&] { pool_.slots(id, 0, s.length + 1); }, "outside");
  }

  // `f` must throw a one-line Error containing `needle` and leave the whole pool as it was.
  template <typename F>
  void refused(F f, const char* needle) {
    const State before = snapshot(pool_);
    const bool deep = ++refusals_ % 16 == 0;  // the free order is O(pages) to read: now and then
    std::vector<int32_t> order;
    if (deep) order = free_order(pool_);
    try {
      f();
      ADD_FAILURE() << "expected an Error containing '" << needle << "'";
      return;
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(needle), std::string::npos) << m;
      EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    }
    ASSERT_TRUE(snapshot(pool_) == before) << "a refused call changed the pool";
    if (deep) ASSERT_EQ(free_order(pool_), order) << "a refused call reordered the free pages";
  }

  // The whole pool against the shadow, O(pages + requests), no allocation but request_ids().
  void check() {
    ++epoch_;
    ASSERT_EQ(pool_.free_pages(), sh_.free) << "after op " << ops;
    const std::vector<RequestId> ids = pool_.request_ids();
    ASSERT_EQ(ids.size(), sh_.live.size()) << "after op " << ops;
    int64_t owned = 0;
    for (RequestId id : ids) {
      auto it = sh_.reqs.find(id);
      ASSERT_NE(it, sh_.reqs.end()) << "unknown request " << id << " in the pool";
      const Shadow::Req& s = it->second;
      const std::vector<int32_t>& pages = pool_.pages(id);
      ASSERT_EQ(pages.size(), s.pages.size()) << "request " << id;
      ASSERT_TRUE(std::equal(pages.begin(), pages.end(), s.pages.begin()))
          << "request " << id << ": pages changed";
      ASSERT_EQ(pool_.length(id), s.length) << "request " << id;
      ASSERT_EQ(pool_.capacity(id), int64_t(pages.size()) * ps_) << "request " << id;
      ASSERT_EQ(int64_t(pages.size()), pages_for(s.length, ps_)) << "request " << id;
      for (int32_t p : pages) {
        ASSERT_NE(stamp_[size_t(p)], epoch_) << "page " << p << " owned twice";
        stamp_[size_t(p)] = epoch_;
      }
      owned += int64_t(pages.size());
    }
    ASSERT_EQ(owned + pool_.free_pages(), total_) << "pages lost after op " << ops;
  }

  const int64_t ps_, total_;
  std::mt19937_64 rng_;
  KVPool pool_;
  Shadow sh_;
  std::vector<RequestId> freed_;
  std::vector<uint64_t> stamp_;
  uint64_t epoch_ = 0;
  int64_t refusals_ = 0;
};

TEST(KVPoolStress, AMillionRandomOperations) {
  struct Case {
    int64_t page_size, num_pages, steps;
  };
  const Case cases[] = {{1, 160, 400'000}, {16, 96, 350'000}, {64, 64, 350'000}};
  int64_t total = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (const Case& c : cases) {
    const uint64_t seed = 20260 + uint64_t(c.page_size);
    SCOPED_TRACE("page_size " + std::to_string(c.page_size) + ", seed " + std::to_string(seed));
    Walk w(c.page_size, c.num_pages, seed);
    for (int64_t i = 0; i < c.steps; ++i)
      if (!w.step()) FAIL() << "at step " << i;
    w.drain();
    ASSERT_FALSE(HasFailure());
    std::printf("  page %2ld: %ld ops (%ld decodes, %ld frees, %ld refused allocations)\n",
                long(c.page_size), long(w.ops), long(w.decodes), long(w.frees),
                long(w.failed_allocs));
    // The walk must have filled the pool often and emptied it.
    EXPECT_GT(w.failed_allocs, c.steps / 100);
    EXPECT_GT(w.frees, c.steps / 20);
    total += w.ops;
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("  %ld pool operations in %.2f s\n", long(total), s);
  EXPECT_GE(total, 1'000'000);
}

}  // namespace
}  // namespace mla

namespace mla {
namespace {

// Regression (found by the walk above): reserve() rounded num_tokens up to pages as
// (n + page_size - 1) / page_size, which overflows for n near INT64_MAX; the request then held
// INT64_MAX tokens in no pages, and its slots() read past its page table.
TEST(KVPoolStress, HugeReservationsAreRefused) {
  for (int64_t ps : {1, 16, 64}) {
    KVPoolConfig c;
    c.num_layers = 1, c.row_dim = 1, c.dtype = DType::F32, c.page_size = ps, c.num_pages = 8;
    KVPool pool(c);
    pool.reserve(1, 3);
    const State before = snapshot(pool);
    for (int64_t n : {std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::max() - 1,
                      std::numeric_limits<int64_t>::max() - ps / 2, 9 * ps}) {
      EXPECT_THROW(pool.reserve(1, n), Error) << "page " << ps << ", " << n << " tokens";
      EXPECT_THROW(pool.reserve(2, n), Error) << "page " << ps << ", " << n << " tokens";
      EXPECT_TRUE(snapshot(pool) == before);
    }
  }
}

}  // namespace
}  // namespace mla
