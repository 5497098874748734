// src/server/text_model.cpp — TextModel over mla::text's tokenizer and chat template.
#include "server/text_model.h"

#include <filesystem>
#include <fstream>
#include <optional>

#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace mla::server {
namespace {

class HfText : public TextModel {
 public:
  HfText(text::Tokenizer tok, std::optional<text::ChatTemplate> tmpl) : tok_(std::move(tok)), tmpl_(std::move(tmpl)) {}
  std::vector<int32_t> encode(const std::string& t, bool add_special_tokens) const override {
    return tok_.encode(t, add_special_tokens);
  }
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const override {
    return tok_.decode(ids, skip_special_tokens);
  }
  std::string token_bytes(int32_t id) const override { return tok_.token_bytes(id, false); }
  class HfStream : public Stream {
   public:
    HfStream(const text::Tokenizer& t, bool skip) : dec_(t, skip) {}
    std::string push(int32_t id) override { return dec_.push(id); }
    std::string flush() override { return dec_.flush(); }

   private:
    text::StreamDecoder dec_;
  };
  std::unique_ptr<Stream> stream(bool skip_special_tokens) const override {
    return std::make_unique<HfStream>(tok_, skip_special_tokens);
  }
  bool has_chat_template() const override { return tmpl_.has_value(); }
  std::string render_chat(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                          const nlohmann::ordered_json& tools, const nlohmann::ordered_json& kwargs) const override {
    return tmpl_->render(messages, add_generation_prompt, tools, kwargs);
  }

 private:
  text::Tokenizer tok_;
  std::optional<text::ChatTemplate> tmpl_;
};

}  // namespace

std::unique_ptr<TextModel> load_text_model(const std::string& dir) {
  namespace fs = std::filesystem;
  if (!fs::exists(fs::path(dir) / "tokenizer.json")) return nullptr;
  text::Tokenizer tok = text::Tokenizer::load(dir);
  std::optional<text::ChatTemplate> tmpl;
  // A template lives in chat_template.jinja or in tokenizer_config.json's "chat_template".
  bool has_template = fs::exists(fs::path(dir) / "chat_template.jinja");
  if (!has_template && fs::exists(fs::path(dir) / "tokenizer_config.json")) {
    std::ifstream in(fs::path(dir) / "tokenizer_config.json");
    nlohmann::json cfg = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    has_template = cfg.is_object() && cfg.contains("chat_template") && !cfg["chat_template"].is_null();
  }
  if (has_template) tmpl = text::ChatTemplate::load(dir);
  return std::make_unique<HfText>(std::move(tok), std::move(tmpl));
}

}  // namespace mla::server
