// tests/echo_server.cpp — the HTTP server of `mla serve` over a scripted engine that answers every
// chat with its last user message, a byte (or named DeepSeek marker) per token. The end-to-end test
// drives it with the official OpenAI client to see what the random test model cannot be made to
// emit: reasoning and tool calls, streamed and not.
//   echo_server PORT_FILE     listens on 127.0.0.1, any free port (written to PORT_FILE); SIGINT or
//                             SIGTERM stops it
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "server/server.h"
#include "server_fakes.h"

namespace {

// The prompt of a chat is its last user message, as written.
class EchoText : public mla::server::testing::ByteText {
 public:
  std::string render_chat(const nlohmann::ordered_json& messages, bool, const nlohmann::ordered_json&,
                          const nlohmann::ordered_json&) const override {
    std::string last;
    for (const auto& m : messages)
      if (m.value("role", "") == "user" && m.contains("content") && m["content"].is_string()) last = m["content"];
    return last;
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: echo_server PORT_FILE\n");
    return 2;
  }
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);  // every thread started below inherits it
  try {
    EchoText text;
    mla::server::testing::ScriptedService service(
        [&text](const std::vector<int32_t>& prompt) { return text.decode(prompt, false); });
    mla::server::ServerOptions o;
    o.port = 0;
    o.model_name = "echo";
    mla::server::Server server(service, &text, o);
    const int port = server.bind();
    const std::string tmp = std::string(argv[1]) + ".tmp";
    std::ofstream(tmp) << port;
    std::filesystem::rename(tmp, argv[1]);
    std::thread waiter([&] {
      int sig = 0;
      sigwait(&stop_signals, &sig);
      server.stop(false);
    });
    server.run();
    waiter.join();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "echo_server: %s\n", e.what());
    return 1;
  }
  return 0;
}
