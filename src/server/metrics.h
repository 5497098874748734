// src/server/metrics.h — the engine's counters in Prometheus text format (GET /metrics).
#pragma once
#include <string>

#include "engine/service.h"

namespace mla::server {

// mla:num_requests_running, mla:num_requests_waiting, mla:kv_cache_usage_perc, the prefix-cache and
// token counters, mla:forward_steps_total{method=...}, the step graphs' and host waits' counters, the
// TTFT / inter-token latency histograms, and the server's own mla:client_disconnects_total (requests
// aborted because their client went away).
std::string render_metrics(const engine::MetricsSnapshot& m, int64_t client_disconnects = 0);

}  // namespace mla::server
