// Flash-style MHA prefill on tensor cores (bf16): ragged batches, causal (bottom-right) or no mask,
// o and the natural-log LSE out. Two kernel bodies behind one entry point:
//   - sm_90a, (Dqk, Dv) = (192, 128): wgmma + TMA, a producer warpgroup (setmaxnreg 40) and two
//     consumer warpgroups (232 registers; 128 query rows × 128 keys per tile), P kept in registers.
//   - any instantiated dims: mma.sync.m16n8k16 + ldmatrix + cp.async double buffering (FA2 style),
//     64 query rows × 64 keys per tile.
// No host synchronization or allocation (capturable in a CUDA graph).
#pragma once
#include "platform/gpu/attention_kernels.h"

namespace mla::cuda {

// The shared GPU types (platform/gpu) these CUDA-only kernels take.
using gpu::DeviceSegments;
using gpu::Elem;
using gpu::MhaParams;
using gpu::MlaParams;
using gpu::Workspace;

// True when p.elem is bf16 and (qk_dim, v_dim) is one of the instantiated pairs:
// (192,128) (128,128) (96,64) (64,64) (48,32) (40,32) (32,20). Otherwise use the generic kernel.
bool mha_fast_supports(const MhaParams& p);

// Requires mha_fast_supports(p). The sm_90a path assumes the K/V rows in
// [k_start + k_len − 128, k_start) (read, then masked, for requests shorter than one tile) hold
// finite values, as any packed ragged tensor does; negative rows are zero-filled.
void mha_attention_fast(const MhaParams& p);

// ---- For the test/benchmark program: force one body. Variants of the sm_90a one: Wgmma overlaps
// the softmax with the next products inside a warpgroup, WgmmaNoOverlap does not, WgmmaPingpong adds
// turn-taking between the two warpgroups to Wgmma; WgmmaPersistent is WgmmaNoOverlap on a grid of
// one CTA per SM that takes the blocks in turn (needs p.sched; the default when p.sched is set).
enum class MhaFastPath : int {
  Auto = 0,
  Mma = 1,
  Wgmma = 2,
  WgmmaNoOverlap = 3,
  WgmmaPingpong = 5,
  WgmmaPersistent = 6
};
void mha_attention_fast_path(const MhaParams& p, MhaFastPath path);

}  // namespace mla::cuda
