// src/server/protocol.cpp — OpenAI request parsing and validation, responses' shared pieces.
#include "server/protocol.h"

#include <cmath>
#include <limits>
#include <random>

#include <fmt/format.h>

namespace mla::server {

ojson ApiError::body() const {
  ojson e;
  e["message"] = message;
  e["type"] = type;
  e["param"] = param.empty() ? ojson(nullptr) : ojson(param);
  e["code"] = code.empty() ? ojson(nullptr) : ojson(code);
  ojson j;
  j["error"] = e;
  return j;
}

ApiError bad_request(std::string message, std::string param) {
  ApiError e;
  e.status = 400;
  e.message = std::move(message);
  e.param = std::move(param);
  return e;
}

namespace {

std::string show(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

// Reads the request object's fields; null counts as absent (OpenAI clients send nulls).
class Reader {
 public:
  explicit Reader(const json& obj) : obj_(obj) {}
  const json* find(const char* key) const {
    auto it = obj_.find(key);
    return it == obj_.end() || it->is_null() ? nullptr : &*it;
  }
  [[noreturn]] static void bad(const char* key, const char* what, const json& v) {
    throw bad_request(fmt::format("'{}' must be {} (got {})", key, what, show(v)), key);
  }
  std::optional<bool> boolean(const char* key) const {
    const json* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) bad(key, "a boolean", *v);
    return v->get<bool>();
  }
  std::optional<double> number(const char* key, double lo, double hi, const char* what) const {
    const json* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_number()) bad(key, what, *v);
    const double x = v->get<double>();
    if (!std::isfinite(x) || x < lo || x > hi) bad(key, what, *v);
    return x;
  }
  std::optional<int64_t> integer(const char* key, int64_t lo, int64_t hi, const char* what) const {
    const json* v = find(key);
    if (!v) return std::nullopt;
    int64_t x = 0;
    if (v->is_number_unsigned()) {
      if (v->get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max())) bad(key, what, *v);
      x = int64_t(v->get<uint64_t>());
    } else if (v->is_number_integer()) {
      x = v->get<int64_t>();
    } else if (v->is_number_float() && std::floor(v->get<double>()) == v->get<double>() &&
               std::fabs(v->get<double>()) < 9e15) {
      x = int64_t(v->get<double>());
    } else {
      bad(key, what, *v);
    }
    if (x < lo || x > hi) bad(key, what, *v);
    return x;
  }
  std::optional<std::string> string(const char* key) const {
    const json* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_string()) bad(key, "a string", *v);
    return v->get<std::string>();
  }

 private:
  const json& obj_;
};

constexpr int64_t kMaxN = 128;
constexpr int64_t kMaxTopLogprobs = 20;
constexpr int64_t kI32 = std::numeric_limits<int32_t>::max();

// A token-id list: every element an integer id (range checked against the vocabulary later).
bool is_id_list(const json& v) {
  if (!v.is_array() || v.empty()) return false;
  for (const json& x : v)
    if (!x.is_number_integer()) return false;
  return true;
}

std::vector<int64_t> id_list(const json& v) {
  std::vector<int64_t> ids;
  for (const json& x : v) {
    if (x.is_number_unsigned() && x.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
      ids.push_back(std::numeric_limits<int64_t>::max());
    else
      ids.push_back(x.get<int64_t>());
  }
  return ids;
}

void parse_prompts(const json& body, ParsedRequest& r) {
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) throw bad_request("'prompt' is required", "prompt");
  const json& p = *it;
  const char* what = "a string, a list of token ids, or a list of strings or of token-id lists";
  if (p.is_string()) {
    r.prompts.emplace_back(p.get<std::string>());
  } else if (is_id_list(p)) {
    r.prompts.emplace_back(id_list(p));
  } else if (p.is_array() && !p.empty()) {
    for (const json& x : p) {
      if (x.is_string()) r.prompts.emplace_back(x.get<std::string>());
      else if (is_id_list(x)) r.prompts.emplace_back(id_list(x));
      else Reader::bad("prompt", what, p);
    }
  } else {
    Reader::bad("prompt", what, p);
  }
}

void parse_messages(const json& body, const ojson& ordered, ParsedRequest& r) {
  auto it = body.find("messages");
  if (it == body.end() || it->is_null()) throw bad_request("'messages' is required", "messages");
  if (!it->is_array() || it->empty()) Reader::bad("messages", "a non-empty list of messages", *it);
  for (size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    const std::string key = fmt::format("messages[{}]", i);
    if (!m.is_object()) throw bad_request(fmt::format("'{}' must be an object (got {})", key, show(m)), "messages");
    auto role = m.find("role");
    if (role == m.end() || !role->is_string())
      throw bad_request(fmt::format("'{}.role' must be a string", key), "messages");
    static const char* roles[] = {"system", "developer", "user", "assistant", "tool"};
    bool known = false;
    for (const char* k : roles) known |= role->get<std::string>() == k;
    if (!known)
      throw bad_request(fmt::format("'{}.role' must be one of system, developer, user, assistant, tool (got {})", key,
                                    show(*role)),
                        "messages");
    auto content = m.find("content");
    if (content != m.end() && !content->is_null() && !content->is_string() && !content->is_array())
      throw bad_request(fmt::format("'{}.content' must be a string, a list of parts or null", key), "messages");
  }
  // Content given as parts: the text parts joined (what the chat template expects).
  r.messages = ojson::array();
  for (const ojson& m : ordered["messages"]) {
    ojson c = m;
    auto content = m.find("content");
    if (content != m.end() && content->is_array()) {
      std::string text;
      for (const ojson& part : *content) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
          throw bad_request("only text content parts ({\"type\": \"text\", \"text\": ...}) are supported", "messages");
        text += part["text"].get<std::string>();
      }
      c["content"] = text;
    }
    r.messages.push_back(std::move(c));
  }
  if (auto t = body.find("tools"); t != body.end() && !t->is_null()) {
    if (!t->is_array()) Reader::bad("tools", "a list of tools", *t);
    for (const json& tool : *t)
      if (!tool.is_object() || !tool.contains("function") || !tool["function"].is_object() ||
          !tool["function"].contains("name") || !tool["function"]["name"].is_string())
        throw bad_request("each of 'tools' must be {\"type\": \"function\", \"function\": {\"name\": ...}}", "tools");
    r.tools = ordered["tools"];
  }
  if (auto tc = body.find("tool_choice"); tc != body.end() && !tc->is_null()) {
    if (tc->is_string()) {
      const std::string s = tc->get<std::string>();
      if (s != "none" && s != "auto" && s != "required") Reader::bad("tool_choice", "none, auto or required", *tc);
      if (s == "none") r.tools = ojson();
    } else if (!tc->is_object()) {
      Reader::bad("tool_choice", "none, auto, required or a function object", *tc);
    }
  }
}

}  // namespace

ParsedRequest parse_request(Endpoint endpoint, const std::string& body_text) {
  json body;
  try {
    body = json::parse(body_text);
  } catch (const json::parse_error& e) {
    throw bad_request(fmt::format("the request body is not valid JSON: {}", e.what()));
  }
  if (!body.is_object()) throw bad_request("the request body must be a JSON object");
  ParsedRequest r;
  r.endpoint = endpoint;
  Reader f(body);
  if (auto m = f.string("model")) r.model = *m;
  if (endpoint == Endpoint::COMPLETIONS) {
    parse_prompts(body, r);
  } else {
    parse_messages(body, ojson::parse(body_text), r);
    if (const json* kw = f.find("chat_template_kwargs")) {
      if (!kw->is_object()) Reader::bad("chat_template_kwargs", "an object", *kw);
      r.chat_template_kwargs = ojson::parse(body_text)["chat_template_kwargs"];
    }
  }

  engine::SamplingParams& p = r.params;
  if (auto v = f.number("temperature", 0, 1e6, "a number >= 0")) p.temperature = *v;
  if (auto v = f.number("top_p", 0, 1, "a number in (0, 1]")) {
    if (*v <= 0) Reader::bad("top_p", "a number in (0, 1]", body["top_p"]);
    p.top_p = *v;
  }
  if (auto v = f.integer("top_k", -1, kI32, "an integer >= -1 (-1 or 0: off)")) p.top_k = std::max<int64_t>(*v, 0);
  if (auto v = f.number("min_p", 0, 1, "a number in [0, 1]")) p.min_p = *v;
  if (auto v = f.integer("seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), "an integer"))
    p.seed = uint64_t(*v);
  if (auto v = f.number("frequency_penalty", -2, 2, "a number in [-2, 2]")) p.frequency_penalty = *v;
  if (auto v = f.number("presence_penalty", -2, 2, "a number in [-2, 2]")) p.presence_penalty = *v;
  if (f.find("repetition_penalty")) {
    auto v = f.number("repetition_penalty", 0, 1e6, "1 (repetition_penalty is not supported; use frequency_penalty)");
    if (*v != 1) Reader::bad("repetition_penalty", "1 (repetition_penalty is not supported; use frequency_penalty)",
                            body["repetition_penalty"]);
  }
  const char* mt_what = "an integer >= 1";
  std::optional<int64_t> mt = f.integer("max_tokens", 1, std::numeric_limits<int64_t>::max(), mt_what);
  if (endpoint == Endpoint::CHAT)
    if (auto v = f.integer("max_completion_tokens", 1, std::numeric_limits<int64_t>::max(), mt_what)) mt = v;
  if (mt) {
    p.max_tokens = *mt;
    r.max_tokens_given = true;
  }
  if (auto v = f.integer("n", 1, kMaxN, "an integer in [1, 128]")) r.n = *v;
  if (auto v = f.integer("best_of", 1, kMaxN, "an integer in [1, 128]"))
    if (*v != r.n) Reader::bad("best_of", "equal to n (best_of is not supported)", body["best_of"]);
  if (auto v = f.boolean("echo"); v && *v) throw bad_request("'echo' is not supported", "echo");
  if (f.find("suffix")) throw bad_request("'suffix' is not supported", "suffix");
  if (auto v = f.boolean("ignore_eos")) p.ignore_eos = *v;
  if (auto v = f.boolean("stream")) r.stream = *v;
  if (auto v = f.boolean("return_token_ids")) r.return_token_ids = *v;
  if (auto v = f.boolean("skip_special_tokens")) r.skip_special_tokens = *v;
  if (auto v = f.boolean("add_generation_prompt")) r.add_generation_prompt = *v;
  if (const json* so = f.find("stream_options")) {
    if (!so->is_object()) Reader::bad("stream_options", "an object", *so);
    if (!r.stream) throw bad_request("'stream_options' is only allowed when 'stream' is true", "stream_options");
    Reader s(*so);
    if (auto v = s.boolean("include_usage")) r.include_usage = *v;
  }
  if (const json* st = f.find("stop")) {
    const char* what = "a string or a list of strings";
    if (st->is_string()) {
      r.stop.push_back(st->get<std::string>());
    } else if (st->is_array()) {
      for (const json& x : *st) {
        if (!x.is_string()) Reader::bad("stop", what, *st);
        r.stop.push_back(x.get<std::string>());
      }
    } else {
      Reader::bad("stop", what, *st);
    }
    for (const std::string& s : r.stop)
      if (s.empty()) throw bad_request("'stop' strings must not be empty", "stop");
  }
  if (const json* st = f.find("stop_token_ids")) {
    if (!st->is_array()) Reader::bad("stop_token_ids", "a list of token ids", *st);
    for (const json& x : *st) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > kI32)
        Reader::bad("stop_token_ids", "a list of token ids", *st);
      p.stop_token_ids.push_back(int32_t(x.get<int64_t>()));
    }
  }
  if (endpoint == Endpoint::COMPLETIONS) {
    if (auto v = f.integer("logprobs", 0, kMaxTopLogprobs, "an integer in [0, 20]")) {
      r.logprobs = true;
      p.top_logprobs = *v;
    }
  } else {
    r.logprobs = f.boolean("logprobs").value_or(false);
    auto top = f.integer("top_logprobs", 0, kMaxTopLogprobs, "an integer in [0, 20]");
    if (top && !r.logprobs) throw bad_request("'top_logprobs' needs 'logprobs' set to true", "top_logprobs");
    if (r.logprobs) p.top_logprobs = top.value_or(0);
  }
  return r;
}

std::vector<std::vector<int32_t>> tokenize_prompts(ParsedRequest& r, const TextModel* text, int64_t vocab_size,
                                                   int64_t max_context) {
  std::vector<std::vector<int32_t>> out;
  if (!r.stop.empty() && !text)
    throw bad_request("'stop' strings need a tokenizer, and this model folder has none (use stop_token_ids)", "stop");
  if (r.endpoint == Endpoint::CHAT) {
    if (!text) throw bad_request("chat completions need a tokenizer, and this model folder has none", "messages");
    if (!text->has_chat_template())
      throw bad_request("chat completions need a chat template, and this model's tokenizer has none", "messages");
    std::string prompt;
    try {
      prompt = text->render_chat(r.messages, r.add_generation_prompt, r.tools, r.chat_template_kwargs);
    } catch (const std::exception& e) {
      throw bad_request(fmt::format("the chat template failed on these messages: {}", e.what()), "messages");
    }
    const size_t open = prompt.rfind("<think>"), close = prompt.rfind("</think>");
    r.reasoning_open = open != std::string::npos && (close == std::string::npos || close < open);
    r.chat_prompt = prompt;
    try {
      out.push_back(text->encode(prompt, /*add_special_tokens=*/false));
    } catch (const std::exception& e) {
      throw bad_request(e.what(), "messages");
    }
  } else {
    for (const auto& p : r.prompts) {
      if (const auto* s = std::get_if<std::string>(&p)) {
        if (!text)
          throw bad_request("text prompts need a tokenizer, and this model folder has none: send token ids", "prompt");
        try {
          out.push_back(text->encode(*s, /*add_special_tokens=*/true));
        } catch (const std::exception& e) {
          throw bad_request(e.what(), "prompt");
        }
      } else {
        const auto& ids = std::get<std::vector<int64_t>>(p);
        std::vector<int32_t> v;
        for (size_t i = 0; i < ids.size(); ++i) {
          if (ids[i] < 0 || ids[i] >= vocab_size)
            throw bad_request(fmt::format("prompt token id {} at index {} is outside the vocabulary [0, {})", ids[i],
                                          i, vocab_size),
                              "prompt");
          v.push_back(int32_t(ids[i]));
        }
        out.push_back(std::move(v));
      }
    }
  }
  for (int32_t id : r.params.stop_token_ids)
    if (id >= vocab_size)
      throw bad_request(fmt::format("stop_token_ids: id {} is outside the vocabulary [0, {})", id, vocab_size),
                        "stop_token_ids");
  int64_t longest = 0;
  for (const auto& ids : out) {
    if (ids.empty()) throw bad_request("the prompt is empty", r.endpoint == Endpoint::CHAT ? "messages" : "prompt");
    longest = std::max<int64_t>(longest, int64_t(ids.size()));
  }
  const char* what = r.endpoint == Endpoint::CHAT ? "messages" : "prompt";
  if (longest >= max_context)
    throw bad_request(fmt::format("This model's maximum context length is {} tokens. However, your {} has {} tokens",
                                  max_context, what, longest),
                      r.endpoint == Endpoint::CHAT ? "messages" : "prompt");
  if (!r.max_tokens_given && r.endpoint == Endpoint::CHAT) {
    r.params.max_tokens = max_context - longest;
  } else if (!r.max_tokens_given) {
    r.params.max_tokens = std::min<int64_t>(16, max_context - longest);
  } else if (r.params.max_tokens > max_context - longest) {
    throw bad_request(fmt::format("This model's maximum context length is {} tokens. However, you requested {} "
                                  "tokens ({} in the {}, {} in the completion)",
                                  max_context, longest + r.params.max_tokens, longest, what, r.params.max_tokens),
                      "max_tokens");
  }
  return out;
}

std::string sse_event(const ojson& j) {
  return "data: " + j.dump(-1, ' ', false, ojson::error_handler_t::replace) + "\n\n";
}

std::string make_request_id(Endpoint e) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{}-{:016x}{:08x}", e == Endpoint::CHAT ? "chatcmpl" : "cmpl", rng(), uint32_t(rng()));
}

ojson usage_json(int64_t prompt_tokens, int64_t completion_tokens, int64_t cached_tokens) {
  ojson u;
  u["prompt_tokens"] = prompt_tokens;
  u["completion_tokens"] = completion_tokens;
  u["total_tokens"] = prompt_tokens + completion_tokens;
  u["prompt_tokens_details"] = ojson{{"cached_tokens", cached_tokens}};
  return u;
}

std::string token_text(const TextModel* text, int32_t id) {
  if (!text) return fmt::format("token_id:{}", id);
  return text->decode({id}, /*skip_special_tokens=*/false);
}

ojson completion_logprobs(const TextModel* text, const std::vector<engine::TokenLogprob>& lp, int64_t text_offset) {
  ojson j;
  ojson tokens = ojson::array(), token_logprobs = ojson::array(), top = ojson::array(), offsets = ojson::array();
  for (const auto& t : lp) {
    const std::string s = token_text(text, t.id);
    tokens.push_back(s);
    token_logprobs.push_back(t.logprob);
    ojson alt = ojson::object();
    for (const auto& [id, l] : t.top) alt[token_text(text, id)] = l;
    top.push_back(alt);
    offsets.push_back(text_offset);
    text_offset += int64_t(s.size());
  }
  j["tokens"] = tokens;
  j["token_logprobs"] = token_logprobs;
  j["top_logprobs"] = top;
  j["text_offset"] = offsets;
  return j;
}

namespace {
// A token's raw bytes (its text may be a replacement character when it holds part of one).
ojson bytes_of(const TextModel* text, int32_t id) {
  const std::string s = text ? text->token_bytes(id) : token_text(nullptr, id);
  ojson b = ojson::array();
  for (unsigned char c : s) b.push_back(int(c));
  return b;
}
}  // namespace

ojson chat_logprobs(const TextModel* text, const std::vector<engine::TokenLogprob>& lp) {
  ojson content = ojson::array();
  for (const auto& t : lp) {
    const std::string s = token_text(text, t.id);
    ojson e;
    e["token"] = s;
    e["logprob"] = t.logprob;
    e["bytes"] = bytes_of(text, t.id);
    ojson top = ojson::array();
    for (const auto& [id, l] : t.top) {
      const std::string a = token_text(text, id);
      top.push_back(ojson{{"token", a}, {"logprob", l}, {"bytes", bytes_of(text, id)}});
    }
    e["top_logprobs"] = top;
    content.push_back(e);
  }
  return ojson{{"content", content}};
}

}  // namespace mla::server
