// mla_decode_tile.cuh — the KV tile pipeline both MLA decode kernels share (wide: 256 threads,
// narrow: 128): keys stream in tiles of 64, gathered row by row through kv_slots with cp.async into
// 128-byte-swizzled shared memory (keys past k_len are zero-filled, never read). bf16 rows land in
// the swizzled stage directly; fp8 rows land raw in a staging buffer and are widened to bf16 in
// shared memory (exact), so the products read bf16 either way.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "platform/cuda/mla_decode_launch.h"
#include "platform/cuda/sm90.cuh"

namespace mla::cuda::mla_decode {

// What one CTA of a decode kernel covers (grid: row tile x, split y, request z): the request's
// packed (token, head) rows, this tile's first row, and its KV tiles [t_begin, t_end).
struct CtaWork {
  int q_len, rows, row0, k_len, q_start;
  const int32_t* slots;  // the request's slot table
  int t_begin, t_end;
};
// false when the row tile (of tile_rows rows) lies past the request.
__device__ __forceinline__ bool cta_work(const KParams& p, int tile_rows, CtaWork& w) {
  const int rt = blockIdx.x, split = blockIdx.y, r = blockIdx.z;
  w.q_len = p.q_len[r];
  w.rows = w.q_len * p.H;
  w.row0 = rt * tile_rows;
  if (w.row0 >= w.rows) return false;
  w.k_len = p.k_len[r];
  w.q_start = p.q_start[r];
  w.slots = p.slots + p.k_start[r];
  const int nk = (w.k_len + kKeys - 1) / kKeys;
  const int tps = (nk + p.splits - 1) / p.splits;
  w.t_begin = min(nk, split * tps);
  w.t_end = min(nk, w.t_begin + tps);
  return true;
}

// The 64-row kernels: this thread's two accumulator rows rr[h] = 16·wi + lane/4 + 8h of the tile
// (wi: its warp in the warpgroup) and the end of the keys each one sees (causal, bottom-right).
__device__ __forceinline__ void tile_rows_of_thread(const KParams& p, const CtaWork& w, int wi, int lane,
                                                    int (&rr)[2], int (&lim)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    rr[h] = 16 * wi + (lane >> 2) + 8 * h;
    const int qi = (w.row0 + rr[h]) / p.H;
    lim[h] = p.causal ? min(w.k_len, w.k_len - w.q_len + qi + 1) : w.k_len;
  }
}

// The 64-row kernels (256 threads): Q rows [row0, row0 + 64) of the request → sQ, 9 swizzled
// [64][64] chunks, rows past the request zero-filled; cp.async, uncommitted.
__device__ __forceinline__ void load_q_tile(const KParams& p, const CtaWork& w, uint32_t sQ, int tid) {
  const __nv_bfloat16* qbase = p.q + (size_t(w.q_start) * p.H + w.row0) * kD;
  const int sub = tid & 7;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = (tid >> 3) + 32 * h;
    const bool valid = w.row0 + row < w.rows;
    const __nv_bfloat16* src = valid ? qbase + size_t(row) * kD + sub * 8 : p.q;
#pragma unroll
    for (int i = 0; i < 9; ++i)
      sm90::cp_async(sQ + i * kChunkBytes + sm90::swz128(row, sub), valid ? src + i * 64 : p.q, valid);
  }
}

// The 64-row kernels' output: warpgroup wg holds O[64 rows][256·wg, +256) in the m64n256
// accumulator layout (this thread: rows rr[h], columns 256·wg + 8j + 2(lane & 3) + {0, 1} in
// o[4j + 2h + {0, 1}]). m: the row's running max (log2 units), l: its total sum over all keys. Writes
// o · out_scale / l and the natural-log LSE, or the split's f32 partial and LSE to the workspace.
__device__ __forceinline__ void store_o_rows(const KParams& p, const CtaWork& w, const float (&o)[128],
                                             const int (&rr)[2], const float (&m)[2], const float (&l)[2],
                                             int wg, int lane) {
  const int c0 = 256 * wg + 2 * (lane & 3);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int prow = w.row0 + rr[h];
    if (prow >= w.rows) continue;
    const float inv = l[h] > 0.f ? p.out_scale / l[h] : 0.f;
    const float lse = l[h] > 0.f ? (m[h] + log2f(l[h])) * 0.69314718055994531f : -INFINITY;
    const size_t grow = size_t(w.q_start) * p.H + prow;  // row of o [T·H, 512]
    const bool write_lse = wg == 0 && (lane & 3) == 0;
    if (p.splits == 1) {
      if (p.o_f32) {
        float* orow = static_cast<float*>(p.o) + grow * kDv + c0;
#pragma unroll
        for (int j = 0; j < 32; ++j)
          *reinterpret_cast<float2*>(orow + 8 * j) =
              make_float2(o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv);
      } else {
        __nv_bfloat16* orow = static_cast<__nv_bfloat16*>(p.o) + grow * kDv + c0;
#pragma unroll
        for (int j = 0; j < 32; ++j)
          *reinterpret_cast<uint32_t*>(orow + 8 * j) =
              sm90::pack_bf16(o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv);
      }
      if (write_lse && p.lse) p.lse[grow] = lse;
    } else {
      const size_t prow_ws = size_t(blockIdx.y) * p.rows_total + grow;
      float* orow = p.ws_o + prow_ws * kDv + c0;
#pragma unroll
      for (int j = 0; j < 32; ++j)
        *reinterpret_cast<float2*>(orow + 8 * j) =
            make_float2(o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv);
      if (write_lse) p.ws_lse[prow_ws] = lse;
    }
  }
}

// The 64-row kernels: O[64 rows][256 columns] in the m64n256 accumulator layout, row rr[h] of this
// thread scaled by f[h].
__device__ __forceinline__ void scale_rows(float (&o)[128], const float (&f)[2]) {
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    o[4 * j + 0] *= f[0];
    o[4 * j + 1] *= f[0];
    o[4 * j + 2] *= f[1];
    o[4 * j + 3] *= f[1];
  }
}

// Sixteen e4m3 values (columns 16·sub + [0, 16) of a 64-column chunk) of key `key` → their bf16
// values, or with kF16 their f16 values (one cvt a pair: the f16 products of the fp8 kernels), exact,
// in the 128B-swizzled 16-bit chunk at `chunk`: its 16-byte pieces 2·sub, 2·sub + 1.
template <bool kF16 = false>
__device__ __forceinline__ void widen_fp8x16(uint4 v, uint32_t chunk, int key, int sub) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  uint32_t b[8];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    if constexpr (kF16) {
      sm90::fp8x4_to_f16x2x2(w[k], b[2 * k], b[2 * k + 1]);
    } else {
      b[2 * k] = sm90::e4m3x2_to_bf16x2<0, 1>(w[k], w[k]);
      b[2 * k + 1] = sm90::e4m3x2_to_bf16x2<2, 3>(w[k], w[k]);
    }
  }
  sm90::st_shared_v4(chunk + sm90::swz128(key, 2 * sub), make_uint4(b[0], b[1], b[2], b[3]));
  sm90::st_shared_v4(chunk + sm90::swz128(key, 2 * sub + 1), make_uint4(b[4], b[5], b[6], b[7]));
}

// ---- f16 products for fp8 KV (mla_decode_seesaw.cu; P·V of mla_decode_narrow.cu) -----------------
// e4m3 → f16 is exact and one cvt a pair. Each Q row is scaled by a power of two 2^k (exact) so that
// its largest |q| lies in [2^14, 2^15): every bf16 value of the row down to 2^-28 of that largest is
// then exactly an f16 value (smaller ones keep fewer bits); S's row is scaled back by 2^-k with the
// softmax scale (the narrow kernel's e4m3 Q takes its own 2^k the same way, q_row_exponent(mx, 7)).
// P goes in as P·2^15 in f16 (P ≤ 1; 11 significant bits against bf16's 8).
constexpr int kPScaleLog2 = 15;
constexpr float kPScale = float(1 << kPScaleLog2);  // 2^15
// 2^e as a float, e in [−126, 127].
__device__ __forceinline__ float pow2(int e) { return __int_as_float((127 + e) << 23); }
// The larger |x| of a word's two bf16 values.
__device__ __forceinline__ float bf16x2_absmax(uint32_t w) {
  return fmaxf(fabsf(__uint_as_float(w << 16)), fabsf(__uint_as_float(w & 0xffff0000u)));
}
// k for a row whose largest |q| is mx, so that mx·2^k lies in [2^top, 2^(top + 1)) (top 14: f16, 7:
// e4m3); 0 for a row of zeros or with an infinity.
__device__ __forceinline__ int q_row_exponent(float mx, int top) {
  return mx > 0.f && mx <= 3.4e38f ? min(100, max(-100, top - ((__float_as_int(mx) >> 23) - 127))) : 0;
}
// A word's two bf16 values times f (a power of two) as f16x2.
__device__ __forceinline__ uint32_t bf16x2_to_f16x2(uint32_t w, float f) {
  return sm90::pack_f16(__uint_as_float(w << 16) * f, __uint_as_float(w & 0xffff0000u) * f);
}

// A raw fp8 stage read by the products themselves (kRawOperands below): [64 keys][576 bytes], the
// 16-byte piece p of key k at k·576 + 16·(p XOR 2·((k >> 1) & 1)). Pieces stay inside their aligned
// group of four, so 16-byte accesses to two neighbouring keys' groups and 4-byte accesses to one
// word of four keys k ≡ 0..3 (mod 4) at 8 consecutive words are free of bank conflicts.
__device__ __forceinline__ uint32_t raw_piece(int key, int piece) {
  return uint32_t(key * kD + 16 * (piece ^ (((key >> 1) & 1) << 1)));
}

// One thread's share of the double-buffered KV tile pipeline, kThreads threads per CTA:
//   bf16: 8 threads per key, thread tid takes 16-byte chunk tid & 7 of each of the 9 128-byte column
//         chunks of keys tid/8 + kKeyStep·h → the swizzled stage, directly;
//   fp8:  4 threads per key, chunk tid & 3 of each of the 9 64-byte columns → the raw stage, then
//         widened into the one bf16 tile at sKV; with kRawOperands the raw stage (raw_piece's
//         layout) is the tile: the products read it through registers, nothing is widened.
// Per tile t: wait(stage, more) → the bf16 tile's address; the math; release(stage, more). The
// slots of tile t + 2 (fetch) are read during tile t's math; its copies go out as soon as its stage
// is free (fp8: once converted, in wait; bf16: after the math, in release). The slots live in the
// caller's array `slot`, not in the struct: an array member keeps the whole struct out of registers
// until the loops are unrolled, and the PTX then recomputes the stage addresses on every tile.
template <int kThreads, bool kFp8, bool kRawOperands = false>
struct KvTile {
  static_assert(kFp8 || !kRawOperands, "only an fp8 stage is read raw");
  static constexpr int kShift = kFp8 ? 2 : 3;           // log2(threads per key)
  static constexpr int kKeyStep = kThreads >> kShift;  // keys per pass
  static constexpr int kPasses = kKeys / kKeyStep;

  const uint8_t* kv;      // the pool's rows
  const int32_t* slots;   // the request's slot table
  int k_len;              // its keys
  uint32_t sKV;           // bf16: [2 stages][64 keys][576]; fp8: [64][576]
  uint32_t sRaw;          // fp8 only: [2 stages][64 keys][576] e4m3
  int tid;

  // Reads the slots of this thread's keys of tile t.
  __device__ __forceinline__ void fetch(int t, int (&slot)[kPasses]) const {
#pragma unroll
    for (int h = 0; h < kPasses; ++h) {
      const int kidx = t * kKeys + (tid >> kShift) + kKeyStep * h;
      slot[h] = kidx < k_len ? __ldg(slots + kidx) : -1;
    }
  }
  // Issues the async copies of the fetched tile into `stage`.
  __device__ __forceinline__ void load(int stage, const int (&slot)[kPasses]) const {
    if constexpr (kFp8) {
      const int sub = tid & 3;
#pragma unroll
      for (int h = 0; h < kPasses; ++h) {
        const int key = (tid >> 2) + kKeyStep * h;
        const bool valid = slot[h] >= 0;
        const uint8_t* src = valid ? kv + size_t(slot[h]) * kD + sub * 16 : kv;
        const uint32_t dst = sRaw + stage * kRawBytes;
#pragma unroll
        for (int i = 0; i < 9; ++i)
          sm90::cp_async(dst + (kRawOperands ? raw_piece(key, sub + 4 * i) : key * kD + sub * 16 + i * 64),
                         valid ? src + i * 64 : kv, valid);
      }
    } else {
      const int sub = tid & 7;
#pragma unroll
      for (int h = 0; h < kPasses; ++h) {
        const int key = (tid >> 3) + kKeyStep * h;
        const bool valid = slot[h] >= 0;
        const uint8_t* src = valid ? kv + size_t(slot[h]) * (kD * 2) + sub * 16 : kv;
        const uint32_t dst = sKV + stage * kTileBytes + sm90::swz128(key, sub);
#pragma unroll
        for (int i = 0; i < 9; ++i)
          sm90::cp_async(dst + i * kChunkBytes, valid ? src + i * 128 : kv, valid);
      }
    }
  }
  // fp8 only: raw stage → the bf16 swizzled tile (dims 64i + 16sub + [0, 16) of each key).
  __device__ __forceinline__ void convert(int stage) const {
    const int sub = tid & 3;
#pragma unroll
    for (int h = 0; h < kPasses; ++h) {
      const int key = (tid >> 2) + kKeyStep * h;
      const uint32_t src = sRaw + stage * kRawBytes + key * kD + sub * 16;
#pragma unroll
      for (int i = 0; i < 9; ++i)
        widen_fp8x16(sm90::ld_shared_v4(src + i * 64), sKV + i * kChunkBytes, key, sub);
    }
  }
  // The prologue: the first two tiles of [t_begin, t_end) in flight, one commit group each (the
  // first also holds whatever the caller issued before, e.g. Q).
  __device__ __forceinline__ void start(int t_begin, int t_end, int (&slot)[kPasses]) const {
    fetch(t_begin, slot);
    load(0, slot);
    sm90::cp_async_commit();
    if (t_begin + 1 < t_end) {
      fetch(t_begin + 1, slot);
      load(1, slot);
    }
    sm90::cp_async_commit();
  }
  // Waits for `stage` (the next stage's copies stay in flight) and returns the shared-memory address
  // of its bf16 tile (kRawOperands: of the raw stage); fp8 widens it first and reissues the stage for
  // the fetched tile when `more`.
  __device__ __forceinline__ uint32_t wait(int stage, bool more, const int (&slot)[kPasses]) const {
    sm90::cp_async_wait<1>();
    sm90::fence_proxy_async();
    __syncthreads();
    if constexpr (kRawOperands) {
      return sRaw + stage * kRawBytes;
    } else if constexpr (kFp8) {
      convert(stage);
      sm90::fence_proxy_async();
      __syncthreads();
      if (more) load(stage, slot);
      sm90::cp_async_commit();
      return sKV;
    } else {
      return sKV + stage * kTileBytes;
    }
  }
  // After the tile's math (and a barrier): bf16 (and a raw-operand stage) reissues the stage for the
  // fetched tile when `more`.
  __device__ __forceinline__ void release(int stage, bool more, const int (&slot)[kPasses]) const {
    if constexpr (!kFp8 || kRawOperands) {
      if (more) load(stage, slot);
      sm90::cp_async_commit();
    }
  }
};

// Raises a kernel's dynamic shared-memory limit to `bytes` once per device; `done` is the caller's
// (one static array per kernel).
template <typename Kernel>
void set_smem_limit_once(Kernel* kernel, int bytes, bool (&done)[64]) {
  int dev = 0;
  cudaGetDevice(&dev);
  if (dev < 0 || dev >= 64 || !done[dev]) {
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (dev >= 0 && dev < 64) done[dev] = true;
  }
}

}  // namespace mla::cuda::mla_decode
