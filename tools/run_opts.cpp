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
  if (o.tp.tp > 1)  // before any rank starts
    check_tensor_parallel(o.random_weights.empty() ? load_model_config(o.model) : named_model_config(o.random_weights),
                          o.tp.tp);
  s.tp = TpRank(o.tp, o.p, command_line());
  const bool lead = s.tp.rank() == 0;  // only rank 0 speaks
  const std::string what = o.random_weights.empty() ? o.model : "random " + o.random_weights;
  auto load = [&o](Ops& ops, const LoadOptions& lo) {
    return o.random_weights.empty() ? load_model(o.model, ops, lo)
                                    : random_model(named_model_config(o.random_weights), ops, o.weight_seed, lo);
  };
  const EngineOptions eo{o.fwd, o.kv, o.page_size, std::max<int64_t>(max_tokens, 1)};
  LoadOptions lo = lead ? progress_on_stderr(what) : LoadOptions{};
  if (s.tp.active()) lo.tp = &s.tp.communicator(*s.ops);
  if (o.tp.tp > 1 && o.tp.in_process) {
    s.threads = std::make_unique<ThreadRanks>(
        o.tp.tp, [&o, load, eo](int rank, InProcessGroup& g, const std::function<std::string()>& receive) {
          std::unique_ptr<Ops> ops = make_ops(o.p, o.act, o.options);
          std::unique_ptr<Communicator> comm = g.communicator(rank, *ops);
          LoadOptions mine;
          mine.tp = comm.get();
          LoadedModel lm = load(*ops, mine);
          Engine(*lm.model, eo).follow(receive);
        });
    lo.tp = &s.threads->rank0(*s.ops);
  }
  s.lm = load(*s.ops, lo);
  if (lead && (o.verbose || s.lm.seconds >= 1.0))
    std::fprintf(stderr, "mla: loaded %s (%s, %ld layers, %.2fM parameters%s) in %.2f s\n", what.c_str(),
                 s.lm.config.model_type().c_str(), long(s.lm.config.num_hidden_layers), s.lm.model->parameters() / 1e6,
                 lo.tp ? fmt::format(" a rank, tensor parallel {}", o.tp.tp).c_str() : "", s.lm.seconds);
  if (lead)
    for (const std::string& n : s.lm.unused) std::fprintf(stderr, "mla: note: checkpoint tensor '%s' is not used\n", n.c_str());
  s.engine = std::make_unique<Engine>(*s.lm.model, eo);
  if (s.threads) s.engine->lead([t = s.threads.get()](const std::string& m) { t->send(m); });
  if (s.tp.active()) {
    RankGroup* g = &s.tp.group();
    if (!lead) {
      s.engine->follow([g] { return g->broadcast(std::string()); });
      throw RankFinished{};
    }
    s.engine->lead([g](const std::string& m) { g->broadcast(m); });
  }
  return s;
}

}  // namespace mla::cli
