// tools/cli.h — the mla command line: subcommands and the helpers they share.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

namespace mla::cli {

// Exit codes: 0 success; 1 the work failed (bad model, batch or method at run time);
// 2 bad command-line values.
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

// Thrown for bad command-line values; main prints the message and exits with kExitUsage.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The text parsers (tools/cli_util.cpp); bad text throws UsageError naming `what`.
// "3,17,42" → {3, 17, 42}: non-negative integers, no empty items. `what` names the option.
std::vector<int64_t> parse_int_list(const std::string& text, const std::string& what);
// "4096:512,0:17" → {(4096, 512), (0, 17)}: PREFIX:NEW per request (--requests).
std::vector<std::pair<int64_t, int64_t>> parse_requests(const std::string& text);
// Ids separated by commas and/or whitespace (a --prompt-file); empty when there are none.
std::vector<int64_t> parse_id_text(const std::string& text, const std::string& what);

// Each registers its subcommand; the callback runs it and returns the exit code through `rc`.
void add_dispatch_command(CLI::App& app, int& rc);
void add_attn_command(CLI::App& app, int& rc);
void add_attn_demo_command(CLI::App& app, int& rc);
void add_demo_command(CLI::App& app, int& rc);
void add_logits_command(CLI::App& app, int& rc);
void add_generate_command(CLI::App& app, int& rc);
void add_inspect_command(CLI::App& app, int& rc);
void add_bench_command(CLI::App& app, int& rc);

}  // namespace mla::cli
