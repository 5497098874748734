// MoE on every platform present: Ops::moe_route against the host route_tokens (forced ties, V2
// greedy / group_limited_greedy, V3 noaux_tc with bias), Ops::moe_experts against a naive f64
// loop, batch invariance on the GPUs (a token alone and inside T = 37 and T = 128 batches gives
// bit-identical rows), an expert with no rows, ids outside the experts, T = 0 and bad input.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "harness.h"
#include "mla/error.h"
#include "mla/fp_formats.h"
#include "mla/moe.h"
#include "mla/platform.h"
#include "mla/platform_ops.h"
#include "platform/gpu/moe_job.h"

namespace mla {
namespace {

struct Flavour {
  const char* name;
  Platform platform;
  DType act;
};
const Flavour kFlavours[] = {
    {"cpu_f64", Platform::CPU, DType::F64},    {"cpu_f32", Platform::CPU, DType::F32},
    {"cpu_bf16", Platform::CPU, DType::BF16},  {"cuda_f32", Platform::CUDA, DType::F32},
    {"cuda_bf16", Platform::CUDA, DType::BF16}, {"rocm_f32", Platform::ROCM, DType::F32},
    {"rocm_bf16", Platform::ROCM, DType::BF16},
};
std::string flavour_name(const testing::TestParamInfo<Flavour>& i) { return i.param.name; }

std::unique_ptr<Ops> ops_for(const Flavour& f) {
  if (!platform_available(f.platform)) return nullptr;
  return make_ops(f.platform, f.act);
}
#define MLA_OPS_OR_SKIP(ops, f)                                                                   \
  std::unique_ptr<Ops> ops = ops_for(f);                                                          \
  if (!ops) GTEST_SKIP() << "platform " << platform_name(f.platform) << " is not available here"

Tensor host_f32(const std::vector<float>& v, Shape s) {
  Tensor t = Tensor::host(DType::F32, std::move(s));
  std::memcpy(t.data(), v.data(), v.size() * 4);
  return t;
}
Tensor host_i32(const std::vector<int32_t>& v, Shape s) {
  Tensor t = Tensor::host(DType::I32, std::move(s));
  std::memcpy(t.data(), v.data(), v.size() * 4);
  return t;
}

// ---- routing --------------------------------------------------------------------------------

struct RouteCase {
  const char* name;
  MoeRouting r;
  bool bias;
};
std::vector<RouteCase> route_cases() {
  MoeRouting greedy;  // V2-Lite
  greedy.n_routed_experts = 64, greedy.num_experts_per_tok = 6, greedy.routed_scaling_factor = 1.0;
  MoeRouting limited;  // V2
  limited.n_routed_experts = 160, limited.num_experts_per_tok = 6, limited.n_group = 8, limited.topk_group = 3;
  limited.topk_method = "group_limited_greedy", limited.routed_scaling_factor = 16.0;
  MoeRouting v3;  // V3
  v3.n_routed_experts = 256, v3.num_experts_per_tok = 8, v3.n_group = 8, v3.topk_group = 4;
  v3.scoring_func = "sigmoid", v3.topk_method = "noaux_tc", v3.norm_topk_prob = true, v3.routed_scaling_factor = 2.5;
  return {{"v2_greedy", greedy, false}, {"v2_group_limited_greedy", limited, false}, {"v3_noaux_tc", v3, true}};
}

// Random logits with ties forced: whole tokens of equal logits, pairs of equal experts (their
// biases equal too), and values repeated across groups.
void random_logits(const MoeRouting& r, int64_t T, uint32_t seed, std::vector<float>& logits, std::vector<float>& bias,
                   bool with_bias) {
  const int64_t E = r.n_routed_experts;
  std::mt19937 g(seed);
  std::normal_distribution<float> n(0.f, 2.f);
  logits.resize(size_t(T * E));
  for (float& v : logits) v = n(g);
  bias.clear();
  if (with_bias) {
    std::uniform_int_distribution<int> q(-8, 8);
    for (int64_t e = 0; e < E; ++e) bias.push_back(float(q(g)) / 64.f);  // few distinct values
  }
  std::uniform_int_distribution<int64_t> pick(0, E - 1);
  for (int64_t t = 0; t < T; ++t) {
    float* l = &logits[size_t(t * E)];
    if (t % 7 == 3) {  // every expert tied
      std::fill(l, l + E, 0.25f);
      continue;
    }
    for (int i = 0; i < E / 4; ++i) {  // many equal pairs, some of them the largest values
      const int64_t a = pick(g), b = pick(g);
      l[b] = l[a];
      if (with_bias) bias[size_t(b)] = bias[size_t(a)];
    }
    const int64_t top = std::max_element(l, l + E) - l;
    l[(top + E / 2) % E] = l[top];
  }
}

class MoeRoute : public testing::TestWithParam<Flavour> {};

TEST_P(MoeRoute, SameChoiceAsTheHostRouter) {
  MLA_OPS_OR_SKIP(ops, GetParam());
  const int64_t T = 97;
  for (const RouteCase& c : route_cases()) {
    SCOPED_TRACE(c.name);
    std::vector<float> logits, bias;
    random_logits(c.r, T, 7, logits, bias, c.bias);
    const int64_t E = c.r.n_routed_experts, K = c.r.num_experts_per_tok;
    const Routing want = route_tokens(c.r, logits, bias, T);
    Tensor dl = ops->upload(host_f32(logits, {T, E}));
    Tensor db = c.bias ? ops->upload(host_f32(bias, {E})) : Tensor();
    Tensor ex = ops->empty(DType::I32, {T, K}), w = ops->empty(DType::F32, {T, K});
    ops->moe_route(dl, db, c.r, ex, w);
    const Tensor hx = ops->download(ex), hw = ops->download(w);
    double worst = 0;
    for (int64_t i = 0; i < T * K; ++i) {
      ASSERT_EQ(hx.ptr<int32_t>()[i], want.expert[size_t(i)]) << "token " << i / K << " k " << i % K;
      worst = std::max(worst, std::abs(double(hw.ptr<float>()[i]) - want.weight[size_t(i)]) /
                                  std::max(1e-30, std::abs(double(want.weight[size_t(i)]))));
    }
    // Both compute in double and round once to f32: at most an ulp of f32 apart (measured 0).
    EXPECT_LE(worst, 1.2e-7) << "largest relative weight difference";
    std::cout << "[ moe_route " << GetParam().name << " " << c.name << " ] max rel weight diff " << worst << "\n";
  }
}

// moe_router (the router's logits and the routing; on the GPUs one launch up to 64 tokens, a GEMM
// and moe_route beyond): the logits within f32 summation error of an f64 dot product, the choice
// exactly route_tokens' of those logits, a row's logits the same bits alone as in a batch of any
// size up to 64 on the GPUs, and the fused launch's counters back at zero (every later call routes
// too). With bf16 activations the router is also bf16 (as the model holds it then): its logits are
// the bits of an f32 router holding the same values, wherever one path serves both (the GPUs' own
// kernels up to 256 tokens, the CPU everywhere).
TEST_P(MoeRoute, TheRouterRoutesItsOwnLogits) {
  MLA_OPS_OR_SKIP(ops, GetParam());
  const int64_t H = 2048;
  const bool gpu = GetParam().platform != Platform::CPU;
  std::vector<DType> router_dtypes{DType::F32};
  if (ops->act_dtype() == DType::BF16) router_dtypes.push_back(DType::BF16);
  for (const DType rd : router_dtypes)
  for (const RouteCase& c : route_cases()) {
    const int64_t E = c.r.n_routed_experts, K = c.r.num_experts_per_tok;
    std::mt19937 g(11);
    std::uniform_int_distribution<int> q(-127, 127);  // x exact in bf16
    std::normal_distribution<float> n(0.f, 0.05f);
    std::vector<float> router(size_t(E * H)), bias;
    for (float& v : router) v = rd == DType::BF16 ? fp::bf16_decode(fp::bf16_encode(n(g))) : n(g);
    if (c.bias)
      for (int64_t e = 0; e < E; ++e) bias.push_back(float(q(g)) / 512.f);
    Tensor dr32 = ops->upload(host_f32(router, {E, H})), dr = dr32;
    if (rd == DType::BF16) {
      dr = ops->empty(DType::BF16, {E, H});
      ops->copy(dr32, dr);
    }
    Tensor db = c.bias ? ops->upload(host_f32(bias, {E})) : Tensor();
    std::vector<float> first_x, first_logits;  // row 0 of the first call: every later call has it at row T / 2
    double worst = 0;
    // On the GPUs: T ≤ 64 the fused router, to 256 the logits kernel (gpu::kMoeLogitsTokens; the
    // same bits per row), past it the GEMM.
    for (int64_t T : {5, 1, 64, 65, 256, 5, 257, 600}) {
      SCOPED_TRACE(fmt::format("{} router {} T {}", c.name, dtype_name(rd), T));
      std::vector<float> x(size_t(T * H));
      for (int64_t i = 0; i < T * H; ++i) x[size_t(i)] = float(q(g)) / 64.f;
      if (!first_x.empty()) std::copy(first_x.begin(), first_x.end(), x.begin() + (T / 2) * H);
      Tensor x32 = ops->upload(host_f32(x, {T, H})), dx = ops->empty(ops->act_dtype(), {T, H});
      ops->copy(x32, dx);
      Tensor dl = ops->empty(DType::F32, {T, E}), ex = ops->empty(DType::I32, {T, K}), w = ops->empty(DType::F32, {T, K});
      ops->moe_router(dx, dr, db, c.r, dl, ex, w);
      const Tensor hl = ops->download(dl), hx = ops->download(ex), hw = ops->download(w);
      const float* l = hl.ptr<float>();
      for (int64_t t = 0; t < T; t += T > 64 ? 7 : 1)
        for (int64_t e = 0; e < E; ++e) {
          double ref = 0, mag = 0;
          for (int64_t k = 0; k < H; ++k) {
            const double p = double(x[size_t(t * H + k)]) * double(router[size_t(e * H + k)]);
            ref += p, mag += std::abs(p);
          }
          worst = std::max(worst, std::abs(double(l[t * E + e]) - ref) / mag);
        }
      const std::vector<float> logits(l, l + T * E);
      if (rd == DType::BF16 && (!gpu || T <= 256)) {
        Tensor dl32 = ops->empty(DType::F32, {T, E});
        ops->moe_router(dx, dr32, db, c.r, dl32, ex, w);
        EXPECT_EQ(0, std::memcmp(ops->download(dl32).ptr<float>(), l, size_t(T * E) * 4))
            << "a bf16 router's logits differ from an f32 router's holding the same values";
      }
      const Routing want = route_tokens(c.r, logits, bias, T);
      for (int64_t i = 0; i < T * K; ++i) {
        ASSERT_EQ(hx.ptr<int32_t>()[i], want.expert[size_t(i)]) << "token " << i / K << " k " << i % K;
        EXPECT_LE(std::abs(double(hw.ptr<float>()[i]) - want.weight[size_t(i)]),
                  1.2e-7 * std::abs(double(want.weight[size_t(i)])));
      }
      if (first_x.empty()) {
        first_x.assign(x.begin(), x.begin() + H);
        first_logits.assign(logits.begin(), logits.begin() + E);
      } else if (gpu && T <= 256) {
        EXPECT_EQ(0, std::memcmp(&logits[size_t((T / 2) * E)], first_logits.data(), size_t(E) * 4))
            << "the row's logits differ from the first call's";
      }
    }
    // f32 sums of 2048 products against f64, relative to Σ|x·w|.
    EXPECT_LE(worst, 2e-6) << c.name;
    std::cout << "[ moe_router " << GetParam().name << " " << c.name << " router " << dtype_name(rd)
              << " ] max logit error / sum |x w| " << worst << "\n";
  }
}

TEST_P(MoeRoute, NoTokensAndBadInput) {
  MLA_OPS_OR_SKIP(ops, GetParam());
  MoeRouting r = route_cases()[0].r;
  Tensor l0 = ops->empty(DType::F32, {0, 64}), e0 = ops->empty(DType::I32, {0, 6}), w0 = ops->empty(DType::F32, {0, 6});
  EXPECT_NO_THROW(ops->moe_route(l0, Tensor(), r, e0, w0));
  Tensor l = ops->empty(DType::F32, {2, 63}), e = ops->empty(DType::I32, {2, 6}), w = ops->empty(DType::F32, {2, 6});
  EXPECT_THROW(ops->moe_route(l, Tensor(), r, e, w), Error);  // 63 logits for 64 experts
  // A bf16 router beside f32 activations (x would be narrowed on the way to a bf16 GEMM).
  if (ops->act_dtype() != DType::BF16) {
    Tensor x = ops->empty(ops->act_dtype(), {2, 64}), router = ops->empty(DType::BF16, {64, 64});
    Tensor logits = ops->empty(DType::F32, {2, 64});
    expect_error([&] { ops->moe_router(x, router, Tensor(), r, logits, e, w); }, {"moe_router", "bf16 router"});
  }
  r.num_experts_per_tok = 65;
  Tensor l2 = ops->empty(DType::F32, {2, 64});
  EXPECT_THROW(ops->moe_route(l2, Tensor(), r, e, w), Error);
}

INSTANTIATE_TEST_SUITE_P(Platforms, MoeRoute, testing::ValuesIn(kFlavours), flavour_name);

// ---- experts --------------------------------------------------------------------------------

struct Experts {
  int64_t E, I, H;
  Tensor gate, up, down;  // host, in the activation dtype
};
Experts random_experts(int64_t E, int64_t I, int64_t H, DType act, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<double> n(0.0, 1.0);
  auto make = [&](Shape s, double scale) {
    int64_t c = 1;
    for (int64_t d : s) c *= d;
    std::vector<double> v(static_cast<size_t>(c));
    for (double& x : v) x = n(g) * scale;
    return Tensor::host_from(v, act, s);
  };
  return {E, I, H, make({E, I, H}, 1.0 / std::sqrt(double(H))), make({E, I, H}, 1.0 / std::sqrt(double(H))),
          make({E, H, I}, 1.0 / std::sqrt(double(I)))};
}
Tensor random_x(int64_t T, int64_t H, DType act, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<double> n(0.0, 1.0);
  std::vector<double> v(static_cast<size_t>(T * H));
  for (double& x : v) x = n(g);
  return Tensor::host_from(v, act, {T, H});
}
// K distinct experts per token, never `skip` (an expert with no rows); weights in (0.1, 1).
void random_choice(int64_t T, int64_t K, int64_t E, int64_t skip, uint32_t seed, std::vector<int32_t>& ex,
                   std::vector<float>& w) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(0.1f, 1.f);
  ex.clear(), w.clear();
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> all;
    for (int32_t e = 0; e < E; ++e)
      if (e != skip) all.push_back(e);
    std::shuffle(all.begin(), all.end(), g);
    for (int64_t k = 0; k < K; ++k) ex.push_back(all[size_t(k)]), w.push_back(u(g));
  }
}

// out[t] = Σ_k w · down_e(silu(gate_e x) ⊙ up_e x) in double from the stored values.
std::vector<double> naive(const Tensor& x, const Experts& m, const std::vector<int32_t>& ex, const std::vector<float>& w,
                          int64_t K) {
  const int64_t T = x.dim(0), H = m.H, I = m.I;
  const std::vector<double> xd = x.to_doubles(), g = m.gate.to_doubles(), u = m.up.to_doubles(), d = m.down.to_doubles();
  std::vector<double> out(static_cast<size_t>(T * H), 0.0), h(static_cast<size_t>(I));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < K; ++k) {
      const int64_t e = ex[size_t(t * K + k)];
      for (int64_t i = 0; i < I; ++i) {
        double a = 0, b = 0;
        for (int64_t j = 0; j < H; ++j) {
          a += g[size_t((e * I + i) * H + j)] * xd[size_t(t * H + j)];
          b += u[size_t((e * I + i) * H + j)] * xd[size_t(t * H + j)];
        }
        h[size_t(i)] = a / (1 + std::exp(-a)) * b;
      }
      for (int64_t j = 0; j < H; ++j) {
        double s = 0;
        for (int64_t i = 0; i < I; ++i) s += d[size_t((e * H + j) * I + i)] * h[size_t(i)];
        out[size_t(t * H + j)] += double(w[size_t(t * K + k)]) * s;
      }
    }
  return out;
}

class MoeExperts : public testing::TestWithParam<Flavour> {};

// Largest |got − want| over the largest |want| (measured on the CPU: f64 1e-15, f32 2.3e-7, bf16 5.4e-3).
double tolerance(DType act) { return act == DType::F64 ? 1e-14 : act == DType::F32 ? 2e-6 : 3e-2; }

TEST_P(MoeExperts, MatchTheNaiveLoop) {
  const Flavour f = GetParam();
  MLA_OPS_OR_SKIP(ops, f);
  struct Shape3 {
    int64_t T, K, E, I, H;
  };
  // Multiples of 64 (the CUDA bf16 tensor-core paths: 16-, 32-, 64- and, on sm_90a, 128-row tiles),
  // reductions of 2048 (those paths' 128-wide stages: gate/up over hidden, down over I), odd sizes
  // (the portable path) and 4200 slots (the GPUs' plan built by three blocks: gpu::kMoeAlignChunk).
  // On the GPUs also 8192 slots over 64 experts (~100 tiles of 128 rows): more (tile, column slice)
  // jobs than the H200's 132 SMs in both GEMMs, so the persistent wgmma body takes several a block.
  for (Shape3 s : {Shape3{37, 3, 8, 192, 128}, Shape3{50, 2, 4, 128, 192}, Shape3{150, 2, 4, 128, 64},
                   Shape3{600, 2, 4, 128, 256}, Shape3{24, 2, 4, 128, 2048}, Shape3{24, 2, 4, 2048, 128},
                   Shape3{5, 2, 6, 40, 72}, Shape3{2100, 2, 8, 128, 256}, Shape3{4096, 2, 64, 256, 512}}) {
    if (s.E == 64 && f.platform == Platform::CPU) continue;  // 3.2 G products in the naive loop
    SCOPED_TRACE(fmt::format("T {} K {} E {} I {} hidden {}", s.T, s.K, s.E, s.I, s.H));
    const Experts m = random_experts(s.E, s.I, s.H, f.act, 11);
    const Tensor x = random_x(s.T, s.H, f.act, 12);
    std::vector<int32_t> ex;
    std::vector<float> w;
    random_choice(s.T, s.K, s.E, /*skip=*/1, 13, ex, w);
    const std::vector<double> want = naive(x, m, ex, w, s.K);
    Tensor out = ops->empty(f.act, {s.T, s.H});
    ops->moe_experts(ops->upload(x), ops->upload(host_i32(ex, {s.T, s.K})), ops->upload(host_f32(w, {s.T, s.K})),
                     ops->upload(m.gate), ops->upload(m.up), ops->upload(m.down), out);
    const std::vector<double> got = ops->download(out).to_doubles();
    double err = 0, scale = 0;
    for (size_t i = 0; i < want.size(); ++i)
      err = std::max(err, std::abs(got[i] - want[i])), scale = std::max(scale, std::abs(want[i]));
    EXPECT_LE(err / scale, tolerance(f.act));
    std::cout << "[ moe_experts " << f.name << " T " << s.T << " I " << s.I << " ] max err / max |out| "
              << err / scale << "\n";
  }
}

TEST_P(MoeExperts, NoTokensAndBadInput) {
  const Flavour f = GetParam();
  MLA_OPS_OR_SKIP(ops, f);
  const Experts m = random_experts(4, 64, 64, f.act, 1);
  Tensor g = ops->upload(m.gate), u = ops->upload(m.up), d = ops->upload(m.down);
  Tensor x0 = ops->empty(f.act, {0, 64}), e0 = ops->empty(DType::I32, {0, 2}), w0 = ops->empty(DType::F32, {0, 2});
  Tensor o0 = ops->empty(f.act, {0, 64});
  EXPECT_NO_THROW(ops->moe_experts(x0, e0, w0, g, u, d, o0));
  Tensor x = ops->empty(f.act, {3, 64}), e = ops->empty(DType::I32, {3, 2}), w = ops->empty(DType::F32, {3, 2});
  Tensor o = ops->empty(f.act, {3, 64}), o_bad = ops->empty(f.act, {3, 32});
  EXPECT_THROW(ops->moe_experts(x, e, w, g, u, d, o_bad), Error);      // out is not [T, hidden]
  Tensor u_bad = ops->empty(f.act, {4, 32, 64});
  EXPECT_THROW(ops->moe_experts(x, e, w, g, u_bad, d, o), Error);      // up is not [E, I, hidden]
  Tensor e_f = ops->empty(DType::F32, {3, 2});
  EXPECT_THROW(ops->moe_experts(x, e_f, w, g, u, d, o), Error);        // expert ids must be i32
}

// moe_experts_add (the shared experts' rows, made in a side lane, added by the combine on the GPUs)
// gives the bits of moe_experts, the join, then add: the fast and portable shapes, 1 to 600 tokens,
// the lane's work a real GEMM of x. A mismatched added tensor is refused.
TEST_P(MoeExperts, AddingTheSharedRowsIsMoeExpertsThenAdd) {
  const Flavour f = GetParam();
  MLA_OPS_OR_SKIP(ops, f);
  struct Shape3 {
    int64_t T, K, E, I, H;
  };
  for (Shape3 s : {Shape3{1, 2, 4, 128, 256}, Shape3{37, 3, 8, 192, 128}, Shape3{600, 2, 4, 128, 256},
                   Shape3{5, 2, 6, 40, 72}}) {
    SCOPED_TRACE(fmt::format("T {} K {} E {} I {} hidden {}", s.T, s.K, s.E, s.I, s.H));
    const Experts m = random_experts(s.E, s.I, s.H, f.act, 31);
    const Tensor xh = random_x(s.T, s.H, f.act, 32);
    std::vector<int32_t> ex;
    std::vector<float> w;
    random_choice(s.T, s.K, s.E, -1, 33, ex, w);
    const Tensor x = ops->upload(xh), e = ops->upload(host_i32(ex, {s.T, s.K})), wt = ops->upload(host_f32(w, {s.T, s.K}));
    const Tensor g = ops->upload(m.gate), u = ops->upload(m.up), d = ops->upload(m.down);
    const Tensor proj = ops->upload(random_x(s.H, s.H, f.act, 34));  // the lane's GEMM: x · projᵀ
    auto shared_rows = [&] {
      Tensor y = ops->empty(f.act, {s.T, s.H});
      ops->linear(x, proj, y);
      return y;
    };
    Tensor fused = ops->empty(f.act, {s.T, s.H});
    {
      SideLane lane(*ops);
      const Tensor y = shared_rows();
      lane.main();
      ops->moe_experts_add(x, e, wt, g, u, d, lane, y, fused);
    }
    Tensor steps = ops->empty(f.act, {s.T, s.H});
    ops->moe_experts(x, e, wt, g, u, d, steps);
    ops->add(steps, shared_rows());
    const Tensor a = ops->download(fused), b = ops->download(steps);
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.nbytes()));
    Tensor plain = ops->empty(f.act, {s.T, s.H});
    ops->moe_experts(x, e, wt, g, u, d, plain);
    const Tensor c = ops->download(plain);
    EXPECT_NE(0, std::memcmp(a.data(), c.data(), a.nbytes())) << "nothing was added";
  }
  const Experts m = random_experts(4, 64, 64, f.act, 1);
  Tensor x = ops->empty(f.act, {3, 64}), e = ops->empty(DType::I32, {3, 2}), w = ops->empty(DType::F32, {3, 2});
  Tensor o = ops->empty(f.act, {3, 64}), bad = ops->empty(f.act, {3, 32});
  SideLane lane(*ops);
  lane.main();
  EXPECT_THROW(ops->moe_experts_add(x, e, w, ops->upload(m.gate), ops->upload(m.up), ops->upload(m.down), lane, bad, o),
               Error);
}

// A token's row alone, and inside T = 37, 64, 128 and 512 batches of other tokens: bit-identical.
TEST_P(MoeExperts, ARowDoesNotDependOnTheBatch) {
  const Flavour f = GetParam();
  MLA_OPS_OR_SKIP(ops, f);
  // On CUDA bf16: T ≤ 37 16-row tiles (mma.sync), T = 64 32-row tiles, T = 128 64-row tiles, T = 512
  // 128-row tiles (wgmma on sm_90a); hidden 2048: the mma.sync body's 128-wide stages for gate/up.
  for (const int64_t H : {256, 2048}) {
    SCOPED_TRACE(fmt::format("hidden {}", H));
    const int64_t E = 4, K = 2, I = 128;
    const Experts m = random_experts(E, I, H, f.act, 21);
    Tensor g = ops->upload(m.gate), u = ops->upload(m.up), d = ops->upload(m.down);
    const Tensor xb = random_x(128, H, f.act, 22);
    std::vector<int32_t> ex;
    std::vector<float> w;
    random_choice(128, K, E, -1, 23, ex, w);
    const size_t es = dtype_size(f.act);
    auto run = [&](const std::vector<int64_t>& tokens) {  // rows of xb, in this order
      const int64_t T = int64_t(tokens.size());
      Tensor x = Tensor::host(f.act, {T, H});
      std::vector<int32_t> e;
      std::vector<float> ww;
      for (int64_t i = 0; i < T; ++i) {
        std::memcpy(static_cast<char*>(x.data()) + size_t(i * H) * es,
                    static_cast<const char*>(xb.data()) + size_t(tokens[size_t(i)] * H) * es, size_t(H) * es);
        for (int64_t k = 0; k < K; ++k)
          e.push_back(ex[size_t(tokens[size_t(i)] * K + k)]), ww.push_back(w[size_t(tokens[size_t(i)] * K + k)]);
      }
      Tensor out = ops->empty(f.act, {T, H});
      ops->moe_experts(ops->upload(x), ops->upload(host_i32(e, {T, K})), ops->upload(host_f32(ww, {T, K})), g, u, d,
                       out);
      return ops->download(out);
    };
    std::vector<int64_t> all(128), first37(37), some(64), many(512);
    for (int64_t i = 0; i < 128; ++i) all[size_t(i)] = 127 - i;  // reversed: other rows, other tiles
    for (int64_t i = 0; i < 37; ++i) first37[size_t(i)] = (i * 5) % 128;
    for (int64_t i = 0; i < 64; ++i) some[size_t(i)] = (i * 2 + 1) % 128;  // the odd tokens
    for (int64_t i = 0; i < 512; ++i) many[size_t(i)] = (i * 7 + 3) % 128;  // each token 4 times
    const Tensor big = run(all), mid = run(first37), odd = run(some), huge = run(many);
    for (int64_t tok : {int64_t(0), int64_t(5), int64_t(90), int64_t(127)}) {
      SCOPED_TRACE(fmt::format("token {}", tok));
      const Tensor alone = run({tok});
      const char* a = static_cast<const char*>(alone.data());
      EXPECT_EQ(std::memcmp(a, static_cast<const char*>(big.data()) + size_t((127 - tok) * H) * es, size_t(H) * es), 0)
          << "inside the T = 128 batch";
      for (int64_t i = 0; i < 37; ++i)
        if (first37[size_t(i)] == tok)
          EXPECT_EQ(std::memcmp(a, static_cast<const char*>(mid.data()) + size_t(i * H) * es, size_t(H) * es), 0)
              << "inside the T = 37 batch";
      for (int64_t i = 0; i < 64; ++i)
        if (some[size_t(i)] == tok)
          EXPECT_EQ(std::memcmp(a, static_cast<const char*>(odd.data()) + size_t(i * H) * es, size_t(H) * es), 0)
              << "inside the T = 64 batch";
      for (int64_t i = 0; i < 512; ++i)
        if (many[size_t(i)] == tok)
          EXPECT_EQ(std::memcmp(a, static_cast<const char*>(huge.data()) + size_t(i * H) * es, size_t(H) * es), 0)
              << "inside the T = 512 batch, row " << i;
    }
  }
}

// An expert id outside [0, E) (a NaN router row leaves −1) adds nothing on the GPUs, in a step of
// one token as inside a batch: the token's row is that of its valid slots alone, bit for bit. The
// CPU refuses such an id.
TEST_P(MoeExperts, AnIdOutsideTheExpertsAddsNothingOnTheGpus) {
  const Flavour f = GetParam();
  MLA_OPS_OR_SKIP(ops, f);
  const int64_t E = 4, I = 128, H = 256;
  const Experts m = random_experts(E, I, H, f.act, 41);
  const Tensor g = ops->upload(m.gate), u = ops->upload(m.up), d = ops->upload(m.down);
  const Tensor xh = random_x(2, H, f.act, 42);  // token 0, then token 1
  auto run = [&](int64_t T, const std::vector<int32_t>& ex, const std::vector<float>& w) {
    const int64_t K = int64_t(ex.size()) / T;
    Tensor x = Tensor::host(f.act, {T, H});
    std::memcpy(x.data(), xh.data(), x.nbytes());
    Tensor out = ops->empty(f.act, {T, H});
    ops->moe_experts(ops->upload(x), ops->upload(host_i32(ex, {T, K})), ops->upload(host_f32(w, {T, K})), g, u, d,
                     out);
    return ops->download(out);
  };
  if (f.platform == Platform::CPU) {
    EXPECT_THROW(run(1, {2, -1}, {0.5f, 0.25f}), Error);
    return;
  }
  const size_t row = size_t(H) * dtype_size(f.act);
  const Tensor valid = run(1, {2, 1}, {0.5f, 0.25f});  // slot 1 on a real expert
  const Tensor want = run(1, {2}, {0.5f});             // slot 0 alone
  EXPECT_NE(0, std::memcmp(valid.data(), want.data(), row)) << "expert 1's slot added nothing";
  for (const int32_t bad : {-1, int32_t(E), 1000}) {
    SCOPED_TRACE(fmt::format("id {}", bad));
    const Tensor alone = run(1, {2, bad}, {0.5f, 0.25f});
    EXPECT_EQ(0, std::memcmp(alone.data(), want.data(), row)) << "one token";
    const Tensor batch = run(2, {2, bad, bad, 3}, {0.5f, 0.25f, 0.75f, 0.125f});
    EXPECT_EQ(0, std::memcmp(batch.data(), want.data(), row)) << "token 0 in a batch of two";
  }
}

INSTANTIATE_TEST_SUITE_P(Platforms, MoeExperts, testing::ValuesIn(kFlavours), flavour_name);

// The prefill expert GEMM's job order (gpu::moe_job_at) over plans laid out as the planner lays
// them (an expert's tiles together, in row order): every (tile, slice) exactly once; an expert's
// jobs the same numbers as in tile-by-tile order; within an expert, slice by slice, the expert's
// tiles of a slice consecutive and in row order.
TEST(MoeJobOrder, EveryTileAndSliceOnceAnExpertsTilesOfASliceTogether) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const int E = 1 + int(rng() % 40), slices = 1 + int(rng() % 17), bm = trial % 3 ? 128 : 64;
    const int choices[] = {0, 1, 5, 63, 64, 65, 127, 128, 129, 200, 256, 257, 400, 700};
    std::vector<int32_t> offsets{0}, tiles;
    std::vector<int> first_tile;
    for (int e = 0; e < E; ++e) {
      const int rows = choices[rng() % std::size(choices)];
      first_tile.push_back(int(tiles.size() / 2));
      for (int r = 0; r < rows; r += bm) tiles.push_back(e), tiles.push_back(offsets.back() + r);
      offsets.push_back(offsets.back() + rows);
    }
    const int ntiles = int(tiles.size() / 2), jobs = ntiles * slices;
    SCOPED_TRACE(fmt::format("trial {}: E {} slices {} bm {} tiles {}", trial, E, slices, bm, ntiles));
    std::vector<int> seen(size_t(jobs), 0);
    for (int job = 0; job < jobs; ++job) {
      const gpu::MoeJob j = gpu::moe_job_at(job, slices, bm, tiles.data(), offsets.data());
      ASSERT_GE(j.expert, 0);
      ASSERT_LT(j.expert, E);
      const int n = (offsets[size_t(j.expert) + 1] - offsets[size_t(j.expert)] + bm - 1) / bm, t0 = first_tile[size_t(j.expert)];
      const int i = (j.row0 - offsets[size_t(j.expert)]) / bm;
      ASSERT_EQ(j.row0, offsets[size_t(j.expert)] + i * bm);
      ASSERT_GE(i, 0);
      ASSERT_LT(i, n);
      ASSERT_GE(j.slice, 0);
      ASSERT_LT(j.slice, slices);
      ASSERT_EQ(tiles[2 * size_t(t0 + i)], j.expert);
      ++seen[size_t(t0 + i) * size_t(slices) + size_t(j.slice)];
      ASSERT_EQ(job / slices >= t0 && job / slices < t0 + n, true) << "job " << job << " outside its expert's range";
      ASSERT_EQ(job - t0 * slices, j.slice * n + i) << "job " << job;
    }
    for (int k = 0; k < jobs; ++k) ASSERT_EQ(seen[size_t(k)], 1) << "tile " << k / slices << " slice " << k % slices;
  }
}

}  // namespace
}  // namespace mla
