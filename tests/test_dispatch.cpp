// Dispatch: the per-backend handler rules, platform defaults, platform resolution, and the
// ForwardMethod names. Expected methods are written out by hand in the tables, never recomputed.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "mla/dispatch.h"
#include "mla/error.h"
#include "mla/forward_method.h"

namespace mla {
namespace {

using enum ForwardMode;
using enum ForwardMethod;
using enum Platform;

// The settings every table row runs under (besides the row's own switches).
constexpr int64_t kThreshold = 100;
constexpr int64_t kCapacity = 1000;

// Σ prefix_len: none, just below the threshold, exactly at it, above it. Each row's batch has two
// requests sharing the sum, so PT (50 + 50) is at the threshold only as a sum.
constexpr int64_t P0 = 0, PB = 99, PT = 100, PA = 150;
// Σ seq_len: exactly the chunk capacity, or one above it.
constexpr int64_t CAP = 1000, OVER = 1001;

enum Cc { CC_DEF, CC_ON, CC_OFF };  // chunked-prefix cache: unset, asked on, asked off
constexpr bool DET = true, NODET = false;
constexpr bool ROPE = true, NOROPE = false;  // fused decode RoPE

struct Row {
  const char* backend;
  ForwardMode mode;
  int64_t sum_prefix;
  int64_t sum_seq;
  Cc cc;
  bool det;
  Platform platform;
  bool rope;
  ForwardMethod want;
};

std::string_view mode_str(ForwardMode m) {
  switch (m) {
    case EXTEND: return "EXTEND";
    case DECODE: return "DECODE";
    case TARGET_VERIFY: return "TARGET_VERIFY";
    case DRAFT_EXTEND: return "DRAFT_EXTEND";
    case IDLE: return "IDLE";
  }
  return "?";
}

std::string_view platform_str(Platform p) {
  switch (p) {
    case CPU: return "cpu";
    case CUDA: return "cuda";
    case ROCM: return "rocm";
  }
  return "?";
}

std::string describe(size_t i, const Row& r) {
  static const char* cc[] = {"unset", "on", "off"};
  return fmt::format("row {}: backend='{}' mode={} sum_prefix={} sum_seq={} chunked_cache={} "
                     "deterministic={} platform={} fused_rope={}",
                     i, r.backend, mode_str(r.mode), r.sum_prefix, r.sum_seq, cc[r.cc], r.det,
                     platform_str(r.platform), r.rope);
}

Batch summary_of(const Row& r) {
  return Batch::from_seq_lens(r.mode, {r.sum_prefix / 2, r.sum_prefix - r.sum_prefix / 2},
                              {r.sum_seq / 2, r.sum_seq - r.sum_seq / 2});
}

DispatchSettings settings_of(const Row& r) {
  DispatchSettings s;
  s.backend = r.backend;
  s.chunked_prefix_threshold = kThreshold;
  s.chunk_capacity = kCapacity;
  if (r.cc == CC_ON) s.chunked_prefix_cache = true;
  if (r.cc == CC_OFF) s.chunked_prefix_cache = false;
  s.deterministic = r.det;
  s.fused_decode_rope = r.rope;
  return s;
}

// Every backend runs the same 36 scenarios, in the same order, so the blocks can be compared line
// by line: modes; Σ prefix × chunked cache; capacity; speculative modes with a prefix;
// deterministic; platforms and fused RoPE.
const std::vector<Row> kRows = {
    // ---- fa3: one shot when it fits, chunked otherwise; deterministic forces MLA.
    {"fa3", EXTEND, P0, CAP, CC_DEF, NODET, CUDA, NOROPE, MHA_ONE_SHOT},
    {"fa3", DECODE, P0, CAP, CC_DEF, NODET, CUDA, NOROPE, MLA},
    {"fa3", TARGET_VERIFY, P0, CAP, CC_DEF, NODET, CUDA, NOROPE, MLA},
    {"fa3", DRAFT_EXTEND, P0, CAP, CC_DEF, NODET, CUDA, NOROPE, MLA},
    {"fa3", IDLE, P0, CAP, CC_DEF, NODET, CUDA, NOROPE, MLA},
    {"fa3", EXTEND, P0, CAP, CC_ON, NODET, CUDA, NOROPE, MHA_ONE_SHOT},
    {"fa3", EXTEND, P0, CAP, CC_OFF, NODET, CUDA, NOROPE, MHA_ONE_SHOT},
    {"fa3", EXTEND, PB, CAP, CC_ON, NODET, CUDA, NOROPE, MLA},
    {"fa3", EXTEND, PB, CAP, CC_OFF, NODET, CUDA, NOROPE, MLA},
    {"fa3", EXTEND, PT, CAP, CC_DEF, NODET, CUDA, NOROPE, MHA_ONE_SHOT},
    {"fa3", EXTEND, PT, CAP, CC_ON, NODET, CUDA, NOROPE, MHA_ONE_SHOT},
    {"fa3", EXTEND, PT, CAP, CC_OFF, NODET, CUDA, NOROPE, MLA},
    {"fa3", EXTEND, PA, CAP, CC_ON, NODET, CUDA, NOROPE, MHA_ONE_SHOT},
    {"fa3", EXTEND, PA, CAP, CC_OFF, NODET, CUDA, NOROPE, MLA},
    {"fa3", EXTEND, P0, OVER, CC_DEF, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"fa3", EXTEND, P0, OVER, CC_OFF, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"fa3", EXTEND, PT, OVER, CC_ON, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"fa3", EXTEND, PA, OVER, CC_ON, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"fa3", EXTEND, PB, OVER, CC_ON, NODET, CUDA, NOROPE, MLA},
    {"fa3", EXTEND, PA, OVER, CC_OFF, NODET, CUDA, NOROPE, MLA},
    {"fa3", DECODE, P0, OVER, CC_ON, NODET, CUDA, NOROPE, MLA},
    {"fa3", TARGET_VERIFY, PT, CAP, CC_ON, NODET, CUDA, NOROPE, MLA},
    {"fa3", DRAFT_EXTEND, PA, CAP, CC_ON, NODET, CUDA, NOROPE, MLA},
    {"fa3", DECODE, PA, CAP, CC_ON, NODET, CUDA, NOROPE, MLA},
    {"fa3", DRAFT_EXTEND, P0, CAP, CC_OFF, NODET, CUDA, NOROPE, MLA},
    {"fa3", EXTEND, P0, CAP, CC_DEF, DET, CUDA, NOROPE, MLA},
    {"fa3", EXTEND, PT, CAP, CC_ON, DET, CUDA, NOROPE, MLA},
    {"fa3", EXTEND, P0, OVER, CC_DEF, DET, CUDA, NOROPE, MLA},
    {"fa3", DECODE, P0, CAP, CC_DEF, DET, CUDA, NOROPE, MLA},
    {"fa3", DECODE, P0, CAP, CC_DEF, NODET, ROCM, ROPE, MLA},
    {"fa3", DECODE, P0, CAP, CC_DEF, NODET, CUDA, ROPE, MLA},
    {"fa3", DECODE, P0, CAP, CC_DEF, NODET, CPU, ROPE, MLA},
    {"fa3", DECODE, P0, CAP, CC_DEF, NODET, ROCM, NOROPE, MLA},
    {"fa3", EXTEND, P0, CAP, CC_DEF, NODET, ROCM, ROPE, MHA_ONE_SHOT},
    {"fa3", TARGET_VERIFY, P0, CAP, CC_DEF, NODET, ROCM, ROPE, MLA},
    {"fa3", DECODE, P0, CAP, CC_DEF, DET, ROCM, ROPE, MLA},

    // ---- flashinfer: as fa3, but deterministic mode changes nothing.
    {"flashinfer", EXTEND, P0, CAP, CC_DEF, NODET, CUDA, NOROPE, MHA_ONE_SHOT},
    {"flashinfer", DECODE, P0, CAP, CC_DEF, NODET, CUDA, NOROPE, MLA},
    {"flashinfer", TARGET_VERIFY, P0, CAP, CC_DEF, NODET, CUDA, NOROPE, MLA},
    {"flashinfer", DRAFT_EXTEND, P0, CAP, CC_DEF, NODET, CUDA, NOROPE, MLA},
    {"flashinfer", IDLE, P0, CAP, CC_DEF, NODET, CUDA, NOROPE, MLA},
    {"flashinfer", EXTEND, P0, CAP, CC_ON, NODET, CUDA, NOROPE, MHA_ONE_SHOT},
    {"flashinfer", EXTEND, P0, CAP, CC_OFF, NODET, CUDA, NOROPE, MHA_ONE_SHOT},
    {"flashinfer", EXTEND, PB, CAP, CC_ON, NODET, CUDA, NOROPE, MLA},
    {"flashinfer", EXTEND, PB, CAP, CC_OFF, NODET, CUDA, NOROPE, MLA},
    {"flashinfer", EXTEND, PT, CAP, CC_DEF, NODET, CUDA, NOROPE, MHA_ONE_SHOT},
    {"flashinfer", EXTEND, PT, CAP, CC_ON, NODET, CUDA, NOROPE, MHA_ONE_SHOT},
    {"flashinfer", EXTEND, PT, CAP, CC_OFF, NODET, CUDA, NOROPE, MLA},
    {"flashinfer", EXTEND, PA, CAP, CC_ON, NODET, CUDA, NOROPE, MHA_ONE_SHOT},
    {"flashinfer", EXTEND, PA, CAP, CC_OFF, NODET, CUDA, NOROPE, MLA},
    {"flashinfer", EXTEND, P0, OVER, CC_DEF, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"flashinfer", EXTEND, P0, OVER, CC_OFF, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"flashinfer", EXTEND, PT, OVER, CC_ON, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"flashinfer", EXTEND, PA, OVER, CC_ON, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"flashinfer", EXTEND, PB, OVER, CC_ON, NODET, CUDA, NOROPE, MLA},
    {"flashinfer", EXTEND, PA, OVER, CC_OFF, NODET, CUDA, NOROPE, MLA},
    {"flashinfer", DECODE, P0, OVER, CC_ON, NODET, CUDA, NOROPE, MLA},
    {"flashinfer", TARGET_VERIFY, PT, CAP, CC_ON, NODET, CUDA, NOROPE, MLA},
    {"flashinfer", DRAFT_EXTEND, PA, CAP, CC_ON, NODET, CUDA, NOROPE, MLA},
    {"flashinfer", DECODE, PA, CAP, CC_ON, NODET, CUDA, NOROPE, MLA},
    {"flashinfer", DRAFT_EXTEND, P0, CAP, CC_OFF, NODET, CUDA, NOROPE, MLA},
    {"flashinfer", EXTEND, P0, CAP, CC_DEF, DET, CUDA, NOROPE, MHA_ONE_SHOT},
    {"flashinfer", EXTEND, PT, CAP, CC_ON, DET, CUDA, NOROPE, MHA_ONE_SHOT},
    {"flashinfer", EXTEND, P0, OVER, CC_DEF, DET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"flashinfer", DECODE, P0, CAP, CC_DEF, DET, CUDA, NOROPE, MLA},
    {"flashinfer", DECODE, P0, CAP, CC_DEF, NODET, ROCM, ROPE, MLA},
    {"flashinfer", DECODE, P0, CAP, CC_DEF, NODET, CUDA, ROPE, MLA},
    {"flashinfer", DECODE, P0, CAP, CC_DEF, NODET, CPU, ROPE, MLA},
    {"flashinfer", DECODE, P0, CAP, CC_DEF, NODET, ROCM, NOROPE, MLA},
    {"flashinfer", EXTEND, P0, CAP, CC_DEF, NODET, ROCM, ROPE, MHA_ONE_SHOT},
    {"flashinfer", TARGET_VERIFY, P0, CAP, CC_DEF, NODET, ROCM, ROPE, MLA},
    {"flashinfer", DECODE, P0, CAP, CC_DEF, DET, ROCM, ROPE, MLA},

    // ---- flashmla: as flashinfer.
    {"flashmla", EXTEND, P0, CAP, CC_DEF, NODET, CUDA, NOROPE, MHA_ONE_SHOT},
    {"flashmla", DECODE, P0, CAP, CC_DEF, NODET, CUDA, NOROPE, MLA},
    {"flashmla", TARGET_VERIFY, P0, CAP, CC_DEF, NODET, CUDA, NOROPE, MLA},
    {"flashmla", DRAFT_EXTEND, P0, CAP, CC_DEF, NODET, CUDA, NOROPE, MLA},
    {"flashmla", IDLE, P0, CAP, CC_DEF, NODET, CUDA, NOROPE, MLA},
    {"flashmla", EXTEND, P0, CAP, CC_ON, NODET, CUDA, NOROPE, MHA_ONE_SHOT},
    {"flashmla", EXTEND, P0, CAP, CC_OFF, NODET, CUDA, NOROPE, MHA_ONE_SHOT},
    {"flashmla", EXTEND, PB, CAP, CC_ON, NODET, CUDA, NOROPE, MLA},
    {"flashmla", EXTEND, PB, CAP, CC_OFF, NODET, CUDA, NOROPE, MLA},
    {"flashmla", EXTEND, PT, CAP, CC_DEF, NODET, CUDA, NOROPE, MHA_ONE_SHOT},
    {"flashmla", EXTEND, PT, CAP, CC_ON, NODET, CUDA, NOROPE, MHA_ONE_SHOT},
    {"flashmla", EXTEND, PT, CAP, CC_OFF, NODET, CUDA, NOROPE, MLA},
    {"flashmla", EXTEND, PA, CAP, CC_ON, NODET, CUDA, NOROPE, MHA_ONE_SHOT},
    {"flashmla", EXTEND, PA, CAP, CC_OFF, NODET, CUDA, NOROPE, MLA},
    {"flashmla", EXTEND, P0, OVER, CC_DEF, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"flashmla", EXTEND, P0, OVER, CC_OFF, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"flashmla", EXTEND, PT, OVER, CC_ON, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"flashmla", EXTEND, PA, OVER, CC_ON, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"flashmla", EXTEND, PB, OVER, CC_ON, NODET, CUDA, NOROPE, MLA},
    {"flashmla", EXTEND, PA, OVER, CC_OFF, NODET, CUDA, NOROPE, MLA},
    {"flashmla", DECODE, P0, OVER, CC_ON, NODET, CUDA, NOROPE, MLA},
    {"flashmla", TARGET_VERIFY, PT, CAP, CC_ON, NODET, CUDA, NOROPE, MLA},
    {"flashmla", DRAFT_EXTEND, PA, CAP, CC_ON, NODET, CUDA, NOROPE, MLA},
    {"flashmla", DECODE, PA, CAP, CC_ON, NODET, CUDA, NOROPE, MLA},
    {"flashmla", DRAFT_EXTEND, P0, CAP, CC_OFF, NODET, CUDA, NOROPE, MLA},
    {"flashmla", EXTEND, P0, CAP, CC_DEF, DET, CUDA, NOROPE, MHA_ONE_SHOT},
    {"flashmla", EXTEND, PT, CAP, CC_ON, DET, CUDA, NOROPE, MHA_ONE_SHOT},
    {"flashmla", EXTEND, P0, OVER, CC_DEF, DET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"flashmla", DECODE, P0, CAP, CC_DEF, DET, CUDA, NOROPE, MLA},
    {"flashmla", DECODE, P0, CAP, CC_DEF, NODET, ROCM, ROPE, MLA},
    {"flashmla", DECODE, P0, CAP, CC_DEF, NODET, CUDA, ROPE, MLA},
    {"flashmla", DECODE, P0, CAP, CC_DEF, NODET, CPU, ROPE, MLA},
    {"flashmla", DECODE, P0, CAP, CC_DEF, NODET, ROCM, NOROPE, MLA},
    {"flashmla", EXTEND, P0, CAP, CC_DEF, NODET, ROCM, ROPE, MHA_ONE_SHOT},
    {"flashmla", TARGET_VERIFY, P0, CAP, CC_DEF, NODET, ROCM, ROPE, MLA},
    {"flashmla", DECODE, P0, CAP, CC_DEF, DET, ROCM, ROPE, MLA},

    // ---- cutlass_mla: the same choice of MHA, but never one shot.
    {"cutlass_mla", EXTEND, P0, CAP, CC_DEF, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"cutlass_mla", DECODE, P0, CAP, CC_DEF, NODET, CUDA, NOROPE, MLA},
    {"cutlass_mla", TARGET_VERIFY, P0, CAP, CC_DEF, NODET, CUDA, NOROPE, MLA},
    {"cutlass_mla", DRAFT_EXTEND, P0, CAP, CC_DEF, NODET, CUDA, NOROPE, MLA},
    {"cutlass_mla", IDLE, P0, CAP, CC_DEF, NODET, CUDA, NOROPE, MLA},
    {"cutlass_mla", EXTEND, P0, CAP, CC_ON, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"cutlass_mla", EXTEND, P0, CAP, CC_OFF, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"cutlass_mla", EXTEND, PB, CAP, CC_ON, NODET, CUDA, NOROPE, MLA},
    {"cutlass_mla", EXTEND, PB, CAP, CC_OFF, NODET, CUDA, NOROPE, MLA},
    {"cutlass_mla", EXTEND, PT, CAP, CC_DEF, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"cutlass_mla", EXTEND, PT, CAP, CC_ON, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"cutlass_mla", EXTEND, PT, CAP, CC_OFF, NODET, CUDA, NOROPE, MLA},
    {"cutlass_mla", EXTEND, PA, CAP, CC_ON, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"cutlass_mla", EXTEND, PA, CAP, CC_OFF, NODET, CUDA, NOROPE, MLA},
    {"cutlass_mla", EXTEND, P0, OVER, CC_DEF, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"cutlass_mla", EXTEND, P0, OVER, CC_OFF, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"cutlass_mla", EXTEND, PT, OVER, CC_ON, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"cutlass_mla", EXTEND, PA, OVER, CC_ON, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"cutlass_mla", EXTEND, PB, OVER, CC_ON, NODET, CUDA, NOROPE, MLA},
    {"cutlass_mla", EXTEND, PA, OVER, CC_OFF, NODET, CUDA, NOROPE, MLA},
    {"cutlass_mla", DECODE, P0, OVER, CC_ON, NODET, CUDA, NOROPE, MLA},
    {"cutlass_mla", TARGET_VERIFY, PT, CAP, CC_ON, NODET, CUDA, NOROPE, MLA},
    {"cutlass_mla", DRAFT_EXTEND, PA, CAP, CC_ON, NODET, CUDA, NOROPE, MLA},
    {"cutlass_mla", DECODE, PA, CAP, CC_ON, NODET, CUDA, NOROPE, MLA},
    {"cutlass_mla", DRAFT_EXTEND, P0, CAP, CC_OFF, NODET, CUDA, NOROPE, MLA},
    {"cutlass_mla", EXTEND, P0, CAP, CC_DEF, DET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"cutlass_mla", EXTEND, PT, CAP, CC_ON, DET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"cutlass_mla", EXTEND, P0, OVER, CC_DEF, DET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"cutlass_mla", DECODE, P0, CAP, CC_DEF, DET, CUDA, NOROPE, MLA},
    {"cutlass_mla", DECODE, P0, CAP, CC_DEF, NODET, ROCM, ROPE, MLA},
    {"cutlass_mla", DECODE, P0, CAP, CC_DEF, NODET, CUDA, ROPE, MLA},
    {"cutlass_mla", DECODE, P0, CAP, CC_DEF, NODET, CPU, ROPE, MLA},
    {"cutlass_mla", DECODE, P0, CAP, CC_DEF, NODET, ROCM, NOROPE, MLA},
    {"cutlass_mla", EXTEND, P0, CAP, CC_DEF, NODET, ROCM, ROPE, MHA_CHUNKED_KV},
    {"cutlass_mla", TARGET_VERIFY, P0, CAP, CC_DEF, NODET, ROCM, ROPE, MLA},
    {"cutlass_mla", DECODE, P0, CAP, CC_DEF, DET, ROCM, ROPE, MLA},

    // ---- trtllm_mla: chunked KV for any extend while the cache is on (no threshold), or with no
    // prefix; capacity and deterministic mode change nothing.
    {"trtllm_mla", EXTEND, P0, CAP, CC_DEF, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"trtllm_mla", DECODE, P0, CAP, CC_DEF, NODET, CUDA, NOROPE, MLA},
    {"trtllm_mla", TARGET_VERIFY, P0, CAP, CC_DEF, NODET, CUDA, NOROPE, MLA},
    {"trtllm_mla", DRAFT_EXTEND, P0, CAP, CC_DEF, NODET, CUDA, NOROPE, MLA},
    {"trtllm_mla", IDLE, P0, CAP, CC_DEF, NODET, CUDA, NOROPE, MLA},
    {"trtllm_mla", EXTEND, P0, CAP, CC_ON, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"trtllm_mla", EXTEND, P0, CAP, CC_OFF, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"trtllm_mla", EXTEND, PB, CAP, CC_ON, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"trtllm_mla", EXTEND, PB, CAP, CC_OFF, NODET, CUDA, NOROPE, MLA},
    {"trtllm_mla", EXTEND, PT, CAP, CC_DEF, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"trtllm_mla", EXTEND, PT, CAP, CC_ON, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"trtllm_mla", EXTEND, PT, CAP, CC_OFF, NODET, CUDA, NOROPE, MLA},
    {"trtllm_mla", EXTEND, PA, CAP, CC_ON, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"trtllm_mla", EXTEND, PA, CAP, CC_OFF, NODET, CUDA, NOROPE, MLA},
    {"trtllm_mla", EXTEND, P0, OVER, CC_DEF, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"trtllm_mla", EXTEND, P0, OVER, CC_OFF, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"trtllm_mla", EXTEND, PT, OVER, CC_ON, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"trtllm_mla", EXTEND, PA, OVER, CC_ON, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"trtllm_mla", EXTEND, PB, OVER, CC_ON, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"trtllm_mla", EXTEND, PA, OVER, CC_OFF, NODET, CUDA, NOROPE, MLA},
    {"trtllm_mla", DECODE, P0, OVER, CC_ON, NODET, CUDA, NOROPE, MLA},
    {"trtllm_mla", TARGET_VERIFY, PT, CAP, CC_ON, NODET, CUDA, NOROPE, MLA},
    {"trtllm_mla", DRAFT_EXTEND, PA, CAP, CC_ON, NODET, CUDA, NOROPE, MLA},
    {"trtllm_mla", DECODE, PA, CAP, CC_ON, NODET, CUDA, NOROPE, MLA},
    {"trtllm_mla", DRAFT_EXTEND, P0, CAP, CC_OFF, NODET, CUDA, NOROPE, MLA},
    {"trtllm_mla", EXTEND, P0, CAP, CC_DEF, DET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"trtllm_mla", EXTEND, PT, CAP, CC_ON, DET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"trtllm_mla", EXTEND, P0, OVER, CC_DEF, DET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"trtllm_mla", DECODE, P0, CAP, CC_DEF, DET, CUDA, NOROPE, MLA},
    {"trtllm_mla", DECODE, P0, CAP, CC_DEF, NODET, ROCM, ROPE, MLA},
    {"trtllm_mla", DECODE, P0, CAP, CC_DEF, NODET, CUDA, ROPE, MLA},
    {"trtllm_mla", DECODE, P0, CAP, CC_DEF, NODET, CPU, ROPE, MLA},
    {"trtllm_mla", DECODE, P0, CAP, CC_DEF, NODET, ROCM, NOROPE, MLA},
    {"trtllm_mla", EXTEND, P0, CAP, CC_DEF, NODET, ROCM, ROPE, MHA_CHUNKED_KV},
    {"trtllm_mla", TARGET_VERIFY, P0, CAP, CC_DEF, NODET, ROCM, ROPE, MLA},
    {"trtllm_mla", DECODE, P0, CAP, CC_DEF, DET, ROCM, ROPE, MLA},

    // ---- fa4: chunked KV, whatever the batch or settings.
    {"fa4", EXTEND, P0, CAP, CC_DEF, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"fa4", DECODE, P0, CAP, CC_DEF, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"fa4", TARGET_VERIFY, P0, CAP, CC_DEF, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"fa4", DRAFT_EXTEND, P0, CAP, CC_DEF, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"fa4", IDLE, P0, CAP, CC_DEF, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"fa4", EXTEND, P0, CAP, CC_ON, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"fa4", EXTEND, P0, CAP, CC_OFF, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"fa4", EXTEND, PB, CAP, CC_ON, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"fa4", EXTEND, PB, CAP, CC_OFF, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"fa4", EXTEND, PT, CAP, CC_DEF, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"fa4", EXTEND, PT, CAP, CC_ON, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"fa4", EXTEND, PT, CAP, CC_OFF, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"fa4", EXTEND, PA, CAP, CC_ON, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"fa4", EXTEND, PA, CAP, CC_OFF, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"fa4", EXTEND, P0, OVER, CC_DEF, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"fa4", EXTEND, P0, OVER, CC_OFF, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"fa4", EXTEND, PT, OVER, CC_ON, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"fa4", EXTEND, PA, OVER, CC_ON, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"fa4", EXTEND, PB, OVER, CC_ON, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"fa4", EXTEND, PA, OVER, CC_OFF, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"fa4", DECODE, P0, OVER, CC_ON, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"fa4", TARGET_VERIFY, PT, CAP, CC_ON, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"fa4", DRAFT_EXTEND, PA, CAP, CC_ON, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"fa4", DECODE, PA, CAP, CC_ON, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"fa4", DRAFT_EXTEND, P0, CAP, CC_OFF, NODET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"fa4", EXTEND, P0, CAP, CC_DEF, DET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"fa4", EXTEND, PT, CAP, CC_ON, DET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"fa4", EXTEND, P0, OVER, CC_DEF, DET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"fa4", DECODE, P0, CAP, CC_DEF, DET, CUDA, NOROPE, MHA_CHUNKED_KV},
    {"fa4", DECODE, P0, CAP, CC_DEF, NODET, ROCM, ROPE, MHA_CHUNKED_KV},
    {"fa4", DECODE, P0, CAP, CC_DEF, NODET, CUDA, ROPE, MHA_CHUNKED_KV},
    {"fa4", DECODE, P0, CAP, CC_DEF, NODET, CPU, ROPE, MHA_CHUNKED_KV},
    {"fa4", DECODE, P0, CAP, CC_DEF, NODET, ROCM, NOROPE, MHA_CHUNKED_KV},
    {"fa4", EXTEND, P0, CAP, CC_DEF, NODET, ROCM, ROPE, MHA_CHUNKED_KV},
    {"fa4", TARGET_VERIFY, P0, CAP, CC_DEF, NODET, ROCM, ROPE, MHA_CHUNKED_KV},
    {"fa4", DECODE, P0, CAP, CC_DEF, DET, ROCM, ROPE, MHA_CHUNKED_KV},

    // ---- triton: MHA only for a prefill with no prefix (the cache is forced off, so no threshold
    // path); deterministic forces MLA.
    {"triton", EXTEND, P0, CAP, CC_DEF, NODET, CUDA, NOROPE, MHA},
    {"triton", DECODE, P0, CAP, CC_DEF, NODET, CUDA, NOROPE, MLA},
    {"triton", TARGET_VERIFY, P0, CAP, CC_DEF, NODET, CUDA, NOROPE, MLA},
    {"triton", DRAFT_EXTEND, P0, CAP, CC_DEF, NODET, CUDA, NOROPE, MLA},
    {"triton", IDLE, P0, CAP, CC_DEF, NODET, CUDA, NOROPE, MLA},
    {"triton", EXTEND, P0, CAP, CC_ON, NODET, CUDA, NOROPE, MHA},
    {"triton", EXTEND, P0, CAP, CC_OFF, NODET, CUDA, NOROPE, MHA},
    {"triton", EXTEND, PB, CAP, CC_ON, NODET, CUDA, NOROPE, MLA},
    {"triton", EXTEND, PB, CAP, CC_OFF, NODET, CUDA, NOROPE, MLA},
    {"triton", EXTEND, PT, CAP, CC_DEF, NODET, CUDA, NOROPE, MLA},
    {"triton", EXTEND, PT, CAP, CC_ON, NODET, CUDA, NOROPE, MLA},
    {"triton", EXTEND, PT, CAP, CC_OFF, NODET, CUDA, NOROPE, MLA},
    {"triton", EXTEND, PA, CAP, CC_ON, NODET, CUDA, NOROPE, MLA},
    {"triton", EXTEND, PA, CAP, CC_OFF, NODET, CUDA, NOROPE, MLA},
    {"triton", EXTEND, P0, OVER, CC_DEF, NODET, CUDA, NOROPE, MHA},
    {"triton", EXTEND, P0, OVER, CC_OFF, NODET, CUDA, NOROPE, MHA},
    {"triton", EXTEND, PT, OVER, CC_ON, NODET, CUDA, NOROPE, MLA},
    {"triton", EXTEND, PA, OVER, CC_ON, NODET, CUDA, NOROPE, MLA},
    {"triton", EXTEND, PB, OVER, CC_ON, NODET, CUDA, NOROPE, MLA},
    {"triton", EXTEND, PA, OVER, CC_OFF, NODET, CUDA, NOROPE, MLA},
    {"triton", DECODE, P0, OVER, CC_ON, NODET, CUDA, NOROPE, MLA},
    {"triton", TARGET_VERIFY, PT, CAP, CC_ON, NODET, CUDA, NOROPE, MLA},
    {"triton", DRAFT_EXTEND, PA, CAP, CC_ON, NODET, CUDA, NOROPE, MLA},
    {"triton", DECODE, PA, CAP, CC_ON, NODET, CUDA, NOROPE, MLA},
    {"triton", DRAFT_EXTEND, P0, CAP, CC_OFF, NODET, CUDA, NOROPE, MLA},
    {"triton", EXTEND, P0, CAP, CC_DEF, DET, CUDA, NOROPE, MLA},
    {"triton", EXTEND, PT, CAP, CC_ON, DET, CUDA, NOROPE, MLA},
    {"triton", EXTEND, P0, OVER, CC_DEF, DET, CUDA, NOROPE, MLA},
    {"triton", DECODE, P0, CAP, CC_DEF, DET, CUDA, NOROPE, MLA},
    {"triton", DECODE, P0, CAP, CC_DEF, NODET, ROCM, ROPE, MLA},
    {"triton", DECODE, P0, CAP, CC_DEF, NODET, CUDA, ROPE, MLA},
    {"triton", DECODE, P0, CAP, CC_DEF, NODET, CPU, ROPE, MLA},
    {"triton", DECODE, P0, CAP, CC_DEF, NODET, ROCM, NOROPE, MLA},
    {"triton", EXTEND, P0, CAP, CC_DEF, NODET, ROCM, ROPE, MHA},
    {"triton", TARGET_VERIFY, P0, CAP, CC_DEF, NODET, ROCM, ROPE, MLA},
    {"triton", DECODE, P0, CAP, CC_DEF, DET, ROCM, ROPE, MLA},

    // ---- aiter: MHA for every extend; the fused-RoPE decode on ROCm.
    {"aiter", EXTEND, P0, CAP, CC_DEF, NODET, CUDA, NOROPE, MHA},
    {"aiter", DECODE, P0, CAP, CC_DEF, NODET, CUDA, NOROPE, MLA},
    {"aiter", TARGET_VERIFY, P0, CAP, CC_DEF, NODET, CUDA, NOROPE, MLA},
    {"aiter", DRAFT_EXTEND, P0, CAP, CC_DEF, NODET, CUDA, NOROPE, MLA},
    {"aiter", IDLE, P0, CAP, CC_DEF, NODET, CUDA, NOROPE, MLA},
    {"aiter", EXTEND, P0, CAP, CC_ON, NODET, CUDA, NOROPE, MHA},
    {"aiter", EXTEND, P0, CAP, CC_OFF, NODET, CUDA, NOROPE, MHA},
    {"aiter", EXTEND, PB, CAP, CC_ON, NODET, CUDA, NOROPE, MHA},
    {"aiter", EXTEND, PB, CAP, CC_OFF, NODET, CUDA, NOROPE, MHA},
    {"aiter", EXTEND, PT, CAP, CC_DEF, NODET, CUDA, NOROPE, MHA},
    {"aiter", EXTEND, PT, CAP, CC_ON, NODET, CUDA, NOROPE, MHA},
    {"aiter", EXTEND, PT, CAP, CC_OFF, NODET, CUDA, NOROPE, MHA},
    {"aiter", EXTEND, PA, CAP, CC_ON, NODET, CUDA, NOROPE, MHA},
    {"aiter", EXTEND, PA, CAP, CC_OFF, NODET, CUDA, NOROPE, MHA},
    {"aiter", EXTEND, P0, OVER, CC_DEF, NODET, CUDA, NOROPE, MHA},
    {"aiter", EXTEND, P0, OVER, CC_OFF, NODET, CUDA, NOROPE, MHA},
    {"aiter", EXTEND, PT, OVER, CC_ON, NODET, CUDA, NOROPE, MHA},
    {"aiter", EXTEND, PA, OVER, CC_ON, NODET, CUDA, NOROPE, MHA},
    {"aiter", EXTEND, PB, OVER, CC_ON, NODET, CUDA, NOROPE, MHA},
    {"aiter", EXTEND, PA, OVER, CC_OFF, NODET, CUDA, NOROPE, MHA},
    {"aiter", DECODE, P0, OVER, CC_ON, NODET, CUDA, NOROPE, MLA},
    {"aiter", TARGET_VERIFY, PT, CAP, CC_ON, NODET, CUDA, NOROPE, MLA},
    {"aiter", DRAFT_EXTEND, PA, CAP, CC_ON, NODET, CUDA, NOROPE, MLA},
    {"aiter", DECODE, PA, CAP, CC_ON, NODET, CUDA, NOROPE, MLA},
    {"aiter", DRAFT_EXTEND, P0, CAP, CC_OFF, NODET, CUDA, NOROPE, MLA},
    {"aiter", EXTEND, P0, CAP, CC_DEF, DET, CUDA, NOROPE, MHA},
    {"aiter", EXTEND, PT, CAP, CC_ON, DET, CUDA, NOROPE, MHA},
    {"aiter", EXTEND, P0, OVER, CC_DEF, DET, CUDA, NOROPE, MHA},
    {"aiter", DECODE, P0, CAP, CC_DEF, DET, CUDA, NOROPE, MLA},
    {"aiter", DECODE, P0, CAP, CC_DEF, NODET, ROCM, ROPE, MLA_FUSED_ROPE_ROCM},
    {"aiter", DECODE, P0, CAP, CC_DEF, NODET, CUDA, ROPE, MLA},
    {"aiter", DECODE, P0, CAP, CC_DEF, NODET, CPU, ROPE, MLA},
    {"aiter", DECODE, P0, CAP, CC_DEF, NODET, ROCM, NOROPE, MLA},
    {"aiter", EXTEND, P0, CAP, CC_DEF, NODET, ROCM, ROPE, MHA},
    {"aiter", TARGET_VERIFY, P0, CAP, CC_DEF, NODET, ROCM, ROPE, MLA},
    {"aiter", DECODE, P0, CAP, CC_DEF, DET, ROCM, ROPE, MLA_FUSED_ROPE_ROCM},
    // aiter's other non-decode modes on ROCm with fused RoPE stay MLA.
    {"aiter", DRAFT_EXTEND, P0, CAP, CC_DEF, NODET, ROCM, ROPE, MLA},
    {"aiter", IDLE, P0, CAP, CC_DEF, NODET, ROCM, ROPE, MLA},

    // ---- no backend named: the platform's default (cpu, cuda: fa3; rocm: aiter).
    {"", EXTEND, PT, CAP, CC_ON, NODET, CPU, NOROPE, MHA_ONE_SHOT},
    {"", EXTEND, PT, CAP, CC_ON, NODET, CUDA, NOROPE, MHA_ONE_SHOT},
    {"", EXTEND, PT, CAP, CC_ON, NODET, ROCM, NOROPE, MHA},
    {"", EXTEND, PB, CAP, CC_ON, NODET, ROCM, NOROPE, MHA},
    {"", EXTEND, P0, CAP, CC_DEF, DET, CUDA, NOROPE, MLA},
    {"", EXTEND, P0, CAP, CC_DEF, DET, ROCM, NOROPE, MHA},
    {"", DECODE, P0, CAP, CC_DEF, NODET, CPU, ROPE, MLA},
    {"", DECODE, P0, CAP, CC_DEF, NODET, CUDA, ROPE, MLA},
    {"", DECODE, P0, CAP, CC_DEF, NODET, ROCM, ROPE, MLA_FUSED_ROPE_ROCM},
};

TEST(Dispatch, HandlerTable) {
  for (size_t i = 0; i < kRows.size(); ++i) {
    const Row& r = kRows[i];
    SCOPED_TRACE(describe(i, r));
    ForwardMethod got = select_method(summary_of(r), settings_of(r), r.platform);
    EXPECT_EQ(method_name(got), method_name(r.want));
  }
}

// The table itself must span every dimension for every backend, so a row dropped by mistake is
// caught here rather than silently shrinking the coverage.
TEST(Dispatch, HandlerTableCoversEveryDimension) {
  for (const std::string& backend : backend_names()) {
    SCOPED_TRACE(backend);
    std::set<ForwardMode> modes;
    std::set<std::tuple<int64_t, Cc>> extend_prefix_cc;
    std::set<int64_t> extend_seq;
    std::set<bool> extend_det, decode_det;
    std::set<std::tuple<Platform, bool>> decode_platform_rope;
    for (const Row& r : kRows) {
      if (backend != r.backend) continue;
      modes.insert(r.mode);
      if (r.mode == EXTEND) {
        extend_prefix_cc.insert({r.sum_prefix, r.cc});
        extend_seq.insert(r.sum_seq);
        extend_det.insert(r.det);
      }
      if (r.mode == DECODE) {
        decode_det.insert(r.det);
        decode_platform_rope.insert({r.platform, r.rope});
      }
    }
    EXPECT_EQ(modes.size(), 5u);
    for (int64_t p : {P0, PB, PT, PA})
      for (Cc cc : {CC_ON, CC_OFF})
        EXPECT_TRUE(extend_prefix_cc.count({p, cc})) << "prefix " << p << " cc " << int(cc);
    EXPECT_TRUE(extend_prefix_cc.count({PT, CC_DEF}));
    EXPECT_EQ(extend_seq, (std::set<int64_t>{CAP, OVER}));
    EXPECT_EQ(extend_det, (std::set<bool>{false, true}));
    EXPECT_EQ(decode_det, (std::set<bool>{false, true}));
    for (Platform p : {CPU, CUDA, ROCM}) EXPECT_TRUE(decode_platform_rope.count({p, true}));
    EXPECT_TRUE(decode_platform_rope.count({ROCM, false}));
  }
}

TEST(Dispatch, EmptyIdleBatch) {
  Batch b;
  b.mode = IDLE;
  DispatchSettings s;
  s.backend = "fa3";
  EXPECT_EQ(select_method(b, s, CUDA), MLA);
  s.backend = "fa4";
  EXPECT_EQ(select_method(b, s, CUDA), MHA_CHUNKED_KV);
  s.backend = "aiter";
  s.fused_decode_rope = true;
  EXPECT_EQ(select_method(b, s, ROCM), MLA);
}

TEST(Dispatch, DefaultSettingsThresholdAndCapacity) {
  // The header's defaults: threshold 8192 on Σ prefix, capacity 131072 tokens.
  DispatchSettings s;
  s.backend = "fa3";
  auto extend = [](int64_t prefix, int64_t seq) { return Batch::from_seq_lens(EXTEND, {prefix}, {seq}); };
  EXPECT_EQ(select_method(extend(8191, 9000), s, CUDA), MLA);
  EXPECT_EQ(select_method(extend(8192, 9000), s, CUDA), MHA_ONE_SHOT);
  EXPECT_EQ(select_method(extend(8192, 131072), s, CUDA), MHA_ONE_SHOT);
  EXPECT_EQ(select_method(extend(8192, 131073), s, CUDA), MHA_CHUNKED_KV);
}

TEST(Dispatch, BackendNames) {
  EXPECT_EQ(backend_names(), (std::vector<std::string>{"fa3", "flashinfer", "flashmla",
                                                       "cutlass_mla", "trtllm_mla", "fa4",
                                                       "triton", "aiter"}));
}

TEST(Dispatch, ChunkedPrefixCacheEnabled) {
  struct Case {
    const char* backend;
    bool unset, on, off;  // the result when the setting is unset, true, false
  };
  const Case cases[] = {
      {"fa3", true, true, false},        {"flashinfer", true, true, false},
      {"flashmla", true, true, false},   {"cutlass_mla", true, true, false},
      {"trtllm_mla", true, true, false}, {"fa4", true, true, false},
      {"triton", false, false, false},   {"aiter", false, false, false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.backend);
    DispatchSettings s;
    EXPECT_EQ(chunked_prefix_cache_enabled(c.backend, s), c.unset);
    s.chunked_prefix_cache = true;
    EXPECT_EQ(chunked_prefix_cache_enabled(c.backend, s), c.on);
    s.chunked_prefix_cache = false;
    EXPECT_EQ(chunked_prefix_cache_enabled(c.backend, s), c.off);
  }
}

TEST(Dispatch, PlatformDefaults) {
  EXPECT_EQ(default_backend(CPU), "fa3");
  EXPECT_EQ(default_backend(CUDA), "fa3");
  EXPECT_EQ(default_backend(ROCM), "aiter");
}

// Runs f, expecting an mla::Error with a one-line message; returns the message.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    return msg;
  }
  ADD_FAILURE() << "no mla::Error thrown";
  return "";
}

Batch extend_batch(std::vector<int64_t> prefix, std::vector<int64_t> seq) {
  return Batch::from_seq_lens(EXTEND, prefix, seq);
}

TEST(Dispatch, UnknownBackendListsKnownNames) {
  const std::string known =
      "(known: fa3, flashinfer, flashmla, cutlass_mla, trtllm_mla, fa4, triton, aiter)";
  for (const char* name : {"fa5", "FA3", " fa3", "flash_infer"}) {
    DispatchSettings s;
    s.backend = name;
    for (Platform p : {CPU, CUDA, ROCM}) {
      std::string msg = error_of([&] { select_method(extend_batch({0}, {10}), s, p); });
      EXPECT_EQ(msg, fmt::format("unknown attention backend '{}' {}", name, known));
    }
  }
}

TEST(Dispatch, ValidationErrors) {
  DispatchSettings s;
  s.backend = "fa3";
  // Lengths are checked where the batch is made from them, the settings by select_method.
  auto msg = [&](std::vector<int64_t> prefix, std::vector<int64_t> seq) {
    return error_of([&] { select_method(extend_batch(prefix, seq), s, CUDA); });
  };

  EXPECT_EQ(msg({0, 0}, {5}),
            "batch has 2 prefix lengths but 1 sequence lengths");
  EXPECT_EQ(msg({0}, {5, 6}),
            "batch has 1 prefix lengths but 2 sequence lengths");
  EXPECT_EQ(msg({0, 5}, {3, 4}), "request 1: prefix_len 5 exceeds seq_len 4");
  EXPECT_EQ(msg({4, 0}, {3, 4}), "request 0: prefix_len 4 exceeds seq_len 3");
  EXPECT_EQ(msg({0, 0, -1}, {3, 4, 5}), "request 2: prefix_len -1 is negative");
  EXPECT_EQ(msg({0, -2}, {3, -1}), "request 1: prefix_len -2 is negative");
  EXPECT_EQ(msg({0, 0}, {3, -1}), "request 1: seq_len -1 is negative");

  // Equal prefix and sequence lengths are fine (a request with no new tokens).
  EXPECT_NO_THROW(select_method(extend_batch({7}, {7}), s, CUDA));

  s.chunked_prefix_threshold = 0;
  EXPECT_EQ(msg({0}, {5}), "chunked_prefix_threshold must be positive, got 0");
  s.chunked_prefix_threshold = -3;
  EXPECT_EQ(msg({0}, {5}), "chunked_prefix_threshold must be positive, got -3");
  s.chunked_prefix_threshold = 1;
  s.chunk_capacity = 0;
  EXPECT_EQ(msg({0}, {5}), "chunk_capacity must be positive, got 0");
  s.chunk_capacity = -1;
  EXPECT_EQ(msg({0}, {5}), "chunk_capacity must be positive, got -1");

  // Every backend validates, not only fa3 (fa4 ignores the batch for its choice).
  for (const std::string& backend : backend_names()) {
    DispatchSettings t;
    t.backend = backend;
    EXPECT_EQ(error_of([&] { select_method(Batch{EXTEND, {{0, 2, -1}}}, t, ROCM); }),
              "request 0: new_len -1 is negative")
        << backend;
  }
}

TEST(Dispatch, BatchFromLengths) {
  Batch b = Batch::from_seq_lens(DECODE, {10, 0, 300}, {11, 1, 301});
  EXPECT_EQ(b.mode, DECODE);
  EXPECT_EQ(b.prefix_lens(), (std::vector<int64_t>{10, 0, 300}));
  EXPECT_EQ(b.seq_lens(), (std::vector<int64_t>{11, 1, 301}));
  EXPECT_EQ(b.sum_prefix(), 310);
  EXPECT_EQ(b.sum_seq(), 313);
  EXPECT_EQ(b.requests[2].id, 2);
  Batch same = Batch::from_lengths(DECODE, {{10, 1}, {0, 1}, {300, 1}});
  EXPECT_EQ(same.seq_lens(), b.seq_lens());
  EXPECT_EQ(error_of([] { Batch::from_lengths(EXTEND, {{0, 1}, {3, -2}}); }), "request 1: new_len -2 is negative");

  // A fresh prefill of two prompts through the default backends.
  Batch prefill{EXTEND, {{1, 0, 40}, {2, 0, 24}}};
  DispatchSettings s;
  EXPECT_EQ(select_method(prefill, s, CPU), MHA_ONE_SHOT);
  EXPECT_EQ(select_method(prefill, s, ROCM), MHA);
}

// ---- platform resolution

TEST(Resolve, RocmRoutesSharedMethodsToTwins) {
  EXPECT_EQ(resolve_method(ROCM, MHA), MHA_ROCM);
  EXPECT_EQ(resolve_method(ROCM, MHA_ONE_SHOT), MHA_ONE_SHOT_ROCM);
  EXPECT_EQ(resolve_method(ROCM, MHA_CHUNKED_KV), MHA_CHUNKED_KV_ROCM);
  EXPECT_EQ(resolve_method(ROCM, MLA), MLA_ROCM);
}

TEST(Resolve, RocmLeavesPlatformMembersAlone) {
  EXPECT_EQ(resolve_method(ROCM, MHA_ROCM), MHA_ROCM);
  EXPECT_EQ(resolve_method(ROCM, MHA_ONE_SHOT_ROCM), MHA_ONE_SHOT_ROCM);
  EXPECT_EQ(resolve_method(ROCM, MHA_CHUNKED_KV_ROCM), MHA_CHUNKED_KV_ROCM);
  EXPECT_EQ(resolve_method(ROCM, MLA_ROCM), MLA_ROCM);
  EXPECT_EQ(resolve_method(ROCM, MLA_FUSED_ROPE_ROCM), MLA_FUSED_ROPE_ROCM);
}

TEST(Resolve, IdentityOffRocm) {
  for (Platform p : {CPU, CUDA})
    for (ForwardMethod m : all_methods())
      EXPECT_EQ(resolve_method(p, m), m) << platform_str(p) << " " << method_name(m);
}

TEST(Resolve, RocmNeverRunsAGenericMethodAndIsIdempotent) {
  for (Platform p : {CPU, CUDA, ROCM}) {
    for (ForwardMethod m : all_methods()) {
      ForwardMethod r = resolve_method(p, m);
      EXPECT_EQ(resolve_method(p, r), r) << platform_str(p) << " " << method_name(m);
      if (p == ROCM) {
        EXPECT_FALSE(is_generic(r)) << method_name(m);
      }
    }
  }
}

// ---- ForwardMethod names

TEST(ForwardMethodNames, AllMethodsInEnumOrderWithExactNames) {
  const std::vector<std::string_view> names = {
      "MHA",      "MHA_ONE_SHOT",        "MHA_CHUNKED_KV",
      "MLA",      "MHA_ROCM",            "MHA_ONE_SHOT_ROCM",
      "MHA_CHUNKED_KV_ROCM", "MLA_ROCM", "MLA_FUSED_ROPE_ROCM"};
  ASSERT_EQ(all_methods().size(), names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    EXPECT_EQ(all_methods()[i], ForwardMethod(i));
    EXPECT_EQ(method_name(all_methods()[i]), names[i]);
  }
}

TEST(ForwardMethodNames, ParseRoundTrip) {
  for (ForwardMethod m : all_methods()) EXPECT_EQ(parse_method(method_name(m)), m);
  EXPECT_EQ(parse_method("MHA_CHUNKED_KV"), MHA_CHUNKED_KV);
  EXPECT_EQ(parse_method("MLA_FUSED_ROPE_ROCM"), MLA_FUSED_ROPE_ROCM);
}

TEST(ForwardMethodNames, ParseErrorListsKnownNames) {
  const std::string known =
      "(known: MHA, MHA_ONE_SHOT, MHA_CHUNKED_KV, MLA, MHA_ROCM, MHA_ONE_SHOT_ROCM, "
      "MHA_CHUNKED_KV_ROCM, MLA_ROCM, MLA_FUSED_ROPE_ROCM)";
  for (const char* s : {"mha", "Mla", "MHA ", "", "MLA_ROCM2", "mha_one_shot"})
    EXPECT_EQ(error_of([&] { parse_method(s); }),
              fmt::format("unknown forward method '{}' {}", s, known));
}

TEST(ForwardMethodNames, IsGeneric) {
  EXPECT_TRUE(is_generic(MHA));
  EXPECT_TRUE(is_generic(MHA_ONE_SHOT));
  EXPECT_TRUE(is_generic(MHA_CHUNKED_KV));
  EXPECT_TRUE(is_generic(MLA));
  EXPECT_FALSE(is_generic(MHA_ROCM));
  EXPECT_FALSE(is_generic(MHA_ONE_SHOT_ROCM));
  EXPECT_FALSE(is_generic(MHA_CHUNKED_KV_ROCM));
  EXPECT_FALSE(is_generic(MLA_ROCM));
  EXPECT_FALSE(is_generic(MLA_FUSED_ROPE_ROCM));
}

}  // namespace
}  // namespace mla
