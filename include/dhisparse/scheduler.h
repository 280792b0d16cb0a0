// dhisparse serving API: many requests at once over one engine (continuous batching).
//
// Requests arrive at any time (submit, from any thread) and wait in a bounded queue; each
// step runs the decode row of every running request plus prefill chunks of new ones under a
// token budget, samples, and hands each request its new text through its sink. A request
// leaves the moment it finishes or is cancelled, its KV pages back in the pool in that step.
// When the pool runs out mid-decode the newest running request is preempted: its pages are
// freed and it waits again at the head of the queue; on resume its prompt and the tokens it
// already generated are prefilled again (recompute), and it goes on where it stopped.
//
// Either one thread owns the step loop (start / stop: the server), or the caller drives it
// with step() (Engine::generate, tests). The clock is injectable so that the scheduler's
// timing metrics are tested without a GPU or a wall clock.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dhisparse/engine.h"

namespace dhs {

// speculative_k "auto": each cycle's drafts (0 .. kSpeculativeAutoMaxK) chosen from the request's
// measured acceptance and the measured cost of steps, 0 where speculation would not pay.
inline constexpr int kSpeculativeAuto = -2;
inline constexpr int kSpeculativeAutoMaxK = 8;

struct SchedulerOptions {
  int max_num_seqs = 64;                  // requests running at once (vLLM --max-num-seqs)
  int64_t max_num_batched_tokens = 2048;  // tokens of one step: decode rows + prefill chunks
  int64_t max_model_len = 0;              // prompt + generated tokens per request; 0: the engine's context
  int max_waiting = 1024;                 // requests queued beyond this are refused (HTTP 429)
  // Speculative decoding for requests that do not choose (GenerateOptions::speculative_k -1):
  // drafts per cycle (0: off; kSpeculativeAuto: chosen per cycle, engine/spec_controller.h) and
  // the draft's pages.
  int speculative_k = 0;
  std::string draft_policy = "sinkwindow:16";
  // IO-aware admission (a KV hierarchy): a new request that needs room made by offloading running
  // requests' pages waits while the hierarchy's I/O load with it running would be above this
  // (StepRunner::kv_io_load_admitting: the share of recent steps its page moves and in-place
  // reads took, at their measured price, plus what the working sets the pool would no longer
  // hold would add).
  double kv_io_admit_max = 0.8;
  // And (the throughput rule) waits while the batch's tokens per second would fall with it
  // running: the step's cost fitted against its rows, prefill tokens and pages moved
  // (StepRunner::kv_admitting_pays, kv/step_cost.h); a request that adds no pages to the link
  // is never held by it. false: the load rule alone (`serve --kv-io-admit load`).
  bool kv_admit_throughput = true;
};

struct RequestParams {
  std::vector<int32_t> prompt;  // ids, BOS included where the model wants it
  GenerateOptions options;      // sampling, max_tokens, stop strings, ignore_eos
};

// What a request's sink receives. Sinks run on the thread that steps (the loop thread, or the
// caller of step()); they must be short and must not call back into the scheduler except
// cancel(). The last event of every accepted request has finished = true, exactly once.
struct RequestEvent {
  uint64_t id = 0;
  std::string text;             // printable text since the last event (never half a UTF-8
                                // character, never part of a stop string)
  std::vector<int32_t> tokens;  // ids sampled since the last event (a stop token not included)
  bool finished = false;
  std::string finish_reason;    // when finished: "stop" (eos or stop string), "length"
                                // (max_tokens or max_model_len), "abort" (cancelled), "error"
  std::string error;            // finish_reason "error": why
  int64_t n_prompt = 0;         // prompt tokens
  int64_t n_generated = 0;      // tokens generated so far (the stop token not included)
  // Speculative decoding so far: verification steps, draft tokens checked, accepted.
  int64_t spec_verifies = 0, spec_drafted = 0, spec_accepted = 0;
};
using RequestSink = std::function<void(const RequestEvent&)>;

enum class SubmitStatus {
  Accepted,
  Invalid,       // bad parameters or a prompt that can never fit (HTTP 400); error says why
  QueueFull,     // max_waiting requests already wait (HTTP 429)
  ShuttingDown,  // stop() was called (HTTP 503)
};
struct SubmitResult {
  SubmitStatus status = SubmitStatus::Accepted;
  uint64_t id = 0;    // when accepted
  std::string error;  // when not
};

// Seconds on a monotonic clock.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual double now() const = 0;
};
std::shared_ptr<Clock> steady_clock();

// A cumulative histogram with fixed upper bounds (Prometheus' shape): counts[i] observations
// <= bounds[i]; count and sum over all of them.
struct Histogram {
  std::vector<double> bounds;
  std::vector<uint64_t> counts;
  uint64_t count = 0;
  double sum = 0.0;
  explicit Histogram(std::vector<double> upper_bounds = {});
  void add(double v);
  double quantile(double q) const;  // estimate from the buckets (upper bound of the bucket)
};

struct SchedulerStats {
  int64_t n_running = 0, n_waiting = 0;
  uint64_t n_steps = 0;
  uint64_t n_preemptions = 0;
  uint64_t n_swapped = 0;          // of those, swapped to the KV hierarchy's host tier (not recomputed)
  uint64_t n_admission_io_waits = 0;  // steps at which an admission waited: the I/O load with it running was too high
  uint64_t n_admission_throughput_waits = 0;  // of those, held by the throughput rule (the load alone was not too high)
  double kv_io_load = 0.0;         // the hierarchy's I/O load now (0 without one)
  double kv_page_cost_us = 0.0;    // what one more page moved between the tiers costs a step, fitted (µs)
  double kv_step_page_cost_us = 0.0;  // the throughput rule's price of a page: the larger of that and the whole step's fitted slope (µs)
  double kv_step_fixed_ms = -1.0;     // the step's fitted fixed part (ms; < 0: not known, counted as 0)
  double kv_budget_target_miss = 0.0;  // the cache manager's miss target (0 without it; RunnerTiers::budget_target_miss)
  uint64_t n_submitted = 0, n_rejected_full = 0;
  uint64_t n_finished_stop = 0, n_finished_length = 0, n_finished_abort = 0, n_finished_error = 0;
  uint64_t prompt_tokens = 0;      // prompt tokens of requests that started (recompute not counted)
  uint64_t generation_tokens = 0;  // tokens generated
  // Speculative decoding: verification steps, the draft tokens they checked, those accepted.
  uint64_t spec_verifies = 0, spec_drafted = 0, spec_accepted = 0;
  PoolStats kv;                    // the KV pool now
  std::string kv_check;            // "" when the pool's accounting holds
  PageCounts pages;                // sparse decode's pages read / all, since start
  TierCounts tiers;                // the KV hierarchy's page moves, since start (0 without a host tier)
  // Seconds: time to first token, per output token after the first (one observation per
  // request: its mean), arrival to finish.
  Histogram ttft, tpot, e2e;
};

class Scheduler {
 public:
  virtual ~Scheduler() = default;
  virtual const SchedulerOptions& options() const = 0;
  // Thread-safe. Checks the request (ids in range, a prompt shorter than max_model_len whose
  // pages fit the pool, sampling parameters) and queues it.
  virtual SubmitResult submit(RequestParams params, RequestSink sink) = 0;
  // Thread-safe; unknown or finished ids are ignored. The request ends with "abort" and its
  // pages return to the pool at the next step.
  virtual void cancel(uint64_t id) = 0;
  // One step in the calling thread: drop cancelled requests, admit waiting ones, run the
  // step, deliver events. Returns false when there was nothing to run. Not while start()ed.
  virtual bool step() = 0;
  // A thread owns the step loop from now on (sleeps while idle).
  virtual void start() = 0;
  // Stops accepting requests; drain: runs every accepted request to its end; otherwise
  // aborts them all. Then joins the loop thread (if started). Idempotent.
  virtual void stop(bool drain) = 0;
  virtual SchedulerStats stats() const = 0;
};

}  // namespace dhs
