// tools/run_opts.cpp — opening a model session from the shared model options.
#include "run_opts.h"

#include <chrono>
#include <cstdio>

namespace mla::cli {

Session open_session(const RunOpts& o, int64_t max_tokens) {
  using Clock = std::chrono::steady_clock;
  Session s;
  s.ops = make_ops(o.p, o.act, o.options);
  const auto t0 = Clock::now();
  s.lm = load_model(o.model, *s.ops);
  if (o.verbose)
    std::fprintf(stderr, "mla: loaded %s (%s, %ld layers, %.2fM parameters) in %.2f s\n", o.model.c_str(),
               s.lm.config.model_type().c_str(), long(s.lm.config.num_hidden_layers), s.lm.parameters / 1e6,
               std::chrono::duration<double>(Clock::now() - t0).count());
  for (const std::string& n : s.lm.unused) std::fprintf(stderr, "mla: note: checkpoint tensor '%s' is not used\n", n.c_str());
  EngineOptions eo{o.fwd, o.kv, o.page_size, std::max<int64_t>(max_tokens, 1)};
  s.engine = std::make_unique<Engine>(*s.lm.model, eo);
  return s;
}

}  // namespace mla::cli
