// mla chat-template — the model's chat template rendered for a conversation, as transformers'
// apply_chat_template(..., tokenize=False) renders it; with --json also the ids the tokenizer gives
// that text (encode without special tokens: the template writes the BOS itself).
#include <cstdio>
#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>

#include "cli.h"
#include "mla/error.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace mla::cli {
namespace {

// A JSON file given on the command line: unreadable or malformed → UsageError (exit 2).
nlohmann::ordered_json read_json_file(const std::string& path, const char* option) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError(fmt::format("{}: cannot read '{}'", option, path));
  const std::string text(std::istreambuf_iterator<char>(in), {});
  try {
    return nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(fmt::format("{}: '{}' is not valid JSON ({})", option, path, e.what()));
  }
}

}  // namespace

void add_chat_template_command(CLI::App& app, int& rc) {
  struct Opts {
    std::string tokenizer, messages_file, tools_file;
    bool add_generation_prompt = false, json = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* sub = app.add_subcommand("chat-template", "Render the model's chat template for a conversation");
  sub->add_option("--tokenizer", o->tokenizer, "model folder with tokenizer_config.json (and tokenizer.json)")
      ->required();
  sub->add_option("--messages-file", o->messages_file, "JSON array of OpenAI-style messages")->required();
  sub->add_flag("--add-generation-prompt", o->add_generation_prompt, "end with the assistant's turn opening");
  sub->add_option("--tools-file", o->tools_file, "JSON array of tool definitions");
  sub->add_flag("--json", o->json, "{\"text\": ..., \"ids\": [...]} on stdout");
  sub->callback([o, &rc] {
    const nlohmann::ordered_json messages = read_json_file(o->messages_file, "--messages-file");
    if (!messages.is_array()) throw UsageError("--messages-file: expected a JSON array of messages");
    for (size_t k = 0; k < messages.size(); ++k)
      if (!messages[k].is_object()) throw UsageError(fmt::format("--messages-file: message {} is not a JSON object", k));
    nlohmann::ordered_json tools = nullptr;
    if (!o->tools_file.empty()) {
      tools = read_json_file(o->tools_file, "--tools-file");
      if (!tools.is_array()) throw UsageError("--tools-file: expected a JSON array of tools");
    }
    const text::ChatTemplate tmpl = text::ChatTemplate::load(o->tokenizer);
    const std::string prompt = tmpl.render(messages, o->add_generation_prompt, tools);
    if (o->json) {
      const text::Tokenizer tok = text::Tokenizer::load(o->tokenizer);
      const std::vector<int32_t> ids = tok.encode(prompt, /*add_special_tokens=*/false);
      nlohmann::ordered_json j = {{"text", prompt}, {"ids", ids}};
      std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    } else {
      std::fwrite(prompt.data(), 1, prompt.size(), stdout);
    }
    rc = 0;
  });
}

}  // namespace mla::cli
