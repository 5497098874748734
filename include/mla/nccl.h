// mla/nccl.h — the communicator of a tensor-parallel group of one process per NVIDIA GPU (CUDA
// builds): NCCL for all_gather, reduce_scatter, broadcast and large all-reduces; our own kernels over
// peer memory (CUDA IPC, NVLink) for small and middle all-reduces, and the fused all-reduce + add +
// RMSNorm of decode. Every collective runs on the Ops' stream without waiting on the host, and may
// be captured in a CUDA graph (replays give the eager bits).
//
// Sums: ours (one-shot, two-shot, fused) add in f32 in rank order 0 … n−1 and round once, the bits
// of the in-process communicator. all_reduce_add_rmsnorm runs fused (one kernel: the one-shot sum,
// h += y, the norm) when y fits one_shot_max_bytes and has at most 64 rows; else all_reduce, then
// Ops::add_rmsnorm. NCCL's (all-reduce above two_shot_max_bytes, reduce_scatter) add
// in NCCL's ring order, in the tensor's dtype: within rounding of ours, not the same bits.
//
// Ranks that disagree on a collective's kind, dtype, element count or root: our kernels carry all
// of it in their barrier; every rank sees the disagreement, skips the data and goes on, and the next
// collective of every rank throws Error naming both sides. Before each NCCL call (check_shapes) a
// one-block barrier compares the same; on a disagreement it stops the device (the NCCL call queued
// after it never runs, so nothing hangs, but that process's CUDA context is lost) and the next
// collective throws the same Error. A peer that stops coming (a crashed rank) makes our kernels
// give up after barrier_timeout_s; that communicator then throws on every later call.
//
// Our kernels serve groups of 2 to 8 ranks; larger groups (and use_ours = false) use NCCL alone.
#pragma once
#include <cstddef>
#include <memory>
#include <string>

#include "mla/communicator.h"
#include "mla/ops.h"

namespace mla {

// A new NCCL unique id (128 bytes): made by rank 0 and given to every rank before nccl_communicator.
std::string nccl_unique_id();

struct NcclOptions {
  // all_reduce of at most one_shot_max_bytes: one-shot; then up to two_shot_max_bytes: two-shot;
  // above: NCCL. The defaults are where each was fastest on 2 H200s (NVLink, bench/NOTES.md): one-shot
  // to 4 MB, two-shot to 64 MB. Each rank holds two halves of peer buffer, each as large as the
  // largest call needs (push: size × one_shot_max_bytes, 2 × two_shot_max_bytes; pull: the bytes):
  // 2 × 128 MB with the defaults.
  size_t one_shot_max_bytes = size_t(4) << 20;
  size_t two_shot_max_bytes = size_t(64) << 20;
  // Our kernels write into the peers' buffers and read their own (push), or copy into their own and
  // read the peers' (pull). Every rank must pass the same options.
  bool push = true;
  bool use_ours = true;        // false: every collective through NCCL
  bool check_shapes = true;    // the barrier before each NCCL call (needs use_ours)
  double barrier_timeout_s = 60;
};

// Rank `rank` of `size` (one process per GPU). `ops` must be the CUDA platform's, on this process's
// device 0 (CUDA_VISIBLE_DEVICES rotated so that device 0 is the rank's own GPU, the peers' GPUs
// visible too). Every rank calls it at once (it returns when all have joined). Throws Error for a
// bad rank or id, non-CUDA ops, or when NCCL or the peer mappings fail.
std::unique_ptr<Communicator> nccl_communicator(int rank, int size, const std::string& unique_id, Ops& ops,
                                                const NcclOptions& options = {});

}  // namespace mla
