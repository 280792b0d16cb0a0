// Load-adaptive speculative decoding (issue 24, item 5): how many drafts a request's next cycle
// makes (k = 0: decode plainly), from three things measured while serving:
//  * the request's acceptance: the share of its drafts the verifier kept, a running estimate
//    that starts from a prior and forgets old cycles (AcceptanceEstimate);
//  * what steps cost: t = w + m * rows + p * kv, w the step's fixed part (weights, launches), m
//    per row, p per token of context a row attends over, fitted online by least squares with
//    forgetting over every step the scheduler runs (StepCostModel);
//  * the request's context and the batch it shares steps with (w is paid once per step).
// A cycle of k drafts emits E(a, k) = (1 - a^(k+1)) / (1 - a) tokens on average (each draft kept
// with probability a, independently) and costs k draft steps and one verify step; decoding plainly
// emits one token per step. The choice is the k of the most tokens per second, and 0 unless that
// beats plain decoding by min_gain: speculation where it would not pay (short context, batches
// where rows cost more than the shared part) is left off.
#pragma once
#include <array>
#include <cstdint>

namespace dhs {

class StepCostModel {
 public:
  // forget: weight of the past per observation (0.98: ~50 steps of memory).
  explicit StepCostModel(double forget = 0.98);
  // One step: its rows, the context tokens they attend over in all, and its seconds.
  void observe(double rows, double kv_tokens, double seconds);
  double predict(double rows, double kv_tokens) const;
  // Enough steps of different shapes that the fit means something.
  bool ready() const { return n_ >= kMinObservations && rows_seen_varied_; }
  double fixed() const { return theta_[0]; }
  double per_row() const { return theta_[1]; }
  double per_kv_token() const { return theta_[2]; }
  static constexpr int kMinObservations = 8;

 private:
  double forget_;
  std::array<double, 3> theta_{};                // w, m, p
  std::array<std::array<double, 3>, 3> P_{};     // inverse information (recursive least squares)
  int n_ = 0;
  double first_rows_ = -1;
  bool rows_seen_varied_ = false;
};

// The share of a request's drafts the verifier keeps: (accepted + prior_a) / (drafted + prior_n),
// with older cycles down-weighted by forget per cycle.
class AcceptanceEstimate {
 public:
  explicit AcceptanceEstimate(double prior = 0.6, double prior_weight = 4.0, double forget = 0.9)
      : prior_(prior), prior_weight_(prior_weight), forget_(forget) {}
  void observe(int drafted, int accepted);
  double alpha() const { return (accepted_ + prior_ * prior_weight_) / (drafted_ + prior_weight_); }

 private:
  double prior_, prior_weight_, forget_;
  double drafted_ = 0, accepted_ = 0;
};

struct SpecCostInputs {
  int64_t context = 0;        // tokens the request's rows attend over (dense)
  int64_t draft_context = 0;  // tokens a draft row attends over (its sink + recent pages)
  int batch = 1;              // requests sharing the step (the fixed part is split among them)
  bool verify_reads_once = false;  // the runner's verify reads the pages once for all rows (else per row)
};

struct SpecChoice {
  int k = 0;
  double gain = 1.0;  // tokens per second against decoding plainly (1: k = 0)
};

// Expected tokens a cycle of k drafts emits at acceptance a.
double spec_expected_tokens(double a, int k);

// The k in [0, k_max] of the most tokens per second, 0 unless gain >= min_gain.
SpecChoice choose_speculation(const StepCostModel& cost, double alpha, const SpecCostInputs& in, int k_max,
                              double min_gain = 1.03);

// Probing (auto): choose_speculation learns only from cycles that run. A request whose choice is 0
// may never draft, so its acceptance stays the prior, and the fit of decode steps alone (rows 1,
// the context a few tokens apart) cannot tell the weights' part from the KV's — on the H100 at
// 128k x 1 (8B shape, session 42) auto never drafted. So a request that decodes plainly runs, now
// and then, a cycle of kProbeDrafts drafts: once the plain tokens since its last probe reach its
// gap, while its context is more than twice the draft's (else a draft reads what a step reads) and
// the verify reads the KV once for its rows (else no cycle pays, whatever the acceptance),
// and only where the fit cannot yet say (not ready, or no draft step among the steps it remembers:
// its split of a plain step into weights and KV is then a guess) or would speculate at an
// acceptance drafts do reach (kProbeAlpha). The gap doubles with every probe, from kFirstProbeGap
// to kMaxProbeGap, so a request whose drafts are never kept spends at most kProbeDrafts draft
// steps per doubling of its output up to ~16k tokens (2 log2(n / 16 + 1) in all), then
// kProbeDrafts per kMaxProbeGap tokens.
class SpecProbe {
 public:
  static constexpr int kProbeDrafts = 2;
  static constexpr int64_t kFirstProbeGap = 16, kMaxProbeGap = 8192;
  static constexpr double kProbeAlpha = 0.9;
  // A plain decode token of the request.
  void plain_token() { ++since_; }
  // The drafts of a cycle whose choice was 0: kProbeDrafts (within k_max) when a probe is due,
  // else 0. A probe restarts the count and doubles the gap.
  // fit_saw_drafts: a draft step is among the steps the fit remembers.
  int drafts(const StepCostModel& cost, const SpecCostInputs& in, int k_max, bool fit_saw_drafts);
  int64_t gap() const { return gap_; }

 private:
  int64_t since_ = 0, gap_ = kFirstProbeGap;
};

}  // namespace dhs
