// src/engine/radix_cache.cpp — the radix prefix cache over pages of the latent KV pool.
#include "engine/radix_cache.h"

#include <algorithm>

#include "mla/error.h"

namespace mla::engine {

RadixCache::RadixCache(KVPool& pool) : pool_(pool), ps_(pool.config().page_size), root_(std::make_unique<Node>()) {
  root_->serial = serial_++;
}

RadixCache::~RadixCache() {
  // Release every page the tree holds (requests keep theirs).
  std::vector<Node*> stack{root_.get()};
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    if (!n->pages.empty()) {
      try {
        pool_.release(n->pages);
      } catch (...) {
      }
    }
    for (auto& [k, c] : n->children) stack.push_back(c.get());
  }
}

void RadixCache::refresh(Node* n) {
  if (n->in_lru) {
    lru_.erase({n->last_access, n->serial});
    n->in_lru = false;
  }
  if (n != root_.get() && n->lock == 0 && n->children.empty()) {
    lru_.emplace(LruKey{n->last_access, n->serial}, n);
    n->in_lru = true;
  }
}

void RadixCache::touch(Node* n) {
  if (n == root_.get()) return;
  const bool was = n->in_lru;
  if (was) lru_.erase({n->last_access, n->serial}), n->in_lru = false;
  n->last_access = clock_;
  if (was) refresh(n);
}

RadixCache::Node* RadixCache::split(Node* n, int64_t pages) {
  Node* parent = n->parent;
  auto mid = std::make_unique<Node>();
  Node* m = mid.get();
  m->parent = parent;
  m->key.assign(n->key.begin(), n->key.begin() + pages * ps_);
  m->pages.assign(n->pages.begin(), n->pages.begin() + pages);
  m->lock = n->lock;
  m->last_access = n->last_access;
  m->serial = serial_++;
  std::vector<int32_t> first(n->key.begin(), n->key.begin() + ps_);
  auto it = parent->children.find(first);
  std::unique_ptr<Node> self = std::move(it->second);
  n->key.erase(n->key.begin(), n->key.begin() + pages * ps_);
  n->pages.erase(n->pages.begin(), n->pages.begin() + pages);
  n->parent = m;
  m->children.emplace(std::vector<int32_t>(n->key.begin(), n->key.begin() + ps_), std::move(self));
  it->second = std::move(mid);
  // n keeps its leaf status and its LRU key; m has a child, so it is not in the LRU set.
  return m;
}

RadixCache::Match RadixCache::match_prefix(const std::vector<int32_t>& tokens, int64_t max_tokens) {
  Match m;
  m.node = root_.get();
  const int64_t limit = std::min<int64_t>(max_tokens, int64_t(tokens.size())) / ps_ * ps_;
  ++clock_;
  Node* n = root_.get();
  int64_t pos = 0;
  while (pos < limit) {
    auto it = n->children.find(std::vector<int32_t>(tokens.begin() + pos, tokens.begin() + pos + ps_));
    if (it == n->children.end()) break;
    Node* c = it->second.get();
    int64_t k = 1;  // pages of c that match (the first does: it is the key)
    const int64_t cp = int64_t(c->pages.size());
    while (k < cp && pos + (k + 1) * ps_ <= limit &&
           std::equal(c->key.begin() + k * ps_, c->key.begin() + (k + 1) * ps_, tokens.begin() + pos + k * ps_))
      ++k;
    if (k < cp) c = split(c, k);
    touch(c);
    m.pages.insert(m.pages.end(), c->pages.begin(), c->pages.end());
    pos += k * ps_;
    n = c;
    if (k < cp) break;
  }
  m.tokens = pos;
  m.node = n;
  return m;
}

int64_t RadixCache::match_length(const std::vector<int32_t>& tokens, int64_t max_tokens) const {
  const int64_t limit = std::min<int64_t>(max_tokens, int64_t(tokens.size())) / ps_ * ps_;
  const Node* n = root_.get();
  int64_t pos = 0;
  while (pos < limit) {
    auto it = n->children.find(std::vector<int32_t>(tokens.begin() + pos, tokens.begin() + pos + ps_));
    if (it == n->children.end()) break;
    const Node* c = it->second.get();
    int64_t k = 1;
    const int64_t cp = int64_t(c->pages.size());
    while (k < cp && pos + (k + 1) * ps_ <= limit &&
           std::equal(c->key.begin() + k * ps_, c->key.begin() + (k + 1) * ps_, tokens.begin() + pos + k * ps_))
      ++k;
    pos += k * ps_;
    if (k < cp) break;
    n = c;
  }
  return pos;
}

void RadixCache::lock(Node* node) {
  for (Node* n = node; n && n != root_.get(); n = n->parent) {
    if (n->lock++ == 0) {
      evictable_pages_ -= int64_t(n->pages.size());
      refresh(n);
    }
  }
}

void RadixCache::unlock(Node* node) {
  for (Node* n = node; n && n != root_.get(); n = n->parent)
    if (n->lock <= 0) fail("radix cache: unlocking a node that is not locked");
  for (Node* n = node; n && n != root_.get(); n = n->parent) {
    if (--n->lock == 0) {
      evictable_pages_ += int64_t(n->pages.size());
      refresh(n);
    }
  }
}

int64_t RadixCache::insert(const std::vector<int32_t>& tokens, const std::vector<int32_t>& pages) {
  const int64_t np = int64_t(pages.size());
  if (int64_t(tokens.size()) < np * ps_)
    fail("radix cache: {} pages need {} tokens, got {}", np, np * ps_, tokens.size());
  ++clock_;
  Node* n = root_.get();
  int64_t pos = 0;  // in pages
  while (pos < np) {
    std::vector<int32_t> first(tokens.begin() + pos * ps_, tokens.begin() + (pos + 1) * ps_);
    auto it = n->children.find(first);
    if (it == n->children.end()) {
      std::vector<int32_t> take(pages.begin() + pos, pages.end());
      auto leaf = std::make_unique<Node>();
      leaf->parent = n;
      leaf->key.assign(tokens.begin() + pos * ps_, tokens.begin() + np * ps_);
      leaf->pages = take;
      leaf->last_access = clock_;
      leaf->serial = serial_++;
      Node* l = leaf.get();
      pool_.retain(take);  // throws before the tree changes
      try {
        n->children.emplace(std::move(first), std::move(leaf));
      } catch (...) {
        pool_.release(take);
        throw;
      }
      cached_pages_ += int64_t(take.size());
      evictable_pages_ += int64_t(take.size());
      refresh(n);  // no longer a leaf
      refresh(l);
      return int64_t(take.size());
    }
    Node* c = it->second.get();
    const int64_t cp = int64_t(c->pages.size());
    int64_t k = 1;
    while (k < cp && pos + k < np &&
           std::equal(c->key.begin() + k * ps_, c->key.begin() + (k + 1) * ps_, tokens.begin() + (pos + k) * ps_))
      ++k;
    if (k < cp) c = split(c, k);
    touch(c);
    pos += k;
    n = c;
  }
  return 0;
}

void RadixCache::remove_leaf(Node* n) {
  Node* parent = n->parent;
  if (n->in_lru) lru_.erase({n->last_access, n->serial});
  pool_.release(n->pages);
  cached_pages_ -= int64_t(n->pages.size());
  evictable_pages_ -= int64_t(n->pages.size());
  parent->children.erase(std::vector<int32_t>(n->key.begin(), n->key.begin() + ps_));  // deletes n
  refresh(parent);
}

int64_t RadixCache::evict(int64_t num_pages, std::vector<std::vector<int32_t>>* evicted) {
  int64_t released = 0;
  while (released < num_pages && !lru_.empty()) {
    Node* n = lru_.begin()->second;
    if (evicted) {
      std::vector<std::vector<int32_t>> parts;
      for (Node* a = n; a != root_.get(); a = a->parent) parts.push_back(a->key);
      std::vector<int32_t> path;
      for (auto p = parts.rbegin(); p != parts.rend(); ++p) path.insert(path.end(), p->begin(), p->end());
      evicted->push_back(std::move(path));
    }
    released += int64_t(n->pages.size());
    remove_leaf(n);
  }
  return released;
}

bool RadixCache::make_free(int64_t free) {
  while (pool_.free_pages() < free && !lru_.empty()) evict(1);
  return pool_.free_pages() >= free;
}

int64_t RadixCache::flush() { return evict(cached_pages_); }

void RadixCache::check() const {
  int64_t pages = 0, evictable = 0;
  size_t leaves = 0;
  std::vector<const Node*> stack{root_.get()};
  while (!stack.empty()) {
    const Node* n = stack.back();
    stack.pop_back();
    if (n != root_.get()) {
      if (n->pages.empty() || int64_t(n->key.size()) != int64_t(n->pages.size()) * ps_)
        fail("radix cache: a node has {} tokens for {} pages", n->key.size(), n->pages.size());
      if (n->lock < 0) fail("radix cache: negative lock count");
      if (n->lock > n->parent->lock && n->parent != root_.get())
        fail("radix cache: a node is locked more than its parent");
      for (int32_t p : n->pages)
        if (pool_.ref_count(p) < 1) fail("radix cache: cached page {} is free in the pool", p);
      pages += int64_t(n->pages.size());
      if (n->lock == 0) evictable += int64_t(n->pages.size());
      const bool leaf_unlocked = n->children.empty() && n->lock == 0;
      if (leaf_unlocked != n->in_lru) fail("radix cache: LRU set out of date");
      if (n->in_lru) {
        auto it = lru_.find({n->last_access, n->serial});
        if (it == lru_.end() || it->second != n) fail("radix cache: LRU entry missing");
        ++leaves;
      }
    }
    for (const auto& [k, c] : n->children) {
      if (c->parent != n) fail("radix cache: broken parent link");
      if (!std::equal(k.begin(), k.end(), c->key.begin()) || int64_t(k.size()) != ps_)
        fail("radix cache: child filed under the wrong key");
      if (n != root_.get() && c->last_access > n->last_access)
        fail("radix cache: a child was used after its parent");
      stack.push_back(c.get());
    }
  }
  if (pages != cached_pages_ || evictable != evictable_pages_ || leaves != lru_.size())
    fail("radix cache: counts out of date ({} / {} pages, {} / {} evictable, {} / {} leaves)", pages,
         cached_pages_, evictable, evictable_pages_, leaves, lru_.size());
}

}  // namespace mla::engine
