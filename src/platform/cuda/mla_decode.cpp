// mla_decode.cpp — the host side of the fast MLA decode (mla_decode.h): what it supports, the
// workspace it needs, and the launch plan: the kernel (narrow swap-AB for ≤ 32 packed rows per
// request, else wide 64-row tiles) and the KV split count, then the kernels and the combine.
//
// Rows: the (token, head) pairs of one request, packed (row = token·H + head), so speculative
// tokens and small head counts share a tile. kv_scale (any row dtype) is folded into the softmax
// scale and the output scale. Split-KV: each (row tile, split) CTA writes f32 partial o + natural-log
// LSE to the workspace; the combine merges them, or the see-saw grid itself where the device holds
// it at once with at most one row a CTA to merge (launch_seesaw, MlaParams::grid_counters).
#include "platform/cuda/mla_decode.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "mla/batch.h"
#include "platform/cuda/mla_decode_launch.h"
#include "platform/cuda/mla_decode_parts.h"
#include "platform/cuda/sm90_host.h"

namespace mla::cuda {
namespace {

using namespace mla_decode;

// Splits a workspace for `rows` query rows must hold: a split run never puts more than 2·SMs CTAs
// (of ≥ rows/64 row tiles) on the grid.
int64_t ws_split_cap(int64_t rows, int num_sms) {
  if (rows <= 0) return 1;
  return std::clamp<int64_t>((2 * int64_t(num_sms) * kRows + rows - 1) / rows, 1, kMaxSplits);
}

// Split count: fewest waves × (tiles per split + fixed cost), plus the combine, over the candidates
// the workspace allows. The combine's cost, in tiles: 1 + s/16 (its loop over the splits' partials;
// fitted on h16 b1 s_k 16384, where 32/64/128 splits took 28.6/24.4/28.3 µs: ~2.05 µs a tile,
// ~0.125 µs a split).
int choose_splits(int64_t units, int nk, int num_sms, int64_t cap) {
  if (nk <= 1 || cap <= 1) return 1;
  auto cost = [&](int64_t s) {
    const int64_t waves = (units * s + num_sms - 1) / num_sms;
    return double(waves) * (double((nk + s - 1) / s) + 2.0) + (s > 1 ? 1.0 + double(s) / 16.0 : 0.0);
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

}  // namespace

size_t mla_fast_workspace_bytes(int32_t total_q, int32_t num_heads, int32_t num_sms) {
  const int64_t rows = int64_t(total_q) * num_heads;
  const int sms = num_sms > 0 ? num_sms : 132;
  const int64_t cap = ws_split_cap(rows, sms);
  const size_t split = cap <= 1 ? 0 : size_t(cap) * size_t(rows) * (kDv + 1) * sizeof(float);
  // 64-row tiles (more than 32 rows): room for a persistent grid's slots, one a CTA.
  const size_t persistent = rows > kNarrowRowsMax ? size_t(sms) * kPersistentSlotBytes : 0;
  return std::max(split, persistent);
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

MlaDecodeSchedule mla_fast_schedule(const MlaParams& p, const MlaDecodeTuning& tuning) {
  const DeviceSegments& sg = p.seg;
  MlaDecodeSchedule s;
  if (sg.num_requests <= 0 || sg.total_q <= 0) return s;
  const int H = p.num_heads;
  const int64_t rows_total = int64_t(sg.total_q) * H;
  const int64_t max_rows = int64_t(sg.max_q_len) * H;  // packed rows of the largest request
  // ≤ 32 rows: swap-AB kernel with an N = 8/16/32 row tile; else 64-row tiles (variants: tuning).
  s.narrow = !tuning.use_mma_sync && (tuning.variant & 14) == 0 && max_rows <= kNarrowRowsMax;
  s.tile_rows = !s.narrow ? kRows : max_rows <= 8 ? 8 : max_rows <= 16 ? 16 : 32;
  s.row_tiles = int((max_rows + s.tile_rows - 1) / s.tile_rows);
  if (s.row_tiles <= 0) return s;
  // Key tiles of the longest request as the step's kv_bucket() (mla/batch.h) rounds it: the split
  // count, and so the grid, stays fixed while the lengths grow inside a bucket (step graphs).
  const int64_t longest = kv_bucket(std::max<int64_t>(sg.max_k_len, 0));
  const int nk = int(std::min<int64_t>((longest + kKeys - 1) / kKeys, INT32_MAX));
  s.key_tiles = nk;
  const int64_t units = int64_t(sg.num_requests) * s.row_tiles;
  const bool fp8 = p.kv_elem == Elem::FP8_E4M3FN;
  const int num_sms = device_sms() * (s.narrow ? narrow_ctas_per_sm(s.tile_rows, fp8) : 1);  // CTA slots
  const size_t per_split = size_t(rows_total) * (kDv + 1) * sizeof(float);
  const int64_t cap = p.ws.ptr ? std::min<int64_t>(kMaxSplits, int64_t(p.ws.bytes / per_split)) : 1;
  s.splits = tuning.force_splits > 0
                 ? int(std::clamp<int64_t>(tuning.force_splits, 1, std::max<int64_t>(cap, 1)))
                 : choose_splits(units, nk, num_sms, cap);
  if (s.splits < 1) s.splits = 1;
  // The persistent see-saw grid: parts of the row tiles' common KV sequence, as many as fit one CTA
  // an SM (every CTA resident: a part may wait for later ones), a slot and a flag for each CTA.
  // Auto: where the lengths are uneven (persistent_pays); the choice follows from the step's shapes
  // alone, and CudaOps::launch_class gives it to the step graph's key (persistent_class).
  const bool see_saw = !s.narrow && !tuning.use_mma_sync && (tuning.variant & (2 | 4 | 16)) == 0;
  const int parts = s.row_tiles > 0 ? device_sms() / s.row_tiles : 0;
  const bool fits = see_saw && parts >= 2 && p.grid_counters && int64_t(parts) * s.row_tiles + 2 <= gpu::kGridCounterInts &&
                    p.ws.ptr && p.ws.bytes >= size_t(parts) * s.row_tiles * kPersistentSlotBytes;
  const bool want = (tuning.variant & 128) ||
                    (tuning.force_splits <= 0 && persistent_class(max_rows, sg.num_requests, sg.k_fill, device_sms()) == 1);
  if (fits && want && (tuning.variant & 256) == 0) {
    s.parts = parts;
    s.splits = 1;
  }
  return s;
}

int32_t mla_fast_launch_class(int64_t max_q_len, int64_t requests, int64_t heads, int32_t k_fill) {
  return persistent_class(max_q_len * heads, requests, k_fill, device_sms());
}

bool mla_fast_rounds_q_to_e4m3(const MlaParams& p, const MlaDecodeSchedule& s) {
  return s.narrow && narrow_raw_fp8(s.tile_rows, p.kv_elem == Elem::FP8_E4M3FN);
}

int32_t mla_attention_fast(const MlaParams& p, const MlaDecodeSchedule& s, const MlaDecodeTuning& tuning) {
  const DeviceSegments& sg = p.seg;
  if (sg.num_requests <= 0 || sg.total_q <= 0 || s.row_tiles <= 0) return 0;
  const int H = p.num_heads;
  const int64_t rows_total = int64_t(sg.total_q) * H;
  const bool narrow = s.narrow;
  const int tile_rows = s.tile_rows, row_tiles = s.row_tiles, splits = s.splits;

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
  // The pool scale applies to every row dtype.
  kp.scale_log2 = p.softmax_scale * p.kv_scale * 1.4426950408889634f;
  kp.out_scale = p.kv_scale;
  kp.o = p.o;
  kp.o_f32 = p.o_elem == Elem::F32 ? 1 : 0;
  kp.lse = p.lse;
  kp.ws_o = splits > 1 || s.parts > 0 ? static_cast<float*>(p.ws.ptr) : nullptr;
  kp.ws_lse = splits > 1   ? kp.ws_o + size_t(splits) * rows_total * kDv
              : s.parts > 0 ? kp.ws_o + size_t(s.parts) * row_tiles * kRows * kDv
                            : nullptr;
  kp.v_lbo = (tuning.variant & 1) ? 1024u : uint32_t(kChunkBytes);  // bit 0: roles swapped (debug)
  kp.v_sbo = (tuning.variant & 1) ? uint32_t(kChunkBytes) : 1024u;

  const dim3 grid = s.parts > 0 ? dim3(row_tiles, s.parts) : dim3(row_tiles, splits, sg.num_requests);
  bool merged = false;
  if (narrow) {
    launch_narrow(kp, grid, p.stream, tile_rows, fp8);
  } else {
    const WideProducts products = tuning.use_mma_sync     ? WideProducts::kMmaSync
                                  : (tuning.variant & 2)  ? WideProducts::kWgmmaSMmaPV
                                  : (tuning.variant & 4)  ? WideProducts::kMmaSWgmmaPV
                                  : (tuning.variant & 16) ? WideProducts::kSplitS
                                                          : WideProducts::kWgmma;
    // Bit 6 (64) of the tuning: the combine kernel even where the grid could merge its partials.
    PersistParams pp;
    if (s.parts > 0) pp = {s.parts, sg.num_requests, p.grid_counters + 2};
    merged = launch_wide(kp, grid, p.stream, fp8, products, (s.key_tiles + splits - 1) / splits,
                         (tuning.variant & 64) ? nullptr : p.grid_counters, pp);
  }
  // The combine starts early (programmatic dependent launch) only with enough rows to spread over
  // the SMs: its CTAs start wherever SMs are free when the decode grid's last CTAs start, and a
  // grid of a few rows (h128 b1: 128) then runs on the few SMs the decode grid left idle, 10 µs
  // slower than launched plainly on the H200 (b16: 2048 rows, 2 µs faster).
  const bool early = (tuning.variant & 32) == 0 && rows_total >= 4 * int64_t(device_sms());
  if (splits > 1 && !merged) launch_combine(kp, p.stream, early);
  return splits;
}

}  // namespace mla::cuda
