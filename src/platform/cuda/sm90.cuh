// sm90.cuh — the Hopper (sm_90a) primitives of the CUDA tensor-core kernels: PTX wrappers for
// cp.async, mbarriers and the TMA bulk tensor copy, shared-memory access, ldmatrix / mma.sync,
// wgmma (fence, commit, wait, the register fence, descriptors, the products) and the bf16 / fp8
// conversions. One definition of each, shared by mla_decode_*.cu and mha_prefill.cu; device code
// only (include from .cu files built for sm_90a).
#pragma once
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "platform/gpu/elem.cuh"

namespace mla::cuda::sm90 {

// ---- addresses and conversions ---------------------------------------------------------------
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 2^x, approximate (ex2.approx.ftz): the softmax exponent in log2 units.
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
// silu(g) · u of two f32 products as bf16 stores them: each rounded to bf16, then gpu::silu_times
// (the gate/up epilogues of the expert and small-row GEMMs: the bits of two stores and silu_mul).
__device__ __forceinline__ float silu_mul_bf16(float g, float u) {
  g = __bfloat162float(__float2bfloat16_rn(g));
  u = __bfloat162float(__float2bfloat16_rn(u));
  return gpu::silu_times(g, u);
}
// Two floats → packed bf16x2, `lo` in the low half (the lower column of an mma fragment).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}
// Two floats → packed f16x2, `lo` in the low half.
__device__ __forceinline__ uint32_t pack_f16(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}
__device__ __forceinline__ uint16_t bf16_bits(float x) {
  const __nv_bfloat16 h = __float2bfloat16_rn(x);
  return *reinterpret_cast<const uint16_t*>(&h);
}
// Four e4m3fn codes → two f16 pairs (exact): lo = bytes 0, 1 (byte 0 in its low half), hi = bytes
// 2, 3. The cvt reads each 16-bit half of the register as it is: no mask or shift before it.
__device__ __forceinline__ void fp8x4_to_f16x2x2(uint32_t four, uint32_t& lo, uint32_t& hi) {
  asm("{\n.reg .b16 a, b;\nmov.b32 {a, b}, %2;\ncvt.rn.f16x2.e4m3x2 %0, a;\ncvt.rn.f16x2.e4m3x2 %1, b;\n}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(four));
}
__device__ __forceinline__ uint16_t f16_bits(float x) { return __half_as_ushort(__float2half_rn(x)); }
// Four floats → four e4m3fn codes (nearest even, saturating at ±448; NaN stays NaN), a in byte 0.
__device__ __forceinline__ uint32_t e4m3x4(float a, float b, float c, float d) {
  const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
  const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, __NV_E4M3);
  return lo | (hi << 16);
}

// Byte permute: byte i of the result is byte ((sel >> 4i) & 7) of the pair (a: bytes 0–3, b: 4–7),
// or that byte's sign bit copied over all 8 bits where bit 3 of the nibble is set.
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}
// Two e4m3fn codes, bytes S0 and S1 (0–7) of the pair (a, b) → bf16x2 of their values, exact for
// every finite code, by integer ops and one multiply (through the cvt it takes a cvt to f16x2, two
// to f32 and a pack): each byte sign-extended to 16 bits (bit 3 of a selector nibble) and shifted
// up 4 puts the sign in bit 15, the exponent and mantissa in bits 10–4; masked, that is the value
// × 2^−120 as a bf16 (subnormal for e4m3's subnormals), and the product by 2^120 is exact. NaN
// codes become 480.
template <int S0, int S1>
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint32_t a, uint32_t b) {
  constexpr uint32_t sel = S0 | (S0 | 8) << 4 | S1 << 8 | (S1 | 8) << 12;
  const uint32_t t = (prmt(a, b, sel) << 4) & 0x87F087F0u;
  uint32_t r;
  asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(r) : "r"(t), "r"(0x7B807B80u));  // 2^120, twice
  return r;
}

// ---- cp.async -------------------------------------------------------------------------------
// BYTES-byte async copy global → shared; valid = false zero-fills the destination, reads nothing.
template <int BYTES = 16>
__device__ __forceinline__ void cp_async(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? BYTES : 0;
  if constexpr (BYTES == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n) : "memory");
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(src), "n"(BYTES), "r"(n)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// ---- barriers and fences --------------------------------------------------------------------
// Generic-proxy shared-memory writes → visible to wgmma / TMA (async proxy) after the next barrier.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void named_bar_sync(int id, int n) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int n) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
// Moves this warpgroup's register budget (setmaxnreg; needs a register cap at kernel entry).
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N) : "memory");
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N) : "memory");
}

// ---- programmatic dependent launch ----------------------------------------------------------
// The stream's next kernel, when launched with programmatic stream serialization, may start once
// every CTA of this grid has called this (or exited).
__device__ __forceinline__ void pdl_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}
// Waits until the stream's previous kernel has completed and its writes are visible (returns at
// once in a grid launched without programmatic stream serialization).
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
// An int in global memory read with acquire semantics at GPU scope; the global timer (ns).
__device__ __forceinline__ int ld_acquire_gpu(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint64_t globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}

// ---- mbarriers and TMA ----------------------------------------------------------------------
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
// Makes the mbarrier initializations visible to the async proxy and the cluster.
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Arrives on `bar` once this thread's earlier cp.async copies have landed (the arrival is counted
// in the barrier's expected count: .noinc).
__device__ __forceinline__ void cp_async_mbar_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, int phase) {
  uint32_t done;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(phase)
        : "memory");
  } while (!done);
}
// One box of a 3-D tensor map into shared memory, completing on mbarrier `bar`.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0,
                                            int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
// One box of shared memory → a 3-D tensor map's global tensor (bulk group of this thread). The
// writes that filled the box need fence_proxy_async and a barrier first.
__device__ __forceinline__ void tma_store_3d(const CUtensorMap* map, uint32_t src, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(src), "r"(c0), "r"(c1), "r"(c2)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// This thread's bulk groups but the newest N have read their shared memory (it may be written again).
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
// ... and have completed.
template <int N>
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

// ---- shared memory --------------------------------------------------------------------------
__device__ __forceinline__ void st_shared_u16(uint32_t addr, uint16_t v) {
  asm volatile("st.shared.b16 [%0], %1;\n" ::"r"(addr), "h"(v) : "memory");
}
__device__ __forceinline__ void st_shared_u32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ void st_shared_f32(uint32_t addr, float v) {
  asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(addr), "f"(v) : "memory");
}
__device__ __forceinline__ void st_shared_v4(uint32_t addr, uint4 v) {
  asm volatile("st.shared.v4.b32 [%0], {%1,%2,%3,%4};\n" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z),
               "r"(v.w)
               : "memory");
}
__device__ __forceinline__ float ld_shared_f32(uint32_t addr) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ uint32_t ld_shared_u32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ void st_shared_u64(uint32_t addr, uint64_t v) {
  asm volatile("st.shared.b64 [%0], %1;\n" ::"r"(addr), "l"(v) : "memory");
}
__device__ __forceinline__ uint64_t ld_shared_u64(uint32_t addr) {
  uint64_t v;
  asm volatile("ld.shared.b64 %0, [%1];\n" : "=l"(v) : "r"(addr) : "memory");
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
// Byte offset of 16-byte column chunk x (0..7) of row `row` inside a 128B-swizzled [rows][64 bf16]
// atom column (the layout of TMA / wgmma SWIZZLE_128B: chunk index XOR row mod 8).
__device__ __forceinline__ uint32_t swz128(int row, int x) {
  return uint32_t(row * 128 + ((x ^ (row & 7)) << 4));
}

// ---- ldmatrix / stmatrix / mma.sync ---------------------------------------------------------
// Four 8 × 8 b16 matrices → shared memory: register i of lane t is row t / 4, columns 2 (t % 4) + {0, 1}
// of matrix i (an mma / wgmma accumulator fragment's layout); lanes 8i .. 8i + 7 give matrix i's row
// addresses.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r[0]), "r"(r[1]),
               "r"(r[2]), "r"(r[3])
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
// c[4] += a[16x16] · b[16x8] (bf16 in, f32 accumulate).
__device__ __forceinline__ void mma_bf16(float* c, const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ---- wgmma ----------------------------------------------------------------------------------
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Pins accumulator registers around wgmma issue / wait (the compiler must not move their reads or
// writes across it).
template <int N>
__device__ __forceinline__ void reg_fence(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
// The same for the A fragments of a register-A product, which must stay as they are until it completes.
template <int M, int N>
__device__ __forceinline__ void reg_fence(uint32_t (&r)[M][N]) {
#pragma unroll
  for (int i = 0; i < M; ++i)
#pragma unroll
    for (int j = 0; j < N; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}
// Shared-memory matrix descriptor, 128-byte swizzle; address and strides in bytes.
__device__ __forceinline__ uint64_t sw128_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t((lbo >> 4) & 0x3FFF) << 16) |
         (uint64_t((sbo >> 4) & 0x3FFF) << 32) | (uint64_t(1) << 62);
}
// Byte offset of 16-byte unit u (0..3) of row `row` inside a 64B-swizzled [rows][64 bytes] atom
// column (wgmma SWIZZLE_64B: unit index XOR (row / 2) mod 4; atoms of 8 rows, 512 bytes).
__device__ __forceinline__ uint32_t swz64(int row, int u) {
  return uint32_t(row * 64 + ((u ^ ((row >> 1) & 3)) << 4));
}
// Shared-memory matrix descriptor of a K-major operand, 64-byte swizzle (addr 512-byte aligned at
// the atom; sbo: bytes between 8-row atoms).
__device__ __forceinline__ uint64_t sw64_desc(uint32_t addr, uint32_t sbo) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t((sbo >> 4) & 0x3FFF) << 32) |
         (uint64_t(2) << 62);
}
// sw128_desc(addr + off, lbo, sbo) from base = sw128_desc(addr, lbo, sbo), off a multiple of 16:
// the address field holds addr >> 4 and shared addresses stay below 256 KiB, so adding off >> 4 to
// the low word never carries out of the field. One add per product instead of building a
// descriptor (a loop of small products otherwise spends most of its instructions on them).
__device__ __forceinline__ uint64_t desc_add(uint64_t base, uint32_t off) {
  return (uint64_t(uint32_t(base >> 32)) << 32) | (uint32_t(base) + (off >> 4));
}

// The products. wgmma_m64nNk16_ss<kTransA, kTransB>(d, da, db, scale_d): D[64×N] (+)= A[64×16] ·
// B[16×N], A and B from shared memory (descriptors); kTransA / kTransB = 1: that operand is MN-major
// (else K-major); scale_d = 0 overwrites D. D is the warpgroup's f32 accumulator fragment, N / 2
// registers per thread: asm operands %0 .. %(N/2 − 1), then da, db, scale_d, kTransA, kTransB.
#define MLA_WG_D4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define MLA_WG_D16(i) MLA_WG_D4(i), MLA_WG_D4(i + 4), MLA_WG_D4(i + 8), MLA_WG_D4(i + 12)
#define MLA_WG_D32(i) MLA_WG_D16(i), MLA_WG_D16(i + 16)
#define MLA_WG_D64(i) MLA_WG_D16(i), MLA_WG_D16(i + 16), MLA_WG_D16(i + 32), MLA_WG_D16(i + 48)
#define MLA_WG_R4 "%0, %1, %2, %3"
#define MLA_WG_R8 MLA_WG_R4 ", %4, %5, %6, %7"
#define MLA_WG_R16 MLA_WG_R8 ", %8, %9, %10, %11, %12, %13, %14, %15"
#define MLA_WG_R32 \
  MLA_WG_R16 ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define MLA_WG_R64                                                                                 \
  MLA_WG_R32 ", "                                                                                  \
             "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "     \
             "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define MLA_WG_R128                                                                                \
  MLA_WG_R64 ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "  \
             "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "     \
             "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, "     \
             "%110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, " \
             "%124, %125, %126, %127"
// N columns; R: D's registers; A, B, S, TA, TB: the operand numbers of da, db, scale_d, kTransA,
// kTransB; then D's operands. kF16: A and B hold f16 (else bf16).
#define MLA_WG_SS_ASM(N, R, A, B, S, TA, TB, T, ...)                                                \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #S ", 0;\n"                                     \
               "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." T "." T " {" R "}, "               \
               "%" #A ", %" #B ", p, 1, 1, %" #TA ", %" #TB ";\n}\n"                                \
               : __VA_ARGS__                                                                       \
               : "l"(da), "l"(db), "r"(scale_d), "n"(kTransA), "n"(kTransB));
#define MLA_WG_SS(N, R, A, B, S, TA, TB, ...)                                                       \
  template <int kTransA, int kTransB, bool kF16 = false>                                           \
  __device__ __forceinline__ void wgmma_m64n##N##k16_ss(float (&d)[N / 2], uint64_t da, uint64_t db, \
                                                        int scale_d) {                             \
    if constexpr (kF16) {                                                                          \
      MLA_WG_SS_ASM(N, R, A, B, S, TA, TB, "f16", __VA_ARGS__)                                     \
    } else {                                                                                       \
      MLA_WG_SS_ASM(N, R, A, B, S, TA, TB, "bf16", __VA_ARGS__)                                    \
    }                                                                                              \
  }
MLA_WG_SS(8, MLA_WG_R4, 4, 5, 6, 7, 8, MLA_WG_D4(0))
MLA_WG_SS(16, MLA_WG_R8, 8, 9, 10, 11, 12, MLA_WG_D4(0), MLA_WG_D4(4))
MLA_WG_SS(32, MLA_WG_R16, 16, 17, 18, 19, 20, MLA_WG_D16(0))
MLA_WG_SS(64, MLA_WG_R32, 32, 33, 34, 35, 36, MLA_WG_D32(0))
MLA_WG_SS(128, MLA_WG_R64, 64, 65, 66, 67, 68, MLA_WG_D64(0))
MLA_WG_SS(256, MLA_WG_R128, 128, 129, 130, 131, 132, MLA_WG_D64(0), MLA_WG_D64(64))

// wgmma_m64nNk16_rs<kTransB, kF16>(d, a, db, scale_d): D[64×N] (+)= A[64×16] · B[16×N], A from
// registers (the mma.m16n8k16 A fragment of each warp: rows 16·warp + [0, 16)), B from shared memory
// (MN-major when kTransB); kF16: A and B hold f16 (else bf16). Operands: D, then a[0..3], db,
// scale_d, kTransB.
#define MLA_WG_RS_ASM(N, R, A0, A1, A2, A3, B, S, TB, T, ...)                                      \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #S ", 0;\n"                                 \
               "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." T "." T " {" R "}, "              \
               "{%" #A0 ", %" #A1 ", %" #A2 ", %" #A3 "}, %" #B ", p, 1, 1, %" #TB ";\n}\n"         \
               : __VA_ARGS__                                                                       \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d), "n"(kTransB));
#define MLA_WG_RS(N, R, A0, A1, A2, A3, B, S, TB, ...)                                              \
  template <int kTransB, bool kF16 = false>                                                        \
  __device__ __forceinline__ void wgmma_m64n##N##k16_rs(float (&d)[N / 2], const uint32_t (&a)[4], \
                                                        uint64_t db, int scale_d = 1) {            \
    if constexpr (kF16) {                                                                          \
      MLA_WG_RS_ASM(N, R, A0, A1, A2, A3, B, S, TB, "f16", __VA_ARGS__)                            \
    } else {                                                                                       \
      MLA_WG_RS_ASM(N, R, A0, A1, A2, A3, B, S, TB, "bf16", __VA_ARGS__)                           \
    }                                                                                              \
  }
MLA_WG_RS(8, MLA_WG_R4, 4, 5, 6, 7, 8, 9, 10, MLA_WG_D4(0))
MLA_WG_RS(16, MLA_WG_R8, 8, 9, 10, 11, 12, 13, 14, MLA_WG_D4(0), MLA_WG_D4(4))
MLA_WG_RS(64, MLA_WG_R32, 32, 33, 34, 35, 36, 37, 38, MLA_WG_D32(0))
MLA_WG_RS(128, MLA_WG_R64, 64, 65, 66, 67, 68, 69, 70, MLA_WG_D64(0))
MLA_WG_RS(256, MLA_WG_R128, 128, 129, 130, 131, 132, 133, 134, MLA_WG_D64(0), MLA_WG_D64(64))

// wgmma_m64nNk32_rs_e4m3(d, a, db, scale_d): D[64×N] (+)= A[64×32] · B[32×N] in e4m3 with f32
// sums, A from registers (4 words of 4 codes per thread; cute's ALayout_64x32: word w of lane
// 4g + c in warp i holds row 16i + g + 8·(w & 1), k 4c + 16·(w >> 1) + [0, 4), byte order), B from
// shared memory, K-major (the only major order of 8-bit operands).
#define MLA_WG_RS8(N, R, A0, A1, A2, A3, B, S, ...)                                                  \
  __device__ __forceinline__ void wgmma_m64n##N##k32_rs_e4m3(float (&d)[N / 2], const uint32_t (&a)[4], \
                                                             uint64_t db, int scale_d) {            \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #S ", 0;\n"                                  \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k32.f32.e4m3.e4m3 {" R "}, "              \
                 "{%" #A0 ", %" #A1 ", %" #A2 ", %" #A3 "}, %" #B ", p, 1, 1;\n}\n"                \
                 : __VA_ARGS__                                                                     \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));             \
  }
MLA_WG_RS8(8, MLA_WG_R4, 4, 5, 6, 7, 8, 9, MLA_WG_D4(0))
MLA_WG_RS8(16, MLA_WG_R8, 8, 9, 10, 11, 12, 13, MLA_WG_D4(0), MLA_WG_D4(4))

#undef MLA_WG_RS8
#undef MLA_WG_RS
#undef MLA_WG_RS_ASM
#undef MLA_WG_SS
#undef MLA_WG_SS_ASM
#undef MLA_WG_R128
#undef MLA_WG_R64
#undef MLA_WG_R32
#undef MLA_WG_R16
#undef MLA_WG_R8
#undef MLA_WG_R4
#undef MLA_WG_D64
#undef MLA_WG_D32
#undef MLA_WG_D16
#undef MLA_WG_D4

}  // namespace mla::cuda::sm90
