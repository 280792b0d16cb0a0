// Prometheus text exposition (metrics.h). Format: one "# HELP" and "# TYPE" per family, samples
// with the model_name label vLLM puts on each; histograms as cumulative _bucket{le=...} rows,
// "+Inf" equal to _count, then _sum and _count.
#include "server/metrics.h"

#include <cstdio>

namespace dhs::server {
namespace {

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// A label value with Prometheus' escapes (backslash, quote, newline).
std::string label_value(const std::string& s) {
  std::string out;
  for (const char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

class Writer {
 public:
  explicit Writer(const std::string& model) : label_("model_name=\"" + label_value(model) + "\"") {}

  void family(const char* name, const char* type, const char* help) {
    out_ += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  }
  void sample(const std::string& name, double v, const std::string& extra = "") {
    out_ += name + "{" + label_ + (extra.empty() ? "" : "," + extra) + "} " + num(v) + "\n";
  }
  void gauge(const char* name, const char* help, double v) {
    family(name, "gauge", help);
    sample(name, v);
  }
  void counter(const char* name, const char* help, double v) {
    family(name, "counter", help);
    sample(name, v);
  }
  void histogram(const char* name, const char* help, const Histogram& h) {
    family(name, "histogram", help);
    const std::string n = name;
    for (size_t i = 0; i < h.bounds.size() && i < h.counts.size(); ++i)
      sample(n + "_bucket", static_cast<double>(h.counts[i]), "le=\"" + num(h.bounds[i]) + "\"");
    sample(n + "_bucket", static_cast<double>(h.count), "le=\"+Inf\"");
    sample(n + "_sum", h.sum);
    sample(n + "_count", static_cast<double>(h.count));
  }
  std::string take() { return std::move(out_); }

 private:
  std::string label_;
  std::string out_;
};

}  // namespace

std::string render_metrics(const SchedulerStats& s, const std::string& model_name, const HttpCounters& http) {
  Writer w(model_name);
  w.gauge("vllm:num_requests_running", "Requests in the running batch.", static_cast<double>(s.n_running));
  w.gauge("vllm:num_requests_waiting", "Requests waiting to be admitted.", static_cast<double>(s.n_waiting));
  const double usage = s.kv.n_total > 0 ? static_cast<double>(s.kv.n_used) / static_cast<double>(s.kv.n_total) : 0.0;
  w.gauge("vllm:gpu_cache_usage_perc", "KV pool usage as a fraction (1 = full), whatever the device.", usage);
  w.counter("vllm:num_preemptions_total", "Requests preempted (recomputed later) since start.",
            static_cast<double>(s.n_preemptions));
  w.counter("vllm:prompt_tokens_total", "Prompt tokens of requests that started (recompute not counted).",
            static_cast<double>(s.prompt_tokens));
  w.counter("vllm:generation_tokens_total", "Tokens generated.", static_cast<double>(s.generation_tokens));
  // Speculative decoding, as vLLM names its counters: verifications, draft tokens checked, accepted.
  w.counter("vllm:spec_decode_num_drafts_total", "Speculative verifications.", static_cast<double>(s.spec_verifies));
  w.counter("vllm:spec_decode_num_draft_tokens_total", "Draft tokens verified.", static_cast<double>(s.spec_drafted));
  w.counter("vllm:spec_decode_num_accepted_tokens_total", "Draft tokens accepted.", static_cast<double>(s.spec_accepted));
  w.family("vllm:request_success_total", "counter", "Requests finished, by finish reason.");
  w.sample("vllm:request_success_total", static_cast<double>(s.n_finished_stop), "finished_reason=\"stop\"");
  w.sample("vllm:request_success_total", static_cast<double>(s.n_finished_length), "finished_reason=\"length\"");
  w.sample("vllm:request_success_total", static_cast<double>(s.n_finished_abort), "finished_reason=\"abort\"");
  w.sample("vllm:request_success_total", static_cast<double>(s.n_finished_error), "finished_reason=\"error\"");
  w.histogram("vllm:time_to_first_token_seconds", "Arrival to first token.", s.ttft);
  w.histogram("vllm:time_per_output_token_seconds", "Mean time per output token after the first, per request.", s.tpot);
  w.histogram("vllm:e2e_request_latency_seconds", "Arrival to finish.", s.e2e);

  w.counter("dhisparse:requests_submitted_total", "Requests accepted by the scheduler.", static_cast<double>(s.n_submitted));
  w.counter("dhisparse:requests_rejected_queue_full_total", "Requests refused with 429 (queue full).",
            static_cast<double>(s.n_rejected_full));
  w.counter("dhisparse:steps_total", "Scheduler steps run.", static_cast<double>(s.n_steps));
  w.gauge("dhisparse:kv_pages_read_fraction", "KV pages read by sparse decode over all pages, since start (1 = dense).",
          s.pages.read_frac());
  w.counter("dhisparse:kv_pages_read_total", "KV pages read by decode attention.", static_cast<double>(s.pages.read));
  w.counter("dhisparse:kv_pages_total", "KV pages decode attention would read dense.", static_cast<double>(s.pages.total));
  w.gauge("dhisparse:kv_pool_free_blocks", "Free blocks of the KV pool.", static_cast<double>(s.kv.n_free));
  w.gauge("dhisparse:kv_pool_used_blocks", "Used blocks of the KV pool.", static_cast<double>(s.kv.n_used));
  w.gauge("dhisparse:kv_pool_total_blocks", "Blocks of the KV pool.", static_cast<double>(s.kv.n_total));
  w.gauge("dhisparse:kv_check_ok", "1 when the KV pool's accounting holds (free + used = total, no page owned twice).",
          s.kv_check.empty() ? 1.0 : 0.0);
  w.counter("dhisparse:preemptions_swapped_total",
            "Preemptions whose request went to the KV hierarchy's host tier (resumed without recompute).",
            static_cast<double>(s.n_swapped));
  w.counter("dhisparse:kv_tier_hits_total", "KV hierarchy: pages a step read that were in the device tier.",
            static_cast<double>(s.tiers.hits));
  w.gauge("dhisparse:kv_io_load",
          "KV hierarchy: share of recent steps its page moves and in-place reads took, each page at its measured price "
          "(dhisparse:kv_page_cost_us).",
          s.kv_io_load);
  w.gauge("dhisparse:kv_page_cost_us",
          "KV hierarchy: what one more page moved between the tiers costs a step (us), fitted from the host's time in "
          "the hierarchy against the pages moved, never below its bytes at the link's rate (IO-aware admission's price).",
          s.kv_page_cost_us);
  w.counter("dhisparse:admissions_deferred_io_total",
            "KV hierarchy: scheduler steps at which an admission waited because the hierarchy's I/O load with the new "
            "request running would pass --kv-io-admit-max, or (the throughput rule) the batch's tokens per second would "
            "fall with it running (IO-aware admission).",
            static_cast<double>(s.n_admission_io_waits));
  w.counter("dhisparse:admissions_deferred_throughput_total",
            "KV hierarchy: of those, the steps held by the throughput rule (--kv-io-admit throughput).",
            static_cast<double>(s.n_admission_throughput_waits));
  w.gauge("dhisparse:kv_step_page_cost_us",
          "KV hierarchy: the throughput rule's price of a page moved between the tiers (us): the larger of "
          "dhisparse:kv_page_cost_us and the whole step's fitted cost per page.",
          s.kv_step_page_cost_us);
  w.gauge("dhisparse:kv_step_fixed_ms",
          "KV hierarchy: the step's fitted fixed part (ms), which one more running request shares; -1 while not known "
          "(the rows have not varied), which the throughput rule counts as 0.",
          s.kv_step_fixed_ms);
  w.gauge("dhisparse:kv_budget_target_miss",
          "KV hierarchy (--kv-device-budget auto): the miss rate the cache manager sizes the buffers against — "
          "with --kv-budget-io-share, following the link's measured price (pages missed per page read); 0 without "
          "the manager.",
          s.kv_budget_target_miss);
  w.counter("dhisparse:kv_tier_late_total",
            "KV hierarchy (--kv-recall ahead): pages a step read in place from the host tier.",
            static_cast<double>(s.tiers.late));
  w.counter("dhisparse:kv_tier_recalled_total", "KV hierarchy: pages recalled from the host tier.",
            static_cast<double>(s.tiers.recalled));
  w.counter("dhisparse:kv_tier_offloaded_total", "KV hierarchy: pages copied to the host tier.",
            static_cast<double>(s.tiers.offloaded));
  w.counter("dhisparse:kv_tier_dropped_total",
            "KV hierarchy: pages evicted whose host copy was still valid (no copy).", static_cast<double>(s.tiers.dropped));
  w.gauge("dhisparse:kv_tier_host_used_pages", "KV hierarchy: pages of the host tier in use.",
          static_cast<double>(s.tiers.host_used));
  w.counter("dhisparse:kv_tier_steps_total", "KV hierarchy (CUDA): steps with decode rows over the host tier.",
            static_cast<double>(s.tiers.tier_steps));
  w.counter("dhisparse:kv_land_overlapped_steps_total",
            "KV hierarchy (CUDA): of those, the steps whose landing ran beside the resident attention (--kv-land-overlap).",
            static_cast<double>(s.tiers.overlapped_steps));
  w.counter("dhisparse:http_requests_total", "HTTP requests answered.", static_cast<double>(http.n_http_requests));
  w.counter("dhisparse:http_client_errors_total", "HTTP requests answered with a 4xx.",
            static_cast<double>(http.n_client_errors));
  w.counter("dhisparse:http_stream_disconnects_total", "Requests whose client left before the end (streaming or not; the request is cancelled).",
            static_cast<double>(http.n_disconnects));
  w.gauge("dhisparse:http_open_streams", "SSE streams open now.", static_cast<double>(http.n_open_streams));
  return w.take();
}

}  // namespace dhs::server
