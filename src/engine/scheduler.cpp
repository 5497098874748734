// src/engine/scheduler.cpp — continuous batching: admission, chunked prefill, decode, retraction,
// the prefix cache, sampling, updates and metrics.
#include "engine/scheduler.h"

#include <algorithm>
#include <random>

#include "engine/sampler.h"
#include "mla/error.h"

namespace mla::engine {

Policy parse_policy(const std::string& s) {
  if (s == "fcfs") return Policy::FCFS;
  if (s == "lpm") return Policy::LPM;
  fail("unknown scheduling policy '{}' (known: fcfs, lpm)", s);
}

namespace {

MetricsSnapshot::Histogram make_histogram(std::vector<double> bounds) {
  MetricsSnapshot::Histogram h;
  h.counts.assign(bounds.size() + 1, 0);  // the last: +Inf
  h.bounds = std::move(bounds);
  return h;
}

void observe(MetricsSnapshot::Histogram& h, double v) {
  for (size_t i = 0; i < h.bounds.size(); ++i)
    if (v <= h.bounds[i]) ++h.counts[i];
  ++h.counts.back();
  h.sum += v;
  ++h.count;
}

int64_t pages_for(int64_t tokens, int64_t ps) { return (tokens + ps - 1) / ps; }

}  // namespace

Scheduler::Scheduler(Engine& engine, const SchedulerOptions& opt) : engine_(engine), opt_(opt) {
  if (opt.token_budget < 1) fail("scheduler: token budget must be >= 1, got {}", opt.token_budget);
  if (opt.prefill_chunk < 0) fail("scheduler: prefill chunk must be >= 0, got {}", opt.prefill_chunk);
  if (opt.max_running < 1) fail("scheduler: max running must be >= 1, got {}", opt.max_running);
  if (opt.max_queue < 1) fail("scheduler: max queue must be >= 1, got {}", opt.max_queue);
  if (opt.decode_reserve < 0) fail("scheduler: decode reserve must be >= 0, got {}", opt.decode_reserve);
  if (opt.max_choices < 1) fail("scheduler: max choices must be >= 1, got {}", opt.max_choices);
  vocab_ = engine.model().config().vocab_size;
  if (opt.eos_token_id >= vocab_) fail("scheduler: eos token id {} is outside the vocabulary [0, {})", opt.eos_token_id, vocab_);
  ps_ = engine.options().page_size;
  if (!engine.pool().request_ids().empty()) fail("scheduler: the engine's pool must be empty");
  if (opt.prefix_cache) cache_ = std::make_unique<RadixCache>(engine.pool());
  stats_.time_to_first_token = make_histogram(
      {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80});
  stats_.inter_token_latency = make_histogram(
      {0.001, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5});
}

Scheduler::~Scheduler() {
  if (ahead_ && ahead_->f.copy) {
    try {
      engine_.finish(ahead_->f);  // its copy must land before the pinned buffer goes back
    } catch (...) {
    }
  }
  for (Seq* s : running_)
    if (engine_.pool().has(s->pool_id)) engine_.release(s->pool_id);
  cache_.reset();
}

int64_t Scheduler::max_context() const {
  return std::min(engine_.model().config().attn.max_position_embeddings, engine_.pool().num_slots());
}

double Scheduler::kv_cache_usage() const {
  const int64_t all = engine_.pool().config().num_pages;
  return all == 0 ? 0.0 : double(all - engine_.pool().free_pages()) / double(all);
}

void Scheduler::validate(const GenerateRequest& r) const {
  if (r.prompt.empty()) fail("the prompt is empty");
  for (size_t i = 0; i < r.prompt.size(); ++i)
    if (r.prompt[i] < 0 || r.prompt[i] >= vocab_)
      fail("prompt token {} (index {}) is outside the vocabulary [0, {})", r.prompt[i], i, vocab_);
  validate_sampling(r.params);
  for (int32_t t : r.params.stop_token_ids)
    if (t < 0 || t >= vocab_) fail("stop token id {} is outside the vocabulary [0, {})", t, vocab_);
  if (r.n < 1 || r.n > opt_.max_choices) fail("n must be in [1, {}], got {}", opt_.max_choices, r.n);
  const int64_t total = int64_t(r.prompt.size()) + r.params.max_tokens;
  if (total > max_context())
    fail("prompt ({} tokens) + max_tokens ({}) = {} is past the context of {} tokens", r.prompt.size(),
         r.params.max_tokens, total, max_context());
}

void Scheduler::add(RequestHandle handle, GenerateRequest r, std::function<void(const RequestUpdate&)> on_update,
                    LogitsHook hook) {
  validate(r);
  if (requests_.count(handle)) fail("scheduler: request handle {} is in use", handle);
  auto q = std::make_unique<Request>();
  q->handle = handle;
  q->seed = r.params.seed ? *r.params.seed : (uint64_t(std::random_device{}()) << 32 | std::random_device{}());
  q->r = std::move(r);
  q->on_update = std::move(on_update);
  q->hook = std::move(hook);
  q->submitted = Clock::now();
  for (int64_t i = 0; i < q->r.n; ++i) {
    auto s = std::make_unique<Seq>();
    s->req = q.get();
    s->index = i;
    s->pool_id = next_pool_id_++;
    s->tokens = q->r.prompt;
    s->prompt_len = s->prefill_end = int64_t(q->r.prompt.size());
    s->state = i == 0 ? State::WAITING : State::FORK_PENDING;
    q->seqs.push_back(std::move(s));
  }
  Seq* first = q->seqs[0].get();
  stats_.prompt_tokens += int64_t(q->r.prompt.size());
  requests_.emplace(handle, std::move(q));
  waiting_.push_back(first);
}

int64_t Scheduler::waiting_requests() const {
  int64_t n = 0;
  for (const auto& [h, q] : requests_) n += !q->admitted;
  return n;
}

int64_t Scheduler::pages_to_hold(const Seq& s, int64_t tokens) const {
  const KVPool& pool = engine_.pool();
  const int64_t have = pool.has(s.pool_id) ? int64_t(pool.pages(s.pool_id).size()) : 0;
  return std::max<int64_t>(0, pages_for(tokens, ps_) - have);
}

int64_t Scheduler::chunk_end(const Seq& s) const {
  if (opt_.prefill_chunk == 0) return s.prefill_end;
  const int64_t k = (s.computed - s.chunk_origin) / opt_.prefill_chunk + 1;
  return std::min(s.prefill_end, s.chunk_origin + k * opt_.prefill_chunk);
}

void Scheduler::admit(int64_t budget) {
  if (waiting_.empty()) return;
  std::vector<Seq*> order(waiting_.begin(), waiting_.end());
  if (opt_.policy == Policy::LPM && cache_) {
    std::vector<std::pair<int64_t, Seq*>> keyed;
    for (Seq* s : order) keyed.emplace_back(cache_->match_length(s->tokens, s->prefill_end - 1), s);
    std::stable_sort(keyed.begin(), keyed.end(), [](auto& a, auto& b) { return a.first > b.first; });
    for (size_t i = 0; i < order.size(); ++i) order[i] = keyed[i].second;
  }
  KVPool& pool = engine_.pool();
  for (Seq* s : order) {
    if (int64_t(running_.size()) >= opt_.max_running) break;
    if (budget <= 0 && !running_.empty()) break;  // the step's prefill budget is spent
    Request& q = *s->req;
    RadixCache::Match m;
    if (cache_) m = cache_->match_prefix(s->tokens, s->prefill_end - 1);
    // Reserve: the prefill and a few decode tokens, and the same for each choice still to fork.
    const int64_t final_len = s->prompt_len + q.r.params.max_tokens;
    int64_t reserve = pages_for(std::min(s->prefill_end + opt_.decode_reserve, final_len), ps_) - int64_t(m.pages.size());
    int64_t forks = 0;
    for (auto& c : q.seqs) forks += c->state == State::FORK_PENDING;
    if (forks > 0)
      reserve += forks * (pages_for(std::min(s->prompt_len + opt_.decode_reserve, final_len), ps_) -
                          (s->prompt_len - 1) / ps_);
    int64_t outstanding = 0;  // pages the running prefills still need
    for (Seq* r : running_)
      if (r->computed < r->prefill_end) outstanding += pages_to_hold(*r, r->prefill_end);
    if (cache_ && m.tokens > 0) cache_->lock(m.node);
    const int64_t available = pool.free_pages() + (cache_ ? cache_->evictable_pages() : 0);
    if (available < reserve + outstanding && !running_.empty()) {
      if (cache_ && m.tokens > 0) cache_->unlock(m.node);
      break;
    }
    if (m.tokens > 0) {
      try {
        engine_.adopt(s->pool_id, m.pages);
      } catch (...) {
        cache_->unlock(m.node);
        throw;
      }
      s->lock = m.node;
    }
    s->computed = s->chunk_origin = m.tokens;
    s->state = State::RUNNING;
    s->admit_order = next_admit_++;
    if (s->index == 0 && !q.admitted) {
      q.cached_tokens = m.tokens;
      q.admitted = true;
    }
    stats_.prefix_cache_queries += s->prefill_end;
    stats_.prefix_cache_hits += m.tokens;
    running_.push_back(s);
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), s));
    budget -= chunk_end(*s) - s->computed;
  }
}

void Scheduler::fork_choices(Seq& parent) {
  Request& q = *parent.req;
  const int64_t k = (parent.prompt_len - 1) / ps_;  // whole pages; the rest is recomputed
  const std::vector<int32_t>& pp = engine_.pool().pages(parent.pool_id);
  const std::vector<int32_t> shared(pp.begin(), pp.begin() + k);
  for (auto& c : q.seqs) {
    if (c->state != State::FORK_PENDING) continue;
    if (k > 0) engine_.adopt(c->pool_id, shared);
    if (parent.lock && cache_) {
      cache_->lock(parent.lock);
      c->lock = parent.lock;
    }
    c->computed = c->chunk_origin = k * ps_;
    c->state = State::RUNNING;
    c->admit_order = next_admit_++;
    running_.push_back(c.get());
  }
}

void Scheduler::cache_progress(Seq& s) {
  // The whole pages computed so far enter the cache at once, so requests admitted meanwhile
  // share them (the sequence keeps its own pages where the cache had the tokens already); the
  // sequence then locks the deeper node instead of its old one.
  if (!cache_) return;
  const int64_t k = s.computed / ps_;
  if (k == 0) return;
  const std::vector<int32_t>& pp = engine_.pool().pages(s.pool_id);
  cache_->insert(s.tokens, std::vector<int32_t>(pp.begin(), pp.begin() + k));
  RadixCache::Match m = cache_->match_prefix(s.tokens, k * ps_);
  cache_->lock(m.node);
  if (s.lock) cache_->unlock(s.lock);
  s.lock = m.node;
}

Scheduler::Seq* Scheduler::newest_running() { return running_.empty() ? nullptr : running_.back(); }

void Scheduler::let_go(Seq& s) {
  // A step ahead still writes the sequence's next KV row into its pages: the platform runs it
  // before any later step that could reuse them.
  forget_ahead(s);
  KVPool& pool = engine_.pool();
  if (pool.has(s.pool_id)) {
    if (cache_) {
      const int64_t k = s.computed / ps_;
      const std::vector<int32_t>& pp = pool.pages(s.pool_id);
      cache_->insert(s.tokens, std::vector<int32_t>(pp.begin(), pp.begin() + std::min<int64_t>(k, int64_t(pp.size()))));
    }
    engine_.release(s.pool_id);
  }
  if (s.lock && cache_) cache_->unlock(s.lock);
  s.lock = nullptr;
}

void Scheduler::retract(Seq& s) {
  let_go(s);
  s.computed = s.chunk_origin = 0;
  s.prefill_end = int64_t(s.tokens.size());
  s.state = State::WAITING;
  running_.erase(std::find(running_.begin(), running_.end(), &s));
  waiting_.push_front(&s);
  ++stats_.retractions;
}

void Scheduler::finish_seq(Seq& s, FinishReason why) {
  Request& q = *s.req;
  if (s.state == State::RUNNING) {
    let_go(s);
    running_.erase(std::find(running_.begin(), running_.end(), &s));
  } else if (s.state == State::WAITING) {
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), &s));
  }
  s.state = State::FINISHED;
  s.finish = why;
  ChoiceUpdate& cu = q.pending[s.index];
  cu.index = s.index;
  cu.finish = why;
  ++q.finished;
}

bool Scheduler::wants_greedy_only(const Request& q) {
  const SamplingParams& p = q.r.params;
  return (p.temperature == 0 || p.top_k == 1) && p.frequency_penalty == 0 && p.presence_penalty == 0 &&
         p.top_logprobs < 0 && !q.hook;
}

bool Scheduler::wants_row_only(const Request& q) {
  const SamplingParams& p = q.r.params;
  return p.frequency_penalty == 0 && p.presence_penalty == 0 && p.top_logprobs < 0 && !q.hook;
}

void Scheduler::sample(Seq& s, const float* logits, int32_t greedy_token) {
  Request& q = *s.req;
  const SamplingParams& p = q.r.params;
  int32_t tok = greedy_token;
  if (logits) {
    if (q.hook) q.hook(s.index, logits, vocab_);
    std::vector<float> row(logits, logits + vocab_);
    apply_penalties(row, s.counts, p.frequency_penalty, p.presence_penalty);
    const double u = p.temperature == 0 ? 0.0 : stream_uniform(q.seed, uint64_t(s.index), uint64_t(s.generated));
    tok = sample_token(row.data(), vocab_, p, u);
  }
  ChoiceUpdate& cu = q.pending[s.index];
  cu.index = s.index;
  s.tokens.push_back(tok);
  ++s.generated;
  ++s.counts[tok];
  ++stats_.generation_tokens;
  const auto now = Clock::now();
  if (!q.first_token) {
    observe(stats_.time_to_first_token, std::chrono::duration<double>(now - q.submitted).count());
    q.first_token = true;
  } else if (s.generated > 1) {
    observe(stats_.inter_token_latency, std::chrono::duration<double>(now - s.last_token).count());
  }
  s.last_token = now;

  FinishReason why = FinishReason::NONE;
  int64_t drop = 0;
  if (std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), tok) != p.stop_token_ids.end() ||
      (!p.ignore_eos && tok == opt_.eos_token_id)) {
    why = FinishReason::STOP;
  } else if (q.r.stop_check) {
    const std::vector<int32_t> out(s.tokens.begin() + s.prompt_len, s.tokens.end());
    const int64_t r = q.r.stop_check(s.index, out);
    if (r >= 0) why = FinishReason::STOP, drop = std::min(r, s.generated);
  }
  if (why == FinishReason::NONE && s.generated >= p.max_tokens) why = FinishReason::LENGTH;
  // Report what is new; a stop string drops its tokens unless they were reported already.
  const int64_t upto = std::max(s.reported, s.generated - drop);
  for (int64_t i = s.reported; i < upto; ++i) {
    const int32_t t = s.tokens[size_t(s.prompt_len + i)];
    cu.new_tokens.push_back(t);
    if (p.top_logprobs >= 0) {
      // Tokens are reported as they are sampled (a stop string only drops), so the token reported
      // here is always the one just sampled from `logits`.
      cu.logprobs.push_back(token_logprobs(logits, vocab_, t, p.top_logprobs));
    }
  }
  s.reported = upto;
  if (why != FinishReason::NONE) finish_seq(s, why);
}

std::vector<Scheduler::Group> Scheduler::group_items(ForwardMode mode, std::vector<Item>& items) const {
  // Each item runs by the method it would run by alone: an item joins a group of its solo method
  // only if the group's method stays that; MHA_CHUNKED_KV splits its prefix into chunks of
  // chunk_capacity / requests tokens, so it always runs alone.
  auto batch_of = [mode](const std::vector<Item*>& g) {
    Batch b{mode, {}};
    for (const Item* it : g) b.requests.push_back({it->seq->pool_id, it->begin, it->end - it->begin});
    return b;
  };
  std::vector<Group> groups;
  for (Item& it : items) {
    const ForwardMethod solo = engine_.method_for(batch_of({&it}));
    bool placed = false;
    if (solo != ForwardMethod::MHA_CHUNKED_KV) {
      for (Group& g : groups) {
        if (g.method != solo) continue;
        std::vector<Item*> with = g.items;
        with.push_back(&it);
        if (engine_.method_for(batch_of(with)) != solo) continue;
        g.items = std::move(with);
        placed = true;
        break;
      }
    }
    if (!placed) groups.push_back({solo, {&it}});
  }
  return groups;
}

void Scheduler::count_batch(ForwardMode mode, ForwardMethod method, int64_t tokens) {
  ++stats_.steps_per_method[std::string(method_name(method))];
  if (opt_.on_batch) opt_.on_batch(mode, method, tokens);
}

void Scheduler::fail_request(Request& q, const std::string& why) {
  if (q.error.empty()) q.error = why;
  for (auto& s : q.seqs)
    if (s->state != State::FINISHED) finish_seq(*s, FinishReason::ABORT);
}

void Scheduler::run_items(ForwardMode mode, std::vector<Item>& items) {
  if (items.empty()) return;
  std::vector<Group> groups = group_items(mode, items);
  for (Group& g : groups) {
    // A sequence finished by a failed batch of this step leaves the later ones.
    g.items.erase(std::remove_if(g.items.begin(), g.items.end(),
                                 [](const Item* it) { return it->seq->state != State::RUNNING; }),
                  g.items.end());
    if (g.items.empty()) continue;
    std::vector<StepRequest> reqs;
    for (const Item* it : g.items)
      reqs.push_back({it->seq->pool_id, std::vector<int32_t>(it->seq->tokens.begin() + it->begin,
                                                             it->seq->tokens.begin() + it->end)});
    // When every sequence that samples now wants just the greedy token (no penalties, logprobs or
    // hook), the platform picks it and only the ids come back, not [requests, vocab] logits.
    // Else, when none of them needs the logits on the host (penalties, logprobs, hook), the platform
    // draws every token (Ops::sample_rows) with the uniform number the host sampler would use.
    bool greedy = true, on_device = opt_.device_sampling;
    for (const Item* it : g.items)
      if (it->end == int64_t(it->seq->tokens.size())) {
        greedy = greedy && wants_greedy_only(*it->seq->req);
        on_device = on_device && wants_row_only(*it->seq->req);
      }
    on_device = on_device && !greedy;
    std::vector<SampleRow> rows;
    if (on_device)
      for (const Item* it : g.items) {
        const Seq& s = *it->seq;
        const SamplingParams& p = s.req->r.params;
        if (it->end != int64_t(s.tokens.size())) {
          rows.push_back(SampleRow{0.0, 1.0, 0.0, 0.0, 0});  // a chunk that samples nothing: cheap greedy
          continue;
        }
        const double u = p.temperature == 0 ? 0.0 : stream_uniform(s.req->seed, uint64_t(s.index), uint64_t(s.generated));
        rows.push_back(sample_row(p, u));
      }
    StepResult r;
    try {
      r = engine_.step(mode, reqs, /*last_only=*/true, greedy, on_device ? &rows : nullptr);
    } catch (const std::exception& e) {
      // The batch failed (the engine changed nothing): its requests fail, with the error.
      for (const Item* it : g.items) fail_request(*it->seq->req, e.what());
      continue;
    }
    int64_t n = 0;
    for (const StepRequest& q : reqs) n += int64_t(q.ids.size());
    count_batch(mode, r.method, n);
    for (size_t i = 0; i < g.items.size(); ++i) {
      Seq& s = *g.items[i]->seq;
      s.computed = g.items[i]->end;
      if (s.index == 0 && s.computed >= s.prompt_len) {
        bool pending = false;
        for (auto& c : s.req->seqs) pending |= c->state == State::FORK_PENDING;
        if (pending) fork_choices(s);
      }
      if (mode == ForwardMode::EXTEND) cache_progress(s);
      if (s.computed == int64_t(s.tokens.size())) {
        if (greedy) sample(s, nullptr, r.greedy[i]);
        else if (on_device) sample(s, nullptr, r.sampled[i]);
        else sample(s, r.logits.data() + i * size_t(vocab_));
      }
    }
  }
}

bool Scheduler::decodes_ahead(std::vector<Item>& items, bool& greedy) const {
  if (!opt_.decode_ahead || !engine_.decodes_ahead() || items.empty()) return false;
  bool all_greedy = true, on_device = opt_.device_sampling;
  for (const Item& it : items) {
    all_greedy = all_greedy && wants_greedy_only(*it.seq->req);
    on_device = on_device && wants_row_only(*it.seq->req);
  }
  greedy = all_greedy;
  return (all_greedy || on_device) && group_items(ForwardMode::DECODE, items).size() == 1;
}

void Scheduler::launch_ahead(std::vector<Item>& items, bool greedy) {
  // A sequence in the step before gives no id: its token is the one that step draws, on the platform.
  // Its token here is then its (generated + 2)-th: the random number follows.
  std::vector<StepRequest> reqs;
  std::vector<SampleRow> rows;
  for (const Item& it : items) {
    const Seq& s = *it.seq;
    reqs.push_back({s.pool_id, s.ahead ? std::vector<int32_t>{} : std::vector<int32_t>{s.tokens[size_t(it.begin)]}});
    if (greedy) continue;
    const SamplingParams& p = s.req->r.params;
    const uint64_t i = uint64_t(s.generated + (s.ahead ? 1 : 0));
    rows.push_back(sample_row(p, p.temperature == 0 ? 0.0 : stream_uniform(s.req->seed, uint64_t(s.index), i)));
  }
  Ahead next;
  try {
    next.f = engine_.decode_launch(reqs, ahead_ ? &ahead_->f : nullptr, greedy ? nullptr : &rows);
  } catch (const std::exception& e) {
    // Nothing was issued: the batch's requests fail, with the error; the step before still lands.
    for (const Item& it : items) fail_request(*it.seq->req, e.what());
    drain_ahead();
    return;
  }
  ++stats_.ahead_batches;
  count_batch(ForwardMode::DECODE, next.f.method, int64_t(items.size()));
  for (Item& it : items) {
    it.seq->computed = it.end;
    next.seqs.push_back(it.seq);
  }
  std::optional<Ahead> before = std::move(ahead_);
  ahead_.reset();
  if (before)
    for (Seq* s : before->seqs)
      if (s) s->ahead = false;
  for (Seq* s : next.seqs) s->ahead = true;
  ahead_ = std::move(next);
  if (before) take(*before);  // a sequence that stops there leaves ahead_ (forget_ahead)
}

void Scheduler::take(Ahead& a) {
  const std::vector<int32_t> tokens = engine_.finish(a.f);
  for (size_t i = 0; i < a.seqs.size(); ++i)
    if (Seq* s = a.seqs[i]) sample(*s, nullptr, tokens[i]);  // a sequence that left is null (let_go)
}

void Scheduler::drain_ahead() {
  if (!ahead_) return;
  Ahead a = std::move(*ahead_);
  ahead_.reset();
  for (Seq* s : a.seqs)
    if (s) s->ahead = false;
  take(a);
}

void Scheduler::forget_ahead(Seq& s) {
  if (!s.ahead) return;
  s.ahead = false;
  if (ahead_)
    for (Seq*& x : ahead_->seqs)
      if (x == &s) x = nullptr;
}

void Scheduler::flush_updates() {
  for (auto it = requests_.begin(); it != requests_.end();) {
    Request& q = *it->second;
    const bool done = q.finished == int64_t(q.seqs.size());
    if (q.pending.empty() && !done) {
      ++it;
      continue;
    }
    RequestUpdate u;
    for (auto& [i, cu] : q.pending) u.choices.push_back(std::move(cu));
    q.pending.clear();
    u.finished = done;
    u.error = q.error;
    u.prompt_tokens = int64_t(q.r.prompt.size());
    u.cached_tokens = q.cached_tokens;
    for (auto& s : q.seqs) u.completion_tokens += s->reported;
    if (q.on_update) q.on_update(u);
    it = done ? requests_.erase(it) : std::next(it);
  }
}

void Scheduler::abort(RequestHandle handle) {
  auto it = requests_.find(handle);
  if (it == requests_.end()) return;
  Request& q = *it->second;
  for (auto& s : q.seqs)
    if (s->state != State::FINISHED) finish_seq(*s, FinishReason::ABORT);
  RequestUpdate u;
  for (auto& [i, cu] : q.pending) u.choices.push_back(std::move(cu));
  u.finished = true;
  u.prompt_tokens = int64_t(q.r.prompt.size());
  u.cached_tokens = q.cached_tokens;
  for (auto& s : q.seqs) u.completion_tokens += s->reported;
  auto cb = std::move(q.on_update);
  requests_.erase(it);
  if (cb) cb(u);
}

void Scheduler::abort_all() {
  std::vector<RequestHandle> hs;
  for (auto& [h, q] : requests_) hs.push_back(h);
  for (RequestHandle h : hs) abort(h);
}

int64_t Scheduler::flush_cache() { return cache_ ? cache_->flush() : 0; }

bool Scheduler::step() {
  if (requests_.empty()) {
    drain_ahead();  // only sequences that left are in it
    return false;
  }
  KVPool& pool = engine_.pool();
  auto make_free = [&](int64_t pages) { return cache_ ? cache_->make_free(pages) : pool.free_pages() >= pages; };

  // Decodes: every running sequence with one token to compute past its prefill: the last token on
  // the host, or the one the step ahead draws unless that one is its last (max_tokens).
  std::vector<Seq*> dec;
  for (Seq* s : running_)
    if (s->computed >= s->prefill_end &&
        (s->computed == int64_t(s->tokens.size()) - 1 || (s->ahead && s->generated + 1 < s->req->r.params.max_tokens)))
      dec.push_back(s);
  auto decode_pages = [&] {
    int64_t n = 0;
    for (Seq* s : dec) n += pages_to_hold(*s, s->computed + 1);
    return n;
  };
  // Out of pages: retract the newest sequence (its pages go to the cache, it resumes later).
  while (!make_free(decode_pages())) {
    Seq* victim = newest_running();
    if (!victim) break;
    dec.erase(std::remove(dec.begin(), dec.end(), victim), dec.end());
    retract(*victim);
  }
  int64_t reserved = decode_pages();

  // Admission within what the step's budget leaves after the decodes and the running prefills.
  int64_t budget = opt_.token_budget - int64_t(dec.size());
  int64_t running_prefill = 0;
  for (Seq* s : running_)
    if (s->computed < s->prefill_end) running_prefill += chunk_end(*s) - s->computed;
  admit(budget - running_prefill);

  // Prefill chunks within the budget, in admission order; chunk boundaries come from the
  // sequence alone (chunk_origin + k · prefill_chunk), never from the budget.
  std::vector<Item> ext;
  for (Seq* s : running_) {
    if (s->computed >= s->prefill_end) continue;
    const int64_t end = chunk_end(*s), n = end - s->computed;
    if (n > budget && !ext.empty()) break;
    const int64_t p = pages_to_hold(*s, end);
    if (!make_free(reserved + p)) continue;
    reserved += p;
    budget -= n;
    ext.push_back({s, s->computed, end});
  }
  if (dec.empty() && ext.empty() && ahead_) {
    drain_ahead();  // its sequences reach max_tokens there
    flush_updates();
    return true;
  }
  if (dec.empty() && ext.empty()) {
    // Every running sequence waits for pages the others hold: let the newest go.
    if (Seq* victim = newest_running(); victim && running_.size() > 1) retract(*victim);
    flush_updates();
    return true;
  }
  std::vector<Item> dec_items;
  for (Seq* s : dec) dec_items.push_back({s, s->computed, s->computed + 1});
  ++stats_.steps;
  bool greedy = false;
  if (decodes_ahead(dec_items, greedy)) {
    launch_ahead(dec_items, greedy);
  } else {
    drain_ahead();  // its sequences' tokens are this batch's input
    run_items(ForwardMode::DECODE, dec_items);
  }
  run_items(ForwardMode::EXTEND, ext);
  flush_updates();
  return true;
}

}  // namespace mla::engine
