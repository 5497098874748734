// mla dispatch — which forward method a batch gets, on which platform, and whether it runs.
#include <cstdio>

#include <nlohmann/json.hpp>

#include "cli.h"
#include "mla/attention.h"
#include "mla/error.h"

namespace mla::cli {

void add_dispatch_command(CLI::App& app, int& rc) {
  struct Opts {
    std::string backend, mode = "extend", seq_lens, prefix_lens, platform = "cpu";
    int64_t threshold = 8192, capacity = 131072;
    bool no_chunked = false, deterministic = false, fused_rope = false, json = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* sub = app.add_subcommand("dispatch", "Show the forward method a batch gets");
  sub->add_option("--backend", o->backend, "attention backend rules (default: the platform's)");
  sub->add_option("--mode", o->mode, "extend|decode|target_verify|draft_extend|idle")->capture_default_str();
  sub->add_option("--seq-lens", o->seq_lens, "total length (prefix + new) of each request, e.g. 4096,17");
  sub->add_option("--prefix-lens", o->prefix_lens, "prefix length of each request (default: all 0)");
  sub->add_option("--platform", o->platform, "cpu|cuda|rocm")->capture_default_str();
  sub->add_option("--chunked-prefix-threshold", o->threshold, "Σ prefix at which chunked prefix starts")->capture_default_str();
  sub->add_option("--chunk-capacity", o->capacity, "tokens per prefix chunk")->capture_default_str();
  sub->add_flag("--disable-chunked-prefix-cache", o->no_chunked, "turn the chunked-prefix cache off");
  sub->add_flag("--deterministic", o->deterministic, "deterministic inference mode");
  sub->add_flag("--fused-decode-rope", o->fused_rope, "ROCm: RoPE inside the decode kernel");
  sub->add_flag("--json", o->json, "one JSON object on stdout");
  sub->callback([o, &rc] {
    BatchSummary b;
    DispatchSettings s;
    Platform p;
    try {
      b.mode = parse_mode(o->mode);
      b.seq_lens = parse_int_list(o->seq_lens, "--seq-lens");
      b.prefix_lens = o->prefix_lens.empty() ? std::vector<int64_t>(b.seq_lens.size(), 0)
                                             : parse_int_list(o->prefix_lens, "--prefix-lens");
      if (b.prefix_lens.size() != b.seq_lens.size())
        throw UsageError(fmt::format("--prefix-lens has {} values, --seq-lens has {}", b.prefix_lens.size(), b.seq_lens.size()));
      for (size_t i = 0; i < b.seq_lens.size(); ++i)
        if (b.prefix_lens[i] > b.seq_lens[i])
          throw UsageError(fmt::format("request {}: prefix {} is longer than its sequence {}", i, b.prefix_lens[i], b.seq_lens[i]));
      if (b.seq_lens.empty() && b.mode != ForwardMode::IDLE)
        throw UsageError("--seq-lens: no requests (only an idle batch may be empty)");
      Batch batch{b.mode, {}};  // the mode's rules: one new token per request in decode, ...
      for (size_t i = 0; i < b.seq_lens.size(); ++i)
        batch.requests.push_back(
            {RequestId(i), b.prefix_lens[i], b.seq_lens[i] - b.prefix_lens[i]});
      validate_batch(batch);
      if (o->threshold <= 0) throw UsageError("--chunked-prefix-threshold must be positive");
      if (o->capacity <= 0) throw UsageError("--chunk-capacity must be positive");
      p = parse_platform(o->platform);
      s.backend = o->backend;
      s.chunked_prefix_threshold = o->threshold;
      s.chunk_capacity = o->capacity;
      if (o->no_chunked) s.chunked_prefix_cache = false;
      s.deterministic = o->deterministic;
      s.fused_decode_rope = o->fused_rope;
      DispatchResult d = dispatch(b, s, p);
      if (o->json) {
        nlohmann::ordered_json j = {{"method", method_name(d.method)},     {"platform", platform_name(p)},
                            {"resolved", method_name(d.resolved)}, {"implemented", d.implemented},
                            {"serves", d.serves},                  {"reason", d.reason}};
        std::printf("%s\n", j.dump().c_str());
      } else {
        std::printf("method:      %s\nplatform:    %s\nresolved:    %s\nimplemented: %s\nserves:      %s\n",
                    std::string(method_name(d.method)).c_str(), std::string(platform_name(p)).c_str(),
                    std::string(method_name(d.resolved)).c_str(), d.implemented ? "true" : "false",
                    d.serves ? "true" : "false");
        if (!d.reason.empty()) std::printf("reason:      %s\n", d.reason.c_str());
      }
      rc = 0;
    } catch (const Error& e) {  // every failure here is a bad value on the command line
      throw UsageError(e.what());
    }
  });
}

}  // namespace mla::cli
