// The benches' decode policies (`--policies`): the engine's PolicySpec plus what only a bench has
// (per-(layer, KV head) budget fractions replayed from a real model's trace, Quest's token
// budget), read from the benches' spelling. Shared by dhisparse bench and its --hierarchy mode.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dhisparse/policy.h"
#include "dhisparse/model_config.h"

namespace dhs {

// Spelled with "@sketch4": the policy's pages chosen by the 4-bit key sketch.
bool chosen_by_sketch(const std::string& spec);
// A policy spec without its "/R" (reselect) suffix.
std::string without_reselect(const std::string& spec);
// Policies whose pages MinMax page summaries choose (sparse, scored, not by the sketch).
bool needs_minmax(const std::string& spec);

struct BenchPolicy {
  PolicySpec spec;
  std::vector<float> frac;  // per (layer, KV head) budget fractions of a trace, or empty
  double gamma = 1.0;
  std::string budgets = "all pages";
  int reselect_every = 1;
  bool dense_label = false;  // spelled "dense": the step other rows are compared with
};

// dense; trace:LABEL (top-k with the budgets of `trace` at trace_len, 0: its longest);
// quest:TOKENS; any rule of the engine's grammar; each optionally @sketch4, then /R.
BenchPolicy parse_bench_policy(const std::string& pol_spec, const std::string& trace, int64_t trace_len, const ModelConfig& cfg);

}  // namespace dhs
