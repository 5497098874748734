// bench/gpu/bench.cpp — the body of `mla bench` (see bench.h). Times kernels alone with CUDA events: warm-up, then the median
// of `runs`, rotating input buffers so every run reads more than the L2 holds.
#include "bench/gpu/bench.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "mla/attention.h"
#include "mla/config.h"
#include "mla/error.h"
#include "mla/moe.h"
#include "mla/platform_ops.h"
#include "platform/gpu/attention_kernels.h"
#include "platform/cuda/cuda_check.h"
#include "platform/gpu/elementwise.h"
#include "platform/gpu/gpu_ops.h"
#include "platform/cuda/mha_prefill.h"
#include "platform/cuda/mla_decode.h"
#include "platform/cuda/moe_gemm.h"
#include "platform/gpu/moe.h"

namespace mla::cuda {
namespace {

using namespace gpu;  // the shared kernels and types

using json = nlohmann::json;

struct DeviceBuffer {
  void* p = nullptr;
  size_t bytes = 0;
  explicit DeviceBuffer(size_t n) : bytes(n) { MLA_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 16))); }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};
using Buf = std::unique_ptr<DeviceBuffer>;
Buf alloc(size_t n) { return std::make_unique<DeviceBuffer>(n); }

template <typename T>
Buf upload(const std::vector<T>& v, cudaStream_t s) {
  Buf b = alloc(v.size() * sizeof(T));
  MLA_CUDA_CHECK(cudaMemcpyAsync(b->p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice, s));
  return b;
}

// Median time in µs of fn(i) over `runs` runs after `warm` warm-ups; fn gets the run index.
template <typename F>
double time_us(cudaStream_t s, int runs, F&& fn, int warm = 3) {
  cudaEvent_t a, b;
  MLA_CUDA_CHECK(cudaEventCreate(&a));
  MLA_CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < warm; ++i) fn(i);
  std::vector<float> ms;
  for (int i = 0; i < runs; ++i) {
    MLA_CUDA_CHECK(cudaEventRecord(a, s));
    fn(i);
    MLA_CUDA_CHECK(cudaEventRecord(b, s));
    MLA_CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    MLA_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return double(ms[ms.size() / 2]) * 1e3;
}

struct Ceilings {
  double copy_gbs = 0, gemm_tflops = 0;
};

Ceilings measure_ceilings(cudaStream_t s, int runs) {
  Ceilings c;
  const size_t n = size_t(2) << 30;  // 2 GiB each way
  Buf src = alloc(n), dst = alloc(n);
  MLA_CUDA_CHECK(cudaMemsetAsync(src->p, 1, n, s));
  const double us = time_us(s, runs, [&](int) { MLA_CUDA_CHECK(cudaMemcpyAsync(dst->p, src->p, n, cudaMemcpyDeviceToDevice, s)); });
  c.copy_gbs = 2.0 * double(n) / (us * 1e-6) / 1e9;
  const int m = 8192;
  Buf A = alloc(size_t(m) * m * 2), B = alloc(size_t(m) * m * 2), C = alloc(size_t(m) * m * 2);
  fill_random(A->p, Elem::BF16, size_t(m) * m, 1, 1.f, s);
  fill_random(B->p, Elem::BF16, size_t(m) * m, 2, 1.f, s);
  cublasHandle_t h;
  MLA_CUBLAS_CHECK(cublasCreate(&h));
  MLA_CUBLAS_CHECK(cublasSetStream(h, s));
  const float one = 1.f, zero = 0.f;
  const double gus = time_us(s, runs, [&](int) {
    MLA_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, m, m, &one, A->p, CUDA_R_16BF, m, B->p, CUDA_R_16BF, m,
                                  &zero, C->p, CUDA_R_16BF, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  });
  cublasDestroy(h);
  c.gemm_tflops = 2.0 * m * double(m) * m / (gus * 1e-6) / 1e12;
  return c;
}

json row(const std::string& name, double us, double flops, double bytes, const Ceilings& c) {
  const double tf = flops / (us * 1e-6) / 1e12, gbs = bytes / (us * 1e-6) / 1e9;
  return {{"name", name}, {"us", us}, {"tflops", tf}, {"gbs", gbs},
          {"frac_gemm", tf / c.gemm_tflops}, {"frac_copy", gbs / c.copy_gbs}};
}

// MLA decode: b requests × s_q query tokens × h heads against s_k latent rows each (page 64,
// pages shuffled over the pool), bf16 or fp8 rows. Enough pool copies to exceed the L2.
json bench_mla(int h, int b, int sk, int sq, Elem kv, const Ceilings& c, int runs, cudaStream_t s) {
  const int D = 576, Dv = 512, page = 64;
  const int pages_per = (sk + page - 1) / page;
  const int64_t slots = int64_t(b) * pages_per * page;
  const size_t kv_bytes = size_t(slots) * D * (kv == Elem::BF16 ? 2 : 1);
  const int copies = int(std::clamp<size_t>((size_t(200) << 20) / std::max<size_t>(kv_bytes, 1), 1, 8));
  std::vector<Buf> pools;
  for (int i = 0; i < copies; ++i) {
    pools.push_back(alloc(kv_bytes));
    fill_random(pools.back()->p, kv, size_t(slots) * D, 10 + i, kv == Elem::BF16 ? 1.f : 8.f, s);
  }
  std::vector<int32_t> perm(size_t(b) * pages_per);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(7));
  std::vector<int32_t> kv_slots, qs, ql, ks, kl;
  for (int r = 0; r < b; ++r) {
    qs.push_back(r * sq), ql.push_back(sq), ks.push_back(int32_t(kv_slots.size())), kl.push_back(sk);
    for (int t = 0; t < sk; ++t) kv_slots.push_back(perm[size_t(r) * pages_per + t / page] * page + t % page);
  }
  Buf dslots = upload(kv_slots, s), dqs = upload(qs, s), dql = upload(ql, s), dks = upload(ks, s), dkl = upload(kl, s);
  const int T = b * sq;
  Buf q = alloc(size_t(T) * h * D * 2), o = alloc(size_t(T) * h * Dv * 2), lse = alloc(size_t(T) * h * 4);
  fill_random(q->p, Elem::BF16, size_t(T) * h * D, 3, 1.f, s);
  int sms = 132;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  Buf ws = alloc(mla_fast_workspace_bytes(T, h, sms));
  MlaParams p{q->p, Elem::BF16, pools[0]->p, kv, 1.f, static_cast<int32_t*>(dslots->p),
              {static_cast<int32_t*>(dqs->p), static_cast<int32_t*>(dql->p), static_cast<int32_t*>(dks->p),
               static_cast<int32_t*>(dkl->p), b, sq, sk, T, true},
              h, D, Dv, 0.1352f, o->p, Elem::BF16, static_cast<float*>(lse->p), {ws->p, ws->bytes}, s};
  // The grid counters the platform gives each lane (the in-grid merge, the persistent grid's flags).
  Buf counters = alloc(size_t(gpu::kGridCounterInts) * 4);
  MLA_CUDA_CHECK(cudaMemsetAsync(counters->p, 0, size_t(gpu::kGridCounterInts) * 4, s));
  p.grid_counters = static_cast<int32_t*>(counters->p);
  if (!mla_fast_supports(p)) fail("bench: the fast MLA kernel does not support h {}", h);
  const double us = time_us(s, runs, [&](int i) {
    p.kv = pools[size_t(i) % pools.size()]->p;
    mla_attention_fast(p);
  });
  const double flops = 2.0 * b * sq * double(h) * sk * (D + Dv);
  const double bytes = double(b) * sk * D * (kv == Elem::BF16 ? 2 : 1) + double(T) * h * (D + Dv) * 2;
  json j = row(fmt::format("mla_decode h{} b{} sk{} sq{} {}", h, b, sk, sq, kv == Elem::BF16 ? "bf16" : "fp8"), us, flops, bytes, c);
  j.update({{"h", h}, {"b", b}, {"s_k", sk}, {"s_q", sq}, {"kv", kv == Elem::BF16 ? "bf16" : "fp8"}});
  return j;
}

// MHA prefill, 128 heads, 192/128: `sq` new tokens attending `sk` keys (causal bottom-right) or a
// prefix chunk (no mask).
json bench_mha(const std::string& kind, int sq, int sk, bool causal, const Ceilings& c, int runs, cudaStream_t s) {
  const int H = 128, Dqk = 192, Dv = 128;
  Buf q = alloc(size_t(sq) * H * Dqk * 2), k = alloc(size_t(sk) * H * Dqk * 2), v = alloc(size_t(sk) * H * Dv * 2);
  Buf o = alloc(size_t(sq) * H * Dv * 2), lse = alloc(size_t(sq) * H * 4);
  fill_random(q->p, Elem::BF16, size_t(sq) * H * Dqk, 4, 1.f, s);
  fill_random(k->p, Elem::BF16, size_t(sk) * H * Dqk, 5, 1.f, s);
  fill_random(v->p, Elem::BF16, size_t(sk) * H * Dv, 6, 1.f, s);
  std::vector<int32_t> seg = {0, sq, 0, sk};
  Buf d = upload(seg, s);
  const int32_t* di = static_cast<const int32_t*>(d->p);
  MhaParams p{q->p, k->p, v->p, Elem::BF16, {di, di + 1, di + 2, di + 3, 1, sq, sk, sq, causal}, H, Dqk, Dv, 0.1352f,
              o->p, static_cast<float*>(lse->p), s};
  if (!mha_fast_supports(p)) fail("bench: the fast MHA kernel does not support 192/128");
  const double us = time_us(s, runs, [&](int) { mha_attention_fast(p); });
  const double avg_keys = causal ? (std::max(0, sk - sq) + double(sk)) / 2 : double(sk);
  const double flops = 2.0 * H * double(sq) * avg_keys * (Dqk + Dv);
  const double bytes = (double(sq) * H * (Dqk + Dv) + double(sk) * H * (Dqk + Dv)) * 2;
  json j = row(fmt::format("mha_prefill {} s_q{} s_k{}", kind, sq, sk), us, flops, bytes, c);
  j.update({{"s_q", sq}, {"s_k", sk}, {"causal", causal}});
  return j;
}

json counters_json(const StepCounters& c) {
  return {{"h2d", c.h2d_copies}, {"d2h", c.d2h_copies}, {"host_syncs", c.host_syncs},
          {"decode_schedules", c.decode_schedules}};
}

// One whole DeepSeek-V3 attention layer through a platform's ops (bf16, bf16 KV, page 64), by the
// method its default backend dispatches: the CUDA platform, or the ROCm twins on this GPU
// (rocm-on-cuda, with `options` and `ds` choosing target, absorb format and fused-RoPE decode).
// "us" and "counters": the layer alone, uploading its own arrays (no step); "step": the same layer
// inside a step (Ops::begin_step: the plan on the device once), as each layer of a model's step
// runs: its time per layer, the counts of the step's first layer (with the plan's copy) and of each
// further layer, and the host time of begin_step + end_step.
json bench_layer(const std::string& name, ForwardMode mode, int b, int prefix, int fresh, const Ceilings& c, int runs,
                 Platform platform = Platform::CUDA, const PlatformOptions& options = {},
                 const DispatchSettings& ds = {}) {
  AttentionConfig cfg = preset_config("deepseek-v3");
  std::unique_ptr<Ops> ops = make_ops(platform, DType::BF16, options);
  AttentionWeights w = random_attention_weights(cfg, 5, DType::BF16);
  AttentionLayer layer(cfg, w, *ops);
  const int64_t per = (prefix + fresh + 63) / 64 * 64;
  KVPool pool({1, cfg.kv_row_dim(), DType::BF16, 64, b * per / 64}, [&](DType d, Shape sh) { return ops->empty(d, std::move(sh)); });
  ops->fill(pool.buffer(0), 0.5);
  Batch batch{mode, {}};
  for (int r = 0; r < b; ++r) {
    pool.reserve(r, prefix + fresh);
    batch.requests.push_back({r, prefix, fresh});
  }
  BatchPlan plan = plan_batch(batch, pool);
  Tensor x = ops->empty(DType::BF16, {plan.num_tokens, cfg.hidden_size});
  fill_random(x.data(), Elem::BF16, size_t(x.numel()), 9, 1.f, nullptr);
  ops->synchronize();
  cudaStream_t s = nullptr;  // the layer runs on the ops' stream; events on the legacy stream order with it
  ForwardMethod m = dispatch(batch, ds, platform).resolved;
  const double us = time_us(s, runs, [&](int) {
    layer.forward(x, plan, pool, 0, m, ds);
    ops->synchronize();
  }, 1);
  StepCounters c0 = ops->counters();
  layer.forward(x, plan, pool, 0, m, ds);
  const StepCounters alone = ops->counters() - c0;
  ops->synchronize();

  json step;
  {
    ops->begin_step(plan, pool);  // sizes the step's buffers (both pinned ones: two steps)
    ops->end_step();
    ops->begin_step(plan, pool);
    ops->end_step();
    ops->synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    ops->begin_step(plan, pool);
    ops->end_step();
    step["begin_step_us"] = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    ops->synchronize();
    StepScope scope(*ops, plan, pool);
    layer.forward(x, plan, pool, 0, m, ds);
    const StepCounters first = ops->step_counters();
    layer.forward(x, plan, pool, 0, m, ds);
    step["first_layer"] = counters_json(first);
    step["next_layer"] = counters_json(ops->step_counters() - first);
    ops->synchronize();
    step["us"] = time_us(s, runs, [&](int) {
      layer.forward(x, plan, pool, 0, m, ds);
      ops->synchronize();
    }, 1);
  }
  json j = {{"name", name}, {"us", us}, {"method", method_name(m)}, {"platform", platform_name(platform)},
            {"counters", counters_json(alone)}, {"step", step}};
  if (platform == Platform::ROCM) j["rocm"] = options.rocm.describe();
  (void)c;
  return j;
}

// One MoE layer's routed experts (bf16) through the CUDA platform's ops: moe_route on random f32
// router logits, then moe_experts on the stacked experts, timed on the ops' stream. Roofline bytes:
// the weights of the experts the routing touched (plus x, out); FLOPs: 2 · T·K · 3 · I · hidden.
// Enough weight copies rotate that every run reads more than the L2 holds. `old_loop` also times
// the per-expert host loop this replaced (router logits downloaded, route_tokens on the host,
// per expert gather → three GEMMs → scatter) on the same rows.
json bench_moe(const std::string& name, const MoeRouting& r, int64_t I, int64_t Hd, int64_t T, bool old_loop,
               const Ceilings& c, int runs) {
  const int64_t E = r.n_routed_experts, K = r.num_experts_per_tok;
  std::unique_ptr<Ops> ops = make_ops(Platform::CUDA, DType::BF16);
  cudaStream_t s = dynamic_cast<gpu::GpuOps&>(*ops).stream();
  const size_t per = size_t(E * I * Hd);
  const int copies = int(std::clamp<size_t>((size_t(3) << 30) / (per * 2 * 3), 1, 4));
  struct Set { Tensor gate, up, down; };
  std::vector<Set> sets;
  for (int i = 0; i < copies; ++i) {
    Set w{ops->empty(DType::BF16, {E, I, Hd}), ops->empty(DType::BF16, {E, I, Hd}), ops->empty(DType::BF16, {E, Hd, I})};
    fill_random(w.gate.data(), Elem::BF16, per, 30 + i, 0.02f, s);
    fill_random(w.up.data(), Elem::BF16, per, 40 + i, 0.02f, s);
    fill_random(w.down.data(), Elem::BF16, per, 50 + i, 0.02f, s);
    sets.push_back(std::move(w));
  }
  Tensor logits = ops->empty(DType::F32, {T, E}), bias;
  fill_random(logits.data(), Elem::F32, size_t(T * E), 60, 1.f, s);
  if (r.scoring_func == "sigmoid") {
    bias = ops->empty(DType::F32, {E});
    fill_random(bias.data(), Elem::F32, size_t(E), 61, 0.01f, s);
  }
  Tensor x = ops->empty(DType::BF16, {T, Hd}), out = ops->empty(DType::BF16, {T, Hd});
  fill_random(x.data(), Elem::BF16, size_t(T * Hd), 62, 1.f, s);
  Tensor ex = ops->empty(DType::I32, {T, K}), w = ops->empty(DType::F32, {T, K});
  const double us = time_us(s, runs, [&](int i) {
    const Set& m = sets[size_t(i) % sets.size()];
    ops->moe_route(logits, bias, r, ex, w);
    ops->moe_experts(x, ex, w, m.gate, m.up, m.down, out);
  });
  const double route_us = time_us(s, runs, [&](int) { ops->moe_route(logits, bias, r, ex, w); });
  const double experts_us = time_us(s, runs, [&](int i) {
    const Set& m = sets[size_t(i) % sets.size()];
    ops->moe_experts(x, ex, w, m.gate, m.up, m.down, out);
  });
  // The kernels of moe_experts, each timed alone: the plan, the two grouped GEMMs (FLOP rate on the
  // real rows; `tile_fill` = real rows / rows of the tiles run) and the combine.
  const int64_t n = T * K;
  const int bm = moe_fast_rows(n, E, I, Hd);
  const int64_t max_tiles = moe_max_tiles(n, E, bm);
  Tensor words = ops->empty(DType::I32, {moe_plan_words(n, E, bm)});
  const MoePlan plan = moe_plan_at(words.ptr<int32_t>(), n, E, bm);
  Tensor h = ops->empty(DType::BF16, {n, I}), y = ops->empty(DType::BF16, {n, Hd});
  const double plan_us = time_us(s, runs, [&](int) { moe_align(ex.ptr<int32_t>(), n, int(E), bm, plan, s); });
  const double gate_up_us = time_us(s, runs, [&](int i) {
    const Set& m = sets[size_t(i) % sets.size()];
    moe_gate_up_fast(x.data(), T, int(K), plan, max_tiles, bm, m.gate.data(), m.up.data(), E, I, Hd, h.data(), s);
  });
  const double down_us = time_us(s, runs, [&](int i) {
    moe_down_fast(h.data(), n, plan, max_tiles, bm, sets[size_t(i) % sets.size()].down.data(), E, I, Hd, y.data(), s);
  });
  const double combine_us = time_us(s, runs, [&](int) {
    moe_combine(y.data(), Elem::BF16, plan.pos, w.ptr<float>(), T, K, Hd, out.data(), Elem::BF16, nullptr, Elem::BF16, s);
  });
  int32_t tiles_run = 0;
  MLA_CUDA_CHECK(cudaMemcpyAsync(&tiles_run, plan.num_tiles, sizeof tiles_run, cudaMemcpyDeviceToHost, s));
  MLA_CUDA_CHECK(cudaStreamSynchronize(s));
  const double gemm_flops = 2.0 * double(n) * double(I) * double(Hd);  // one projection
  json parts = {{"tile_rows", bm}, {"tile_fill", double(n) / (double(tiles_run) * bm)}, {"plan_us", plan_us},
                {"gate_up_us", gate_up_us}, {"down_us", down_us}, {"combine_us", combine_us},
                {"gate_up_tflops", 2 * gemm_flops / gate_up_us * 1e-6}, {"down_tflops", gemm_flops / down_us * 1e-6}};

  const Tensor hx = ops->download(ex);
  std::vector<bool> touched(size_t(E), false);
  for (int64_t i = 0; i < T * K; ++i) touched[size_t(hx.ptr<int32_t>()[i])] = true;
  const double n_touched = double(std::count(touched.begin(), touched.end(), true));
  const double flops = 2.0 * double(T * K) * 3.0 * double(I) * double(Hd);
  const double bytes = n_touched * 3.0 * double(I) * double(Hd) * 2 + 2.0 * double(T * Hd) * 2;
  json j = row(fmt::format("moe {} T{}", name, T), us, flops, bytes, c);
  j.update({{"T", T}, {"E", E}, {"K", K}, {"I", I}, {"hidden", Hd}, {"experts_touched", n_touched},
            {"route_us", route_us}, {"experts_us", experts_us},
            {"roofline_us", std::max(bytes / (c.copy_gbs * 1e9), flops / (c.gemm_tflops * 1e12)) * 1e6},
            {"parts", parts}});
  if (old_loop) {
    std::vector<Tensor> eg, eu, ed;  // per-expert tensors, as the model held them
    for (int64_t e = 0; e < E; ++e) {
      eg.push_back(ops->empty(DType::BF16, {I, Hd})), eu.push_back(ops->empty(DType::BF16, {I, Hd}));
      ed.push_back(ops->empty(DType::BF16, {Hd, I}));
      fill_random(eg.back().data(), Elem::BF16, size_t(I * Hd), 70 + e, 0.02f, s);
      fill_random(eu.back().data(), Elem::BF16, size_t(I * Hd), 170 + e, 0.02f, s);
      fill_random(ed.back().data(), Elem::BF16, size_t(I * Hd), 270 + e, 0.02f, s);
    }
    std::vector<float> bias_h;
    if (bias.defined())
      for (double v : ops->download(bias).to_doubles()) bias_h.push_back(float(v));
    const double old_us = time_us(s, std::min(runs, 5), [&](int) {
      std::vector<float> host;
      for (double v : ops->download(logits).to_doubles()) host.push_back(float(v));
      const Routing rt = route_tokens(r, host, bias_h, T);
      ops->fill(out, 0.0);
      for (int64_t e = 0; e < E; ++e) {
        std::vector<int32_t> rows;
        std::vector<float> wts;
        for (int64_t i = 0; i < T * K; ++i)
          if (rt.expert[size_t(i)] == e) rows.push_back(int32_t(i / K)), wts.push_back(rt.weight[size_t(i)]);
        if (rows.empty()) continue;
        const int64_t n = int64_t(rows.size());
        Tensor xe = ops->empty(DType::BF16, {n, Hd}), g = ops->empty(DType::BF16, {n, I}), u = ops->empty(DType::BF16, {n, I});
        Tensor y = ops->empty(DType::BF16, {n, Hd});
        ops->gather_rows(x, rows, xe);
        ops->linear(xe, eg[size_t(e)], g);
        ops->linear(xe, eu[size_t(e)], u);
        ops->silu_mul(g, u, g);
        ops->linear(g, ed[size_t(e)], y);
        ops->scatter_add_rows(y, rows, wts, out);
      }
    }, 1);
    j["old_host_loop_us"] = old_us;
    j["speedup_over_old"] = old_us / us;
  }
  return j;
}

}  // namespace

json run_bench(const BenchOptions& o) {
  cudaStream_t s;
  MLA_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaDeviceProp prop{};
  MLA_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const int runs = o.quick ? 5 : o.runs;
  if (o.layers_only) {  // the V3 layer rows alone (no ceilings: the layer rows report none)
    json layers = json::array();
    layers.push_back(bench_layer("layer decode b128 s4096 (V3)", ForwardMode::DECODE, 128, 4095, 1, {}, o.quick ? 3 : 10));
    layers.push_back(bench_layer("layer prefill s4096 (V3)", ForwardMode::EXTEND, 1, 0, 4096, {}, o.quick ? 2 : 5));
    cudaStreamDestroy(s);
    return {{"device", prop.name}, {"sms", prop.multiProcessorCount}, {"layer", layers}};
  }
  Ceilings c = measure_ceilings(s, runs);
  json out = {{"device", prop.name}, {"sms", prop.multiProcessorCount},
              {"ceilings", {{"copy_gbs", c.copy_gbs}, {"gemm_bf16_tflops", c.gemm_tflops}}}};
  {  // MoE: V2-Lite (E 64, top-6, I 1408, hidden 2048) and V3 (E 256, top-8, I 2048, hidden 7168)
    MoeRouting v2;
    v2.n_routed_experts = 64, v2.num_experts_per_tok = 6;
    MoeRouting v3;
    v3.n_routed_experts = 256, v3.num_experts_per_tok = 8, v3.n_group = 8, v3.topk_group = 4;
    v3.scoring_func = "sigmoid", v3.topk_method = "noaux_tc", v3.norm_topk_prob = true, v3.routed_scaling_factor = 2.5;
    json moe = json::array();
    if (!o.rocm_only) {
      for (int64_t T : o.quick ? std::vector<int64_t>{1, 128} : std::vector<int64_t>{1, 16, 128, 256, 4096})
        moe.push_back(bench_moe("v2-lite", v2, 1408, 2048, T, T <= 128, c, runs));
      for (int64_t T : {128, 4096}) moe.push_back(bench_moe("v3", v3, 2048, 7168, T, false, c, runs));
    }
    out["moe"] = moe;
    if (o.moe_only) {
      cudaStreamDestroy(s);
      return out;
    }
  }
  json mla = json::array(), mha = json::array(), layers = json::array();
  if (!o.rocm_only) {
    const std::vector<int> heads = {128, 16}, batches = o.quick ? std::vector<int>{1, 128} : std::vector<int>{1, 16, 128};
    const std::vector<int> lens = o.quick ? std::vector<int>{4096} : std::vector<int>{1024, 4096, 16384};
    for (int h : heads)
      for (int b : batches)
        for (int sk : lens)
          for (int sq : {1, 2})
            for (Elem kv : {Elem::BF16, Elem::FP8_E4M3FN}) mla.push_back(bench_mla(h, b, sk, sq, kv, c, runs, s));
    for (int sl : lens) {
      mha.push_back(bench_mha("causal", sl, sl, true, c, runs, s));
      mha.push_back(bench_mha("one_shot_prefix", sl / 4, sl, true, c, runs, s));
      mha.push_back(bench_mha("prefix_chunk", sl / 4, sl, false, c, runs, s));
    }
    layers.push_back(bench_layer("layer decode b128 s4096 (V3)", ForwardMode::DECODE, 128, 4095, 1, c, o.quick ? 3 : 10));
    layers.push_back(bench_layer("layer prefill s4096 (V3)", ForwardMode::EXTEND, 1, 0, 4096, c, o.quick ? 2 : 5));
    out["mla_decode"] = mla;
    out["mha_prefill"] = mha;
    out["layer"] = layers;
  }
  // The ROCm twins on this GPU against the CUDA platform (smaller shapes: the twins' attention is
  // the portable SIMT kernel and their GEMMs our own).
  struct RocmRow { const char* name; ForwardMode mode; int b, prefix, fresh; RocmArch arch; AbsorbFormat absorb; bool fused; };
  const RocmRow rocm_rows[] = {
      {"decode b32 s1024 (V3)", ForwardMode::DECODE, 32, 1023, 1, RocmArch::GFX942, AbsorbFormat::ACT, false},
      {"decode b32 s1024 (V3)", ForwardMode::DECODE, 32, 1023, 1, RocmArch::GFX942, AbsorbFormat::ACT, true},
      {"decode b32 s1024 (V3)", ForwardMode::DECODE, 32, 1023, 1, RocmArch::GFX942, AbsorbFormat::FP8, false},
      {"decode b32 s1024 (V3)", ForwardMode::DECODE, 32, 1023, 1, RocmArch::GFX950, AbsorbFormat::MXFP4, false},
      {"prefill s1024 (V3)", ForwardMode::EXTEND, 1, 0, 1024, RocmArch::GFX942, AbsorbFormat::ACT, false},
  };
  json rocm = json::array();
  for (const RocmRow& r : rocm_rows) {
    PlatformOptions po;
    po.rocm.arch = r.arch, po.rocm.absorb = r.absorb;
    DispatchSettings ds;
    ds.fused_decode_rope = r.fused;
    const int n = o.quick ? 2 : 5;
    json row = {{"layer", r.name},
                {"cuda", bench_layer(r.name, r.mode, r.b, r.prefix, r.fresh, c, n)},
                {"rocm", bench_layer(r.name, r.mode, r.b, r.prefix, r.fresh, c, n, Platform::ROCM, po, ds)}};
    row["rocm_over_cuda"] = row["rocm"]["us"].get<double>() / row["cuda"]["us"].get<double>();
    rocm.push_back(row);
  }
  out["rocm_vs_cuda"] = rocm;
  cudaStreamDestroy(s);
  return out;
}

}  // namespace mla::cuda
