// The DeepSeek decoder, written once against Ops: embedding, layers (attention + dense MLP or
// MoE), final norm, lm_head. MoE layers route and run their experts on the platform (Ops::moe_route,
// Ops::moe_experts) from the f32 router logits, with the routed experts stacked per projection.
#include "mla/model.h"

#include <optional>

#include "mla/error.h"
#include "mla/registry.h"

namespace mla {
namespace {

std::string layer_prefix(int64_t i) { return fmt::format("model.layers.{}.", i); }

}  // namespace

MoeRouting moe_routing(const ModelConfig& c) {
  MoeRouting r;
  r.n_routed_experts = c.n_routed_experts;
  r.num_experts_per_tok = c.num_experts_per_tok;
  r.n_group = c.n_group;
  r.topk_group = c.topk_group;
  r.scoring_func = c.scoring_func;
  r.topk_method = c.topk_method;
  r.norm_topk_prob = c.norm_topk_prob;
  r.routed_scaling_factor = c.routed_scaling_factor;
  return r;
}

Shape WeightShard::full_shape(const Shape& part) const {
  Shape s = part;
  if (!whole()) s[size_t(dim)] = full;
  return s;
}

void check_tensor_parallel(const ModelConfig& c, int tp) {
  if (tp < 1) fail("tensor parallel size must be at least 1, got {}", tp);
  auto even = [&](const char* field, int64_t v) {
    if (v % tp != 0) fail("tensor parallel size {} does not divide {} = {}", tp, field, v);
  };
  even("num_attention_heads", c.attn.num_attention_heads);
  bool dense = false, moe = false;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) (c.is_moe_layer(i) ? moe : dense) = true;
  if (dense) even("intermediate_size", c.intermediate_size);
  if (moe) even("moe_intermediate_size", c.moe_intermediate_size);
}

namespace {

// How a rank splits an attention weight: heads by rows of the input projections, by columns of o_proj.
WeightShard attention_shard(const AttentionWeightSlot& s, int rank, int tp) {
  const std::string_view n = s.name;
  if (tp == 1) return {};
  if (n == "q_b_proj" || n == "q_proj" || n == "kv_b_proj") return {0, rank * s.shape[0], tp * s.shape[0]};
  if (n == "o_proj") return {1, rank * s.shape[1], tp * s.shape[1]};
  return {};  // the latent projections and norms: every rank holds them whole
}

}  // namespace

Model::Model(const ModelConfig& c, WeightSource& src, Ops& ops, Communicator* tp)
    : cfg_(c), ops_(ops), tp_(tp && tp->size() > 1 ? tp : nullptr) {
  c.validate();
  const int ranks = tp_size(), rank = tp_rank();
  check_tensor_parallel(c, ranks);
  if (c.n_routed_experts > 0) routing_ = moe_routing(c);
  const DType act = ops.act_dtype();
  const int64_t H = c.hidden_size(), V = c.vocab_size;
  AttentionConfig rank_attn = c.attn;  // this rank's heads
  rank_attn.num_attention_heads /= ranks;
  struct Job {
    std::string name;
    Tensor dst;
    WeightShard shard;
  };
  std::vector<Job> jobs;  // every weight, allocated first (the platform runs out before any read)
  auto want = [&](const std::string& name, Shape shape, DType dtype, WeightShard shard = {}) {
    Tensor t = ops.empty(dtype, std::move(shape));
    jobs.push_back({name, t, shard});
    return t;
  };
  // This rank's `part` of a dimension `full` long, along `dim` (the whole tensor without TP).
  auto split = [&](int dim, int64_t part, int64_t full) {
    return ranks == 1 ? WeightShard{} : WeightShard{dim, rank * part, full};
  };
  // An MLP of `width` (the whole model's): this rank's width / tp, gate/up by rows, down by columns.
  auto want_mlp = [&](const std::string& p, int64_t width) -> Mlp {
    const int64_t w = width / ranks;
    return {want(p + "gate_proj.weight", {w, H}, act, split(0, w, width)),
            want(p + "up_proj.weight", {w, H}, act, split(0, w, width)),
            want(p + "down_proj.weight", {H, w}, act, split(1, w, width))};
  };
  // The vocabulary: ceil(V / tp) rows a rank, the last ones short (zero rows pad them).
  vocab_rows_ = (V + ranks - 1) / ranks;
  vocab_begin_ = std::min<int64_t>(V, rank * vocab_rows_);
  const int64_t vocab_own = std::min(V - vocab_begin_, vocab_rows_);
  auto want_vocab = [&](const std::string& name, int64_t rows) {  // [rows ≥ vocab_rows_, H], zeros past ours
    Tensor t = ops.empty(act, {rows, H});
    if (rows > vocab_own) {
      Tensor pad = t.rows(vocab_own, rows);
      ops.fill(pad, 0.0);
    }
    if (vocab_own > 0) jobs.push_back({name, t.rows(0, vocab_own), split(0, vocab_rows_, V)});
    return t;
  };
  std::vector<AttentionWeights> attn(size_t(c.num_hidden_layers));
  embed_ = want_vocab("model.embed_tokens.weight", vocab_rows_ + (ranks > 1 ? 1 : 0));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = layer_prefix(i);
    Layer l;
    l.input_layernorm = want(p + "input_layernorm.weight", {H}, act);
    for (const AttentionWeightSlot& s : attention_weight_slots(rank_attn))
      if (s.used)
        attn[size_t(i)].*s.member =
            want(fmt::format("{}self_attn.{}.weight", p, s.name), s.shape, act, attention_shard(s, rank, ranks));
    l.post_attention_layernorm = want(p + "post_attention_layernorm.weight", {H}, act);
    if (c.is_moe_layer(i)) {
      const int64_t E = c.n_routed_experts, I = c.moe_intermediate_size / ranks;
      const WeightShard in = split(0, I, c.moe_intermediate_size), out = split(1, I, c.moe_intermediate_size);
      // In bf16 when the model runs in bf16, as transformers holds it (the correction bias stays
      // f32 there too); the logits are f32 sums either way.
      l.router = want(p + "mlp.gate.weight", {E, H}, act == DType::BF16 ? DType::BF16 : DType::F32);
      if (c.model_type() == "deepseek_v3") l.bias = want(p + "mlp.gate.e_score_correction_bias", {E}, DType::F32);
      l.experts = {ops.empty(act, {E, I, H}), ops.empty(act, {E, I, H}), ops.empty(act, {E, H, I})};
      for (int64_t e = 0; e < E; ++e) {
        const std::string ep = fmt::format("{}mlp.experts.{}.", p, e);
        jobs.push_back({ep + "gate_proj.weight", l.experts.gate_proj.rows(e, e + 1).reshaped({I, H}), in});
        jobs.push_back({ep + "up_proj.weight", l.experts.up_proj.rows(e, e + 1).reshaped({I, H}), in});
        jobs.push_back({ep + "down_proj.weight", l.experts.down_proj.rows(e, e + 1).reshaped({H, I}), out});
      }
      if (c.n_shared_experts > 0)
        l.shared = want_mlp(p + "mlp.shared_experts.", c.moe_intermediate_size * c.n_shared_experts);
    } else {
      l.mlp = want_mlp(p + "mlp.", c.intermediate_size);
    }
    layers_.push_back(std::move(l));
  }
  norm_ = want("model.norm.weight", {H}, act);
  if (c.tie_word_embeddings && !src.has("lm_head.weight")) lm_head_ = embed_.rows(0, vocab_rows_);
  else lm_head_ = want_vocab("lm_head.weight", vocab_rows_);
  int64_t bytes = 0;
  for (const Job& j : jobs) bytes += int64_t(j.dst.nbytes()), parameters_ += j.dst.numel();
  src.begin(int64_t(jobs.size()), bytes);
  for (Job& j : jobs) src.fill(j.name, j.dst, j.shard);
  src.end();
  for (size_t i = 0; i < layers_.size(); ++i) {
    Layer& l = layers_[i];
    l.attn = AttentionLayer::on_platform(rank_attn, attn[i], ops);
  }
}

Tensor Model::mlp(const Mlp& m, const Tensor& x) {
  const int64_t n = x.dim(0), I = m.gate_proj.dim(0);
  const DType act = ops_.act_dtype();
  Tensor gate = ops_.empty(act, {n, I});  // [n, I]
  ops_.gate_up(x, m.gate_proj, m.up_proj, gate);
  Tensor y = ops_.empty(act, {n, cfg_.hidden_size()});  // [n, hidden]
  ops_.linear(gate, m.down_proj, y);
  return y;
}

Tensor Model::moe(const Layer& l, const Tensor& x) {
  const int64_t T = x.dim(0), E = routing_.n_routed_experts, K = routing_.num_experts_per_tok;
  // The router first: forked beside it, the shared experts' GEMMs held the SMs its blocks waited
  // for (V2-Lite decode b1: 16 µs a layer in the router, 7 µs after it). Then the shared experts
  // in a side lane, alongside the routed experts: they only read x, and their output is added
  // after the join, so the bits are those of the calls in order.
  Tensor logits = ops_.empty(DType::F32, {T, E});  // [T, E], f32 as HF computes the router
  Tensor expert = ops_.empty(DType::I32, {T, K}), weight = ops_.empty(DType::F32, {T, K});  // [T, K]
  ops_.moe_router(x, l.router, l.bias, routing_, logits, expert, weight);
  std::optional<SideLane> lane;
  Tensor shared;  // [T, hidden]
  if (l.shared) {
    lane.emplace(ops_);
    shared = mlp(*l.shared, x);
    lane->main();
  }
  Tensor out = ops_.empty(ops_.act_dtype(), {T, cfg_.hidden_size()});  // [T, hidden]
  if (l.shared)  // the lane joins before the routed experts' weighted sum, which adds the shared output
    ops_.moe_experts_add(x, expert, weight, l.experts.gate_proj, l.experts.up_proj, l.experts.down_proj, *lane, shared,
                         out);
  else
    ops_.moe_experts(x, expert, weight, l.experts.gate_proj, l.experts.up_proj, l.experts.down_proj, out);
  return out;
}

ForwardMethod Model::choose_method(const Batch& b, const ForwardOptions& opt) const {
  const Platform p = ops_.platform();
  if (opt.method) {
    require_method_impl(*opt.method, p, b);
    return *opt.method;
  }
  DispatchResult d = dispatch(b, opt.dispatch, p);
  if (!d.implemented || !d.serves)
    fail("dispatch chose {} (resolved {}) on {}: {}", method_name(d.method), method_name(d.resolved),
         platform_name(p), d.reason);
  return d.resolved;
}

ModelOutput Model::forward(const std::vector<int32_t>& ids, const BatchPlan& plan, KVPool& pool,
                           const ForwardOptions& opt, const std::vector<int32_t>* logit_rows,
                           const DeviceIds* device_ids) {
  const int64_t T = plan.num_tokens;
  if (int64_t(ids.size()) != T) fail("model: {} ids for a batch of {} tokens", ids.size(), T);
  if (device_ids) {
    if (tp_) fail("model: token ids on the device need tp 1 (each rank maps them to its vocabulary rows on the host)");
    const Tensor& src = device_ids->src;
    if (src.dtype() != DType::I32 || src.rank() != 1 || src.platform() != ops_.platform())
      fail("model: device ids must be I32 values [n] on {} (got {} {})", platform_name(ops_.platform()),
           shape_str(src.shape()), dtype_name(src.dtype()));
    if (int64_t(device_ids->from.size()) != T) fail("model: {} device id rows for a batch of {} tokens", device_ids->from.size(), T);
    for (int32_t r : device_ids->from)
      if (r < -1 || r >= src.numel()) fail("model: device id row {} is outside the {} ids given", r, src.numel());
  }
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= cfg_.vocab_size)
      fail("token id {} (position {} of the batch) is outside the vocabulary [0, {})", ids[i], i, cfg_.vocab_size);
  if (logit_rows)
    for (int32_t r : *logit_rows)
      if (r < 0 || r >= T) fail("model: logit row {} is outside the batch of {} tokens", r, T);
  if (pool.config().num_layers != cfg_.num_hidden_layers)
    fail("KV pool has {} layers, the model {}", pool.config().num_layers, cfg_.num_hidden_layers);
  ModelOutput out;
  out.method = choose_method(plan.batch, opt);
  // With tp > 1 the embedding rows of this rank's vocabulary: other ids read its zero row.
  std::vector<int32_t> rows_of_ids;
  if (tp_) {
    rows_of_ids.resize(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      const int64_t r = ids[i] - vocab_begin_;
      rows_of_ids[i] = int32_t(r >= 0 && r < vocab_rows_ ? r : vocab_rows_);
    }
  }
  // Device ids on a platform whose ops read the host vectors (the CPU): the values are here already.
  std::vector<int32_t> read_ids;
  if (device_ids && !ops_.step_plan_on_device()) {
    const Tensor h = ops_.download(device_ids->src);
    read_ids = ids;
    for (int64_t i = 0; i < T; ++i) {
      const int32_t r = device_ids->from[size_t(i)];
      if (r < 0) continue;
      const int32_t t = h.ptr<int32_t>()[r];
      if (t < 0 || t >= cfg_.vocab_size) fail("model: device token id {} is outside the vocabulary [0, {})", t, cfg_.vocab_size);
      read_ids[size_t(i)] = t;
    }
  }
  const std::vector<int32_t>& embed_rows = tp_ ? rows_of_ids : !read_ids.empty() ? read_ids : ids;
  const StepScope step(ops_, plan, pool, {&embed_rows, logit_rows});  // the plan goes to the device once
  if (device_ids && ops_.step_plan_on_device()) ops_.step_rows_from(embed_rows, device_ids->src, device_ids->from);
  if (opt.graphs && plan.batch.mode == ForwardMode::DECODE && out.method == ForwardMethod::MLA && T > 0 &&
      ops_.can_capture() && (!tp_ || tp_->capturable())) {
    out.logits = run_graph(embed_rows, plan, pool, out.method, opt.dispatch, logit_rows);
    if (out.logits.defined()) return out;
  }
  out.logits = ops_.empty(DType::F32, {logit_rows ? int64_t(logit_rows->size()) : T, cfg_.vocab_size});
  run(embed_rows, plan, pool, out.method, opt.dispatch, logit_rows, out.logits);
  return out;
}

void Model::run(const std::vector<int32_t>& embed_rows, const BatchPlan& plan, KVPool& pool, ForwardMethod method,
                const DispatchSettings& settings, const std::vector<int32_t>* logit_rows, Tensor& logits_out) {
  const int64_t T = plan.num_tokens, Hd = cfg_.hidden_size();
  const DType act = ops_.act_dtype();
  ops_.mark("embed");  // the timeline's sections (Ops::mark): nothing unless a benchmark asks
  Tensor h = ops_.empty(act, {T, Hd});  // [T, hidden] the residual stream
  ops_.gather_rows(embed_, embed_rows, h);
  if (tp_) tp_->all_reduce(h);
  Tensor x = ops_.empty(act, {T, Hd});  // [T, hidden] the normalized input of a sublayer
  Tensor pending;  // the last sublayer's output (with tp > 1 this rank's part), added to h with the next norm
  auto add_norm = [&](const Tensor& w) {
    const double eps = cfg_.attn.rms_norm_eps;
    if (!pending.defined()) ops_.copy(h, x), ops_.rmsnorm(x, Hd, w, eps);
    else if (tp_) tp_->all_reduce_add_rmsnorm(pending, h, x, w, eps, ops_);
    else ops_.add_rmsnorm(h, pending, x, w, eps);
  };
  for (size_t i = 0; i < layers_.size(); ++i) {
    const Layer& l = layers_[i];
    ops_.mark("attention");  // with the norm (and all-reduce) before it
    add_norm(l.input_layernorm);
    pending = l.attn->forward(x, plan, pool, int64_t(i), method, settings).out;
    ops_.mark(l.mlp ? "mlp" : "moe");
    add_norm(l.post_attention_layernorm);
    pending = l.mlp ? mlp(*l.mlp, x) : moe(l, x);
  }
  ops_.mark("head");
  if (pending.defined()) {
    if (tp_) tp_->all_reduce(pending);
    ops_.add(h, pending);
  }
  if (logit_rows) {  // the final norm and lm_head act row by row: only the rows asked for
    Tensor picked = ops_.empty(act, {int64_t(logit_rows->size()), Hd});  // [rows, hidden]
    ops_.gather_rows(h, *logit_rows, picked);
    h = picked;
  }
  ops_.rmsnorm(h, Hd, norm_, cfg_.attn.rms_norm_eps);
  logits(h, logits_out);
  ops_.mark("end");
}

Tensor Model::run_graph(const std::vector<int32_t>& embed_rows, const BatchPlan& plan, KVPool& pool,
                        ForwardMethod method, const DispatchSettings& settings, const std::vector<int32_t>* logit_rows) {
  const int64_t T = plan.num_tokens, rows = logit_rows ? int64_t(logit_rows->size()) : T, V = cfg_.vocab_size;
  // Graphs hold this pool's buffers and its scales as they were recorded: another pool drops them.
  std::vector<double> scales;
  for (int64_t l = 0; l < pool.config().num_layers; ++l) scales.push_back(pool.scale(l));
  if (graph_pool_.empty() || graph_pool_[0].data() != pool.buffer(0).data() || graph_scales_ != scales) {
    graphs_.clear();
    graph_pool_.clear();
    for (int64_t l = 0; l < pool.config().num_layers; ++l) graph_pool_.push_back(pool.buffer(l));
    graph_scales_ = std::move(scales);
  }
  if (!graph_logits_.defined() || graph_logits_.dim(0) < rows) {  // the graphs write the old buffer
    graphs_.clear();
    graph_logits_ = Tensor();
    graph_logits_ = ops_.empty(DType::F32, {kv_bucket(rows), V});
  }
  const GraphKey key{T, int64_t(plan.batch.requests.size()), logit_rows ? rows : -1, plan.kv_bucket(),
                     ops_.launch_class(plan, cfg_.attn.num_attention_heads / tp_size()), method};
  auto [it, fresh] = graphs_.try_emplace(key);
  it->second.last_use = ++graph_clock_;
  if (fresh) {  // the first time runs op by op (and makes any buffer the calls keep)
    if (graphs_.size() > kMaxGraphs) {
      auto oldest = graphs_.begin();
      for (auto g = graphs_.begin(); g != graphs_.end(); ++g)
        if (g->second.last_use < oldest->second.last_use) oldest = g;
      graphs_.erase(oldest);
    }
    return Tensor();
  }
  Tensor dst = graph_logits_.rows(0, rows);  // [rows, vocab]
  GraphEntry& e = it->second;
  if (!e.graph || !ops_.replay(*e.graph)) {
    e.graph.reset();
    ops_.begin_capture();
    try {
      run(embed_rows, plan, pool, method, settings, logit_rows, dst);
    } catch (...) {
      try {
        ops_.end_capture(/*failed=*/true);
      } catch (const Error&) {
      }
      throw;
    }
    e.graph = ops_.end_capture();
    if (!ops_.replay(*e.graph)) fail("model: the step graph just recorded does not fit its step");
  }
  if (tp_) tp_->check();
  Tensor out = ops_.empty(DType::F32, {rows, V});  // [rows, vocab]: the caller's; the next replay overwrites dst
  ops_.copy(dst, out);
  return out;
}

void Model::logits(const Tensor& h, Tensor& out) {
  const int64_t rows = h.dim(0), V = cfg_.vocab_size;
  if (!tp_) {
    ops_.linear(h, lm_head_, out);
    return;
  }
  const int ranks = tp_->size();
  Tensor part = ops_.empty(DType::F32, {rows, vocab_rows_});  // [rows, V / tp] this rank's vocabulary
  ops_.linear(h, lm_head_, part);
  Tensor all = ops_.empty(DType::F32, {ranks * rows, vocab_rows_});  // [tp · rows, V / tp]
  tp_->all_gather(part, all);
  for (int r = 0; r < ranks; ++r) {  // rank r's columns, without the padding
    const int64_t begin = std::min<int64_t>(V, r * vocab_rows_), n = std::min(V - begin, vocab_rows_);
    if (n > 0) ops_.copy_cols(all.rows(r * rows, (r + 1) * rows), 0, out, begin, n);
  }
}

}  // namespace mla
