// mla dispatch — which forward method a batch gets, on which platform, and whether it runs.
#include <cstdio>

#include <nlohmann/json.hpp>

#include "cli.h"
#include "mla/attention.h"
#include "mla/error.h"

namespace mla::cli {

void add_dispatch_command(CLI::App& app, int& rc) {
  struct Opts {
    std::string mode = "extend", seq_lens, prefix_lens;
    PlatformFlags platform;
    DispatchFlags dispatch;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* sub = app.add_subcommand("dispatch", "Show the forward method a batch gets");
  sub->add_option("--mode", o->mode, "extend|decode|target_verify|draft_extend|idle")->capture_default_str();
  sub->add_option("--seq-lens", o->seq_lens, "total length (prefix + new) of each request, e.g. 4096,17");
  sub->add_option("--prefix-lens", o->prefix_lens, "prefix length of each request (default: all 0)");
  o->platform.add(sub);
  o->dispatch.add(sub);
  sub->add_flag("--json", o->json, "one JSON object on stdout");
  sub->callback([o, &rc] {
    Batch batch;
    DispatchSettings s;
    Platform p;
    try {
      const ForwardMode mode = parse_mode(o->mode);
      const std::vector<int64_t> seq = parse_int_list(o->seq_lens, "--seq-lens");
      const std::vector<int64_t> prefix = o->prefix_lens.empty() ? std::vector<int64_t>(seq.size(), 0)
                                                                 : parse_int_list(o->prefix_lens, "--prefix-lens");
      if (prefix.size() != seq.size())
        throw UsageError(fmt::format("--prefix-lens has {} values, --seq-lens has {}", prefix.size(), seq.size()));
      for (size_t i = 0; i < seq.size(); ++i)
        if (prefix[i] > seq[i])
          throw UsageError(fmt::format("request {}: prefix {} is longer than its sequence {}", i, prefix[i], seq[i]));
      if (seq.empty() && mode != ForwardMode::IDLE)
        throw UsageError("--seq-lens: no requests (only an idle batch may be empty)");
      batch = Batch::from_seq_lens(mode, prefix, seq);
      validate_batch(batch);
      s = o->dispatch.parse();
      p = o->platform.parse();
      DispatchResult d = dispatch(batch, s, p);
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
