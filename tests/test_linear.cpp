// Ops::linear on every platform against a double reference: a few rows (decode) and many; bf16 and
// f32 weights (the router's, with bf16 activations: mixed dtypes), N and K that are not multiples
// of 8, 16 or 64; up to 16 rows in bf16 with each row's bits the same alone and in the batch.
// Ops::absorb_q (a GEMM per head) at the models' head shapes likewise, with each row's bits the
// same alone and in a batch.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <tuple>
#include <utility>
#include <vector>

#include "harness.h"
#include "mla/platform_ops.h"

namespace mla {
namespace {

std::vector<Platform> platforms() { return test::available_platforms(); }

// Largest |got − want| over the largest |want|. Measured: f32 out 3.7e-7 on the CPU, 3.0e-6 on the
// H200 (cuBLAS, bf16 weights into f32 out); bf16 out 3.0e-3 (the output's own rounding, 2⁻⁹ of a
// value).
double tolerance(DType out) { return out == DType::F32 ? 1e-5 : 1e-2; }

// Largest |y − x · wᵀ| over the largest |x · wᵀ| (in double), x [M, K], w [N, K], y [M, N].
double linear_error(const std::vector<double>& xd, const std::vector<double>& wd, const std::vector<double>& got,
                    int64_t M, int64_t N, int64_t K) {
  double err = 0, scale = 0;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double want = 0;
      for (int64_t k = 0; k < K; ++k) want += xd[size_t(m * K + k)] * wd[size_t(n * K + k)];
      err = std::max(err, std::abs(got[size_t(m * N + n)] - want)), scale = std::max(scale, std::abs(want));
    }
  return err / scale;
}

TEST(Linear, FewAndManyRowsMatchTheReference) {
  double worst[2] = {0, 0};  // bf16 out, f32 out
  // (activations, weights, out): the layers' own; f32 weights with f32 out, as the router; bf16
  // weights with f32 out, as lm_head's logits.
  const std::vector<std::tuple<DType, DType, DType>> kinds{
      {DType::F32, DType::F32, DType::F32},   {DType::BF16, DType::BF16, DType::BF16},
      {DType::BF16, DType::F32, DType::F32},  {DType::BF16, DType::BF16, DType::F32}};
  for (Platform p : platforms())
    for (const auto& [act, wt, yt] : kinds) {
      auto ops = make_ops(p, act);
      for (auto [N, K] : {std::pair<int64_t, int64_t>{37, 1000}, {64, 2048}, {2051, 512}}) {
        Tensor w = ops->empty(wt, {N, K});
        ops->fill_random(w, 11, 1.0 / std::sqrt(double(K)));
        const std::vector<double> wd = ops->download(w).to_doubles();
        for (int64_t M : {1, 2, 3, 5, 8, 9, 33}) {
          SCOPED_TRACE(fmt::format("{} act {} w {} out {} M {} N {} K {}", platform_name(p), dtype_name(act),
                                   dtype_name(wt), dtype_name(yt), M, N, K));
          Tensor x = ops->empty(act, {M, K}), y = ops->empty(yt, {M, N});
          ops->fill_random(x, 12, 1.0);
          ops->linear(x, w, y);
          const double e =
              linear_error(ops->download(x).to_doubles(), wd, ops->download(y).to_doubles(), M, N, K);
          EXPECT_LE(e, tolerance(yt));
          worst[yt == DType::F32] = std::max(worst[yt == DType::F32], e);
        }
      }
    }
  std::cout << "[ linear ] worst max err / max |out|: bf16 out " << worst[0] << ", f32 out " << worst[1] << "\n";
}

// Decode batches in bf16 at V2-Lite's projection shapes (q_proj, kv_a_proj_with_mqa, a shared
// expert's down) and two small ones (a reduction that ends inside a 256-wide stage, N = 8): CUDA takes
// its own kernel up to 16 rows (linear_small.cu). Every platform matches the reference; on the CPU
// and CUDA each row has the same bits alone as inside the batch (ROCm's GEMM switches kernels at 8
// rows). Measured on an H100: 3.1e-3 of the largest |out| (the output's bf16 rounding).
TEST(Linear, UpToSixteenRowsARowKeepsItsBitsAlone) {
  double worst = 0;
  for (Platform p : platforms()) {
    auto ops = make_ops(p, DType::BF16);
    for (auto [N, K] : {std::pair<int64_t, int64_t>{3072, 2048}, {576, 2048}, {2048, 2816}, {72, 192}, {8, 64}}) {
      Tensor w = ops->empty(DType::BF16, {N, K});
      ops->fill_random(w, 41, 1.0 / std::sqrt(double(K)));
      const std::vector<double> wd = ops->download(w).to_doubles();
      for (int64_t M : {1, 2, 7, 16}) {
        SCOPED_TRACE(fmt::format("{} M {} N {} K {}", platform_name(p), M, N, K));
        Tensor x = ops->empty(DType::BF16, {M, K}), y = ops->empty(DType::BF16, {M, N});
        ops->fill_random(x, 42 + uint64_t(M), 1.0);
        ops->linear(x, w, y);
        const std::vector<double> got = ops->download(y).to_doubles();
        const double e = linear_error(ops->download(x).to_doubles(), wd, got, M, N, K);
        EXPECT_LE(e, tolerance(DType::BF16));
        worst = std::max(worst, e);
        if (p == Platform::ROCM || M == 1) continue;
        for (int64_t m : {int64_t(0), M / 2, M - 1}) {
          Tensor one = ops->empty(DType::BF16, {1, N});
          ops->linear(x.rows(m, m + 1), w, one);
          const std::vector<double> alone = ops->download(one).to_doubles();
          for (int64_t n = 0; n < N; ++n)
            ASSERT_EQ(alone[size_t(n)], got[size_t(m * N + n)]) << "row " << m << " alone, column " << n;
        }
      }
    }
  }
  std::cout << "[ linear, up to 16 rows ] worst max err / max |out|: " << worst << "\n";
}

// gate_up = silu(x · gateᵀ) · (x · upᵀ): one launch on CUDA for bf16 decode batches of up to 16 rows,
// bit for bit the two linear calls and silu_mul it replaces (past 16 rows, and elsewhere, it is them).
TEST(GateUp, IsTwoLinearsAndSiluMulBitForBit) {
  for (Platform p : platforms()) {
    auto ops = make_ops(p, DType::BF16);
    for (auto [I, K] : {std::pair<int64_t, int64_t>{2816, 2048}, {1408, 2048}, {24, 192}, {8, 64}}) {
      Tensor gate = ops->empty(DType::BF16, {I, K}), up = ops->empty(DType::BF16, {I, K});
      ops->fill_random(gate, 51, 2.0 / std::sqrt(double(K)));
      ops->fill_random(up, 52, 1.0 / std::sqrt(double(K)));
      for (int64_t M : {1, 3, 16, 17}) {
        SCOPED_TRACE(fmt::format("{} M {} I {} K {}", platform_name(p), M, I, K));
        Tensor x = ops->empty(DType::BF16, {M, K});
        ops->fill_random(x, 53 + uint64_t(M), 1.0);
        Tensor got = ops->empty(DType::BF16, {M, I}), g = ops->empty(DType::BF16, {M, I}),
               u = ops->empty(DType::BF16, {M, I});
        ops->gate_up(x, gate, up, got);
        ops->linear(x, gate, g);
        ops->linear(x, up, u);
        ops->silu_mul(g, u, g);
        const std::vector<double> a = ops->download(got).to_doubles(), b = ops->download(g).to_doubles();
        int64_t nonzero = 0;
        for (size_t i = 0; i < a.size(); ++i) {
          ASSERT_EQ(a[i], b[i]) << "row " << i / size_t(I) << " column " << i % size_t(I);
          nonzero += a[i] != 0;
        }
        EXPECT_GT(nonzero, int64_t(a.size()) / 2);
      }
    }
  }
}

// q_mla[t, h] = [q_nope[t, h] · w_kc[h] | q_pe[t, h]] at DeepSeek's head shape (dn 128, dr 64, L 512;
// the CUDA platform's own kernel takes it in bf16 up to 32 tokens, in blocks of 16; cuBLAS past
// that). Measured: bf16 out 3.2e-3 of the largest |out| on the H200 (the output's rounding); f32
// 5.5e-7 on the CPU (CUDA's f32 goes through cuBLAS, held to the linear bound, not yet measured). A
// row's bits alone and in a batch of up to 32 tokens are the same (past 32, CUDA's cuBLAS may round
// otherwise: docs/engine.md, what holds on CUDA).
TEST(AbsorbQ, MatchesTheReferenceAndARowKeepsItsBitsAlone) {
  constexpr int64_t dn = 128, dr = 64, L = 512;
  double worst[2] = {0, 0};  // bf16, f32
  for (Platform p : platforms())
    for (DType act : {DType::BF16, DType::F32})
      for (int64_t H : {16, 3}) {
        auto ops = make_ops(p, act);
        Tensor w = ops->empty(act, {H, dn, L});
        ops->fill_random(w, 21, 1.0 / std::sqrt(double(dn)));
        const std::vector<double> wd = ops->download(w).to_doubles();
        for (int64_t T : {1, 5, 16, 17, 32, 33, 130}) {
          SCOPED_TRACE(fmt::format("{} {} H {} T {}", platform_name(p), dtype_name(act), H, T));
          Tensor q = ops->empty(act, {T, H, dn + dr}), out = ops->empty(act, {T, H, L + dr});
          ops->fill_random(q, 22 + uint64_t(T), 1.0);
          ops->absorb_q(q, w, dn, dr, out);
          const std::vector<double> qd = ops->download(q).to_doubles(), got = ops->download(out).to_doubles();
          double err = 0, scale = 0;
          for (int64_t t = 0; t < T; ++t)
            for (int64_t h = 0; h < H; ++h) {
              const double* qr = &qd[size_t((t * H + h) * (dn + dr))];
              const double* gr = &got[size_t((t * H + h) * (L + dr))];
              for (int64_t l = 0; l < L; ++l) {
                double want = 0;
                for (int64_t d = 0; d < dn; ++d) want += qr[d] * wd[size_t((h * dn + d) * L + l)];
                err = std::max(err, std::abs(gr[l] - want)), scale = std::max(scale, std::abs(want));
              }
              for (int64_t j = 0; j < dr; ++j) ASSERT_EQ(gr[L + j], qr[dn + j]) << "rope column " << j;
            }
          EXPECT_LE(err / scale, tolerance(act));
          worst[act == DType::F32] = std::max(worst[act == DType::F32], err / scale);
          if (act != DType::BF16 || T > 32) continue;  // (cuBLAS on CUDA: f32, and bf16 past 32 tokens)
          for (int64_t t : {int64_t(0), T / 2, T - 1}) {  // the row alone: the same bits
            Tensor one = ops->empty(act, {1, H, L + dr});
            ops->absorb_q(q.rows(t, t + 1), w, dn, dr, one);
            const std::vector<double> alone = ops->download(one).to_doubles();
            for (size_t i = 0; i < alone.size(); ++i)
              ASSERT_EQ(alone[i], got[size_t(t * H * (L + dr)) + i]) << "row " << t << " alone, element " << i;
          }
        }
      }
  std::cout << "[ absorb_q ] worst max err / max |out|: bf16 " << worst[0] << ", f32 " << worst[1] << "\n";
}

// absorb_q_rope (the MLA method's absorb with q's RoPE, fused on CUDA for decode batches) gives the
// bits of rope on q then absorb_q: bf16 and f32, through the fused kernel (up to 32 tokens) and past
// it, both pair orders, positions up to 163 839, a YaRN attention factor.
TEST(AbsorbQRope, IsRopeThenAbsorbQBitForBit) {
  constexpr int64_t dn = 128, dr = 64, L = 512;
  RopeFrequencies f;
  for (int64_t i = 0; i < dr / 2; ++i) f.inv_freq.push_back(std::pow(10000.0, -2.0 * double(i) / double(dr)));
  f.attention_factor = 1.17;
  for (Platform p : platforms())
    for (DType act : {DType::BF16, DType::F32})
      for (int64_t H : {16, 3})
        for (bool interleave : {true, false}) {
          f.interleave = interleave;
          auto ops = make_ops(p, act);
          Tensor w = ops->empty(act, {H, dn, L});
          ops->fill_random(w, 41, 1.0 / std::sqrt(double(dn)));
          for (int64_t T : {1, 5, 17, 33}) {
            SCOPED_TRACE(fmt::format("{} {} H {} T {} interleave {}", platform_name(p), dtype_name(act), H, T,
                                     interleave));
            std::vector<int32_t> positions;
            for (int64_t t = 0; t < T; ++t) positions.push_back(int32_t((t * 7919 + 3) % 163840));
            Tensor q = ops->empty(act, {T, H, dn + dr}), q2 = ops->empty(act, {T, H, dn + dr});
            ops->fill_random(q, 42 + uint64_t(T), 1.0);
            ops->copy(q, q2);
            Tensor fused = ops->empty(act, {T, H, L + dr}), steps = ops->empty(act, {T, H, L + dr});
            Tensor plain = ops->empty(act, {T, H, L + dr});  // q's rope columns as they were
            ops->absorb_q(q, w, dn, dr, plain);
            ops->absorb_q_rope(q, w, dn, dr, positions, f, fused);
            ops->rope(q2, H, dn + dr, dn, positions, f);
            ops->absorb_q(q2, w, dn, dr, steps);
            const Tensor a = ops->download(fused), b = ops->download(steps);
            ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.nbytes()));
            // Every row's rope columns rotated (no position is 0), its absorbed columns those of plain.
            const std::vector<double> got = a.to_doubles(), before = ops->download(plain).to_doubles();
            for (int64_t r = 0; r < T * H; ++r) {
              int64_t moved = 0;
              for (int64_t j = 0; j < L + dr; ++j) {
                const size_t i = size_t(r * (L + dr) + j);
                if (j < L) ASSERT_EQ(got[i], before[i]) << "row " << r << " column " << j;
                else moved += got[i] != before[i];
              }
              EXPECT_GT(moved, dr / 2) << "row " << r << ": rope columns not rotated";
            }
          }
        }
}

// o[t, h] = o_lat[t, h] · w_vc[h]ᵀ at DeepSeek's head shape (dv 128, L 512; the CUDA platform's own
// kernel takes it in bf16 up to 32 tokens), with each row's bits the same alone up to 32 tokens.
// Measured: bf16 out 3.7e-3 on the H200; f32 1.5e-7 on the CPU.
TEST(AbsorbO, MatchesTheReferenceAndARowKeepsItsBitsAlone) {
  constexpr int64_t dv = 128, L = 512;
  double worst[2] = {0, 0};  // bf16, f32
  for (Platform p : platforms())
    for (DType act : {DType::BF16, DType::F32})
      for (int64_t H : {16, 3}) {
        auto ops = make_ops(p, act);
        Tensor w = ops->empty(act, {H, dv, L});
        ops->fill_random(w, 31, 1.0 / std::sqrt(double(L)));
        const std::vector<double> wd = ops->download(w).to_doubles();
        for (int64_t T : {1, 5, 16, 17, 32, 130}) {
          SCOPED_TRACE(fmt::format("{} {} H {} T {}", platform_name(p), dtype_name(act), H, T));
          Tensor x = ops->empty(act, {T, H, L}), out = ops->empty(act, {T, H, dv});
          ops->fill_random(x, 32 + uint64_t(T), 1.0);
          ops->absorb_o(x, w, out);
          const std::vector<double> xd = ops->download(x).to_doubles(), got = ops->download(out).to_doubles();
          double err = 0, scale = 0;
          for (int64_t t = 0; t < T; ++t)
            for (int64_t h = 0; h < H; ++h)
              for (int64_t d = 0; d < dv; ++d) {
                double want = 0;
                for (int64_t l = 0; l < L; ++l)
                  want += xd[size_t((t * H + h) * L + l)] * wd[size_t((h * dv + d) * L + l)];
                const double g = got[size_t((t * H + h) * dv + d)];
                err = std::max(err, std::abs(g - want)), scale = std::max(scale, std::abs(want));
              }
          EXPECT_LE(err / scale, tolerance(act));
          worst[act == DType::F32] = std::max(worst[act == DType::F32], err / scale);
          if (act != DType::BF16 || T > 32) continue;  // (cuBLAS on CUDA: f32, and bf16 past 32 tokens)
          for (int64_t t : {int64_t(0), T / 2, T - 1}) {
            Tensor one = ops->empty(act, {1, H, dv});
            ops->absorb_o(x.rows(t, t + 1), w, one);
            const std::vector<double> alone = ops->download(one).to_doubles();
            for (size_t i = 0; i < alone.size(); ++i)
              ASSERT_EQ(alone[i], got[size_t(t * H * dv) + i]) << "row " << t << " alone, element " << i;
          }
        }
      }
  std::cout << "[ absorb_o ] worst max err / max |out|: bf16 " << worst[0] << ", f32 " << worst[1] << "\n";
}

}  // namespace
}  // namespace mla
