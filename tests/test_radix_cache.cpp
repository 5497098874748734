// The radix prefix cache and the KV pool's shared pages: unit cases, then a randomized stress
// against a naive reference (a map from each cached page's token prefix to its page), checking
// matches, insertions, LRU eviction order, locks and every page's reference count.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <random>

#include "engine/radix_cache.h"
#include "mla/error.h"
#include "mla/kv_pool.h"

namespace mla::engine {
namespace {

KVPool make_pool(int64_t page_size, int64_t num_pages) {
  KVPoolConfig c;
  c.num_layers = 1;
  c.row_dim = 4;
  c.dtype = DType::F32;
  c.page_size = page_size;
  c.num_pages = num_pages;
  return KVPool(c);
}

std::vector<int32_t> refs(const KVPool& p) {
  std::vector<int32_t> r;
  for (int32_t i = 0; i < p.config().num_pages; ++i) r.push_back(p.ref_count(i));
  return r;
}

TEST(KVPoolSharing, AdoptSharesWholePagesAndFreesOnLastHolder) {
  KVPool p = make_pool(4, 6);
  p.reserve(1, 10);  // pages 0, 1, 2
  const std::vector<int32_t> shared{p.pages(1)[0], p.pages(1)[1]};
  p.adopt(2, shared, 8);
  EXPECT_EQ(p.length(2), 8);
  EXPECT_EQ(p.ref_count(shared[0]), 2);
  p.reserve(2, 9);  // grows with a fresh page
  EXPECT_EQ(p.pages(2).size(), 3u);
  EXPECT_NE(p.pages(2)[2], p.pages(1)[2]);
  EXPECT_EQ(p.free_pages(), 2);
  p.free(1);  // pages 0, 1 stay with request 2; page 2 returns
  EXPECT_EQ(p.free_pages(), 3);
  EXPECT_EQ(p.ref_count(shared[0]), 1);
  p.retain(shared);  // an outside holder
  p.free(2);
  EXPECT_EQ(p.free_pages(), 4);
  p.release(shared);
  EXPECT_EQ(p.free_pages(), 6);
  EXPECT_EQ(refs(p), std::vector<int32_t>(6, 0));
}

TEST(KVPoolSharing, BadSharingChangesNothing) {
  KVPool p = make_pool(4, 4);
  p.reserve(1, 8);
  const std::vector<int32_t> before = refs(p);
  const int32_t a = p.pages(1)[0], b = p.pages(1)[1];
  const int32_t unused = 3;
  ASSERT_EQ(p.ref_count(unused), 0);
  EXPECT_THROW(p.adopt(1, {a}, 4), Error);           // exists
  EXPECT_THROW(p.adopt(2, {a}, 3), Error);           // not whole pages
  EXPECT_THROW(p.adopt(2, {a, unused}, 8), Error);   // a free page
  EXPECT_THROW(p.adopt(2, {a, a}, 8), Error);        // twice
  EXPECT_THROW(p.adopt(2, {a, 9}, 8), Error);        // out of range
  EXPECT_THROW(p.retain({a, unused}), Error);
  EXPECT_THROW(p.release({a, a}), Error);            // held once
  EXPECT_THROW(p.release({b, -1}), Error);
  EXPECT_FALSE(p.has(2));
  EXPECT_EQ(refs(p), before);
  EXPECT_EQ(p.free_pages(), 2);
  p.retain({a, a});
  p.release({a, a});
  EXPECT_EQ(refs(p), before);
}

TEST(RadixCache, MatchInsertSplitLockEvict) {
  KVPool p = make_pool(2, 16);
  RadixCache c(p);
  p.reserve(1, 6);  // tokens 1 2 | 3 4 | 5 6
  const std::vector<int32_t> t1{1, 2, 3, 4, 5, 6};
  EXPECT_EQ(c.insert(t1, p.pages(1)), 3);
  const std::vector<int32_t> pages1 = p.pages(1);
  p.free(1);
  EXPECT_EQ(p.free_pages(), 13);  // the cache holds three pages
  // A match ending inside the node splits it; the partial page 5 is not matched.
  RadixCache::Match m = c.match_prefix({1, 2, 3, 4, 5, 9}, 6);
  EXPECT_EQ(m.tokens, 4);
  EXPECT_EQ(m.pages, std::vector<int32_t>(pages1.begin(), pages1.begin() + 2));
  EXPECT_EQ(c.match_length({1, 2, 3, 4, 5, 6}, 5), 4);  // max_tokens caps at whole pages
  c.check();
  c.lock(m.node);
  EXPECT_EQ(c.evictable_pages(), 1);
  EXPECT_EQ(c.evict(10), 1);  // only the unlocked leaf [5 6]
  EXPECT_EQ(c.cached_pages(), 2);
  EXPECT_EQ(c.flush(), 0);
  c.unlock(m.node);
  EXPECT_THROW(c.unlock(m.node), Error);
  c.check();
  // A second branch; the least recently used leaf goes first.
  p.reserve(2, 4);
  EXPECT_EQ(c.insert({1, 2, 7, 8}, p.pages(2)), 1);  // [1 2] is cached: the cache keeps its page
  p.free(2);
  c.match_prefix({1, 2, 3, 4}, 4);  // [1 2][3 4] is now newer than [7 8]
  std::vector<std::vector<int32_t>> ev;
  EXPECT_EQ(c.evict(1, &ev), 1);
  EXPECT_EQ(ev, (std::vector<std::vector<int32_t>>{{1, 2, 7, 8}}));
  c.check();
  EXPECT_EQ(c.flush(), 2);
  EXPECT_EQ(p.free_pages(), 16);
}

// The reference: every cached page by its token prefix (tokens [0, (i + 1) · page_size)).
struct RefPage {
  int32_t page;
  uint64_t time;
  int64_t locks = 0;
};

class Stress {
 public:
  Stress(int64_t ps, int64_t pages, uint64_t seed) : ps_(ps), pool_(make_pool(ps, pages)), cache_(pool_), rng_(seed) {
    for (int b = 0; b < 5; ++b) bases_.push_back(random_tokens(int64_t(rng_() % 10 + 2) * ps_));
  }
  int64_t ops = 0, evicted_leaves = 0, hits = 0, refused = 0;

  void step() {
    ++ops;
    const int r = int(rng_() % 100);
    if (r < 30 && live_.size() < 8) start();
    else if (r < 55 && !live_.empty()) finish(rng_() % 4 != 0);
    else if (r < 70) evict_one();
    else if (r < 85) lookup();
    else if (r < 86) flush();
    else if (!live_.empty()) grow();
    if (ops % 97 == 0) check_all();
  }
  void drain() {
    while (!live_.empty()) finish(true);
    flush();
    check_all();
    ASSERT_EQ(pool_.free_pages(), pool_.config().num_pages) << "pages leaked";
  }

 private:
  struct Live {
    RequestId id;
    std::vector<int32_t> tokens;
    RadixCache::Node* node = nullptr;
    int64_t locked_pages = 0;
  };

  std::vector<int32_t> random_tokens(int64_t n) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = int32_t(rng_() % 3);
    return t;
  }
  // A sequence sharing a prefix with one of a few bases, then diverging.
  std::vector<int32_t> sequence() {
    const auto& b = bases_[rng_() % bases_.size()];
    std::vector<int32_t> t(b.begin(), b.begin() + int64_t(rng_() % (b.size() + 1)));
    auto tail = random_tokens(int64_t(rng_() % (3 * ps_ + 1)));
    t.insert(t.end(), tail.begin(), tail.end());
    if (t.empty()) t.push_back(0);
    return t;
  }
  std::vector<int32_t> key(const std::vector<int32_t>& t, int64_t pages) const {
    return std::vector<int32_t>(t.begin(), t.begin() + pages * ps_);
  }
  bool has_child(const std::vector<int32_t>& k) const {
    auto it = ref_.upper_bound(k);
    return it != ref_.end() && it->first.size() > k.size() && std::equal(k.begin(), k.end(), it->first.begin());
  }
  // Reference match: whole pages of t[0, limit) whose prefixes are all cached.
  std::vector<int32_t> ref_match(const std::vector<int32_t>& t, int64_t limit) {
    std::vector<int32_t> pages;
    for (int64_t i = 1; i * ps_ <= std::min<int64_t>(limit, int64_t(t.size())); ++i) {
      auto it = ref_.find(key(t, i));
      if (it == ref_.end()) break;
      pages.push_back(it->second.page);
    }
    ++clock_;
    for (int64_t i = 1; i <= int64_t(pages.size()); ++i) ref_[key(t, i)].time = clock_;
    return pages;
  }
  void lookup() {
    const auto t = sequence();
    const int64_t limit = int64_t(rng_() % (t.size() + 1));
    const auto want = ref_match(t, limit);
    const auto m = cache_.match_prefix(t, limit);
    ASSERT_EQ(m.pages, want) << "match differs at op " << ops;
    ASSERT_EQ(m.tokens, int64_t(want.size()) * ps_);
  }
  void start() {
    Live l{next_id_++, sequence()};
    const int64_t n = int64_t(l.tokens.size());
    const auto want = ref_match(l.tokens, n - 1);
    const auto m = cache_.match_prefix(l.tokens, n - 1);
    ASSERT_EQ(m.pages, want) << "match differs at op " << ops;
    hits += !want.empty();
    if (!want.empty()) {
      cache_.lock(m.node);
      for (int64_t i = 1; i <= int64_t(want.size()); ++i) ++ref_[key(l.tokens, i)].locks;
      l.node = m.node;
      l.locked_pages = int64_t(want.size());
      pool_.adopt(l.id, m.pages, m.tokens);
    }
    if (!reserve(l, n)) return;
    live_.push_back(std::move(l));
  }
  // Makes room (evicting) and reserves; on failure lets the request go.
  bool reserve(Live& l, int64_t n) {
    const int64_t have = pool_.has(l.id) ? int64_t(pool_.pages(l.id).size()) : 0;
    const int64_t need = std::max<int64_t>(0, (n + ps_ - 1) / ps_ - have);
    while (pool_.free_pages() < need && cache_.evictable_pages() > 0) evict_one();
    if (pool_.free_pages() < need) {
      EXPECT_THROW(pool_.reserve(l.id, n), Error);
      ++refused;
      release(l);
      return false;
    }
    pool_.reserve(l.id, n);
    return true;
  }
  void grow() {
    Live& l = live_[rng_() % live_.size()];
    auto more = random_tokens(int64_t(rng_() % (2 * ps_) + 1));
    l.tokens.insert(l.tokens.end(), more.begin(), more.end());
    if (!reserve(l, int64_t(l.tokens.size()))) live_.erase(std::find_if(live_.begin(), live_.end(), [&](const Live& x) { return x.id == l.id; }));
  }
  void release(Live& l) {
    if (l.node) {
      cache_.unlock(l.node);
      for (int64_t i = 1; i <= l.locked_pages; ++i) --ref_[key(l.tokens, i)].locks;
    }
    if (pool_.has(l.id)) pool_.free(l.id);
  }
  void finish(bool insert) {
    const size_t i = rng_() % live_.size();
    Live l = std::move(live_[i]);
    live_.erase(live_.begin() + int64_t(i));
    if (insert) {
      const int64_t k = int64_t(l.tokens.size()) / ps_;
      const std::vector<int32_t> pages(pool_.pages(l.id).begin(), pool_.pages(l.id).begin() + k);
      ++clock_;
      int64_t fresh = 0;
      for (int64_t j = 1; j <= k; ++j) {
        auto [it, added] = ref_.try_emplace(key(l.tokens, j), RefPage{pages[size_t(j - 1)], clock_});
        it->second.time = clock_;
        fresh += added;
      }
      ASSERT_EQ(cache_.insert(l.tokens, pages), fresh) << "insert differs at op " << ops;
    }
    release(l);
  }
  void evict_one() {
    std::vector<std::vector<int32_t>> paths;
    // The reference's least recently used unlocked leaf.
    uint64_t oldest = UINT64_MAX;
    for (const auto& [k, v] : ref_)
      if (v.locks == 0 && !has_child(k)) oldest = std::min(oldest, v.time);
    const int64_t n = cache_.evict(1, &paths);
    if (oldest == UINT64_MAX) {
      ASSERT_EQ(n, 0) << "evicted with nothing evictable at op " << ops;
      return;
    }
    ASSERT_EQ(paths.size(), 1u);
    ASSERT_GE(n, 1);
    const auto& path = paths[0];
    ASSERT_EQ(int64_t(path.size()) % ps_, 0);
    const int64_t np = int64_t(path.size()) / ps_;
    ASSERT_GE(np, n);
    for (int64_t j = np; j > np - n; --j) {
      auto it = ref_.find(key(path, j));
      ASSERT_NE(it, ref_.end()) << "evicted a page that was not cached at op " << ops;
      ASSERT_EQ(it->second.locks, 0) << "evicted a locked page at op " << ops;
      ASSERT_FALSE(has_child(it->first)) << "evicted a page with a cached child at op " << ops;
      ASSERT_EQ(it->second.time, oldest) << "evicted a page that was not least recently used at op " << ops;
      ref_.erase(it);
    }
    ++evicted_leaves;
  }
  void flush() {
    cache_.flush();
    for (auto it = ref_.begin(); it != ref_.end();) it = it->second.locks == 0 ? ref_.erase(it) : std::next(it);
  }
  void check_all() {
    cache_.check();
    ASSERT_EQ(cache_.cached_pages(), int64_t(ref_.size()));
    std::vector<int32_t> want(size_t(pool_.config().num_pages), 0);
    for (const auto& [k, v] : ref_) ++want[size_t(v.page)];
    for (const Live& l : live_)
      for (int32_t p : pool_.pages(l.id)) ++want[size_t(p)];
    int64_t zero = 0;
    for (int32_t p = 0; p < pool_.config().num_pages; ++p) {
      ASSERT_EQ(pool_.ref_count(p), want[size_t(p)]) << "page " << p << " at op " << ops;
      zero += want[size_t(p)] == 0;
    }
    ASSERT_EQ(pool_.free_pages(), zero);
    // No page is cached twice, and a cached page is held by no request past its prefix.
    std::map<int32_t, int> seen;
    for (const auto& [k, v] : ref_) ASSERT_EQ(++seen[v.page], 1) << "page cached twice";
  }

  int64_t ps_;
  KVPool pool_;
  RadixCache cache_;
  std::mt19937_64 rng_;
  std::vector<std::vector<int32_t>> bases_;
  std::map<std::vector<int32_t>, RefPage> ref_;
  std::vector<Live> live_;
  RequestId next_id_ = 1;
  uint64_t clock_ = 0;
};

// A million operations optimized; the sanitizer build (slower by ~20x) runs a tenth, and
// MLA_STRESS_OPS overrides both.
int64_t stress_ops() {
  if (const char* e = std::getenv("MLA_STRESS_OPS")) return std::max<int64_t>(1000, std::atoll(e));
#if defined(__SANITIZE_ADDRESS__)
  return 100'000;
#else
  return 1'000'000;
#endif
}

TEST(RadixCacheStress, RandomOperationsAgainstAReference) {
  const int64_t total = stress_ops();
  const auto t0 = std::chrono::steady_clock::now();
  struct Case {
    int64_t ps, pages;
  };
  const Case cases[] = {{1, 40}, {4, 48}, {16, 40}};
  for (const Case& c : cases) {
    SCOPED_TRACE("page size " + std::to_string(c.ps));
    Stress s(c.ps, c.pages, 7 + uint64_t(c.ps));
    for (int64_t i = 0; i < total / 3; ++i) {
      s.step();
      if (::testing::Test::HasFatalFailure()) return;
    }
    s.drain();
    std::printf("  page %2ld: %ld ops, %ld hits, %ld leaves evicted, %ld refused\n", long(c.ps), long(s.ops),
                long(s.hits), long(s.evicted_leaves), long(s.refused));
    EXPECT_GT(s.hits, s.ops / 20);
    EXPECT_GT(s.evicted_leaves, s.ops / 50);
  }
  std::printf("  %.2f s\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

}  // namespace
}  // namespace mla::engine
