// tests/server_fakes.h — a byte-level TextModel and a scripted Service for the server's tests.
//
// Ids 0..255 are the bytes themselves; 256.. are named tokens ("<think>", the DeepSeek tool-call
// markers, "<eos>"). Stream decoding holds back an incomplete UTF-8 sequence, as the real one does.
#pragma once
#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/service.h"
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

// A Service whose every choice answers script(prompt) (byte-level ids, then EOS), one token per update
// (1 ms apart), on its own thread, calling stop_check as the engine does. It stands in for the engine
// where a random test model cannot be made to emit what a test needs (reasoning, tool calls).
class ScriptedService : public engine::Service {
 public:
  using Script = std::function<std::string(const std::vector<int32_t>& prompt)>;
  explicit ScriptedService(Script script) : script_(std::move(script)) {}
  ~ScriptedService() override { shutdown(false); }
  engine::RequestHandle submit(engine::GenerateRequest req, std::function<void(const engine::RequestUpdate&)> cb) override {
    std::lock_guard<std::mutex> l(m_);
    const engine::RequestHandle h = next_++;
    auto aborted = std::make_shared<std::atomic<bool>>(false);
    aborted_[h] = aborted;
    threads_.emplace_back([this, req = std::move(req), cb = std::move(cb), aborted] {
      std::vector<int32_t> ids = ByteText().encode(script_(req.prompt), false);
      ids.push_back(kEos);
      std::vector<std::vector<int32_t>> out(size_t(req.n));
      std::vector<bool> done(size_t(req.n), false);
      int64_t completion = 0;
      for (size_t t = 0; t < ids.size(); ++t) {
        engine::RequestUpdate u;
        u.prompt_tokens = int64_t(req.prompt.size());
        for (int64_t c = 0; c < req.n; ++c) {
          if (done[size_t(c)]) continue;
          engine::ChoiceUpdate cu;
          cu.index = c;
          if (aborted->load()) {
            cu.finish = engine::FinishReason::ABORT;
          } else {
            out[size_t(c)].push_back(ids[t]);
            cu.new_tokens = {ids[t]};
            ++completion;
            if (ids[t] == kEos) cu.finish = engine::FinishReason::STOP;
            else if (int64_t(out[size_t(c)].size()) >= req.params.max_tokens) cu.finish = engine::FinishReason::LENGTH;
            if (req.stop_check) {
              const int64_t drop = req.stop_check(c, out[size_t(c)]);
              if (drop >= 0) {
                cu.new_tokens.resize(size_t(std::max<int64_t>(0, 1 - drop)));
                completion -= std::min<int64_t>(drop, 1);
                cu.finish = engine::FinishReason::STOP;
              }
            }
          }
          if (cu.finish != engine::FinishReason::NONE) done[size_t(c)] = true;
          u.choices.push_back(cu);
        }
        u.completion_tokens = completion;
        u.finished = std::all_of(done.begin(), done.end(), [](bool d) { return d; });
        cb(u);
        if (u.finished) return;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    });
    return h;
  }
  void abort(engine::RequestHandle h) override {
    std::lock_guard<std::mutex> l(m_);
    if (auto it = aborted_.find(h); it != aborted_.end() && !it->second->exchange(true)) ++aborts;
  }
  std::atomic<int> aborts{0};  // requests the server aborted
  engine::MetricsSnapshot metrics() const override { return {}; }
  std::shared_future<int64_t> flush_cache() override {
    std::promise<int64_t> done;
    done.set_value(0);
    return done.get_future().share();
  }
  void shutdown(bool) override {
    std::vector<std::thread> ts;
    {
      std::lock_guard<std::mutex> l(m_);
      ts.swap(threads_);
    }
    for (auto& t : ts) t.join();
  }
  int64_t vocab_size() const override { return 256 + 8; }
  int64_t max_context() const override { return 4096; }
  int32_t eos_token_id() const override { return kEos; }

 private:
  Script script_;
  std::mutex m_;
  engine::RequestHandle next_ = 1;
  std::map<engine::RequestHandle, std::shared_ptr<std::atomic<bool>>> aborted_;
  std::vector<std::thread> threads_;
};

}  // namespace mla::server::testing
