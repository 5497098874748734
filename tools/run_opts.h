// tools/run_opts.h — the options every model command shares (logits, generate, demo, serve) and the
// session they open: platform ops, the loaded model and the engine over its KV pool.
#pragma once
#include <algorithm>
#include <memory>
#include <string>

#include "cli.h"
#include "engine/engine.h"
#include "mla/model.h"
#include "mla/platform_ops.h"

namespace mla::cli {

// Options every model command shares.
struct RunOpts {
  std::string model, platform = "cpu", dtype = "f32", kv_dtype = "f32", method = "auto", backend;
  int64_t page_size = 16, threshold = 8192, capacity = 131072;
  bool verbose = false, fused_rope = false;
  RocmFlags rocm_flags;
  void add(CLI::App* sub, bool model_required = true) {
    rocm_flags.add(sub);
    sub->add_flag("--fused-decode-rope", fused_rope, "ROCm: aiter decode runs MLA_FUSED_ROPE_ROCM");
    sub->add_flag("-v,--verbose", verbose, "loading details on stderr");
    auto* m = sub->add_option("--model", model, "HF checkpoint folder (config.json + safetensors)");
    if (model_required) m->required();
    sub->add_option("--platform", platform, "cpu|cuda|rocm")->capture_default_str();
    sub->add_option("--dtype", dtype, "activations and weights: f32 | bf16 | f64")->capture_default_str();
    sub->add_option("--kv-dtype", kv_dtype, "latent KV pool: f32 | bf16 | fp8_e4m3fn")->capture_default_str();
    sub->add_option("--page-size", page_size, "KV pool page size")->capture_default_str();
    sub->add_option("--method", method, "auto | MHA | MHA_ONE_SHOT | MHA_CHUNKED_KV | MLA")->capture_default_str();
    sub->add_option("--backend", backend, "attention backend rules (default: the platform's)");
    sub->add_option("--chunked-prefix-threshold", threshold, "dispatch threshold on Σ prefix")->capture_default_str();
    sub->add_option("--chunk-capacity", capacity, "MHA_CHUNKED_KV chunk capacity (tokens)")->capture_default_str();
  }
  // Parsed and checked; bad values are usage errors.
  Platform p;
  DType act, kv;
  ForwardOptions fwd;
  PlatformOptions options;
  void parse() {
    options.rocm = rocm_flags.parse();
    fwd.dispatch.fused_decode_rope = fused_rope;
    try {
      p = parse_platform(platform);
      act = parse_dtype(dtype);
      kv = parse_dtype(kv_dtype);
      if (method != "auto") fwd.method = parse_method(method);
      fwd.dispatch.backend = backend;
      if (!backend.empty()) {
        const auto& known = backend_names();
        if (std::find(known.begin(), known.end(), backend) == known.end())
          select_method({}, fwd.dispatch, p);  // throws the error listing the known names
      }
    } catch (const Error& e) {
      throw UsageError(e.what());
    }
    if (page_size <= 0 || threshold <= 0 || capacity <= 0)
      throw UsageError("--page-size, --chunked-prefix-threshold and --chunk-capacity must be positive");
    fwd.dispatch.chunked_prefix_threshold = threshold;
    fwd.dispatch.chunk_capacity = capacity;
  }
};

struct Session {
  std::unique_ptr<Ops> ops;
  LoadedModel lm;
  std::unique_ptr<Engine> engine;
};

// Loads the model (notes on stderr) and makes an engine whose pool holds `max_tokens` tokens.
Session open_session(const RunOpts& o, int64_t max_tokens);

}  // namespace mla::cli
