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

// Options every model command shares: the model, the platform, dtype and dispatch option groups
// (cli_options.h), the pool's page size and a forced method.
struct RunOpts {
  std::string model, method = "auto";
  int64_t page_size = 16;
  bool verbose = false;
  PlatformFlags platform;
  DtypeFlags dtypes{"f32", "f32"};
  DispatchFlags dispatch;
  void add(CLI::App* sub, bool model_required = true) {
    sub->add_flag("-v,--verbose", verbose, "loading details on stderr");
    auto* m = sub->add_option("--model", model, "HF checkpoint folder (config.json + safetensors)");
    if (model_required) m->required();
    platform.add(sub);
    dtypes.add(sub);
    dispatch.add(sub);
    sub->add_option("--page-size", page_size, "KV pool page size")->capture_default_str();
    sub->add_option("--method", method, "auto | MHA | MHA_ONE_SHOT | MHA_CHUNKED_KV | MLA")->capture_default_str();
  }
  // Parsed and checked; bad values are usage errors.
  Platform p;
  DType act, kv;
  ForwardOptions fwd;
  PlatformOptions options;
  void parse() {
    options = platform.options();
    p = platform.parse();
    act = dtypes.act();
    kv = dtypes.kv();
    try {
      if (method != "auto") fwd.method = parse_method(method);
    } catch (const Error& e) {
      throw UsageError(e.what());
    }
    fwd.dispatch = dispatch.parse();
    if (page_size <= 0) throw UsageError("--page-size must be positive");
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
