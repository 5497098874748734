// moe_job.h — the prefill expert GEMM's job order over a MoE plan (platform/gpu/moe.h's MoePlan:
// tiles[2j], tiles[2j+1] = expert and first row of row tile j; offsets[e] = expert e's first row).
#pragma once
#include <cstdint>

namespace mla::gpu {

// The order of the prefill expert GEMM's jobs (row tile × column slice of `slices`) over a plan of
// bm-row tiles: expert by expert, within an expert slice by slice, the expert's tiles of a slice
// side by side (they read the slice's weights at the same time: bench/NOTES.md, "The prefill expert
// GEMM: the pair order measured …"). An expert's jobs take the same job numbers as in tile-by-tile
// order (tile job / slices), so the map needs no table. Host and device (relaxed constexpr); plain
// C++, so its test (test_moe, MoeJobOrder) runs in every build.
struct MoeJob {
  int expert, row0, slice;  // the tile's expert and first row, the column slice
};
constexpr MoeJob moe_job_at(int job, int slices, int bm, const int32_t* tiles, const int32_t* offsets) {
  const int tm = job / slices, e = tiles[2 * tm];                   // tile-by-tile order's tile: its expert
  const int first = offsets[e], n = (offsets[e + 1] - first + bm - 1) / bm;  // the expert's tiles
  const int jl = job - (tm - (tiles[2 * tm + 1] - first) / bm) * slices;     // job among the expert's
  return MoeJob{e, first + (jl % n) * bm, jl / n};
}

}  // namespace mla::gpu
