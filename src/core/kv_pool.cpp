// The paged latent KV pool: per-layer row buffers and the request-to-pages table.
#include "mla/kv_pool.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "mla/error.h"

namespace mla {

KVPool::KVPool(const KVPoolConfig& cfg, Allocator alloc) : cfg_(cfg) {
  if (cfg.num_layers < 1) fail("KV pool: num_layers must be >= 1, got {}", cfg.num_layers);
  if (cfg.row_dim < 1) fail("KV pool: row_dim must be >= 1, got {}", cfg.row_dim);
  if (cfg.page_size < 1) fail("KV pool: page_size must be >= 1, got {}", cfg.page_size);
  if (cfg.num_pages < 0) fail("KV pool: num_pages must be >= 0, got {}", cfg.num_pages);
  // Slots are int32: every slot id must fit.
  constexpr int64_t kMaxSlots = int64_t(std::numeric_limits<int32_t>::max()) + 1;
  if (cfg.num_pages > kMaxSlots / cfg.page_size)
    fail("KV pool: num_pages {} of page_size {} exceeds the int32 slot range", cfg.num_pages,
         cfg.page_size);
  switch (cfg.dtype) {
    case DType::F32: case DType::BF16: case DType::F8_E4M3FN: case DType::F8_E4M3FNUZ: break;
    default:
      fail("KV pool: dtype must be f32, bf16, fp8_e4m3fn or fp8_e4m3fnuz, got {}",
           dtype_name(cfg.dtype));
  }
  if (!alloc) alloc = [](DType t, Shape s) { return Tensor::host(t, std::move(s)); };

  const Shape shape{num_slots(), cfg.row_dim};  // [num_pages * page_size, row_dim]
  buffers_.reserve(size_t(cfg.num_layers));
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    Tensor t = alloc(cfg.dtype, shape);
    if (!t.defined() || t.dtype() != cfg.dtype || t.shape() != shape)
      fail("KV pool: allocator returned {} {} for layer {}, expected {} {}", dtype_name(t.dtype()),
           shape_str(t.shape()), l, dtype_name(cfg.dtype), shape_str(shape));
    buffers_.push_back(std::move(t));
  }
  scales_.assign(size_t(cfg.num_layers), 1.0);

  // Pages are taken from the back: a fresh pool hands out 0, 1, 2, ...
  refs_.assign(size_t(cfg.num_pages), 0);
  free_list_.resize(size_t(cfg.num_pages));
  for (int64_t p = 0; p < cfg.num_pages; ++p)
    free_list_[size_t(p)] = int32_t(cfg.num_pages - 1 - p);
}

const KVPool::Entry& KVPool::entry(RequestId id) const {
  auto it = requests_.find(id);
  if (it == requests_.end()) fail("KV pool: unknown request {}", id);
  return it->second;
}

void KVPool::reserve(RequestId id, int64_t num_tokens) {
  if (num_tokens < 0) fail("KV pool: request {} reserves {} tokens (must be >= 0)", id, num_tokens);
  auto it = requests_.find(id);
  const int64_t have = it == requests_.end() ? 0 : int64_t(it->second.pages.size());
  // Rounded up without overflow: num_tokens may be anything up to INT64_MAX.
  const int64_t need = num_tokens / cfg_.page_size + (num_tokens % cfg_.page_size != 0);
  const int64_t more = std::max<int64_t>(need - have, 0);
  if (more > free_pages())
    fail("KV pool: request {} needs {} more pages of {} tokens, {} free", id, more,
         cfg_.page_size, free_pages());

  // Everything that can throw (allocation) happens before the free list changes.
  bool created = false;
  if (it == requests_.end()) {
    it = requests_.emplace(id, Entry{}).first;
    created = true;
  }
  Entry& e = it->second;
  try {
    e.pages.reserve(size_t(have + more));
  } catch (...) {
    if (created) requests_.erase(it);
    throw;
  }
  for (int64_t k = 0; k < more; ++k) {
    e.pages.push_back(free_list_.back());
    refs_[size_t(free_list_.back())] = 1;
    free_list_.pop_back();
  }
  e.length = std::max(e.length, num_tokens);
}

void KVPool::adopt(RequestId id, const std::vector<int32_t>& shared, int64_t num_tokens) {
  if (requests_.count(id)) fail("KV pool: cannot adopt pages into request {}: it exists", id);
  if (num_tokens != int64_t(shared.size()) * cfg_.page_size)
    fail("KV pool: request {} adopts {} pages for {} tokens (only whole pages of {} are shared)", id,
         shared.size(), num_tokens, cfg_.page_size);
  std::vector<int32_t> sorted = shared;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    const int32_t p = sorted[i];
    if (p < 0 || p >= cfg_.num_pages) fail("KV pool: request {} adopts page {} outside [0, {})", id, p, cfg_.num_pages);
    if (refs_[size_t(p)] == 0) fail("KV pool: request {} adopts page {}, which is free", id, p);
    if (i > 0 && sorted[i - 1] == p) fail("KV pool: request {} adopts page {} twice", id, p);
  }
  requests_.emplace(id, Entry{shared, num_tokens});  // may throw before any count changes
  for (int32_t p : shared) ++refs_[size_t(p)];
}

void KVPool::free(RequestId id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) fail("KV pool: cannot free unknown request {}", id);
  release(it->second.pages);
  requests_.erase(it);
}

void KVPool::retain(const std::vector<int32_t>& pages) {
  for (int32_t p : pages) {
    if (p < 0 || p >= cfg_.num_pages) fail("KV pool: cannot retain page {} outside [0, {})", p, cfg_.num_pages);
    if (refs_[size_t(p)] == 0) fail("KV pool: cannot retain page {}: it is free", p);
  }
  for (int32_t p : pages) ++refs_[size_t(p)];
}

void KVPool::release(const std::vector<int32_t>& pages) {
  // Checked first: every page must be held at least as many times as it appears.
  std::vector<int32_t> sorted = pages;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0, j; i < sorted.size(); i = j) {
    const int32_t p = sorted[i];
    for (j = i; j < sorted.size() && sorted[j] == p;) ++j;
    if (p < 0 || p >= cfg_.num_pages) fail("KV pool: cannot release page {} outside [0, {})", p, cfg_.num_pages);
    if (refs_[size_t(p)] < int32_t(j - i))
      fail("KV pool: cannot release page {} {} times: it has {} holders", p, j - i, refs_[size_t(p)]);
  }
  free_list_.reserve(free_list_.size() + pages.size());  // may throw before any change
  // Pushed in reverse so the next request gets them back in the same order.
  for (auto p = pages.rbegin(); p != pages.rend(); ++p)
    if (--refs_[size_t(*p)] == 0) free_list_.push_back(*p);
}

int32_t KVPool::ref_count(int32_t page) const {
  if (page < 0 || page >= cfg_.num_pages) fail("KV pool: page {} outside [0, {})", page, cfg_.num_pages);
  return refs_[size_t(page)];
}

int64_t KVPool::capacity(RequestId id) const {
  return int64_t(entry(id).pages.size()) * cfg_.page_size;
}

int64_t KVPool::length(RequestId id) const { return entry(id).length; }

std::vector<RequestId> KVPool::request_ids() const {
  std::vector<RequestId> ids;
  ids.reserve(requests_.size());
  for (const auto& [id, e] : requests_) ids.push_back(id);
  return ids;
}

const std::vector<int32_t>& KVPool::pages(RequestId id) const { return entry(id).pages; }

void KVPool::slots(RequestId id, int64_t begin, int64_t end, std::vector<int32_t>& out) const {
  const Entry& e = entry(id);
  if (begin < 0 || begin > end || end > e.length)
    fail("KV pool: slots [{}, {}) of request {} are outside its {} reserved tokens", begin, end, id,
         e.length);
  out.reserve(out.size() + size_t(end - begin));
  const int64_t ps = cfg_.page_size;
  for (int64_t t = begin; t < end; ++t) out.push_back(page_slot(e.pages, ps, t));
}

std::vector<int32_t> KVPool::slots(RequestId id, int64_t begin, int64_t end) const {
  std::vector<int32_t> out;
  slots(id, begin, end, out);
  return out;
}

Tensor& KVPool::buffer(int64_t layer) {
  if (layer < 0 || layer >= cfg_.num_layers)
    fail("KV pool: layer {} out of range [0, {})", layer, cfg_.num_layers);
  return buffers_[size_t(layer)];
}

const Tensor& KVPool::buffer(int64_t layer) const {
  if (layer < 0 || layer >= cfg_.num_layers)
    fail("KV pool: layer {} out of range [0, {})", layer, cfg_.num_layers);
  return buffers_[size_t(layer)];
}

double KVPool::scale(int64_t layer) const {
  if (layer < 0 || layer >= cfg_.num_layers)
    fail("KV pool: layer {} out of range [0, {})", layer, cfg_.num_layers);
  return scales_[size_t(layer)];
}

void KVPool::set_scale(int64_t layer, double s) {
  if (layer < 0 || layer >= cfg_.num_layers)
    fail("KV pool: layer {} out of range [0, {})", layer, cfg_.num_layers);
  if (!std::isfinite(s) || s <= 0)
    fail("KV pool: scale of layer {} must be finite and > 0, got {}", layer, s);
  scales_[size_t(layer)] = s;
}

}  // namespace mla
