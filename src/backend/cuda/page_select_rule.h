// A sparse policy (dhisparse/policy.h) as the select kernels' rule fields: the GPU statement of
// each rule, beside its CPU statement in sparse/policy.cpp. Adding a rule: its row in
// sparse/policy_spec.cpp, its SelectionPolicy, a case here and, where the kernel needs a new cut,
// a branch in page_select.cu. The PageSelector and the model never name a rule.
#pragma once
#include "backend/cuda/page_select.h"
#include "dhisparse/policy.h"

namespace dhs::cuda {

// The page data a rule's estimate reads on the device.
struct RulePageData {
  bool scores = false;                    // reads page data at all (SinkWindow and Dense do not)
  bool sketch = false;                    // the per-token 4-bit key sketch (estimator sketch4)
  SummaryKind kind = SummaryKind::MinMax; // else these summaries
};

// Sets p's rule fields (rule, gamma, budget, frac, sinks, window, combine, share_heads,
// dense_below, gaussian, kind) from `spec`, leaving buffers alone; returns what it reads.
// Throws dhs::Error for a rule or estimator the device does not have. spec must be sparse.
RulePageData set_rule(const PolicySpec& spec, PageSelectParams* p);

}  // namespace dhs::cuda
