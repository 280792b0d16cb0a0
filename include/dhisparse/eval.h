// dhisparse public API: `dhisparse eval`, the accuracy study of sparse decode
// (DESIGN.md §4): RULER-style synthetic tasks (src/eval/ruler_tasks.h) at given
// lengths, dense and every policy on identical prompts from one shared prefill.
//  * accuracy: greedy output of each policy scored against the task's answers;
//  * fidelity: the dense continuation teacher-forced under each policy, per decode
//    step top-1 agreement and KL(dense || policy) of the next-token distributions;
//  * pages read: per policy, length, layer and KV head, and a histogram of the
//    per-(layer, head, step) fractions.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dhisparse/engine.h"

namespace dhs {

struct EvalOptions {
  std::vector<std::string> tasks;  // task names (src/eval/ruler_tasks.h); empty = all
  std::vector<int64_t> lengths = {4096};
  int samples = 100;               // per task and length
  // Each policy besides dense, parsed from the grammar over the engine's own fields (PolicySpec::parse
  // with EngineOptions::policy as defaults). Dense always runs first: the reference.
  std::vector<PolicySpec> policies;
  bool chat = true;                // wrap the prompt in the model's chat template when it has one
  uint64_t seed = 1;
  std::string out;                 // JSON lines appended here ("" = none)
  std::string trace_out;           // per-(layer, KV head) pages-read fractions per policy and length, JSON
  std::string commit = "unknown", model_name, device;
  std::string gpu_weights, quantization;  // the engine's (EngineOptions), recorded in each row
  std::string draft_quantization = "none";  // (EngineOptions), recorded in speculative rows
  std::string estimator = "sketch4";  // the engine's: row labels name another one only
  // Speculative decoding's acceptance (issue 24), when speculative_k > 0: each policy's greedy
  // output decoded again as cycles of speculative_k drafts on `draft` (sink + recent pages) and
  // verification by the policy one row at a time (the exact, per-row form), counting the drafts
  // kept per verification; the draft costs k steps a cycle, the output is the policy's own.
  int speculative_k = 0;
  PolicySpec draft;
  std::function<void(int64_t done, int64_t total)> progress;  // samples done, for a bar on a terminal
  // Progress lines for a log, where a bar cannot go (stderr piped): the plan up front (tasks x
  // lengths x samples, policies), an estimate of the total time after the first sample, and
  // one line per (task, length) finished with the time so far and an ETA.
  std::function<void(const std::string& line)> log;
};

// Runs the study on `engine` (loaded with a sparse policy, so page summaries are kept),
// writes the rows, prints a table to stdout. Returns 0.
int run_eval(Engine& engine, const EvalOptions& opts);

}  // namespace dhs
