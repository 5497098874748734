// src/server/server.h — the OpenAI-compatible HTTP server over an engine::Service.
//
// Endpoints: POST /v1/completions, POST /v1/chat/completions (both streaming or not), GET /v1/models,
// GET /health, GET /metrics (Prometheus), POST /flush_cache. HTTP threads never wait for the engine's
// scheduler: each request gets a queue that the Service's callbacks fill, and the HTTP thread drains it.
// /flush_cache is the exception: it answers once the flush is done (at most one step).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "engine/service.h"
#include "server/text_model.h"

namespace mla::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;            // 0: any free port (bind() says which)
  std::string api_key;        // non-empty: /v1/* and /flush_cache need "Authorization: Bearer KEY"
  std::string model_name;     // what /v1/models lists and requests may name
  int http_threads = 64;      // concurrent connections served
};

class Server {
 public:
  // `text` may be null (token-id prompts only). Both must outlive the server.
  Server(engine::Service& service, const TextModel* text, ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  int bind();  // binds host:port; returns the port; mla::Error when it cannot
  void run();  // serves until stop(); returns when every connection has ended
  // From any thread: refuse new generation requests (503), let the in-flight ones finish (drain) or
  // abort them, shut the engine down, then stop listening. run() returns afterwards.
  void stop(bool drain);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace mla::server
