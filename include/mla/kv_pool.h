// mla/kv_pool.h — the paged latent KV pool: one buffer per layer of rows
// [kv_lora_rank + qk_rope_head_dim] (576 for V3), and a request-to-pages table.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "mla/dtype.h"
#include "mla/tensor.h"

namespace mla {

using RequestId = int64_t;

struct KVPoolConfig {
  int64_t num_layers = 1;
  int64_t row_dim = 576;   // kv_lora_rank + qk_rope_head_dim
  DType dtype = DType::BF16;  // F32, BF16, F8_E4M3FN or F8_E4M3FNUZ (the last two with a per-layer scale)
  int64_t page_size = 1;   // tokens per page, any value >= 1
  int64_t num_pages = 0;   // pages in the pool (all layers share the page table)
};

// The cache slot of token t of a request holding `pages` (page_size slots each, in token order).
inline int32_t page_slot(const std::vector<int32_t>& pages, int64_t page_size, int64_t t) {
  return int32_t(int64_t(pages[size_t(t / page_size)]) * page_size + t % page_size);
}

// Slot s of a layer is row s of that layer's buffer [num_pages * page_size, row_dim]; the pages
// of a request need not be contiguous. Every mutating call either succeeds or throws Error and
// leaves the pool exactly as it was.
//
// Pages are reference-counted: a page is free (count 0) or held by one or more holders — requests
// (each of its pages counts once per request) and outside holders such as a prefix cache
// (retain/release). A request may start from pages another holder has (adopt): only whole pages
// are shared, and a shared page is full, so no holder ever writes it again (no copy-on-write).
// A page returns to the free list when its last holder lets go.
class KVPool {
 public:
  using Allocator = std::function<Tensor(DType, Shape)>;
  // Buffers come from `alloc` (a platform's Ops::empty); the default allocates host memory.
  explicit KVPool(const KVPoolConfig& cfg, Allocator alloc = {});

  const KVPoolConfig& config() const { return cfg_; }
  int64_t num_slots() const { return cfg_.num_pages * cfg_.page_size; }
  int64_t free_pages() const { return int64_t(free_list_.size()); }

  // Makes request `id` hold slots for tokens [0, num_tokens): creates it if new, grows it if it
  // holds fewer (never shrinks). Throws Error if the pool lacks the pages.
  void reserve(RequestId id, int64_t num_tokens);
  // Creates request `id` holding `shared` (pages some holder has, each full) for tokens
  // [0, num_tokens), num_tokens == shared.size() · page_size; each page gains a holder. Throws
  // Error if `id` exists, a page is free or out of range, a page repeats, or the count is off.
  void adopt(RequestId id, const std::vector<int32_t>& shared, int64_t num_tokens);
  // Lets go of every page of `id` (a page returns to the pool when no other holder has it).
  // Throws Error for an unknown id.
  void free(RequestId id);
  // Outside holders: one more (retain) or one fewer (release) holder of each page. Pages must be
  // held already (retain) or held by the caller (release); a page may repeat only in release of
  // pages held that many times. Throw Error, changing nothing, otherwise.
  void retain(const std::vector<int32_t>& pages);
  void release(const std::vector<int32_t>& pages);
  int32_t ref_count(int32_t page) const;  // holders of `page` (0: free)
  bool has(RequestId id) const { return requests_.count(id) != 0; }
  // Tokens the request can hold (pages · page_size) and tokens reserved through reserve().
  int64_t capacity(RequestId id) const;
  int64_t length(RequestId id) const;
  std::vector<RequestId> request_ids() const;
  const std::vector<int32_t>& pages(RequestId id) const;

  // Slots of tokens [begin, end) of request `id`, appended to `out`. Throws Error when the range
  // is outside [0, length(id)).
  void slots(RequestId id, int64_t begin, int64_t end, std::vector<int32_t>& out) const;
  std::vector<int32_t> slots(RequestId id, int64_t begin, int64_t end) const;

  // Layer buffers [num_slots, row_dim] of config().dtype, and the per-layer dequantization scale
  // (stored = value / scale; read = stored · scale). The scale is 1 unless set.
  Tensor& buffer(int64_t layer);
  const Tensor& buffer(int64_t layer) const;
  double scale(int64_t layer) const;
  void set_scale(int64_t layer, double s);

 private:
  KVPoolConfig cfg_;
  std::vector<Tensor> buffers_;
  std::vector<double> scales_;
  std::vector<int32_t> free_list_;  // free page ids; pages are taken from the back
  std::vector<int32_t> refs_;       // [num_pages] holders of each page
  struct Entry {
    std::vector<int32_t> pages;
    int64_t length = 0;
  };
  std::map<RequestId, Entry> requests_;
  const Entry& entry(RequestId id) const;
};

}  // namespace mla
