// src/server/protocol.h — the OpenAI request and response formats: parsing, validation, JSON out.
//
// Pure functions over nlohmann::json: no sockets, no threads, so every rule is unit-tested.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/service.h"
#include "server/text_model.h"

namespace mla::server {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

// An error as OpenAI sends it: {"error": {"message", "type", "param", "code"}} with an HTTP status.
struct ApiError {
  int status = 400;
  std::string message, type = "invalid_request_error", param, code;
  ojson body() const;
};
ApiError bad_request(std::string message, std::string param = "");

enum class Endpoint { COMPLETIONS, CHAT };

// One request as the server runs it, before tokenization.
struct ParsedRequest {
  Endpoint endpoint = Endpoint::COMPLETIONS;
  std::string model;
  // completions: each prompt is text or token ids; chat: messages (+ tools).
  std::vector<std::variant<std::string, std::vector<int64_t>>> prompts;
  ojson messages, tools, chat_template_kwargs = ojson::object();  // chat, in the request's key order
  bool add_generation_prompt = true;
  std::string chat_prompt;      // chat: the rendered template (set by tokenize_prompts)
  bool reasoning_open = false;  // chat: the prompt ends inside "<think>" (R1-style templates)
  engine::SamplingParams params;
  bool max_tokens_given = false;
  int64_t n = 1;
  bool stream = false, include_usage = false, return_token_ids = false, skip_special_tokens = true;
  std::vector<std::string> stop;
  bool logprobs = false;  // chat: logprobs true; completions: logprobs given (top count in params)
};

// The checks that need no model: types, ranges, known values. Throws ApiError.
ParsedRequest parse_request(Endpoint endpoint, const std::string& body);

// The checks that need the model: the prompts as ids (tokenized when text), ids inside the vocabulary,
// prompt + max_tokens within the context (max_tokens defaults to what the context leaves for chat).
// `text` may be null: token-id prompts only. Throws ApiError.
std::vector<std::vector<int32_t>> tokenize_prompts(ParsedRequest& req, const TextModel* text, int64_t vocab_size,
                                                   int64_t max_context);

// SSE framing: "data: {json}\n\n" and the final "data: [DONE]\n\n".
std::string sse_event(const ojson& j);
inline const char* sse_done() { return "data: [DONE]\n\n"; }

// "cmpl-…" / "chatcmpl-…" with 24 random hex digits.
std::string make_request_id(Endpoint e);

ojson usage_json(int64_t prompt_tokens, int64_t completion_tokens, int64_t cached_tokens);

// The text of one token for logprobs: its decoded text, or "token_id:N" without a tokenizer.
std::string token_text(const TextModel* text, int32_t id);

// Logprobs of one choice's new tokens in the endpoint's format. Completions: {tokens, token_logprobs,
// top_logprobs, text_offset} (offsets start at `text_offset`); chat: {content: [...]}.
ojson completion_logprobs(const TextModel* text, const std::vector<engine::TokenLogprob>& lp, int64_t text_offset);
ojson chat_logprobs(const TextModel* text, const std::vector<engine::TokenLogprob>& lp);

}  // namespace mla::server
