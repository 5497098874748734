// tools/run_opts.cpp — opening a model session from the shared model options.
#include "run_opts.h"

#include <unistd.h>

#include <cstdio>
#include <memory>

namespace mla::cli {
namespace {

// A progress line on stderr once a load has run for a second: rewritten in place on a terminal,
// every 5 s otherwise; the last one when it ends.
LoadOptions progress_on_stderr(const std::string& what) {
  LoadOptions lo;
  auto last = std::make_shared<double>(-10.0);
  const bool tty = isatty(STDERR_FILENO);
  lo.progress = [=](const LoadProgress& p) {
    const bool done = p.tensors == p.tensors_total;
    if (p.seconds < 1.0 || (!done && p.seconds - *last < (tty ? 0.25 : 5.0))) return;
    *last = p.seconds;
    const double rate = p.bytes / p.seconds, left = rate > 0 ? (p.bytes_total - p.bytes) / rate : 0.0;
    std::fprintf(stderr, "%smla: loading %s: %ld/%ld tensors, %.2f/%.2f GB, %.2f GB/s, %.0f s left   %s",
                 tty ? "\r" : "", what.c_str(), long(p.tensors), long(p.tensors_total), p.bytes / 1e9,
                 p.bytes_total / 1e9, rate / 1e9, left, tty && !done ? "" : "\n");
  };
  return lo;
}

}  // namespace

std::string RunOpts::model_name() const {
  if (!random_weights.empty()) return random_weights;
  std::string dir = model;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir.substr(dir.find_last_of('/') + 1);
}

Session open_session(const RunOpts& o, int64_t max_tokens) {
  Session s;
  s.ops = make_ops(o.p, o.act, o.options);
  const std::string what = o.random_weights.empty() ? o.model : "random " + o.random_weights;
  const LoadOptions lo = progress_on_stderr(what);
  s.lm = o.random_weights.empty() ? load_model(o.model, *s.ops, lo)
                                  : random_model(named_model_config(o.random_weights), *s.ops, o.weight_seed, lo);
  if (o.verbose || s.lm.seconds >= 1.0)
    std::fprintf(stderr, "mla: loaded %s (%s, %ld layers, %.2fM parameters) in %.2f s\n", what.c_str(),
                 s.lm.config.model_type().c_str(), long(s.lm.config.num_hidden_layers), s.lm.model->parameters() / 1e6,
                 s.lm.seconds);
  for (const std::string& n : s.lm.unused) std::fprintf(stderr, "mla: note: checkpoint tensor '%s' is not used\n", n.c_str());
  EngineOptions eo{o.fwd, o.kv, o.page_size, std::max<int64_t>(max_tokens, 1)};
  s.engine = std::make_unique<Engine>(*s.lm.model, eo);
  return s;
}

}  // namespace mla::cli
