// Our all-reduce kernels over peer memory (NVLink through CUDA IPC), for a tensor-parallel group of
// one process per GPU: one-shot (every rank reads every rank's buffer), two-shot (reduce-scatter,
// then all-gather over peer memory), and the one-shot reduce fused with the residual add + RMSNorm.
// Sums are f32 in rank order 0, 1, …, n−1, rounded once to the tensor's dtype: the same bits on
// every rank as the in-process communicator.
//
// Each rank owns one peer-mapped region: flags [kBlocks] blocks × kMaxRanks sources, then two data
// halves (consecutive data calls alternate halves, so no call needs a barrier at its end). A call
// either copies its data into its own half and reads the peers' (pull), or writes it into the peers'
// halves and reads its own (push). Block b
// of every kernel meets block b of the other ranks at a barrier: each signals (epoch, tag) into the
// peers' flags with a system-scope release and waits for theirs with acquire loads; every grid has
// kBlocks blocks, and block b reads only what block b of each rank wrote, so a per-block barrier is
// enough. The tag names the collective, dtype and element count: ranks that disagree all see it,
// skip the data and record the disagreement (never waiting for ever); a wait that outlasts the
// timeout is recorded too. The host reads the record (host-mapped memory) without synchronizing.
#pragma once
#include <cstddef>
#include <cstdint>

#include "platform/gpu/attention_kernels.h"  // Elem
#include "platform/gpu/gpu_runtime.h"

namespace mla::cuda {

using gpu::Elem;

inline constexpr int kArMaxRanks = 8;
inline constexpr int kArBlocks = 64;            // the grid of every data kernel
inline constexpr int kArThreads = 512;          // one-shot and two-shot
inline constexpr int kArNormThreads = 256;      // the fused kernel: the block GpuOps::add_rmsnorm uses
inline constexpr size_t kArFlagBytes = 128 << 10;  // the flags at the start of each region

// What a barrier's tag says; kinds of the NCCL calls only take part in the shape check.
enum class ArKind : uint8_t {
  OneShot = 1, TwoShot, Fused, NcclAllReduce, NcclAllGather, NcclReduceScatter, NcclBroadcast, OneShotPush, TwoShotPush
};
// kind (8 bits) | dtype (8) | root (8) | element count (40)
inline uint64_t ar_tag(ArKind k, uint8_t dtype, int root, int64_t numel) {
  return uint64_t(k) << 56 | uint64_t(dtype) << 48 | uint64_t(uint8_t(root)) << 40 |
         (uint64_t(numel) & ((uint64_t(1) << 40) - 1));
}
inline ArKind ar_tag_kind(uint64_t t) { return ArKind(t >> 56); }
inline uint8_t ar_tag_dtype(uint64_t t) { return uint8_t(t >> 48); }
inline int ar_tag_root(uint64_t t) { return int(uint8_t(t >> 40)); }
inline int64_t ar_tag_numel(uint64_t t) { return int64_t(t & ((uint64_t(1) << 40) - 1)); }

// Written by the kernels into host-mapped memory; code last (1: tags disagree, 2: timed out).
struct ArError {
  int32_t code;
  int32_t peer;
  uint64_t mine, theirs;
};

struct ArPeers {
  int rank = 0, size = 0;
  char* region[kArMaxRanks] = {};  // each rank's region (this rank's own and the peers' mappings)
  size_t half_bytes = 0;           // each data half
  uint64_t* state = nullptr;       // this rank's own counters (device memory): epoch[kArBlocks], calls[kArBlocks]
  ArError* error = nullptr;        // device view of the host-mapped record
  uint64_t timeout_ns = 0;
};

// x[n] (f32 or bf16) ← Σ_r x_r; `tag`: ar_tag of the call. Pull: each rank copies x into its own
// half and reads the peers' (a half of ar_half_bytes(pull) bytes); push: each rank writes x into the
// peers' halves and reads only its own.
void ar_one_shot(const ArPeers& p, void* x, Elem e, int64_t n, bool push, uint64_t tag, cudaStream_t s);
void ar_two_shot(const ArPeers& p, void* x, Elem e, int64_t n, bool push, uint64_t tag, cudaStream_t s);
// The data half a call of `bytes` needs.
inline size_t ar_half_bytes(bool two, bool push, int size, size_t bytes) {
  const size_t units = (bytes + 15) / 16, per = (units + size_t(size) - 1) / size_t(size);
  if (!push) return two ? per * size_t(size) * 16 : units * 16;
  return two ? 2 * per * size_t(size) * 16 : units * size_t(size) * 16;
}
// y[M, n] ← Σ_r y_r (one-shot), h += y, x ← RMSNorm(h) · w: the bits of ar_one_shot followed by
// gpu::add_rmsnorm.
void ar_add_rmsnorm(const ArPeers& p, void* y, Elem ye, void* h, Elem he, void* x, int64_t M, int64_t n,
                    const void* w, Elem we, float eps, uint64_t tag, cudaStream_t s);
// A one-block barrier carrying `tag` (before an NCCL call): a rank that sees another tag records it
// and traps, so that the NCCL call queued after it never runs (the context is lost; the record
// says why).
void ar_check(const ArPeers& p, uint64_t tag, cudaStream_t s);

}  // namespace mla::cuda
