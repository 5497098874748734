// The reference harness: one attention-layer case against the float64 reference.
#include "mla/reference_harness.h"

#include <chrono>
#include <cmath>

#include "mla/compare.h"
#include "mla/error.h"

namespace mla {

double tolerance(DType act, DType kv) {
  if (is_fp8(kv)) return 5e-2;
  if (act == DType::BF16 || kv == DType::BF16) return 1e-2;
  if (act == DType::F64) return 1e-6;
  return 1e-5;
}

double tolerance(const LayerCase& c, ForwardMethod method) {
  const double base = tolerance(c.act, c.kv);
  if (c.platform != Platform::ROCM || !uses_absorbed_weights(method)) return base;
  switch (c.options.rocm.absorb) {
    case AbsorbFormat::FP8: return std::max(base, 5e-2);
    case AbsorbFormat::MXFP4: return std::max(base, 0.25);
    default: return base;
  }
}

LayerFixture::LayerFixture(const LayerCase& c) : c_(c) {
  w_ = random_attention_weights(c.cfg, c.seed, DType::F32);
  for (size_t r = 0; r < c.requests.size(); ++r) {
    const auto [prefix, fresh] = c.requests[r];
    x_.push_back(randn(size_t((prefix + fresh) * c.cfg.hidden_size), c.seed * 1000 + r));
    std::vector<double> head(x_.back().begin(), x_.back().begin() + prefix * c.cfg.hidden_size);
    prefix_rows_.push_back(reference_latent_rows(c.cfg, w_, head, 0));
  }
  ops_ = make_ops(c.platform, c.act, c.options);
  layer_ = std::make_unique<AttentionLayer>(c.cfg, w_, *ops_);
  if (auto packed = ops_->absorbed_as_packed(split_kv_b_proj(c.cfg, w_.kv_b_proj))) {
    w_packed_ = w_;
    w_packed_->kv_b_proj = merge_kv_b_proj(c.cfg, *packed);
  }
}

LayerRun LayerFixture::run(std::optional<ForwardMethod> method, double fill) {
  const AttentionConfig& cfg = c_.cfg;
  Ops& ops = *ops_;
  int64_t tokens = 0;
  for (auto [p, n] : c_.requests) tokens += (p + n + c_.page_size - 1) / c_.page_size * c_.page_size;
  KVPoolConfig pc{1, cfg.kv_row_dim(), c_.kv, c_.page_size, tokens / c_.page_size + 3};
  KVPool pool(pc, [&](DType d, Shape s) { return ops.empty(d, std::move(s)); });
  pool.set_scale(0, c_.kv_scale);
  ops.fill(pool.buffer(0), fill);
  // Spread the requests over the pool: a dummy request takes the first pages and is freed, so
  // live requests do not start at slot 0.
  pool.reserve(1, 2 * c_.page_size);
  Batch b{c_.mode, {}};
  for (size_t r = 0; r < c_.requests.size(); ++r) {
    const auto [prefix, fresh] = c_.requests[r];
    const RequestId id = RequestId(100 + r);
    pool.reserve(id, prefix + fresh);
    b.requests.push_back({id, prefix, fresh});
    if (prefix > 0) {
      Tensor rows = Tensor::host_from(prefix_rows_[r], ops.act_dtype(), {prefix, cfg.kv_row_dim()});
      ops.cache_write(pool, 0, pool.slots(id, 0, prefix), ops.upload(rows));
    }
  }
  pool.free(1);
  BatchPlan plan = plan_batch(b, pool);
  std::vector<double> xn;
  for (size_t r = 0; r < c_.requests.size(); ++r) {
    const auto [prefix, fresh] = c_.requests[r];
    xn.insert(xn.end(), x_[r].begin() + prefix * cfg.hidden_size, x_[r].end());
  }
  Tensor x = ops.upload(Tensor::host_from(xn, ops.act_dtype(), {plan.num_tokens, cfg.hidden_size}));
  const auto t0 = std::chrono::steady_clock::now();
  AttentionOutput o = method ? layer_->forward(x, plan, pool, 0, *method, c_.settings)
                             : layer_->forward(x, plan, pool, 0, c_.settings);
  ops.synchronize();
  const auto t1 = std::chrono::steady_clock::now();
  LayerRun run{o.method, ops.download(o.out).to_doubles(), ops.download(o.lse).to_doubles(), {},
               std::chrono::duration<double>(t1 - t0).count()};
  Tensor rows = ops.empty(DType::F32, {plan.num_tokens, cfg.kv_row_dim()});
  ops.cache_read(pool, 0, plan.new_slots, rows);
  run.new_rows = ops.download(rows).to_doubles();
  return run;
}

const ReferenceResult& LayerFixture::reference(ForwardMethod method) {
  const bool packed = w_packed_ && uses_absorbed_weights(method);
  std::optional<ReferenceResult>& ref = packed ? ref_packed_ : ref_;
  if (!ref) {
    const Batch b = Batch::from_lengths(c_.mode, c_.requests);
    ref = reference_attention(c_.cfg, packed ? *w_packed_ : w_, x_, b, {c_.kv, c_.kv_scale});
  }
  return *ref;
}

LayerErrors LayerFixture::errors(const LayerRun& r) {
  const ReferenceResult& ref = reference(r.method);
  LayerErrors e;
  e.out = rel_l2(r.out, ref.out);
  e.lse = rel_l2(r.lse, ref.lse);
  e.rows = rel_l2(r.new_rows, ref.new_rows);
  e.worst = std::max({e.out, e.lse, e.rows});
  if (std::isnan(e.worst)) e.worst = INFINITY;
  return e;
}

}  // namespace mla
