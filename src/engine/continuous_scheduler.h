// The continuous-batching scheduler over a StepRunner (what it does: dhisparse/scheduler.h).
//
// Each step, in this order:
//   1. requests cancelled since the last step leave (their pages back in the pool);
//   2. every running request that has finished its prefill gets its decode row, oldest first;
//      a row that needs a page the pool does not have preempts the newest running request
//      (recompute: pages freed, back at the head of the queue) until it fits;
//   3. requests still prefilling get chunks of what is left of the token budget;
//   4. waiting requests are admitted in arrival order while a slot, the budget and the pages of
//      their whole prompt are there (plus one page per list for each running request, so that
//      the next decode rows do not preempt at once); the head of the queue is never skipped;
//   5. one StepRunner::step over all rows, sampling the requests whose rows reach the end of
//      their tokens; each sampled token goes through eos, the stream decoder, stop strings,
//      max_tokens and max_model_len, and the request's sink gets the new text.
// Sinks run after the step with no lock held.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "dhisparse/scheduler.h"
#include "engine/spec_controller.h"
#include "engine/step_runner.h"

namespace dhs {

class ContinuousScheduler final : public Scheduler {
 public:
  // max_context: the engine's context (max_model_len may not exceed it).
  ContinuousScheduler(StepRunner& runner, const Tokenizer& tok, int64_t max_context, const SchedulerOptions& o,
                      std::shared_ptr<Clock> clock = steady_clock());
  ~ContinuousScheduler() override;

  const SchedulerOptions& options() const override { return opt_; }
  SubmitResult submit(RequestParams params, RequestSink sink) override;
  void cancel(uint64_t id) override;
  bool step() override;
  void start() override;
  void stop(bool drain) override;
  SchedulerStats stats() const override;

  // Sparse decode's page counts of the steps run since the last call (Engine::take_page_counts).
  PageCounts take_page_counts();
  // Nothing running, waiting or cancelled-but-not-yet-dropped.
  bool idle() const;
  bool started() const { return loop_.joinable(); }

 private:
  struct Request;
  // A decode row, a prefill chunk, a speculative draft row (a decode row on the draft policy whose
  // token is not emitted) or a verify row (k + 1 tokens: the cycle's first token and its drafts).
  enum class RowKind { Normal, Draft, Verify };
  struct Row {
    Request* req;
    int64_t n;
    RowKind kind = RowKind::Normal;
  };
  struct Delivery {
    RequestSink* sink;
    RequestEvent event;
  };
  using Owned = std::unique_ptr<Request>;

  void loop();
  // Step parts (loop thread / the caller of step(), under step_mu_).
  void drop_cancelled(std::vector<Owned>* done);
  // Rows placed so far whose requests are still in their prompt.
  static int prefill_rows(const std::vector<Row>& rows);
  // StepRunner::prefill_alone: what this step may place (Any otherwise), and whether the last
  // step was a prefill step (they alternate with decode steps).
  enum class Phase { Any, DecodeOnly, PrefillOnly };
  Phase phase_ = Phase::Any;
  bool last_prefill_ = false;
  bool prefill_pending();
  void schedule_running(std::vector<Row>* rows, int64_t* budget, std::vector<Owned>* done);
  void admit(std::vector<Row>* rows, int64_t* budget, std::vector<Owned>* done);
  void run_rows(const std::vector<Row>& rows, std::vector<Owned>* done);
  void take_token(Request& r, int32_t id, double now);
  // Speculation: the row a decoding request with speculative_k runs next (a draft, or the verify
  // once its drafts are in); false when it must preempt itself. The verify's outcome after the step.
  bool place_speculative(Request& r, std::vector<Row>* rows, int64_t* budget);
  // logits: the verify rows' [k_cycle + 1, vocab]; or (ids non-null, a greedy request without a
  // penalty) the runner's greedy id of each row.
  void accept_verified(Request& r, float* logits, const int32_t* ids, double now);
  // Why a request's speculative options cannot run here ("" when they can); the draft's policy.
  std::string check_speculation(const GenerateOptions& o, PolicySpec* draft) const;
  static constexpr int kMaxSpeculativeK = 16;
  // Drafts of a new cycle: the request's own k, or (auto) the controller's choice, or a probe
  // where that is 0 (SpecProbe: the request's count and gap move).
  int next_cycle_drafts(Request& r);
  StepCostModel step_cost_;  // every step's time against its rows and context (loop thread)
  // Steps since one with a draft row; past the fit's memory (forget 0.98: ~50 steps, twice that
  // here) the fit's price of a draft is a guess, and probes do not ask it (SpecProbe).
  static constexpr int64_t kFitMemorySteps = 100;
  int64_t steps_since_draft_ = kFitMemorySteps;  // (saturates there: run_rows)
  bool reserve_or_preempt(Request& r, int64_t n);
  void preempt_newest();
  void finish(Request& r, const std::string& reason, const std::string& error, double now);
  Owned remove_running(Request* r);
  void publish(std::vector<Owned>* done);  // stats, pages back, events out (no lock held for sinks)
  int64_t pages_per_token() const;
  int64_t chunk_cap() const;  // tokens of one prefill chunk (the pool's half with a KV hierarchy)

  StepRunner& runner_;
  const Tokenizer& tok_;
  SchedulerOptions opt_;
  std::shared_ptr<Clock> clock_;
  int cap_ = 1;              // requests running at once: max_num_seqs capped by the runner
  int64_t step_tokens_ = 1;  // token budget of a step: max_num_batched_tokens capped by the runner

  std::mutex step_mu_;  // one step at a time
  // The step's state (under step_mu_).
  std::vector<Owned> running_;  // admission order: the newest last
  std::vector<int> free_slots_;
  StepOutput out_;
  PageCounts unread_pages_;

  mutable std::mutex mu_;  // the queue, cancellations, flags, counts that other threads read
  std::condition_variable cv_;
  std::deque<Owned> waiting_;  // arrival order; preempted requests go back to the front
  std::vector<uint64_t> cancels_;
  uint64_t next_id_ = 1;
  int64_t n_running_ = 0;
  uint64_t io_waits_ = 0;  // admissions deferred by the hierarchy's I/O load (loop thread only)
  uint64_t throughput_waits_ = 0;  // of those, by the throughput rule
  bool accepting_ = true, stopping_ = false, abort_all_ = false;
  std::thread loop_;

  mutable std::mutex stats_mu_;
  SchedulerStats stats_;
  std::vector<Delivery> pending_;  // events of the current step
};

}  // namespace dhs
