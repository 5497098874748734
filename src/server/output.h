// src/server/output.h — from sampled tokens to what a client sees: text, stop strings, reasoning, tool calls.
//
// Every parser here is incremental: text arrives in arbitrary pieces (one per engine update), and a
// marker or stop string split across pieces is held back until it is known whole or known absent.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/service.h"
#include "server/text_model.h"

namespace mla::server {

// The length of the longest suffix of `text` that is a proper prefix of `marker` (a marker that may
// still be completing).
size_t partial_marker_suffix(std::string_view text, std::string_view marker);

// Where a UTF-8 text may be cut at or before `pos` without splitting a character.
size_t utf8_floor(std::string_view text, size_t pos);

// DeepSeek reasoning: "<think>…</think>" becomes reasoning_content. R1-style templates open <think>
// in the prompt (start_in_reasoning), so everything before "</think>" is reasoning; otherwise a
// reply that itself begins with "<think>" is reasoning up to "</think>", and any other reply is content.
class ReasoningParser {
 public:
  explicit ReasoningParser(bool start_in_reasoning);
  struct Out {
    std::string reasoning, content;
  };
  Out feed(std::string_view text);
  Out finish();  // what was held back
  static constexpr std::string_view kOpen = "<think>", kClose = "</think>";

 private:
  enum class State { START, REASONING, CONTENT } state_;
  bool at_reasoning_start_;  // nothing of the reasoning emitted yet (a repeated "<think>" is dropped)
  std::string buf_;
};

struct ToolCall {
  std::string id, name, arguments;  // arguments: the JSON text the model wrote
};

// One streamed piece of a tool call, as OpenAI streams them: the call's first delta carries its id
// and name (as soon as the name is known), the later ones the next piece of the argument text.
// Concatenating a call's pieces gives its whole `arguments`.
struct ToolCallDelta {
  int64_t index = 0;  // the call's place among the choice's calls
  bool first = false;  // the call's first delta: `id` and `name` are set
  std::string id, name;
  std::string arguments;  // the next piece of the arguments (may be empty)
};

// Adds streamed deltas to whole calls (what a non-streamed response and a client's accumulation give).
void accumulate_tool_calls(std::vector<ToolCall>& calls, const std::vector<ToolCallDelta>& deltas);

// DeepSeek tool calls, V3 and V3.1 formats:
//   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>…<｜tool▁calls▁end｜>
//   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>…<｜tool▁calls▁end｜>
// Text outside the block is content. A call starts (first delta) once its name is known: at the
// separator (V3.1) or the newline after the name (V3). Its arguments then stream as they arrive:
// trimmed of blank space, without the V3 ```json fence, holding back only a tail that could still
// be blank space at the end, the closing fence or the start of <｜tool▁call▁end｜>. Empty arguments
// are "{}".
class ToolCallParser {
 public:
  struct Out {
    std::string content;
    std::vector<ToolCallDelta> calls;
  };
  Out feed(std::string_view text);
  // What was held back: a started call's arguments as they stand (the model stopped inside it); text
  // of a block in which no call had started comes back as content, as the model wrote it.
  Out finish();
  int64_t calls_emitted() const { return calls_; }  // calls started
  static constexpr std::string_view kCallsBegin = "<｜tool▁calls▁begin｜>", kCallsEnd = "<｜tool▁calls▁end｜>",
                                    kCallBegin = "<｜tool▁call▁begin｜>", kCallEnd = "<｜tool▁call▁end｜>",
                                    kSep = "<｜tool▁sep｜>";

 private:
  enum class State { TEXT, CALLS, CALL } state_ = State::TEXT;
  // TEXT, CALLS: text not yet handled; CALL: the call's text after <｜tool▁call▁begin｜>, up to and
  // including what is not handled yet.
  std::string buf_;
  // The block's text since it opened or its last call started: content if no call follows.
  std::string raw_block_;
  int64_t calls_ = 0;      // calls started (the next call's index)
  bool block_has_calls_ = false;
  // The call being read (state CALL).
  bool named_ = false;      // its first delta went out
  bool fence_known_ = false, fenced_ = false;  // V3: whether the arguments sit inside a ``` fence
  bool v3_ = false;
  size_t args_at_ = 0;      // where the arguments begin in buf_ (leading blank space skipped once seen)
  size_t args_sent_ = 0;    // bytes of the arguments sent
  size_t scanned_ = 0;      // buf_ searched for <｜tool▁call▁end｜> up to here
  void call(Out& out, bool ended, size_t n);  // the call in buf_[0, n)
};

// What one choice sends in one update.
struct Delta {
  std::string text;       // completions: the text; chat: content
  std::string reasoning;  // chat only
  std::vector<ToolCallDelta> tool_calls;
  bool empty() const { return text.empty() && reasoning.empty() && tool_calls.empty(); }
};

// Stop strings, evaluated on the scheduler thread through GenerateRequest::stop_check: the decoded
// text of each choice, the stop string's position, and how many trailing tokens lie wholly past it.
// `cut(index)` (read after that choice's last update has been received) is the text length to keep,
// or -1 when no stop string matched.
class StopStrings {
 public:
  StopStrings(const TextModel& text, std::vector<std::string> stops, bool skip_special, int64_t choices,
              std::vector<int32_t> silent_ids);
  int64_t check(int64_t index, const std::vector<int32_t>& tokens);
  int64_t cut(int64_t index) const { return choices_.at(size_t(index)).cut; }

 private:
  struct Choice {
    std::unique_ptr<TextModel::Stream> detok;
    std::string text;
    std::vector<size_t> starts;  // text offset where each token's text begins
    size_t searched = 0;
    int64_t cut = -1;
  };
  std::vector<std::string> stops_;
  size_t longest_ = 0;
  std::vector<int32_t> silent_;
  std::vector<Choice> choices_;
};

// One choice's output: detokenization (the finishing EOS / stop token adds no text), stop-string
// truncation with hold-back, and for chat the reasoning and tool-call parsers.
class ChoiceOutput {
 public:
  ChoiceOutput(const TextModel* text, bool skip_special, size_t stop_holdback, bool chat, bool reasoning_open,
               std::vector<int32_t> silent_ids);
  // `cut`: the text length to keep when a stop string ended the choice, else -1.
  Delta push(const engine::ChoiceUpdate& u, int64_t cut);
  const std::vector<int32_t>& token_ids() const { return ids_; }
  bool finished() const { return finish_ != engine::FinishReason::NONE; }
  engine::FinishReason finish() const { return finish_; }
  // OpenAI's finish_reason: "tool_calls" when a chat choice stopped after calling tools.
  std::string finish_reason() const;
  int64_t text_length() const { return emitted_; }

 private:
  const TextModel* text_;
  std::unique_ptr<TextModel::Stream> detok_;
  size_t holdback_;
  bool chat_;
  std::vector<int32_t> silent_;
  std::vector<int32_t> ids_;
  std::string pending_;
  int64_t emitted_ = 0;
  engine::FinishReason finish_ = engine::FinishReason::NONE;
  ReasoningParser reasoning_;
  ToolCallParser tools_;
};

}  // namespace mla::server
