// src/server/server.cpp — HTTP endpoints (cpp-httplib) bridged to the engine's Service callbacks.
#include "server/server.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <ctime>
#include <deque>
#include <future>
#include <mutex>
#include <thread>

#include <httplib.h>
#include <sys/socket.h>

#include "server/metrics.h"
#include "server/output.h"
#include "server/peer.h"
#include "server/protocol.h"

namespace mla::server {

using engine::FinishReason;
using engine::RequestUpdate;

namespace {

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(e.body().dump(), "application/json");
}

ApiError api_error(int status, std::string message, std::string type, std::string code = "", std::string param = "") {
  ApiError e;
  e.status = status;
  e.message = std::move(message);
  e.type = std::move(type);
  e.code = std::move(code);
  e.param = std::move(param);
  return e;
}

// The Service's updates for one HTTP request, handed from the scheduler thread to the HTTP thread.
struct Mailbox {
  std::mutex m;
  std::condition_variable cv;
  std::deque<std::pair<size_t, RequestUpdate>> q;  // (prompt index, update)
};

}  // namespace

struct Server::Impl {
  engine::Service& service;
  const TextModel* text;
  ServerOptions opt;
  httplib::Server http;
  std::atomic<bool> stopping{false}, service_stopped{false};
  std::mutex inflight_m;
  std::condition_variable inflight_cv;
  int64_t inflight = 0;
  std::atomic<int64_t> client_disconnects{0};  // requests aborted because their client went away
  int64_t created = std::time(nullptr);

  Impl(engine::Service& s, const TextModel* t, ServerOptions o) : service(s), text(t), opt(std::move(o)) {}

  void begin_inflight() {
    std::lock_guard<std::mutex> l(inflight_m);
    ++inflight;
  }
  void end_inflight() {
    std::lock_guard<std::mutex> l(inflight_m);
    --inflight;
    inflight_cv.notify_all();
  }

  void routes();
  void generate(Endpoint e, const httplib::Request& req, httplib::Response& res);
};

namespace {

// One generation request: its prompts (each a Service request with n choices), and each choice's output.
struct Generation {
  Server::Impl* impl = nullptr;
  ParsedRequest req;
  std::string id;
  int64_t created = 0;
  std::shared_ptr<Mailbox> mail = std::make_shared<Mailbox>();
  std::vector<std::vector<int32_t>> prompts;
  std::vector<engine::RequestHandle> handles;
  std::vector<std::shared_ptr<StopStrings>> stops;  // per prompt; null without stop strings
  std::vector<ChoiceOutput> outs;                    // prompt p, choice c → p * n + c
  std::vector<int64_t> prompt_tokens, cached_tokens, completion_tokens;
  std::vector<bool> done;
  size_t open = 0;
  std::string error;
  // Non-streaming: the whole choice.
  std::vector<std::string> text, reasoning;
  std::vector<std::vector<ToolCall>> calls;
  std::vector<std::vector<engine::TokenLogprob>> logprobs;
  bool started = false, ended = false, aborted = false;
  int sock = -1;  // the request's connection (-1: not found; then only a failed write tells)

  bool chat() const { return req.endpoint == Endpoint::CHAT; }
  size_t choices() const { return prompts.size() * size_t(req.n); }

  void abort_all() {
    if (aborted) return;
    aborted = true;
    for (size_t p = 0; p < handles.size(); ++p)
      if (!done[p]) impl->service.abort(handles[p]);
  }

  // The client went away: abort what still runs (the engine frees its pages within one step).
  void client_left() {
    if (!aborted && open > 0) ++impl->client_disconnects;
    abort_all();
  }

  // Waits up to `timeout` for updates; an engine that has stopped finishes what is left as aborted.
  std::deque<std::pair<size_t, RequestUpdate>> wait(std::chrono::milliseconds timeout) {
    std::deque<std::pair<size_t, RequestUpdate>> got;
    std::unique_lock<std::mutex> l(mail->m);
    mail->cv.wait_for(l, timeout, [&] { return !mail->q.empty(); });
    got.swap(mail->q);
    l.unlock();
    if (got.empty() && impl->service_stopped.load()) {
      for (size_t p = 0; p < prompts.size(); ++p) {
        if (done[p]) continue;
        RequestUpdate u;
        u.finished = true;
        u.prompt_tokens = prompt_tokens[p];
        u.cached_tokens = cached_tokens[p];
        u.completion_tokens = completion_tokens[p];
        for (int64_t c = 0; c < req.n; ++c)
          if (!outs[p * size_t(req.n) + size_t(c)].finished())
            u.choices.push_back(engine::ChoiceUpdate{c, {}, {}, FinishReason::ABORT});
        got.emplace_back(p, std::move(u));
      }
    }
    return got;
  }

  ojson usage() const {
    int64_t pt = 0, ct = 0, cached = 0;
    for (size_t p = 0; p < prompts.size(); ++p) pt += prompt_tokens[p], ct += completion_tokens[p], cached += cached_tokens[p];
    return usage_json(pt, ct, cached);
  }

  ojson chunk_head() const {
    ojson j;
    j["id"] = id;
    j["object"] = chat() ? "chat.completion.chunk" : "text_completion";
    j["created"] = created;
    j["model"] = impl->opt.model_name;
    return j;
  }

  static ojson tool_calls_json(const std::vector<ToolCall>& calls) {
    ojson a = ojson::array();
    for (const ToolCall& tc : calls) {
      ojson c;
      c["id"] = tc.id;
      c["type"] = "function";
      c["function"] = ojson{{"name", tc.name}, {"arguments", tc.arguments}};
      a.push_back(c);
    }
    return a;
  }

  // Streamed, as OpenAI sends them: a call's first delta carries its id, type and name, later ones
  // only the next piece of the arguments.
  static ojson tool_call_deltas_json(const std::vector<ToolCallDelta>& deltas) {
    ojson a = ojson::array();
    for (const ToolCallDelta& d : deltas) {
      ojson c;
      c["index"] = d.index;
      if (d.first) {
        c["id"] = d.id;
        c["type"] = "function";
        c["function"] = ojson{{"name", d.name}, {"arguments", d.arguments}};
      } else {
        c["function"] = ojson{{"arguments", d.arguments}};
      }
      a.push_back(c);
    }
    return a;
  }

  // One streamed chunk of choice k.
  std::string stream_chunk(size_t k, const Delta& d, const engine::ChoiceUpdate& u, bool finishing) {
    ChoiceOutput& o = outs[k];
    std::string s;
    const bool has_lp = req.logprobs && !u.logprobs.empty();
    const bool carries = !d.empty() || has_lp || (req.return_token_ids && !u.new_tokens.empty());
    auto emit = [&](ojson choice) {
      ojson j = chunk_head();
      j["choices"] = ojson::array({choice});
      if (req.include_usage) j["usage"] = nullptr;
      s += sse_event(j);
    };
    if (chat()) {
      if (carries) {
        ojson delta = ojson::object();
        if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
        if (!d.text.empty() || (d.reasoning.empty() && d.tool_calls.empty())) delta["content"] = d.text;
        if (!d.tool_calls.empty()) delta["tool_calls"] = tool_call_deltas_json(d.tool_calls);
        ojson c;
        c["index"] = k;
        c["delta"] = delta;
        c["logprobs"] = has_lp ? chat_logprobs(impl->text, u.logprobs) : ojson(nullptr);
        c["finish_reason"] = nullptr;
        if (req.return_token_ids) c["token_ids"] = u.new_tokens;
        emit(c);
      }
      if (finishing) {
        ojson c;
        c["index"] = k;
        c["delta"] = ojson::object();
        c["logprobs"] = nullptr;
        c["finish_reason"] = o.finish_reason();
        if (req.return_token_ids) c["token_ids"] = ojson::array();
        emit(c);
      }
    } else if (carries || finishing) {
      ojson c;
      c["index"] = k;
      c["text"] = d.text;
      c["logprobs"] = has_lp ? completion_logprobs(impl->text, u.logprobs, o.text_length() - int64_t(d.text.size()))
                             : ojson(nullptr);
      c["finish_reason"] = finishing ? ojson(o.finish_reason()) : ojson(nullptr);
      if (req.return_token_ids) c["token_ids"] = u.new_tokens;
      emit(c);
    }
    return s;
  }

  // Applies one update; streaming returns the SSE text it produces.
  std::string apply(size_t p, const RequestUpdate& u, bool streaming) {
    std::string sse;
    prompt_tokens[p] = u.prompt_tokens;
    cached_tokens[p] = u.cached_tokens;
    completion_tokens[p] = u.completion_tokens;
    for (const engine::ChoiceUpdate& cu : u.choices) {
      if (cu.index < 0 || cu.index >= req.n) continue;
      const size_t k = p * size_t(req.n) + size_t(cu.index);
      if (outs[k].finished()) continue;
      const int64_t cut = stops[p] && cu.finish == FinishReason::STOP ? stops[p]->cut(cu.index) : -1;
      Delta d = outs[k].push(cu, cut);
      if (streaming) {
        sse += stream_chunk(k, d, cu, outs[k].finished());
      } else {
        text[k] += d.text;
        reasoning[k] += d.reasoning;
        accumulate_tool_calls(calls[k], d.tool_calls);
        logprobs[k].insert(logprobs[k].end(), cu.logprobs.begin(), cu.logprobs.end());
      }
    }
    if (!u.error.empty() && error.empty()) error = u.error;
    if ((u.finished || !u.error.empty()) && !done[p]) {
      done[p] = true;
      --open;
    }
    return sse;
  }

  ojson full_response() const {
    ojson j;
    j["id"] = id;
    j["object"] = chat() ? "chat.completion" : "text_completion";
    j["created"] = created;
    j["model"] = impl->opt.model_name;
    ojson cs = ojson::array();
    for (size_t k = 0; k < choices(); ++k) {
      const ChoiceOutput& o = outs[k];
      ojson c;
      c["index"] = k;
      if (chat()) {
        ojson m;
        m["role"] = "assistant";
        m["content"] = text[k].empty() && !calls[k].empty() ? ojson(nullptr) : ojson(text[k]);
        if (!reasoning[k].empty()) m["reasoning_content"] = reasoning[k];
        if (!calls[k].empty()) m["tool_calls"] = tool_calls_json(calls[k]);
        c["message"] = m;
        c["logprobs"] = req.logprobs ? chat_logprobs(impl->text, logprobs[k]) : ojson(nullptr);
      } else {
        c["text"] = text[k];
        c["logprobs"] = req.logprobs ? completion_logprobs(impl->text, logprobs[k], 0) : ojson(nullptr);
      }
      c["finish_reason"] = o.finish_reason();
      if (req.return_token_ids) {
        c["prompt_token_ids"] = prompts[k / size_t(req.n)];
        c["token_ids"] = o.token_ids();
      }
      cs.push_back(c);
    }
    j["choices"] = cs;
    j["usage"] = usage();
    return j;
  }
};

}  // namespace

void Server::Impl::generate(Endpoint e, const httplib::Request& hreq, httplib::Response& res) {
  auto g = std::make_shared<Generation>();
  g->impl = this;
  try {
    if (stopping.load()) throw api_error(503, "the server is shutting down", "service_unavailable_error");
    g->req = parse_request(e, hreq.body);
    if (!g->req.model.empty() && g->req.model != opt.model_name)
      throw api_error(404, fmt::format("The model `{}` does not exist.", g->req.model), "invalid_request_error",
                      "model_not_found", "model");
    g->prompts = tokenize_prompts(g->req, text, service.vocab_size(), service.max_context());
  } catch (const ApiError& err) {
    send_error(res, err);
    return;
  }
  const ParsedRequest& r = g->req;
  g->id = make_request_id(e);
  g->created = std::time(nullptr);
  const size_t P = g->prompts.size(), K = P * size_t(r.n);
  // Tokens that finish a choice without adding text: EOS (unless ignored) and the stop tokens.
  std::vector<int32_t> silent = r.params.stop_token_ids;
  if (!r.params.ignore_eos) silent.push_back(service.eos_token_id());
  size_t holdback = 0;
  for (const auto& s : r.stop) holdback = std::max(holdback, s.size() - 1);
  const bool skip_special = e == Endpoint::CHAT ? false : r.skip_special_tokens;
  for (size_t k = 0; k < K; ++k)
    g->outs.emplace_back(text, skip_special, holdback, e == Endpoint::CHAT, r.reasoning_open, silent);
  g->text.resize(K), g->reasoning.resize(K), g->calls.resize(K), g->logprobs.resize(K);
  g->prompt_tokens.assign(P, 0), g->cached_tokens.assign(P, 0), g->completion_tokens.assign(P, 0);
  g->done.assign(P, false);
  for (size_t p = 0; p < P; ++p) g->prompt_tokens[p] = int64_t(g->prompts[p].size());
  g->stops.resize(P);
  try {
    for (size_t p = 0; p < P; ++p) {
      engine::GenerateRequest gr;
      gr.prompt = g->prompts[p];
      gr.params = r.params;
      gr.n = r.n;
      if (!r.stop.empty()) {
        auto ss = std::make_shared<StopStrings>(*text, r.stop, skip_special, r.n, silent);
        g->stops[p] = ss;
        gr.stop_check = [ss](int64_t index, const std::vector<int32_t>& tokens) { return ss->check(index, tokens); };
      }
      std::shared_ptr<Mailbox> mail = g->mail;
      g->handles.push_back(service.submit(std::move(gr), [mail, p](const RequestUpdate& u) {
        std::lock_guard<std::mutex> l(mail->m);
        mail->q.emplace_back(p, u);
        mail->cv.notify_one();
      }));
      ++g->open;
    }
  } catch (const engine::QueueFullError& err) {
    g->abort_all();
    send_error(res, api_error(503, err.what(), "service_unavailable_error", "queue_full"));
    return;
  } catch (const Error& err) {
    g->abort_all();
    send_error(res, bad_request(err.what()));
    return;
  }

  // The connection, watched while the request runs: a client that closes it is gone (cpp-httplib
  // 0.11 tells a handler nothing, and a non-streamed response writes nothing before the end).
  g->sock = find_connection_socket(hreq.local_addr, hreq.local_port, hreq.remote_addr, hreq.remote_port);
  begin_inflight();
  if (!r.stream) {
    // Every update wakes the wait, so a closed connection is seen within one engine step.
    while (g->open > 0) {
      for (auto& [p, u] : g->wait(std::chrono::milliseconds(50))) g->apply(p, u, false);
      if (g->open > 0 && !g->aborted && peer_closed(g->sock)) g->client_left();
    }
    end_inflight();
    if (!g->error.empty()) {
      send_error(res, api_error(500, g->error, "server_error"));
      return;
    }
    res.set_content(g->full_response().dump(-1, ' ', false, ojson::error_handler_t::replace), "application/json");
    return;
  }
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [g](size_t, httplib::DataSink& sink) {
        std::string out;
        if (!g->started) {
          g->started = true;
          if (g->chat())
            for (size_t k = 0; k < g->choices(); ++k) {
              ojson j = g->chunk_head();
              ojson c;
              c["index"] = k;
              c["delta"] = ojson{{"role", "assistant"}, {"content", ""}};
              c["logprobs"] = nullptr;
              c["finish_reason"] = nullptr;
              j["choices"] = ojson::array({c});
              if (g->req.include_usage) j["usage"] = nullptr;
              out += sse_event(j);
            }
        }
        if (g->open > 0 && !g->aborted && peer_closed(g->sock)) {
          g->client_left();
          return false;
        }
        if (g->open > 0)
          for (auto& [p, u] : g->wait(std::chrono::milliseconds(out.empty() ? 50 : 0))) out += g->apply(p, u, true);
        const bool end = g->open == 0 && !g->ended;
        if (end) {
          g->ended = true;
          if (!g->error.empty()) out += sse_event(api_error(500, g->error, "server_error").body());
          if (g->req.include_usage) {
            ojson j = g->chunk_head();
            j["choices"] = ojson::array();
            j["usage"] = g->usage();
            out += sse_event(j);
          }
          out += sse_done();
        }
        if (!out.empty() && !sink.write(out.data(), out.size())) {
          g->client_left();
          return false;
        }
        if (end) sink.done();
        return true;
      },
      [g](bool) {
        if (g->open > 0) g->client_left();  // the response ended early: the client is gone
        g->impl->end_inflight();
      });
}

void Server::Impl::routes() {
  http.set_payload_max_length(64 << 20);
  // Clients keep connections open between requests (the OpenAI clients do), for any number of
  // requests; an idle one closes after 2 s, which also bounds how long stop() waits for idle ones.
  http.set_keep_alive_max_count(1000000);
  http.set_keep_alive_timeout(2);
  http.new_task_queue = [n = opt.http_threads] { return new httplib::ThreadPool(size_t(std::max(n, 2))); };
  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (opt.api_key.empty() || req.path == "/health" || req.path == "/metrics")
      return httplib::Server::HandlerResponse::Unhandled;
    if (req.get_header_value("Authorization") == "Bearer " + opt.api_key)
      return httplib::Server::HandlerResponse::Unhandled;
    send_error(res, api_error(401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key"));
    return httplib::Server::HandlerResponse::Handled;
  });
  http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 404)
      send_error(res, api_error(404, fmt::format("unknown route {} {}", req.method, req.path), "invalid_request_error"));
    else
      send_error(res, api_error(res.status, fmt::format("HTTP {}", res.status), "invalid_request_error"));
  });
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(res, api_error(500, what, "server_error"));
  });
  http.Post("/v1/completions",
            [this](const httplib::Request& q, httplib::Response& r) { generate(Endpoint::COMPLETIONS, q, r); });
  http.Post("/v1/chat/completions",
            [this](const httplib::Request& q, httplib::Response& r) { generate(Endpoint::CHAT, q, r); });
  http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    ojson m;
    m["id"] = opt.model_name;
    m["object"] = "model";
    m["created"] = created;
    m["owned_by"] = "mla";
    m["max_model_len"] = service.max_context();
    ojson j;
    j["object"] = "list";
    j["data"] = ojson::array({m});
    res.set_content(j.dump(), "application/json");
  });
  http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (stopping.load()) send_error(res, api_error(503, "the server is shutting down", "service_unavailable_error"));
    else res.set_content("{}", "application/json");
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(render_metrics(service.metrics(), client_disconnects.load()),
                    "text/plain; version=0.0.4; charset=utf-8");
  });
  http.Post("/flush_cache", [this](const httplib::Request&, httplib::Response& res) {
    // Answers once the flush is done (the scheduler takes it between two steps), as a client
    // that flushes and then measures expects; a step longer than the wait gets 202.
    const std::shared_future<int64_t> done = service.flush_cache();
    if (done.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
      res.status = 202;
      res.set_content("{\"status\":\"pending\"}", "application/json");
      return;
    }
    res.set_content(fmt::format("{{\"status\":\"ok\",\"pages_released\":{}}}", done.get()), "application/json");
  });
}

Server::Server(engine::Service& service, const TextModel* text, ServerOptions options)
    : impl_(std::make_unique<Impl>(service, text, std::move(options))) {
  impl_->routes();
}

Server::~Server() = default;

int Server::bind() {
  Impl& m = *impl_;
  int port = m.opt.port;
  // cpp-httplib listens with a backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG, fixed inside the Debian
  // library): a burst of 128 clients overflowed it and some connections were reset. The listening
  // socket is caught as it is made; a second listen() on it raises the backlog.
  int listen_fd = -1;
  m.http.set_socket_options([&listen_fd](socket_t s) {
    httplib::default_socket_options(s);
    listen_fd = int(s);
  });
  if (port == 0) {
    port = m.http.bind_to_any_port(m.opt.host);
    if (port < 0) fail("cannot listen on {} (any port)", m.opt.host);
  } else if (!m.http.bind_to_port(m.opt.host, port)) {
    fail("cannot listen on {}:{} (in use, or not an address of this machine)", m.opt.host, port);
  }
  if (listen_fd >= 0 && ::listen(listen_fd, SOMAXCONN) != 0)
    fail("cannot listen on {}:{} with a backlog of {}", m.opt.host, port, SOMAXCONN);
  m.opt.port = port;
  return port;
}

void Server::run() { impl_->http.listen_after_bind(); }

void Server::stop(bool drain) {
  Impl& m = *impl_;
  if (m.stopping.exchange(true)) return;
  m.service.shutdown(drain);  // every request gets its last update (finished or aborted)
  m.service_stopped = true;
  {
    // The HTTP threads write those last updates; then listening stops.
    std::unique_lock<std::mutex> l(m.inflight_m);
    m.inflight_cv.wait_for(l, std::chrono::seconds(30), [&] { return m.inflight == 0; });
  }
  m.http.stop();
}

}  // namespace mla::server
