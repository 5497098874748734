// tools/cli.h — the mla command line: subcommands and the helpers they share.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli_util.h"  // UsageError and the text parsers
#include "mla/error.h"
#include "mla/platform_ops.h"

namespace mla::cli {

// Exit codes: 0 success; 1 the work failed (bad model, batch or method at run time);
// 2 bad command-line values.
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

// The ROCm platform's settings as options (--rocm-arch, --rocm-fp8, --rocm-absorb); bad values and
// conflicts are usage errors naming them.
struct RocmFlags {
  std::string arch = "gfx942", fp8, absorb = "act";
  void add(CLI::App* sub) {
    sub->add_option("--rocm-arch", arch, "ROCm target: gfx90a | gfx940 | gfx942 | gfx950")->capture_default_str();
    sub->add_option("--rocm-fp8", fp8, "ROCm fp8 flavour: e4m3fn | e4m3fnuz (default: the arch's own)");
    sub->add_option("--rocm-absorb", absorb, "ROCm absorbed weights: act | fp8 | fp8-dequant | mxfp4")
        ->capture_default_str();
  }
  RocmSettings parse() const {
    try {
      RocmSettings s;
      s.arch = parse_rocm_arch(arch);
      if (fp8 == "e4m3fn") s.fp8 = Fp8Flavor::E4M3FN;
      else if (fp8 == "e4m3fnuz") s.fp8 = Fp8Flavor::E4M3FNUZ;
      else if (!fp8.empty()) fail("unknown fp8 flavour '{}' (known: e4m3fn, e4m3fnuz)", fp8);
      s.absorb = parse_absorb_format(absorb);
      s.validate();
      return s;
    } catch (const Error& e) {
      throw UsageError(e.what());
    }
  }
};

// Each registers its subcommand; the callback runs it and returns the exit code through `rc`.
void add_dispatch_command(CLI::App& app, int& rc);
void add_attn_command(CLI::App& app, int& rc);
void add_attn_demo_command(CLI::App& app, int& rc);
void add_demo_command(CLI::App& app, int& rc);
void add_logits_command(CLI::App& app, int& rc);
void add_generate_command(CLI::App& app, int& rc);
void add_inspect_command(CLI::App& app, int& rc);
void add_bench_command(CLI::App& app, int& rc);
void add_serve_command(CLI::App& app, int& rc);
void add_bench_serve_command(CLI::App& app, int& rc);
void add_tokenize_command(CLI::App& app, int& rc);
void add_detokenize_command(CLI::App& app, int& rc);
void add_chat_template_command(CLI::App& app, int& rc);

}  // namespace mla::cli
