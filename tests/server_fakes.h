// tests/server_fakes.h — a byte-level TextModel for the server's protocol tests.
//
// Ids 0..255 are the bytes themselves; 256.. are named tokens ("<think>", the DeepSeek tool-call
// markers, "<eos>"). Stream decoding holds back an incomplete UTF-8 sequence, as the real one does.
#pragma once
#include <string>
#include <vector>

#include "server/text_model.h"

namespace mla::server::testing {

inline const std::vector<std::string>& named_tokens() {
  static const std::vector<std::string> t = {"<think>", "</think>", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>",
                                             "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>", "<eos>"};
  return t;
}
inline constexpr int32_t kEos = 256 + 7;

class ByteText : public TextModel {
 public:
  std::vector<int32_t> encode(const std::string& text, bool) const override {
    std::vector<int32_t> ids;
    size_t i = 0;
    while (i < text.size()) {
      bool named = false;
      for (size_t k = 0; k < named_tokens().size(); ++k)
        if (text.compare(i, named_tokens()[k].size(), named_tokens()[k]) == 0) {
          ids.push_back(int32_t(256 + k));
          i += named_tokens()[k].size();
          named = true;
          break;
        }
      if (!named) ids.push_back(static_cast<unsigned char>(text[i++]));
    }
    return ids;
  }
  static std::string bytes(int32_t id, bool skip_special) {
    if (id < 256) return std::string(1, char(id));
    if (skip_special && id == kEos) return "";
    return named_tokens().at(size_t(id - 256));
  }
  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const override {
    std::string s;
    for (int32_t id : ids) s += bytes(id, skip_special);
    return s;
  }
  std::string token_bytes(int32_t id) const override { return bytes(id, false); }
  class ByteStream : public Stream {
   public:
    explicit ByteStream(bool skip) : skip_(skip) {}
    std::string push(int32_t id) override {
      pending_ += bytes(id, skip_);
      // Emit up to the last complete UTF-8 character.
      size_t end = pending_.size(), i = pending_.size();
      while (i > 0 && (static_cast<unsigned char>(pending_[i - 1]) & 0xC0) == 0x80) --i;
      if (i > 0) {
        const unsigned char lead = static_cast<unsigned char>(pending_[i - 1]);
        const size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
        if (pending_.size() - (i - 1) < need) end = i - 1;
      }
      std::string out = pending_.substr(0, end);
      pending_.erase(0, end);
      return out;
    }
    std::string flush() override {
      std::string out;
      out.swap(pending_);
      return out;
    }

   private:
    bool skip_;
    std::string pending_;
  };
  std::unique_ptr<Stream> stream(bool skip_special) const override { return std::make_unique<ByteStream>(skip_special); }
  bool has_chat_template() const override { return true; }
  // "<role>: content\n" per message, then "assistant:" (+ "<think>" when think_open).
  std::string render_chat(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                          const nlohmann::ordered_json& tools, const nlohmann::ordered_json& kwargs) const override {
    std::string s;
    for (const auto& m : messages) s += m["role"].get<std::string>() + ": " + m.value("content", "") + "\n";
    if (!tools.is_null()) s += "tools: " + tools.dump() + "\n";
    if (add_generation_prompt) s += think_open || kwargs.value("thinking", false) ? "assistant:<think>" : "assistant:";
    return s;
  }
  bool think_open = false;
};

}  // namespace mla::server::testing
