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
#include "tp_ranks.h"

namespace mla::cli {

// Options every model command shares: the model, the platform, dtype and dispatch option groups
// (cli_options.h), the pool's page size and a forced method.
struct RunOpts {
  std::string model, random_weights, method = "auto";
  uint64_t weight_seed = 0;
  int64_t page_size = 16;
  bool verbose = false;
  bool no_graphs = false;
  PlatformFlags platform;
  DtypeFlags dtypes{"f32", "f32"};
  DispatchFlags dispatch;
  TpFlags tp;
  // model_required: --model (or --random-weights, when allowed) must be given.
  void add(CLI::App* sub, bool model_required = true, bool allow_random = true) {
    sub->add_flag("-v,--verbose", verbose, "loading details on stderr");
    auto* m = sub->add_option("--model", model, "HF checkpoint folder (config.json + safetensors)");
    if (allow_random) {
      auto* r = sub->add_option("--random-weights", random_weights,
                                "no checkpoint: a named shape (deepseek-v2-lite, deepseek-v2, deepseek-v3; NAME:N "
                                "keeps N layers) with random weights made on the platform");
      sub->add_option("--weight-seed", weight_seed, "seed of --random-weights")->capture_default_str();
      r->excludes(m);
      if (model_required) model_or_random_ = true;
    } else if (model_required) {
      m->required();
    }
    platform.add(sub);
    dtypes.add(sub);
    dispatch.add(sub);
    sub->add_option("--page-size", page_size, "KV pool page size")->capture_default_str();
    sub->add_option("--method", method, "auto | MHA | MHA_ONE_SHOT | MHA_CHUNKED_KV | MLA")->capture_default_str();
    sub->add_flag("--no-graphs", no_graphs,
                  "run decode steps op by op: no CUDA graphs (they give the same bits; this measures them)");
    tp.add(sub);
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
    fwd.graphs = !no_graphs;
    if (page_size <= 0) throw UsageError("--page-size must be positive");
    if (model_or_random_ && model.empty() && random_weights.empty())
      throw UsageError("give the model with --model DIR or --random-weights SHAPE");
    tp.group();  // usage errors for bad --tp values
  }
  // The model's name: its folder's last component, or the random shape.
  std::string model_name() const;

 private:
  bool model_or_random_ = false;
};

struct Session {
  std::unique_ptr<Ops> ops;
  TpRank tp;  // with --tp N: this rank's group and communicator
  std::unique_ptr<ThreadRanks> threads;  // with --tp N --tp-in-process: ranks 1 … N−1
  LoadedModel lm;
  std::unique_ptr<Engine> engine;  // with --tp N, rank 0's leads the other ranks' engines
};

// Loads the model (a progress line on stderr for loads past a second; notes with --verbose) and
// makes an engine whose pool holds `max_tokens` tokens. With --tp N: joins the group first (rank 0
// starts its host's other ranks) and loads this rank's shard; on the ranks other than 0 it follows
// rank 0's engine until that ends, then throws RankFinished (their command is done).
Session open_session(const RunOpts& o, int64_t max_tokens);

}  // namespace mla::cli
