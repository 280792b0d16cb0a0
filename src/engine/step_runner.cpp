// What both runners share: the front end's sparse options as a sparse/ PolicyConfig.
#include "engine/step_runner.h"

#include "core/error.h"

namespace dhs {

PolicyConfig policy_config(const EngineOptions& o) {
  PolicyConfig pc;
  pc.name = o.sparse_policy;
  pc.gamma = o.gamma;
  pc.budget = o.budget;
  pc.dense_below = o.dense_below;
  pc.min_step_tokens = o.sparse_min_tokens;
  pc.estimator = o.estimator;
  pc.n_sink = o.sink_pages;
  pc.n_recent = o.recent_pages;
  pc.reselect_every = o.reselect_every;
  DHS_CHECK(o.combine == "sum" || o.combine == "max", "--combine must be sum or max, got '{}'", o.combine);
  pc.combine = o.combine == "max" ? GroupCombine::Max : GroupCombine::Sum;
  return pc;
}

GpuPageData gpu_page_data(const EngineOptions& o) {
  GpuPageData d;
  if (o.sparse_policy == "dense") return d;
  if (o.keep_all_estimators) {
    d.summaries = "both";
    d.key_sketch = true;
  } else if (o.estimator == "sketch4") {
    d.key_sketch = true;
  } else {
    DHS_CHECK(o.estimator == "minmax" || o.estimator == "meanspread" || o.estimator == "gaussian",
              "--estimator {}: the CUDA backend has minmax, meanspread, gaussian and sketch4", o.estimator);
    d.summaries = o.estimator == "minmax" ? "minmax" : "meanspread";
  }
  return d;
}

}  // namespace dhs
