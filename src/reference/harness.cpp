// The reference harness: one attention-layer case against the float64 reference.
#include "mla/reference_harness.h"

#include <chrono>
#include <cmath>

#include "mla/compare.h"
#include "mla/error.h"

namespace mla {

double dtype_tolerance(DType act, DType kv) {
  if (is_fp8(kv)) return 5e-2;
  if (act == DType::BF16 || kv == DType::BF16) return 1e-2;
  if (act == DType::F64) return 1e-6;
  return 1e-5;
}

double Tolerance::max() const { return std::max({out, lse, rows}); }

bool within(const LayerErrors& e, const Tolerance& t) { return e.out <= t.out && e.lse <= t.lse && e.rows <= t.rows; }

namespace {

// The CPU tolerances: per method, activation dtype and KV dtype, one per output. Each is within 10x
// of the largest error measured over the CPU cases of tests/method_cases.h (relative L2; the
// measured worst is in the comment, `ctest -R Methods.EveryMethod/Cpu -V` prints them all), rounded
// up to a 1-2-5 step. The reference sees the rows exactly as each method does (CacheRounding), so
// these bound the methods' own arithmetic: f32 activations stay near 1e-6 whatever the cache holds.
struct TolRow {
  ForwardMethod method;
  DType act, kv;
  Tolerance tol;
};
using FM = ForwardMethod;
constexpr DType F64 = DType::F64, F32 = DType::F32, BF = DType::BF16, FP8 = DType::F8_E4M3FN;
const TolRow kCpuTolerances[] = {
    // Measured worst (out / lse / rows) over two runs of the harness with different seeds; a cached
    // row whose f32 value lands near a bf16 / fp8 rounding midpoint may round the other way than the
    // f64 reference (one fp8 step is 6%), which is what the fp8 and bf16 rows and out entries allow.
    // method            act  kv     out    lse    rows       measured: out / lse / rows
    {FM::MHA,            F64, F32, {5e-15, 2e-15, 1e-15}},  // 7.1e-16 / 3.3e-16 / 0
    {FM::MHA_ONE_SHOT,   F64, F32, {5e-15, 2e-15, 1e-15}},  // 6.8e-16 / 2.8e-16 / 0
    {FM::MHA_CHUNKED_KV, F64, F32, {5e-15, 2e-15, 1e-15}},  // 8.2e-16 / 3.3e-16 / 0
    {FM::MLA,            F64, F32, {5e-15, 2e-15, 1e-15}},  // 7.3e-16 / 3.2e-16 / 0
    {FM::MHA,            F32, F32, {1e-6,  5e-7,  2e-6}},   // 2.2e-7 / 1.3e-7 / 5.6e-7
    {FM::MHA_ONE_SHOT,   F32, F32, {5e-6,  2e-6,  2e-6}},   // 1.1e-6 / 4.3e-7 / 5.7e-7
    {FM::MHA_CHUNKED_KV, F32, F32, {5e-6,  2e-6,  2e-6}},   // 1.1e-6 / 4.3e-7 / 5.7e-7
    {FM::MLA,            F32, F32, {5e-6,  2e-6,  2e-6}},   // 1.1e-6 / 4.2e-7 / 5.7e-7
    {FM::MHA,            F32, BF,  {1e-6,  5e-7,  5e-6}},   // 2.2e-7 / 1.0e-7 / 1.0e-6
    {FM::MHA_ONE_SHOT,   F32, BF,  {5e-6,  1e-6,  5e-6}},   // 5.0e-7 / 1.1e-7 / 1.0e-6
    {FM::MHA_CHUNKED_KV, F32, BF,  {2e-6,  1e-6,  5e-6}},   // 3.1e-7 / 1.2e-7 / 1.0e-6
    {FM::MLA,            F32, BF,  {5e-6,  1e-6,  5e-6}},   // 5.1e-7 / 1.1e-7 / 1.0e-6
    {FM::MHA,            BF,  BF,  {2e-2,  1e-2,  1e-2}},   // 7.5e-3 / 3.0e-3 / 4.2e-3
    {FM::MHA_ONE_SHOT,   BF,  BF,  {2e-2,  1e-2,  1e-2}},   // 7.8e-3 / 3.0e-3 / 4.2e-3
    {FM::MHA_CHUNKED_KV, BF,  BF,  {2e-2,  1e-2,  1e-2}},   // 7.9e-3 / 3.0e-3 / 4.2e-3
    {FM::MLA,            BF,  BF,  {2e-2,  1e-2,  1e-2}},   // 7.9e-3 / 2.9e-3 / 4.2e-3
    {FM::MHA,            F32, FP8, {1e-6,  5e-7,  1e-3}},   // 2.3e-7 / 1.2e-7 / 2.3e-4 (rows: any method)
    {FM::MHA_ONE_SHOT,   F32, FP8, {2e-4,  5e-5,  1e-3}},   // 3.9e-5 / 6.3e-6 / 2.3e-4
    {FM::MHA_CHUNKED_KV, F32, FP8, {5e-6,  2e-6,  1e-3}},   // 1.2e-6 / 4.0e-7 / 2.3e-4
    {FM::MLA,            F32, FP8, {2e-4,  5e-5,  1e-3}},   // 3.9e-5 / 6.3e-6 / 2.3e-4
    {FM::MHA,            BF,  FP8, {2e-2,  1e-2,  5e-2}},   // 7.4e-3 / 3.2e-3 / 2.3e-2 (rows: any method)
    {FM::MHA_ONE_SHOT,   BF,  FP8, {1e-1,  3e-2,  5e-2}},   // 3.4e-2 / 9.9e-3 / 2.3e-2
    {FM::MHA_CHUNKED_KV, BF,  FP8, {1e-1,  2e-2,  5e-2}},   // 3.6e-2 / 5.4e-3 / 2.3e-2
    {FM::MLA,            BF,  FP8, {1e-1,  3e-2,  5e-2}},   // 3.6e-2 / 1.1e-2 / 2.3e-2
};

// Whether `m` attends the new tokens' rows as the cache gives them back (it reads every row from the
// pool) or as computed. The ROCm twins build K cast to the cache dtype, so theirs count as cached.
bool new_rows_from_cache(ForwardMethod m) { return m != ForwardMethod::MHA && m != ForwardMethod::MHA_CHUNKED_KV; }

}  // namespace

Tolerance tolerance(const LayerCase& c, ForwardMethod method) {
  if (c.platform == Platform::CPU) {
    for (const TolRow& r : kCpuTolerances)
      if (r.method == method && r.act == c.act && r.kv == c.kv) return r.tol;
    // (a pair the harness does not measure, e.g. `mla attn --dtype f64 --kv-dtype bf16`: the dtype rule)
  }
  double base = dtype_tolerance(c.act, c.kv);
  if (c.platform == Platform::ROCM && uses_absorbed_weights(method)) {
    switch (c.options.rocm.absorb) {
      case AbsorbFormat::FP8: base = std::max(base, 5e-2); break;
      case AbsorbFormat::MXFP4: base = std::max(base, 0.25); break;
      default: break;
    }
  }
  return {base, base, base};
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
  // Quantized absorb weights (ROCm): the reference quantizes them itself, not with the packer it
  // judges. w_kc [H, dn, R] is quantized as the MLA absorb reads it, over dn (MXFP4 blocks along dn);
  // w_vc [H, dv, R] over R.
  const AbsorbFormat af = c.options.rocm.absorb;
  if (c.platform == Platform::ROCM && af != AbsorbFormat::ACT) {
    AbsorbedWeights a = split_kv_b_proj(c.cfg, w_.kv_b_proj);
    const int64_t H = c.cfg.num_attention_heads, dn = c.cfg.qk_nope_head_dim, dv = c.cfg.v_head_dim,
                  R = c.cfg.kv_lora_rank;
    std::vector<double> kc = a.w_kc.to_doubles(), vc = a.w_vc.to_doubles();
    if (af == AbsorbFormat::MXFP4) {
      std::vector<double> kcT(kc.size());  // [H, R, dn]
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < dn; ++d)
          for (int64_t r = 0; r < R; ++r) kcT[size_t((h * R + r) * dn + d)] = kc[size_t((h * dn + d) * R + r)];
      kcT = reference_mxfp4(kcT, dn);
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < dn; ++d)
          for (int64_t r = 0; r < R; ++r) kc[size_t((h * dn + d) * R + r)] = kcT[size_t((h * R + r) * dn + d)];
      vc = reference_mxfp4(vc, R);
    } else {
      kc = reference_fp8_per_tensor(kc), vc = reference_fp8_per_tensor(vc);
    }
    a.w_kc = Tensor::host_from(kc, DType::F64, a.w_kc.shape());
    a.w_vc = Tensor::host_from(vc, DType::F64, a.w_vc.shape());
    w_packed_ = w_;
    w_packed_->kv_b_proj = merge_kv_b_proj(c.cfg, a);
  }
}

LayerRun LayerFixture::run(std::optional<ForwardMethod> method, double fill, bool in_step) {
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
  std::optional<StepScope> step;
  if (in_step) step.emplace(ops, plan, pool);
  AttentionOutput o = method ? layer_->forward(x, plan, pool, 0, *method, c_.settings)
                             : layer_->forward(x, plan, pool, 0, c_.settings);
  step.reset();
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
  // With the cache in the activation dtype the method's new rows are already what the cache holds.
  const bool cached = new_rows_from_cache(method) || c_.kv == c_.act;
  std::optional<ReferenceResult>& ref = ref_[packed][cached];
  if (!ref) {
    const Batch b = Batch::from_lengths(c_.mode, c_.requests);
    ref = reference_attention(c_.cfg, packed ? *w_packed_ : w_, x_, b, {c_.kv, c_.kv_scale, cached});
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
