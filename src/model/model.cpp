// The DeepSeek decoder, written once against Ops: embedding, layers (attention + dense MLP or
// MoE), final norm, lm_head. Routing runs on the host from the f32 router logits.
#include "mla/model.h"

#include <set>

#include "mla/error.h"
#include "mla/registry.h"

namespace mla {
namespace {

std::string layer_prefix(int64_t i) { return fmt::format("model.layers.{}.", i); }

MlpWeights load_mlp(const TensorLookup& get, const std::string& p, int64_t hidden, int64_t width,
                    DType dtype) {
  return {load_weight(get, p + "gate_proj.weight", {width, hidden}, dtype),
          load_weight(get, p + "up_proj.weight", {width, hidden}, dtype),
          load_weight(get, p + "down_proj.weight", {hidden, width}, dtype)};
}

}  // namespace

ModelWeights load_model_weights(const ModelConfig& c, const TensorLookup& get,
                                const std::vector<std::string>& names, DType dtype,
                                std::vector<std::string>* unused) {
  c.validate();
  std::set<std::string> used;
  TensorLookup track = [&](const std::string& name) {
    used.insert(name);
    used.insert(name + "_scale_inv");
    return get(name);
  };
  const int64_t H = c.hidden_size(), V = c.vocab_size;
  ModelWeights w;
  w.embed_tokens = load_weight(track, "model.embed_tokens.weight", {V, H}, dtype);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = layer_prefix(i);
    DecoderLayerWeights l;
    l.input_layernorm = load_weight(track, p + "input_layernorm.weight", {H}, dtype);
    l.post_attention_layernorm = load_weight(track, p + "post_attention_layernorm.weight", {H}, dtype);
    l.self_attn = load_attention_weights(c.attn, track, p + "self_attn.", dtype);
    if (c.is_moe_layer(i)) {
      MoeWeights m;
      const int64_t E = c.n_routed_experts, I = c.moe_intermediate_size;
      m.gate = load_weight(track, p + "mlp.gate.weight", {E, H}, DType::F32);
      if (c.model_type() == "deepseek_v3")
        m.e_score_correction_bias = load_weight(track, p + "mlp.gate.e_score_correction_bias", {E}, DType::F32);
      for (int64_t e = 0; e < E; ++e)
        m.experts.push_back(load_mlp(track, fmt::format("{}mlp.experts.{}.", p, e), H, I, dtype));
      if (c.n_shared_experts > 0) m.shared = load_mlp(track, p + "mlp.shared_experts.", H, I * c.n_shared_experts, dtype);
      l.moe = std::move(m);
    } else {
      l.mlp = load_mlp(track, p + "mlp.", H, c.intermediate_size, dtype);
    }
    w.layers.push_back(std::move(l));
  }
  w.norm = load_weight(track, "model.norm.weight", {H}, dtype);
  const bool has_head = std::find(names.begin(), names.end(), "lm_head.weight") != names.end();
  if (c.tie_word_embeddings && !has_head) w.lm_head = w.embed_tokens;
  else w.lm_head = load_weight(track, "lm_head.weight", {V, H}, dtype);
  if (unused)
    for (const std::string& n : names)
      if (!used.count(n)) unused->push_back(n);
  return w;
}

Model::Model(const ModelConfig& c, const ModelWeights& w, Ops& ops) : cfg_(c), ops_(ops) {
  c.validate();
  if (int64_t(w.layers.size()) != c.num_hidden_layers)
    fail("model weights have {} layers, the config {}", w.layers.size(), c.num_hidden_layers);
  const DType act = ops.act_dtype();
  auto up = [&](const Tensor& t) { return ops.upload(t.to(act)); };
  embed_ = up(w.embed_tokens);
  norm_ = up(w.norm);
  lm_head_ = up(w.lm_head);
  for (const DecoderLayerWeights& lw : w.layers) {
    Layer l;
    l.input_layernorm = up(lw.input_layernorm);
    l.post_attention_layernorm = up(lw.post_attention_layernorm);
    l.attn = std::make_unique<AttentionLayer>(c.attn, lw.self_attn, ops);
    if (lw.mlp) l.mlp = upload(*lw.mlp);
    if (lw.moe) {
      l.router = ops.upload(lw.moe->gate.to(DType::F32));
      if (lw.moe->e_score_correction_bias.defined())
        for (double v : lw.moe->e_score_correction_bias.to_doubles()) l.bias.push_back(float(v));
      for (const MlpWeights& e : lw.moe->experts) l.experts.push_back(upload(e));
      if (lw.moe->shared.gate_proj.defined()) l.shared = upload(lw.moe->shared);
    }
    layers_.push_back(std::move(l));
  }
}

Model::Mlp Model::upload(const MlpWeights& m) {
  const DType act = ops_.act_dtype();
  return {ops_.upload(m.gate_proj.to(act)), ops_.upload(m.up_proj.to(act)), ops_.upload(m.down_proj.to(act))};
}

Tensor Model::mlp(const Mlp& m, const Tensor& x) {
  const int64_t n = x.dim(0), I = m.gate_proj.dim(0);
  const DType act = ops_.act_dtype();
  Tensor gate = ops_.empty(act, {n, I}), up = ops_.empty(act, {n, I});  // [n, I]
  ops_.linear(x, m.gate_proj, gate);
  ops_.linear(x, m.up_proj, up);
  ops_.silu_mul(gate, up, gate);
  Tensor y = ops_.empty(act, {n, cfg_.hidden_size()});  // [n, hidden]
  ops_.linear(gate, m.down_proj, y);
  return y;
}

Tensor Model::moe(const Layer& l, const Tensor& x) {
  const int64_t T = x.dim(0), E = cfg_.n_routed_experts, K = cfg_.num_experts_per_tok;
  Tensor logits = ops_.empty(DType::F32, {T, E});  // [T, E], f32 as HF computes the router
  ops_.linear(x, l.router, logits);
  std::vector<float> host;
  for (double v : ops_.download(logits).to_doubles()) host.push_back(float(v));
  Routing r = route_tokens(cfg_, host, l.bias, T);
  Tensor out = ops_.empty(ops_.act_dtype(), {T, cfg_.hidden_size()});  // [T, hidden]
  ops_.fill(out, 0.0);
  for (int64_t e = 0; e < E; ++e) {
    std::vector<int32_t> rows;
    std::vector<float> weights;
    for (int64_t i = 0; i < T * K; ++i)
      if (r.expert[size_t(i)] == e) rows.push_back(int32_t(i / K)), weights.push_back(r.weight[size_t(i)]);
    if (rows.empty()) continue;
    Tensor xe = ops_.empty(ops_.act_dtype(), {int64_t(rows.size()), cfg_.hidden_size()});  // [n_e, hidden]
    ops_.gather_rows(x, rows, xe);
    ops_.scatter_add_rows(mlp(l.experts[size_t(e)], xe), rows, weights, out);
  }
  if (l.shared) ops_.add(out, mlp(*l.shared, x));
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
                           const ForwardOptions& opt) {
  const int64_t T = plan.num_tokens, Hd = cfg_.hidden_size();
  if (int64_t(ids.size()) != T) fail("model: {} ids for a batch of {} tokens", ids.size(), T);
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= cfg_.vocab_size)
      fail("token id {} (position {} of the batch) is outside the vocabulary [0, {})", ids[i], i, cfg_.vocab_size);
  if (pool.config().num_layers != cfg_.num_hidden_layers)
    fail("KV pool has {} layers, the model {}", pool.config().num_layers, cfg_.num_hidden_layers);
  ModelOutput out;
  out.method = choose_method(plan.batch, opt);
  const StepScope step(ops_, plan, pool, &ids);  // the plan and ids go to the device once
  const DType act = ops_.act_dtype();
  Tensor h = ops_.empty(act, {T, Hd});  // [T, hidden] the residual stream
  ops_.gather_rows(embed_, ids, h);
  Tensor x = ops_.empty(act, {T, Hd});
  for (size_t i = 0; i < layers_.size(); ++i) {
    const Layer& l = layers_[i];
    ops_.copy(h, x);
    ops_.rmsnorm(x, Hd, l.input_layernorm, cfg_.attn.rms_norm_eps);
    AttentionOutput a = l.attn->forward(x, plan, pool, int64_t(i), out.method, opt.dispatch);
    ops_.add(h, a.out);
    ops_.copy(h, x);
    ops_.rmsnorm(x, Hd, l.post_attention_layernorm, cfg_.attn.rms_norm_eps);
    ops_.add(h, l.mlp ? mlp(*l.mlp, x) : moe(l, x));
  }
  ops_.rmsnorm(h, Hd, norm_, cfg_.attn.rms_norm_eps);
  out.logits = ops_.empty(DType::F32, {T, cfg_.vocab_size});  // [T, vocab]
  ops_.linear(h, lm_head_, out.logits);
  return out;
}

}  // namespace mla
