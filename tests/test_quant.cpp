// Host weight quantization (mla/quant.h): per-tensor fp8 e4m3fn / e4m3fnuz error bounds and
// equivalence, block-fp8 checkpoints to per-tensor, MXFP4 packing, the U8 dtype, and bad inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "mla/dtype.h"
#include "mla/error.h"
#include "mla/fp_formats.h"
#include "mla/quant.h"
#include "mla/tensor.h"
#include "harness.h"

namespace mla {
namespace {

// 2^e by repeated multiplication.
double pow2(int e) {
  double r = 1;
  for (; e > 0; --e) r *= 2;
  for (; e < 0; ++e) r /= 2;
  return r;
}

// OCP e4m3fn value of a code, from its fields (NaN for S.1111.111).
double ref_fn(uint8_t c) {
  if ((c & 0x7f) == 0x7f) return std::nan("");
  const int e = (c >> 3) & 15, m = c & 7;
  const double v = e == 0 ? m * pow2(-9) : (8 + m) * pow2(e - 10);
  return (c & 0x80) ? -v : v;
}

// The spacing of e4m3fn values around |x| (x in fp8 units, ≤ 448): 2^(max(floor(log2|x|), −6) − 3).
double fn_quantum(double x) {
  int e = -6;
  if (x != 0) {
    std::frexp(std::fabs(x), &e);
    e = std::max(e - 1, -6);
  }
  return pow2(e - 3);
}

std::vector<double> randn(size_t n, uint64_t seed, double stddev = 1.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> d(0.0, stddev);
  std::vector<double> v(n);
  for (double& x : v) x = d(rng);
  return v;
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const uint8_t* p = static_cast<const uint8_t*>(t.data());
  return {p, p + t.nbytes()};
}

// Runs f, which must throw Error whose message holds every one of `words`.
// ---- U8 and the flavors ---------------------------------------------------------------------------

TEST(Quant, U8Dtype) {
  EXPECT_EQ(dtype_size(DType::U8), 1u);
  EXPECT_EQ(dtype_name(DType::U8), "u8");
  EXPECT_EQ(parse_dtype("u8"), DType::U8);
  EXPECT_EQ(dtype_max(DType::U8), 255.0);
  EXPECT_FALSE(is_fp8(DType::U8));
  EXPECT_EQ(int(DType::U8), int(DType::I64) + 1);  // appended: no existing value moved
  uint8_t b[8];
  for (int v = 0; v < 256; ++v) {
    store_from_double(b, DType::U8, 3, v);
    EXPECT_EQ(b[3], v);
    EXPECT_EQ(load_as_double(b, DType::U8, 3), double(v));
  }
  store_from_double(b, DType::U8, 0, 300.0);
  store_from_double(b, DType::U8, 1, -5.0);
  store_from_double(b, DType::U8, 2, 7.9);
  EXPECT_EQ(b[0], 255);  // clamped, like a saturating cast
  EXPECT_EQ(b[1], 0);
  EXPECT_EQ(b[2], 7);  // truncated, like the other integer dtypes
  const Tensor t = Tensor::host_from({0, 1, 128, 255}, DType::U8, {4});
  EXPECT_EQ(t.nbytes(), 4u);
  EXPECT_EQ(t.ptr<uint8_t>()[2], 128);
  EXPECT_EQ(t.to(DType::F32).to_doubles(), (std::vector<double>{0, 1, 128, 255}));
}

TEST(Quant, FlavorNames) {
  EXPECT_EQ(fp8_flavor_name(Fp8Flavor::E4M3FN), "e4m3fn");
  EXPECT_EQ(fp8_flavor_name(Fp8Flavor::E4M3FNUZ), "e4m3fnuz");
  EXPECT_EQ(fp8_dtype(Fp8Flavor::E4M3FN), DType::F8_E4M3FN);
  EXPECT_EQ(fp8_dtype(Fp8Flavor::E4M3FNUZ), DType::F8_E4M3FNUZ);
}

// ---- per-tensor fp8 --------------------------------------------------------------------------------

TEST(Quant, Fp8PerTensorErrorBound) {
  const Shape shape{48, 80};  // [N, K]
  std::vector<double> v = randn(48 * 80, 1, 0.02);
  v[1234] = -0.125;  // the amax, negative
  v[7] = 0.0;
  v[8] = 3e-9;  // far below the smallest step: rounds to 0
  v[9] = 1e-6;  // subnormal in fp8 units
  v[10] = -2.5e-6;
  const Tensor w = Tensor::host_from(v, DType::F32, shape);
  const Fp8Weight q = quantize_fp8_per_tensor(w, Fp8Flavor::E4M3FN);
  ASSERT_EQ(q.codes.dtype(), DType::F8_E4M3FN);
  ASSERT_EQ(q.codes.shape(), shape);
  EXPECT_EQ(q.scale, float(0.125 / 448));
  const uint8_t* c = q.codes.ptr<uint8_t>();
  EXPECT_EQ(c[1234], 0xfe);  // the amax is exactly −448 in fp8 units
  EXPECT_EQ(ref_fn(c[1234]), -448.0);
  EXPECT_EQ(c[7], 0x00);
  EXPECT_EQ(c[8], 0x00);
  const Tensor d = dequantize(q, DType::F64);
  ASSERT_EQ(d.shape(), shape);
  int used = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    const double wv = double(float(v[i]));
    const double x = wv / double(q.scale);  // the value in fp8 units
    const double got = ref_fn(c[i]);
    EXPECT_LE(std::fabs(got - x), fn_quantum(x) / 2 + std::fabs(x) * 0x1p-23) << i << " x " << x;
    EXPECT_EQ(d.at(i), got * double(q.scale)) << i;  // dequantize: code × scale, exactly
    EXPECT_LE(std::fabs(got), 448.0);
    used += (c[i] & 0x7f) > 0 && (c[i] & 0x7f) < 0x08;
  }
  EXPECT_GE(used, 2);  // the subnormals are in play
  // Dequantized to f32 / bf16 / f16: one rounding of the exact values.
  for (DType t : {DType::F32, DType::BF16, DType::F16}) {
    const Tensor dt = dequantize(q, t);
    ASSERT_EQ(dt.dtype(), t);
    for (size_t i = 0; i < v.size(); ++i)
      ASSERT_EQ(dt.at(i), Tensor::host_from({d.at(i)}, t, {1}).at(0)) << dtype_name(t) << " " << i;
  }
}

// Every float input dtype gives the same codes and scale for the same values; any rank works.
TEST(Quant, Fp8PerTensorInputDtypesAndRanks) {
  std::vector<double> v = randn(2 * 3 * 40, 2, 3.0);
  for (double& x : v) {  // exact in every dtype: 8 significant bits, within f16's normal range
    x = std::clamp(double(bf16_to_float(float_to_bf16(float(x)))), -3.0, 3.0);
    if (std::fabs(x) < 0x1p-10) x = 0;
  }
  v[5] = 3.0;
  const Fp8Weight ref = quantize_fp8_per_tensor(Tensor::host_from(v, DType::F64, {240}), Fp8Flavor::E4M3FN);
  for (DType t : {DType::F32, DType::BF16, DType::F16}) {
    for (const Shape& s : {Shape{240}, Shape{2, 3, 40}, Shape{6, 40}, Shape{1, 1, 1, 240}}) {
      const Fp8Weight q = quantize_fp8_per_tensor(Tensor::host_from(v, t, s), Fp8Flavor::E4M3FN);
      EXPECT_EQ(q.scale, ref.scale) << dtype_name(t);
      ASSERT_EQ(q.codes.shape(), s);
      for (size_t i = 0; i < v.size(); ++i)
        ASSERT_EQ(q.codes.ptr<uint8_t>()[i], ref.codes.ptr<uint8_t>()[i]) << dtype_name(t) << " " << i;
    }
  }
  // A scalar (rank 0).
  const Fp8Weight s = quantize_fp8_per_tensor(Tensor::host_from({-2.5}, DType::F32, {}), Fp8Flavor::E4M3FN);
  EXPECT_EQ(s.codes.ptr<uint8_t>()[0], 0xfe);
  EXPECT_EQ(dequantize(s, DType::F64).at(0), -448.0 * double(float(2.5 / 448)));
}

TEST(Quant, Fp8PerTensorZerosAndTinyTensors) {
  for (Fp8Flavor f : {Fp8Flavor::E4M3FN, Fp8Flavor::E4M3FNUZ}) {
    // Scale 1 for fn; the fnuz path normalizes that fn result, doubling it.
    const float one = f == Fp8Flavor::E4M3FN ? 1.0f : 2.0f;
    const Fp8Weight z = quantize_fp8_per_tensor(Tensor::host(DType::BF16, {3, 5}), f);
    EXPECT_EQ(z.scale, one);
    for (int i = 0; i < 15; ++i) EXPECT_EQ(z.codes.ptr<uint8_t>()[i], 0);
    const Fp8Weight nz = quantize_fp8_per_tensor(Tensor::host_from({0.0, -0.0}, DType::F32, {2}), f);
    EXPECT_EQ(nz.scale, one);
    EXPECT_EQ(nz.codes.ptr<uint8_t>()[1], f == Fp8Flavor::E4M3FN ? 0x80 : 0x00);
    EXPECT_EQ(dequantize(nz, DType::F32).at(1), 0.0);
    EXPECT_EQ(quantize_fp8_per_tensor(Tensor::host(DType::F32, {0, 4}), f).codes.numel(), 0);
  }
  // amax / 448 would be a subnormal f32: the scale stops at 2^-126 and the values still round
  // to the nearest step.
  const std::vector<double> tiny{1e-40, -5e-41, 3e-42};
  const Fp8Weight t = quantize_fp8_per_tensor(Tensor::host_from(tiny, DType::F32, {3}), Fp8Flavor::E4M3FN);
  EXPECT_EQ(t.scale, 0x1p-126f);
  for (size_t i = 0; i < tiny.size(); ++i) {
    const double x = double(float(tiny[i])) / double(t.scale);
    EXPECT_LE(std::fabs(ref_fn(t.codes.ptr<uint8_t>()[i]) - x), fn_quantum(x) / 2) << i;
  }
  EXPECT_NE(t.codes.ptr<uint8_t>()[0], 0);
  // f64 values beyond the f32 range are fine as long as the scale is an f32.
  const Fp8Weight big = quantize_fp8_per_tensor(Tensor::host_from({1e40, -2.5e40}, DType::F64, {2}),
                                                Fp8Flavor::E4M3FN);
  EXPECT_EQ(big.scale, float(2.5e40 / 448));
  EXPECT_EQ(big.codes.ptr<uint8_t>()[1], 0xfe);
}

// The fnuz path: the same values as the fn path, scale × 2, no 0x80 (fnuz's NaN) anywhere.
TEST(Quant, Fp8FnuzValuesEqualFnValues) {
  std::vector<double> v = randn(64 * 33, 3, 0.5);
  v[100] = 2.0;
  for (int i = 0; i < 20; ++i) v[size_t(200 + i)] = -1e-7 * (i + 1);  // −0 in fn units
  v[300] = -0.0;
  const Tensor w = Tensor::host_from(v, DType::F32, {64, 33});
  const Fp8Weight fn = quantize_fp8_per_tensor(w, Fp8Flavor::E4M3FN);
  const Fp8Weight nuz = quantize_fp8_per_tensor(w, Fp8Flavor::E4M3FNUZ);
  ASSERT_EQ(nuz.codes.dtype(), DType::F8_E4M3FNUZ);
  ASSERT_EQ(nuz.codes.shape(), (Shape{64, 33}));
  EXPECT_EQ(nuz.scale, fn.scale * 2);
  int neg_zeros = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    const uint8_t a = fn.codes.ptr<uint8_t>()[i], b = nuz.codes.ptr<uint8_t>()[i];
    neg_zeros += a == 0x80;
    EXPECT_NE(b, 0x80) << i;
    EXPECT_EQ(b, a == 0x80 ? 0 : a) << i;
  }
  EXPECT_GE(neg_zeros, 21);  // the −0 case is exercised
  for (DType out : {DType::F64, DType::F32, DType::BF16, DType::F16}) {
    const std::vector<double> a = dequantize(fn, out).to_doubles(), b = dequantize(nuz, out).to_doubles();
    for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(a[i], b[i]) << dtype_name(out) << " " << i;
  }
  // Largest fnuz magnitude in use is 224 (fn's 448 halved), never beyond fnuz's 240.
  for (size_t i = 0; i < v.size(); ++i)
    EXPECT_LE(std::fabs(fp::e4m3fnuz_decode(nuz.codes.ptr<uint8_t>()[i])), 224.0f);
}

TEST(Quant, NormalizeEveryFnCode) {
  std::vector<uint8_t> codes;
  for (int c = 0; c < 256; ++c)
    if ((c & 0x7f) != 0x7f) codes.push_back(uint8_t(c));
  ASSERT_EQ(codes.size(), 254u);
  Tensor t = Tensor::host(DType::F8_E4M3FN, {2, 127});  // [2, 127]
  std::copy(codes.begin(), codes.end(), t.ptr<uint8_t>());
  const Fp8Weight fn{t, 0.375f};
  const Fp8Weight nuz = normalize_fn_to_fnuz(fn);
  ASSERT_EQ(nuz.codes.dtype(), DType::F8_E4M3FNUZ);
  ASSERT_EQ(nuz.codes.shape(), (Shape{2, 127}));
  EXPECT_EQ(nuz.scale, 0.75f);
  const Tensor d = dequantize(nuz, DType::F64);
  for (size_t i = 0; i < codes.size(); ++i) {
    const uint8_t z = nuz.codes.ptr<uint8_t>()[i];
    EXPECT_EQ(z, codes[i] == 0x80 ? 0 : codes[i]);
    // fnuz fields: bias 8 — the value is fn's, read at half, times the doubled scale.
    const double want = ref_fn(codes[i]) * 0.375;
    EXPECT_EQ(double(fp::e4m3fnuz_decode(z)) * 0.75, want) << int(codes[i]);
    EXPECT_EQ(d.at(i), want) << int(codes[i]);
  }
  expect_error([&] { normalize_fn_to_fnuz(nuz); }, {"normalize_fn_to_fnuz", "fp8_e4m3fn", "fp8_e4m3fnuz"});
  for (uint8_t nan : {0x7f, 0xff}) {
    Tensor bad = t.clone();
    bad.ptr<uint8_t>()[130] = nan;
    expect_error([&] { normalize_fn_to_fnuz({bad, 1.0f}); }, {"NaN", "[1, 3]"});
  }
  expect_error([&] { normalize_fn_to_fnuz({t, 3e38f}); }, {"overflow"});
  expect_error([&] { normalize_fn_to_fnuz({t, std::nanf("")}); }, {"scale"});
  expect_error([&] { normalize_fn_to_fnuz({Tensor(), 1.0f}); }, {"undefined"});
}

// A hand-made DeepSeek-style block-fp8 weight: different scales per block, partial edge blocks.
TEST(Quant, BlockFp8ToPerTensor) {
  const int64_t N = 7, K = 11, B = 4;  // scale_inv [2, 3]; the last row and column blocks are partial
  const std::vector<double> sc{0.5, 2.0, 0.0078125, 3.0, 0.25, 1.5};
  Tensor s = Tensor::host_from(sc, DType::F32, {2, 3});  // [ceil(N/B), ceil(K/B)]
  Tensor w = Tensor::host(DType::F8_E4M3FN, {N, K});       // [N, K]
  std::vector<double> want(size_t(N * K));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      uint8_t c = uint8_t((n * 37 + k * 11) % 254);
      if ((c & 0x7f) == 0x7f) c = 0x3f;
      w.ptr<uint8_t>()[n * K + k] = c;
      want[size_t(n * K + k)] = ref_fn(c) * sc[size_t((n / B) * 3 + k / B)];
    }
  double amax = 0;
  for (double x : want) amax = std::max(amax, std::fabs(x));
  const Fp8Weight q = block_fp8_to_per_tensor(w, s, Fp8Flavor::E4M3FN, B);
  ASSERT_EQ(q.codes.shape(), (Shape{N, K}));
  EXPECT_EQ(q.scale, float(amax / 448));
  const Tensor d = dequantize(q, DType::F64);
  for (size_t i = 0; i < want.size(); ++i) {
    const double x = want[i] / double(q.scale);
    EXPECT_LE(std::fabs(d.at(i) / double(q.scale) - x), fn_quantum(x) / 2 + std::fabs(x) * 0x1p-23)
        << "element " << i << " want " << want[i] << " got " << d.at(i);
  }
  // fnuz: the very same values.
  const Fp8Weight z = block_fp8_to_per_tensor(w, s, Fp8Flavor::E4M3FNUZ, B);
  EXPECT_EQ(z.codes.dtype(), DType::F8_E4M3FNUZ);
  EXPECT_EQ(dequantize(z, DType::F64).to_doubles(), d.to_doubles());

  // The default 128 blocks, with partial edges: [130, 200] → scale_inv [2, 2].
  Tensor w2 = Tensor::host(DType::F8_E4M3FN, {130, 200});
  for (int64_t i = 0; i < w2.numel(); ++i) w2.ptr<uint8_t>()[i] = uint8_t(0x30 + i % 8);  // 0.5 .. 0.9375
  const Tensor s2 = Tensor::host_from({1.0, 0.5, 0.25, 4.0}, DType::F32, {2, 2});
  const Fp8Weight q2 = block_fp8_to_per_tensor(w2, s2, Fp8Flavor::E4M3FN);
  EXPECT_EQ(q2.scale, float(0.9375 * 4 / 448));  // amax sits in the bottom-right partial block
  const Tensor d2 = dequantize(q2, DType::F64);
  for (int64_t n : {0, 127, 128, 129})
    for (int64_t k : {0, 1, 127, 128, 199}) {
      const double v = ref_fn(uint8_t(0x30 + (n * 200 + k) % 8)) * s2.at(size_t((n / 128) * 2 + k / 128));
      const double x = v / double(q2.scale);
      EXPECT_LE(std::fabs(d2.at(size_t(n * 200 + k)) / double(q2.scale) - x), fn_quantum(x) / 2 + x * 0x1p-23)
          << n << ", " << k;
    }

  // Bad inputs.
  expect_error([&] { block_fp8_to_per_tensor(w.to(DType::F32), s, Fp8Flavor::E4M3FN, B); },
               {"block_fp8_to_per_tensor", "fp8_e4m3fn", "f32"});
  expect_error([&] { block_fp8_to_per_tensor(w, Tensor::host(DType::F32, {2, 2}), Fp8Flavor::E4M3FN, B); },
               {"block_fp8_to_per_tensor", "scale_inv", "[2, 2]", "[2, 3]"});
  expect_error([&] { block_fp8_to_per_tensor(w, s.to(DType::BF16), Fp8Flavor::E4M3FN, B); },
               {"block_fp8_to_per_tensor", "scale_inv", "bf16"});
  Tensor wn = w.clone();
  wn.ptr<uint8_t>()[3 * K + 9] = 0xff;
  expect_error([&] { block_fp8_to_per_tensor(wn, s, Fp8Flavor::E4M3FN, B); }, {"[3, 9]", "0xff"});
  Tensor si = s.clone();
  si.ptr<float>()[5] = INFINITY;
  expect_error([&] { block_fp8_to_per_tensor(w, si, Fp8Flavor::E4M3FN, B); }, {"[4, 8]", "inf"});
  expect_error([&] { block_fp8_to_per_tensor(w, s, Fp8Flavor::E4M3FN, 0); }, {"block"});
}

// ---- MXFP4 ------------------------------------------------------------------------------------

TEST(Quant, Mxfp4PackingLayout) {
  // One row of 64: block 0 has amax 6 (scale 1), so elements are their own e2m1 codes; block 1
  // is block 0 × 2^-10 (scale 2^-10, the same codes).
  const double grid[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6};
  std::vector<double> v(64);
  for (int i = 0; i < 32; ++i) {
    v[size_t(i)] = grid[(3 * i + 1) % 16];
    v[size_t(32 + i)] = v[size_t(i)] * 0x1p-10;
  }
  const Mxfp4Weight m = quantize_mxfp4(Tensor::host_from(v, DType::F32, {1, 64}));
  ASSERT_EQ(m.packed.dtype(), DType::U8);
  ASSERT_EQ(m.scales.dtype(), DType::U8);
  ASSERT_EQ(m.packed.shape(), (Shape{1, 32}));
  ASSERT_EQ(m.scales.shape(), (Shape{1, 2}));
  EXPECT_EQ(m.shape, (Shape{1, 64}));
  EXPECT_EQ(m.scales.ptr<uint8_t>()[0], 127);
  EXPECT_EQ(m.scales.ptr<uint8_t>()[1], 127 - 10);
  const uint8_t* p = m.packed.ptr<uint8_t>();
  for (int i = 0; i < 16; ++i) {
    const int lo = (6 * i + 1) % 16, hi = (6 * i + 4) % 16;  // codes of elements 2i and 2i+1
    EXPECT_EQ(p[i], uint8_t(hi << 4 | lo)) << "byte " << i;
    EXPECT_EQ(p[16 + i], p[i]) << "byte " << 16 + i;
  }
  EXPECT_EQ(p[0], 0x41);  // element 0 = 0.5 (code 1) low, element 1 = 2 (code 4) high
  EXPECT_EQ(p[1], 0xa7);  // element 2 = 6 (code 7), element 3 = −1 (code 0xa)
  const Tensor d = dequantize(m, DType::F32);
  for (size_t i = 0; i < 64; ++i) EXPECT_EQ(d.at(i), v[i]) << i;  // all on the grid: exact
}

TEST(Quant, Mxfp4MatchesTheBlockQuantizer) {
  const Shape shape{3, 2, 96};  // [.., K]: 3 blocks per row
  std::vector<double> v = randn(3 * 2 * 96, 4);
  for (size_t i = 0; i < v.size(); ++i) v[i] *= pow2(int(i / 32) % 7 * 5 - 15);  // scales differ
  const Tensor w = Tensor::host_from(v, DType::F32, shape);
  const Mxfp4Weight m = quantize_mxfp4(w);
  ASSERT_EQ(m.packed.shape(), (Shape{3, 2, 48}));
  ASSERT_EQ(m.scales.shape(), (Shape{3, 2, 3}));
  ASSERT_EQ(m.shape, shape);
  const Tensor d = dequantize(m, DType::F32), d64 = dequantize(m, DType::F64);
  ASSERT_EQ(d.shape(), shape);
  std::vector<int> codes_seen(256);
  for (int64_t r = 0; r < 6; ++r)
    for (int64_t b = 0; b < 3; ++b) {
      float blk[32];
      for (int j = 0; j < 32; ++j) blk[j] = float(v[size_t(r * 96 + 32 * b + j)]);
      uint8_t want[16];
      const uint8_t code = fp::mxfp4_quantize_block(blk, want);
      ASSERT_EQ(m.scales.ptr<uint8_t>()[r * 3 + b], code) << r << ", " << b;
      ++codes_seen[code];
      const float scale = fp::e8m0_decode(code);
      for (int j = 0; j < 16; ++j) ASSERT_EQ(m.packed.ptr<uint8_t>()[r * 48 + 16 * b + j], want[j]);
      for (int j = 0; j < 32; ++j) {
        const size_t i = size_t(r * 96 + 32 * b + j);
        const uint8_t byte = m.packed.ptr<uint8_t>()[r * 48 + 16 * b + j / 2];
        const uint8_t nib = j % 2 ? byte >> 4 : byte & 0xf;
        ASSERT_EQ(d.at(i), double(fp::e2m1_decode(nib) * scale)) << i;
        ASSERT_EQ(d64.at(i), d.at(i));
        ASSERT_LE(std::fabs(d.at(i) - double(blk[j])), double(scale)) << i;  // half of 4 → 6, or clipping
      }
    }
  int distinct = 0;
  for (int n : codes_seen) distinct += n > 0;
  EXPECT_GE(distinct, 6);
  // bf16 and f64 inputs holding the same values quantize identically.
  for (DType t : {DType::BF16, DType::F64}) {
    std::vector<double> vb(v.size());
    for (size_t i = 0; i < v.size(); ++i) vb[i] = double(bf16_to_float(float_to_bf16(float(v[i]))));
    const Mxfp4Weight a = quantize_mxfp4(Tensor::host_from(vb, t, shape));
    const Mxfp4Weight b = quantize_mxfp4(Tensor::host_from(vb, DType::F32, shape));
    EXPECT_EQ(bytes_of(a.packed), bytes_of(b.packed)) << dtype_name(t);
    EXPECT_EQ(bytes_of(a.scales), bytes_of(b.scales)) << dtype_name(t);
  }
  // Rank 1.
  const Mxfp4Weight one = quantize_mxfp4(Tensor::host_from(std::vector<double>(32, 1.0), DType::F32, {32}));
  EXPECT_EQ(one.packed.shape(), (Shape{16}));
  EXPECT_EQ(one.scales.shape(), (Shape{1}));
  EXPECT_EQ(dequantize(one, DType::BF16).to_doubles(), std::vector<double>(32, 1.0));
}

// ---- bad inputs -------------------------------------------------------------------------------------

TEST(Quant, BadInputs) {
  const Tensor ok = Tensor::host_from(randn(64, 5), DType::F32, {2, 32});
  // Not on the host: a tensor that claims to live on a device (its bytes are never read).
  const Tensor dev(DType::F32, {2, 32}, Platform::CUDA, std::shared_ptr<void>(std::calloc(64, 4), std::free));
  for (Fp8Flavor f : {Fp8Flavor::E4M3FN, Fp8Flavor::E4M3FNUZ}) {
    expect_error([&] { quantize_fp8_per_tensor(dev, f); }, {"quantize_fp8_per_tensor", "host", "cuda"});
    expect_error([&] { quantize_fp8_per_tensor(Tensor::host(DType::I32, {4}), f); },
                 {"quantize_fp8_per_tensor", "dtype", "i32"});
    expect_error([&] { quantize_fp8_per_tensor(Tensor::host(DType::F8_E4M3FN, {4}), f); },
                 {"dtype", "fp8_e4m3fn"});
    expect_error([&] { quantize_fp8_per_tensor(Tensor::host(DType::U8, {4}), f); }, {"dtype", "u8"});
    expect_error([&] { quantize_fp8_per_tensor(Tensor(), f); }, {"undefined"});
    for (double bad : {double(NAN), double(INFINITY), -double(INFINITY)}) {
      Tensor t = ok.clone();
      t.set(37, bad);
      expect_error([&] { quantize_fp8_per_tensor(t, f); }, {"non-finite", "[1, 5]"}, std::to_string(bad));
    }
    expect_error([&] { quantize_fp8_per_tensor(Tensor::host_from({1e300}, DType::F64, {1}), f); },
                 {"scale", "f32"});
  }
  expect_error([&] { dequantize(Fp8Weight{Tensor::host(DType::F32, {2}), 1.f}, DType::F32); },
               {"codes", "f32"});
  const Fp8Weight q = quantize_fp8_per_tensor(ok, Fp8Flavor::E4M3FN);
  expect_error([&] { dequantize(q, DType::I64); }, {"output dtype", "i64"});
  expect_error([&] { dequantize(q, DType::F8_E4M3FN); }, {"output dtype", "fp8_e4m3fn"});
  expect_error([&] { dequantize(Fp8Weight{q.codes, -1.f}, DType::F32); }, {"scale"});
  expect_error([&] { dequantize(Fp8Weight{q.codes, INFINITY}, DType::F32); }, {"scale"});
  Tensor nanq = q.codes.clone();
  nanq.ptr<uint8_t>()[33] = 0x7f;
  expect_error([&] { dequantize(Fp8Weight{nanq, 1.f}, DType::F32); }, {"NaN", "0x7f", "[1, 1]"});
  Tensor nanz = Tensor::host(DType::F8_E4M3FNUZ, {3});
  nanz.ptr<uint8_t>()[2] = 0x80;
  expect_error([&] { dequantize(Fp8Weight{nanz, 1.f}, DType::F32); }, {"NaN", "0x80", "[2]"});

  // MXFP4.
  for (int64_t K : {48, 31, 16, 1}) {
    expect_error([&] { quantize_mxfp4(Tensor::host(DType::F32, {4, K})); },
                 {"quantize_mxfp4", "K = " + std::to_string(K), "multiple of 32"});
  }
  expect_error([&] { quantize_mxfp4(Tensor::host(DType::F32, {})); }, {"rank"});
  expect_error([&] { quantize_mxfp4(Tensor::host(DType::I32, {64})); }, {"dtype", "i32"});
  expect_error([&] { quantize_mxfp4(dev); }, {"host"});
  expect_error([&] { quantize_mxfp4(Tensor::host_from(std::vector<double>(32, 1e39), DType::F64, {32})); },
               {"f32"});
  {
    Tensor t = ok.clone();
    t.set(40, NAN);
    expect_error([&] { quantize_mxfp4(t); }, {"quantize_mxfp4", "[1, 8]"});
  }
  const Mxfp4Weight m = quantize_mxfp4(ok);
  expect_error([&] { dequantize(m, DType::U8); }, {"output dtype", "u8"});
  expect_error([&] { dequantize(Mxfp4Weight{m.packed, m.scales, {2, 64}}, DType::F32); },
               {"[2, 16]", "[2, 2]", "[2, 32]"});
  expect_error([&] { dequantize(Mxfp4Weight{m.packed, m.scales, {2, 48}}, DType::F32); }, {"K = 48"});
  expect_error([&] { dequantize(Mxfp4Weight{m.packed.to(DType::F32), m.scales, m.shape}, DType::F32); },
               {"u8", "f32"});
  Mxfp4Weight nan_scale{m.packed, m.scales.clone(), m.shape};
  nan_scale.scales.ptr<uint8_t>()[1] = 0xff;
  expect_error([&] { dequantize(nan_scale, DType::F32); }, {"NaN", "0xff", "[1, 0]"});
}

}  // namespace
}  // namespace mla
