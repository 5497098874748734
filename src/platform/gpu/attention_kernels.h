// Parameter structs and launchers of the GPU attention kernels (one kernel family per .cu file).
// Plain pointers, sizes and strides in elements; everything already checked by the caller; no host
// synchronization inside (capturable in a CUDA graph).
#pragma once
#include <cstdint>

#include "platform/gpu/gpu_runtime.h"

namespace mla::gpu {

// Element types of the tensors a kernel reads or writes.
enum class Elem : int { F32 = 0, BF16 = 1, FP8_E4M3FN = 2, FP8_E4M3FNUZ = 3 };
inline constexpr size_t elem_size(Elem e) { return e == Elem::F32 ? 4 : e == Elem::BF16 ? 2 : 1; }

// Ragged segments on the device: request r's queries [q_start[r], +q_len[r]) attend keys
// [k_start[r], +k_len[r]) (for MLA: indices into kv_slots). Causal masks align bottom-right:
// query i of the request sees keys j <= k_len − q_len + i.
struct DeviceSegments {
  const int32_t* q_start;
  const int32_t* q_len;
  const int32_t* k_start;
  const int32_t* k_len;
  int32_t num_requests;
  int32_t max_q_len;  // max over requests (host-known; sizes the grid)
  int32_t max_k_len;
  int32_t total_q;    // Σ q_len
  bool causal;
  // mla::kv_fill of the key lengths (mla/batch.h; host-known, eighths, 8: all as long as the
  // longest). After `causal`: the fields the kernels read keep their offsets and the struct its size.
  int32_t k_fill = 8;
};

// Scratch a split-KV kernel may use, preallocated by the caller (sized by *_workspace_bytes).
struct Workspace {
  void* ptr = nullptr;
  size_t bytes = 0;
};

// ---- MLA (absorbed) attention over the paged latent cache -------------------------------------
// q [total_q, H, D] (D = kv_lora_rank + rope_dim = 576 for V3), rows of the pool
// kv [num_slots, D] gathered through kv_slots; scores use the whole row, values are its first
// kv_lora_rank (Dv) columns. o [total_q, H, Dv], lse [total_q, H] f32 natural log (−inf: no key).
// fp8 rows are dequantized (× kv_scale) in registers.
constexpr int kGridCounterInts = 2 + 1024;
struct MlaParams {
  const void* q;
  Elem q_elem;
  const void* kv;
  Elem kv_elem;
  float kv_scale;
  const int32_t* kv_slots;
  DeviceSegments seg;
  int32_t num_heads;
  int32_t head_dim;   // D (576)
  int32_t v_dim;      // Dv (512)
  float softmax_scale;
  void* o;
  Elem o_elem;
  float* lse;
  Workspace ws;
  cudaStream_t stream;
  // kGridCounterInts ints, zero, on the device, one array per stream that launches it: in the first
  // two a split decode grid the device holds at once counts its CTAs to merge its partials itself,
  // without a combine kernel; the rest are the persistent decode grid's flags, one a CTA. Every
  // launch leaves them zero. Null: the combine kernel, never the persistent grid.
  int32_t* grid_counters = nullptr;
};
// The general kernel (f32 or bf16 activations, any D ≤ 1024, SIMT cores): the exact path.
void mla_attention_generic(const MlaParams& p);

// ---- MHA attention (decompressed K/V), ragged -------------------------------------------------
// q [total_q, H, Dqk], k [total_k, H, Dqk], v [total_k, H, Dv] → o [total_q, H, Dv], lse [total_q, H].
struct MhaParams {
  const void* q;
  const void* k;
  const void* v;
  Elem elem;  // q, k, v, o share it
  DeviceSegments seg;
  int32_t num_heads;
  int32_t qk_dim;
  int32_t v_dim;
  float softmax_scale;
  void* o;
  float* lse;
  cudaStream_t stream;
  // Two ints, zero, on the device, that a persistent kernel's block scheduler may count in (it
  // leaves them zero); one pair per stream that launches it. Null: no persistent grid.
  int32_t* sched = nullptr;
};
void mha_attention_generic(const MhaParams& p);

}  // namespace mla::gpu
