// src/server/output.cpp — incremental detokenization, stop strings, DeepSeek reasoning and tool calls.
#include "server/output.h"

#include <algorithm>
#include <random>

#include <fmt/format.h>

namespace mla::server {

size_t partial_marker_suffix(std::string_view text, std::string_view marker) {
  const size_t most = std::min(text.size(), marker.size() - 1);
  for (size_t k = most; k > 0; --k)
    if (text.substr(text.size() - k) == marker.substr(0, k)) return k;
  return 0;
}

size_t utf8_floor(std::string_view text, size_t pos) {
  pos = std::min(pos, text.size());
  while (pos > 0 && pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) --pos;
  return pos;
}

// ---- reasoning ----

ReasoningParser::ReasoningParser(bool start_in_reasoning)
    : state_(start_in_reasoning ? State::REASONING : State::START), at_reasoning_start_(true) {}

ReasoningParser::Out ReasoningParser::feed(std::string_view text) {
  Out out;
  buf_ += text;
  for (;;) {
    if (state_ == State::START) {
      // A reply that opens with "<think>" (after blank space) reasons; anything else is content.
      const size_t ws = buf_.find_first_not_of(" \t\r\n");
      if (ws == std::string::npos) return out;  // blank so far: undecided
      std::string_view rest = std::string_view(buf_).substr(ws);
      if (rest.size() < kOpen.size() && kOpen.substr(0, rest.size()) == rest) return out;  // "<thi": undecided
      if (rest.substr(0, kOpen.size()) == kOpen) {
        buf_.erase(0, ws + kOpen.size());
        state_ = State::REASONING;
        at_reasoning_start_ = false;
        continue;
      }
      state_ = State::CONTENT;
      continue;
    }
    if (state_ == State::REASONING) {
      if (at_reasoning_start_) {  // the model may open <think> again although the prompt did
        const size_t ws = buf_.find_first_not_of(" \t\r\n");
        if (ws == std::string::npos) return out;
        std::string_view rest = std::string_view(buf_).substr(ws);
        if (rest.size() < kOpen.size() && kOpen.substr(0, rest.size()) == rest) return out;
        if (rest.substr(0, kOpen.size()) == kOpen) buf_.erase(0, ws + kOpen.size());
        at_reasoning_start_ = false;
      }
      const size_t end = buf_.find(kClose);
      if (end != std::string::npos) {
        out.reasoning += buf_.substr(0, end);
        buf_.erase(0, end + kClose.size());
        state_ = State::CONTENT;
        continue;
      }
      const size_t keep = partial_marker_suffix(buf_, kClose);
      out.reasoning += buf_.substr(0, buf_.size() - keep);
      buf_.erase(0, buf_.size() - keep);
      return out;
    }
    out.content += buf_;
    buf_.clear();
    return out;
  }
}

ReasoningParser::Out ReasoningParser::finish() {
  Out out;
  if (state_ == State::REASONING) out.reasoning = std::move(buf_);
  else out.content = std::move(buf_);
  buf_.clear();
  return out;
}

// ---- tool calls ----

namespace {

bool blank(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

std::string trim(std::string_view s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return "";
  const size_t e = s.find_last_not_of(" \t\r\n");
  return std::string(s.substr(b, e - b + 1));
}

std::string tool_call_id() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("call_{:016x}{:08x}", rng(), uint32_t(rng()));
}

constexpr std::string_view kFence = "```";

// How much of arguments `a` (leading blank space skipped) is certain whatever follows: the end may
// still be trimmed of blank space and, inside a fence, of the closing ``` with the blank space before it.
size_t args_certain(std::string_view a, bool fenced) {
  size_t e = a.size();
  while (e > 0 && blank(a[e - 1])) --e;
  if (fenced) {
    size_t ticks = 0;
    while (e > 0 && ticks < kFence.size() && a[e - 1] == '`') --e, ++ticks;
    if (ticks > 0)
      while (e > 0 && blank(a[e - 1])) --e;
  }
  return e;
}

// The arguments of a call that has ended: trimmed, without the closing fence.
std::string args_whole(std::string_view a, bool fenced) {
  std::string s = trim(a);
  if (fenced && s.size() >= kFence.size() && s.compare(s.size() - kFence.size(), kFence.size(), kFence) == 0) {
    s.resize(s.size() - kFence.size());
    s = trim(s);
  }
  return s;
}

}  // namespace

void accumulate_tool_calls(std::vector<ToolCall>& calls, const std::vector<ToolCallDelta>& deltas) {
  for (const ToolCallDelta& d : deltas) {
    if (d.first) {
      if (calls.size() <= size_t(d.index)) calls.resize(size_t(d.index) + 1);
      calls[size_t(d.index)].id = d.id;
      calls[size_t(d.index)].name = d.name;
    }
    calls.at(size_t(d.index)).arguments += d.arguments;
  }
}

// The call in buf_[0, n) (the text after <｜tool▁call▁begin｜>): its first delta once the name is
// known, then what is certain of its arguments. `ended`: buf_[n] is <｜tool▁call▁end｜> (or the text
// stopped there).
void ToolCallParser::call(Out& out, bool ended, size_t n) {
  const std::string_view region = std::string_view(buf_).substr(0, n);
  if (!named_) {
    std::string name;
    const size_t sep = region.find(kSep);
    if (sep == std::string_view::npos) {  // no separator: a name alone, once the call ends
      if (!ended) return;
      name = trim(region);
      args_at_ = n;
    } else {
      const std::string head = trim(region.substr(0, sep));
      const size_t rest = sep + kSep.size();
      const size_t nl = head == "function" ? region.find('\n', rest) : std::string_view::npos;
      if (nl != std::string_view::npos) {  // V3: function<sep>NAME\n```json\nARGS\n```
        v3_ = true;
        name = trim(region.substr(rest, nl - rest));
        args_at_ = nl + 1;
      } else if (head == "function" && !ended) {
        return;  // V3's name line may still be arriving
      } else {  // V3.1: NAME<sep>ARGS
        name = head;
        args_at_ = rest;
      }
    }
    named_ = true;
    ToolCallDelta d;
    d.index = calls_++;
    d.first = true;
    d.id = tool_call_id();
    d.name = std::move(name);
    out.calls.push_back(std::move(d));
    raw_block_.clear();
    block_has_calls_ = true;
  }
  while (args_at_ < n && blank(buf_[args_at_])) ++args_at_;
  if (v3_ && !fence_known_) {  // never stream the fence: wait until it is known present or absent
    const std::string_view a = region.substr(args_at_);
    if (!ended && a.size() < kFence.size() && kFence.substr(0, a.size()) == a) return;
    if (a.substr(0, kFence.size()) == kFence) {  // drop the fence's line ("```json")
      const size_t nl = region.find('\n', args_at_);
      if (nl == std::string_view::npos && !ended) return;
      args_at_ = nl == std::string_view::npos ? n : nl + 1;
      fenced_ = true;
      while (args_at_ < n && blank(buf_[args_at_])) ++args_at_;
    }
    fence_known_ = true;
  }
  const std::string_view a = region.substr(std::min(args_at_, n));
  std::string piece;
  if (ended) {
    std::string whole = args_whole(a, fenced_);
    if (whole.empty()) whole = "{}";
    if (whole.size() > args_sent_) piece = whole.substr(args_sent_);
  } else {
    const size_t certain = args_certain(a, fenced_);
    if (certain > args_sent_) piece = std::string(a.substr(args_sent_, certain - args_sent_));
  }
  args_sent_ += piece.size();
  if (piece.empty()) return;
  if (!out.calls.empty() && out.calls.back().index == calls_ - 1) {
    out.calls.back().arguments += piece;
  } else {
    ToolCallDelta d;
    d.index = calls_ - 1;
    d.arguments = std::move(piece);
    out.calls.push_back(std::move(d));
  }
}

ToolCallParser::Out ToolCallParser::feed(std::string_view text) {
  Out out;
  buf_ += text;
  for (;;) {
    if (state_ == State::TEXT) {
      // The block opens with <｜tool▁calls▁begin｜>; a lone <｜tool▁call▁begin｜> opens it too.
      size_t at = buf_.find(kCallsBegin);
      size_t skip = kCallsBegin.size();
      const size_t at1 = buf_.find(kCallBegin);
      if (at1 != std::string::npos && (at == std::string::npos || at1 < at)) at = at1, skip = 0;
      if (at == std::string::npos) {
        const size_t keep = std::max(partial_marker_suffix(buf_, kCallsBegin), partial_marker_suffix(buf_, kCallBegin));
        out.content += buf_.substr(0, buf_.size() - keep);
        buf_.erase(0, buf_.size() - keep);
        return out;
      }
      out.content += buf_.substr(0, at);
      raw_block_ = buf_.substr(at, skip);
      block_has_calls_ = false;
      buf_.erase(0, at + skip);
      state_ = State::CALLS;
      continue;
    }
    if (state_ == State::CALL) {
      // Only the new text can complete <｜tool▁call▁end｜>: the search starts where the last one stopped.
      const size_t from = scanned_ >= kCallEnd.size() ? scanned_ - kCallEnd.size() + 1 : 0;
      const size_t end = buf_.find(kCallEnd, from);
      if (end == std::string::npos) {
        scanned_ = buf_.size();
        call(out, false, buf_.size() - partial_marker_suffix(buf_, kCallEnd));
        return out;
      }
      call(out, true, end);
      buf_.erase(0, end + kCallEnd.size());
      named_ = fence_known_ = fenced_ = v3_ = false;
      args_at_ = args_sent_ = scanned_ = 0;
      state_ = State::CALLS;
      continue;
    }
    // Inside the block: calls, then the end marker; blank space between them is dropped.
    const size_t ws = buf_.find_first_not_of(" \t\r\n");
    if (ws == std::string::npos) return out;
    if (ws > 0) {
      raw_block_ += buf_.substr(0, ws);
      buf_.erase(0, ws);
    }
    if (buf_.rfind(kCallsEnd, 0) == 0) {
      buf_.erase(0, kCallsEnd.size());
      raw_block_.clear();
      state_ = State::TEXT;
      continue;
    }
    if (buf_.rfind(kCallBegin, 0) == 0) {
      raw_block_ += kCallBegin;
      buf_.erase(0, kCallBegin.size());
      state_ = State::CALL;
      continue;
    }
    auto arriving = [&](std::string_view m) { return buf_.size() < m.size() && m.substr(0, buf_.size()) == buf_; };
    if (arriving(kCallsEnd) || arriving(kCallBegin)) return out;  // a marker still arriving
    // Something else inside the block: the block is over; the rest is content.
    raw_block_.clear();
    state_ = State::TEXT;
  }
}

ToolCallParser::Out ToolCallParser::finish() {
  Out out;
  if (state_ == State::CALL && named_) {
    call(out, true, buf_.size() - partial_marker_suffix(buf_, kCallEnd));  // the arguments as far as they got
  } else if (state_ == State::CALLS && block_has_calls_) {
    out.content = buf_;  // an unclosed block: only a marker's start can be left
  } else if (state_ != State::TEXT) {
    out.content = raw_block_ + buf_;  // no call started in the block: the text as written
  } else {
    out.content = buf_;
  }
  buf_.clear();
  raw_block_.clear();
  named_ = fence_known_ = fenced_ = v3_ = false;
  args_at_ = args_sent_ = scanned_ = 0;
  state_ = State::TEXT;
  return out;
}

// ---- stop strings (scheduler thread) ----

StopStrings::StopStrings(const TextModel& text, std::vector<std::string> stops, bool skip_special, int64_t choices,
                         std::vector<int32_t> silent_ids)
    : stops_(std::move(stops)), silent_(std::move(silent_ids)) {
  for (const auto& s : stops_) longest_ = std::max(longest_, s.size());
  choices_.resize(size_t(choices));
  for (Choice& c : choices_) c.detok = text.stream(skip_special);
}

int64_t StopStrings::check(int64_t index, const std::vector<int32_t>& tokens) {
  Choice& c = choices_.at(size_t(index));
  if (c.cut >= 0) return -1;
  while (c.starts.size() < tokens.size()) {
    const int32_t id = tokens[c.starts.size()];
    c.starts.push_back(c.text.size());
    if (std::find(silent_.begin(), silent_.end(), id) == silent_.end()) c.text += c.detok->push(id);
  }
  const size_t from = c.searched >= longest_ ? c.searched - longest_ + 1 : 0;
  size_t best = std::string::npos;
  for (const auto& s : stops_) best = std::min(best, c.text.find(s, from));
  c.searched = c.text.size();
  if (best == std::string::npos) return -1;
  c.cut = int64_t(best);
  int64_t drop = 0;
  // Tokens whose text begins at or past the stop string are dropped (at least the one that completed
  // it is kept when the stop string starts inside it).
  for (size_t i = tokens.size(); i-- > 0 && c.starts[i] >= best;) ++drop;
  return drop;
}

// ---- one choice ----

ChoiceOutput::ChoiceOutput(const TextModel* text, bool skip_special, size_t stop_holdback, bool chat,
                           bool reasoning_open, std::vector<int32_t> silent_ids)
    : text_(text), holdback_(stop_holdback), chat_(chat), silent_(std::move(silent_ids)), reasoning_(reasoning_open) {
  if (text_) detok_ = text_->stream(skip_special);
}

Delta ChoiceOutput::push(const engine::ChoiceUpdate& u, int64_t cut) {
  Delta d;
  for (size_t i = 0; i < u.new_tokens.size(); ++i) {
    const int32_t id = u.new_tokens[i];
    ids_.push_back(id);
    if (!detok_) continue;
    // The token that finished the choice (EOS or a stop token) adds no text.
    const bool last = i + 1 == u.new_tokens.size() && u.finish == engine::FinishReason::STOP;
    if (last && std::find(silent_.begin(), silent_.end(), id) != silent_.end()) continue;
    pending_ += detok_->push(id);
  }
  std::string now;
  if (u.finish != engine::FinishReason::NONE) {
    finish_ = u.finish;
    if (detok_) pending_ += detok_->flush();
    if (cut >= 0) {
      const int64_t keep = std::max<int64_t>(0, cut - emitted_);
      if (keep < int64_t(pending_.size())) pending_.resize(size_t(keep));
    }
    now = std::move(pending_);
    pending_.clear();
  } else {
    const size_t n = pending_.size() > holdback_ ? utf8_floor(pending_, pending_.size() - holdback_) : 0;
    now = pending_.substr(0, n);
    pending_.erase(0, n);
  }
  emitted_ += int64_t(now.size());
  if (!chat_) {
    d.text = std::move(now);
    return d;
  }
  ReasoningParser::Out r = reasoning_.feed(now);
  if (finished()) {
    ReasoningParser::Out f = reasoning_.finish();
    r.reasoning += f.reasoning;
    r.content += f.content;
  }
  d.reasoning = std::move(r.reasoning);
  ToolCallParser::Out t = tools_.feed(r.content);
  if (finished()) {
    ToolCallParser::Out f = tools_.finish();
    t.content += f.content;
  }
  d.text = std::move(t.content);
  d.tool_calls = std::move(t.calls);
  return d;
}

std::string ChoiceOutput::finish_reason() const {
  if (chat_ && finish_ == engine::FinishReason::STOP && tools_.calls_emitted() > 0) return "tool_calls";
  switch (finish_) {
    case engine::FinishReason::STOP: return "stop";
    case engine::FinishReason::LENGTH: return "length";
    case engine::FinishReason::ABORT: return "abort";
    default: return "";
  }
}

}  // namespace mla::server
