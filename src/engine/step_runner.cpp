// What both runners share: which page data a sparse engine keeps.
#include "engine/step_runner.h"

#include "core/error.h"

namespace dhs {

GpuPageData gpu_page_data(const EngineOptions& o) {
  GpuPageData d;
  if (o.policy.dense()) return d;
  if (o.keep_all_estimators) {
    d.summaries = "both";
    d.key_sketch = true;
  } else if (o.policy.estimator == "sketch4") {
    d.key_sketch = true;
  } else {
    DHS_CHECK(o.policy.estimator == "minmax" || o.policy.estimator == "meanspread" || o.policy.estimator == "gaussian",
              "--estimator {}: the CUDA backend has minmax, meanspread, gaussian and sketch4", o.policy.estimator);
    d.summaries = o.policy.estimator == "minmax" ? "minmax" : "meanspread";
  }
  return d;
}

}  // namespace dhs
