// mla/reference_harness.h — one attention-layer case of the reference harness: a config, a batch with
// prefixes already in a (NaN-filled) pool, a method, a platform's ops; and its error against the
// float64 reference. Used by the method tests and by `mla attn` / `mla demo`.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "mla/attention.h"
#include "mla/platform_ops.h"
#include "mla/reference.h"

namespace mla {

struct LayerCase {
  std::string name;
  AttentionConfig cfg;
  Platform platform = Platform::CPU;
  DType act = DType::F32;       // ops flavour: activation storage
  DType kv = DType::F32;        // pool dtype
  int64_t page_size = 16;
  ForwardMode mode = ForwardMode::EXTEND;
  std::vector<std::pair<int64_t, int64_t>> requests;  // (prefix_len, new_len)
  DispatchSettings settings;
  double kv_scale = 1.0;        // per-layer pool scale
  uint64_t seed = 1;
  PlatformOptions options;      // e.g. the ROCm target and absorb weight format
};

// Today's single tolerance per dtype pair (fp8 KV 5e-2; bf16 anywhere 1e-2; f32 1e-5; the f64 flavour
// 1e-6): what the GPU platforms are held to until their errors are measured per method and output.
double dtype_tolerance(DType act, DType kv);

// A tolerance per output of the layer (relative L2 against the float64 reference).
struct Tolerance {
  double out = 0, lse = 0, rows = 0;
  double max() const;
};
struct LayerErrors;
// The tolerance of `method` in case `c`. On the CPU: a table per (method, activation dtype, KV dtype)
// and output, each entry within 10x of the error measured on the harness's cases (the measured value
// is beside it in harness.cpp; a dtype pair it does not list gets dtype_tolerance). On CUDA and ROCm: dtype_tolerance for every output, and for the
// absorbed ROCm methods with quantized absorb weights whose activations are quantized too (judged
// against the reference with the same dequantized weights): fp8 w8a8 5e-2, MXFP4 a4w4 0.25.
Tolerance tolerance(const LayerCase& c, ForwardMethod method);
bool within(const LayerErrors& e, const Tolerance& t);

// GoogleTest prints a case by its name (found by argument-dependent lookup).
inline void PrintTo(const LayerCase& c, std::ostream* os) { *os << c.name; }

struct LayerRun {
  ForwardMethod method;
  std::vector<double> out, lse, new_rows;  // downloaded: [T, hidden], [T, H], [T, row_dim]
  double seconds = 0;                      // the forward call alone
};

struct LayerErrors {
  double out = 0, lse = 0, rows = 0;  // relative L2 against the reference
  double worst = 0;                   // max of the three
};

// Random weights, inputs and reference for a case, built once and reused across methods.
class LayerFixture {
 public:
  explicit LayerFixture(const LayerCase& c);
  const LayerCase& c() const { return c_; }
  // Computed on first use (it is the slow part for large batches). `method` picks the weights
  // (the absorbed methods are judged with the absorbed weights as the platform packs them) and
  // whether attention sees the new tokens' rows as the cache gives them back (see CacheRounding).
  const ReferenceResult& reference(ForwardMethod method = ForwardMethod::MHA);
  // Runs `method` (nullopt: dispatch) on a fresh pool whose unused rows hold `fill`; with `in_step`
  // the forward call runs inside a step over its plan (Ops::begin_step), as a model's layers do.
  LayerRun run(std::optional<ForwardMethod> method, double fill, bool in_step = false);
  Ops& ops() { return *ops_; }
  LayerErrors errors(const LayerRun& r);

 private:
  LayerCase c_;
  AttentionWeights w_;
  std::vector<std::vector<double>> x_;  // per request [prefix + new, hidden]
  std::optional<ReferenceResult> ref_[2][2];  // [packed absorbed weights][new rows from the cache]
  std::optional<AttentionWeights> w_packed_;   // those weights, when they differ
  std::vector<std::vector<double>> prefix_rows_;  // per request [prefix, row_dim]
  std::unique_ptr<Ops> ops_;
  std::unique_ptr<AttentionLayer> layer_;
};

}  // namespace mla
