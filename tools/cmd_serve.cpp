// mla serve — the OpenAI-compatible HTTP server over the engine's scheduler.
#include <pthread.h>

#include <csignal>
#include <cstdio>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "cli.h"
#include "engine/engine.h"
#include "engine/service_impl.h"
#include "mla/error.h"
#include "run_opts.h"
#include "server/server.h"
#include "server/text_model.h"

namespace mla::cli {

void add_serve_command(CLI::App& app, int& rc) {
  struct Opts : RunOpts {
    std::string tokenizer, host = "127.0.0.1", api_key, name, port_file, policy = "fcfs";
    int port = 8000, http_threads = 0;
    int64_t max_queue = 1024, kv_tokens = 65536, token_budget = 2048, prefill_chunk = 512, max_running = 64,
            max_choices = 16;
    bool no_prefix_cache = false, no_decode_ahead = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* sub = app.add_subcommand("serve", "OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions)");
  o->add(sub);
  sub->add_option("--tokenizer", o->tokenizer, "folder with tokenizer.json (default: the model folder)");
  sub->add_option("--host", o->host, "address to listen on")->capture_default_str();
  sub->add_option("--port", o->port, "port (0: any free port; see --port-file)")->capture_default_str();
  sub->add_option("--port-file", o->port_file, "write the port to this file once listening");
  sub->add_option("--api-key", o->api_key, "require 'Authorization: Bearer KEY' on /v1/* and /flush_cache");
  sub->add_option("--served-model-name", o->name, "the model's name in the API (default: the model folder's name)");
  sub->add_option("--max-queue", o->max_queue, "requests waiting for admission; past it 503")->capture_default_str();
  sub->add_option("--kv-tokens", o->kv_tokens, "KV pool capacity in tokens (requests + prefix cache)")
      ->capture_default_str();
  sub->add_option("--token-budget", o->token_budget, "tokens per scheduler step")->capture_default_str();
  sub->add_option("--prefill-chunk", o->prefill_chunk, "chunked prefill size (0: whole prompts)")->capture_default_str();
  sub->add_option("--max-running", o->max_running, "sequences running at once")->capture_default_str();
  sub->add_option("--max-n", o->max_choices, "largest n (choices) per request")->capture_default_str();
  sub->add_option("--policy", o->policy, "fcfs | lpm (longest prefix match first)")->capture_default_str();
  sub->add_flag("--no-prefix-cache", o->no_prefix_cache, "disable the radix prefix cache");
  sub->add_flag("--no-decode-ahead", o->no_decode_ahead,
                "decode step by step: no step issued before the last one's tokens reach the host (the same tokens)");
  sub->add_option("--http-threads", o->http_threads,
                  "connections served at once (default: --max-running + 64; a stream holds one for its whole life)");
  sub->callback([o, &rc] {
    o->parse();
    if (o->port < 0 || o->port > 65535) throw UsageError("--port must be in [0, 65535]");
    if (o->max_queue < 0 || o->kv_tokens <= 0 || o->token_budget <= 0 || o->prefill_chunk < 0 || o->max_running <= 0 ||
        o->max_choices <= 0 || o->http_threads < 0)
      throw UsageError("--max-queue, --prefill-chunk must be >= 0; --kv-tokens, --token-budget, --max-running, "
                       "--max-n > 0; --http-threads >= 0");
    engine::SchedulerOptions so;
    so.token_budget = o->token_budget;
    so.prefill_chunk = o->prefill_chunk;
    so.max_running = o->max_running;
    so.max_queue = o->max_queue;
    so.prefix_cache = !o->no_prefix_cache;
    so.max_choices = o->max_choices;
    so.decode_ahead = !o->no_decode_ahead;
    try {
      so.policy = engine::parse_policy(o->policy);
    } catch (const Error& e) {
      throw UsageError(e.what());
    }
    // SIGINT / SIGTERM go to one waiting thread only: block them before any thread starts.
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
    std::signal(SIGPIPE, SIG_IGN);

    const std::string tok_dir = o->tokenizer.empty() ? o->model : o->tokenizer;
    std::unique_ptr<server::TextModel> text = tok_dir.empty() ? nullptr : server::load_text_model(tok_dir);
    if (!text && !o->tokenizer.empty()) fail("--tokenizer {}: no tokenizer.json there", o->tokenizer);
    Session s = open_session(*o, o->kv_tokens);
    so.eos_token_id = o->model.empty() ? -1 : engine::read_eos_token_id(o->model, s.lm.config.vocab_size);
    std::unique_ptr<engine::Service> service = engine::make_service(*s.engine, so);

    server::ServerOptions opt;
    opt.host = o->host;
    opt.port = o->port;
    opt.api_key = o->api_key;
    // Each open stream holds an HTTP thread: fewer threads than running sequences would leave
    // connections waiting in the HTTP queue, unseen by the scheduler.
    opt.http_threads = o->http_threads > 0 ? o->http_threads : int(o->max_running) + 64;
    opt.model_name = o->name;
    if (opt.model_name.empty()) opt.model_name = o->model_name();
    server::Server srv(*service, text.get(), opt);
    const int port = srv.bind();
    if (!o->port_file.empty()) {
      std::ofstream pf(o->port_file + ".tmp");
      pf << port << "\n";
      pf.close();
      std::rename((o->port_file + ".tmp").c_str(), o->port_file.c_str());
    }
    std::fprintf(stderr, "mla: serving '%s' on http://%s:%d (%s; Ctrl-C stops)\n", opt.model_name.c_str(),
                 o->host.c_str(), port, text ? "text and token-id prompts" : "token-id prompts only: no tokenizer");
    std::thread stopper([&] {
      int sig = 0;
      sigwait(&stop_signals, &sig);
      std::fprintf(stderr, "mla: %s: finishing in-flight requests, then stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
      srv.stop(/*drain=*/true);
    });
    srv.run();
    pthread_kill(stopper.native_handle(), SIGTERM);  // wakes the waiter if run() ended on its own
    stopper.join();
    service->shutdown(false);
    std::fprintf(stderr, "mla: stopped\n");
    rc = 0;
  });
}

}  // namespace mla::cli
