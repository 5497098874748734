// tests/test_server_protocol.cpp — the server's pure parts: request parsing and validation, SSE
// framing, stop strings, the DeepSeek reasoning and tool-call parsers (split at every byte), metrics.
#include <gtest/gtest.h>

#include <random>

#include "server/metrics.h"
#include "server/output.h"
#include "server/protocol.h"
#include "server_fakes.h"

namespace mla::server {
namespace {

using testing::ByteText;
using testing::kEos;

ApiError parse_error(Endpoint e, const std::string& body) {
  try {
    parse_request(e, body);
  } catch (const ApiError& err) {
    return err;
  }
  ADD_FAILURE() << "no error for " << body;
  return {};
}

TEST(ServerProtocol, MalformedAndWrongTypesAre400NamingTheField) {
  EXPECT_EQ(parse_error(Endpoint::COMPLETIONS, "{\"prompt\": [1,2").status, 400);
  EXPECT_NE(parse_error(Endpoint::COMPLETIONS, "{\"prompt\": [1,2").message.find("not valid JSON"), std::string::npos);
  EXPECT_EQ(parse_error(Endpoint::COMPLETIONS, "[1, 2]").status, 400);
  struct Case {
    const char* body;
    const char* param;
  } cases[] = {
      {R"({"prompt": [1], "temperature": "hot"})", "temperature"},
      {R"({"prompt": [1], "temperature": -0.5})", "temperature"},
      {R"({"prompt": [1], "top_p": 0})", "top_p"},
      {R"({"prompt": [1], "top_p": 1.5})", "top_p"},
      {R"({"prompt": [1], "top_k": -2})", "top_k"},
      {R"({"prompt": [1], "min_p": 2})", "min_p"},
      {R"({"prompt": [1], "max_tokens": 0})", "max_tokens"},
      {R"({"prompt": [1], "max_tokens": -5})", "max_tokens"},
      {R"({"prompt": [1], "max_tokens": 2.5})", "max_tokens"},
      {R"({"prompt": [1], "n": 0})", "n"},
      {R"({"prompt": [1], "frequency_penalty": 3})", "frequency_penalty"},
      {R"({"prompt": [1], "presence_penalty": -2.5})", "presence_penalty"},
      {R"({"prompt": [1], "stream": "yes"})", "stream"},
      {R"({"prompt": [1], "stream_options": {"include_usage": true}})", "stream_options"},
      {R"({"prompt": [1], "stop": 5})", "stop"},
      {R"({"prompt": [1], "stop": ["a", 1]})", "stop"},
      {R"({"prompt": [1], "stop": ""})", "stop"},
      {R"({"prompt": [1], "stop_token_ids": [-1]})", "stop_token_ids"},
      {R"({"prompt": [1], "logprobs": 21})", "logprobs"},
      {R"({"prompt": [1], "ignore_eos": 1})", "ignore_eos"},
      {R"({"prompt": [1], "seed": "x"})", "seed"},
      {R"({"prompt": [1], "echo": true})", "echo"},
      {R"({"prompt": [1], "model": 7})", "model"},
      {R"({"prompt": []})", "prompt"},
      {R"({"prompt": 5})", "prompt"},
      {R"({"prompt": [[1, 2], [3, "a"]]})", "prompt"},
      {R"({"prompt": [1.5]})", "prompt"},
      {R"({"max_tokens": 3})", "prompt"},
  };
  for (const Case& c : cases) {
    ApiError e = parse_error(Endpoint::COMPLETIONS, c.body);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body << ": " << e.message;
    EXPECT_EQ(e.type, "invalid_request_error");
    // One line, and the OpenAI shape.
    EXPECT_EQ(e.message.find('\n'), std::string::npos) << e.message;
    ojson b = e.body();
    EXPECT_TRUE(b["error"].contains("message") && b["error"].contains("type") && b["error"].contains("param") &&
                b["error"].contains("code"));
  }
  struct Case2 {
    const char* body;
    const char* param;
  } chat_cases[] = {
      {R"({"messages": []})", "messages"},
      {R"({"messages": [{"role": "wizard", "content": "hi"}]})", "messages"},
      {R"({"messages": [{"content": "hi"}]})", "messages"},
      {R"({"messages": [{"role": "user", "content": 5}]})", "messages"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "logprobs": 3})", "logprobs"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 3})", "top_logprobs"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 0})", "max_completion_tokens"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]})", "tools"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "tool_choice": "maybe"})", "tool_choice"},
  };
  for (const Case2& c : chat_cases) {
    ApiError e = parse_error(Endpoint::CHAT, c.body);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body << ": " << e.message;
  }
}

TEST(ServerProtocol, FieldsReachTheSamplingParams) {
  ParsedRequest r = parse_request(Endpoint::COMPLETIONS, R"({"prompt": [[1, 2], "ab", [3]], "temperature": 0,
      "top_p": 0.5, "top_k": 7, "min_p": 0.1, "seed": 42, "frequency_penalty": 0.5, "presence_penalty": -1,
      "max_tokens": 9, "stop": "x", "stop_token_ids": [3, 4], "ignore_eos": true, "n": 3, "logprobs": 2,
      "stream": true, "stream_options": {"include_usage": true}, "return_token_ids": true})");
  ASSERT_EQ(r.prompts.size(), 3u);
  EXPECT_EQ(std::get<std::vector<int64_t>>(r.prompts[0]), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(std::get<std::string>(r.prompts[1]), "ab");
  EXPECT_EQ(r.params.temperature, 0);
  EXPECT_EQ(r.params.top_p, 0.5);
  EXPECT_EQ(r.params.top_k, 7);
  EXPECT_EQ(r.params.min_p, 0.1);
  EXPECT_EQ(r.params.seed, 42u);
  EXPECT_EQ(r.params.frequency_penalty, 0.5);
  EXPECT_EQ(r.params.presence_penalty, -1);
  EXPECT_EQ(r.params.max_tokens, 9);
  EXPECT_EQ(r.stop, std::vector<std::string>{"x"});
  EXPECT_EQ(r.params.stop_token_ids, (std::vector<int32_t>{3, 4}));
  EXPECT_TRUE(r.params.ignore_eos);
  EXPECT_EQ(r.n, 3);
  EXPECT_EQ(r.params.top_logprobs, 2);
  EXPECT_TRUE(r.stream && r.include_usage && r.return_token_ids);
  // top_k -1 means off; chat's max_completion_tokens wins over max_tokens; nulls are absent.
  ParsedRequest c = parse_request(Endpoint::CHAT, R"({"messages": [{"role": "user", "content":
      [{"type": "text", "text": "he"}, {"type": "text", "text": "llo"}]}], "top_k": -1, "max_tokens": 5,
      "max_completion_tokens": 6, "logprobs": true, "top_logprobs": 3, "temperature": null})");
  EXPECT_EQ(c.params.top_k, 0);
  EXPECT_EQ(c.params.max_tokens, 6);
  EXPECT_EQ(c.params.top_logprobs, 3);
  EXPECT_EQ(c.params.temperature, 1.0);
  EXPECT_EQ(c.messages[0]["content"], "hello");
  ParsedRequest none = parse_request(Endpoint::CHAT, R"({"messages": [{"role": "user", "content": "x"}]})");
  EXPECT_EQ(none.params.top_logprobs, -1);
}

std::vector<std::vector<int32_t>> tokenize(ParsedRequest& r, const TextModel* t, int64_t vocab = 300,
                                           int64_t ctx = 64) {
  return tokenize_prompts(r, t, vocab, ctx);
}

ApiError tokenize_error(Endpoint e, const std::string& body, const TextModel* t, int64_t vocab = 300, int64_t ctx = 64) {
  ParsedRequest r = parse_request(e, body);
  try {
    tokenize(r, t, vocab, ctx);
  } catch (const ApiError& err) {
    return err;
  }
  ADD_FAILURE() << "no error for " << body;
  return {};
}

TEST(ServerProtocol, PromptsAgainstTheModel) {
  ByteText text;
  ParsedRequest r = parse_request(Endpoint::COMPLETIONS, R"({"prompt": ["hi", [5, 6, 7]], "max_tokens": 4})");
  auto ids = tokenize(r, &text);
  ASSERT_EQ(ids.size(), 2u);
  EXPECT_EQ(ids[0], (std::vector<int32_t>{'h', 'i'}));
  EXPECT_EQ(ids[1], (std::vector<int32_t>{5, 6, 7}));
  // Without a tokenizer: ids serve; text is a 400 that says why.
  ParsedRequest r2 = parse_request(Endpoint::COMPLETIONS, R"({"prompt": [5, 6]})");
  EXPECT_EQ(tokenize(r2, nullptr)[0], (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(r2.params.max_tokens, 16);
  ApiError e = tokenize_error(Endpoint::COMPLETIONS, R"({"prompt": "hi"})", nullptr);
  EXPECT_NE(e.message.find("tokenizer"), std::string::npos);
  EXPECT_NE(tokenize_error(Endpoint::CHAT, R"({"messages": [{"role": "user", "content": "x"}]})", nullptr)
                .message.find("tokenizer"),
            std::string::npos);
  EXPECT_EQ(tokenize_error(Endpoint::COMPLETIONS, R"({"prompt": [1], "stop": "x"})", nullptr).param, "stop");
  // Ids outside the vocabulary, too long, too many tokens asked.
  EXPECT_EQ(tokenize_error(Endpoint::COMPLETIONS, R"({"prompt": [1, 300]})", &text).param, "prompt");
  EXPECT_EQ(tokenize_error(Endpoint::COMPLETIONS, R"({"prompt": [1, 2], "stop_token_ids": [300]})", &text).param,
            "stop_token_ids");
  EXPECT_NE(tokenize_error(Endpoint::COMPLETIONS, R"({"prompt": [1, 2, 3]})", &text, 300, 3).message.find("context"),
            std::string::npos);
  ApiError big = tokenize_error(Endpoint::COMPLETIONS, R"({"prompt": [1, 2, 3], "max_tokens": 62})", &text);
  EXPECT_EQ(big.param, "max_tokens");
  ParsedRequest fits = parse_request(Endpoint::COMPLETIONS, R"({"prompt": [1, 2, 3], "max_tokens": 61})");
  EXPECT_NO_THROW(tokenize(fits, &text));
  // Chat: the template's text, max_tokens defaults to what the context leaves, <think> left open.
  ParsedRequest c = parse_request(Endpoint::CHAT, R"({"messages": [{"role": "user", "content": "q"}]})");
  auto cids = tokenize(c, &text);
  EXPECT_EQ(text.decode(cids[0], false), "user: q\nassistant:");
  EXPECT_EQ(c.params.max_tokens, 64 - int64_t(cids[0].size()));
  EXPECT_FALSE(c.reasoning_open);
  // chat_template_kwargs reach the template (here {"thinking": true} opens <think>).
  ParsedRequest ck = parse_request(Endpoint::CHAT, R"({"messages": [{"role": "user", "content": "q"}],
      "chat_template_kwargs": {"thinking": true}})");
  tokenize(ck, &text);
  EXPECT_TRUE(ck.reasoning_open);
  EXPECT_EQ(parse_error(Endpoint::CHAT, R"({"messages": [{"role": "user", "content": "q"}], "chat_template_kwargs": 1})").param,
            "chat_template_kwargs");
  text.think_open = true;
  ParsedRequest c2 = parse_request(Endpoint::CHAT, R"({"messages": [{"role": "user", "content": "q"}]})");
  tokenize(c2, &text);
  EXPECT_TRUE(c2.reasoning_open);
}

TEST(ServerProtocol, SseFramingAndIds) {
  ojson j;
  j["a"] = 1;
  j["b"] = "x\ny";
  EXPECT_EQ(sse_event(j), "data: {\"a\":1,\"b\":\"x\\ny\"}\n\n");
  EXPECT_STREQ(sse_done(), "data: [DONE]\n\n");
  EXPECT_EQ(make_request_id(Endpoint::CHAT).rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(make_request_id(Endpoint::COMPLETIONS).rfind("cmpl-", 0), 0u);
  EXPECT_NE(make_request_id(Endpoint::CHAT), make_request_id(Endpoint::CHAT));
  ojson u = usage_json(10, 5, 4);
  EXPECT_EQ(u.dump(), R"({"prompt_tokens":10,"completion_tokens":5,"total_tokens":15,"prompt_tokens_details":{"cached_tokens":4}})");
}

// Feeds `text` to a parser in two pieces split at every position (and byte by byte).
template <typename Parser, typename Collect>
void every_split(const std::string& text, std::function<Parser()> make, Collect check) {
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    Parser p = make();
    std::vector<typename Parser::Out> outs = {p.feed(text.substr(0, cut)), p.feed(text.substr(cut)), p.finish()};
    check(outs, "split at " + std::to_string(cut));
  }
  Parser p = make();
  std::vector<typename Parser::Out> outs;
  for (char ch : text) outs.push_back(p.feed(std::string(1, ch)));
  outs.push_back(p.finish());
  check(outs, "byte by byte");
}

TEST(ServerReasoning, SplitsThinkFromContentAtEveryBoundary) {
  struct Case {
    bool open;
    std::string text, reasoning, content;
  } cases[] = {
      {false, "<think>I ponder.</think>The answer.", "I ponder.", "The answer."},
      {false, "\n<think>a<b</think>", "a<b", ""},
      {false, "Plain answer </think> kept", "", "Plain answer </think> kept"},
      {false, "<thinking is not a tag", "", "<thinking is not a tag"},
      {true, "still thinking</think>\n\nDone.", "still thinking", "\n\nDone."},
      {true, "<think>doubly opened</think>x", "doubly opened", "x"},
      {true, "never closed", "never closed", ""},
      {false, "<think>never closed", "never closed", ""},
  };
  for (const Case& c : cases)
    every_split<ReasoningParser>(
        c.text, [&] { return ReasoningParser(c.open); },
        [&](const std::vector<ReasoningParser::Out>& outs, const std::string& how) {
          std::string r, t;
          for (const auto& o : outs) r += o.reasoning, t += o.content;
          EXPECT_EQ(r, c.reasoning) << c.text << " " << how;
          EXPECT_EQ(t, c.content) << c.text << " " << how;
        });
}

// What a client accumulates from a parser's outputs: the content and the whole calls. Checks the
// deltas' shape on the way: a call's first delta (id, name) comes before its argument pieces, the
// indices count up from 0, and no delta is empty.
struct Accumulated {
  std::string content;
  std::vector<ToolCall> calls;
};
Accumulated accumulate(const std::vector<ToolCallParser::Out>& outs, const std::string& how) {
  Accumulated a;
  for (const auto& o : outs) {
    a.content += o.content;
    for (const ToolCallDelta& d : o.calls) {
      if (d.first) {
        EXPECT_EQ(d.index, int64_t(a.calls.size())) << how;
        EXPECT_EQ(d.id.rfind("call_", 0), 0u) << how;
      } else {
        EXPECT_LT(d.index, int64_t(a.calls.size())) << "arguments before the call's first delta, " << how;
        EXPECT_FALSE(d.arguments.empty()) << "an empty delta, " << how;
      }
      if (!d.first && d.index >= int64_t(a.calls.size())) continue;
      accumulate_tool_calls(a.calls, {d});
    }
  }
  return a;
}

TEST(ServerToolCalls, ParsesV3AndV31FormatsAtEveryBoundary) {
  const std::string v3 =
      "Let me check.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
      "{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n"
      "{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
  const std::string v31 =
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜>"
      "<｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
  for (const auto& [text, content] : {std::pair{v3, std::string("Let me check.")}, std::pair{v31, std::string()}})
    every_split<ToolCallParser>(
        text, [] { return ToolCallParser(); },
        [&](const std::vector<ToolCallParser::Out>& outs, const std::string& how) {
          Accumulated a = accumulate(outs, how);
          EXPECT_EQ(a.content, content) << how;
          ASSERT_EQ(a.calls.size(), 2u) << how;
          EXPECT_EQ(a.calls[0].name, "get_weather");
          EXPECT_EQ(a.calls[0].arguments, "{\"city\": \"Paris\"}") << how;
          EXPECT_EQ(a.calls[1].name, "get_time");
          EXPECT_EQ(a.calls[1].arguments, "{}") << how;
          EXPECT_NE(a.calls[0].id, a.calls[1].id);
          for (const auto& o : outs)
            for (const ToolCallDelta& d : o.calls) EXPECT_EQ(d.arguments.find('`'), std::string::npos) << how;
        });
  // Text with no markers passes through; a block in which no call started comes back as written.
  for (const std::string broken : {std::string("a<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_w"),
                                   std::string("a<｜tool▁calls▁begin｜>\n<｜tool▁call▁begin｜>get_w"), std::string("plain")})
    every_split<ToolCallParser>(
        broken, [] { return ToolCallParser(); },
        [&](const std::vector<ToolCallParser::Out>& outs, const std::string& how) {
          Accumulated a = accumulate(outs, how);
          EXPECT_TRUE(a.calls.empty()) << how;
          EXPECT_EQ(a.content, broken) << how;
        });
  // A call cut short once its name is known stays a call, with its arguments as far as they got.
  const std::string cut = "a<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"x\": 1 <｜tool▁call";
  every_split<ToolCallParser>(
      cut, [] { return ToolCallParser(); },
      [&](const std::vector<ToolCallParser::Out>& outs, const std::string& how) {
        Accumulated a = accumulate(outs, how);
        EXPECT_EQ(a.content, "a") << how;
        ASSERT_EQ(a.calls.size(), 1u) << how;
        EXPECT_EQ(a.calls[0].name, "f");
        EXPECT_EQ(a.calls[0].arguments, "{\"x\": 1") << how;
      });
}

// The arguments stream as they arrive: fed byte by byte, a call's first delta (with its name) comes
// right after the name, and every argument byte goes out as soon as nothing that follows can change
// it, long before <｜tool▁call▁end｜>; the ``` fence never does.
TEST(ServerToolCalls, ArgumentsStreamAsTheyArrive) {
  struct Case {
    std::string text, name, args;
    std::string named_after;  // the name is sent once this prefix has arrived, not before
  } cases[] = {
      {"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```"
       "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
       "get_weather", "{\"city\": \"Paris\"}", "get_weather\n"},
      {"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>  {\"city\": \"Par is\"}\n"
       "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
       "get_weather", "{\"city\": \"Par is\"}", "<｜tool▁sep｜>"},
  };
  for (const Case& c : cases) {
    ToolCallParser p;
    std::string args;
    bool named = false;
    const size_t name_at = c.text.find(c.named_after) + c.named_after.size();
    const size_t args_at = c.text.find(c.args), args_end = args_at + c.args.size();
    for (size_t i = 0; i < c.text.size(); ++i) {
      ToolCallParser::Out o = p.feed(c.text.substr(i, 1));
      for (const ToolCallDelta& d : o.calls) {
        if (d.first) {
          EXPECT_EQ(d.name, c.name);
          EXPECT_EQ(i + 1, name_at) << "the name went out late or early";
          named = true;
        }
        EXPECT_TRUE(named);
        args += d.arguments;
      }
      // Every byte up to here is out, but for blank space (the arguments may end there).
      if (i + 1 > args_at && i + 1 <= args_end) {
        std::string want = c.text.substr(args_at, i + 1 - args_at);
        while (!want.empty() && want.back() == ' ') want.pop_back();
        EXPECT_EQ(args, want) << "after " << i + 1 << " bytes";
      }
      if (i + 1 >= args_end) EXPECT_EQ(args, c.args) << "after " << i + 1 << " bytes";
    }
    EXPECT_TRUE(p.finish().calls.empty());
    EXPECT_EQ(args, c.args);
  }
}

// The whole-call parse the streamed arguments must equal: the call's text between
// <｜tool▁call▁begin｜> and <｜tool▁call▁end｜>, taken at once.
ToolCall reference_call(std::string_view body) {
  auto trim = [](std::string_view s) {
    const size_t b = s.find_first_not_of(" \t\r\n");
    if (b == std::string_view::npos) return std::string();
    return std::string(s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1));
  };
  ToolCall c;
  const size_t sep = body.find(ToolCallParser::kSep);
  if (sep == std::string_view::npos) {
    c.name = trim(body);
    c.arguments = "{}";
    return c;
  }
  const std::string head = trim(body.substr(0, sep));
  std::string_view rest = body.substr(sep + ToolCallParser::kSep.size());
  const size_t nl = rest.find('\n');
  if (head == "function" && nl != std::string_view::npos) {
    c.name = trim(rest.substr(0, nl));
    std::string args = trim(rest.substr(nl + 1));
    if (args.rfind("```", 0) == 0) {
      const size_t line = args.find('\n');
      args = line == std::string::npos ? "" : args.substr(line + 1);
      if (args.size() >= 3 && args.compare(args.size() - 3, 3, "```") == 0) args.resize(args.size() - 3);
      args = trim(args);
    }
    c.arguments = args;
  } else {
    c.name = head;
    c.arguments = trim(rest);
  }
  if (c.arguments.empty()) c.arguments = "{}";
  return c;
}

// Random blocks of calls in every format (V3 fenced and not, V3.1, "function" without V3's newline,
// a name alone), with arguments full
// of blank space, backticks and pieces of markers, fed in random chunks and byte by byte: the
// accumulated calls equal the whole-call parse, whatever the chunking.
TEST(ServerToolCalls, RandomChunkingsEqualTheWholeParse) {
  std::mt19937 rng(1234);
  auto pick = [&](size_t n) { return size_t(rng() % n); };
  const std::vector<std::string> atoms = {"{", "}", "\"", "a", "b7", ":", ",", " ", "  ", "\n", "\t", "`", "``", "```",
                                          "<", "<｜", "<｜tool▁call", "<｜tool▁call▁end", "｜>", "é", "[1, 2]", "json"};
  auto args_text = [&] {  // anything but the whole end marker
    std::string s;
    do {
      s.clear();
      for (size_t i = pick(12); i-- > 0;) s += atoms[pick(atoms.size())];
    } while (s.find(ToolCallParser::kCallEnd) != std::string::npos);
    return s;
  };
  const std::vector<std::string> blanks = {"", " ", "\n", " \n "};
  for (int round = 0; round < 1000; ++round) {
    std::string text = round % 3 ? "Sure." : "";
    std::vector<ToolCall> want;
    text += ToolCallParser::kCallsBegin;
    for (size_t k = 1 + pick(3); k-- > 0;) {
      std::string body;
      const std::string name = "fn" + std::to_string(pick(100));
      switch (pick(6)) {
        case 0:  // V3, fenced
          body = "function" + std::string(ToolCallParser::kSep) + name + "\n" + blanks[pick(4)] + "```json\n" +
                 args_text() + blanks[pick(4)] + "```" + blanks[pick(4)];
          break;
        case 1:  // V3, fence line only, or no fence
          body = "function" + std::string(ToolCallParser::kSep) + name + "\n" + (pick(2) ? "```json" : "") +
                 args_text();
          break;
        case 2:
        case 3:  // V3.1
          body = name + std::string(ToolCallParser::kSep) + blanks[pick(4)] + args_text() + blanks[pick(4)];
          break;
        case 4:  // "function" and text that may or may not hold the newline that makes it V3
          body = "function" + std::string(ToolCallParser::kSep) + args_text();
          break;
        default:  // a name alone
          body = blanks[pick(4)] + name + blanks[pick(4)];
      }
      want.push_back(reference_call(body));
      text += std::string(ToolCallParser::kCallBegin) + body + std::string(ToolCallParser::kCallEnd) + blanks[pick(4)];
    }
    text += ToolCallParser::kCallsEnd;
    text += round % 2 ? " Done." : "";
    const std::string content = std::string(round % 3 ? "Sure." : "") + (round % 2 ? " Done." : "");
    for (int chunking = 0; chunking < 4; ++chunking) {
      ToolCallParser p;
      std::vector<ToolCallParser::Out> outs;
      for (size_t i = 0; i < text.size();) {
        const size_t n = chunking == 0 ? 1 : 1 + pick(chunking == 1 ? 4 : 40);
        outs.push_back(p.feed(text.substr(i, n)));
        i += n;
      }
      outs.push_back(p.finish());
      const std::string how = "round " + std::to_string(round) + " chunking " + std::to_string(chunking);
      Accumulated a = accumulate(outs, how);
      EXPECT_EQ(a.content, content) << how;
      ASSERT_EQ(a.calls.size(), want.size()) << how << "\n" << text;
      for (size_t k = 0; k < want.size(); ++k) {
        EXPECT_EQ(a.calls[k].name, want[k].name) << how;
        EXPECT_EQ(a.calls[k].arguments, want[k].arguments) << how << "\n" << text;
      }
    }
  }
}

engine::ChoiceUpdate upd(std::vector<int32_t> ids, engine::FinishReason f = engine::FinishReason::NONE) {
  engine::ChoiceUpdate u;
  u.new_tokens = std::move(ids);
  u.finish = f;
  return u;
}

std::vector<int32_t> bytes(const std::string& s) {
  std::vector<int32_t> v;
  for (unsigned char c : s) v.push_back(c);
  return v;
}

TEST(ServerOutput, StopStringsCutTheTextAndHoldBackAPossibleStart) {
  ByteText text;
  const std::vector<std::string> stops = {"END", "\n\n"};
  // The scheduler side: the stop string's position and the tokens wholly past it.
  StopStrings ss(text, stops, true, 1, {kEos});
  std::vector<int32_t> toks;
  int64_t drop = -1;
  for (int32_t id : bytes("abcEN")) {
    toks.push_back(id);
    EXPECT_EQ(ss.check(0, toks), -1);
  }
  toks.push_back('D');
  drop = ss.check(0, toks);
  EXPECT_EQ(drop, 3);  // E, N, D lie past "abc"
  EXPECT_EQ(ss.cut(0), 3);
  // The HTTP side: "EN" is held back until it is known; the cut keeps "abc".
  ChoiceOutput out(&text, true, 2, false, false, {kEos});
  std::string seen;
  seen += out.push(upd(bytes("abcE")), -1).text;
  EXPECT_EQ(seen, "ab");
  seen += out.push(upd(bytes("N")), -1).text;
  EXPECT_EQ(seen, "abc");
  seen += out.push(upd({}, engine::FinishReason::STOP), 3).text;
  EXPECT_EQ(seen, "abc");
  EXPECT_EQ(out.finish_reason(), "stop");
  // A stop string starting inside a token keeps that token and cuts its text.
  ByteText t2;
  StopStrings s2(t2, {"xy"}, true, 1, {});
  EXPECT_EQ(s2.check(0, {'a', 'x'}), -1);
  EXPECT_EQ(s2.check(0, {'a', 'x', 'y'}), 2);
}

TEST(ServerOutput, EosAddsNoTextAndUtf8IsNeverSplit) {
  ByteText text;
  ChoiceOutput out(&text, false, 0, false, false, {kEos});
  const std::string euro = "\xE2\x82\xAC";  // €
  std::string seen;
  Delta d = out.push(upd({'a', int32_t(uint8_t(euro[0]))}), -1);
  EXPECT_EQ(d.text, "a");
  d = out.push(upd({int32_t(uint8_t(euro[1])), int32_t(uint8_t(euro[2])), kEos}, engine::FinishReason::STOP), -1);
  EXPECT_EQ(d.text, euro);
  EXPECT_EQ(out.token_ids().size(), 5u);
  EXPECT_EQ(out.finish_reason(), "stop");
  ChoiceOutput len(&text, false, 0, false, false, {kEos});
  len.push(upd({'a'}, engine::FinishReason::LENGTH), -1);
  EXPECT_EQ(len.finish_reason(), "length");
}

TEST(ServerOutput, ChatSplitsReasoningContentAndToolCalls) {
  ByteText text;
  const std::string reply =
      "<think>Need weather.</think>Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>w\n"
      "```json\n{\"c\":1}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
  std::vector<int32_t> ids = text.encode(reply, false);
  ids.push_back(kEos);
  for (size_t step : {size_t(1), size_t(3), ids.size()}) {
    ChoiceOutput out(&text, false, 0, true, false, {kEos});
    std::string reasoning, content;
    std::vector<ToolCall> calls;
    int64_t deltas = 0;
    for (size_t i = 0; i < ids.size(); i += step) {
      const size_t e = std::min(ids.size(), i + step);
      Delta d = out.push(upd(std::vector<int32_t>(ids.begin() + i, ids.begin() + e),
                             e == ids.size() ? engine::FinishReason::STOP : engine::FinishReason::NONE),
                         -1);
      reasoning += d.reasoning;
      content += d.text;
      accumulate_tool_calls(calls, d.tool_calls);
      deltas += int64_t(d.tool_calls.size());
    }
    // One token (here a byte) at a time, the call streams: its name, then each of the 7 bytes of
    // {"c":1} as it arrives (none of them can be blank space at the end or part of the fence).
    if (step == 1) EXPECT_EQ(deltas, 8);
    EXPECT_EQ(reasoning, "Need weather.");
    EXPECT_EQ(content, "Checking.");
    ASSERT_EQ(calls.size(), 1u);
    EXPECT_EQ(calls[0].name, "w");
    EXPECT_EQ(calls[0].arguments, "{\"c\":1}");
    EXPECT_EQ(out.finish_reason(), "tool_calls");
  }
}

TEST(ServerOutput, LogprobsFormats) {
  ByteText text;
  std::vector<engine::TokenLogprob> lp = {{'a', -0.5f, {{'a', -0.5f}, {'b', -1.5f}}}, {'c', -0.25f, {}}};
  ojson c = completion_logprobs(&text, lp, 4);
  EXPECT_EQ(c["tokens"], ojson({"a", "c"}));
  EXPECT_EQ(c["token_logprobs"][0], -0.5);
  EXPECT_EQ(c["top_logprobs"][0]["b"], -1.5);
  EXPECT_EQ(c["text_offset"], ojson({4, 5}));
  ojson ch = chat_logprobs(&text, lp);
  EXPECT_EQ(ch["content"][0]["token"], "a");
  EXPECT_EQ(ch["content"][0]["bytes"], ojson({97}));
  EXPECT_EQ(ch["content"][0]["top_logprobs"][1]["token"], "b");
  EXPECT_EQ(completion_logprobs(nullptr, lp, 0)["tokens"][0], "token_id:97");
  // Part of a UTF-8 character: the text is a replacement character, the bytes are the token's own.
  ojson part = chat_logprobs(&text, {{0xE2, -1.0f, {}}});
  EXPECT_EQ(part["content"][0]["bytes"], ojson({0xE2}));
}

TEST(ServerMetrics, PrometheusText) {
  engine::MetricsSnapshot m;
  m.requests_running = 3;
  m.requests_waiting = 1;
  m.kv_cache_usage = 0.25;
  m.prefix_cache_queries = 100;
  m.prefix_cache_hits = 40;
  m.prompt_tokens = 120;
  m.generation_tokens = 55;
  m.steps_per_method = {{"MLA", 50}, {"MHA", 3}};
  m.decode_ahead_steps = 47;
  m.step_graph_captures = 4;
  m.step_graph_replays = 46;
  m.step_graphs_kept = 5;
  m.host_syncs = 53;
  m.time_to_first_token.bounds = {0.01, 0.1};
  m.time_to_first_token.counts = {2, 5};
  m.time_to_first_token.count = 6;
  m.time_to_first_token.sum = 0.75;
  const std::string s = render_metrics(m, 2);
  for (const char* line :
       {"# TYPE mla:num_requests_running gauge\nmla:num_requests_running 3\n", "mla:num_requests_waiting 1\n",
        "mla:kv_cache_usage_perc 0.25\n", "# TYPE mla:prefix_cache_queries_total counter\n",
        "mla:prefix_cache_queries_total 100\n", "mla:prefix_cache_hits_total 40\n", "mla:prompt_tokens_total 120\n",
        "mla:generation_tokens_total 55\n", "mla:forward_steps_total{method=\"MHA\"} 3\n",
        "mla:forward_steps_total{method=\"MLA\"} 50\n", "# TYPE mla:decode_ahead_steps_total counter\n",
        "mla:decode_ahead_steps_total 47\n", "# TYPE mla:step_graph_captures_total counter\n",
        "mla:step_graph_captures_total 4\n", "mla:step_graph_replays_total 46\n",
        "# TYPE mla:step_graphs gauge\nmla:step_graphs 5\n", "mla:host_syncs_total 53\n", "# TYPE mla:time_to_first_token_seconds histogram\n",
        "mla:time_to_first_token_seconds_bucket{le=\"0.01\"} 2\n",
        "mla:time_to_first_token_seconds_bucket{le=\"0.1\"} 5\n",
        "mla:time_to_first_token_seconds_bucket{le=\"+Inf\"} 6\n", "mla:time_to_first_token_seconds_sum 0.75\n",
        "mla:time_to_first_token_seconds_count 6\n", "mla:inter_token_latency_seconds_count 0\n",
        "# TYPE mla:client_disconnects_total counter\nmla:client_disconnects_total 2\n"})
    EXPECT_NE(s.find(line), std::string::npos) << line;
  // Every line is a comment or "name{labels} value".
  size_t at = 0;
  while (at < s.size()) {
    const size_t nl = s.find('\n', at);
    ASSERT_NE(nl, std::string::npos);
    const std::string line = s.substr(at, nl - at);
    EXPECT_TRUE(line.rfind("# ", 0) == 0 || line.rfind("mla:", 0) == 0) << line;
    at = nl + 1;
  }
}

}  // namespace
}  // namespace mla::server
