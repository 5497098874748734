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
// 2 bad command-line values; 3 a tensor-parallel rank was lost (the watchdog of mla/ranks.h).
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

// A text prompt through the model's own tokenizer (tokenizer.json + tokenizer_config.json in
// `tokenizer_dir`): `prompt` encoded with the special tokens the tokenizer adds, or, when
// `messages_file` is given, the chat template rendered for that conversation with the generation
// prompt, encoded without special tokens (the template writes them). Bad files and invalid UTF-8
// are usage errors; a broken tokenizer or template is an Error.
struct TextPrompt {
  std::string text;
  std::vector<int32_t> ids;
};
TextPrompt text_prompt(const std::string& tokenizer_dir, const std::string& prompt, const std::string& messages_file);

// Each registers its subcommand; the callback runs it and returns the exit code through `rc`.
void add_dispatch_command(CLI::App& app, int& rc);
void add_attn_command(CLI::App& app, int& rc);
void add_attn_demo_command(CLI::App& app, int& rc);
void add_demo_command(CLI::App& app, int& rc);
void add_logits_command(CLI::App& app, int& rc);
void add_generate_command(CLI::App& app, int& rc);
void add_inspect_command(CLI::App& app, int& rc);
void add_shape_command(CLI::App& app, int& rc);
void add_bench_command(CLI::App& app, int& rc);
void add_serve_command(CLI::App& app, int& rc);
void add_bench_serve_command(CLI::App& app, int& rc);
void add_bench_model_command(CLI::App& app, int& rc);
void add_tokenize_command(CLI::App& app, int& rc);
void add_detokenize_command(CLI::App& app, int& rc);
void add_chat_template_command(CLI::App& app, int& rc);

}  // namespace mla::cli
