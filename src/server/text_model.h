// src/server/text_model.h — what the server needs of text: encode, decode, stream-decode, chat template.
//
// The server works with token ids alone when a model folder has no tokenizer (text prompts then get
// a 400 saying why). load_text_model() wraps mla::text's tokenizer and chat template.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mla::server {

class TextModel {
 public:
  virtual ~TextModel() = default;
  virtual std::vector<int32_t> encode(const std::string& text, bool add_special_tokens) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const = 0;
  // One token's raw bytes (a byte-level token may hold part of a UTF-8 character): logprobs' "bytes".
  virtual std::string token_bytes(int32_t id) const = 0;
  // Incremental detokenization: the concatenation of every push() and flush() equals decode().
  class Stream {
   public:
    virtual ~Stream() = default;
    virtual std::string push(int32_t id) = 0;
    virtual std::string flush() = 0;
  };
  virtual std::unique_ptr<Stream> stream(bool skip_special_tokens) const = 0;
  virtual bool has_chat_template() const = 0;
  // The prompt text of a conversation (OpenAI messages); tools: null or the request's tool list;
  // kwargs: more template variables (the request's chat_template_kwargs, e.g. {"thinking": true}).
  virtual std::string render_chat(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                  const nlohmann::ordered_json& tools, const nlohmann::ordered_json& kwargs) const = 0;
};

// The tokenizer (DIR/tokenizer.json) and, when DIR has one, the chat template; nullptr when DIR has
// no tokenizer.json. A broken tokenizer or template is an mla::Error.
std::unique_ptr<TextModel> load_text_model(const std::string& dir);

}  // namespace mla::server
