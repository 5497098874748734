// mla_decode_launch.h — what the host side of the MLA decode (mla_decode.cpp) hands its kernels:
// the tile constants, the kernel parameters and one launcher per kernel family (mla_decode_seesaw.cu,
// mla_decode_wide.cu, mla_decode_narrow.cu, mla_decode_combine.cu). Internal to the CUDA platform.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#ifdef MLA_SEESAW_TRACE
#include "platform/cuda/cuda_check.h"
#endif

namespace mla::cuda::mla_decode {

constexpr int kD = 576;                      // latent row: kv_lora_rank 512 + rope 64
constexpr int kDv = 512;                     // values: the first kDv columns of the row
constexpr int kRows = 64;                    // query rows per CTA of the wide kernel
constexpr int kKeys = 64;                    // keys per KV tile
constexpr int kChunkBytes = 64 * 128;        // [64 rows][64 cols] bf16, 128B swizzle atom column
constexpr int kTileBytes = 9 * kChunkBytes;  // [64 rows][576] bf16 = 73728
constexpr int kRawBytes = kKeys * kD;        // [64 keys][576] fp8 = 36864
constexpr int kMaxSplits = 128;

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
  float* ws_o;        // [splits, T·H, 512] f32 (splits > 1); persistent: [CTAs, 64, 512]
  float* ws_lse;      // [splits, T·H]; persistent: [CTAs, 64], log2 units
  uint32_t v_lbo;     // V (MN-major) descriptor: bytes between 64-column blocks
  uint32_t v_sbo;     //                          bytes between 8-key groups
};

// What the persistent see-saw grid takes beside KParams (its own kernel parameter: three more
// fields in KParams changed every see-saw kernel's code, +2.9 % of it, and made the unsplit grid
// 1.5-3 % slower on an H100).
struct PersistParams {
  int parts = 0;         // > 0: the persistent grid (row tiles, parts); kp.splits is 1
  int requests = 0;      // of the segments
  int* flags = nullptr;  // a flag per CTA (row tile · parts + part), zero between launches
};

// The 64-row kernels: kWgmma is production (the see-saw kernel, mla_decode_seesaw.cu); kSplitS the
// split-S kernel (mla_decode_wide.cu); the rest are the split-S kernel with mma.sync for both
// products (the reference path) or one of each (bf16 KV only; debugging aids).
enum class WideProducts { kWgmma, kSplitS, kMmaSync, kWgmmaSMmaPV, kMmaSWgmmaPV };

// Bytes of a persistent see-saw CTA's workspace slot: its partial [64 rows][512] f32 and LSEs [64].
constexpr size_t kPersistentSlotBytes = size_t(kRows) * (kDv + 1) * sizeof(float);

// grid (row tiles, splits, requests), or (row tiles, parts) for the persistent see-saw grid
// (pp.parts > 0); each launcher sets its kernel's shared-memory limit once per
// device.
// split_tiles: the most key tiles a CTA takes (the longest request's over kp.splits); the see-saw
// kernel's launch picks its pair bodies by it. grid_counters: the first two of
// MlaParams::grid_counters, zero, that a split grid the device holds at once may count in to merge
// its partials itself (it leaves them zero); null: never (the persistent grid's flags are pp.flags).
// Returns true when the grid merged them (no combine to launch).
bool launch_wide(const KParams& kp, dim3 grid, cudaStream_t stream, bool fp8, WideProducts products,
                 int split_tiles, int* grid_counters, const PersistParams& pp = {});
bool launch_seesaw(const KParams& kp, dim3 grid, cudaStream_t stream, bool fp8, int split_tiles,
                   int* grid_counters, const PersistParams& pp = {});
#ifdef MLA_SEESAW_TRACE
// Measurement builds only: per CTA of the last see-saw launches, for each warpgroup and point, the
// (%globaltimer ns, clock64) pair at slots 2·(wg·kTracePoints + point) and + 1; the CTA's SM + 1 in
// the last slot (0: the CTA recorded nothing). Takes the records (copies them to out, a
// kTraceCtas × kTraceSlots array) and clears them; returns kTraceCtas.
enum TracePoint { kTraceEntry, kTraceWork, kTraceQ, kTraceFirstS, kTracePair0, kTraceStore = kTracePair0 + 8,
                  kTraceEnd, kTraceArrived, kTraceMerged, kTracePoints };
constexpr int kTracePairs = kTraceStore - kTracePair0;
constexpr int kTraceCtas = 1024;
constexpr int kTraceSlots = 4 * kTracePoints + 1;
int seesaw_trace_take(unsigned long long* out);
// The combine's CTAs of the last launches: %globaltimer at start, after the wait, at the end
// (kTraceCtas × 3; 0: not recorded). Takes and clears them.
int combine_trace_take(unsigned long long* out);
// Both: a trace array's bytes (its __device__ symbol) copied to out, then zeroed.
template <class Symbol>
void take_trace(const Symbol& symbol, void* out) {
  MLA_CUDA_CHECK(cudaDeviceSynchronize());
  MLA_CUDA_CHECK(cudaMemcpyFromSymbol(out, symbol, sizeof(Symbol)));
  void* dev = nullptr;
  MLA_CUDA_CHECK(cudaGetSymbolAddress(&dev, symbol));
  MLA_CUDA_CHECK(cudaMemset(dev, 0, sizeof(Symbol)));
}
#endif
// tile_rows: 8, 16 or 32. The narrow kernel's raw fp8 form (mla_decode_narrow.cu): fp8 rows through
// registers, Q·Kᵀ in e4m3, at ≤ 16 rows.
constexpr bool narrow_raw_fp8(int tile_rows, bool fp8) { return fp8 && tile_rows <= 16; }
// CTAs of the narrow kernel one SM holds (the raw form leaves room for two).
constexpr int narrow_ctas_per_sm(int tile_rows, bool fp8) { return narrow_raw_fp8(tile_rows, fp8) ? 2 : 1; }
void launch_narrow(const KParams& kp, dim3 grid, cudaStream_t stream, int tile_rows, bool fp8);
// Merges the kp.splits partial results of the workspace into kp.o / kp.lse; early: launched as a
// programmatic dependent of the decode kernel before it in the stream (every decode kernel calls
// pdl_launch_dependents at its start).
void launch_combine(const KParams& kp, cudaStream_t stream, bool early);

}  // namespace mla::cuda::mla_decode
