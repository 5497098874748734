// tests/test_server_http.cpp — the HTTP server over a scripted Service: DeepSeek reasoning and tool
// calls, stop strings and n > 1 through real sockets, streamed and not (a random test model cannot be
// made to emit these, so the script stands in for the engine).
#include <gtest/gtest.h>
#include <httplib.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include "server/peer.h"
#include "server/protocol.h"
#include "server/server.h"
#include "server_fakes.h"

namespace mla::server {
namespace {

using testing::ByteText;
using testing::kEos;
using testing::ScriptedService;

struct Running {
  ScriptedService service;
  ByteText text;
  std::unique_ptr<Server> server;
  std::thread thread;
  int port = 0;
  explicit Running(std::string script) : service([script](const std::vector<int32_t>&) { return script; }) {
    ServerOptions o;
    o.port = 0;
    o.model_name = "scripted";
    server = std::make_unique<Server>(service, &text, o);
    port = server->bind();
    thread = std::thread([this] { server->run(); });
  }
  ~Running() {
    server->stop(true);
    thread.join();
  }
  httplib::Result post(const std::string& path, const json& body) {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(10, 0);
    return c.Post(path.c_str(), body.dump(), "application/json");
  }
};

// The SSE events of a body, parsed (the final [DONE] checked and dropped).
std::vector<json> events(const std::string& body) {
  std::vector<json> out;
  size_t at = 0;
  bool done = false;
  while (at < body.size()) {
    const size_t end = body.find("\n\n", at);
    EXPECT_NE(end, std::string::npos);
    if (end == std::string::npos) break;
    const std::string ev = body.substr(at, end - at);
    EXPECT_EQ(ev.rfind("data: ", 0), 0u) << ev;
    EXPECT_FALSE(done) << "an event after [DONE]";
    if (ev == "data: [DONE]") done = true;
    else out.push_back(json::parse(ev.substr(6)));
    at = end + 2;
  }
  EXPECT_TRUE(done);
  return out;
}

const char* kToolReply =
    "<think>The user wants weather.</think>Let me look.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function"
    "<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";

TEST(ServerHttp, ChatReasoningAndToolCalls) {
  Running r(kToolReply);
  const json req = {{"messages", {{{"role", "user"}, {"content", "Weather in Paris?"}}}},
                    {"tools", {{{"type", "function"}, {"function", {{"name", "get_weather"}}}}}}};
  auto res = r.post("/v1/chat/completions", req);
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  json j = json::parse(res->body);
  const json& m = j["choices"][0]["message"];
  EXPECT_EQ(m["reasoning_content"], "The user wants weather.");
  EXPECT_EQ(m["content"], "Let me look.");
  ASSERT_EQ(m["tool_calls"].size(), 1u);
  EXPECT_EQ(m["tool_calls"][0]["type"], "function");
  EXPECT_EQ(m["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(m["tool_calls"][0]["function"]["arguments"], "{\"city\": \"Paris\"}");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls");

  // Streamed, n = 2: the role first, then reasoning, content and the call; the same for both choices.
  json sreq = req;
  sreq["stream"] = true;
  sreq["n"] = 2;
  auto sres = r.post("/v1/chat/completions", sreq);
  ASSERT_TRUE(sres);
  ASSERT_EQ(sres->status, 200);
  std::string reasoning[2], content[2], finish[2];
  json calls[2] = {json::array(), json::array()};
  int pieces[2] = {0, 0};
  bool saw_role[2] = {false, false};
  for (const json& e : events(sres->body)) {
    EXPECT_EQ(e["object"], "chat.completion.chunk");
    ASSERT_EQ(e["choices"].size(), 1u);
    const json& c = e["choices"][0];
    const int k = c["index"].get<int>();
    const json& d = c["delta"];
    if (!saw_role[k]) {
      EXPECT_EQ(d.value("role", ""), "assistant");
      saw_role[k] = true;
    }
    reasoning[k] += d.value("reasoning_content", "");
    content[k] += d.value("content", "");
    // Tool calls as OpenAI streams them: the first delta of a call has its id, type and name; later
    // ones only {"index", "function": {"arguments": piece}}, to be concatenated.
    if (d.contains("tool_calls"))
      for (const json& tc : d["tool_calls"]) {
        const size_t i = tc["index"].get<size_t>();
        if (tc.contains("id")) {
          EXPECT_EQ(i, calls[k].size());
          EXPECT_EQ(tc["type"], "function");
          EXPECT_TRUE(tc["function"].contains("name"));
          EXPECT_TRUE(tc["function"]["arguments"].is_string());
          calls[k].push_back(tc);
        } else {
          ASSERT_LT(i, calls[k].size()) << "arguments before the call's first delta";
          EXPECT_EQ(tc.size(), 2u) << tc.dump();
          EXPECT_EQ(tc["function"].size(), 1u) << tc.dump();
          calls[k][i]["function"]["arguments"] =
              calls[k][i]["function"]["arguments"].get<std::string>() + tc["function"]["arguments"].get<std::string>();
          ++pieces[k];
        }
      }
    if (!c["finish_reason"].is_null()) finish[k] = c["finish_reason"];
  }
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(reasoning[k], "The user wants weather.");
    EXPECT_EQ(content[k], "Let me look.");
    ASSERT_EQ(calls[k].size(), 1u);
    EXPECT_EQ(calls[k][0]["index"], 0);
    EXPECT_EQ(calls[k][0]["function"]["name"], "get_weather");
    EXPECT_EQ(calls[k][0]["function"]["arguments"], "{\"city\": \"Paris\"}");
    EXPECT_GE(pieces[k], 10) << "the arguments arrive a token at a time";
    EXPECT_EQ(finish[k], "tool_calls");
  }
}

TEST(ServerHttp, StopStringsThroughTheEngineCallback) {
  Running r("Hello world. STOP here, never seen.");
  auto res = r.post("/v1/completions", {{"prompt", "Say hi"}, {"stop", {"STOP", "zzz"}}, {"max_tokens", 100}});
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  json j = json::parse(res->body);
  EXPECT_EQ(j["choices"][0]["text"], "Hello world. ");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  // Streamed: no piece of "STOP" ever reaches the client.
  auto sres = r.post("/v1/completions", {{"prompt", "Say hi"}, {"stop", "STOP"}, {"stream", true}, {"max_tokens", 100}});
  ASSERT_TRUE(sres);
  std::string text, finish;
  for (const json& e : events(sres->body)) {
    text += e["choices"][0]["text"].get<std::string>();
    if (!e["choices"][0]["finish_reason"].is_null()) finish = e["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(text, "Hello world. ");
  EXPECT_EQ(finish, "stop");
  // max_tokens first: "length", the text up to there.
  auto lres = r.post("/v1/completions", {{"prompt", "Say hi"}, {"max_tokens", 5}});
  ASSERT_TRUE(lres);
  json l = json::parse(lres->body);
  EXPECT_EQ(l["choices"][0]["text"], "Hello");
  EXPECT_EQ(l["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(l["usage"]["completion_tokens"], 5);
}

// 256 clients at once (a load generator's burst): every connection is served. cpp-httplib's own
// listen backlog of 5 reset some of them; the server raises it.
TEST(ServerHttp, ABurstOfClientsIsServedWhole) {
  Running r("Hello world.");
  const int n = 256;
  std::atomic<int> ok{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> clients;
  for (int i = 0; i < n; ++i)
    clients.emplace_back([&] {
      while (!go) std::this_thread::yield();
      auto res = r.post("/v1/completions", {{"prompt", "Say hi"}, {"max_tokens", 3}, {"stream", true}});
      if (res && res->status == 200) ++ok;
    });
  go = true;
  for (auto& t : clients) t.join();
  EXPECT_EQ(ok.load(), n);
}

// The connection's socket found by its two ends, and its peer's state, on a loopback pair.
TEST(ServerPeer, FindsTheConnectionAndSeesItsPeerClose) {
  const int lst = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(lst, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(listen(lst, 1), 0);
  socklen_t len = sizeof(a);
  getsockname(lst, reinterpret_cast<sockaddr*>(&a), &len);
  const int cli = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_EQ(connect(cli, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  const int srv = accept(lst, nullptr, nullptr);
  ASSERT_GE(srv, 0);
  sockaddr_in c{};
  len = sizeof(c);
  getsockname(cli, reinterpret_cast<sockaddr*>(&c), &len);
  const int server_port = ntohs(a.sin_port), client_port = ntohs(c.sin_port);
  // The server's end: local = the listening port, peer = the client's port (the client's own socket
  // has these ends the other way round).
  EXPECT_EQ(find_connection_socket("127.0.0.1", server_port, "127.0.0.1", client_port), srv);
  EXPECT_EQ(find_connection_socket("127.0.0.1", client_port, "127.0.0.1", server_port), cli);
  EXPECT_EQ(find_connection_socket("127.0.0.2", server_port, "127.0.0.1", client_port), -1);
  EXPECT_EQ(find_connection_socket("127.0.0.1", server_port, "127.0.0.1", -1), -1);
  // Data waiting (a request sent, not read) is not a close; a close is, and poll() read nothing.
  ASSERT_EQ(send(cli, "GET", 3, 0), 3);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(peer_closed(srv));
  close(cli);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_TRUE(peer_closed(srv));
  char buf[8];
  EXPECT_EQ(recv(srv, buf, sizeof(buf), 0), 3);
  EXPECT_FALSE(peer_closed(-1));
  close(srv);
  close(lst);
}

// A client that sends a request on a raw socket and closes the connection without reading the answer.
void send_and_close(int port, const json& body) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  const std::string b = body.dump();
  const std::string req = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                          "Content-Length: " + std::to_string(b.size()) + "\r\n\r\n" + b;
  ASSERT_EQ(send(fd, req.data(), req.size(), 0), ssize_t(req.size()));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the request is running now
  close(fd);
}

// A client that gives up on a request, streamed or not, has it aborted at once (the script would
// run for seconds), and /metrics counts it.
TEST(ServerHttp, AClientThatClosesTheConnectionHasItsRequestAborted) {
  Running r(std::string(4000, 'x'));
  int want = 0;
  for (bool stream : {false, true}) {
    send_and_close(r.port, {{"prompt", "Say hi"}, {"max_tokens", 4000}, {"stream", stream}});
    ++want;
    const auto t0 = std::chrono::steady_clock::now();
    while (r.service.aborts.load() < want && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2))
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    EXPECT_EQ(r.service.aborts.load(), want) << (stream ? "streamed" : "not streamed");
  }
  httplib::Client c("127.0.0.1", r.port);
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("\nmla:client_disconnects_total 2\n"), std::string::npos) << m->body;
  // A client that waits gets the whole answer.
  auto res = r.post("/v1/completions", {{"prompt", "Say hi"}, {"max_tokens", 50}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), "application/json");
  EXPECT_EQ(json::parse(res->body)["choices"][0]["text"], std::string(50, 'x'));
  EXPECT_EQ(r.service.aborts.load(), 2);
}

}  // namespace
}  // namespace mla::server
