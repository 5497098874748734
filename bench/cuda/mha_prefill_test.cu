// Standalone test + benchmark of the flash MHA prefill kernels (src/platform/cuda/mha_prefill.cu).
// Correctness: random bf16 q/k/v (ragged requests with gaps between them, prime lengths, prefix and
// no-mask cases, empty requests), every kernel body against an fp32/f64 CPU reference on the same
// bf16 inputs; poisoned outputs (gap rows must stay poisoned). Benchmark: causal s = 1024, 4096,
// 16384 and one prefix-chunk shape at 128 heads, CUDA events around calls queued back to back (as
// cuDNN's numbers were taken), median, and the same call launched onto an idle device beside it
// ("idle us"); cuBLAS bf16 GEMM ceiling.
//   the CUDA build's target mha_prefill_test (cmake --build build --target mha_prefill_test);
//   build/bin/mha_prefill_test [--probe] [--path NAME]... [--bench] [--gemm] [--shape TEXT]
// Each benchmark shape's timing runs inside cudaProfilerStart/Stop, so `ncu --profile-from-start off`
// sees the benchmark's launches alone.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "platform/cuda/cuda_check.h"
#include "platform/cuda/mha_prefill.h"

namespace mla::cuda {
[[noreturn]] void cuda_fail(const char* kind, const char* what, const char* call, const char* file, int line) {
  std::fprintf(stderr, "%s error: %s in %s (%s:%d)\n", kind, what, call, file, line);
  std::exit(2);
}
}  // namespace mla::cuda

using namespace mla::cuda;
using bf16 = __nv_bfloat16;
#define CK(x) MLA_CUDA_CHECK(x)

namespace {

float bf2f(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t f2bf(float f) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

const char* path_name(MhaFastPath p) {
  switch (p) {
    case MhaFastPath::Auto: return "auto";
    case MhaFastPath::Mma: return "mma";
    case MhaFastPath::Wgmma: return "wgmma";
    case MhaFastPath::WgmmaNoOverlap: return "wgmma-nooverlap";
    case MhaFastPath::WgmmaPingpong: return "wgmma-pingpong";
    case MhaFastPath::WgmmaPersistent: return "wgmma-persistent";
  }
  return "?";
}

void parallel_for(int n, const auto& fn) {
  const int nt = std::max(1u, std::thread::hardware_concurrency());
  std::atomic<int> next{0};
  std::vector<std::thread> th;
  for (int t = 0; t < nt; ++t)
    th.emplace_back([&] {
      for (int i; (i = next.fetch_add(1)) < n;) fn(i);
    });
  for (auto& t : th) t.join();
}

// ---- correctness ------------------------------------------------------------------------------
struct Case {
  std::string name;
  int H, dqk, dv;
  bool causal;
  std::vector<std::pair<int, int>> reqs;  // (q_len, k_len)
  std::vector<int> heads;                 // heads to check (empty: all)
};

struct Layout {
  std::vector<int32_t> qs, ql, ks, kl;
  int Tq = 0, Tk = 0, max_q = 0, max_k = 0, total_q = 0;
};
Layout make_layout(const Case& c) {
  Layout L;
  for (auto [q, k] : c.reqs) {
    L.qs.push_back(L.Tq);
    L.ql.push_back(q);
    L.ks.push_back(L.Tk);
    L.kl.push_back(k);
    L.Tq += q + 3;  // gaps: rows no request owns (o must stay untouched there)
    L.Tk += k + 5;
    L.max_q = std::max(L.max_q, q);
    L.max_k = std::max(L.max_k, k);
    L.total_q += q;
  }
  return L;
}

struct CheckResult {
  double o_rel = 0, lse_err = 0;
  long bad = 0;  // NaN / poison / −inf mismatches / gap rows written
};

// Reference o (f64 accumulation of fp32 scores) for (request row t, head h).
void reference_row(const Case& c, const Layout& L, const std::vector<float>& q, const std::vector<float>& k,
                   const std::vector<float>& v, int r, int i, int h, float scale, std::vector<double>& o,
                   double& lse) {
  const int H = c.H, dqk = c.dqk, dv = c.dv;
  const int ql = L.ql[r], kl = L.kl[r];
  const int visible = c.causal ? std::min(kl, std::max(0, kl - ql + i + 1)) : kl;
  o.assign(dv, 0.0);
  if (visible <= 0) {
    lse = -INFINITY;
    return;
  }
  const float* qr = &q[(size_t(L.qs[r] + i) * H + h) * dqk];
  std::vector<double> s(visible);
  double mx = -INFINITY;
  for (int j = 0; j < visible; ++j) {
    const float* kr = &k[(size_t(L.ks[r] + j) * H + h) * dqk];
    float acc[8] = {};
    int d = 0;
    for (; d + 8 <= dqk; d += 8)
      for (int u = 0; u < 8; ++u) acc[u] += qr[d + u] * kr[d + u];
    for (; d < dqk; ++d) acc[0] += qr[d] * kr[d];
    float dot = 0;
    for (int u = 0; u < 8; ++u) dot += acc[u];
    s[j] = double(dot) * scale;
    mx = std::max(mx, s[j]);
  }
  double l = 0;
  for (int j = 0; j < visible; ++j) {
    const double p = std::exp(s[j] - mx);
    l += p;
    const float* vr = &v[(size_t(L.ks[r] + j) * H + h) * dv];
    for (int d = 0; d < dv; ++d) o[d] += p * vr[d];
  }
  for (int d = 0; d < dv; ++d) o[d] /= l;
  lse = mx + std::log(l);
}

bool run_case(const Case& c, const std::vector<MhaFastPath>& paths, std::mt19937& rng) {
  const Layout L = make_layout(c);
  const int H = c.H;
  const float scale = 1.f / std::sqrt(float(c.dqk));
  auto rnd = [&](size_t n, float a) {
    std::uniform_real_distribution<float> U(-a, a);
    std::vector<uint16_t> b(n);
    for (auto& x : b) x = f2bf(U(rng));
    return b;
  };
  const size_t nq = size_t(std::max(L.Tq, 1)) * H * c.dqk, nk = size_t(std::max(L.Tk, 1)) * H * c.dqk,
               nv = size_t(std::max(L.Tk, 1)) * H * c.dv, no = size_t(std::max(L.Tq, 1)) * H * c.dv,
               nl = size_t(std::max(L.Tq, 1)) * H;
  const auto hq = rnd(nq, 2.f), hk = rnd(nk, 2.f), hv = rnd(nv, 1.f);
  std::vector<float> fq(nq), fk(nk), fv(nv);
  for (size_t i = 0; i < nq; ++i) fq[i] = bf2f(hq[i]);
  for (size_t i = 0; i < nk; ++i) fk[i] = bf2f(hk[i]);
  for (size_t i = 0; i < nv; ++i) fv[i] = bf2f(hv[i]);

  // Reference for the checked heads.
  std::vector<int> heads = c.heads;
  if (heads.empty())
    for (int h = 0; h < H; ++h) heads.push_back(h);
  struct Row {
    int r, i, h;
  };
  std::vector<Row> rows;
  for (int r = 0; r < int(c.reqs.size()); ++r)
    for (int i = 0; i < L.ql[r]; ++i)
      for (int h : heads) rows.push_back({r, i, h});
  std::vector<double> ref_o(rows.size() * c.dv), ref_lse(rows.size());
  parallel_for(int(rows.size()), [&](int x) {
    std::vector<double> o;
    reference_row(c, L, fq, fk, fv, rows[x].r, rows[x].i, rows[x].h, scale, o, ref_lse[x]);
    std::copy(o.begin(), o.end(), ref_o.begin() + size_t(x) * c.dv);
  });

  void *dq, *dk, *dv, *dout;
  float* dlse;
  int32_t* dseg;
  CK(cudaMalloc(&dq, nq * 2));
  CK(cudaMalloc(&dk, nk * 2));
  CK(cudaMalloc(&dv, nv * 2));
  CK(cudaMalloc(&dout, no * 2));
  CK(cudaMalloc(&dlse, nl * 4));
  const int R = int(c.reqs.size());
  CK(cudaMalloc(&dseg, sizeof(int32_t) * 4 * std::max(R, 1)));
  int32_t* dsched;  // the persistent body's block counters: zero before and after every launch
  CK(cudaMalloc(&dsched, 2 * sizeof(int32_t)));
  CK(cudaMemset(dsched, 0, 2 * sizeof(int32_t)));
  CK(cudaMemcpy(dq, hq.data(), nq * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dk, hk.data(), nk * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dv, hv.data(), nv * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dseg + 0 * R, L.qs.data(), 4 * R, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dseg + 1 * R, L.ql.data(), 4 * R, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dseg + 2 * R, L.ks.data(), 4 * R, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dseg + 3 * R, L.kl.data(), 4 * R, cudaMemcpyHostToDevice));

  MhaParams p{};
  p.q = dq;
  p.k = dk;
  p.v = dv;
  p.elem = Elem::BF16;
  p.seg = {dseg, dseg + R, dseg + 2 * R, dseg + 3 * R, R, L.max_q, L.max_k, L.total_q, c.causal};
  p.num_heads = H;
  p.qk_dim = c.dqk;
  p.v_dim = c.dv;
  p.softmax_scale = scale;
  p.o = dout;
  p.lse = dlse;
  p.stream = nullptr;
  p.sched = dsched;
  if (!mha_fast_supports(p)) {
    std::printf("  %-34s UNSUPPORTED\n", c.name.c_str());
    return false;
  }

  bool all_ok = true;
  std::vector<uint16_t> ho(no);
  std::vector<float> hl(nl);
  for (MhaFastPath path : paths) {
    CK(cudaMemset(dout, 0xFF, no * 2));  // bf16 NaN
    CK(cudaMemset(dlse, 0xFF, nl * 4));  // f32 NaN
    mha_attention_fast_path(p, path);
    CK(cudaGetLastError());
    const cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
      std::printf("  %-34s %-16s KERNEL ERROR %s\n", c.name.c_str(), path_name(path), cudaGetErrorString(e));
      std::exit(3);  // the context is gone
    }
    CK(cudaMemcpy(ho.data(), dout, no * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hl.data(), dlse, nl * 4, cudaMemcpyDeviceToHost));
    int32_t hs[2];
    CK(cudaMemcpy(hs, dsched, sizeof hs, cudaMemcpyDeviceToHost));
    CheckResult cr;
    if (hs[0] != 0 || hs[1] != 0) {
      std::printf("  %-30s %-16s block counters left at %d, %d\n", c.name.c_str(), path_name(path), hs[0], hs[1]);
      ++cr.bad;
    }
    double num = 0, den = 0;
    for (size_t x = 0; x < rows.size(); ++x) {
      const size_t t = size_t(L.qs[rows[x].r] + rows[x].i) * H + rows[x].h;
      for (int d = 0; d < c.dv; ++d) {
        const double got = bf2f(ho[t * c.dv + d]), ref = ref_o[x * c.dv + d];
        if (!std::isfinite(got)) ++cr.bad;
        num += (got - ref) * (got - ref);
        den += ref * ref;
      }
      const double gl = hl[t], rl = ref_lse[x];
      if (std::isinf(rl) || std::isinf(gl) || std::isnan(gl)) {
        if (!(std::isinf(rl) && std::isinf(gl) && rl < 0 && gl < 0)) ++cr.bad;
      } else {
        cr.lse_err = std::max(cr.lse_err, std::abs(gl - rl));
      }
    }
    cr.o_rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
    // Gap rows (no request) must still hold the poison.
    long gap_written = 0;
    std::vector<char> owned(std::max(L.Tq, 1), 0);
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < L.ql[r]; ++i) owned[L.qs[r] + i] = 1;
    for (int t = 0; t < L.Tq; ++t)
      if (!owned[t])
        for (int h = 0; h < H; ++h) {
          for (int d = 0; d < c.dv; ++d) gap_written += ho[(size_t(t) * H + h) * c.dv + d] != 0xFFFF;
          uint32_t u;
          std::memcpy(&u, &hl[size_t(t) * H + h], 4);
          gap_written += u != 0xFFFFFFFFu;
        }
    cr.bad += gap_written;
    const bool ok = cr.bad == 0 && cr.o_rel <= 1e-2 && cr.lse_err <= 1e-3;
    all_ok &= ok;
    std::printf("  %-30s %-16s o rel L2 %.2e  lse max err %.2e  bad %ld  %s\n", c.name.c_str(), path_name(path),
                cr.o_rel, cr.lse_err, cr.bad, ok ? "PASS" : "FAIL");
  }
  CK(cudaFree(dq));
  CK(cudaFree(dk));
  CK(cudaFree(dv));
  CK(cudaFree(dout));
  CK(cudaFree(dlse));
  CK(cudaFree(dseg));
  CK(cudaFree(dsched));
  return all_ok;
}

// ---- benchmark --------------------------------------------------------------------------------
__global__ void fill_random(bf16* x, size_t n, uint32_t seed, float a) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 16;
    h *= 0x7feb352du;
    h ^= h >> 15;
    h *= 0x846ca68bu;
    h ^= h >> 16;
    x[i] = __float2bfloat16((float(h) * (1.f / 4294967296.f) * 2.f - 1.f) * a);
  }
}
// sum (a − b)², sum b², count of non-finite a.
__global__ void diff_stats(const bf16* a, const bf16* b, size_t n, double* out) {
  double s = 0, r = 0, bad = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const double x = __bfloat162float(a[i]), y = __bfloat162float(b[i]);
    if (!isfinite(x)) bad += 1;
    s += (x - y) * (x - y);
    r += y * y;
  }
  atomicAdd(out, s);
  atomicAdd(out + 1, r);
  atomicAdd(out + 2, bad);
}

struct Shape {
  const char* name;
  int H, sq, sk;
  bool causal;
};

double median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// Queued: every call and its events queued back to back, then waited for once (as cuDNN's numbers
// were taken), so the events time the device's work; the host stays ahead of kernels this long.
template <typename F>
double queued_ms(F&& f, int warm, int iters, float* spread = nullptr) {
  for (int i = 0; i < warm; ++i) f();
  CK(cudaDeviceSynchronize());
  std::vector<cudaEvent_t> a(iters), b(iters);
  for (int i = 0; i < iters; ++i) {
    CK(cudaEventCreate(&a[i]));
    CK(cudaEventCreate(&b[i]));
  }
  for (int i = 0; i < iters; ++i) {
    CK(cudaEventRecord(a[i]));
    f();
    CK(cudaEventRecord(b[i]));
  }
  CK(cudaDeviceSynchronize());
  std::vector<float> t(iters);
  for (int i = 0; i < iters; ++i) {
    CK(cudaEventElapsedTime(&t[i], a[i], b[i]));
    CK(cudaEventDestroy(a[i]));
    CK(cudaEventDestroy(b[i]));
  }
  if (spread) *spread = *std::max_element(t.begin(), t.end()) / *std::min_element(t.begin(), t.end());
  return median(t);
}

// From idle: each call launched onto an idle device, its events around it, then waited for (the
// events also hold the host's launch latency).
template <typename F>
double time_ms(F&& f, int warm, int iters, float* spread = nullptr) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < warm; ++i) f();
  CK(cudaDeviceSynchronize());
  std::vector<float> t;
  for (int i = 0; i < iters; ++i) {
    CK(cudaEventRecord(a));
    f();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  if (spread) *spread = *std::max_element(t.begin(), t.end()) / *std::min_element(t.begin(), t.end());
  return median(t);
}

double gemm_ceiling() {
  const int n = 8192;
  bf16 *A, *B, *C;
  CK(cudaMalloc(&A, size_t(n) * n * 2));
  CK(cudaMalloc(&B, size_t(n) * n * 2));
  CK(cudaMalloc(&C, size_t(n) * n * 2));
  fill_random<<<1024, 256>>>(A, size_t(n) * n, 11, 1.f);
  fill_random<<<1024, 256>>>(B, size_t(n) * n, 12, 1.f);
  cublasHandle_t h;
  MLA_CUBLAS_CHECK(cublasCreate(&h));
  const float alpha = 1.f, beta = 0.f;
  auto run = [&] {
    MLA_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, A, CUDA_R_16BF, n, B, CUDA_R_16BF, n,
                                  &beta, C, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  };
  const double ms = time_ms(run, 3, 10);
  MLA_CUBLAS_CHECK(cublasDestroy(h));
  CK(cudaFree(A));
  CK(cudaFree(B));
  CK(cudaFree(C));
  const double tf = 2.0 * n * double(n) * n / (ms * 1e-3) / 1e12;
  std::printf("cuBLAS bf16 GEMM 8192^3: %.3f ms  %.1f TFLOP/s\n", ms, tf);
  return tf;
}

// Returns false when a bit-identity check failed (the default path run twice, or the persistent
// grid against the plain one).
bool bench(const std::vector<MhaFastPath>& paths, double ceiling, const std::string& only) {
  bool same_bits = true;
  const Shape shapes[] = {
      {"causal s=1024 h=128", 128, 1024, 1024, true},
      {"causal s=4096 h=128", 128, 4096, 4096, true},
      {"causal s=16384 h=128", 128, 16384, 16384, true},
      {"causal s=4096 h=16 (V2-Lite)", 16, 4096, 4096, true},
      {"prefix chunk q=4096 k=4096 nomask", 128, 4096, 4096, false},
  };
  std::printf("\n%-36s %-16s %10s %9s %7s %7s %10s  %s\n", "shape", "path", "us", "TFLOP/s", "ceil%", "spread",
              "idle us", "vs mma (rel L2)");
  for (const Shape& s : shapes) {
    if (!only.empty() && std::string(s.name).find(only) == std::string::npos) continue;
    const int H = s.H, dqk = 192, dvd = 128;
    const size_t nq = size_t(s.sq) * H * dqk, nk = size_t(s.sk) * H * dqk, nv = size_t(s.sk) * H * dvd,
                 no = size_t(s.sq) * H * dvd;
    bf16 *q, *k, *v, *o, *o_ref;
    float* lse;
    int32_t* seg;
    double* stats;
    CK(cudaMalloc(&q, nq * 2));
    CK(cudaMalloc(&k, nk * 2));
    CK(cudaMalloc(&v, nv * 2));
    CK(cudaMalloc(&o, no * 2));
    CK(cudaMalloc(&o_ref, no * 2));
    CK(cudaMalloc(&lse, size_t(s.sq) * H * 4));
    CK(cudaMalloc(&seg, 24));  // q_start, q_len, k_start, k_len; then the two block counters
    CK(cudaMalloc(&stats, 3 * sizeof(double)));
    fill_random<<<2048, 256>>>(q, nq, 1, 1.f);
    fill_random<<<2048, 256>>>(k, nk, 2, 1.f);
    fill_random<<<2048, 256>>>(v, nv, 3, 1.f);
    const int32_t hseg[6] = {0, s.sq, 0, s.sk, 0, 0};
    CK(cudaMemcpy(seg, hseg, 24, cudaMemcpyHostToDevice));
    MhaParams p{};
    p.q = q;
    p.k = k;
    p.v = v;
    p.elem = Elem::BF16;
    p.seg = {seg, seg + 1, seg + 2, seg + 3, 1, s.sq, s.sk, s.sq, s.causal};
    p.num_heads = H;
    p.qk_dim = dqk;
    p.v_dim = dvd;
    p.softmax_scale = 1.f / std::sqrt(192.f);
    p.lse = lse;
    p.stream = nullptr;
    p.sched = seg + 4;
    const double avg_keys = s.causal ? (std::max(0, s.sk - s.sq) + s.sk) / 2.0 : double(s.sk);
    const double flops = 2.0 * H * double(s.sq) * avg_keys * (dqk + dvd);
    const int iters = s.sq >= 16384 ? 10 : 20;
    bool have_ref = false;
    for (MhaFastPath path : paths) {
      p.o = path == MhaFastPath::Mma ? o_ref : o;
      float spread = 0;
      CK(cudaProfilerStart());
      const double ms = queued_ms([&] { mha_attention_fast_path(p, path); }, 3, iters, &spread);
      const double ms_idle = time_ms([&] { mha_attention_fast_path(p, path); }, 1, iters);
      CK(cudaProfilerStop());
      CK(cudaGetLastError());
      CK(cudaDeviceSynchronize());
      const double tf = flops / (ms * 1e-3) / 1e12;
      char cmp[64] = "";
      if (path == MhaFastPath::Mma) {
        have_ref = true;
      } else if (have_ref) {
        CK(cudaMemset(stats, 0, 3 * sizeof(double)));
        diff_stats<<<1024, 256>>>(o, o_ref, no, stats);
        double hs[3];
        CK(cudaMemcpy(hs, stats, sizeof hs, cudaMemcpyDeviceToHost));
        std::snprintf(cmp, sizeof cmp, "%.2e%s", std::sqrt(hs[0] / hs[1]), hs[2] > 0 ? " NONFINITE" : "");
      }
      std::printf("%-36s %-16s %10.1f %9.1f %6.1f%% %7.3f %10.1f  %s\n", s.name, path_name(path), ms * 1e3, tf,
                  100.0 * tf / ceiling, spread, ms_idle * 1e3, cmp);
      std::fflush(stdout);
    }
    // Run-to-run determinism of the default path (a moving result means a race), and the persistent
    // grid against the plain one (the same blocks computed alike: the same bits).
    auto sum_sq_diff = [&](MhaFastPath a, MhaFastPath b) {
      p.o = o_ref;
      mha_attention_fast_path(p, a);
      p.o = o;
      mha_attention_fast_path(p, b);
      CK(cudaMemset(stats, 0, 3 * sizeof(double)));
      diff_stats<<<1024, 256>>>(o, o_ref, no, stats);
      double hs[3];
      CK(cudaMemcpy(hs, stats, sizeof hs, cudaMemcpyDeviceToHost));
      return hs[0];
    };
    const double twice = sum_sq_diff(MhaFastPath::Auto, MhaFastPath::Auto);
    const double grids = sum_sq_diff(MhaFastPath::WgmmaNoOverlap, MhaFastPath::WgmmaPersistent);
    std::printf("%-36s auto twice: sum sq diff %.3e (0 = deterministic)%s\n", s.name, twice,
                twice == 0 ? "" : "  FAIL");
    std::printf("%-36s persistent vs plain grid: sum sq diff %.3e (0 = same bits)%s\n", s.name, grids,
                grids == 0 ? "" : "  FAIL");
    same_bits &= twice == 0 && grids == 0;
    CK(cudaFree(q));
    CK(cudaFree(k));
    CK(cudaFree(v));
    CK(cudaFree(o));
    CK(cudaFree(o_ref));
    CK(cudaFree(lse));
    CK(cudaFree(seg));
    CK(cudaFree(stats));
  }
  return same_bits;
}

}  // namespace

MhaFastPath parse_path(const char* s) {
  for (MhaFastPath p : {MhaFastPath::Auto, MhaFastPath::Mma, MhaFastPath::Wgmma, MhaFastPath::WgmmaNoOverlap,
                        MhaFastPath::WgmmaPingpong, MhaFastPath::WgmmaPersistent})
    if (!std::strcmp(s, path_name(p))) return p;
  std::fprintf(stderr, "unknown path %s\n", s);
  std::exit(2);
}

// --probe: print the device and exit. --path NAME (repeatable; default all): bodies to check (and
// time). --bench: time the bodies that passed. --gemm: time the cuBLAS ceiling. --quick: skip the
// 128-head cases. --shape TEXT: time only the shapes whose name holds TEXT.
int main(int argc, char** argv) {
  bool probe = false, do_bench = false, do_gemm = false, quick = false;
  std::string only;
  std::vector<MhaFastPath> paths;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--probe")) probe = true;
    else if (!std::strcmp(argv[i], "--bench")) do_bench = true;
    else if (!std::strcmp(argv[i], "--gemm")) do_gemm = true;
    else if (!std::strcmp(argv[i], "--quick")) quick = true;  // small cases only (for compute-sanitizer)
    else if (!std::strcmp(argv[i], "--shape") && i + 1 < argc) only = argv[++i];
    else if (!std::strcmp(argv[i], "--path") && i + 1 < argc) paths.push_back(parse_path(argv[++i]));
  }
  if (paths.empty())
    paths = {MhaFastPath::Auto, MhaFastPath::Mma, MhaFastPath::Wgmma, MhaFastPath::WgmmaNoOverlap,
             MhaFastPath::WgmmaPingpong, MhaFastPath::WgmmaPersistent};
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, cc %d.%d, %d SMs, L2 %d MB, smem/block optin %zu KB\n", prop.name, prop.major, prop.minor,
              prop.multiProcessorCount, prop.l2CacheSize >> 20, prop.sharedMemPerBlockOptin >> 10);
  if (probe) return 0;

  const bool small = std::find_if(paths.begin(), paths.end(), [](MhaFastPath p) {
                       return p == MhaFastPath::Auto || p == MhaFastPath::Mma;
                     }) != paths.end();
  std::vector<Case> cases = {
      {"h1 causal ragged", 1, 192, 128, true, {{127, 127}, {251, 389}, {13, 13}, {1, 97}, {130, 130}}, {}},
      {"h3 causal empty/k<q/prefix", 3, 192, 128, true, {{257, 257}, {67, 0}, {5, 2}, {0, 17}, {300, 601}}, {}},
      {"h16 nomask prefix chunks", 16, 192, 128, false, {{199, 401}, {131, 0}, {64, 128}, {1, 7}}, {}},
      {"h128 causal ragged prefix", 128, 192, 128, true, {{509, 509}, {211, 1031}}, {0, 1, 2, 3, 61, 62, 126, 127}},
      {"h128 nomask chunk", 128, 192, 128, false, {{383, 1531}}, {0, 57, 127}},
      {"h128 causal s=1024", 128, 192, 128, true, {{1024, 1024}}, {0, 1, 64, 127}},
  };
  if (small) {
    const std::vector<Case> more = {
        {"h16 (128,128) causal", 16, 128, 128, true, {{257, 257}, {19, 300}}, {}},
        {"h3 (96,64) nomask", 3, 96, 64, false, {{100, 200}, {7, 0}}, {}},
        {"h1 (64,64) causal", 1, 64, 64, true, {{333, 333}}, {}},
        {"h16 (48,32) causal", 16, 48, 32, true, {{97, 97}, {23, 151}, {0, 5}}, {}},
        {"h3 (40,32) nomask", 3, 40, 32, false, {{61, 61}, {17, 0}, {29, 113}}, {}},
        {"h16 (32,20) causal", 16, 32, 20, true, {{131, 131}, {7, 0}, {41, 83}}, {}},
    };
    cases.insert(cases.end(), more.begin(), more.end());
  }
  if (quick) std::erase_if(cases, [](const Case& c) { return c.H == 128; });
  std::mt19937 rng(1234);
  bool ok = true;
  std::vector<MhaFastPath> passed;
  std::printf("correctness (o rel L2 <= 1e-2, lse abs <= 1e-3):\n");
  for (MhaFastPath path : paths) {
    bool pok = true;
    for (const Case& c : cases) {
      if (c.dqk != 192 && path != MhaFastPath::Mma && path != MhaFastPath::Auto) continue;
      pok &= run_case(c, {path}, rng);
      std::fflush(stdout);
    }
    std::printf("path %-16s %s\n", path_name(path), pok ? "PASS" : "FAIL");
    std::fflush(stdout);
    ok &= pok;
    if (pok && path != MhaFastPath::Auto) passed.push_back(path);
  }
  std::printf("correctness overall: %s\n", ok ? "PASS" : "FAIL (see lines above)");
  std::fflush(stdout);

  const double ceil = do_gemm ? gemm_ceiling() : 782.0;
  if (!do_gemm) std::printf("(no GEMM timed: ceiling taken as 782 TFLOP/s, KERNELS.md)\n");
  if (do_bench && !passed.empty()) ok &= bench(passed, ceil, only);
  return ok ? 0 : 1;
}
