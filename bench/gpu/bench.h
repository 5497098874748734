// bench/gpu/bench.h — the CUDA benchmark behind `mla bench` (library mla_bench_gpu, linked by the
// CLI when CUDA is on): measures its own ceilings (device copy bandwidth, a large cuBLAS bf16 GEMM)
// in the same process, then times MLA decode, MHA prefill, whole layers on DeepSeek-V3 shapes and MoE
// (route + experts) on V2-Lite and V3 shapes.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

namespace mla::cuda {

struct BenchOptions {
  bool quick = false;  // fewer shapes and runs (a smoke test)
  int runs = 20;       // timed runs per row (median reported)
  bool rocm_only = false;  // only the ROCm-twins-vs-CUDA layer rows
  bool layers_only = false;  // only the V3 layer rows (decode b128 s4096, prefill s4096)
  bool moe_only = false;   // only the MoE rows (route + experts on V2-Lite and V3 shapes)
};
nlohmann::json run_bench(const BenchOptions& o);

}  // namespace mla::cuda
