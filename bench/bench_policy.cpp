#include "bench/bench_policy.h"

#include <string_view>

#include "eval/budget_trace.h"

namespace dhs {

namespace {
constexpr std::string_view kSketchSuffix = "@sketch4";
}  // namespace

bool chosen_by_sketch(const std::string& spec) {
  return spec.size() > kSketchSuffix.size() &&
         spec.compare(spec.size() - kSketchSuffix.size(), kSketchSuffix.size(), kSketchSuffix) == 0;
}
std::string without_reselect(const std::string& spec) { return spec.substr(0, spec.rfind('/')); }
bool needs_minmax(const std::string& spec) {
  const std::string s = without_reselect(spec);
  return s != "dense" && !chosen_by_sketch(s);
}

BenchPolicy parse_bench_policy(const std::string& pol_spec, const std::string& trace, int64_t trace_len, const ModelConfig& cfg) {
  BenchPolicy bp;
  // "/R" last: each layer selects every R steps (staggered), reusing its lists between.
  std::string spec = pol_spec;
  if (const size_t sl = spec.rfind('/'); sl != std::string::npos) {
    bp.reselect_every = std::stoi(spec.substr(sl + 1));
    spec = spec.substr(0, sl);
  }
  // "@sketch4": the same budgets, chosen by the 4-bit key sketch (its scoring cost included).
  const bool sketch = chosen_by_sketch(spec);
  const std::string pol = sketch ? spec.substr(0, spec.size() - kSketchSuffix.size()) : spec;
  PolicySpec& pc = bp.spec;
  pc.reselect_every = bp.reselect_every;
  pc.estimator = sketch ? "sketch4" : "minmax";
  bp.dense_label = pol == "dense";
  if (pol == "dense") {
    pc.rule = SelectRule::Dense;
  } else if (pol.rfind("trace:", 0) == 0) {
    const BudgetTrace tr = load_budget_trace(trace, pol.substr(6), trace_len);
    pc.rule = SelectRule::TopK;
    bp.frac = tr.mapped(static_cast<int>(cfg.n_layers), static_cast<int>(cfg.n_heads_kv));
    if (tr.label.rfind("coverage-", 0) == 0) bp.gamma = std::stod(tr.label.substr(9));
    bp.budgets = "per-(layer, KV head) fractions replayed from " + tr.model + " at " + std::to_string(tr.length) + " tokens";
  } else if (pol.rfind("quest:", 0) == 0) {
    pc.rule = SelectRule::TopK;
    pc.budget = std::stoi(pol.substr(6)) / 16;
    bp.budgets = "top-k, " + pol.substr(6) + " tokens per list";
  } else {
    // Any rule of the engine's grammar (dhisparse/policy.h) with its value, e.g. coverage:0.99 or
    // topfrac:0.3, in the bench's spelling: "@sketch4" then "/R" after it (read above), minmax otherwise.
    pc = PolicySpec::parse(pol, pc);
    bp.budgets = pc.str();
  }
  return bp;
}

}  // namespace dhs
