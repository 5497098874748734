// The ROCm platform's GEMM kernel family (src/platform/rocm/gemm.h), run on the ROCm-platform device
// (rocm-on-cuda: an NVIDIA GPU through the CUDA build). Every result is compared with a host f64
// GEMM of the SAME quantized operands (activations quantized group by group with the fp:: functions,
// weight codes decoded with fp::), so the only expected difference is the kernel's f32 accumulation:
// relative L2 ≤ 1e-5 for f32 output, ≤ 4e-3 for bf16 output (its rounding). Each case runs through
// gemm() (the shape's pick) and through every tile variant; output padding must stay untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "mla/error.h"
#include "mla/platform.h"

#if defined(MLA_WITH_CUDA) || defined(MLA_WITH_ROCM)
#include "mla/fp_formats.h"
#include "platform/gpu/gpu_runtime.h"
#include "platform/rocm/gemm.h"

namespace mla::test {
namespace {

using gpu::Elem;
using rocm::ActQuant;
using rocm::GemmParams;
using rocm::WeightFormat;

#define SKIP_WITHOUT_ROCM() \
  if (!mla::platform_available(mla::Platform::ROCM)) GTEST_SKIP() << "no ROCm-platform device"

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// A device buffer on the test's stream (stream-ordered calls: the names the shim maps to HIP).
class Dev {
 public:
  Dev(size_t bytes, cudaStream_t s) : bytes_(bytes), s_(s) {
    check(cudaMallocAsync(&p_, bytes ? bytes : 1, s), "cudaMallocAsync");
  }
  ~Dev() { cudaFreeAsync(p_, s_); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  void* get() const { return p_; }
  void upload(const void* h) {
    check(cudaMemcpyAsync(p_, h, bytes_, cudaMemcpyHostToDevice, s_), "upload");
    check(cudaStreamSynchronize(s_), "sync");
  }
  void download(void* h) {
    check(cudaMemcpyAsync(h, p_, bytes_, cudaMemcpyDeviceToHost, s_), "download");
    check(cudaStreamSynchronize(s_), "sync");
  }

 private:
  void* p_ = nullptr;
  size_t bytes_;
  cudaStream_t s_;
};

class RocmGemm : public ::testing::Test {
 protected:
  void SetUp() override {
    if (mla::platform_available(mla::Platform::ROCM))
      check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  }
  void TearDown() override {
    if (stream) cudaStreamDestroy(stream);
  }
  cudaStream_t stream = nullptr;
};

// Stores v as element e (f32 or bf16) into bytes at index i; returns the value stored.
float store_host(std::vector<uint8_t>& buf, Elem e, size_t i, float v) {
  if (e == Elem::F32) {
    std::memcpy(&buf[i * 4], &v, 4);
    return v;
  }
  const uint16_t c = fp::bf16_encode(v);
  std::memcpy(&buf[i * 2], &c, 2);
  return fp::bf16_decode(c);
}
float load_host(const std::vector<uint8_t>& buf, Elem e, size_t i) {
  if (e == Elem::F32) {
    float v;
    std::memcpy(&v, &buf[i * 4], 4);
    return v;
  }
  uint16_t c;
  std::memcpy(&c, &buf[i * 2], 2);
  return fp::bf16_decode(c);
}

struct Case {
  int64_t batch, M, N, K;
  Elem x_elem;
  WeightFormat wf;
  Elem w_elem;
  ActQuant aq;
  Elem y_elem;
  int64_t pad;  // extra elements (bytes for MXFP4 weights) per row and per batch entry
};

std::string describe(const Case& c) {
  auto el = [](Elem e) {
    switch (e) {
      case Elem::F32: return "f32";
      case Elem::BF16: return "bf16";
      case Elem::FP8_E4M3FN: return "e4m3fn";
      default: return "e4m3fnuz";
    }
  };
  const char* wf = c.wf == WeightFormat::PLAIN ? "plain" : c.wf == WeightFormat::FP8 ? "fp8" : "mxfp4";
  const char* aq = c.aq == ActQuant::NONE ? "none" : c.aq == ActQuant::FP8_GROUP128 ? "fp8g128" : "mxfp4";
  return "batch " + std::to_string(c.batch) + " M " + std::to_string(c.M) + " N " + std::to_string(c.N) + " K " +
         std::to_string(c.K) + " x " + el(c.x_elem) + " w " + wf + "/" + el(c.w_elem) + " aq " + aq + " y " +
         el(c.y_elem) + " pad " + std::to_string(c.pad);
}

// The host side of one case: operands (as stored and as the dequantized values the GEMM multiplies)
// and the f64 reference.
struct Host {
  GemmParams p{};
  std::vector<uint8_t> x, w, ws, y;
  std::vector<double> ref;  // [b][m][n]
  double y_sentinel_bits_f32 = 0;
};

// Activation row x (K values as stored) → the values the GEMM multiplies.
std::vector<float> quantize_row(const std::vector<float>& x, ActQuant aq, Elem flavour) {
  const size_t K = x.size();
  std::vector<float> out(x);
  if (aq == ActQuant::FP8_GROUP128) {
    const bool fnuz = flavour == Elem::FP8_E4M3FNUZ;
    const float qmax = fnuz ? fp::kE4m3fnuzMax : fp::kE4m3fnMax;
    for (size_t g0 = 0; g0 < K; g0 += 128) {
      const size_t g1 = std::min(K, g0 + 128);
      float amax = 0;
      for (size_t k = g0; k < g1; ++k) amax = std::max(amax, std::fabs(x[k]));
      const float s = amax == 0.0f ? 1.0f : amax / qmax;
      for (size_t k = g0; k < g1; ++k)
        out[k] = fnuz ? fp::e4m3fnuz_decode(fp::e4m3fnuz_encode(x[k] / s)) * s
                      : fp::e4m3fn_decode(fp::e4m3fn_encode(x[k] / s)) * s;
    }
  } else if (aq == ActQuant::MXFP4) {
    for (size_t g0 = 0; g0 < K; g0 += 32) {
      uint8_t packed[16];
      const uint8_t code = fp::mxfp4_quantize_block(&x[g0], packed);
      const float s = fp::e8m0_decode(code);
      for (int i = 0; i < 32; ++i) out[g0 + i] = fp::e2m1_decode(uint8_t((packed[i / 2] >> (4 * (i & 1))) & 0xf)) * s;
    }
  }
  return out;
}

// Random values with a magnitude that changes from one 32-group to the next (so that group scales
// differ), and one all-zero group in row 0 when K allows (amax == 0).
float sample(std::mt19937& rng, int64_t m, int64_t k) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  static const float kMag[] = {1.0f, 0.25f, 4.0f, 0.03f, 16.0f};
  const float v = nd(rng) * kMag[(k / 32 + m) % 5];
  if (m == 0 && k >= 128 && k < 256) return 0.0f;
  return v;
}

Host make_case(const Case& c, uint64_t seed) {
  Host h;
  std::mt19937 rng{uint32_t(seed)};
  GemmParams& p = h.p;
  p.M = c.M, p.N = c.N, p.K = c.K, p.batch = c.batch;
  p.x_elem = c.x_elem, p.w_elem = c.w_elem, p.wf = c.wf, p.aq = c.aq, p.y_elem = c.y_elem;
  p.x_ld = c.K + c.pad;
  p.x_bstride = c.M * p.x_ld + 3 * c.pad;
  p.y_ld = c.N + c.pad;
  p.y_bstride = c.M * p.y_ld + 3 * c.pad;
  if (c.wf == WeightFormat::MXFP4) {
    p.w_ld = c.K / 2 + c.pad;
    p.s_ld = c.K / 32 + c.pad;
    p.s_bstride = c.N * p.s_ld + c.pad;
  } else {
    p.w_ld = c.K + c.pad;
  }
  p.w_bstride = c.N * p.w_ld + 3 * c.pad;
  p.w_scale = c.wf == WeightFormat::FP8 ? 0.0173f : 1.0f;

  h.x.assign(size_t(c.batch * p.x_bstride) * elem_size(c.x_elem), 0);
  const size_t w_bytes = c.wf == WeightFormat::PLAIN ? elem_size(c.w_elem) : 1;
  h.w.assign(size_t(c.batch * p.w_bstride) * w_bytes, 0);
  if (c.wf == WeightFormat::MXFP4) h.ws.assign(size_t(c.batch * p.s_bstride), 0);
  h.y.assign(size_t(c.batch * p.y_bstride) * elem_size(c.y_elem), 0x7f);  // sentinel: 0x7f7f…

  // Activations: stored, then quantized on the host as the kernel does.
  std::vector<std::vector<float>> xq(size_t(c.batch * c.M));
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t m = 0; m < c.M; ++m) {
      std::vector<float> row(size_t(c.K));
      for (int64_t k = 0; k < c.K; ++k)
        row[size_t(k)] = store_host(h.x, c.x_elem, size_t(b * p.x_bstride + m * p.x_ld + k), sample(rng, m, k));
      xq[size_t(b * c.M + m)] = quantize_row(row, c.aq, c.w_elem);
    }
  // Weights: stored form, and the dequantized values ŵ.
  std::vector<float> wd(size_t(c.batch * c.N * c.K));
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t n = 0; n < c.N; ++n) {
      float* wrow = &wd[size_t((b * c.N + n) * c.K)];
      if (c.wf == WeightFormat::PLAIN) {
        for (int64_t k = 0; k < c.K; ++k)
          wrow[k] = store_host(h.w, c.w_elem, size_t(b * p.w_bstride + n * p.w_ld + k), sample(rng, n + 1, k));
      } else if (c.wf == WeightFormat::FP8) {
        const bool fnuz = c.w_elem == Elem::FP8_E4M3FNUZ;
        for (int64_t k = 0; k < c.K; ++k) {
          const float v = sample(rng, n + 1, k) * 40.0f;  // codes over the whole range, some saturating
          const uint8_t code = fnuz ? fp::e4m3fnuz_encode(v) : fp::e4m3fn_encode(v);
          h.w[size_t(b * p.w_bstride + n * p.w_ld + k)] = code;
          wrow[k] = (fnuz ? fp::e4m3fnuz_decode(code) : fp::e4m3fn_decode(code)) * p.w_scale;
        }
      } else {
        for (int64_t g = 0; g < c.K / 32; ++g) {
          float v[32];
          for (int i = 0; i < 32; ++i) v[i] = sample(rng, n + 1, g * 32 + i);
          uint8_t packed[16];
          const uint8_t code = fp::mxfp4_quantize_block(v, packed);
          std::memcpy(&h.w[size_t(b * p.w_bstride + n * p.w_ld + g * 16)], packed, 16);
          h.ws[size_t(b * p.s_bstride + n * p.s_ld + g)] = code;
          for (int i = 0; i < 32; ++i)
            wrow[g * 32 + i] = fp::e2m1_decode(uint8_t((packed[i / 2] >> (4 * (i & 1))) & 0xf)) * fp::e8m0_decode(code);
        }
      }
    }
  h.ref.assign(size_t(c.batch * c.M * c.N), 0.0);
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t m = 0; m < c.M; ++m) {
      const std::vector<float>& xr = xq[size_t(b * c.M + m)];
      for (int64_t n = 0; n < c.N; ++n) {
        const float* wrow = &wd[size_t((b * c.N + n) * c.K)];
        double s = 0;
        for (int64_t k = 0; k < c.K; ++k) s += double(xr[size_t(k)]) * double(wrow[k]);
        h.ref[size_t((b * c.M + m) * c.N + n)] = s;
      }
    }
  return h;
}

// Runs the case through gemm() (variant −1) or one tile variant; returns the relative L2 error and
// checks that the output's padding kept its sentinel.
double run_case(const Case& c, Host& h, int variant, cudaStream_t s) {
  Dev dx(h.x.size(), s), dw(h.w.size(), s), dws(std::max<size_t>(h.ws.size(), 1), s), dy(h.y.size(), s);
  dx.upload(h.x.data());
  dw.upload(h.w.data());
  if (!h.ws.empty()) dws.upload(h.ws.data());
  dy.upload(h.y.data());
  GemmParams p = h.p;
  p.x = dx.get(), p.w = dw.get(), p.y = dy.get(), p.stream = s;
  p.w_scales = h.ws.empty() ? nullptr : static_cast<const uint8_t*>(dws.get());
  if (variant < 0) rocm::gemm(p);
  else rocm::detail::gemm_variant(p, variant);
  check(cudaStreamSynchronize(s), "gemm");
  std::vector<uint8_t> out(h.y.size());
  dy.download(out.data());

  std::vector<bool> inside(out.size() / elem_size(c.y_elem), false);
  double num = 0, den = 0;
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t m = 0; m < c.M; ++m)
      for (int64_t n = 0; n < c.N; ++n) {
        const size_t i = size_t(b * p.y_bstride + m * p.y_ld + n);
        inside[i] = true;
        const double r = h.ref[size_t((b * c.M + m) * c.N + n)], d = double(load_host(out, c.y_elem, i)) - r;
        num += d * d;
        den += r * r;
      }
  size_t touched = 0;
  for (size_t i = 0; i < inside.size(); ++i)
    if (!inside[i] && std::memcmp(&out[i * elem_size(c.y_elem)], &h.y[i * elem_size(c.y_elem)], elem_size(c.y_elem)))
      ++touched;
  EXPECT_EQ(touched, 0u) << "output padding written: " << describe(c) << " variant " << variant;
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

void check_cases(const std::vector<Case>& cases, cudaStream_t s) {
  uint64_t seed = 1;
  for (const Case& c : cases) {
    Host h = make_case(c, seed++);
    const double tol = c.y_elem == Elem::F32 ? 1e-5 : 4e-3;
    for (int v = -1; v < rocm::detail::num_variants(); ++v) {
      const double err = run_case(c, h, v, s);
      EXPECT_LE(err, tol) << describe(c) << " variant " << (v < 0 ? "auto" : rocm::detail::variant_name(v));
    }
  }
}

constexpr Elem F32 = Elem::F32, BF16 = Elem::BF16, FN = Elem::FP8_E4M3FN, FNUZ = Elem::FP8_E4M3FNUZ;
constexpr WeightFormat PLAIN = WeightFormat::PLAIN, FP8 = WeightFormat::FP8, MX = WeightFormat::MXFP4;
constexpr ActQuant NONE = ActQuant::NONE, G128 = ActQuant::FP8_GROUP128, AMX = ActQuant::MXFP4;

TEST_F(RocmGemm, PlainF32) {
  SKIP_WITHOUT_ROCM();
  check_cases({{1, 1, 1, 1, F32, PLAIN, F32, NONE, F32, 0},
               {1, 7, 33, 130, F32, PLAIN, F32, NONE, F32, 0},
               {1, 33, 130, 7, F32, PLAIN, F32, NONE, F32, 3},
               {1, 130, 7, 33, F32, PLAIN, F32, NONE, F32, 0},
               {1, 200, 150, 256, F32, PLAIN, F32, NONE, F32, 8},  // aligned rows: vector loads
               {16, 7, 33, 130, F32, PLAIN, F32, NONE, F32, 5},
               {16, 33, 64, 128, F32, PLAIN, F32, NONE, F32, 4}},
              stream);
}

TEST_F(RocmGemm, PlainBf16) {
  SKIP_WITHOUT_ROCM();
  check_cases({{1, 1, 1, 1, BF16, PLAIN, BF16, NONE, F32, 0},
               {1, 7, 33, 130, BF16, PLAIN, BF16, NONE, F32, 0},
               {1, 33, 130, 7, BF16, PLAIN, BF16, NONE, BF16, 1},
               {1, 300, 260, 520, BF16, PLAIN, BF16, NONE, F32, 0},
               {1, 300, 260, 520, BF16, PLAIN, BF16, NONE, BF16, 8},
               {16, 7, 33, 130, BF16, PLAIN, BF16, NONE, BF16, 5},
               {16, 33, 64, 128, BF16, PLAIN, BF16, NONE, F32, 8},
               {16, 64, 128, 512, BF16, PLAIN, BF16, NONE, F32, 0},  // absorb-like
               {1, 33, 130, 200, F32, PLAIN, BF16, NONE, F32, 0},    // mixed operand types
               {1, 33, 130, 200, BF16, PLAIN, F32, NONE, BF16, 3},
               {1, 8, 40, 1030, BF16, PLAIN, BF16, NONE, F32, 0},    // few rows, long K
               {3, 1, 300, 2048, BF16, PLAIN, BF16, NONE, BF16, 8}},
              stream);
}

TEST_F(RocmGemm, Fp8WeightsGroup128Activations) {
  SKIP_WITHOUT_ROCM();
  std::vector<Case> cases;
  for (Elem fl : {FN, FNUZ})
    for (int64_t K : {128, 512, 200}) {
      cases.push_back({1, 7, 33, K, BF16, FP8, fl, G128, F32, 0});
      cases.push_back({1, 130, 65, K, F32, FP8, fl, G128, BF16, 3});
      cases.push_back({4, 33, 130, K, BF16, FP8, fl, G128, F32, 8});
    }
  cases.push_back({1, 1, 257, 512, BF16, FP8, FN, G128, BF16, 0});
  cases.push_back({1, 3, 130, 2000, BF16, FP8, FNUZ, G128, F32, 0});  // few rows, long K: the skinny kernel
  cases.push_back({2, 8, 40, 1100, F32, FP8, FN, G128, BF16, 3});
  check_cases(cases, stream);
}

TEST_F(RocmGemm, Fp8WeightsPlainActivations) {
  SKIP_WITHOUT_ROCM();
  check_cases({{1, 7, 33, 200, BF16, FP8, FN, NONE, F32, 0},
               {2, 65, 130, 512, F32, FP8, FNUZ, NONE, BF16, 3}},
              stream);
}

TEST_F(RocmGemm, Mxfp4) {
  SKIP_WITHOUT_ROCM();
  std::vector<Case> cases;
  for (int64_t K : {128, 512}) {
    cases.push_back({1, 7, 33, K, BF16, MX, BF16, AMX, F32, 0});
    cases.push_back({1, 130, 65, K, F32, MX, BF16, AMX, BF16, 3});  // unaligned packed rows
    cases.push_back({8, 33, 130, K, BF16, MX, BF16, AMX, F32, 4});
    cases.push_back({1, 1, 64, K, BF16, MX, BF16, AMX, BF16, 0});
  }
  cases.push_back({2, 5, 33, 1056, F32, MX, BF16, AMX, BF16, 4});
  cases.push_back({1, 8, 130, 2048, BF16, MX, BF16, AMX, F32, 0});
  check_cases(cases, stream);
}

TEST_F(RocmGemm, ZeroK) {
  SKIP_WITHOUT_ROCM();
  check_cases({{2, 5, 9, 0, F32, PLAIN, F32, NONE, F32, 2}}, stream);  // Y = 0 (ref 0: abs. L2)
}

TEST_F(RocmGemm, DequantizeFp8) {
  SKIP_WITHOUT_ROCM();
  const size_t n = 5000;
  for (Elem fl : {FN, FNUZ})
    for (Elem oe : {F32, BF16}) {
      std::vector<uint8_t> codes(n);
      for (size_t i = 0; i < n; ++i) {
        uint8_t c = uint8_t(i * 37 + 11);
        if (fl == FN && (c & 0x7f) == 0x7f) c = 0x7e;  // no NaN codes
        if (fl == FNUZ && c == 0x80) c = 0;
        codes[i] = c;
      }
      const float scale = 0.0371f;
      Dev dc(n, stream), dout(n * elem_size(oe), stream);
      dc.upload(codes.data());
      rocm::dequantize_fp8(dc.get(), fl, scale, dout.get(), oe, n, stream);
      std::vector<uint8_t> out(n * elem_size(oe));
      dout.download(out.data());
      size_t bad = 0;
      for (size_t i = 0; i < n; ++i) {
        const float v = (fl == FN ? fp::e4m3fn_decode(codes[i]) : fp::e4m3fnuz_decode(codes[i])) * scale;
        const float want = oe == F32 ? v : fp::bf16_decode(fp::bf16_encode(v));
        if (load_host(out, oe, i) != want) ++bad;
      }
      EXPECT_EQ(bad, 0u);
    }
}

TEST_F(RocmGemm, InvalidCombinationsThrow) {
  SKIP_WITHOUT_ROCM();
  float dummy = 0;
  uint8_t scales = 0;
  GemmParams base{};
  base.x = &dummy, base.w = &dummy, base.y = &dummy, base.w_scales = &scales;
  base.x_elem = F32, base.w_elem = F32, base.y_elem = F32, base.wf = PLAIN, base.aq = NONE;
  base.M = 4, base.N = 4, base.K = 64, base.batch = 1, base.x_ld = 64, base.w_ld = 64, base.y_ld = 4;
  base.stream = stream;
  auto with = [&](auto f) {
    GemmParams p = base;
    f(p);
    return p;
  };
  EXPECT_THROW(rocm::gemm(with([](GemmParams& p) { p.aq = G128; })), mla::Error);  // PLAIN + quantized x
  EXPECT_THROW(rocm::gemm(with([](GemmParams& p) { p.aq = AMX; })), mla::Error);
  EXPECT_THROW(rocm::gemm(with([](GemmParams& p) { p.wf = FP8, p.w_elem = FN, p.aq = AMX; })), mla::Error);
  EXPECT_THROW(rocm::gemm(with([](GemmParams& p) { p.wf = FP8, p.w_elem = BF16; })), mla::Error);
  EXPECT_THROW(rocm::gemm(with([](GemmParams& p) { p.wf = MX, p.aq = NONE; })), mla::Error);
  EXPECT_THROW(rocm::gemm(with([](GemmParams& p) { p.wf = MX, p.aq = AMX, p.K = 48; })), mla::Error);
  EXPECT_THROW(rocm::gemm(with([](GemmParams& p) { p.wf = MX, p.aq = AMX, p.w_scales = nullptr; })), mla::Error);
  EXPECT_THROW(rocm::gemm(with([](GemmParams& p) { p.w_elem = FN; })), mla::Error);  // PLAIN fp8
  EXPECT_THROW(rocm::gemm(with([](GemmParams& p) { p.x_elem = FN; })), mla::Error);
  EXPECT_THROW(rocm::gemm(with([](GemmParams& p) { p.y_elem = FNUZ; })), mla::Error);
  EXPECT_THROW(rocm::gemm(with([](GemmParams& p) { p.K = 16385; })), mla::Error);
  EXPECT_THROW(rocm::gemm(with([](GemmParams& p) { p.batch = 257; })), mla::Error);
  EXPECT_THROW(rocm::dequantize_fp8(&scales, BF16, 1.0f, &dummy, F32, 1, stream), mla::Error);
  EXPECT_NO_THROW(rocm::gemm(with([](GemmParams& p) { p.M = 0, p.aq = G128; })));  // M == 0: nothing
}

}  // namespace
}  // namespace mla::test

#else  // no GPU platform in this build

TEST(RocmGemm, NeedsAGpuBuild) {
  GTEST_SKIP() << "this build has no GPU platform: the ROCm GEMM tests are not compiled";
}

#endif
