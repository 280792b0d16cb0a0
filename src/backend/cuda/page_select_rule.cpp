#include "backend/cuda/page_select_rule.h"

#include <climits>

#include "core/error.h"

namespace dhs::cuda {

RulePageData set_rule(const PolicySpec& spec, PageSelectParams* p) {
  DHS_CHECK(!spec.dense(), "the dense policy selects nothing on the device");
  RulePageData d;
  d.scores = spec.scores();
  const std::string& e = spec.estimator;
  d.sketch = d.scores && e == "sketch4";
  DHS_CHECK(!d.scores || d.sketch || e == "minmax" || e == "meanspread" || e == "gaussian",
            "--estimator {}: the CUDA backend has minmax, meanspread, gaussian and sketch4", e);
  // gaussian reads the same mean / variance summaries as meanspread.
  d.kind = e == "minmax" ? SummaryKind::MinMax : SummaryKind::MeanSpread;
  p->kind = d.kind;
  p->gaussian = d.scores && e == "gaussian";
  p->gamma = static_cast<float>(spec.gamma);
  p->budget = 0;
  p->frac = 0.0f;
  p->n_sink = spec.n_sink;
  p->n_recent = spec.n_recent;
  p->combine_max = spec.combine == GroupCombine::Max;
  p->share_heads = false;
  p->dense_below = static_cast<int>(std::min<int64_t>(spec.dense_below, INT_MAX));
  switch (spec.rule) {
    case dhs::SelectRule::Coverage:
      p->rule = SelectRule::Coverage;
      break;
    case dhs::SelectRule::TopK:
      p->rule = SelectRule::TopK;
      p->budget = spec.budget;
      break;
    case dhs::SelectRule::TopFrac:
      // Top-k with k = ceil(frac x the list's pages), in float as top_frac_k (sparse/policy.h).
      p->rule = SelectRule::TopK;
      p->frac = static_cast<float>(spec.frac);
      break;
    case dhs::SelectRule::SinkWindow:
      p->rule = SelectRule::SinkWindow;
      p->n_recent = spec.budget > 0 ? spec.budget - spec.n_sink : spec.n_recent;  // as make_policy reads --budget
      break;
    case dhs::SelectRule::SoloHead:
      p->share_heads = true;
      p->rule = spec.budget > 0 ? SelectRule::TopK : SelectRule::Coverage;
      p->budget = spec.budget;
      break;
    case dhs::SelectRule::Dense:
      break;  // (refused above)
  }
  return d;
}

}  // namespace dhs::cuda
