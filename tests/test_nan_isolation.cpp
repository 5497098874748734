// NaN isolation through the KV pool: every (method, platform) pair this build runs, and the whole
// model through the engine. Every cache row outside the batch's valid ranges — other live
// requests' rows, freed slots (some of them reused by the batch's own growth), padding at the end
// of pages, never-used slots — holds NaN (or ±inf), and the outputs must be bit-identical to the
// run where those rows hold finite garbage. A method must also write nothing outside the new
// tokens' slots.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "harness.h"
#include "mla/attention.h"
#include "mla/config.h"
#include "engine/engine.h"
#include "mla/error.h"
#include "mla/model.h"
#include "mla/platform_ops.h"
#include "mla/reference.h"
#include "mla/registry.h"

namespace mla::test {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// What the rows outside the valid ranges hold: `unused` everywhere at first, `other` in the
// rows of other requests (live or freed).
struct Fill {
  const char* name;
  double unused, other;
};
constexpr Fill kClean{"finite", 1.5, -0.75};
constexpr Fill kPoisons[] = {{"nan", kNaN, kNaN}, {"inf", kInf, -kInf}, {"nan_inf", kNaN, kInf}};

AttentionConfig tiny_config() {  // odd small dims, nope != v, YaRN on
  AttentionConfig c = preset_config("deepseek-v3");
  c.hidden_size = 64, c.num_attention_heads = 3, c.q_lora_rank = 24, c.kv_lora_rank = 32;
  c.qk_nope_head_dim = 16, c.qk_rope_head_dim = 8, c.v_head_dim = 12;
  return c;
}
AttentionConfig odd_config() {  // no q_lora, one head, NeoX RoPE, no RoPE scaling
  AttentionConfig c = preset_config("deepseek-v2-lite");
  c.hidden_size = 72, c.num_attention_heads = 1, c.q_lora_rank = 0, c.kv_lora_rank = 40;
  c.qk_nope_head_dim = 24, c.qk_rope_head_dim = 16, c.v_head_dim = 20;
  c.rope_interleave = false;
  c.rope_scaling = RopeScaling{};
  return c;
}

struct Scenario {
  const char* name;
  ForwardMode mode;
  std::vector<std::pair<int64_t, int64_t>> reqs;  // (prefix, new)
  int64_t chunk_capacity;
};
const std::vector<Scenario>& scenarios() {
  static const std::vector<Scenario> s = {
      {"extend_fresh", ForwardMode::EXTEND, {{0, 7}, {0, 13}, {0, 1}}, 131072},
      {"extend_prefix", ForwardMode::EXTEND, {{5, 3}, {17, 9}, {0, 4}, {33, 1}}, 8},
      {"decode", ForwardMode::DECODE, {{9, 1}, {30, 1}, {1, 1}}, 131072},
      {"target_verify", ForwardMode::TARGET_VERIFY, {{12, 3}, {20, 3}}, 131072},
      {"draft_extend", ForwardMode::DRAFT_EXTEND, {{7, 2}, {3, 2}}, 131072},
  };
  return s;
}

struct Case {
  std::string name;
  Platform platform;
  AttentionConfig cfg;
  DType act, kv;
  int64_t page_size;
};

std::vector<Case> cases() {
  std::vector<Case> v;
  const std::pair<DType, DType> dtypes[] = {{DType::F64, DType::F32},
                                            {DType::F32, DType::F32},
                                            {DType::BF16, DType::BF16},
                                            {DType::F32, DType::F8_E4M3FN}};
  const int64_t pages[] = {1, 16, 64};
  int k = 0;
  for (Platform p : all_platforms()) {
    if (!platform_built(p)) continue;
    for (auto [cname, cfg] : {std::pair{"tiny", tiny_config()}, std::pair{"odd", odd_config()}})
      for (auto [act, kv] : dtypes) {
        if (act == DType::F64 && p != Platform::CPU) continue;  // only the CPU has an f64 flavour
        const int64_t ps = pages[k++ % 3];
        v.push_back({fmt::format("{}_{}_{}_kv{}_page{}", platform_name(p), cname, dtype_name(act),
                                 dtype_name(kv), ps),
                     p, cfg, act, kv, ps});
      }
  }
  return v;
}

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

struct Result {
  std::vector<double> out, lse, rows;
};

class NanIsolation : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    const Case& c = GetParam();
    if (!platform_available(c.platform))
      GTEST_SKIP() << "platform " << platform_name(c.platform) << " is not available here";
    w_ = random_attention_weights(c.cfg, 11, DType::F32);
    ops_ = make_ops(c.platform, c.act);
    layer_ = std::make_unique<AttentionLayer>(c.cfg, w_, *ops_);
  }

  // Writes `value` into every row of request `id` (tokens [0, length)).
  void write_rows(KVPool& pool, RequestId id, double value) {
    const int64_t n = pool.length(id), D = GetParam().cfg.kv_row_dim();
    if (n == 0) return;
    std::vector<double> v(size_t(n * D), value);
    ops_->cache_write(pool, 0, pool.slots(id, 0, n),
                      ops_->upload(Tensor::host_from(v, ops_->act_dtype(), {n, D})));
  }

  // One forward of `m` on scenario `s`, the pool laid out so that the batch's requests sit among
  // other requests' pages and grow into freed ones; rows outside the valid ranges hold `f`.
  Result run(const Scenario& s, ForwardMethod m, const Fill& f) {
    const Case& c = GetParam();
    Ops& ops = *ops_;
    const int64_t D = c.cfg.kv_row_dim(), H = c.cfg.hidden_size, ps = c.page_size;
    int64_t pages = 16;
    for (auto [p, n] : s.reqs) pages += (p + n) / ps + 2;
    pages += (3 * ps + 16) / ps * 4;
    KVPool pool({1, D, c.kv, ps, pages}, [&](DType d, Shape sh) { return ops.empty(d, sh); });
    if (is_fp8(c.kv)) pool.set_scale(0, 0.05);
    ops.fill(pool.buffer(0), f.unused);

    // Neighbours (live, never in the batch) and dead requests (freed), interleaved with the
    // batch's requests page by page; none page-aligned, so pages end in padding.
    const RequestId kNeighbour = 1000, kDead = 2000;
    pool.reserve(kNeighbour, 2 * ps + 3);
    pool.reserve(kDead, ps + 5);
    Batch b{s.mode, {}};
    for (size_t r = 0; r < s.reqs.size(); ++r) {
      const RequestId id = RequestId(10 + r);
      pool.reserve(id, s.reqs[r].first);
      pool.reserve(kNeighbour + 1 + RequestId(r), 3);
      b.requests.push_back({id, s.reqs[r].first, s.reqs[r].second});
    }
    // The valid prefix rows, as the reference computes them.
    std::vector<std::vector<double>> x;
    for (size_t r = 0; r < s.reqs.size(); ++r) {
      const auto [prefix, fresh] = s.reqs[r];
      x.push_back(randn(size_t((prefix + fresh) * H), 500 + r));
      if (prefix == 0) continue;
      std::vector<double> head(x.back().begin(), x.back().begin() + prefix * H);
      Tensor rows = Tensor::host_from(reference_latent_rows(c.cfg, w_, head, 0), ops.act_dtype(),
                                      {prefix, D});
      ops.cache_write(pool, 0, pool.slots(b.requests[r].id, 0, prefix), ops.upload(rows));
    }
    for (RequestId id : pool.request_ids())
      if (id >= kNeighbour) write_rows(pool, id, f.other);
    pool.free(kDead);  // its poisoned pages are handed out first: the batch grows into them
    for (const BatchRequest& r : b.requests) pool.reserve(r.id, r.prefix_len + r.new_len);
    pool.reserve(kDead + 1, ps + 1);  // freed slots that stay free
    write_rows(pool, kDead + 1, f.other);
    pool.free(kDead + 1);

    BatchPlan plan = plan_batch(b, pool);
    std::vector<double> xn;
    for (size_t r = 0; r < s.reqs.size(); ++r)
      xn.insert(xn.end(), x[r].begin() + s.reqs[r].first * H, x[r].end());
    Tensor xt = ops.upload(Tensor::host_from(xn, ops.act_dtype(), {plan.num_tokens, H}));

    const Tensor before = ops.download(pool.buffer(0));
    DispatchSettings settings;
    settings.chunk_capacity = s.chunk_capacity;
    AttentionOutput o = layer_->forward(xt, plan, pool, 0, m, settings);
    ops.synchronize();
    const Tensor after = ops.download(pool.buffer(0));

    // Nothing outside the new tokens' slots was written (compared as bytes: NaN == NaN).
    std::vector<bool> is_new(size_t(pool.num_slots()), false);
    for (int32_t slot : plan.new_slots) is_new[size_t(slot)] = true;
    const size_t row_bytes = size_t(D) * dtype_size(c.kv);
    for (int64_t slot = 0; slot < pool.num_slots(); ++slot)
      if (!is_new[size_t(slot)])
        EXPECT_EQ(std::memcmp(static_cast<const char*>(before.data()) + size_t(slot) * row_bytes,
                              static_cast<const char*>(after.data()) + size_t(slot) * row_bytes,
                              row_bytes), 0)
            << method_name(m) << " wrote slot " << slot << ", which is not a new token's";

    Result res{ops.download(o.out).to_doubles(), ops.download(o.lse).to_doubles(), {}};
    Tensor rows = ops.empty(DType::F32, {plan.num_tokens, D});
    ops.cache_read(pool, 0, plan.new_slots, rows);
    res.rows = ops.download(rows).to_doubles();
    return res;
  }

  AttentionWeights w_;
  std::unique_ptr<Ops> ops_;
  std::unique_ptr<AttentionLayer> layer_;
};

bool all_finite(const std::vector<double>& v) {
  for (double x : v)
    if (!std::isfinite(x)) return false;
  return true;
}

TEST_P(NanIsolation, EveryMethodIgnoresRowsOutsideTheBatch) {
  const Case& c = GetParam();
  int ran = 0;
  for (const MethodImpl* impl : method_impls()) {
    if (impl->platform != c.platform) continue;
    for (const Scenario& s : scenarios()) {
      Batch b{s.mode, {}};
      for (auto [p, n] : s.reqs) b.requests.push_back({RequestId(b.requests.size()), p, n});
      if (impl->cannot_serve(b)) continue;  // e.g. MHA with a prefix
      SCOPED_TRACE(fmt::format("{} on {}", method_name(impl->method), s.name));
      const Result clean = run(s, impl->method, kClean);
      ASSERT_TRUE(all_finite(clean.out) && all_finite(clean.lse) && all_finite(clean.rows));
      for (const Fill& f : kPoisons) {
        const Result poisoned = run(s, impl->method, f);
        EXPECT_EQ(poisoned.out, clean.out) << f.name << " outside the batch reached the output";
        EXPECT_EQ(poisoned.lse, clean.lse) << f.name << " outside the batch reached the LSE";
        EXPECT_EQ(poisoned.rows, clean.rows) << f.name << " reached the cached rows";
      }
      ++ran;
    }
  }
  // MHA serves the fresh batch only; the three others serve all five.
  EXPECT_GE(ran, 16) << "too few (method, batch) pairs ran on " << platform_name(c.platform);
}

INSTANTIATE_TEST_SUITE_P(Pool, NanIsolation, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

// ---- the whole model through the engine ------------------------------------------------------

// Every slot of the engine's pool except request `keep`'s tokens [0, length) set to `value`, in
// every layer (the tensors share storage with the pool: this is a test's back door).
void poison_all_but(Engine& e, RequestId keep, double value) {
  const KVPool& pool = e.pool();
  Ops& ops = e.model().ops();
  std::vector<bool> valid(size_t(pool.num_slots()), false);
  if (pool.has(keep))
    for (int32_t s : pool.slots(keep, 0, pool.length(keep))) valid[size_t(s)] = true;
  const int64_t D = pool.config().row_dim;
  for (int64_t l = 0; l < pool.config().num_layers; ++l) {
    Tensor buf = pool.buffer(l);
    Tensor host = ops.download(buf);
    for (int64_t s = 0; s < pool.num_slots(); ++s)
      if (!valid[size_t(s)])
        for (int64_t d = 0; d < D; ++d) host.set(size_t(s * D + d), value);
    Tensor dev = ops.upload(host);
    ops.copy(dev, buf);
  }
  ops.synchronize();
}

TEST(NanIsolation, ModelLogitsIgnoreOtherRequestsRows) {
  const std::string dir = std::string(MLA_TEST_DATA) + "/v3_tiny";
  const std::vector<int32_t> ids = {24, 105, 145, 195, 83, 7, 99, 3, 250, 17, 64, 128};
  const std::vector<int32_t> other = {5, 6, 7, 8, 9, 10, 11, 12, 13};
  int ran = 0;
  for (Platform p : all_platforms()) {
    if (!platform_available(p)) continue;
    for (DType act : {DType::F32, DType::BF16})
      for (DType kv : {DType::F32, DType::BF16, DType::F8_E4M3FN})
        for (std::optional<ForwardMethod> m :  // the platform's own methods (ROCm: the twins)
             {std::optional<ForwardMethod>{}, std::optional{resolve_method(p, ForwardMethod::MHA_ONE_SHOT)},
              std::optional{resolve_method(p, ForwardMethod::MHA_CHUNKED_KV)},
              std::optional{resolve_method(p, ForwardMethod::MLA)}}) {
          SCOPED_TRACE(fmt::format("{} {} kv {} method {}", platform_name(p), dtype_name(act),
                                   dtype_name(kv), m ? method_name(*m) : "auto"));
          std::unique_ptr<Ops> ops = make_ops(p, act);
          LoadedModel lm = load_model(dir, *ops);
          EngineOptions opt;
          opt.forward.method = m;
          opt.forward.dispatch.chunk_capacity = 4;  // MHA_CHUNKED_KV takes the prefix in chunks
          opt.kv_dtype = kv;
          opt.page_size = 4;
          opt.max_tokens = 96;
          // Request 1's batches: a prefill, an extend after a prefix, then decodes.
          auto batches = [&](Engine& eng, auto&& before_each) {
            std::vector<std::vector<float>> logits;
            const std::pair<size_t, size_t> spans[] = {{0, 5}, {5, 8}, {8, 9}, {9, 10}, {10, 11},
                                                       {11, 12}};
            for (auto [b, e] : spans) {
              before_each();
              const ForwardMode mode = e - b == 1 ? ForwardMode::DECODE : ForwardMode::EXTEND;
              logits.push_back(eng.step(mode, {{1, {ids.begin() + b, ids.begin() + e}}}).logits);
            }
            return logits;
          };
          Engine clean(*lm.model, opt);
          const auto want = batches(clean, [] {});

          Engine dirty(*lm.model, opt);
          int k = 0;
          const auto got = batches(dirty, [&] {
            // Other requests come and go between request 1's batches; then every row but
            // request 1's is poisoned, the freed ones included.
            const RequestId rid = 2 + k % 3;
            const size_t n = size_t(1 + k % 4);
            if (dirty.length(rid) + int64_t(n) > 20) dirty.release(rid);
            dirty.step(ForwardMode::EXTEND, {{rid, {other.begin(), other.begin() + n}}});
            if (k % 2) dirty.release(2 + (k + 1) % 3);
            ++k;
            poison_all_but(dirty, 1, kNaN);
          });
          ASSERT_EQ(got.size(), want.size());
          for (size_t i = 0; i < want.size(); ++i)
            EXPECT_EQ(got[i], want[i]) << "batch " << i << ": logits depend on other rows";
          ++ran;
        }
  }
  EXPECT_GE(ran, 24);
}

}  // namespace
}  // namespace mla::test
