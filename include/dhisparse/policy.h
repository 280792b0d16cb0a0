// dhisparse public API: one spelling of a sparse-decode policy for every front end (CLI, eval, bench, server) and every
// consumer (the CPU policies, the GPU selector, the decode graph's key).
//
// Grammar (what `--sparse-policy`, eval's `--policies` and a server request take):
//   RULE[:VALUE][/R][@ESTIMATOR]
//   dense | coverage:G | topk:K | sinkwindow:K[+M] | solohead:G|K | topfrac:F
//   sinkwindow:K+M: a seeded draft (sparse/draft_seeds.h), K sink and recent pages plus the M
//   heaviest pages of the request's last scored step, per (layer, KV head);
//   /R: a layer selects every R decode steps and reuses its last selection in between;
//   @ESTIMATOR: the page mass estimate (sketch4, minmax, meanspread, gaussian, and the CPU
//   studies' sketch4:KEEP, minmax:ALPHA, sketch2, psketch4:R[:KEEP], qsketch4:R[:KEEP]).
// The fields no front end puts in the string (sinks, recents, combine, dense thresholds) come
// from flags or defaults.
//
// Adding a rule: one row in kRules (policy_spec.cpp), its CPU statement (a SelectionPolicy in
// policy.cpp, made in make_policy) and its GPU rule (page_select.cu's dispatch on SelectRule).
// Nothing in model/, engine/ or the front ends changes.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dhs {

// How the per-q-head (and per-row) normalised masses of one KV group are combined.
//   Sum: their mean (a distribution again: sums to 1, so gamma keeps its meaning).
//   Max: their element-wise max, renormalised to sum 1 (favours pages that any
//        single head needs).
enum class GroupCombine { Sum, Max };

enum class SelectRule : int32_t {
  Dense,       // every page
  Coverage,    // the fewest pages whose estimated mass reaches gamma, per KV head
  TopK,        // Quest: budget pages per KV head
  SinkWindow,  // StreamingLLM: sinks and a recent window, no scoring
  SoloHead,    // one page set for all KV heads of a layer (coverage gamma, or top budget)
  TopFrac,     // the heaviest ceil(frac x pages) pages of each list: a budget that grows with the context
};

// What VALUE means for a rule.
enum class RuleArg { None, Mass, Pages, MassOrPages, Fraction };

struct RuleInfo {
  SelectRule rule;
  const char* name;  // as spelled in the grammar
  RuleArg arg;
  bool scores;       // reads page data (summaries or the key sketch) through an estimator
};
const std::vector<RuleInfo>& rule_table();
const RuleInfo& rule_info(SelectRule rule);

struct PolicySpec {
  SelectRule rule = SelectRule::Dense;
  double gamma = 0.99;                 // Coverage, SoloHead (budget 0): mass to reach, (0, 1]
  int budget = 0;                      // TopK, SinkWindow, SoloHead (> 0): pages per list
  int seed_pages = 0;                  // SinkWindow: plus the heaviest pages of the last scored step
  double frac = 0.25;                  // TopFrac: fraction of each list's pages, (0, 1]
  std::string estimator = "sketch4";   // page mass estimate of scoring rules
  GroupCombine combine = GroupCombine::Sum;
  int n_sink = 1;                      // first pages every sparse list keeps
  int n_recent = 1;                    // last pages every sparse list keeps
  int reselect_every = 1;              // a layer selects every this many decode steps, [1, 64]
  int64_t dense_below = 0;             // requests shorter than this (tokens) read every page
  int64_t min_step_tokens = 0;         // steps holding fewer context tokens in all run dense, no selection

  // RULE[:VALUE][/R][@ESTIMATOR] over `defaults` (which supply everything else). Validated.
  // Throws dhs::Error naming the text and what is wrong.
  static PolicySpec parse(std::string_view text, const PolicySpec& defaults);
  static PolicySpec parse(std::string_view text) { return parse(text, PolicySpec{}); }
  // Throws dhs::Error for a field out of range or a combination that means nothing.
  void validate() const;

  // A request's own policy on an engine running `engine` (the server's --sparse-policy): what a
  // request may change is its rule and the rule's value (gamma, budget or frac; the grammar
  // spells nothing else, so sinks and recents are the engine's too); the rest is the engine's,
  // because it is what the engine keeps or how its step is built:
  // the estimator (the page data appended for it), combine, reselect_every (one schedule per
  // step), the dense thresholds (one decision per step). A scoring rule needs a scoring engine
  // policy (its page data and scoring kernels); SoloHead shares one set over the heads (a
  // different select launch on the GPU), so it is neither asked for nor overridden per request.
  // Throws dhs::Error saying which field is the engine's. Returns the request's spec with the
  // engine's fields filled in.
  PolicySpec as_request_policy(const PolicySpec& engine) const;

  bool dense() const { return rule == SelectRule::Dense; }
  bool scores() const { return rule_info(rule).scores; }
  const char* rule_name() const { return rule_info(rule).name; }
  // The grammar's canonical spelling of rule, value, /R and @estimator (parse(str()) gives them back).
  std::string str() const;
  // Every field, for keys (the decode graph's) and logs; equal keys mean equal policies.
  std::string key() const;
  // "dense", "coverage-0.99", "topk-64", "coverage-0.99-minmax", "coverage-0.99-r4": eval's row labels;
  // `default_estimator` is left out of the label.
  std::string label(const std::string& default_estimator) const;

  bool operator==(const PolicySpec&) const = default;
};

}  // namespace dhs
