// src/engine/engine.cpp — the engine loop: batches of requests through the model and the KV pool.
#include "engine/engine.h"

#include <cstring>
#include <type_traits>
#include <set>
#include <unordered_map>

#include "mla/error.h"

namespace mla {
namespace {

// The wire form of one forward (Engine::lead → Engine::follow): little-endian fields in order,
// vectors as a count then their elements. An empty message ends the leader.
class Writer {
 public:
  template <class T>
  void put(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    s_.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  template <class T>
  void put(const std::vector<T>& v) {
    put(int64_t(v.size()));
    s_.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  }
  std::string take() { return std::move(s_); }

 private:
  std::string s_;
};

class Reader {
 public:
  explicit Reader(const std::string& s) : s_(s) {}
  template <class T>
  T get() {
    T v;
    take(&v, sizeof v);
    return v;
  }
  template <class T>
  void get(std::vector<T>& v) {
    const int64_t n = get<int64_t>();
    if (n < 0 || size_t(n) > (s_.size() - at_) / sizeof(T)) fail("engine follow: a malformed step message");
    v.resize(size_t(n));
    take(v.data(), size_t(n) * sizeof(T));
  }
  bool done() const { return at_ == s_.size(); }

 private:
  void take(void* p, size_t n) {
    if (n > s_.size() - at_) fail("engine follow: a step message ends early");
    std::memcpy(p, s_.data() + at_, n);
    at_ += n;
  }
  const std::string& s_;
  size_t at_ = 0;
};

// A step travels as its batch, each request's cache pages (those its tokens reach), the ids, the
// method and the logit rows; the follower rebuilds the plan from them (plan_batch_on_pages), so a
// long context costs one int a page, not one a token.
std::string encode_step(const std::vector<int32_t>& ids, const Batch& b, const KVPool& pool, ForwardMethod method,
                        const std::vector<int32_t>* rows) {
  Writer w;
  w.put(uint8_t(b.mode));
  w.put(b.requests);
  const int64_t ps = pool.config().page_size;
  for (const BatchRequest& r : b.requests) {
    const std::vector<int32_t>& pages = pool.pages(r.id);
    const size_t used = size_t((r.prefix_len + r.new_len + ps - 1) / ps);
    w.put(std::vector<int32_t>(pages.begin(), pages.begin() + int64_t(std::min(used, pages.size()))));
  }
  w.put(ids);
  w.put(int32_t(method));
  w.put(uint8_t(rows != nullptr));
  if (rows) w.put(*rows);
  return w.take();
}

struct FollowedStep {
  std::vector<int32_t> ids, rows;
  bool has_rows = false;
  BatchPlan plan;
  ForwardMethod method = ForwardMethod::MLA;
};

FollowedStep decode_step(const std::string& msg, int64_t page_size) {
  Reader r(msg);
  FollowedStep s;
  Batch b;
  b.mode = ForwardMode(r.get<uint8_t>());
  r.get(b.requests);
  std::vector<std::vector<int32_t>> pages(b.requests.size());
  std::vector<const std::vector<int32_t>*> of;
  for (std::vector<int32_t>& p : pages) r.get(p), of.push_back(&p);
  r.get(s.ids);
  s.method = ForwardMethod(r.get<int32_t>());
  s.has_rows = r.get<uint8_t>() != 0;
  if (s.has_rows) r.get(s.rows);
  if (!r.done()) fail("engine follow: a step message has {} trailing bytes", msg.size());
  s.plan = plan_batch_on_pages(b, page_size, of);
  return s;
}

}  // namespace

Engine::Engine(Model& model, const EngineOptions& opt) : model_(model), opt_(opt) {
  if (opt.page_size <= 0) fail("engine: page size must be positive (got {})", opt.page_size);
  if (opt.max_tokens <= 0) fail("engine: max tokens must be positive (got {})", opt.max_tokens);
  const ModelConfig& c = model.config();
  KVPoolConfig pc{c.num_hidden_layers, c.attn.kv_row_dim(), opt.kv_dtype, opt.page_size,
                  (opt.max_tokens + opt.page_size - 1) / opt.page_size};
  Ops& ops = model.ops();
  pool_ = std::make_unique<KVPool>(pc, [&ops](DType d, Shape s) { return ops.empty(d, std::move(s)); });
}

Engine::~Engine() {
  if (!send_) return;
  try {
    send_(std::string());  // the followers' last message
  } catch (...) {
  }
}

void Engine::lead(std::function<void(const std::string&)> send) { send_ = std::move(send); }

int64_t Engine::follow(const std::function<std::string()>& receive) {
  int64_t steps = 0;
  for (std::string msg = receive(); !msg.empty(); msg = receive(), ++steps) {
    const FollowedStep s = decode_step(msg, opt_.page_size);
    const ForwardMethod mine = model_.choose_method(s.plan.batch, opt_.forward);
    if (mine != s.method)
      fail("tensor-parallel ranks disagree: rank 0 runs a batch by {}, rank {} would by {}", method_name(s.method),
           model_.tp_rank(), method_name(mine));
    ForwardOptions fo = opt_.forward;
    fo.method = s.method;
    model_.forward(s.ids, s.plan, *pool_, fo, s.has_rows ? &s.rows : nullptr);
  }
  return steps;
}

int64_t Engine::length(RequestId id) const {
  auto it = lengths_.find(id);
  return it == lengths_.end() ? 0 : it->second;
}

void Engine::release(RequestId id) {
  if (pool_->has(id)) pool_->free(id);
  lengths_.erase(id);
}

void Engine::adopt(RequestId id, const std::vector<int32_t>& shared) {
  if (lengths_.count(id)) fail("engine: request {} exists", id);
  const int64_t n = int64_t(shared.size()) * opt_.page_size;
  pool_->adopt(id, shared, n);
  try {
    lengths_[id] = n;
  } catch (...) {
    pool_->free(id);
    throw;
  }
}

namespace {
void check_picks(size_t requests, bool last_only, bool greedy, const std::vector<SampleRow>* sample) {
  if (greedy && !last_only) fail("engine: greedy tokens come from the last rows (last_only)");
  if (sample) {
    if (greedy || !last_only) fail("engine: sampled tokens come from the last rows (last_only, not greedy)");
    if (sample->size() != requests) fail("engine: {} sampling rows for {} requests", sample->size(), requests);
    for (const SampleRow& p : *sample) check_sample_row(p);
  }
}
}  // namespace

ModelOutput Engine::forward(ForwardMode mode, const std::vector<StepRequest>& reqs, bool last_only,
                            const DeviceIds* device_ids) {
  const ModelConfig& c = model_.config();
  if (reqs.empty()) fail("engine: empty batch (no requests)");
  if (device_ids && send_) fail("engine: token ids on the device cannot be sent to the other ranks");
  Batch b{mode, {}};
  std::vector<int32_t> ids;
  int64_t pages_needed = 0;
  for (const StepRequest& r : reqs) {
    const int64_t prefix = length(r.id), total = prefix + int64_t(r.ids.size());
    if (total > c.attn.max_position_embeddings)
      fail("request {} would reach {} tokens, past max_position_embeddings {}", r.id, total, c.attn.max_position_embeddings);
    for (int32_t t : r.ids)
      if (t < 0 || t >= c.vocab_size) fail("request {}: token id {} is outside the vocabulary [0, {})", r.id, t, c.vocab_size);
    b.requests.push_back({r.id, prefix, int64_t(r.ids.size())});
    ids.insert(ids.end(), r.ids.begin(), r.ids.end());
    const int64_t have = pool_->has(r.id) ? int64_t(pool_->pages(r.id).size()) : 0;
    pages_needed += std::max<int64_t>(0, (total + opt_.page_size - 1) / opt_.page_size - have);
  }
  validate_batch(b);
  const ForwardMethod method = model_.choose_method(b, opt_.forward);  // refuse before any change
  if (pages_needed > pool_->free_pages())
    fail("KV pool: the batch needs {} more pages of {} tokens, {} free", pages_needed, opt_.page_size, pool_->free_pages());
  for (const BatchRequest& r : b.requests) pool_->reserve(r.id, r.prefix_len + r.new_len);
  std::vector<int32_t> rows;  // last_only: the last new token of each request
  int64_t end = 0;
  if (last_only)
    for (const BatchRequest& r : b.requests) rows.push_back(int32_t((end += r.new_len) - 1));
  // Followers get the step before this rank plans it: both build their plans at once.
  if (send_) send_(encode_step(ids, b, *pool_, method, last_only ? &rows : nullptr));
  BatchPlan plan = plan_batch(b, *pool_);
  ForwardOptions fo = opt_.forward;
  fo.method = method;
  ModelOutput out = model_.forward(ids, plan, *pool_, fo, last_only ? &rows : nullptr, device_ids);
  for (const BatchRequest& r : b.requests) lengths_[r.id] = r.prefix_len + r.new_len;
  return out;
}

Tensor Engine::pick(const Tensor& logits, const std::vector<SampleRow>* sample) {
  Tensor ids = model_.ops().empty(DType::I32, {logits.dim(0)});  // [requests]
  if (sample) model_.ops().sample_rows(logits, *sample, ids);
  else model_.ops().argmax_rows(logits, ids);
  return ids;
}

StepResult Engine::step(ForwardMode mode, const std::vector<StepRequest>& reqs, bool last_only, bool greedy,
                        const std::vector<SampleRow>* sample) {
  check_picks(reqs.size(), last_only, greedy, sample);
  ModelOutput out = forward(mode, reqs, last_only, nullptr);
  StepResult res;
  res.method = out.method;
  if (greedy || sample) {
    const Tensor host = model_.ops().download(pick(out.logits, sample));
    (greedy ? res.greedy : res.sampled).assign(host.ptr<int32_t>(), host.ptr<int32_t>() + host.numel());
    return res;
  }
  Tensor host = model_.ops().download(out.logits);
  res.logits.assign(host.ptr<float>(), host.ptr<float>() + host.numel());
  return res;
}

Engine::InFlight Engine::decode_launch(const std::vector<StepRequest>& reqs, const InFlight* after,
                                      const std::vector<SampleRow>* sample) {
  check_picks(reqs.size(), true, sample == nullptr, sample);
  // A request without ids takes its token from its row of `after`, on the device.
  std::vector<StepRequest> batch;  // the ids there are placeholders
  DeviceIds dev;
  std::unordered_map<RequestId, int32_t> row_of;  // after's requests
  bool from_after = false;
  for (const StepRequest& r : reqs) {
    if (!r.ids.empty()) {
      batch.push_back(r);
      dev.from.push_back(-1);
      continue;
    }
    if (!after) fail("engine: request {} gives no token id and no step is before it", r.id);
    if (!after->ids.defined()) fail("engine: the step to decode after holds no tokens (moved from?)");
    if (row_of.empty())
      for (size_t i = 0; i < after->requests.size(); ++i) row_of.emplace(after->requests[i], int32_t(i));
    auto it = row_of.find(r.id);
    if (it == row_of.end()) fail("engine: request {} gives no token id and was not in the step before", r.id);
    batch.push_back({r.id, {0}});
    dev.from.push_back(it->second);
    from_after = true;
  }
  if (from_after) dev.src = after->ids;
  ModelOutput out = forward(ForwardMode::DECODE, batch, true, from_after ? &dev : nullptr);
  InFlight f;
  for (const StepRequest& r : reqs) f.requests.push_back(r.id);
  f.method = out.method;
  f.ids = pick(out.logits, sample);
  f.copy = model_.ops().download_later(f.ids);
  return f;
}

std::vector<int32_t> Engine::finish(InFlight& f) {
  if (!f.copy) fail("engine: this step was finished already");
  const Tensor h = f.copy->wait();
  f.copy.reset();
  return std::vector<int32_t>(h.ptr<int32_t>(), h.ptr<int32_t>() + h.numel());
}

Engine::Run Engine::run_sequence(const std::vector<int32_t>& ids, int64_t prefill_chunk,
                                 int64_t decode_from) {
  const int64_t n = int64_t(ids.size());
  if (n == 0) fail("no token ids given");
  if (prefill_chunk < 0) fail("prefill chunk must be >= 0 (got {})", prefill_chunk);
  if (decode_from < 0 || decode_from > n) fail("decode-from {} is outside [0, {}]", decode_from, n);
  RequestId id = 1;
  while (lengths_.count(id) || pool_->has(id)) ++id;
  Run run;
  try {
    const int64_t chunk = prefill_chunk == 0 ? std::max<int64_t>(decode_from, 1) : prefill_chunk;
    for (int64_t begin = 0; begin < n;) {
      const bool decode = begin >= decode_from;
      const int64_t end = decode ? begin + 1 : std::min(begin + chunk, decode_from);
      StepResult s = step(decode ? ForwardMode::DECODE : ForwardMode::EXTEND,
                          {{id, std::vector<int32_t>(ids.begin() + begin, ids.begin() + end)}});
      run.logits.insert(run.logits.end(), s.logits.begin(), s.logits.end());
      run.methods.push_back(s.method);
      begin = end;
    }
  } catch (...) {
    release(id);
    throw;
  }
  release(id);
  return run;
}

}  // namespace mla
