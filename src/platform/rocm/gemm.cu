// The ROCm platform's GEMM kernel family (CUDA and HIP from this one source; see gemm.h).
//
// Design. One templated SIMT kernel: a block of 256 threads computes a BM×BN tile of Y for one batch
// entry, each thread a TM×TN register micro-tile (rows ty + i·BM/TM, columns tx + j·BN/TN:
// interleaved, so that the float4 reads of the B tile hit distinct banks and the Y stores of a warp
// are contiguous). K advances in tiles of BK: both operand tiles are staged in shared memory as f32,
// k-contiguous ([row][BK + 4], the padding keeps float4 reads conflict-free), double-buffered, and
// the next tile's raw bits are fetched into registers while the current one is multiplied (no
// cp.async: portable). Each thread fetches "units" of 8 consecutive k-values of one row (16 bytes of
// bf16, 32 of f32, 8 of fp8, 4 of packed e2m1); a unit is read with vector loads where the row is
// aligned and the unit lies inside K, element by element (bounds-checked) otherwise.
// Conversion happens between registers and shared memory: weights are decoded (fp8 code·w_scale,
// e2m1·2^e8m0) and activations decoded and, for ActQuant ≠ NONE, quantized and dequantized
// (x̂ = decode(encode(x/s))·s), so the inner loop is plain f32 FMA of exactly x̂·ŵ.
//
// Activation quantization needs the amax of each (row, group) before the first element of the group
// is quantized. Groups are aligned to K-tiles (BK divides the group: 32 for MXFP4, 128 for fp8):
//   group == BK: the amax comes from the tile's own registers, reduced across the BK/8 consecutive
//                lanes that hold the row (gpu::shfl_xor, offsets < 8: within any 32-lane group);
//   group  > BK: when a tile starts a group, the same threads first scan the group's values of their
//                row straight from global memory (the group's tiles, bounds-checked: the last group
//                may be partial), reduce likewise, and keep the scale in a register for the group's
//                tiles. This re-reads the activation once (from L2) and needs no workspace and no
//                extra launch.
// Tile configurations (gemm.h, detail::GemmTile): LARGE 128×128/8×8/BK 16, MEDIUM 64×64/4×4/BK 32,
// NARROW 32×64/2×4/BK 32, SMALL 16×32/2×1/BK 32; and a second kernel, SKINNY (skinny_k below), for
// ≤ 8 rows: 32-lane groups sweep K along weight rows and reduce with shuffles, X staged per
// 1024-wide chunk (whole groups, so its group amax needs no pre-scan). All use 256 threads and at
// most 40 KiB of static shared memory (AMD's LDS limit is 64 KiB).
// Per-element format work uses bit-exact fast forms of the fp:: conversions (dec_e4m3, fake_e4m3…).
#include <cstdint>

#include "mla/fp_formats.h"
#include "platform/gpu/gpu_check.h"
#include "platform/gpu/gpu_runtime.h"
#include "platform/rocm/gemm.h"

namespace mla::rocm {
namespace {

using gpu::Elem;

enum XKind : int { XK_F32 = 0, XK_BF16 = 1 };
enum WKind : int { WK_F32 = 0, WK_BF16 = 1, WK_FN = 2, WK_FNUZ = 3, WK_MX = 4 };
enum QMode : int { QM_NONE = 0, QM_FP8 = 1, QM_MX = 2 };

constexpr int kThreads = 256;

// ---- fast, exact equivalents of the fp:: conversions the kernels need per element ---------------
// fp_formats.h is the definition; these compute the same bits with a few integer operations
// (checked bit for bit against it: every code for the decoders, every f32 input for the round trips).
#define MLA_GEMM_HD __host__ __device__ __forceinline__

// e4m3 code → value (BIAS 7: e4m3fn, 8: e4m3fnuz) = fp::e4m3fn_decode / fp::e4m3fnuz_decode.
template <int BIAS>
MLA_GEMM_HD float dec_e4m3(uint32_t c) {
  if (BIAS == 7 ? (c & 0x7fu) == 0x7fu : c == 0x80u) return fp::bits_f32(0x7fc00000u);
  const uint32_t e = (c >> 3) & 0xfu, m = c & 7u, sg = (c & 0x80u) << 24;
  if (e == 0) {  // subnormal: m · 2^(1 − BIAS − 3)
    const float v = float(m) * fp::bits_f32(uint32_t(127 + 1 - BIAS - 3) << 23);
    return fp::bits_f32(fp::f32_bits(v) | sg);
  }
  return fp::bits_f32(sg | ((e + 127u - BIAS) << 23) | (m << 20));
}

// e2m1 nibble → value = fp::e2m1_decode: 0, 0.5, then 1, 1.5, 2, 3, 4, 6 (2^(a/2 − 1)·(1 + (a&1)/2)).
MLA_GEMM_HD float dec_e2m1(uint32_t nib) {
  const uint32_t a = nib & 7u, sg = (nib & 8u) << 28;
  const uint32_t mag = a < 2 ? (a ? 0x3f000000u : 0u) : ((((a >> 1) + 126u) << 23) | ((a & 1u) << 22));
  return fp::bits_f32(sg | mag);
}

// decode(encode(t)) for e4m3 (fn: BIAS 7, max 448; fnuz: BIAS 8, max 240, no −0): round to nearest
// even on 3 mantissa bits, saturating; subnormals rounded by adding and removing 2^(23 + quantum
// exponent) (f32 addition rounds to nearest even at exactly the subnormal quantum).
template <int BIAS>
MLA_GEMM_HD float fake_e4m3(float t) {
  constexpr float kMax = BIAS == 7 ? 448.0f : 240.0f;
  constexpr float kC = BIAS == 7 ? 16384.0f : 8192.0f;  // 2^(23 + 1 − BIAS − 3)
  const uint32_t u = fp::f32_bits(t), a = u & 0x7fffffffu, sg = u & 0x80000000u;
  if (a > 0x7f800000u) return fp::bits_f32(0x7fc00000u);
  const float af = fp::bits_f32(a);
  float r;
  if (af > kMax) r = kMax;
  else if (a < (uint32_t(127 + 1 - BIAS) << 23)) r = (af + kC) - kC;
  else r = fp::bits_f32((a + 0x7ffffu + ((a >> 20) & 1u)) & 0xfff00000u);
  if (BIAS == 8 && r == 0.0f) return 0.0f;
  return fp::bits_f32(fp::f32_bits(r) | sg);
}

// e2m1_decode(e2m1_encode(t)) for finite t: nearest even on 1 mantissa bit, quantum 0.5 below 1,
// saturating at 6.
MLA_GEMM_HD float fake_e2m1(float t) {
  const uint32_t u = fp::f32_bits(t), a = u & 0x7fffffffu, sg = u & 0x80000000u;
  const float af = fp::bits_f32(a);
  float r;
  if (af > 6.0f) r = 6.0f;
  else if (a < 0x3f800000u) r = (af + 4194304.0f) - 4194304.0f;  // 2^22: rounds to multiples of 0.5
  else r = fp::bits_f32((a + 0x1fffffu + ((a >> 22) & 1u)) & 0xffc00000u);
  return fp::bits_f32(fp::f32_bits(r) | sg);
}

struct KArgs {
  const void* x;
  int64_t x_ld, x_bs;
  const void* w;
  int64_t w_ld, w_bs;
  const uint8_t* ws;
  int64_t s_ld, s_bs;
  void* y;
  int64_t y_ld, y_bs;
  int64_t M, N, K;
  float w_scale;
  float q_max;  // fp8 max of the activation flavour (QM_FP8)
  int xk, wk;
  bool x_vec, w_vec, y_bf16, q_fnuz;
};

// ---- units: 8 consecutive k-values of one row, as raw bits (the memory image) -----------------
// f32: r[j] = element j; bf16: r[j/2] holds elements j (low half) and j+1; fp8: r[j/4] byte j%4;
// MXFP4: r[0] the 4 packed bytes (element j = nibble j), r[1] the e8m0 scale code.
// Out of range (row ≥ M/N, k ≥ K) is all zero bits, which every format decodes to 0.

__device__ __forceinline__ void load_x(uint32_t (&r)[8], const KArgs& a, int64_t b, int64_t m, int64_t k,
                                       bool active) {
#pragma unroll
  for (int j = 0; j < 8; ++j) r[j] = 0;
  if (!active || m >= a.M || k >= a.K) return;
  const int64_t off = b * a.x_bs + m * a.x_ld + k;
  const bool full = a.x_vec && k + 8 <= a.K;
  if (a.xk == XK_F32) {
    const float* p = static_cast<const float*>(a.x) + off;
    if (full) {
      const uint4 lo = *reinterpret_cast<const uint4*>(p), hi = *reinterpret_cast<const uint4*>(p + 4);
      r[0] = lo.x, r[1] = lo.y, r[2] = lo.z, r[3] = lo.w, r[4] = hi.x, r[5] = hi.y, r[6] = hi.z, r[7] = hi.w;
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j)
        if (k + j < a.K) r[j] = fp::f32_bits(p[j]);
    }
  } else {
    const uint16_t* p = static_cast<const uint16_t*>(a.x) + off;
    if (full) {
      const uint4 v = *reinterpret_cast<const uint4*>(p);
      r[0] = v.x, r[1] = v.y, r[2] = v.z, r[3] = v.w;
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j)
        if (k + j < a.K) r[j >> 1] |= uint32_t(p[j]) << (16 * (j & 1));
    }
  }
}

__device__ __forceinline__ void decode_x(const uint32_t (&r)[8], int xk, float (&v)[8]) {
  if (xk == XK_F32) {
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = fp::bits_f32(r[j]);
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = fp::bits_f32((j & 1) ? (r[j >> 1] & 0xffff0000u) : (r[j >> 1] << 16));
  }
}

__device__ __forceinline__ void load_w(uint32_t (&r)[8], const KArgs& a, int64_t b, int64_t n, int64_t k,
                                       bool active) {
#pragma unroll
  for (int j = 0; j < 8; ++j) r[j] = 0;
  if (!active || n >= a.N || k >= a.K) return;
  const bool full = a.w_vec && k + 8 <= a.K;
  if (a.wk == WK_MX) {  // K % 32 == 0: a unit is never partial
    const uint8_t* p = static_cast<const uint8_t*>(a.w) + b * a.w_bs + n * a.w_ld + (k >> 1);
    if (a.w_vec) {
      r[0] = *reinterpret_cast<const uint32_t*>(p);
    } else {
      r[0] = uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
    }
    r[1] = a.ws[b * a.s_bs + n * a.s_ld + (k >> 5)];
    return;
  }
  const int64_t off = b * a.w_bs + n * a.w_ld + k;
  if (a.wk == WK_F32) {
    const float* p = static_cast<const float*>(a.w) + off;
    if (full) {
      const uint4 lo = *reinterpret_cast<const uint4*>(p), hi = *reinterpret_cast<const uint4*>(p + 4);
      r[0] = lo.x, r[1] = lo.y, r[2] = lo.z, r[3] = lo.w, r[4] = hi.x, r[5] = hi.y, r[6] = hi.z, r[7] = hi.w;
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j)
        if (k + j < a.K) r[j] = fp::f32_bits(p[j]);
    }
  } else if (a.wk == WK_BF16) {
    const uint16_t* p = static_cast<const uint16_t*>(a.w) + off;
    if (full) {
      const uint4 v = *reinterpret_cast<const uint4*>(p);
      r[0] = v.x, r[1] = v.y, r[2] = v.z, r[3] = v.w;
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j)
        if (k + j < a.K) r[j >> 1] |= uint32_t(p[j]) << (16 * (j & 1));
    }
  } else {  // fp8 codes
    const uint8_t* p = static_cast<const uint8_t*>(a.w) + off;
    if (full) {
      const uint2 v = *reinterpret_cast<const uint2*>(p);
      r[0] = v.x, r[1] = v.y;
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j)
        if (k + j < a.K) r[j >> 2] |= uint32_t(p[j]) << (8 * (j & 3));
    }
  }
}

__device__ __forceinline__ void decode_w(const uint32_t (&r)[8], const KArgs& a, float (&v)[8]) {
  switch (a.wk) {
    case WK_F32:
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = fp::bits_f32(r[j]);
      break;
    case WK_BF16:
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = fp::bits_f32((j & 1) ? (r[j >> 1] & 0xffff0000u) : (r[j >> 1] << 16));
      break;
    case WK_FN:
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = dec_e4m3<7>((r[j >> 2] >> (8 * (j & 3))) & 0xffu) * a.w_scale;
      break;
    case WK_FNUZ:
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = dec_e4m3<8>((r[j >> 2] >> (8 * (j & 3))) & 0xffu) * a.w_scale;
      break;
    default: {
      const float s = fp::e8m0_decode(uint8_t(r[1]));
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = dec_e2m1(r[0] >> (4 * j)) * s;
    }
  }
}

// The scale of a (row, group) from its amax: fp8 amax/max (1 for an all-zero group); MXFP4 the
// e8m0 value 2^X of fp::mxfp4_scale_code.
template <int QM>
__device__ __forceinline__ float group_scale(const KArgs& a, float amax) {
  if constexpr (QM == QM_FP8) {
    return amax == 0.0f ? 1.0f : amax / a.q_max;
  } else {
    return fp::e8m0_decode(fp::mxfp4_scale_code(amax));
  }
}

// x̂ = decode(encode(x / s)) · s (fp8), e2m1_decode(e2m1_encode(x · (1/s))) · s (MXFP4): the same
// operations, in the same order, as the host quantizers of fp_formats.h.
template <int QM>
__device__ __forceinline__ float quantize(const KArgs& a, float x, float s) {
  if constexpr (QM == QM_FP8) {
    const float t = x / s;
    return (a.q_fnuz ? fake_e4m3<8>(t) : fake_e4m3<7>(t)) * s;
  } else {
    const float inv = 1.0f / s;  // exact: s is a power of two
    return fake_e2m1(x * inv) * s;
  }
}

template <int BM, int BN, int BK, int TM, int TN, int MINB, int QM>
__global__ void __launch_bounds__(kThreads, MINB) gemm_k(const KArgs a) {
  constexpr int NX = BN / TN;  // threads along n
  static_assert((BM / TM) * NX == kThreads, "256 threads per block");
  static_assert(BK % 8 == 0 && BK >= 8 && BK <= 32, "units of 8 k-values, ≤ 4 per row");
  constexpr int VPR = BK / 8;                      // units per row of a tile
  constexpr int XT = BM * VPR, WT = BN * VPR;      // units per tile
  constexpr int XU = (XT + kThreads - 1) / kThreads, WU = (WT + kThreads - 1) / kThreads;
  constexpr int G = QM == QM_FP8 ? 128 : QM == QM_MX ? 32 : BK;  // activation quantization group
  static_assert(G % BK == 0, "K-tiles aligned to the quantization groups");
  constexpr int LD = BK + 4;

  alignas(16) __shared__ float As[2][BM][LD];
  alignas(16) __shared__ float Bs[2][BN][LD];

  const int tid = threadIdx.x;
  const int tx = tid % NX, ty = tid / NX;
  const int64_t b = blockIdx.z;
  const int64_t m0 = int64_t(blockIdx.y) * BM, n0 = int64_t(blockIdx.x) * BN;
  const int nT = int((a.K + BK - 1) / BK);

  uint32_t xr[XU][8], wr[WU][8];
  float xs[XU];  // the current group's scale of each X unit's row
#pragma unroll
  for (int u = 0; u < XU; ++u) xs[u] = 1.0f;

  auto load_tile = [&](int64_t k0) {
#pragma unroll
    for (int u = 0; u < XU; ++u) {
      const int idx = tid + u * kThreads;
      load_x(xr[u], a, b, m0 + idx / VPR, k0 + (idx % VPR) * 8, idx < XT);
    }
#pragma unroll
    for (int u = 0; u < WU; ++u) {
      const int idx = tid + u * kThreads;
      load_w(wr[u], a, b, n0 + idx / VPR, k0 + (idx % VPR) * 8, idx < WT);
    }
  };

  auto store_tile = [&](int buf, int64_t k0) {
    if constexpr (QM != QM_NONE && G > BK) {
      if (k0 % G == 0) {  // a new group: scan its values of each unit's row (all lanes take part)
#pragma unroll
        for (int u = 0; u < XU; ++u) {
          const int idx = tid + u * kThreads;
          float amax = 0.0f;
#pragma unroll 2
          for (int st = 0; st < G / BK; ++st) {
            uint32_t r[8];
            float v[8];
            load_x(r, a, b, m0 + idx / VPR, k0 + st * BK + (idx % VPR) * 8, idx < XT);
            decode_x(r, a.xk, v);
#pragma unroll
            for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(v[j]));
          }
#pragma unroll
          for (int o = 1; o < VPR; o <<= 1) amax = fmaxf(amax, gpu::shfl_xor(amax, o));
          xs[u] = group_scale<QM>(a, amax);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < XU; ++u) {
      const int idx = tid + u * kThreads;
      float v[8];
      decode_x(xr[u], a.xk, v);
      if constexpr (QM != QM_NONE) {
        if constexpr (G == BK) {  // the tile holds the whole group
          float amax = 0.0f;
#pragma unroll
          for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(v[j]));
#pragma unroll
          for (int o = 1; o < VPR; o <<= 1) amax = fmaxf(amax, gpu::shfl_xor(amax, o));
          xs[u] = group_scale<QM>(a, amax);
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = quantize<QM>(a, v[j], xs[u]);
      }
      if (idx < XT) {
        float4* d = reinterpret_cast<float4*>(&As[buf][idx / VPR][(idx % VPR) * 8]);
        d[0] = make_float4(v[0], v[1], v[2], v[3]);
        d[1] = make_float4(v[4], v[5], v[6], v[7]);
      }
    }
#pragma unroll
    for (int u = 0; u < WU; ++u) {
      const int idx = tid + u * kThreads;
      if (idx < WT) {
        float v[8];
        decode_w(wr[u], a, v);
        float4* d = reinterpret_cast<float4*>(&Bs[buf][idx / VPR][(idx % VPR) * 8]);
        d[0] = make_float4(v[0], v[1], v[2], v[3]);
        d[1] = make_float4(v[4], v[5], v[6], v[7]);
      }
    }
  };

  float acc[TM][TN];
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;

  load_tile(0);
  store_tile(0, 0);
  __syncthreads();
  for (int t = 0; t < nT; ++t) {
    const int cur = t & 1;
    const bool more = t + 1 < nT;
    if (more) load_tile(int64_t(t + 1) * BK);
#pragma unroll
    for (int kk = 0; kk < BK; kk += 4) {
      float4 av[TM];
#pragma unroll
      for (int i = 0; i < TM; ++i) av[i] = *reinterpret_cast<const float4*>(&As[cur][i * (BM / TM) + ty][kk]);
#pragma unroll
      for (int j = 0; j < TN; ++j) {
        const float4 bv = *reinterpret_cast<const float4*>(&Bs[cur][j * NX + tx][kk]);
#pragma unroll
        for (int i = 0; i < TM; ++i) {
          float c = acc[i][j];
          c = fmaf(av[i].x, bv.x, c);
          c = fmaf(av[i].y, bv.y, c);
          c = fmaf(av[i].z, bv.z, c);
          c = fmaf(av[i].w, bv.w, c);
          acc[i][j] = c;
        }
      }
    }
    if (more) store_tile(cur ^ 1, int64_t(t + 1) * BK);
    __syncthreads();
  }

#pragma unroll
  for (int i = 0; i < TM; ++i) {
    const int64_t m = m0 + i * (BM / TM) + ty;
    if (m >= a.M) continue;
#pragma unroll
    for (int j = 0; j < TN; ++j) {
      const int64_t n = n0 + j * NX + tx;
      if (n >= a.N) continue;
      const int64_t o = b * a.y_bs + m * a.y_ld + n;
      if (a.y_bf16) static_cast<uint16_t*>(a.y)[o] = fp::bf16_encode(acc[i][j]);
      else static_cast<float*>(a.y)[o] = acc[i][j];
    }
  }
}

// The skinny kernel, for few rows (decode-time projections: memory-bound on the weight). A block
// covers SM_ROWS rows of X and 16 columns of Y: each 32-lane group owns 2 columns and sweeps K with
// its lanes side by side (unit u·32 + lane of each chunk), so every weight row streams through
// contiguous, vectorized loads, U units per lane in flight per column; the partial sums are reduced
// across the 32 lanes at the end (gpu::shfl_xor). X is staged chunk by chunk (SK_CH k-values, a
// multiple of 128: groups never straddle chunks) in shared memory, decoded and quantized once per
// block; the group amax is reduced across the lanes that staged the group's units.
constexpr int SK_ROWS = 8, SK_COLS_PER_GROUP = 2, SK_U = 4;
constexpr int SK_CH = 32 * 8 * SK_U;                           // 1024 k-values per chunk
constexpr int SK_COLS = (kThreads / 32) * SK_COLS_PER_GROUP;   // 16 columns per block

template <int MINB, int QM>
__global__ void __launch_bounds__(kThreads, MINB) skinny_k(const KArgs a) {
  constexpr int CU = SK_CH / 8;                          // units per row of a chunk (128)
  constexpr int XU = SK_ROWS * CU / kThreads;            // X units staged per thread (4)
  constexpr int G = QM == QM_FP8 ? 128 : QM == QM_MX ? 32 : 8;
  constexpr int GU = G / 8;                              // units per group: consecutive lanes
  static_assert(SK_CH % 128 == 0 && (SK_ROWS * CU) % kThreads == 0 && GU <= 32, "chunk layout");
  // Unit c of row m: elements 0..3 at Xs[m][0][4c], 4..7 at Xs[m][1][4c] (conflict-free float4 reads).
  alignas(16) __shared__ float Xs[SK_ROWS][2][SK_CH / 2];

  const int tid = threadIdx.x, lane = tid & 31, grp = tid >> 5;
  const int64_t b = blockIdx.z;
  const int64_t m0 = int64_t(blockIdx.y) * SK_ROWS;
  const int64_t n0 = int64_t(blockIdx.x) * SK_COLS + grp * SK_COLS_PER_GROUP;

  float acc[SK_COLS_PER_GROUP][SK_ROWS];
#pragma unroll
  for (int r = 0; r < SK_COLS_PER_GROUP; ++r)
#pragma unroll
    for (int m = 0; m < SK_ROWS; ++m) acc[r][m] = 0.0f;

  for (int64_t c0 = 0; c0 < a.K; c0 += SK_CH) {
    uint32_t wr[SK_COLS_PER_GROUP][SK_U][8];
#pragma unroll
    for (int r = 0; r < SK_COLS_PER_GROUP; ++r)
#pragma unroll
      for (int u = 0; u < SK_U; ++u) load_w(wr[r][u], a, b, n0 + r, c0 + (u * 32 + lane) * 8, true);

    __syncthreads();  // the previous chunk's reads of Xs are done
#pragma unroll
    for (int i = 0; i < XU; ++i) {
      const int idx = tid + i * kThreads, m = idx / CU, cu = idx % CU;
      uint32_t raw[8];
      float v[8];
      load_x(raw, a, b, m0 + m, c0 + cu * 8, true);
      decode_x(raw, a.xk, v);
      if constexpr (QM != QM_NONE) {
        float amax = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(v[j]));
#pragma unroll
        for (int o = 1; o < GU; o <<= 1) amax = fmaxf(amax, gpu::shfl_xor(amax, o));
        const float sc = group_scale<QM>(a, amax);
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = quantize<QM>(a, v[j], sc);
      }
      *reinterpret_cast<float4*>(&Xs[m][0][4 * cu]) = make_float4(v[0], v[1], v[2], v[3]);
      *reinterpret_cast<float4*>(&Xs[m][1][4 * cu]) = make_float4(v[4], v[5], v[6], v[7]);
    }
    __syncthreads();

#pragma unroll
    for (int u = 0; u < SK_U; ++u) {
      const int cu = u * 32 + lane;
#pragma unroll
      for (int r = 0; r < SK_COLS_PER_GROUP; ++r) {
        float w[8];
        decode_w(wr[r][u], a, w);
#pragma unroll
        for (int m = 0; m < SK_ROWS; ++m) {
          const float4 lo = *reinterpret_cast<const float4*>(&Xs[m][0][4 * cu]);
          const float4 hi = *reinterpret_cast<const float4*>(&Xs[m][1][4 * cu]);
          float c = acc[r][m];
          c = fmaf(lo.x, w[0], c);
          c = fmaf(lo.y, w[1], c);
          c = fmaf(lo.z, w[2], c);
          c = fmaf(lo.w, w[3], c);
          c = fmaf(hi.x, w[4], c);
          c = fmaf(hi.y, w[5], c);
          c = fmaf(hi.z, w[6], c);
          c = fmaf(hi.w, w[7], c);
          acc[r][m] = c;
        }
      }
    }
  }

  // Sum each column's partials over the 32 lanes; lane r·SK_ROWS + m stores (m, column r).
#pragma unroll
  for (int r = 0; r < SK_COLS_PER_GROUP; ++r)
#pragma unroll
    for (int m = 0; m < SK_ROWS; ++m) {
      float v = acc[r][m];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) v += gpu::shfl_xor(v, o);
      acc[r][m] = v;
    }
  static_assert(SK_COLS_PER_GROUP * SK_ROWS <= 32, "one lane per output");
#pragma unroll
  for (int r = 0; r < SK_COLS_PER_GROUP; ++r)
#pragma unroll
    for (int m = 0; m < SK_ROWS; ++m) {
      if (lane != r * SK_ROWS + m) continue;
      const int64_t mm = m0 + m, n = n0 + r;
      if (mm >= a.M || n >= a.N) continue;
      const int64_t o = b * a.y_bs + mm * a.y_ld + n;
      if (a.y_bf16) static_cast<uint16_t*>(a.y)[o] = fp::bf16_encode(acc[r][m]);
      else static_cast<float*>(a.y)[o] = acc[r][m];
    }
}

__global__ void dequant_fp8_k(const uint8_t* __restrict__ c, bool fnuz, float scale, void* __restrict__ out,
                              bool out_bf16, size_t n) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float v = (fnuz ? dec_e4m3<8>(c[i]) : dec_e4m3<7>(c[i])) * scale;
    if (out_bf16) static_cast<uint16_t*>(out)[i] = fp::bf16_encode(v);
    else static_cast<float*>(out)[i] = v;
  }
}

[[noreturn]] void bad(const char* what, int line) { gpu::gpu_fail("ROCm GEMM", what, "rocm::gemm", __FILE__, line); }
#define MLA_GEMM_REQUIRE(cond, what) \
  do {                               \
    if (!(cond)) bad(what, __LINE__); \
  } while (0)

// Rows of `es`-byte elements starting at p + b·bs + m·ld allow `align`-byte vector loads of units.
bool rows_aligned(const void* p, int64_t ld, int64_t bs, int64_t batch, int64_t es, int64_t align) {
  return reinterpret_cast<uintptr_t>(p) % uintptr_t(align) == 0 && (ld * es) % align == 0 &&
         (batch == 1 || (bs * es) % align == 0);
}

template <int BM, int BN, int BK, int TM, int TN, int MINB>
void launch_tile(const KArgs& a, int qm, int64_t batch, cudaStream_t s) {
  const dim3 grid(unsigned((a.N + BN - 1) / BN), unsigned((a.M + BM - 1) / BM), unsigned(batch));
  switch (qm) {
    case QM_NONE: gemm_k<BM, BN, BK, TM, TN, MINB, QM_NONE><<<grid, kThreads, 0, s>>>(a); break;
    case QM_FP8: gemm_k<BM, BN, BK, TM, TN, MINB, QM_FP8><<<grid, kThreads, 0, s>>>(a); break;
    default: gemm_k<BM, BN, BK, TM, TN, MINB, QM_MX><<<grid, kThreads, 0, s>>>(a); break;
  }
  MLA_GPU_LAUNCH_CHECK();
}

template <int MINB>
void launch_skinny(const KArgs& a, int qm, int64_t batch, cudaStream_t s) {
  const dim3 grid(unsigned((a.N + SK_COLS - 1) / SK_COLS), unsigned((a.M + SK_ROWS - 1) / SK_ROWS), unsigned(batch));
  switch (qm) {
    case QM_NONE: skinny_k<MINB, QM_NONE><<<grid, kThreads, 0, s>>>(a); break;
    case QM_FP8: skinny_k<MINB, QM_FP8><<<grid, kThreads, 0, s>>>(a); break;
    default: skinny_k<MINB, QM_MX><<<grid, kThreads, 0, s>>>(a); break;
  }
  MLA_GPU_LAUNCH_CHECK();
}

// The tile variants (detail::gemm_variant).
constexpr const char* kVariantNames[] = {
    "128x128 k16 8x8", "128x128 k16 8x8 2/SM", "64x64 k32 4x4", "32x64 k32 2x4",
    "16x32 k32 2x1",   "skinny 8x16",          "skinny 8x16 2/SM",
};
constexpr int kNumVariants = int(sizeof(kVariantNames) / sizeof(kVariantNames[0]));

void launch_variant(int v, const KArgs& a, int qm, int64_t batch, cudaStream_t s) {
  switch (v) {
    case 0: launch_tile<128, 128, 16, 8, 8, 1>(a, qm, batch, s); break;
    case 1: launch_tile<128, 128, 16, 8, 8, 2>(a, qm, batch, s); break;
    case 2: launch_tile<64, 64, 32, 4, 4, 1>(a, qm, batch, s); break;
    case 3: launch_tile<32, 64, 32, 2, 4, 1>(a, qm, batch, s); break;
    case 4: launch_tile<16, 32, 32, 2, 1, 1>(a, qm, batch, s); break;
    case 5: launch_skinny<1>(a, qm, batch, s); break;
    default: launch_skinny<2>(a, qm, batch, s); break;
  }
}

}  // namespace

namespace detail {

// Measured on an H200 (rocm-on-cuda; see the report of the kernel family): the skinny kernel wins for
// ≤ 8 rows once K fills its 1024-wide chunks; then the smallest tile that still covers the rows;
// 128×128 once it yields enough blocks to fill the device.
GemmTile pick_tile(const GemmParams& p) {
  if (p.M <= SK_ROWS && p.K >= SK_CH) return GemmTile::SKINNY;
  if (p.M <= 16) return GemmTile::SMALL;
  if (p.M <= 32) return GemmTile::NARROW;
  const int64_t large_blocks = ((p.M + 127) / 128) * ((p.N + 127) / 128) * p.batch;
  if (p.M >= 128 && large_blocks >= 256) return GemmTile::LARGE;
  return GemmTile::MEDIUM;
}

namespace {
// Checks p; false when there is nothing to do.
bool prepare(const GemmParams& p, KArgs& a, int& qm) {
  MLA_GEMM_REQUIRE(p.M >= 0 && p.N >= 0 && p.K >= 0 && p.batch >= 0, "negative size");
  MLA_GEMM_REQUIRE(p.M <= 65536 && p.N <= 32768 && p.K <= 16384 && p.batch <= 256,
                   "size over the limits (M <= 65536, N <= 32768, K <= 16384, batch <= 256)");
  if (p.M == 0 || p.N == 0 || p.batch == 0) return false;
  MLA_GEMM_REQUIRE(p.x && p.w && p.y, "null operand pointer");
  MLA_GEMM_REQUIRE(p.x_elem == Elem::F32 || p.x_elem == Elem::BF16, "activations must be f32 or bf16");
  MLA_GEMM_REQUIRE(p.y_elem == Elem::F32 || p.y_elem == Elem::BF16, "output must be f32 or bf16");
  MLA_GEMM_REQUIRE(p.M == 1 || p.y_ld >= p.N, "output rows overlap (y_ld < N)");

  a = KArgs{};
  a.x = p.x, a.x_ld = p.x_ld, a.x_bs = p.x_bstride;
  a.w = p.w, a.w_ld = p.w_ld, a.w_bs = p.w_bstride;
  a.ws = p.w_scales, a.s_ld = p.s_ld, a.s_bs = p.s_bstride;
  a.y = p.y, a.y_ld = p.y_ld, a.y_bs = p.y_bstride;
  a.M = p.M, a.N = p.N, a.K = p.K;
  a.w_scale = p.w_scale;
  a.xk = p.x_elem == Elem::F32 ? XK_F32 : XK_BF16;
  a.y_bf16 = p.y_elem == Elem::BF16;
  const int64_t xes = p.x_elem == Elem::F32 ? 4 : 2;
  a.x_vec = rows_aligned(p.x, p.x_ld, p.x_bstride, p.batch, xes, 16);

  qm = QM_NONE;
  switch (p.wf) {
    case WeightFormat::PLAIN: {
      MLA_GEMM_REQUIRE(p.w_elem == Elem::F32 || p.w_elem == Elem::BF16, "PLAIN weights must be f32 or bf16");
      MLA_GEMM_REQUIRE(p.aq == ActQuant::NONE, "PLAIN weights take ActQuant NONE only");
      a.wk = p.w_elem == Elem::F32 ? WK_F32 : WK_BF16;
      a.w_vec = rows_aligned(p.w, p.w_ld, p.w_bstride, p.batch, p.w_elem == Elem::F32 ? 4 : 2, 16);
      break;
    }
    case WeightFormat::FP8: {
      MLA_GEMM_REQUIRE(p.w_elem == Elem::FP8_E4M3FN || p.w_elem == Elem::FP8_E4M3FNUZ,
                       "FP8 weights must be FP8_E4M3FN or FP8_E4M3FNUZ codes");
      MLA_GEMM_REQUIRE(p.aq == ActQuant::NONE || p.aq == ActQuant::FP8_GROUP128,
                       "FP8 weights take ActQuant NONE or FP8_GROUP128");
      const bool fnuz = p.w_elem == Elem::FP8_E4M3FNUZ;
      a.wk = fnuz ? WK_FNUZ : WK_FN;
      a.w_vec = rows_aligned(p.w, p.w_ld, p.w_bstride, p.batch, 1, 8);
      if (p.aq == ActQuant::FP8_GROUP128) {
        qm = QM_FP8;
        a.q_fnuz = fnuz;
        a.q_max = fnuz ? fp::kE4m3fnuzMax : fp::kE4m3fnMax;
      }
      break;
    }
    case WeightFormat::MXFP4: {
      MLA_GEMM_REQUIRE(p.aq == ActQuant::MXFP4, "MXFP4 weights require ActQuant MXFP4");
      MLA_GEMM_REQUIRE(p.K % 32 == 0, "MXFP4 weights require K % 32 == 0");
      MLA_GEMM_REQUIRE(p.w_scales != nullptr, "MXFP4 weights need their e8m0 scales (w_scales)");
      a.wk = WK_MX;
      a.w_vec = rows_aligned(p.w, p.w_ld, p.w_bstride, p.batch, 1, 4);
      qm = QM_MX;
      break;
    }
    default: bad("unknown WeightFormat", __LINE__);
  }
  MLA_GEMM_REQUIRE(p.aq == ActQuant::NONE || p.aq == ActQuant::FP8_GROUP128 || p.aq == ActQuant::MXFP4,
                   "unknown ActQuant");

  return true;
}
}  // namespace

int num_variants() { return kNumVariants; }
const char* variant_name(int v) { return v >= 0 && v < kNumVariants ? kVariantNames[v] : "?"; }

void gemm_variant(const GemmParams& p, int variant) {
  MLA_GEMM_REQUIRE(variant >= 0 && variant < kNumVariants, "unknown tile variant");
  KArgs a;
  int qm;
  if (prepare(p, a, qm)) launch_variant(variant, a, qm, p.batch, p.stream);
}

void gemm_tile(const GemmParams& p, GemmTile tile) {
  if (tile == GemmTile::AUTO) tile = pick_tile(p);
  int v = 2;
  switch (tile) {
    // 128×128: one block per SM (all registers) except with fp8 activation quantization, whose
    // longer tile loads want two blocks per SM to hide them (measured on NVIDIA). On AMD the
    // two-per-CU bound makes the compiler spill to scratch (gfx90a: ~600 B/lane), so HIP keeps one.
#if defined(MLA_HIP)
    case GemmTile::LARGE: v = 0; break;
#else
    case GemmTile::LARGE: v = p.aq == ActQuant::FP8_GROUP128 ? 1 : 0; break;
#endif
    case GemmTile::NARROW: v = 3; break;
    case GemmTile::SMALL: v = 4; break;
    case GemmTile::SKINNY: {  // two blocks per SM (spilling a little) pays once there are blocks for it
      const int64_t blocks = ((p.N + SK_COLS - 1) / SK_COLS) * ((p.M + SK_ROWS - 1) / SK_ROWS) * p.batch;
      v = blocks >= 256 ? 6 : 5;
      break;
    }
    default: v = 2; break;
  }
  gemm_variant(p, v);
}

}  // namespace detail

void gemm(const GemmParams& p) { detail::gemm_tile(p, detail::GemmTile::AUTO); }

void dequantize_fp8(const void* codes, gpu::Elem code_elem, float scale, void* out, gpu::Elem out_elem, size_t n,
                    cudaStream_t s) {
  MLA_GEMM_REQUIRE(code_elem == Elem::FP8_E4M3FN || code_elem == Elem::FP8_E4M3FNUZ,
                   "dequantize_fp8: codes must be FP8_E4M3FN or FP8_E4M3FNUZ");
  MLA_GEMM_REQUIRE(out_elem == Elem::F32 || out_elem == Elem::BF16, "dequantize_fp8: output must be f32 or bf16");
  if (n == 0) return;
  MLA_GEMM_REQUIRE(codes && out, "dequantize_fp8: null pointer");
  const size_t blocks = (n + kThreads - 1) / kThreads;
  const unsigned grid = unsigned(blocks < (size_t(1) << 20) ? blocks : (size_t(1) << 20));
  dequant_fp8_k<<<grid, kThreads, 0, s>>>(static_cast<const uint8_t*>(codes), code_elem == Elem::FP8_E4M3FNUZ,
                                          scale, out, out_elem == Elem::BF16, n);
  MLA_GPU_LAUNCH_CHECK();
}

}  // namespace mla::rocm

#undef MLA_GEMM_REQUIRE
#undef MLA_GEMM_HD
