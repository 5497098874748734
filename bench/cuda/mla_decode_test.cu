// Standalone correctness test + benchmark of the fast MLA decode kernels
// (src/platform/cuda/mla_decode*.cu, the host side mla_decode.cpp).
//
// Build: the CUDA build's target mla_decode_test (cmake --build build --target mla_decode_test).
// Run:   mla_decode_test [--no-test] [--no-bench] [--out FILE]
//        MLA_TEST_VARIANT=N ORs MlaDecodeTuning variant bits N into every case (A/B runs of a variant).
//
// Tests: random bf16 q / KV (never zeros), slots shuffled over a pool twice the needed size with NaN
// in every unused row (also the tail of partly used pages), page sizes 1 and 64, heads 1/16/128,
// prime key lengths, 1 and 4 query tokens per request (causal bottom-right, including queries that
// see no key), bf16 and fp8 KV; the production dispatch (narrow swap-AB kernel for ≤ 32 rows), the
// 64-row kernel forced, its mma.sync variant, heuristic / forced split counts, bf16 and f32 output.
// Reference: fp64 CPU attention over the same rounded inputs.
// Bench: DeepSeek-V3 decode shapes, CUDA events, warm-up, median of 30, rotating input sets so the
// KV read is several times the 60 MB L2; a D2D memcpy ceiling measured in the same process. Each
// row is timed as FlashMLA's numbers were: the L2 flushed by a 256 MB memset before every call and
// the call queued behind it, so the events time the device's work, not the host's launch latency;
// "from idle" is the same call launched onto an idle device (the events then also hold the time
// from the host's first launch call to the kernel's start).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdarg>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "mla/batch.h"
#include "platform/cuda/mla_decode.h"
#ifdef MLA_SEESAW_TRACE
#include "platform/cuda/mla_decode_launch.h"
#endif
#include "platform/cuda/sm90.cuh"

using namespace mla::cuda;

namespace {

constexpr int kD = 576, kDv = 512;

void check(cudaError_t e, const char* what, const char* file, int line) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorString(e), file, line, what);
    std::exit(2);
  }
}
#define CK(x) check((x), #x, __FILE__, __LINE__)

FILE* g_out = nullptr;  // optional copy of everything printed
void say(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void say(const char* fmt, ...) {
  va_list a;
  va_start(a, fmt);
  char buf[4096];
  std::vsnprintf(buf, sizeof buf, fmt, a);
  va_end(a);
  std::fputs(buf, stdout);
  std::fflush(stdout);
  if (g_out) {
    std::fputs(buf, g_out);
    std::fflush(g_out);
  }
}

// ---- element conversions (host) ---------------------------------------------------------------
uint16_t f2bf(float f) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
float bf2f(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
float fp8_to_f(uint8_t c) {  // OCP e4m3fn, exact
  const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
  if (e == 15 && m == 7) return NAN;
  const float v = e == 0 ? std::ldexp(float(m) / 8.f, -6) : std::ldexp(1.f + float(m) / 8.f, e - 7);
  return s ? -v : v;
}
uint8_t f_to_fp8(float f) {  // nearest (ties to the even code), saturating
  static std::vector<float> table = [] {  // codes 0..126 are increasing
    std::vector<float> t(127);
    for (int c = 0; c < 127; ++c) t[c] = fp8_to_f(uint8_t(c));
    return t;
  }();
  const float a = std::fabs(f);
  int hi = int(std::lower_bound(table.begin(), table.end(), a) - table.begin());
  int best;
  if (hi >= 127) best = 126;
  else if (hi == 0) best = 0;
  else {
    const float dl = a - table[hi - 1], dh = table[hi] - a;
    best = dl < dh ? hi - 1 : dh < dl ? hi : ((hi & 1) ? hi - 1 : hi);
  }
  return uint8_t(best | (f < 0 ? 0x80 : 0));
}

// The e4m3 Q of the narrow fp8 kernel (mla_fast_rounds_q_to_e4m3): each packed row [576] times
// 2^k, k = 7 − ⌊log2 max|q|⌋ (clamped to ±100), rounded to e4m3fn, times 2^−k.
std::vector<float> q_rounded_to_e4m3(const std::vector<float>& q) {
  std::vector<float> out(q.size());
  for (size_t r = 0; r < q.size() / kD; ++r) {
    float mx = 0.f;
    for (int c = 0; c < kD; ++c) mx = std::max(mx, std::fabs(q[r * kD + c]));
    uint32_t bits;
    std::memcpy(&bits, &mx, 4);
    const int k = mx > 0.f && std::isfinite(mx) ? std::clamp(7 - (int((bits >> 23) & 0xff) - 127), -100, 100) : 0;
    for (int c = 0; c < kD; ++c)
      out[r * kD + c] = std::ldexp(fp8_to_f(f_to_fp8(std::ldexp(q[r * kD + c], k))), -k);
  }
  return out;
}

struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  float uni() { return float(next() >> 40) * (2.f / 16777216.f) - 1.f; }  // [-1, 1)
};

// ---- device helpers (bench data) --------------------------------------------------------------
__device__ uint32_t hash32(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return uint32_t(x);
}
__global__ void fill_bf16(uint16_t* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float v = float(hash32(seed * 0x100000001b3ull + i) >> 8) * (2.f / 16777216.f) - 1.f;
    uint32_t u = __float_as_uint(v);
    u += 0x7fffu + ((u >> 16) & 1u);
    p[i] = uint16_t(u >> 16);
  }
}
__global__ void fill_fp8(uint8_t* p, size_t n, uint64_t seed) {  // |v| in [2^-3, 2^3), never NaN
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint32_t h = hash32(seed * 0x100000001b3ull + i);
    p[i] = uint8_t((h & 0x80) | ((4 + (h >> 8) % 6) << 3) | ((h >> 16) & 7));
  }
}
// dst[i] = rows of src at slots[i] (row_bytes each)
__global__ void gather_rows(uint8_t* dst, const uint8_t* src, const int32_t* slots, int n, int row_bytes) {
  for (int i = blockIdx.x; i < n; i += gridDim.x)
    for (int b = threadIdx.x; b < row_bytes; b += blockDim.x)
      dst[size_t(i) * row_bytes + b] = src[size_t(slots[i]) * row_bytes + b];
}

// ---- problem description + fp64 reference ------------------------------------------------------
struct Problem {
  int H = 16;
  bool fp8 = false;
  bool causal = true;
  float scale = 0.1f;
  float kv_scale = 1.f;
  bool wide_q = false;  // Q row r × 2^{−24, −8, 0, 12, 20}[r mod 5]: past f16's range both ways
  int kv_shift = 0;     // bytes the pool starts past its allocation (a multiple of 16): rows off lines
  std::vector<int> q_len, k_len, q_start, k_start;
  int T = 0, max_q = 0, max_k = 0;
  int k_fill = 8;  // mla::kv_fill of the key lengths, as a step's plan gives it
  void finish() {
    const int B = int(q_len.size());
    q_start.assign(B, 0);
    k_start.assign(B, 0);
    T = 0;
    int ks = 0;
    for (int r = 0; r < B; ++r) {
      q_start[r] = T;
      k_start[r] = ks;
      T += q_len[r];
      ks += k_len[r];
    }
    max_q = *std::max_element(q_len.begin(), q_len.end());
    max_k = *std::max_element(k_len.begin(), k_len.end());
    k_fill = mla::kv_fill(ks, B, max_k);
  }
  int64_t total_k() const { return std::accumulate(k_len.begin(), k_len.end(), int64_t(0)); }
};

// Reference for the requests in `reqs`: q [T,H,576] (float), kvrow(r, j) → float row [576].
// Writes o_ref [T,H,512], lse_ref [T,H] (only rows of the listed requests).
template <class KvRow>
void reference(const Problem& pb, const std::vector<int>& reqs, const std::vector<float>& q, KvRow kvrow,
               std::vector<float>& o_ref, std::vector<float>& lse_ref) {
  struct Task {
    int r, i, h;
  };
  std::vector<Task> tasks;
  for (int r : reqs)
    for (int i = 0; i < pb.q_len[r]; ++i)
      for (int h = 0; h < pb.H; ++h) tasks.push_back({r, i, h});
  const int nth = std::max(1u, std::min(64u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (int t = 0; t < nth; ++t)
    pool.emplace_back([&, t] {
      std::vector<double> s, acc(kDv);
      for (size_t k = t; k < tasks.size(); k += nth) {
        const auto [r, i, h] = tasks[k];
        const size_t row = size_t(pb.q_start[r] + i) * pb.H + h;
        const float* qr = &q[row * kD];
        const int K = pb.k_len[r];
        const int lim = pb.causal ? std::min(K, K - pb.q_len[r] + i + 1) : K;
        if (lim <= 0) {
          std::fill(&o_ref[row * kDv], &o_ref[row * kDv] + kDv, 0.f);
          lse_ref[row] = -INFINITY;
          continue;
        }
        s.assign(lim, 0.0);
        double m = -INFINITY;
        for (int j = 0; j < lim; ++j) {
          const float* kr = kvrow(r, j);
          double d = 0;
          for (int c = 0; c < kD; ++c) d += double(qr[c]) * kr[c];
          s[j] = d * pb.scale;
          m = std::max(m, s[j]);
        }
        double l = 0;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int j = 0; j < lim; ++j) {
          const double pj = std::exp(s[j] - m);
          l += pj;
          const float* kr = kvrow(r, j);
          for (int c = 0; c < kDv; ++c) acc[c] += pj * kr[c];
        }
        for (int c = 0; c < kDv; ++c) o_ref[row * kDv + c] = float(acc[c] / l);
        lse_ref[row] = float(m + std::log(l));
      }
    });
  for (auto& th : pool) th.join();
}

struct Errors {
  double rel_l2 = 0, max_abs = 0, lse_err = 0;
  int64_t nan = 0, inf_mismatch = 0;
  bool pass(double tol_o, double tol_lse) const {
    return nan == 0 && inf_mismatch == 0 && rel_l2 <= tol_o && lse_err <= tol_lse;
  }
};
// Compare rows (token·H + head) of the listed requests.
Errors compare(const Problem& pb, const std::vector<int>& reqs, const std::vector<float>& o,
               const std::vector<float>& lse, const std::vector<float>& o_ref, const std::vector<float>& lse_ref) {
  Errors e;
  double num = 0, den = 0;
  for (int r : reqs)
    for (int i = 0; i < pb.q_len[r]; ++i)
      for (int h = 0; h < pb.H; ++h) {
        const size_t row = size_t(pb.q_start[r] + i) * pb.H + h;
        for (int c = 0; c < kDv; ++c) {
          const double a = o[row * kDv + c], b = o_ref[row * kDv + c];
          if (!std::isfinite(a)) {
            ++e.nan;
            continue;
          }
          num += (a - b) * (a - b);
          den += b * b;
          e.max_abs = std::max(e.max_abs, std::fabs(a - b));
        }
        const float a = lse[row], b = lse_ref[row];
        if (std::isinf(b) || std::isinf(a)) {
          if (!(std::isinf(a) && std::isinf(b) && a < 0 && b < 0)) ++e.inf_mismatch;
        } else if (std::isnan(a)) {
          ++e.nan;
        } else {
          e.lse_err = std::max(e.lse_err, double(std::fabs(a - b)));
        }
      }
  e.rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return e;
}

// mla::gpu::kGridCounterInts ints, zero between launches, in which a split see-saw grid merges its own
// partials and the persistent grid's parts raise their flags (MlaParams::grid_counters); every
// launch must leave them zero (checked after each test launch).
int32_t* g_grid_counters = nullptr;

MlaParams make_params(const Problem& pb, const void* q, const void* kv, const int32_t* slots,
                      const int32_t* seg, void* o, bool o_f32, float* lse, void* ws, size_t ws_bytes) {
  const int B = int(pb.q_len.size());
  MlaParams p{};
  p.q = q;
  p.q_elem = Elem::BF16;
  p.kv = kv;
  p.kv_elem = pb.fp8 ? Elem::FP8_E4M3FN : Elem::BF16;
  p.kv_scale = pb.kv_scale;
  p.kv_slots = slots;
  p.seg.q_start = seg;
  p.seg.q_len = seg + B;
  p.seg.k_start = seg + 2 * B;
  p.seg.k_len = seg + 3 * B;
  p.seg.num_requests = B;
  p.seg.max_q_len = pb.max_q;
  p.seg.max_k_len = pb.max_k;
  p.seg.total_q = pb.T;
  p.seg.causal = pb.causal;
  p.seg.k_fill = pb.k_fill;
  p.num_heads = pb.H;
  p.head_dim = kD;
  p.v_dim = kDv;
  p.softmax_scale = pb.scale;
  p.o = o;
  p.o_elem = o_f32 ? Elem::F32 : Elem::BF16;
  p.lse = lse;
  p.ws.ptr = ws;
  p.ws.bytes = ws_bytes;
  p.stream = nullptr;
  p.grid_counters = g_grid_counters;
  return p;
}

int g_sms = 132;
int g_failures = 0;
std::string g_case;  // --case SUBSTR[|SUBSTR...]: only the benchmark cases whose name holds one of them

bool case_wanted(const std::string& name) {
  if (g_case.empty()) return true;
  for (size_t b = 0;;) {
    const size_t e = g_case.find('|', b);
    const std::string part = g_case.substr(b, e == std::string::npos ? std::string::npos : e - b);
    if (!part.empty() && name.find(part) != std::string::npos) return true;
    if (e == std::string::npos) return false;
    b = e + 1;
  }
}
int g_base_variant = 0;  // MLA_TEST_FORCE_WIDE=1: 64-row tiles everywhere (fallback run); MLA_TEST_VARIANT bits

// ---- correctness tests ---------------------------------------------------------------------------
void run_test(const char* name, Problem pb, int page, uint64_t seed) {
  pb.finish();
  Rng rng{seed};
  const int B = int(pb.q_len.size());
  const int elt = pb.fp8 ? 1 : 2;
  const int row_bytes = kD * elt;
  // Pool: pages shuffled over twice the needed count (+3); every row not owned stays NaN.
  std::vector<int> pages_of(B);
  int64_t need_pages = 0;
  for (int r = 0; r < B; ++r) need_pages += (pb.k_len[r] + page - 1) / page;
  const int64_t pool_pages = 2 * need_pages + 3;
  std::vector<int64_t> perm(pool_pages);
  std::iota(perm.begin(), perm.end(), 0);
  for (int64_t i = pool_pages - 1; i > 0; --i) std::swap(perm[i], perm[rng.next() % uint64_t(i + 1)]);
  const int64_t pool_rows = pool_pages * page;
  std::vector<uint8_t> pool(size_t(pool_rows) * row_bytes);
  if (pb.fp8) {
    std::fill(pool.begin(), pool.end(), uint8_t(0xff));  // e4m3fn NaN
  } else {
    uint16_t* p16 = reinterpret_cast<uint16_t*>(pool.data());
    std::fill(p16, p16 + pool_rows * kD, uint16_t(0x7fc0));  // bf16 NaN
  }
  std::vector<int32_t> slots(pb.total_k());
  std::vector<float> kvf(slots.size() * kD);  // decoded (× kv_scale) rows, in request key order
  int64_t next_page = 0;
  for (int r = 0; r < B; ++r) {
    int64_t pg = -1;
    for (int j = 0; j < pb.k_len[r]; ++j) {
      if (j % page == 0) pg = perm[next_page++];
      const int64_t slot = pg * page + j % page;
      const size_t k = size_t(pb.k_start[r] + j);
      slots[k] = int32_t(slot);
      for (int c = 0; c < kD; ++c) {
        if (pb.fp8) {
          const uint8_t code = f_to_fp8(rng.uni() * 4.f);
          pool[size_t(slot) * row_bytes + c] = code;
          kvf[k * kD + c] = fp8_to_f(code) * pb.kv_scale;
        } else {
          const uint16_t b = f2bf(rng.uni());
          std::memcpy(&pool[size_t(slot) * row_bytes + 2 * c], &b, 2);
          kvf[k * kD + c] = bf2f(b);
        }
      }
    }
  }
  std::vector<uint16_t> q(size_t(pb.T) * pb.H * kD);
  std::vector<float> qf(q.size());
  for (size_t i = 0; i < q.size(); ++i) {
    constexpr int kExp[5] = {-24, -8, 0, 12, 20};
    q[i] = f2bf(pb.wide_q ? std::ldexp(rng.uni(), kExp[(i / kD) % 5]) : rng.uni());
    qf[i] = bf2f(q[i]);
  }
  const size_t rows = size_t(pb.T) * pb.H;
  std::vector<float> o_ref(rows * kDv, NAN), lse_ref(rows, NAN);
  std::vector<int> all(B);
  std::iota(all.begin(), all.end(), 0);
  const auto kvrow = [&](int r, int j) { return &kvf[size_t(pb.k_start[r] + j) * kD]; };
  reference(pb, all, qf, kvrow, o_ref, lse_ref);
  std::vector<float> o_ref8, lse_ref8;  // over Q rounded to e4m3, for the launches that round it

  // Device buffers
  std::vector<int32_t> seg;
  for (auto* v : {&pb.q_start, &pb.q_len, &pb.k_start, &pb.k_len}) seg.insert(seg.end(), v->begin(), v->end());
  void *d_q, *d_kv, *d_o, *d_ws = nullptr;
  int32_t *d_slots, *d_seg;
  float* d_lse;
  CK(cudaMalloc(&d_q, q.size() * 2));
  CK(cudaMalloc(&d_kv, pool.size() + pb.kv_shift));
  CK(cudaMalloc(&d_slots, std::max<size_t>(1, slots.size()) * 4));
  CK(cudaMalloc(&d_seg, seg.size() * 4));
  CK(cudaMalloc(&d_o, rows * kDv * 4));
  CK(cudaMalloc(&d_lse, rows * 4));
  const size_t ws_bytes = mla_fast_workspace_bytes(pb.T, pb.H, g_sms);
  if (ws_bytes) CK(cudaMalloc(&d_ws, ws_bytes));
  CK(cudaMemcpy(d_q, q.data(), q.size() * 2, cudaMemcpyHostToDevice));
  void* const d_pool = static_cast<uint8_t*>(d_kv) + pb.kv_shift;
  CK(cudaMemcpy(d_pool, pool.data(), pool.size(), cudaMemcpyHostToDevice));
  if (!slots.empty()) CK(cudaMemcpy(d_slots, slots.data(), slots.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_seg, seg.data(), seg.size() * 4, cudaMemcpyHostToDevice));

  struct Variant {
    const char* name;
    bool mma;
    int splits;
    bool f32;
    int variant;
  };
  // "wgmma": the production dispatch (narrow swap-AB kernel for ≤ 32 rows, else the 64-row see-saw
  // kernel); "wide": 64-row tiles forced; "splitS": the split-S 64-row kernel; "mma": its mma.sync
  // variant.
  // "combine": the combine kernel where the see-saw grid would merge its split partials itself;
  // its bits must equal the run before it (same kernel, same splits). "persist": the persistent
  // see-saw grid (64-row tiles), "classic": never it.
  std::vector<Variant> variants = {{"wgmma auto", false, 0, false, 0},
                                   {"wgmma auto combine", false, 0, false, 64},
                                   {"wgmma s=64", false, 64, false, 0},
                                   {"wgmma s=64 combine", false, 64, false, 64},
                                   {"wgmma s=64 f32", false, 64, true, 0},
                                   {"wgmma s=1", false, 1, false, 0},
                                   {"wgmma s=3 f32", false, 3, true, 0},
                                   {"wgmma persist", false, 0, false, 128},
                                   {"wgmma persist f32", false, 0, true, 128},
                                   {"wgmma classic", false, 0, false, 256},
                                   {"wide auto", false, 0, false, 8},
                                   {"splitS auto", false, 0, false, 8 | 16},
                                   {"splitS s=3 f32", false, 3, true, 8 | 16},
                                   {"mma auto", true, 0, false, 0},
                                   {"mma s=1 f32", true, 1, true, 0}};
  std::vector<uint8_t> prev_bits;  // the run before's o and lse bytes (bf16 output)
  for (size_t vi = 0; vi < variants.size(); ++vi) {
    const Variant v = variants[vi];
    CK(cudaMemset(d_o, 0xff, rows * kDv * 4));  // poison: NaN in bf16 and f32
    CK(cudaMemset(d_lse, 0xff, rows * 4));
    MlaParams p = make_params(pb, d_q, d_pool, d_slots, d_seg, d_o, v.f32, d_lse, d_ws, ws_bytes);
    if (!mla_fast_supports(p)) {
      say("  %-34s %-14s NOT SUPPORTED\n", name, v.name);
      ++g_failures;
      continue;
    }
    const MlaDecodeTuning tuning{v.splits, v.mma, v.variant | g_base_variant};
    const MlaDecodeSchedule sched = mla_fast_schedule(p, tuning);
    const bool q8 = mla_fast_rounds_q_to_e4m3(p, sched);
    if (q8 && o_ref8.empty()) {  // the reference over the Q this launch multiplies
      o_ref8.assign(rows * kDv, NAN);
      lse_ref8.assign(rows, NAN);
      reference(pb, all, q_rounded_to_e4m3(qf), kvrow, o_ref8, lse_ref8);
    }
    if ((v.variant & 128) && !sched.narrow && sched.row_tiles > 0 && sched.parts == 0) {
      say("  %-34s %-16s the persistent grid was asked for and not taken\n", name, v.name);
      ++g_failures;
    }
    const int used_splits = mla_attention_fast(p, sched, tuning);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    std::vector<float> o(rows * kDv), lse(rows);
    if (v.f32) {
      CK(cudaMemcpy(o.data(), d_o, rows * kDv * 4, cudaMemcpyDeviceToHost));
    } else {
      std::vector<uint16_t> ob(rows * kDv);
      CK(cudaMemcpy(ob.data(), d_o, rows * kDv * 2, cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < ob.size(); ++i) o[i] = bf2f(ob[i]);
    }
    CK(cudaMemcpy(lse.data(), d_lse, rows * 4, cudaMemcpyDeviceToHost));
    std::vector<int32_t> counters(mla::gpu::kGridCounterInts);
    CK(cudaMemcpy(counters.data(), g_grid_counters, counters.size() * 4, cudaMemcpyDeviceToHost));
    if (const auto it = std::find_if(counters.begin(), counters.end(), [](int32_t c) { return c != 0; });
        it != counters.end()) {
      say("  %-34s %-16s grid counter %d was left at %d (must be 0)\n", name, v.name, int(it - counters.begin()), *it);
      ++g_failures;
      CK(cudaMemset(g_grid_counters, 0, counters.size() * 4));
    }
    if (!v.f32) {
      std::vector<uint8_t> bits(rows * kDv * 2 + rows * 4);
      CK(cudaMemcpy(bits.data(), d_o, rows * kDv * 2, cudaMemcpyDeviceToHost));
      std::memcpy(bits.data() + rows * kDv * 2, lse.data(), rows * 4);
      if (std::strstr(v.name, "combine") && bits != prev_bits) {
        say("  %-34s %-16s output bits differ from the in-grid merge's (the run before)\n", name, v.name);
        ++g_failures;
      }
      prev_bits = std::move(bits);
    }
    const Errors e = compare(pb, all, o, lse, q8 ? o_ref8 : o_ref, q8 ? lse_ref8 : lse_ref);
    const bool ok = e.pass(1e-2, 1e-3);
    if (!ok && (v.variant & 7) == 0) ++g_failures;
    say("  %-34s %-16s s=%-3d p=%-3d relL2 %.2e  maxabs %.2e  lse %.2e  nan %lld  -inf-mismatch %lld  %s\n", name,
        v.name, used_splits, sched.parts, e.rel_l2, e.max_abs, e.lse_err, (long long)e.nan, (long long)e.inf_mismatch,
        ok ? "ok" : (v.variant & 7) ? "fail (diagnostic)" : "FAIL");
    if (q8) {  // what rounding Q costs: the same output against the bf16-Q reference (not judged)
      const Errors eq = compare(pb, all, o, lse, o_ref, lse_ref);
      say("  %-34s %-16s       against the bf16-Q reference: relL2 %.2e  lse %.2e\n", name, v.name, eq.rel_l2,
          eq.lse_err);
    }
    // A failing wgmma run: localize it (S or P·V product, V descriptor strides) a few times.
    static int diagnostics = 0;
    if (!ok && vi == 0 && !pb.fp8 && diagnostics < 3) {
      ++diagnostics;
      variants.push_back({"diag wgS+mmaPV", false, 0, false, 2});
      variants.push_back({"diag mmaS+wgPV", false, 0, false, 4});
      variants.push_back({"diag mmaS+wgPV'", false, 0, false, 5});
      variants.push_back({"diag wgmma V'", false, 0, false, 1});
    }
  }
  CK(cudaFree(d_q));
  CK(cudaFree(d_kv));
  CK(cudaFree(d_slots));
  CK(cudaFree(d_seg));
  CK(cudaFree(d_o));
  CK(cudaFree(d_lse));
  if (d_ws) CK(cudaFree(d_ws));
}

bool g_quick = false;  // sanitizer runs: small cases only

// Every e4m3fn code through the widening's integer-op conversion (sm90::e4m3x2_to_bf16x2): out[c]
// = the code in both bf16 halves, taken from bytes 2 and 7 of the pair (a, b), the other bytes set.
__global__ void fp8_to_bf16_every_code(uint32_t* out) {
  const uint32_t c = threadIdx.x, a = 0x5A0000C3u | c << 16, b = c << 24 | 0x11A5EEu;
  out[c] = sm90::e4m3x2_to_bf16x2<2, 7>(a, b);
}

void test_fp8_to_bf16() {
  uint32_t* d;
  CK(cudaMalloc(&d, 256 * 4));
  fp8_to_bf16_every_code<<<1, 256>>>(d);
  std::vector<uint32_t> h(256);
  CK(cudaMemcpy(h.data(), d, 256 * 4, cudaMemcpyDeviceToHost));
  CK(cudaFree(d));
  int bad = 0;
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;  // NaN
    const float want = fp8_to_f(uint8_t(c));
    for (int half = 0; half < 2; ++half) {
      const uint32_t u = (h[c] >> (16 * half)) << 16;
      float got;
      std::memcpy(&got, &u, 4);
      // the bits too: -0 stays -0
      if (got != want || std::signbit(got) != std::signbit(want)) {
        if (++bad <= 4) say("  fp8 code 0x%02x → bf16 %g, want %g\n", c, got, want);
      }
    }
  }
  say("  %-44s %s\n", "e4m3 → bf16 by integer ops, every code", bad ? "FAIL" : "ok");
  if (bad) ++g_failures;
}

void run_tests() {
  say("== correctness (fp64 CPU reference; pass: rel L2 <= 1e-2, |lse err| <= 1e-3, no NaN)\n");
  test_fp8_to_bf16();
  const std::vector<int> primes = {2, 67, 331, 1031, 2053};
  uint64_t seed = 1;
  for (int H : {1, 16, 128})
    for (int ql : {1, 4})
      if (!g_quick || H <= 16)
      for (bool fp8 : {false, true})
        for (int page : {1, 64}) {
          Problem pb;
          pb.H = H;
          pb.fp8 = fp8;
          pb.kv_scale = fp8 ? 0.25f : 1.f;
          pb.scale = 0.12f;
          pb.k_len = primes;
          pb.q_len.assign(primes.size(), ql);
          char name[96];
          std::snprintf(name, sizeof name, "H%d q%d %s page%d", H, ql, fp8 ? "fp8 " : "bf16", page);
          run_test(name, pb, page, seed++);
        }
  // Mixed query lengths, up to 8 tokens (16 row tiles at H 128), a 64-multiple length.
  for (int H : {16, 128}) {
    Problem pb;
    pb.H = H;
    pb.q_len = {1, 4, 2, 8, 3};
    pb.k_len = {5, 97, 257, 1031, 64};
    pb.scale = 0.12f;
    char name[96];
    std::snprintf(name, sizeof name, "H%d mixed q bf16 page64", H);
    run_test(name, pb, 64, seed++);
  }
  // Narrow (swap-AB) tiles: 32 rows (16 heads × 2 tokens, 32 heads, 8 heads × mixed tokens), 8 rows.
  for (bool fp8 : {false, true})
    for (int page : {1, 64}) {
      Problem pb;
      pb.H = 16;
      pb.fp8 = fp8;
      pb.kv_scale = fp8 ? 0.25f : 1.f;
      pb.scale = 0.12f;
      pb.k_len = primes;
      pb.q_len.assign(primes.size(), 2);
      char name[96];
      std::snprintf(name, sizeof name, "H16 q2 %s page%d", fp8 ? "fp8 " : "bf16", page);
      run_test(name, pb, page, seed++);
    }
  {
    Problem pb;
    pb.H = 32;
    pb.q_len.assign(primes.size(), 1);
    pb.k_len = primes;
    pb.scale = 0.12f;
    run_test("H32 q1 bf16 page64", pb, 64, seed++);
  }
  {
    Problem pb;
    pb.H = 8;
    pb.q_len = {1, 4, 2, 3, 4};
    pb.k_len = {3, 97, 257, 1031, 64};
    pb.scale = 0.12f;
    run_test("H8 mixed q bf16 page1", pb, 1, seed++);
  }
  {
    Problem pb;
    pb.H = 2;
    pb.fp8 = true;
    pb.kv_scale = 0.5f;
    pb.causal = false;
    pb.q_len = {3, 1, 4};
    pb.k_len = {13, 1, 509};
    pb.scale = 0.12f;
    run_test("H2 noncausal fp8 page64", pb, 64, seed++);
  }
  {  // non-causal, fp8
    Problem pb;
    pb.H = 16;
    pb.fp8 = true;
    pb.kv_scale = 0.5f;
    pb.causal = false;
    pb.q_len = {3, 1, 2};
    pb.k_len = {13, 1, 509};
    pb.scale = 0.12f;
    run_test("H16 noncausal fp8 page1", pb, 1, seed++);
  }
  for (bool fp8 : {false, true}) {  // a pool 16 bytes past a 128-byte line: rows start at every 16-byte
    // unit of a line (page 1: slots of both parities), the fp8 raw kernel's 6-line case included
    Problem pb;
    pb.H = 16;
    pb.fp8 = fp8;
    pb.kv_scale = fp8 ? 0.5f : 1.f;  // (a bf16 pool has no scale)
    pb.kv_shift = 16;
    pb.q_len = {1, 1, 1};
    pb.k_len = {130, 1, 517};
    run_test(fp8 ? "H16 fp8 pool +16 bytes page1" : "H16 bf16 pool +16 bytes page1", pb, 1, seed++);
  }
  for (bool fp8 : {false, true}) {  // Q rows far past f16's range (the f16 fp8 kernels scale each row)
    Problem pb;
    pb.H = 16;
    pb.fp8 = fp8;
    pb.kv_scale = fp8 ? 0.25f : 1.f;
    pb.wide_q = true;
    pb.scale = 1e-7f;  // S · scale of order 1 on the 2^20 rows
    pb.q_len = {1, 1, 1};  // 16 rows a request: the 16-row kernel (one 2-token request would make it 32)
    pb.k_len = {77, 1000, 300};
    run_test(fp8 ? "H16 wide-range Q fp8 page16" : "H16 wide-range Q bf16 page16", pb, 16, seed++);
    pb.H = 128;  // the 64-row see-saw kernel
    pb.q_len = {1, 2};
    pb.k_len = {77, 1000};
    run_test(fp8 ? "H128 wide-range Q fp8 page16" : "H128 wide-range Q bf16 page16", pb, 16, seed++);
  }
  {  // the persistent grid's edges: requests without keys first, between and last (the last part
     // takes position N), a request shorter than a part and one cut over several parts
    Problem pb;
    pb.H = 128;
    pb.q_len = {1, 1, 2, 1, 1, 1};
    pb.k_len = {0, 64, 1, 0, 4097, 0};
    pb.scale = 0.12f;
    run_test("H128 keyless requests bf16 page64", pb, 64, seed++);
  }
  if (!g_quick) {  // more requests than a CTA has threads (the parts' start found chunk by chunk)
    Problem pb;
    pb.H = 128;
    Rng rng{99};
    for (int r = 0; r < 300; ++r) {
      pb.q_len.push_back(1);
      pb.k_len.push_back(1 + int(rng.next() % 130));
    }
    pb.scale = 0.12f;
    run_test("H128 300 requests bf16 page16", pb, 16, seed++);
  }
  if (!g_quick) {  // one long request: many splits (the see-saw grid merges them itself)
    for (bool fp8 : {false, true}) {
      Problem pb;
      pb.H = 128;
      pb.fp8 = fp8;
      pb.kv_scale = fp8 ? 0.5f : 1.f;
      pb.q_len = {1};
      pb.k_len = {16381};
      pb.scale = 0.12f;
      run_test(fp8 ? "H128 1 request 16381 keys fp8 page64" : "H128 1 request 16381 keys page64", pb, 64, seed++);
    }
    Problem pb;  // two requests of one 64-row tile each: 2 × 64 CTAs at 64 splits
    pb.H = 64;
    pb.q_len = {1, 1};
    pb.k_len = {8000, 5001};
    pb.scale = 0.12f;
    run_test("H64 2 requests 8000 keys page16", pb, 16, seed++);
  }
}

// ---- benchmark -------------------------------------------------------------------------------------
// From idle: each call launched onto an idle device, its events around it, then waited for.
template <class F>
float median_ms(F&& launch, int warm, int iters) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < warm; ++i) launch(i);
  CK(cudaDeviceSynchronize());
  std::vector<float> t(iters);
  for (int i = 0; i < iters; ++i) {
    CK(cudaEventRecord(a));
    launch(warm + i);
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    CK(cudaEventElapsedTime(&t[i], a, b));
  }
  CK(cudaGetLastError());
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[iters / 2];
}

// Queued: before each call a 256 MB memset (about 4× the L2) evicts the L2 and keeps the device busy
// while the host queues the call and its events; all calls are queued, then waited for once.
template <class F>
float queued_ms(F&& launch, int warm, int iters) {
  static void* flush = nullptr;
  constexpr size_t kFlushBytes = size_t(256) << 20;
  if (!flush) CK(cudaMalloc(&flush, kFlushBytes));
  for (int i = 0; i < warm; ++i) launch(i);
  CK(cudaDeviceSynchronize());
  std::vector<cudaEvent_t> a(iters), b(iters);
  for (int i = 0; i < iters; ++i) {
    CK(cudaEventCreate(&a[i]));
    CK(cudaEventCreate(&b[i]));
  }
  for (int i = 0; i < iters; ++i) {
    CK(cudaMemsetAsync(flush, 0, kFlushBytes));
    CK(cudaEventRecord(a[i]));
    launch(warm + i);
    CK(cudaEventRecord(b[i]));
  }
  CK(cudaDeviceSynchronize());
  CK(cudaGetLastError());
  std::vector<float> t(iters);
  for (int i = 0; i < iters; ++i) {
    CK(cudaEventElapsedTime(&t[i], a[i], b[i]));
    CK(cudaEventDestroy(a[i]));
    CK(cudaEventDestroy(b[i]));
  }
  std::sort(t.begin(), t.end());
  return t[iters / 2];
}

double g_copy_gbs = 0;

void bench_copy() {
  const size_t n = size_t(1) << 30;
  void *a, *b;
  CK(cudaMalloc(&a, n));
  CK(cudaMalloc(&b, n));
  CK(cudaMemset(a, 1, n));
  const float ms = median_ms([&](int) { CK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice)); }, 3, 20);
  g_copy_gbs = 2.0 * n / (ms * 1e-3) / 1e9;
  say("== D2D cudaMemcpy 1 GiB: %.1f us, %.0f GB/s (read + write)\n", ms * 1e3, g_copy_gbs);
  CK(cudaFree(a));
  CK(cudaFree(b));
}

struct BenchCase {
  const char* name;
  int H, B, s_q, s_k;
  bool fp8;
  bool mma;
  int variant = 0;  // tuning bits (8: 64-row tiles forced, 16: split-S, 32: plain combine launch)
  int splits = 0;   // > 0: this KV split count, not the heuristic's
  // > 0: key lengths drawn uniformly from whole 64-key pages in s_k·(1 ± spread), mean s_k (1: 64,
  // 128, …, 2·s_k − 64); the batch's fill (Σ k_len over B · longest) is about 1 / (1 + spread).
  float spread = 0;
  bool tail = false;  // one request (the middle one) at 4·s_k keys, the others at s_k
};


#ifdef MLA_SEESAW_TRACE
// A trace build (-DMLA_SEESAW_TRACE): one queued call (after the L2 flush, as timed) of the row,
// then where its see-saw CTAs spent their time: per point, the median and largest time since the
// CTA's own start (clock64 at the SM's clock, and %globaltimer), the CTAs' start spread, the span.
template <class F>
void trace_row(const char* name, F&& launch) {
  using namespace mla::cuda::mla_decode;
  static void* flush = nullptr;
  constexpr size_t kFlushBytes = size_t(256) << 20;
  if (!flush) CK(cudaMalloc(&flush, kFlushBytes));
  std::vector<unsigned long long> tr(size_t(kTraceCtas) * kTraceSlots);
  int clock_khz = 0;
  CK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  std::vector<unsigned long long> ctr(size_t(kTraceCtas) * 3);
  for (int rep = 0; rep < 2; ++rep) {
    seesaw_trace_take(tr.data());  // clears
    combine_trace_take(ctr.data());
    cudaEvent_t ev0, ev1;
    CK(cudaEventCreate(&ev0));
    CK(cudaEventCreate(&ev1));
    CK(cudaMemsetAsync(flush, 0, kFlushBytes));
    CK(cudaEventRecord(ev0));
    launch(0);
    CK(cudaEventRecord(ev1));
    CK(cudaEventSynchronize(ev1));
    float ev_ms = 0;
    CK(cudaEventElapsedTime(&ev_ms, ev0, ev1));
    CK(cudaEventDestroy(ev0));
    CK(cudaEventDestroy(ev1));
    seesaw_trace_take(tr.data());
    combine_trace_take(ctr.data());
    struct Cta { unsigned long long g[2][kTracePoints], c[2][kTracePoints]; };
    std::vector<Cta> ctas;
    std::vector<int> sms;
    for (int i = 0; i < kTraceCtas; ++i) {
      const unsigned long long* r = &tr[size_t(i) * kTraceSlots];
      if (!r[kTraceSlots - 1]) continue;
      Cta c{};
      for (int wg = 0; wg < 2; ++wg)
        for (int pt = 0; pt < kTracePoints; ++pt) {
          c.g[wg][pt] = r[2 * (wg * kTracePoints + pt)];
          c.c[wg][pt] = r[2 * (wg * kTracePoints + pt) + 1];
        }
      ctas.push_back(c);
      sms.push_back(int(r[kTraceSlots - 1]) - 1);
    }
    if (ctas.empty()) { say("  trace %s: no see-saw CTA recorded\n", name); return; }
    unsigned long long g0 = ~0ull, g0max = 0, gend = 0;
    for (const Cta& c : ctas) {
      g0 = std::min(g0, c.g[0][kTraceEntry]);
      g0max = std::max(g0max, c.g[0][kTraceEntry]);
      gend = std::max({gend, c.g[0][kTraceEnd], c.g[1][kTraceEnd], c.g[0][kTraceMerged]});
    }
    std::sort(sms.begin(), sms.end());
    const int distinct = int(std::unique(sms.begin(), sms.end()) - sms.begin());
    say("  trace %s (round %d): %zu CTAs on %d SMs, starts spread %.2f us, span %.2f us (globaltimer); "
        "since the CTA's start, median / max, us (clock64 at %.0f MHz | globaltimer):\n",
        name, rep, ctas.size(), distinct, (g0max - g0) * 1e-3, (gend - g0) * 1e-3, clock_khz * 1e-3);
    {  // the combine's CTAs against the see-saw grid's first start (globaltimer)
      std::vector<double> st, wt, en;
      for (int i = 0; i < kTraceCtas; ++i)
        if (ctr[3 * i + 2]) {
          st.push_back((double(ctr[3 * i]) - double(g0)) * 1e-3);
          wt.push_back((double(ctr[3 * i + 1]) - double(g0)) * 1e-3);
          en.push_back((double(ctr[3 * i + 2]) - double(g0)) * 1e-3);
        }
      std::sort(st.begin(), st.end());
      std::sort(wt.begin(), wt.end());
      std::sort(en.begin(), en.end());
      if (!st.empty())
        say("    combine: %zu CTAs; start %.2f .. %.2f, past its wait %.2f .. %.2f, end %.2f .. %.2f (median %.2f) us "
            "after the first see-saw start; the call's events %.2f us\n",
            st.size(), st.front(), st.back(), wt.front(), wt.back(), en.front(), en.back(), en[en.size() / 2],
            ev_ms * 1e3);
      else say("    combine: none recorded; the call's events %.2f us\n", ev_ms * 1e3);
    }
    static const char* names[kTracePoints] = {"entry", "work", "Q + first copies issued", "first S",
                                              "pair 0", "pair 1", "pair 2", "pair 3", "pair 4", "pair 5",
                                              "pair 6", "pair 7", "before store", "stored",
                                              "grid arrived", "merged"};
    for (int pt = 1; pt < kTracePoints; ++pt)
      for (int wg = 0; wg < 2; ++wg) {
        std::vector<double> dc, dg;
        for (const Cta& c : ctas)
          if (c.c[wg][pt]) {
            dc.push_back(double(c.c[wg][pt] - c.c[wg][kTraceEntry]) / (clock_khz * 1e-3));
            dg.push_back(double(c.g[wg][pt] - c.g[wg][kTraceEntry]) * 1e-3);
          }
        if (dc.empty()) continue;
        std::sort(dc.begin(), dc.end());
        std::sort(dg.begin(), dg.end());
        say("    wg%d %-24s %7.2f / %7.2f | %7.2f / %7.2f   (%zu CTAs)\n", wg, names[pt], dc[dc.size() / 2],
            dc.back(), dg[dg.size() / 2], dg.back(), dc.size());
      }
  }
}
#endif

void run_bench(const BenchCase& bc) {
  Problem pb;
  pb.H = bc.H;
  pb.fp8 = bc.fp8;
  pb.kv_scale = bc.fp8 ? 0.125f : 1.f;
  pb.scale = 1.f / std::sqrt(192.f);
  pb.q_len.assign(bc.B, bc.s_q);
  pb.k_len.assign(bc.B, bc.s_k);
  if (bc.spread > 0) {  // whole pages (the pool below is built of 64-key pages), the same draw every run
    Rng lengths{77};
    const int lo = std::max(1, int(std::lround(bc.s_k * (1 - bc.spread) / 64))), hi = 2 * (bc.s_k / 64) - lo;
    for (int& k : pb.k_len) k = 64 * (lo + int(lengths.next() % uint64_t(hi - lo + 1)));
  }
  if (bc.tail) pb.k_len[bc.B / 2] = 4 * bc.s_k;
  pb.finish();
  const int elt = bc.fp8 ? 1 : 2;
  const size_t row_bytes = size_t(kD) * elt;
  const int64_t keys = pb.total_k();
  const size_t kv_bytes = size_t(keys) * row_bytes;
  const int nsets = int(std::clamp<size_t>((180ull << 20) / kv_bytes + 1, 2, 16));  // ≥ 3× L2 in total
  const size_t rows = size_t(pb.T) * pb.H;
  std::vector<int32_t> seg;
  for (auto* v : {&pb.q_start, &pb.q_len, &pb.k_start, &pb.k_len}) seg.insert(seg.end(), v->begin(), v->end());
  int32_t* d_seg;
  CK(cudaMalloc(&d_seg, seg.size() * 4));
  CK(cudaMemcpy(d_seg, seg.data(), seg.size() * 4, cudaMemcpyHostToDevice));
  struct Set {
    void* q;
    void* kv;
    int32_t* slots;
    std::vector<int32_t> h_slots;
  };
  std::vector<Set> sets(nsets);
  Rng rng{1234};
  for (int s = 0; s < nsets; ++s) {
    Set& st = sets[s];
    CK(cudaMalloc(&st.q, rows * kD * 2));
    CK(cudaMalloc(&st.kv, kv_bytes));
    CK(cudaMalloc(&st.slots, keys * 4));
    fill_bf16<<<1024, 256>>>(static_cast<uint16_t*>(st.q), rows * kD, 100 + s);
    if (bc.fp8) fill_fp8<<<4096, 256>>>(static_cast<uint8_t*>(st.kv), kv_bytes, 200 + s);
    else fill_bf16<<<4096, 256>>>(static_cast<uint16_t*>(st.kv), kv_bytes / 2, 200 + s);
    CK(cudaGetLastError());
    // 64-token pages, shuffled over the pool (pool = exactly the needed pages)
    const int64_t npages = keys / 64;
    std::vector<int64_t> perm(npages);
    std::iota(perm.begin(), perm.end(), 0);
    for (int64_t i = npages - 1; i > 0; --i) std::swap(perm[i], perm[rng.next() % uint64_t(i + 1)]);
    st.h_slots.resize(keys);
    for (int64_t k = 0; k < keys; ++k) st.h_slots[k] = int32_t(perm[k / 64] * 64 + k % 64);
    CK(cudaMemcpy(st.slots, st.h_slots.data(), keys * 4, cudaMemcpyHostToDevice));
  }
  void* d_o;
  float* d_lse;
  void* d_ws = nullptr;
  CK(cudaMalloc(&d_o, rows * kDv * 2));
  CK(cudaMalloc(&d_lse, rows * 4));
  const size_t ws_bytes = mla_fast_workspace_bytes(pb.T, pb.H, g_sms);
  if (ws_bytes) CK(cudaMalloc(&d_ws, ws_bytes));
  const MlaDecodeTuning tuning{bc.splits, bc.mma, bc.variant | g_base_variant};
  int used_splits = 0, used_parts = 0;  // used_parts: the persistent grid's parts (0: not taken)
  bool q8 = false;  // the launch rounds Q to e4m3: the check's reference does too
  auto launch = [&](int i) {
    const Set& st = sets[i % nsets];
    MlaParams p = make_params(pb, st.q, st.kv, st.slots, d_seg, d_o, false, d_lse, d_ws, ws_bytes);
    const MlaDecodeSchedule sched = mla_fast_schedule(p, tuning);
    q8 = mla_fast_rounds_q_to_e4m3(p, sched);
    used_splits = mla_attention_fast(p, sched, tuning);
    used_parts = sched.parts;
  };
  const float ms = queued_ms(launch, 3, 30);
  const float ms2 = queued_ms(launch, 1, 30);  // second measurement: spread
  const float ms_idle = median_ms(launch, 1, 30);
#ifdef MLA_SEESAW_TRACE
  trace_row(bc.name, launch);
#endif

  // Check two requests of the last set launched against the CPU reference.
  {
    const int last = (1 + 30 - 1) % nsets;
    const Set& st = sets[last];
    launch(last);
    CK(cudaDeviceSynchronize());
    std::vector<int> reqs = {0, bc.B - 1};
    if (bc.B == 1) reqs = {0};
    std::vector<uint16_t> qh(rows * kD), oh(rows * kDv);
    std::vector<float> lse(rows);
    CK(cudaMemcpy(qh.data(), st.q, qh.size() * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(oh.data(), d_o, oh.size() * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(lse.data(), d_lse, rows * 4, cudaMemcpyDeviceToHost));
    std::vector<float> qf(qh.size()), of(oh.size());
    for (size_t i = 0; i < qh.size(); ++i) qf[i] = bf2f(qh[i]);
    for (size_t i = 0; i < oh.size(); ++i) of[i] = bf2f(oh[i]);
    // gather each checked request's KV rows
    std::vector<std::vector<float>> kvr(bc.B);
    uint8_t* d_g;
    CK(cudaMalloc(&d_g, size_t(pb.max_k) * row_bytes));
    for (int r : reqs) {
      const int kr = pb.k_len[r];
      gather_rows<<<512, 128>>>(d_g, static_cast<const uint8_t*>(st.kv), st.slots + pb.k_start[r], kr, int(row_bytes));
      CK(cudaGetLastError());
      std::vector<uint8_t> raw(size_t(kr) * row_bytes);
      CK(cudaMemcpy(raw.data(), d_g, raw.size(), cudaMemcpyDeviceToHost));
      auto& v = kvr[r];
      v.resize(size_t(kr) * kD);
      for (size_t i = 0; i < v.size(); ++i) {
        if (bc.fp8) v[i] = fp8_to_f(raw[i]) * pb.kv_scale;
        else {
          uint16_t b;
          std::memcpy(&b, &raw[2 * i], 2);
          v[i] = bf2f(b);
        }
      }
    }
    CK(cudaFree(d_g));
    std::vector<float> o_ref(rows * kDv), lse_ref(rows);
    reference(pb, reqs, q8 ? q_rounded_to_e4m3(qf) : qf, [&](int r, int j) { return &kvr[r][size_t(j) * kD]; },
              o_ref, lse_ref);
    const Errors e = compare(pb, reqs, of, lse, o_ref, lse_ref);
    const bool ok = e.pass(1e-2, 1e-3);
    if (!ok) ++g_failures;
    const double flops = 2.0 * bc.s_q * bc.H * double(keys) * (kD + kDv);  // keys: Σ k_len
    const double bytes = double(kv_bytes) + double(rows) * (kD + kDv) * 2;
    const double t = ms * 1e-3;
    say("  %-30s %8.1f us (again %8.1f, from idle %8.1f)  %6.1f TFLOP/s  %6.0f GB/s  %5.1f%% of copy  [splits %d, parts %d, %d sets; check relL2 %.1e lse %.1e %s]\n",
        bc.name, ms * 1e3, ms2 * 1e3, ms_idle * 1e3, flops / t / 1e12, bytes / t / 1e9, 100.0 * bytes / t / 1e9 / g_copy_gbs,
        used_splits, used_parts, nsets, e.rel_l2, e.lse_err, ok ? "ok" : "FAIL");
  }
  for (Set& st : sets) {
    CK(cudaFree(st.q));
    CK(cudaFree(st.kv));
    CK(cudaFree(st.slots));
  }
  CK(cudaFree(d_seg));
  CK(cudaFree(d_o));
  CK(cudaFree(d_lse));
  if (d_ws) CK(cudaFree(d_ws));
}

void run_benches() {
  bench_copy();
  say("== fast MLA decode (FLOPs = 2·b·s_q·h·s_k·1088; bytes = KV + Q + O)\n");
  const BenchCase cases[] = {
      {"h128 b128 sq1 sk4096 bf16", 128, 128, 1, 4096, false, false},
      {"h16  b128 sq1 sk4096 bf16", 16, 128, 1, 4096, false, false},
      {"h16  b128 sq1 sk4096 bf16 wide", 16, 128, 1, 4096, false, false, 8},
      {"h128 b128 sq2 sk4096 bf16", 128, 128, 2, 4096, false, false},
      {"h16  b128 sq2 sk4096 bf16", 16, 128, 2, 4096, false, false},
      {"h16  b128 sq4 sk4096 bf16", 16, 128, 4, 4096, false, false},
      {"h128 b1   sq1 sk16384 bf16", 128, 1, 1, 16384, false, false},
      {"h16  b1   sq1 sk16384 bf16", 16, 1, 1, 16384, false, false},
      {"h16  b128 sq1 sk16384 bf16", 16, 128, 1, 16384, false, false},
      {"h128 b128 sq1 sk4096 fp8", 128, 128, 1, 4096, true, false},
      {"h16  b128 sq1 sk4096 fp8", 16, 128, 1, 4096, true, false},
      {"h16  b128 sq1 sk4096 fp8 wide", 16, 128, 1, 4096, true, false, 8},
      {"h16  b1   sq1 sk16384 fp8", 16, 1, 1, 16384, true, false},
      {"h64  b128 sq1 sk4096 bf16", 64, 128, 1, 4096, false, false},
      {"h64  b128 sq1 sk4096 bf16 splitS", 64, 128, 1, 4096, false, false, 16},
      {"h64  b128 sq1 sk4096 fp8", 64, 128, 1, 4096, true, false},
      {"h128 b128 sq1 sk4096 bf16 splitS", 128, 128, 1, 4096, false, false, 16},
      {"h128 b128 sq2 sk4096 bf16 splitS", 128, 128, 2, 4096, false, false, 16},
      {"h128 b128 sq1 sk4096 fp8 splitS", 128, 128, 1, 4096, true, false, 16},
      {"h128 b128 sq1 sk1024 bf16", 128, 128, 1, 1024, false, false},
      // the b128 s4096 work in one wave of 128 CTAs (two CTAs an SM there): the difference is one
      // CTA's fixed cost (its start, Q, the first tiles' latency, the output) plus the second wave's
      {"h128 b64  sq1 sk8192 bf16", 128, 64, 1, 8192, false, false},
      {"h128 b64  sq1 sk8192 fp8", 128, 64, 1, 8192, true, false},
      {"h128 b16  sq1 sk4096 bf16", 128, 16, 1, 4096, false, false},
      // key lengths 64 … 8128 (mean 4096): where an even split of the tiles matters most
      {"h128 b128 sq1 sk4096 bf16 ragged", 128, 128, 1, 4096, false, false, 0, 0, 1.f},
      {"h128 b32  sq1 sk4096 bf16 ragged", 128, 32, 1, 4096, false, false, 0, 0, 1.f},
      // the spread of the lengths against the grid that pays (the persistent grid's dispatch rule)
      {"h128 b128 sq1 sk4096 bf16 spread .25", 128, 128, 1, 4096, false, false, 0, 0, .25f},
      {"h128 b128 sq1 sk4096 bf16 spread .5", 128, 128, 1, 4096, false, false, 0, 0, .5f},
      {"h128 b128 sq1 sk4096 bf16 tail", 128, 128, 1, 4096, false, false, 0, 0, 0, true},
      {"h128 b64  sq1 sk4096 bf16 even", 128, 64, 1, 4096, false, false},
      {"h128 b64  sq1 sk4096 bf16 spread .25", 128, 64, 1, 4096, false, false, 0, 0, .25f},
      {"h128 b64  sq1 sk4096 bf16 spread .5", 128, 64, 1, 4096, false, false, 0, 0, .5f},
      {"h128 b64  sq1 sk4096 bf16 ragged", 128, 64, 1, 4096, false, false, 0, 0, 1.f},
      {"h128 b64  sq1 sk4096 bf16 tail", 128, 64, 1, 4096, false, false, 0, 0, 0, true},
      {"h128 b32  sq1 sk4096 bf16 even", 128, 32, 1, 4096, false, false},
      {"h128 b32  sq1 sk4096 bf16 spread .25", 128, 32, 1, 4096, false, false, 0, 0, .25f},
      {"h128 b32  sq1 sk4096 bf16 spread .5", 128, 32, 1, 4096, false, false, 0, 0, .5f},
      {"h128 b32  sq1 sk4096 bf16 tail", 128, 32, 1, 4096, false, false, 0, 0, 0, true},
      {"h128 b256 sq1 sk2048 bf16 even", 128, 256, 1, 2048, false, false},
      {"h128 b256 sq1 sk2048 bf16 spread .5", 128, 256, 1, 2048, false, false, 0, 0, .5f},
      {"h128 b256 sq1 sk2048 bf16 ragged", 128, 256, 1, 2048, false, false, 0, 0, 1.f},
      {"h128 b128 sq1 sk4096 fp8 ragged", 128, 128, 1, 4096, true, false, 0, 0, 1.f},
      {"h128 b128 sq2 sk4096 bf16 ragged", 128, 128, 2, 4096, false, false, 0, 0, 1.f},
      {"h128 b16  sq1 sk4096 bf16 ragged", 128, 16, 1, 4096, false, false, 0, 0, 1.f},
      {"h128 b8   sq1 sk4096 bf16 ragged", 128, 8, 1, 4096, false, false, 0, 0, 1.f},
      {"h128 b4   sq1 sk4096 bf16 ragged", 128, 4, 1, 4096, false, false, 0, 0, 1.f},
      {"h128 b4   sq1 sk4096 bf16 tail", 128, 4, 1, 4096, false, false, 0, 0, 0, true},
      {"h128 b128 sq1 sk4096 bf16 mma", 128, 128, 1, 4096, false, true},
      // the combine launched plainly (tuning bit 32), not as a programmatic dependent
      {"h128 b1   sq1 sk16384 bf16 plain combine", 128, 1, 1, 16384, false, false, 32},
      {"h16  b1   sq1 sk16384 bf16 plain combine", 16, 1, 1, 16384, false, false, 32},
      {"h128 b16  sq1 sk4096 bf16 plain combine", 128, 16, 1, 4096, false, false, 32},
      // the combine kernel where the see-saw grid would merge its split partials itself (bit 64)
      {"h128 b1   sq1 sk16384 bf16 combine kernel", 128, 1, 1, 16384, false, false, 64},
      {"h128 b16  sq1 sk4096 bf16 combine kernel", 128, 16, 1, 4096, false, false, 64},
      {"h128 b1   sq1 sk4096 bf16 combine kernel", 128, 1, 1, 4096, false, false, 64},
      // the split count against the heuristic's, where splitting decides the time
      {"h128 b1   sq1 sk16384 bf16 s=24", 128, 1, 1, 16384, false, false, 0, 24},
      {"h128 b1   sq1 sk16384 bf16 s=16", 128, 1, 1, 16384, false, false, 0, 16},
      {"h128 b1   sq1 sk16384 bf16 s=32", 128, 1, 1, 16384, false, false, 0, 32},
      {"h128 b1   sq1 sk16384 bf16 s=48", 128, 1, 1, 16384, false, false, 0, 48},
      {"h128 b1   sq1 sk16384 bf16 s=64", 128, 1, 1, 16384, false, false, 0, 64},
      {"h128 b1   sq1 sk16384 bf16 s=128", 128, 1, 1, 16384, false, false, 0, 128},
      {"h16  b1   sq1 sk16384 bf16 s=32", 16, 1, 1, 16384, false, false, 0, 32},
      {"h16  b1   sq1 sk16384 bf16 s=64", 16, 1, 1, 16384, false, false, 0, 64},
      {"h128 b16  sq1 sk4096 bf16 s=2", 128, 16, 1, 4096, false, false, 0, 2},
      {"h128 b16  sq1 sk4096 bf16 s=3", 128, 16, 1, 4096, false, false, 0, 3},
      {"h128 b16  sq1 sk4096 bf16 s=4", 128, 16, 1, 4096, false, false, 0, 4},
      {"h128 b16  sq1 sk4096 bf16 s=8", 128, 16, 1, 4096, false, false, 0, 8},
      // one request at 4096 keys (a V3-shaped b1): the split count against the heuristic's
      {"h128 b1   sq1 sk4096 bf16", 128, 1, 1, 4096, false, false},
      {"h128 b1   sq1 sk4096 bf16 s=8", 128, 1, 1, 4096, false, false, 0, 8},
      {"h128 b1   sq1 sk4096 bf16 s=16", 128, 1, 1, 4096, false, false, 0, 16},
      {"h128 b1   sq1 sk4096 bf16 s=32", 128, 1, 1, 4096, false, false, 0, 32},
      {"h128 b1   sq1 sk4096 bf16 s=64", 128, 1, 1, 4096, false, false, 0, 64},
      {"h16  b1   sq1 sk4096 bf16", 16, 1, 1, 4096, false, false},
      {"h16  b1   sq1 sk4096 bf16 s=16", 16, 1, 1, 4096, false, false, 0, 16},
      {"h16  b1   sq1 sk4096 bf16 s=32", 16, 1, 1, 4096, false, false, 0, 32},
      {"h16  b1   sq1 sk4096 bf16 s=64", 16, 1, 1, 4096, false, false, 0, 64},
      // a V2-Lite-shaped decode at batch 1 (16 heads, short context): the split's fixed costs
      {"h16  b1   sq1 sk1024 bf16", 16, 1, 1, 1024, false, false},
      {"h16  b1   sq1 sk1024 bf16 s=4", 16, 1, 1, 1024, false, false, 0, 4},
      {"h16  b1   sq1 sk1024 bf16 s=8", 16, 1, 1, 1024, false, false, 0, 8},
      {"h16  b1   sq1 sk1024 bf16 s=16", 16, 1, 1, 1024, false, false, 0, 16},
  };
  for (const BenchCase& bc : cases)
    if (case_wanted(bc.name)) run_bench(bc);
}

}  // namespace

int main(int argc, char** argv) {
  bool test = true, bench = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--no-test") test = false;
    else if (a == "--no-bench") bench = false;
    else if (a == "--quick") g_quick = true;
    else if (a == "--case" && i + 1 < argc) g_case = argv[++i];
    else if (a == "--out" && i + 1 < argc) g_out = std::fopen(argv[++i], "w");
  }
  if (const char* e = std::getenv("MLA_TEST_FORCE_WIDE"); e && e[0] == '1') g_base_variant = 8;
  if (const char* e = std::getenv("MLA_TEST_VARIANT")) {  // MlaDecodeTuning variant bits
    char* end = nullptr;
    const long v = std::strtol(e, &end, 0);
    if (end == e || *end != '\0' || v < 0 || v > 0xffff) {
      std::fprintf(stderr, "mla_decode_test: MLA_TEST_VARIANT=%s is not a variant bit mask (0..65535)\n", e);
      return 2;
    }
    g_base_variant |= int(v);
  }
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  g_sms = prop.multiProcessorCount;
  CK(cudaMalloc(&g_grid_counters, mla::gpu::kGridCounterInts * sizeof(int32_t)));
  CK(cudaMemset(g_grid_counters, 0, mla::gpu::kGridCounterInts * sizeof(int32_t)));
  say("device: %s, %d SMs, L2 %d MB, smem/block optin %zu KB\n", prop.name, g_sms, prop.l2CacheSize >> 20,
      prop.sharedMemPerBlockOptin >> 10);
  if (test) run_tests();
  if (bench) run_benches();
  say("== %s (%d failures)\n", g_failures ? "FAILED" : "ALL PASSED", g_failures);
  if (g_out) std::fclose(g_out);
  return g_failures ? 1 : 0;
}
