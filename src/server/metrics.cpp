// src/server/metrics.cpp — Prometheus text exposition (version 0.0.4) of a MetricsSnapshot.
#include "server/metrics.h"

#include <fmt/format.h>

namespace mla::server {
namespace {

// Prometheus numbers: integers as such, others with enough digits to round-trip.
std::string num(double x) { return fmt::format("{}", x); }

void header(std::string& s, const char* name, const char* type, const char* help) {
  s += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

void scalar(std::string& s, const char* name, const char* type, const char* help, double v) {
  header(s, name, type, help);
  s += fmt::format("{} {}\n", name, num(v));
}

void histogram(std::string& s, const char* name, const char* help, const engine::MetricsSnapshot::Histogram& h) {
  header(s, name, "histogram", help);
  for (size_t i = 0; i < h.bounds.size(); ++i)
    s += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, num(h.bounds[i]), i < h.counts.size() ? h.counts[i] : 0);
  s += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n", name, h.count);
  s += fmt::format("{}_sum {}\n{}_count {}\n", name, num(h.sum), name, h.count);
}

}  // namespace

std::string render_metrics(const engine::MetricsSnapshot& m, int64_t client_disconnects) {
  std::string s;
  scalar(s, "mla:num_requests_running", "gauge", "Requests in the running batch.", double(m.requests_running));
  scalar(s, "mla:num_requests_waiting", "gauge", "Requests waiting to be scheduled.", double(m.requests_waiting));
  scalar(s, "mla:kv_cache_usage_perc", "gauge", "Fraction of KV-cache pages in use (1 = full).", m.kv_cache_usage);
  scalar(s, "mla:prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.",
         double(m.prefix_cache_queries));
  scalar(s, "mla:prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache.",
         double(m.prefix_cache_hits));
  scalar(s, "mla:prompt_tokens_total", "counter", "Prompt tokens processed.", double(m.prompt_tokens));
  scalar(s, "mla:generation_tokens_total", "counter", "Tokens generated.", double(m.generation_tokens));
  header(s, "mla:forward_steps_total", "counter", "Forward steps by attention forward method.");
  for (const auto& [method, n] : m.steps_per_method)
    s += fmt::format("mla:forward_steps_total{{method=\"{}\"}} {}\n", method, n);
  scalar(s, "mla:decode_ahead_steps_total", "counter",
         "Decode batches issued before the last one's tokens reached the host (of forward_steps_total).",
         double(m.decode_ahead_steps));
  scalar(s, "mla:step_graph_captures_total", "counter",
         "Decode steps recorded as graphs (each costs a step's host time again, and more).",
         double(m.step_graph_captures));
  scalar(s, "mla:step_graph_replays_total", "counter", "Decode steps run by replaying a recorded graph.",
         double(m.step_graph_replays));
  scalar(s, "mla:step_graphs", "gauge", "Step graphs kept (and shapes seen once).",
         double(m.step_graphs_kept));
  scalar(s, "mla:host_syncs_total", "counter",
         "Waits of the host for the device: synchronizations and copies to the host.", double(m.host_syncs));
  histogram(s, "mla:time_to_first_token_seconds", "Time from arrival to the first token, in seconds.",
            m.time_to_first_token);
  histogram(s, "mla:inter_token_latency_seconds", "Time between consecutive tokens of a request, in seconds.",
            m.inter_token_latency);
  scalar(s, "mla:client_disconnects_total", "counter", "Requests aborted because their client went away.",
         double(client_disconnects));
  return s;
}

}  // namespace mla::server
