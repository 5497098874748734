// mla/layer_check.h — one attention-layer case of the reference harness: a config, a batch with
// prefixes already in a (NaN-filled) pool, a method, a platform's ops; and its error against the
// float64 reference. Used by the method tests and by `mla attn` / `mla demo`.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
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
};

// The tolerance of DESIGN.md: fp8 KV 5e-2; bf16 anywhere 1e-2; f32 1e-5; the f64 flavour 1e-6.
// The reference sees the cache rows rounded as the pool stores them, so these bound the engine's
// own error, not the KV format's.
double tolerance(DType act, DType kv);

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
  // Computed on first use (it is the slow part for large batches).
  const ReferenceResult& reference();
  // Runs `method` (nullopt: dispatch) on a fresh pool whose unused rows hold `fill`.
  LayerRun run(std::optional<ForwardMethod> method, double fill);
  LayerErrors errors(const LayerRun& r);

 private:
  LayerCase c_;
  AttentionWeights w_;
  std::vector<std::vector<double>> x_;  // per request [prefix + new, hidden]
  std::optional<ReferenceResult> ref_;
  std::vector<std::vector<double>> prefix_rows_;  // per request [prefix, row_dim]
  std::unique_ptr<Ops> ops_;
  std::unique_ptr<AttentionLayer> layer_;
};

}  // namespace mla
