// src/server/metrics.h — the engine's counters in Prometheus text format (GET /metrics).
#pragma once
#include <string>

#include "engine/service.h"

namespace mla::server {

// mla:num_requests_running, mla:num_requests_waiting, mla:kv_cache_usage_perc, the prefix-cache and
// token counters, mla:forward_steps_total{method=...}, and the TTFT / inter-token latency histograms.
std::string render_metrics(const engine::MetricsSnapshot& m);

}  // namespace mla::server
