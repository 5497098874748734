// mla bench — the CUDA roofline benchmark: ceilings measured in the same process, then MLA decode,
// MHA prefill and whole layers on DeepSeek-V3 shapes, MoE on V2-Lite and V3 shapes; one JSON object
// on stdout.
#include <cstdio>

#include "cli.h"
#include "mla/error.h"
#ifdef MLA_WITH_CUDA
#include "bench/gpu/bench.h"
#endif

namespace mla::cli {

void add_bench_command(CLI::App& app, int& rc) {
  auto quick = std::make_shared<bool>(false);
  auto runs = std::make_shared<int>(20);
  auto rocm_only = std::make_shared<bool>(false);
  auto layers_only = std::make_shared<bool>(false);
  auto moe_only = std::make_shared<bool>(false);
  CLI::App* sub = app.add_subcommand("bench", "CUDA benchmark with its own ceilings (JSON on stdout)");
  sub->add_flag("--quick", *quick, "fewer shapes and runs");
  sub->add_flag("--rocm-vs-cuda", *rocm_only, "only the ROCm twins (rocm-on-cuda) against CUDA, whole layers");
  sub->add_flag("--layers", *layers_only, "only the V3 layer rows (with and without a step plan)");
  sub->add_flag("--moe", *moe_only, "only the MoE rows (route + experts, V2-Lite and V3 shapes)");
  sub->add_option("--runs", *runs, "timed runs per row (the median is reported)")->capture_default_str();
  sub->callback([quick, runs, rocm_only, layers_only, moe_only, &rc] {
    if (*runs <= 0) throw UsageError("--runs must be positive");
#ifdef MLA_WITH_CUDA
    nlohmann::json j = cuda::run_bench({*quick, *runs, *rocm_only, *layers_only, *moe_only});
    std::printf("%s\n", j.dump(1).c_str());
    rc = 0;
#else
    fail("mla bench needs the CUDA platform, which this build does not have");
#endif
  });
}

}  // namespace mla::cli
