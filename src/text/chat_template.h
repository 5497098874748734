// text/chat_template.h — the model's own chat template (tokenizer_config.json's chat_template),
// rendered as transformers' apply_chat_template(..., tokenize=False) renders it.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "text/jinja.h"

namespace mla::text {

class ChatTemplate {
 public:
  // DIR/chat_template.jinja when present (transformers prefers it), else DIR/tokenizer_config.json's
  // "chat_template": a string, or a list of {"name", "template"} from which "default" is taken.
  // bos_token / eos_token / unk_token / pad_token: strings or AddedToken objects ({"content": ...}).
  // A missing or unparsable template → mla::Error naming the file (and line:column in the template).
  static ChatTemplate load(const std::string& dir);
  // The same from the text of a tokenizer_config.json (`what` names it in errors).
  static ChatTemplate from_config(const std::string& config_json, const std::string& what = "tokenizer_config.json");
  ChatTemplate(const std::string& source, std::string bos_token, std::string eos_token);

  // The prompt for `messages` (a JSON array of {"role", "content", "tool_calls", ...}). The context
  // is transformers': messages, tools (none when not given), documents (none), add_generation_prompt,
  // the special tokens, then every member of `extra` (e.g. {"thinking": true}). Objects keep their
  // order with ordered_json; a plain nlohmann::json has its keys sorted already.
  std::string render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                     const nlohmann::ordered_json& tools = nullptr,
                     const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;
  std::string render(const nlohmann::json& messages, bool add_generation_prompt, const nlohmann::json& tools = nullptr,
                     const nlohmann::json& extra = nlohmann::json::object()) const;

  const std::string& source() const { return source_; }
  const std::string& bos_token() const { return bos_; }
  const std::string& eos_token() const { return eos_; }

 private:
  std::string source_;
  jinja::Template tmpl_;
  std::string bos_, eos_, unk_, pad_;
  bool has_unk_ = false, has_pad_ = false;
};

}  // namespace mla::text
