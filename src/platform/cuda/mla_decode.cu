// Fast MLA decode attention for bf16 queries over the paged latent cache (sm_90a).
//
// Rows: the (token, head) pairs of one request, packed (row = token·H + head), so speculative
// tokens and small head counts share a tile. Keys stream in tiles of 64, gathered row by row
// through kv_slots with cp.async into 128-byte-swizzled shared memory (keys past k_len are
// zero-filled, never read), double-buffered. V is the first 512 columns of the same K tile, read by
// the tensor cores as an MN-major operand: never loaded twice.
//
// Two kernels (dispatch on the largest request's packed row count):
//   wide  (> 32 rows, 64-row tiles, 2 warpgroups): per tile, WG w computes
//           S = Q·Kᵀ for keys [32w, 32w+32)      (wgmma m64n32k16, K = 576)
//         the WGs exchange row maxima, write P (bf16) to smem, and WG w accumulates
//           O[:, 256w, +256) += P·V               (wgmma m64n256k16)
//   narrow (≤ 32 rows, N = 8/16/32-row tiles, 1 warpgroup), swap-AB so no work goes to padding:
//           Sᵀ[64 keys][N] = K·Qᵀ,  Oᵀ[512][N] += Vᵀ·Pᵀ   (wgmma m64nNk16)
// fp8 tiles land raw and are widened to bf16 in smem (exact); kv_scale (any row dtype) is folded into the softmax
// scale and the output scale. Split-KV: each (row tile, split) CTA writes f32 partial o + natural-log
// LSE to the workspace; a combine kernel merges them. A mma.sync (ldmatrix) variant of the wide
// kernel is kept as a reference path (mla_fast_set_debug).
#include "platform/cuda/mla_decode.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace mla::cuda {
namespace {

constexpr int kD = 576;
constexpr int kDv = 512;
constexpr int kRows = 64;                     // query rows per CTA
constexpr int kKeys = 64;                     // keys per KV tile
constexpr int kThreads = 256;                 // two warpgroups
constexpr int kChunkBytes = 64 * 128;         // [64 rows][64 cols] bf16, 128B swizzle atom column
constexpr int kTileBytes = 9 * kChunkBytes;   // [64 rows][576] bf16 = 73728
constexpr int kRawBytes = kKeys * kD;         // [64 keys][576] fp8 = 36864
constexpr int kOffQ = 0;                      // Q tile
constexpr int kOffKV = kTileBytes;            // bf16 KV: 2 stages; fp8 KV: bf16 tile + 2 raw stages
constexpr int kOffP = 3 * kTileBytes;         // P [64][64] bf16, swizzled
constexpr int kOffRed = kOffP + 8192;         // f32 row max [2][64], row sum [2][64]
constexpr int kSmemBytes = kOffRed + 4 * 64 * 4 + 1024;  // + slack to align the base to 1 KiB
constexpr int kMaxSplits = 128;

int g_force_splits = 0;
bool g_use_mma_sync = false;
int g_variant = 0;
int g_last_splits = 0;

struct KParams {
  const __nv_bfloat16* q;  // [T, H, 576]
  const uint8_t* kv;       // [slots, 576] bf16 | fp8
  const int32_t* slots;
  const int32_t* q_start;
  const int32_t* q_len;
  const int32_t* k_start;
  const int32_t* k_len;
  int H;
  int causal;
  int splits;
  int rows_total;     // T·H
  float scale_log2;   // softmax_scale (× kv_scale for fp8) × log2(e)
  float out_scale;    // kv_scale for fp8, else 1
  void* o;            // [T, H, 512]
  int o_f32;
  float* lse;         // [T, H] or null
  float* ws_o;        // [splits, T·H, 512] f32 (splits > 1)
  float* ws_lse;      // [splits, T·H]
  uint32_t v_lbo;     // V (MN-major) descriptor: bytes between 64-column blocks
  uint32_t v_sbo;     //                          bytes between 8-key groups
};

// ---- PTX helpers ------------------------------------------------------------------------------
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16-byte async copy; valid = false zero-fills the destination and reads nothing.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
// Generic-proxy smem writes → visible to wgmma (async proxy) after the next barrier.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void named_bar_sync(int id, int n) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void st_shared_u32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ void st_shared_f32(uint32_t addr, float v) {
  asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(addr), "f"(v) : "memory");
}
__device__ __forceinline__ float ld_shared_f32(uint32_t addr) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ uint4 ld_shared_v4(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}
__device__ __forceinline__ void st_shared_v4(uint32_t addr, uint4 v) {
  asm volatile("st.shared.v4.b32 [%0], {%1,%2,%3,%4};\n" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z),
               "r"(v.w)
               : "memory");
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}
__device__ __forceinline__ void st_shared_u16(uint32_t addr, uint16_t v) {
  asm volatile("st.shared.b16 [%0], %1;\n" ::"r"(addr), "h"(v) : "memory");
}
__device__ __forceinline__ uint16_t bf16_bits(float x) {
  const __nv_bfloat16 h = __float2bfloat16_rn(x);
  return *reinterpret_cast<const uint16_t*>(&h);
}
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Byte offset of 16-byte column chunk x (0..7) of row `row` inside a 128B-swizzled [rows][64] atom
// column (the layout of TMA / wgmma SWIZZLE_128B: chunk index XOR row mod 8).
__device__ __forceinline__ uint32_t swz(int row, int x) {
  return uint32_t(row * 128 + ((x ^ (row & 7)) << 4));
}

// ---- wgmma ------------------------------------------------------------------------------------
// Shared-memory matrix descriptor, 128B swizzle. Addresses/offsets in bytes.
__device__ __forceinline__ uint64_t make_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t((lbo >> 4) & 0x3FFF) << 16) |
         (uint64_t((sbo >> 4) & 0x3FFF) << 32) | (uint64_t(1) << 62);
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accumulator reads/writes across wgmma issue / wait.
template <int N>
__device__ __forceinline__ void fence_regs(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Narrow (swap-AB) products: D[64×N] (+)= A[64×16]·B[16×N]; t<ta><tb>: A / B MN-major when 1.
__device__ __forceinline__ void wgmma_m64n8_ss_t00(float (&d)[4], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %6, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 "
      "{"
      "%0, %1, %2, %3"
      "}, %4, %5, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "l"(da), "l"(db), "r"(scale_d));
}
__device__ __forceinline__ void wgmma_m64n8_ss_t10(float (&d)[4], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %6, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 "
      "{"
      "%0, %1, %2, %3"
      "}, %4, %5, p, 1, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "l"(da), "l"(db), "r"(scale_d));
}
__device__ __forceinline__ void wgmma_m64n16_ss_t00(float (&d)[8], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7"
      "}, %8, %9, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "l"(da), "l"(db), "r"(scale_d));
}
__device__ __forceinline__ void wgmma_m64n16_ss_t10(float (&d)[8], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7"
      "}, %8, %9, p, 1, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "l"(da), "l"(db), "r"(scale_d));
}
__device__ __forceinline__ void wgmma_m64n32_ss_t00(float (&d)[16], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
      "}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(da), "l"(db), "r"(scale_d));
}
__device__ __forceinline__ void wgmma_m64n32_ss_t10(float (&d)[16], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
      "}, %16, %17, p, 1, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(da), "l"(db), "r"(scale_d));
}
template <int N, int TA>
__device__ __forceinline__ void wgmma_narrow(float (&d)[N / 2], uint64_t da, uint64_t db, int scale_d) {
  if constexpr (N == 8) {
    if constexpr (TA) wgmma_m64n8_ss_t10(d, da, db, scale_d); else wgmma_m64n8_ss_t00(d, da, db, scale_d);
  } else if constexpr (N == 16) {
    if constexpr (TA) wgmma_m64n16_ss_t10(d, da, db, scale_d); else wgmma_m64n16_ss_t00(d, da, db, scale_d);
  } else {
    if constexpr (TA) wgmma_m64n32_ss_t10(d, da, db, scale_d); else wgmma_m64n32_ss_t00(d, da, db, scale_d);
  }
}


// D[64×256] (+)= A[64×16] · B[16×256], A and B from shared memory (B MN-major).
__device__ __forceinline__ void wgmma_m64n256_ss_tb(float (&d)[128], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, %128, %129, p, 1, 1, 0, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(da), "l"(db), "r"(scale_d));
}

// ---- mma.sync (fallback variant) ----------------------------------------------------------------
__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void mma16816(float* c, const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two e4m3fn codes → two bf16 (exact: every e4m3 value is a bf16 value).
__device__ __forceinline__ uint32_t fp8x2_to_bf16x2(uint32_t two) {
  const __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two), __NV_E4M3);
  const float2 f = __half22float2(__half2(hr));
  return pack_bf16(f.x, f.y);
}

// ---- the main kernel ----------------------------------------------------------------------------
// grid (row tiles, splits, requests), 256 threads, kSmemBytes dynamic smem, one CTA per SM.
// kWgS / kWgPV: wgmma (else mma.sync) for S = Q·Kᵀ / O += P·V (mixed only as a debug aid).
template <bool kWgS, bool kWgPV, bool kFp8>
__global__ void __launch_bounds__(kThreads, 1) mla_fast_kernel(const KParams p) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t sbase = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sQ = sbase + kOffQ;    // [64 rows][576] bf16 as 9 swizzled [64][64] chunks
  const uint32_t sKV = sbase + kOffKV;  // bf16: [2 stages][64 keys][576]; fp8: [64][576] + raw
  const uint32_t sRaw = sKV + kTileBytes;  // fp8 only: [2 stages][64 keys][576] e4m3
  const uint32_t sP = sbase + kOffP;    // [64 rows][64 keys] bf16, swizzled
  const uint32_t sMax = sbase + kOffRed;          // [2 WG][64 rows] f32
  const uint32_t sSum = sMax + 2 * 64 * 4;        // [2 WG][64 rows] f32

  const int tid = threadIdx.x, wg = tid >> 7, wi = (tid >> 5) & 3, lane = tid & 31;
  const int rt = blockIdx.x, split = blockIdx.y, r = blockIdx.z;
  const int H = p.H;
  const int q_len = p.q_len[r];
  const int rows = q_len * H;  // packed (token, head) rows of this request
  const int row0 = rt * kRows;
  if (row0 >= rows) return;
  const int k_len = p.k_len[r], q_start = p.q_start[r];
  const int32_t* slots = p.slots + p.k_start[r];
  const int nk = (k_len + kKeys - 1) / kKeys;
  const int tps = (nk + p.splits - 1) / p.splits;
  const int t_begin = min(nk, split * tps);
  const int t_end = min(nk, t_begin + tps);

  // This thread's two accumulator rows and the end of the keys each one sees (causal, bottom-right).
  int rr[2], lim[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    rr[h] = 16 * wi + (lane >> 2) + 8 * h;
    const int qi = (row0 + rr[h]) / H;
    lim[h] = p.causal ? min(k_len, k_len - q_len + qi + 1) : k_len;
  }

  float o[128];  // O[64 rows][256w, +256) in the wgmma / mma.sync accumulator layout
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY};  // running max, log2 units
  float l_run[2] = {0.f, 0.f};              // running sum (this thread's keys)

  // Slots of this thread's keys of tile t (-1: past k_len, zero-filled).
  auto fetch_slots = [&](int t, int (&sl)[2]) {
    if constexpr (kFp8) {
      const int kidx = t * kKeys + (tid >> 2);
      sl[0] = kidx < k_len ? __ldg(slots + kidx) : -1;
      sl[1] = -1;
    } else {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int kidx = t * kKeys + (tid >> 3) + 32 * h;
        sl[h] = kidx < k_len ? __ldg(slots + kidx) : -1;
      }
    }
  };
  // Issue the async copies of one KV tile (bf16: into the swizzled stage; fp8: into a raw stage).
  auto load_tile = [&](int stage, const int (&sl)[2]) {
    if constexpr (kFp8) {
      const int key = tid >> 2, sub = tid & 3;
      const bool valid = sl[0] >= 0;
      const uint8_t* src = valid ? p.kv + size_t(sl[0]) * kD + sub * 16 : p.kv;
      const uint32_t dst = sRaw + stage * kRawBytes + key * kD + sub * 16;
#pragma unroll
      for (int i = 0; i < 9; ++i) cp_async16(dst + i * 64, valid ? src + i * 64 : p.kv, valid);
    } else {
      const int sub = tid & 7;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int key = (tid >> 3) + 32 * h;
        const bool valid = sl[h] >= 0;
        const uint8_t* src = valid ? p.kv + size_t(sl[h]) * (kD * 2) + sub * 16 : p.kv;
        const uint32_t dst = sKV + stage * kTileBytes + swz(key, sub);
#pragma unroll
        for (int i = 0; i < 9; ++i)
          cp_async16(dst + i * kChunkBytes, valid ? src + i * 128 : p.kv, valid);
      }
    }
  };
  // fp8 only: raw stage → bf16 swizzled tile (dims 64i + 16sub + [0,16) of key tid/4).
  auto convert_tile = [&](int stage) {
    const int key = tid >> 2, sub = tid & 3;
    const uint32_t src = sRaw + stage * kRawBytes + key * kD + sub * 16;
#pragma unroll
    for (int i = 0; i < 9; ++i) {
      const uint4 v = ld_shared_v4(src + i * 64);
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
      uint32_t b[8];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        b[2 * k] = fp8x2_to_bf16x2(w[k] & 0xffffu);
        b[2 * k + 1] = fp8x2_to_bf16x2(w[k] >> 16);
      }
      const uint32_t dst = sKV + i * kChunkBytes;
      st_shared_v4(dst + swz(key, 2 * sub), make_uint4(b[0], b[1], b[2], b[3]));
      st_shared_v4(dst + swz(key, 2 * sub + 1), make_uint4(b[4], b[5], b[6], b[7]));
    }
  };

  if (t_begin < t_end) {
    // ---- prologue: Q (zero rows past the request) + the first two tiles
    {
      const __nv_bfloat16* qbase = p.q + (size_t(q_start) * H + row0) * kD;
      const int sub = tid & 7;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = (tid >> 3) + 32 * h;
        const bool valid = row0 + row < rows;
        const __nv_bfloat16* src = valid ? qbase + size_t(row) * kD + sub * 8 : p.q;
#pragma unroll
        for (int i = 0; i < 9; ++i)
          cp_async16(sQ + i * kChunkBytes + swz(row, sub), valid ? src + i * 64 : p.q, valid);
      }
    }
    int sl[2];
    fetch_slots(t_begin, sl);
    load_tile(0, sl);
    cp_async_commit();
    if (t_begin + 1 < t_end) {
      fetch_slots(t_begin + 1, sl);
      load_tile(1, sl);
    }
    cp_async_commit();

    for (int t = t_begin; t < t_end; ++t) {
      const int stage = (t - t_begin) & 1;
      const bool more = t + 2 < t_end;
      if (more) fetch_slots(t + 2, sl);  // in flight during this tile's math
      cp_async_wait<1>();
      fence_proxy_async();
      __syncthreads();
      uint32_t kv_tile;
      if constexpr (kFp8) {
        convert_tile(stage);
        fence_proxy_async();
        __syncthreads();
        if (more) load_tile(stage, sl);
        cp_async_commit();
        kv_tile = sKV;
      } else {
        kv_tile = sKV + stage * kTileBytes;
      }

      // ---- S[64 rows][32 keys of this WG] = Q · Kᵀ
      float s[16];
#pragma unroll
      for (int i = 0; i < 16; ++i) s[i] = 0.f;
      if constexpr (kWgS) {
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < 36; ++kk) {
          const uint32_t off = (kk >> 2) * kChunkBytes + (kk & 3) * 32;
          wgmma_m64n32_ss_t00(s, make_desc(sQ + off, 16, 1024),
                              make_desc(kv_tile + wg * 4096 + off, 16, 1024), kk > 0);
        }
        wg_commit();
        wg_wait<0>();
        fence_regs(s);
      } else {
#pragma unroll 4
        for (int kk = 0; kk < 36; ++kk) {
          const uint32_t coff = (kk >> 2) * kChunkBytes;
          const int sub = kk & 3;
          uint32_t a[4];
          ldsm_x4(sQ + coff + swz(16 * wi + (lane & 15), 2 * sub + (lane >> 4)), a);
#pragma unroll
          for (int jj = 0; jj < 2; ++jj) {
            const int mi = lane >> 3;
            uint32_t b[4];
            ldsm_x4(kv_tile + coff + swz(32 * wg + 16 * jj + (mi >> 1) * 8 + (lane & 7), 2 * sub + (mi & 1)),
                    b);
            mma16816(&s[8 * jj], a, b[0], b[1]);
            mma16816(&s[8 * jj + 4], a, b[2], b[3]);
          }
        }
      }

      // ---- online softmax (log2 domain); row maxima exchanged between the two WGs
      const int kbase = t * kKeys + 32 * wg + 2 * (lane & 3);
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int h = e >> 1;
          const float v = kbase + 8 * j + (e & 1) < lim[h] ? s[4 * j + e] * p.scale_log2 : -INFINITY;
          s[4 * j + e] = v;
          mx[h] = fmaxf(mx[h], v);
        }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
        if ((lane & 3) == 0) st_shared_f32(sMax + (wg * 64 + rr[h]) * 4, mx[h]);
      }
      named_bar_sync(1, kThreads);
      float alpha[2], base[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float other = ld_shared_f32(sMax + ((wg ^ 1) * 64 + rr[h]) * 4);
        const float m_new = fmaxf(m_run[h], fmaxf(mx[h], other));
        base[h] = m_new == -INFINITY ? 0.f : m_new;
        alpha[h] = fast_exp2(m_run[h] - base[h]);
        m_run[h] = m_new;
      }
      float sum[2] = {0.f, 0.f};
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float pv = fast_exp2(s[4 * j + e] - base[e >> 1]);
          s[4 * j + e] = pv;
          sum[e >> 1] += pv;
        }
#pragma unroll
      for (int h = 0; h < 2; ++h) l_run[h] = l_run[h] * alpha[h] + sum[h];
      // P (bf16) → smem: row rr[h], keys 32wg + 8j + 2(lane&3) + {0,1}
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          st_shared_u32(sP + swz(rr[h], 4 * wg + j) + (lane & 3) * 4,
                        pack_bf16(s[4 * j + 2 * h], s[4 * j + 2 * h + 1]));
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        o[4 * j + 0] *= alpha[0];
        o[4 * j + 1] *= alpha[0];
        o[4 * j + 2] *= alpha[1];
        o[4 * j + 3] *= alpha[1];
      }
      fence_proxy_async();
      named_bar_sync(1, kThreads);

      // ---- O[64][256w, +256) += P[64][64] · V[64 keys][256w, +256)
      if constexpr (kWgPV) {
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
          wgmma_m64n256_ss_tb(o, make_desc(sP + kk * 32, 16, 1024),
                              make_desc(kv_tile + wg * 4 * kChunkBytes + kk * 2048, p.v_lbo, p.v_sbo), 1);
        wg_commit();
        wg_wait<0>();
        fence_regs(o);
      } else {
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          uint32_t a[4];
          ldsm_x4(sP + swz(16 * wi + (lane & 15), 2 * kk + (lane >> 4)), a);
          const int mi = lane >> 3;
          const int key = kk * 16 + (mi & 1) * 8 + (lane & 7);
#pragma unroll
          for (int jp = 0; jp < 16; ++jp) {
            const int dim = 256 * wg + 16 * jp + (mi >> 1) * 8;
            uint32_t b[4];
            ldsm_x4_t(kv_tile + (dim >> 6) * kChunkBytes + swz(key, (dim >> 3) & 7), b);
            mma16816(&o[8 * jp], a, b[0], b[1]);
            mma16816(&o[8 * jp + 4], a, b[2], b[3]);
          }
        }
      }
      __syncthreads();  // this stage (and P, the row maxima) may be overwritten now
      if constexpr (!kFp8) {
        if (more) load_tile(stage, sl);
        cp_async_commit();
      }
    }
  }

  // ---- epilogue: total row sums, normalize, write o + lse (or the split's partial)
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 1);
    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 2);
    if ((lane & 3) == 0) st_shared_f32(sSum + (wg * 64 + rr[h]) * 4, l_run[h]);
  }
  __syncthreads();
  const int c0 = 256 * wg + 2 * (lane & 3);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int prow = row0 + rr[h];
    if (prow >= rows) continue;
    const float l = ld_shared_f32(sSum + rr[h] * 4) + ld_shared_f32(sSum + (64 + rr[h]) * 4);
    const float inv = l > 0.f ? p.out_scale / l : 0.f;
    const float lse = l > 0.f ? (m_run[h] + log2f(l)) * 0.69314718055994531f : -INFINITY;
    const size_t grow = size_t(q_start) * H + prow;  // row of o [T·H, 512]
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
              pack_bf16(o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv);
      }
      if (write_lse && p.lse) p.lse[grow] = lse;
    } else {
      const size_t prow_ws = size_t(split) * p.rows_total + grow;
      float* orow = p.ws_o + prow_ws * kDv + c0;
#pragma unroll
      for (int j = 0; j < 32; ++j)
        *reinterpret_cast<float2*>(orow + 8 * j) =
            make_float2(o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv);
      if (write_lse) p.ws_lse[prow_ws] = lse;
    }
  }
}

// ---- the narrow kernel (swap-AB) ------------------------------------------------------------------
// Requests of ≤ 32 packed rows (e.g. 16 heads × 1–2 tokens): the rows go in the N dimension of the
// products (granularity 8), so no tensor work is spent on padding to 64 rows:
//   Sᵀ[64 keys][N] = K · Qᵀ      (wgmma m64nNk16; A = K tile, B = Q, both K-major)
//   Oᵀ[512][N]    += Vᵀ · Pᵀ     (8 × wgmma m64nNk16; A = the same K tile read MN-major, B = Pᵀ)
// One warpgroup per CTA; same tiles, pipeline, masking and split scheme as the wide kernel.
constexpr int kNarrowThreads = 128;
template <int N>
struct NarrowSmem {
  static constexpr int kQ = 0;                       // Q [9][N rows][64] bf16, swizzled
  static constexpr int kKV = 9 * N * 128;            // as the wide kernel's KV area
  static constexpr int kP = kKV + 2 * kTileBytes;    // Pᵀ [N rows][64 keys] bf16, swizzled
  static constexpr int kRed = kP + N * 128;          // f32 [4 warps][N] max, [4][N] sum
  static constexpr int kBytes = kRed + 2 * 4 * N * 4 + 1024;
};

template <int N, bool kFp8>
__global__ void __launch_bounds__(kNarrowThreads, 1) mla_narrow_kernel(const KParams p) {
  using L = NarrowSmem<N>;
  constexpr int J = N / 8;  // 8-row groups
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t sbase = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sQ = sbase + L::kQ;
  const uint32_t sKV = sbase + L::kKV;     // bf16: [2 stages][64 keys][576]; fp8: [64][576] + raw
  const uint32_t sRaw = sKV + kTileBytes;  // fp8 only: [2 stages][64 keys][576] e4m3
  const uint32_t sP = sbase + L::kP;
  const uint32_t sMax = sbase + L::kRed;   // [4 warps][N] f32
  const uint32_t sSum = sMax + 4 * N * 4;  // [4 warps][N] f32

  const int tid = threadIdx.x, wi = tid >> 5, lane = tid & 31;
  const int rt = blockIdx.x, split = blockIdx.y, r = blockIdx.z;
  const int H = p.H;
  const int q_len = p.q_len[r];
  const int rows = q_len * H;
  const int row0 = rt * N;
  if (row0 >= rows) return;
  const int k_len = p.k_len[r], q_start = p.q_start[r];
  const int32_t* slots = p.slots + p.k_start[r];
  const int nk = (k_len + kKeys - 1) / kKeys;
  const int tps = (nk + p.splits - 1) / p.splits;
  const int t_begin = min(nk, split * tps);
  const int t_end = min(nk, t_begin + tps);

  // This thread's rows 8j + 2(lane&3) + c and their key limits; its keys 16wi + lane/4 + {0, 8}.
  int lim[J][2];
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int qi = (row0 + 8 * j + 2 * (lane & 3) + c) / H;
      lim[j][c] = p.causal ? min(k_len, k_len - q_len + qi + 1) : k_len;
    }
  float o[8][N / 2];  // Oᵀ block b: o[b][4j+e] = O[row 8j + 2(lane&3) + (e&1)][dim 64b + 16wi + lane/4 + 8(e>>1)]
#pragma unroll
  for (int b = 0; b < 8; ++b)
#pragma unroll
    for (int i = 0; i < N / 2; ++i) o[b][i] = 0.f;
  float m_run[J][2], l_run[J][2];
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      m_run[j][c] = -INFINITY;
      l_run[j][c] = 0.f;
    }

  // bf16: keys (tid>>3) + 16h, h < 4, 16-byte chunk tid&7; fp8: keys (tid>>2) + 32h, h < 2, chunk tid&3.
  auto fetch_slots = [&](int t, int (&sl)[4]) {
#pragma unroll
    for (int h = 0; h < 4; ++h) {
      const int key = kFp8 ? (tid >> 2) + 32 * h : (tid >> 3) + 16 * h;
      const int kidx = t * kKeys + key;
      sl[h] = (!kFp8 || h < 2) && kidx < k_len ? __ldg(slots + kidx) : -1;
    }
  };
  auto load_tile = [&](int stage, const int (&sl)[4]) {
    if constexpr (kFp8) {
      const int sub = tid & 3;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int key = (tid >> 2) + 32 * h;
        const bool valid = sl[h] >= 0;
        const uint8_t* src = valid ? p.kv + size_t(sl[h]) * kD + sub * 16 : p.kv;
        const uint32_t dst = sRaw + stage * kRawBytes + key * kD + sub * 16;
#pragma unroll
        for (int i = 0; i < 9; ++i) cp_async16(dst + i * 64, valid ? src + i * 64 : p.kv, valid);
      }
    } else {
      const int sub = tid & 7;
#pragma unroll
      for (int h = 0; h < 4; ++h) {
        const int key = (tid >> 3) + 16 * h;
        const bool valid = sl[h] >= 0;
        const uint8_t* src = valid ? p.kv + size_t(sl[h]) * (kD * 2) + sub * 16 : p.kv;
        const uint32_t dst = sKV + stage * kTileBytes + swz(key, sub);
#pragma unroll
        for (int i = 0; i < 9; ++i)
          cp_async16(dst + i * kChunkBytes, valid ? src + i * 128 : p.kv, valid);
      }
    }
  };
  auto convert_tile = [&](int stage) {
    const int sub = tid & 3;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int key = (tid >> 2) + 32 * h;
      const uint32_t src = sRaw + stage * kRawBytes + key * kD + sub * 16;
#pragma unroll
      for (int i = 0; i < 9; ++i) {
        const uint4 v = ld_shared_v4(src + i * 64);
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
        uint32_t b[8];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          b[2 * k] = fp8x2_to_bf16x2(w[k] & 0xffffu);
          b[2 * k + 1] = fp8x2_to_bf16x2(w[k] >> 16);
        }
        const uint32_t dst = sKV + i * kChunkBytes;
        st_shared_v4(dst + swz(key, 2 * sub), make_uint4(b[0], b[1], b[2], b[3]));
        st_shared_v4(dst + swz(key, 2 * sub + 1), make_uint4(b[4], b[5], b[6], b[7]));
      }
    }
  };

  if (t_begin < t_end) {
    {  // Q rows (zero past the request)
      const __nv_bfloat16* qbase = p.q + (size_t(q_start) * H + row0) * kD;
      const int sub = tid & 7;
      for (int row = tid >> 3; row < N; row += 16) {
        const bool valid = row0 + row < rows;
        const __nv_bfloat16* src = valid ? qbase + size_t(row) * kD + sub * 8 : p.q;
#pragma unroll
        for (int i = 0; i < 9; ++i)
          cp_async16(sQ + i * (N * 128) + swz(row, sub), valid ? src + i * 64 : p.q, valid);
      }
    }
    int sl[4];
    fetch_slots(t_begin, sl);
    load_tile(0, sl);
    cp_async_commit();
    if (t_begin + 1 < t_end) {
      fetch_slots(t_begin + 1, sl);
      load_tile(1, sl);
    }
    cp_async_commit();

    for (int t = t_begin; t < t_end; ++t) {
      const int stage = (t - t_begin) & 1;
      const bool more = t + 2 < t_end;
      if (more) fetch_slots(t + 2, sl);
      cp_async_wait<1>();
      fence_proxy_async();
      __syncthreads();
      uint32_t kv_tile;
      if constexpr (kFp8) {
        convert_tile(stage);
        fence_proxy_async();
        __syncthreads();
        if (more) load_tile(stage, sl);
        cp_async_commit();
        kv_tile = sKV;
      } else {
        kv_tile = sKV + stage * kTileBytes;
      }

      // ---- Sᵀ[64 keys][N rows] = K · Qᵀ
      float s[N / 2];
#pragma unroll
      for (int i = 0; i < N / 2; ++i) s[i] = 0.f;
      wg_fence();
#pragma unroll
      for (int kk = 0; kk < 36; ++kk) {
        const uint32_t ka = (kk >> 2) * kChunkBytes + (kk & 3) * 32;
        const uint32_t qb = (kk >> 2) * (N * 128) + (kk & 3) * 32;
        wgmma_narrow<N, 0>(s, make_desc(kv_tile + ka, 16, 1024), make_desc(sQ + qb, 16, 1024), kk > 0);
      }
      wg_commit();
      wg_wait<0>();
      fence_regs(s);

      // ---- online softmax over the key (M) dimension: in-thread pair, lanes (xor 4/8/16), warps (smem)
      const int kb = t * kKeys + 16 * wi + (lane >> 2);
      float mx[J][2];
#pragma unroll
      for (int j = 0; j < J; ++j)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float v0 = kb < lim[j][c] ? s[4 * j + c] * p.scale_log2 : -INFINITY;
          const float v1 = kb + 8 < lim[j][c] ? s[4 * j + 2 + c] * p.scale_log2 : -INFINITY;
          s[4 * j + c] = v0;
          s[4 * j + 2 + c] = v1;
          float m = fmaxf(v0, v1);
          m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 4));
          m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 8));
          m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 16));
          mx[j][c] = m;
          if (lane < 4) st_shared_f32(sMax + (wi * N + 8 * j + 2 * lane + c) * 4, m);
        }
      __syncthreads();
#pragma unroll
      for (int j = 0; j < J; ++j)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int row = 8 * j + 2 * (lane & 3) + c;
          float mt = mx[j][c];
#pragma unroll
          for (int w = 0; w < 4; ++w) mt = fmaxf(mt, ld_shared_f32(sMax + (w * N + row) * 4));
          const float m_new = fmaxf(m_run[j][c], mt);
          const float base = m_new == -INFINITY ? 0.f : m_new;
          const float alpha = fast_exp2(m_run[j][c] - base);
          m_run[j][c] = m_new;
          const float p0 = fast_exp2(s[4 * j + c] - base);
          const float p1 = fast_exp2(s[4 * j + 2 + c] - base);
          l_run[j][c] = l_run[j][c] * alpha + p0 + p1;
          // Pᵀ[row][key]: keys 16wi + lane/4 (chunk 2wi) and + 8 (chunk 2wi + 1)
          st_shared_u16(sP + swz(row, 2 * wi) + (lane >> 2) * 2, bf16_bits(p0));
          st_shared_u16(sP + swz(row, 2 * wi + 1) + (lane >> 2) * 2, bf16_bits(p1));
#pragma unroll
          for (int b = 0; b < 8; ++b) {
            o[b][4 * j + c] *= alpha;
            o[b][4 * j + 2 + c] *= alpha;
          }
        }
      fence_proxy_async();
      __syncthreads();

      // ---- Oᵀ[64b + (0..63)][N] += Vᵀ · Pᵀ, b = 0..7
      wg_fence();
#pragma unroll
      for (int b = 0; b < 8; ++b)
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
          wgmma_narrow<N, 1>(o[b], make_desc(kv_tile + b * kChunkBytes + kk * 2048, p.v_lbo, p.v_sbo),
                             make_desc(sP + kk * 32, 16, 1024), 1);
      wg_commit();
      wg_wait<0>();
#pragma unroll
      for (int b = 0; b < 8; ++b) fence_regs(o[b]);
      __syncthreads();  // stage, Pᵀ and the row maxima may be overwritten now
      if constexpr (!kFp8) {
        if (more) load_tile(stage, sl);
        cp_async_commit();
      }
    }
  }

  // ---- epilogue
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      float l = l_run[j][c];
      l += __shfl_xor_sync(0xffffffffu, l, 4);
      l += __shfl_xor_sync(0xffffffffu, l, 8);
      l += __shfl_xor_sync(0xffffffffu, l, 16);
      if (lane < 4) st_shared_f32(sSum + (wi * N + 8 * j + 2 * lane + c) * 4, l);
    }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int row = 8 * j + 2 * (lane & 3) + c;
      const int prow = row0 + row;
      if (prow >= rows) continue;
      float l = 0.f;
#pragma unroll
      for (int w = 0; w < 4; ++w) l += ld_shared_f32(sSum + (w * N + row) * 4);
      const float inv = l > 0.f ? p.out_scale / l : 0.f;
      const float lse = l > 0.f ? (m_run[j][c] + log2f(l)) * 0.69314718055994531f : -INFINITY;
      const size_t grow = size_t(q_start) * H + prow;
      const bool write_lse = wi == 0 && (lane >> 2) == 0;
      const int d0 = 16 * wi + (lane >> 2);
      if (p.splits == 1) {
        if (p.o_f32) {
          float* orow = static_cast<float*>(p.o) + grow * kDv + d0;
#pragma unroll
          for (int b = 0; b < 8; ++b) {
            orow[64 * b] = o[b][4 * j + c] * inv;
            orow[64 * b + 8] = o[b][4 * j + 2 + c] * inv;
          }
        } else {
          __nv_bfloat16* orow = static_cast<__nv_bfloat16*>(p.o) + grow * kDv + d0;
#pragma unroll
          for (int b = 0; b < 8; ++b) {
            orow[64 * b] = __float2bfloat16_rn(o[b][4 * j + c] * inv);
            orow[64 * b + 8] = __float2bfloat16_rn(o[b][4 * j + 2 + c] * inv);
          }
        }
        if (write_lse && p.lse) p.lse[grow] = lse;
      } else {
        const size_t prow_ws = size_t(split) * p.rows_total + grow;
        float* orow = p.ws_o + prow_ws * kDv + d0;
#pragma unroll
        for (int b = 0; b < 8; ++b) {
          orow[64 * b] = o[b][4 * j + c] * inv;
          orow[64 * b + 8] = o[b][4 * j + 2 + c] * inv;
        }
        if (write_lse) p.ws_lse[prow_ws] = lse;
      }
    }
}

// ---- combine: o[row] = Σ_s e^(lse_s − m) o_s / Σ_s e^(lse_s − m), lse = m + ln Σ ------------------
// grid T·H rows, 128 threads (4 columns each).
__global__ void __launch_bounds__(128) mla_fast_combine(const float* __restrict__ ws_o,
                                                        const float* __restrict__ ws_lse, int splits,
                                                        int rows_total, void* o, int o_f32, float* lse) {
  __shared__ float w[kMaxSplits];
  __shared__ float s_lse;
  const int row = blockIdx.x, tid = threadIdx.x;
  if (tid < 32) {
    float m = -INFINITY;
    for (int s = tid; s < splits; s += 32) m = fmaxf(m, ws_lse[size_t(s) * rows_total + row]);
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, d));
    float sum = 0.f;
    for (int s = tid; s < splits; s += 32) {
      const float v = ws_lse[size_t(s) * rows_total + row];
      const float e = v == -INFINITY ? 0.f : expf(v - m);
      w[s] = e;
      sum += e;
    }
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, d);
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    for (int s = tid; s < splits; s += 32) w[s] *= inv;
    if (tid == 0) s_lse = sum > 0.f ? m + logf(sum) : -INFINITY;
  }
  __syncthreads();
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int s = 0; s < splits; ++s) {
    const float wt = w[s];
    if (wt > 0.f) {
      const float4 v = *reinterpret_cast<const float4*>(ws_o + (size_t(s) * rows_total + row) * kDv + tid * 4);
      acc.x += wt * v.x;
      acc.y += wt * v.y;
      acc.z += wt * v.z;
      acc.w += wt * v.w;
    }
  }
  if (o_f32) {
    *reinterpret_cast<float4*>(static_cast<float*>(o) + size_t(row) * kDv + tid * 4) = acc;
  } else {
    uint2 packed = make_uint2(pack_bf16(acc.x, acc.y), pack_bf16(acc.z, acc.w));
    *reinterpret_cast<uint2*>(static_cast<__nv_bfloat16*>(o) + size_t(row) * kDv + tid * 4) = packed;
  }
  if (tid == 0 && lse) lse[row] = s_lse;
}

// ---- host side ----------------------------------------------------------------------------------
int device_sms() {
  static int cache[64] = {};
  int dev = 0;
  cudaGetDevice(&dev);
  if (dev < 0 || dev >= 64) return 132;
  if (cache[dev] == 0) {
    int n = 0;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0) n = 132;
    cache[dev] = n;
  }
  return cache[dev];
}

// Splits a workspace for `rows` query rows must hold: a split run never puts more than 2·SMs CTAs
// (of ≥ rows/64 row tiles) on the grid.
int64_t ws_split_cap(int64_t rows, int num_sms) {
  if (rows <= 0) return 1;
  return std::clamp<int64_t>((2 * int64_t(num_sms) * kRows + rows - 1) / rows, 1, kMaxSplits);
}

// Split count: fewest waves × (tiles per split + fixed cost) over the candidates the workspace allows.
int choose_splits(int64_t units, int nk, int num_sms, int64_t cap) {
  if (nk <= 1 || cap <= 1) return 1;
  auto cost = [&](int64_t s) {
    const int64_t waves = (units * s + num_sms - 1) / num_sms;
    return double(waves) * (double((nk + s - 1) / s) + 2.0) + (s > 1 ? 1.0 : 0.0);
  };
  int best = 1;
  double best_cost = cost(1);
  const int64_t smax = std::min<int64_t>({int64_t(nk), cap, kMaxSplits});
  for (int64_t s = 2; s <= smax && units * s <= 2 * int64_t(num_sms); ++s) {
    const double c = cost(s);
    if (c < best_cost - 1e-9) {
      best_cost = c;
      best = int(s);
    }
  }
  return best;
}

template <bool kWgS, bool kWgPV, bool kFp8>
void launch_main(const KParams& kp, dim3 grid, cudaStream_t stream) {
  auto* fn = mla_fast_kernel<kWgS, kWgPV, kFp8>;
  static bool attr_set[64] = {};  // per device
  int dev = 0;
  cudaGetDevice(&dev);
  if (dev < 0 || dev >= 64 || !attr_set[dev]) {
    cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
    if (dev >= 0 && dev < 64) attr_set[dev] = true;
  }
  fn<<<grid, kThreads, kSmemBytes, stream>>>(kp);
}

template <int N, bool kFp8>
void launch_narrow(const KParams& kp, dim3 grid, cudaStream_t stream) {
  auto* fn = mla_narrow_kernel<N, kFp8>;
  static bool attr_set[64] = {};  // per device
  int dev = 0;
  cudaGetDevice(&dev);
  if (dev < 0 || dev >= 64 || !attr_set[dev]) {
    cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, NarrowSmem<N>::kBytes);
    if (dev >= 0 && dev < 64) attr_set[dev] = true;
  }
  fn<<<grid, kNarrowThreads, NarrowSmem<N>::kBytes, stream>>>(kp);
}

}  // namespace

size_t mla_fast_workspace_bytes(int32_t total_q, int32_t num_heads, int32_t num_sms) {
  const int64_t rows = int64_t(total_q) * num_heads;
  const int64_t cap = ws_split_cap(rows, num_sms > 0 ? num_sms : 132);
  if (cap <= 1) return 0;
  return size_t(cap) * size_t(rows) * (kDv + 1) * sizeof(float);
}

bool mla_fast_supports(const MlaParams& p) {
  auto aligned = [](const void* ptr, uintptr_t a) { return (reinterpret_cast<uintptr_t>(ptr) % a) == 0; };
  if (p.q_elem != Elem::BF16) return false;
  if (p.kv_elem != Elem::BF16 && p.kv_elem != Elem::FP8_E4M3FN) return false;
  if (p.o_elem != Elem::BF16 && p.o_elem != Elem::F32) return false;
  if (p.head_dim != kD || p.v_dim != kDv) return false;
  if (p.num_heads < 1 || p.num_heads > 128) return false;
  if (!p.q || !p.kv || !p.o || !p.kv_slots) return false;
  if (!aligned(p.q, 16) || !aligned(p.kv, 16) || !aligned(p.o, 16)) return false;
  if (p.seg.num_requests > 65535) return false;
  if (int64_t(p.seg.max_q_len) * p.num_heads > int64_t(kRows) * 65535) return false;
  return true;
}

void mla_fast_set_debug(int32_t force_splits, bool use_mma_sync, int32_t variant) {
  g_force_splits = force_splits;
  g_use_mma_sync = use_mma_sync;
  g_variant = variant;
}

int32_t mla_fast_debug_last_splits() { return g_last_splits; }

void mla_attention_fast(const MlaParams& p) {
  const DeviceSegments& sg = p.seg;
  if (sg.num_requests <= 0 || sg.total_q <= 0) return;
  const int H = p.num_heads;
  const int64_t rows_total = int64_t(sg.total_q) * H;
  const int64_t max_rows = int64_t(sg.max_q_len) * H;  // packed rows of the largest request
  // ≤ 32 rows: swap-AB kernel with an N = 8/16/32 row tile; else 64-row tiles (variants: debug).
  const bool narrow = !g_use_mma_sync && (g_variant & 14) == 0 && max_rows <= 32;
  const int tile_rows = !narrow ? kRows : max_rows <= 8 ? 8 : max_rows <= 16 ? 16 : 32;
  const int row_tiles = int((max_rows + tile_rows - 1) / tile_rows);
  if (row_tiles <= 0) return;
  const int nk = (std::max(sg.max_k_len, 0) + kKeys - 1) / kKeys;
  const int64_t units = int64_t(sg.num_requests) * row_tiles;
  const int num_sms = device_sms();
  const size_t per_split = size_t(rows_total) * (kDv + 1) * sizeof(float);
  const int64_t cap = p.ws.ptr ? std::min<int64_t>(kMaxSplits, int64_t(p.ws.bytes / per_split)) : 1;
  int splits = g_force_splits > 0 ? int(std::clamp<int64_t>(g_force_splits, 1, std::max<int64_t>(cap, 1)))
                                  : choose_splits(units, nk, num_sms, cap);
  if (splits < 1) splits = 1;
  g_last_splits = splits;

  const bool fp8 = p.kv_elem == Elem::FP8_E4M3FN;
  KParams kp{};
  kp.q = static_cast<const __nv_bfloat16*>(p.q);
  kp.kv = static_cast<const uint8_t*>(p.kv);
  kp.slots = p.kv_slots;
  kp.q_start = sg.q_start;
  kp.q_len = sg.q_len;
  kp.k_start = sg.k_start;
  kp.k_len = sg.k_len;
  kp.H = H;
  kp.causal = sg.causal ? 1 : 0;
  kp.splits = splits;
  kp.rows_total = int(rows_total);
  kp.scale_log2 = p.softmax_scale * p.kv_scale * 1.4426950408889634f;  // the pool scale applies to every row dtype
  kp.out_scale = p.kv_scale;
  kp.o = p.o;
  kp.o_f32 = p.o_elem == Elem::F32 ? 1 : 0;
  kp.lse = p.lse;
  kp.ws_o = splits > 1 ? static_cast<float*>(p.ws.ptr) : nullptr;
  kp.ws_lse = splits > 1 ? kp.ws_o + size_t(splits) * rows_total * kDv : nullptr;
  kp.v_lbo = (g_variant & 1) ? 1024u : uint32_t(kChunkBytes);  // variant bit 0: roles swapped (debug)
  kp.v_sbo = (g_variant & 1) ? uint32_t(kChunkBytes) : 1024u;

  const dim3 grid(row_tiles, splits, sg.num_requests);
  if (narrow) {
    if (tile_rows == 8) fp8 ? launch_narrow<8, true>(kp, grid, p.stream) : launch_narrow<8, false>(kp, grid, p.stream);
    else if (tile_rows == 16) fp8 ? launch_narrow<16, true>(kp, grid, p.stream) : launch_narrow<16, false>(kp, grid, p.stream);
    else fp8 ? launch_narrow<32, true>(kp, grid, p.stream) : launch_narrow<32, false>(kp, grid, p.stream);
  } else if (g_use_mma_sync) {
    if (fp8) launch_main<false, false, true>(kp, grid, p.stream);
    else launch_main<false, false, false>(kp, grid, p.stream);
  } else if ((g_variant & 2) && !fp8) {  // debug: wgmma S, mma.sync P·V
    launch_main<true, false, false>(kp, grid, p.stream);
  } else if ((g_variant & 4) && !fp8) {  // debug: mma.sync S, wgmma P·V
    launch_main<false, true, false>(kp, grid, p.stream);
  } else {
    if (fp8) launch_main<true, true, true>(kp, grid, p.stream);
    else launch_main<true, true, false>(kp, grid, p.stream);
  }
  if (splits > 1)
    mla_fast_combine<<<unsigned(rows_total), 128, 0, p.stream>>>(kp.ws_o, kp.ws_lse, splits, int(rows_total),
                                                               p.o, kp.o_f32, p.lse);
}

}  // namespace mla::cuda
