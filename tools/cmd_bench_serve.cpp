// mla bench-serve — load an OpenAI-compatible server with random token-id prompts and report
// throughput, TTFT, TPOT, inter-token latency and the prefix-cache hit rate, as JSON.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <random>
#include <thread>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "cli.h"
#include "mla/error.h"

namespace mla::cli {
namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

struct Result {
  bool ok = false;
  std::string error;
  int64_t prompt_tokens = 0, output_tokens = 0;
  double ttft = 0, latency = 0;
  std::vector<double> itl;  // seconds between token-carrying chunks
};

struct Summary {
  double mean = 0, median = 0, p99 = 0;
};

Summary summarize(std::vector<double> v) {
  Summary s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / double(v.size());
  s.median = v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  const double rank = 0.99 * double(v.size() - 1);  // linear interpolation, as numpy's percentile
  const size_t lo = size_t(std::floor(rank)), hi = std::min(lo + 1, v.size() - 1);
  s.p99 = v[lo] + (v[hi] - v[lo]) * (rank - double(lo));
  return s;
}

json ms(const Summary& s) { return {{"mean", s.mean * 1e3}, {"median", s.median * 1e3}, {"p99", s.p99 * 1e3}}; }

// The counters of GET /metrics named `name` (no labels).
double metric(const std::string& text, const std::string& name) {
  size_t at = 0;
  while ((at = text.find(name + " ", at)) != std::string::npos) {
    if (at == 0 || text[at - 1] == '\n') return std::stod(text.substr(at + name.size() + 1));
    at += name.size();
  }
  return 0;
}

// One streamed completion; SSE parsed as it arrives, each chunk's token_ids counted.
Result run_one(const std::string& host, int port, const std::string& api_key, const std::string& model,
               const std::vector<int32_t>& prompt, int64_t max_tokens, bool ignore_eos) {
  Result r;
  r.prompt_tokens = int64_t(prompt.size());
  json body = {{"model", model},           {"prompt", prompt},       {"max_tokens", max_tokens},
               {"stream", true},           {"temperature", 0},       {"ignore_eos", ignore_eos},
               {"return_token_ids", true}, {"stream_options", {{"include_usage", true}}}};
  httplib::Client cli(host, port);
  cli.set_read_timeout(600, 0);
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  if (!api_key.empty()) req.set_header("Authorization", "Bearer " + api_key);
  std::string buf;
  const auto t0 = Clock::now();
  auto last = t0;
  bool first = true, done = false;
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    buf.append(data, len);
    size_t end;
    while ((end = buf.find("\n\n")) != std::string::npos) {
      const std::string event = buf.substr(0, end);
      buf.erase(0, end + 2);
      if (event.rfind("data: ", 0) != 0) continue;
      const std::string payload = event.substr(6);
      if (payload == "[DONE]") {
        done = true;
        continue;
      }
      json j = json::parse(payload, nullptr, false);
      if (j.is_discarded()) continue;
      if (j.contains("error")) {
        r.error = j["error"].value("message", "error");
        continue;
      }
      int64_t n = 0;
      for (const json& c : j.value("choices", json::array())) n += int64_t(c.value("token_ids", json::array()).size());
      if (n == 0) continue;
      const auto now = Clock::now();
      if (first) r.ttft = std::chrono::duration<double>(now - t0).count(), first = false;
      else r.itl.push_back(std::chrono::duration<double>(now - last).count());
      last = now;
      r.output_tokens += n;
    }
    return true;
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  const bool sent = cli.send(req, res, err);
  r.latency = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!sent) r.error = "HTTP request failed: " + httplib::to_string(err);
  else if (res.status != 200) r.error = fmt::format("HTTP {}", res.status);
  else if (!done && r.error.empty()) r.error = "the stream ended without [DONE]";
  r.ok = r.error.empty();
  return r;
}

}  // namespace

void add_bench_serve_command(CLI::App& app, int& rc) {
  struct Opts {
    std::string host = "127.0.0.1", api_key, model, model_dir;
    int port = 8000;
    int64_t num_prompts = 100, input_len = 128, output_len = 64, vocab_size = 0, shared_prefix_len = 0,
            prefix_groups = 1, max_concurrency = 0;
    double request_rate = INFINITY, range_ratio = 0;
    uint64_t seed = 0;
    bool no_ignore_eos = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* sub = app.add_subcommand("bench-serve", "Benchmark an OpenAI-compatible server with random token-id prompts (JSON)");
  sub->add_option("--host", o->host, "server address")->capture_default_str();
  sub->add_option("--port", o->port, "server port")->capture_default_str();
  sub->add_option("--api-key", o->api_key, "bearer token");
  sub->add_option("--model", o->model, "model name in requests (default: the first of /v1/models)");
  sub->add_option("--model-dir", o->model_dir, "HF folder whose config.json gives vocab_size");
  sub->add_option("--vocab-size", o->vocab_size, "token ids drawn from [0, N) (default: --model-dir's vocab_size)");
  sub->add_option("--num-prompts", o->num_prompts, "requests to send")->capture_default_str();
  sub->add_option("--input-len", o->input_len, "prompt tokens (shared prefix included)")->capture_default_str();
  sub->add_option("--output-len", o->output_len, "max_tokens per request")->capture_default_str();
  sub->add_option("--range-ratio", o->range_ratio, "lengths drawn from [len·(1-r), len·(1+r)]")->capture_default_str();
  sub->add_option("--shared-prefix-len", o->shared_prefix_len, "tokens every prompt of a group starts with")
      ->capture_default_str();
  sub->add_option("--prefix-groups", o->prefix_groups, "groups of prompts sharing a prefix")->capture_default_str();
  sub->add_option("--request-rate", o->request_rate, "requests per second, Poisson arrivals (default: all at once)");
  sub->add_option("--max-concurrency", o->max_concurrency, "requests in flight at most (0: no bound)")
      ->capture_default_str();
  sub->add_option("--seed", o->seed, "random seed of prompts and arrivals")->capture_default_str();
  sub->add_flag("--no-ignore-eos", o->no_ignore_eos, "let EOS end a request early (default: ignore_eos)");
  sub->callback([o, &rc] {
    if (o->num_prompts <= 0 || o->input_len <= 0 || o->output_len <= 0)
      throw UsageError("--num-prompts, --input-len and --output-len must be positive");
    if (o->shared_prefix_len < 0 || o->shared_prefix_len >= o->input_len || o->prefix_groups <= 0)
      throw UsageError("--shared-prefix-len must be in [0, --input-len) and --prefix-groups positive");
    if (!(o->range_ratio >= 0 && o->range_ratio < 1)) throw UsageError("--range-ratio must be in [0, 1)");
    if (!(o->request_rate > 0)) throw UsageError("--request-rate must be positive");
    if (o->max_concurrency < 0) throw UsageError("--max-concurrency must be >= 0");
    if (o->vocab_size <= 0 && !o->model_dir.empty()) {
      std::ifstream in(o->model_dir + "/config.json");
      json c = json::parse(in, nullptr, false);
      if (c.is_discarded() || !c.contains("vocab_size") || !c["vocab_size"].is_number_integer())
        fail("--model-dir {}: no vocab_size in config.json", o->model_dir);
      o->vocab_size = c["vocab_size"].get<int64_t>();
    }
    if (o->vocab_size <= 0) throw UsageError("give --vocab-size or --model-dir");
    httplib::Client cli(o->host, o->port);
    httplib::Headers auth;
    if (!o->api_key.empty()) auth.emplace("Authorization", "Bearer " + o->api_key);
    if (o->model.empty()) {
      auto res = cli.Get("/v1/models", auth);
      if (!res || res->status != 200) fail("cannot reach http://{}:{}/v1/models", o->host, o->port);
      json j = json::parse(res->body, nullptr, false);
      if (j.is_discarded() || j["data"].empty()) fail("/v1/models lists no model");
      o->model = j["data"][0]["id"].get<std::string>();
    }
    // The workload: random ids; each group shares its first shared_prefix_len tokens.
    std::mt19937_64 rng(o->seed);
    std::uniform_int_distribution<int32_t> tok(0, int32_t(o->vocab_size - 1));
    auto length = [&](int64_t len) {
      const int64_t lo = std::max<int64_t>(1, int64_t(std::floor(double(len) * (1 - o->range_ratio))));
      const int64_t hi = std::max<int64_t>(lo, int64_t(std::ceil(double(len) * (1 + o->range_ratio))));
      return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
    };
    std::vector<std::vector<int32_t>> prefixes(size_t(o->prefix_groups));
    for (auto& p : prefixes)
      for (int64_t i = 0; i < o->shared_prefix_len; ++i) p.push_back(tok(rng));
    std::vector<std::vector<int32_t>> prompts;
    std::vector<int64_t> out_lens;
    for (int64_t i = 0; i < o->num_prompts; ++i) {
      std::vector<int32_t> p = prefixes[size_t(i % o->prefix_groups)];
      const int64_t n = std::max<int64_t>(length(o->input_len), o->shared_prefix_len + 1);
      while (int64_t(p.size()) < n) p.push_back(tok(rng));
      prompts.push_back(std::move(p));
      out_lens.push_back(length(o->output_len));
    }
    std::vector<double> arrival(size_t(o->num_prompts), 0.0);
    if (std::isfinite(o->request_rate)) {
      std::exponential_distribution<double> gap(o->request_rate);
      double t = 0;
      for (double& a : arrival) a = (t += gap(rng));
    }
    auto metrics_text = [&] {
      auto res = cli.Get("/metrics");
      return res && res->status == 200 ? res->body : std::string();
    };
    const std::string before = metrics_text();
    const size_t workers = size_t(std::min<int64_t>(o->max_concurrency > 0 ? o->max_concurrency : o->num_prompts, 1024));
    std::vector<Result> results(size_t(o->num_prompts));
    std::atomic<size_t> next{0};
    const auto t0 = Clock::now();
    std::vector<std::thread> pool;
    for (size_t w = 0; w < workers; ++w)
      pool.emplace_back([&] {
        for (size_t i; (i = next++) < results.size();) {
          std::this_thread::sleep_until(t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(arrival[i])));
          results[i] = run_one(o->host, o->port, o->api_key, o->model, prompts[i], out_lens[i], !o->no_ignore_eos);
        }
      });
    for (auto& t : pool) t.join();
    const double duration = std::chrono::duration<double>(Clock::now() - t0).count();
    const std::string after = metrics_text();

    int64_t done = 0, in_tokens = 0, out_tokens = 0;
    std::vector<double> ttft, tpot, itl;
    std::string first_error;
    for (const Result& r : results) {
      if (!r.ok) {
        if (first_error.empty()) first_error = r.error;
        continue;
      }
      ++done;
      in_tokens += r.prompt_tokens;
      out_tokens += r.output_tokens;
      ttft.push_back(r.ttft);
      if (r.output_tokens > 1) tpot.push_back((r.latency - r.ttft) / double(r.output_tokens - 1));
      itl.insert(itl.end(), r.itl.begin(), r.itl.end());
    }
    const double queries = metric(after, "mla:prefix_cache_queries_total") - metric(before, "mla:prefix_cache_queries_total");
    const double hits = metric(after, "mla:prefix_cache_hits_total") - metric(before, "mla:prefix_cache_hits_total");
    nlohmann::ordered_json j;
    j["model"] = o->model;
    j["num_prompts"] = o->num_prompts;
    j["completed"] = done;
    j["failed"] = o->num_prompts - done;
    if (!first_error.empty()) j["first_error"] = first_error;
    j["request_rate"] = std::isfinite(o->request_rate) ? json(o->request_rate) : json("inf");
    j["max_concurrency"] = o->max_concurrency;
    j["duration_s"] = duration;
    j["total_input_tokens"] = in_tokens;
    j["total_output_tokens"] = out_tokens;
    j["request_throughput"] = double(done) / duration;
    j["input_throughput"] = double(in_tokens) / duration;
    j["output_throughput"] = double(out_tokens) / duration;
    j["ttft_ms"] = ms(summarize(ttft));
    j["tpot_ms"] = ms(summarize(tpot));
    j["itl_ms"] = ms(summarize(itl));
    j["prefix_cache_queries"] = queries;
    j["prefix_cache_hits"] = hits;
    j["prefix_cache_hit_rate"] = queries > 0 ? hits / queries : 0.0;
    // The run's step graphs and host waits (zeros on the CPU): captures during a steady load cost
    // the steps that record them.
    for (const char* name : {"step_graph_captures", "step_graph_replays", "host_syncs"}) {
      const std::string m = std::string("mla:") + name + "_total";
      j[name] = metric(after, m) - metric(before, m);
    }
    j["step_graphs"] = metric(after, "mla:step_graphs");
    std::printf("%s\n", j.dump(2).c_str());
    rc = done == o->num_prompts ? 0 : kExitFailure;
  });
}

}  // namespace mla::cli
