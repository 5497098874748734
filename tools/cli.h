// tools/cli.h — the mla command line: subcommands and the helpers they share.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli_options.h"  // the option groups
#include "cli_util.h"     // UsageError and the text parsers
#include "mla/error.h"
#include "mla/platform_ops.h"

namespace mla::cli {

// Exit codes: 0 success; 1 the work failed (bad model, batch or method at run time);
// 2 bad command-line values.
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

// Each registers its subcommand; the callback runs it and returns the exit code through `rc`.
void add_dispatch_command(CLI::App& app, int& rc);
void add_attn_command(CLI::App& app, int& rc);
void add_attn_demo_command(CLI::App& app, int& rc);
void add_demo_command(CLI::App& app, int& rc);
void add_logits_command(CLI::App& app, int& rc);
void add_generate_command(CLI::App& app, int& rc);
void add_inspect_command(CLI::App& app, int& rc);
void add_bench_command(CLI::App& app, int& rc);
void add_tokenize_command(CLI::App& app, int& rc);
void add_detokenize_command(CLI::App& app, int& rc);
void add_chat_template_command(CLI::App& app, int& rc);

}  // namespace mla::cli
