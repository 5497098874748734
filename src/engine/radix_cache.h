// src/engine/radix_cache.h — the prefix cache: a radix tree over token ids at page granularity,
// whose nodes hold pages of the latent KV pool (after sglang's RadixAttention).
//
// Why a radix tree and not vLLM's block hashing: a tree finds the longest cached prefix by walking
// the prompt once, splits and shares prefixes naturally (system prompts, the n choices of one
// request, multi-turn chats), gives LRU eviction of leaves for free (a leaf is never a prefix of
// something still cached, so evicting leaves first keeps every cached entry reachable), and makes
// "lock the pages this request uses" a walk to the root. Hashing needs a hash chain per block
// (hash of the parent's hash and the block's tokens), a separate free queue ordered for eviction,
// and still cannot evict an inner block without orphaning its descendants' usefulness. The tree
// costs a pointer walk per page; at page sizes of 16-64 that is negligible beside a forward pass.
//
// Keys are whole pages: a node's key is a run of pages' tokens, and children are found by the
// tokens of their first page. Only full pages enter the cache; a prompt's partial last page is
// recomputed by whoever uses the prefix. The cache holds one pool reference (KVPool::retain) on
// every page of every node; requests that use a prefix adopt its pages (their own references)
// and lock the node (and so its ancestors) so it is not evicted while they run.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "mla/kv_pool.h"

namespace mla::engine {

class RadixCache {
 public:
  struct Node;
  explicit RadixCache(KVPool& pool);
  ~RadixCache();  // releases every page the cache holds
  RadixCache(const RadixCache&) = delete;
  RadixCache& operator=(const RadixCache&) = delete;

  struct Match {
    std::vector<int32_t> pages;  // the cached pages of tokens [0, tokens)
    int64_t tokens = 0;          // a multiple of the page size
    Node* node = nullptr;        // the deepest matched node (lock it while the pages are used)
  };
  // The longest cached prefix of tokens[0, max_tokens) in whole pages; refreshes the LRU stamp
  // of every matched node (splitting a node the match ends inside).
  Match match_prefix(const std::vector<int32_t>& tokens, int64_t max_tokens);
  // The tokens match_prefix would match, changing nothing (for ordering the waiting queue).
  int64_t match_length(const std::vector<int32_t>& tokens, int64_t max_tokens) const;
  // Lock / unlock `node` and its ancestors (a count). A locked node is never evicted. nullptr and
  // the root are no-ops. Unlocking a node that is not locked throws Error.
  void lock(Node* node);
  void unlock(Node* node);

  // Inserts tokens [0, pages.size() · page_size) with their pages. Where the tree has the tokens
  // already it keeps its own pages (the caller frees its copies); the rest become a new leaf and
  // the cache retains those pages. Returns the number of pages the cache took.
  int64_t insert(const std::vector<int32_t>& tokens, const std::vector<int32_t>& pages);

  // Evicts least-recently-used unlocked leaves until `num_pages` pages were released (or nothing
  // is evictable); returns the pages released. A page returns to the pool's free list when no
  // request holds it. `evicted` (optional) gets the token path of every evicted leaf.
  int64_t evict(int64_t num_pages, std::vector<std::vector<int32_t>>* evicted = nullptr);
  // Evicts until the pool has `free` free pages or nothing is evictable; true if it has them.
  bool make_free(int64_t free);
  int64_t flush();  // evicts every unlocked node; returns the pages released

  int64_t cached_pages() const { return cached_pages_; }     // pages in the tree
  int64_t evictable_pages() const { return evictable_pages_; }  // pages of unlocked nodes
  int64_t page_size() const { return ps_; }
  // Every invariant (tree shape, keys, counts, LRU set, pool references): throws Error if one
  // does not hold. For tests.
  void check() const;

 private:
  using LruKey = std::pair<uint64_t, uint64_t>;  // (last access, serial)
  void refresh(Node* n);  // re-files n in the LRU set of evictable leaves
  Node* split(Node* n, int64_t pages);  // n's first `pages` pages become a new parent of n
  void touch(Node* n);
  void remove_leaf(Node* n);

  KVPool& pool_;
  int64_t ps_;
  std::unique_ptr<Node> root_;
  uint64_t clock_ = 0, serial_ = 0;
  int64_t cached_pages_ = 0, evictable_pages_ = 0;
  std::map<LruKey, Node*> lru_;  // unlocked leaves, least recently used first
};

struct RadixCache::Node {
  Node* parent = nullptr;
  std::map<std::vector<int32_t>, std::unique_ptr<Node>> children;  // by the first page's tokens
  std::vector<int32_t> key;    // tokens, pages.size() · page_size of them
  std::vector<int32_t> pages;
  int64_t lock = 0;
  uint64_t last_access = 0, serial = 0;
  bool in_lru = false;
};

}  // namespace mla::engine
