// /metrics: the scheduler's and the KV pool's state in Prometheus' text format, under vLLM's
// metric names (so vLLM dashboards read it) plus dhisparse's own (sparse decode's pages read,
// the pool's blocks, whether its accounting holds, the KV hierarchy's page moves).
#pragma once
#include <cstdint>
#include <string>

#include "dhisparse/scheduler.h"

namespace dhs::server {

// What the HTTP layer counts itself.
struct HttpCounters {
  uint64_t n_http_requests = 0;
  uint64_t n_client_errors = 0;   // 4xx answered
  uint64_t n_disconnects = 0;     // streams whose client went before the end
  int64_t n_open_streams = 0;
};

std::string render_metrics(const SchedulerStats& s, const std::string& model_name, const HttpCounters& http);

}  // namespace dhs::server
