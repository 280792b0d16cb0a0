// What both runners share: which page data a sparse engine keeps, and how a step's model output
// rows become a StepOutput.
#include "engine/step_runner.h"

#include <algorithm>

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

void split_output_rows(const std::vector<StepRequest>& batch, const std::vector<float>& rows, int64_t vocab,
                       bool last_rows, StepOutput* out) {
  const size_t V = static_cast<size_t>(vocab);
  out->verify_logits.clear();
  out->verify_row.assign(batch.size(), -1);
  out->logits.assign(last_rows ? batch.size() * V : 0, 0.0f);
  size_t at = 0;  // the request's first row
  for (size_t i = 0; i < batch.size(); ++i) {
    const size_t n = batch[i].verify ? static_cast<size_t>(batch[i].n_new) : 1;
    DHS_ASSERT((at + n) * V <= rows.size());
    if (batch[i].verify) {
      out->verify_row[i] = static_cast<int64_t>(out->verify_logits.size() / V);
      out->verify_logits.insert(out->verify_logits.end(), rows.begin() + static_cast<std::ptrdiff_t>(at * V),
                                rows.begin() + static_cast<std::ptrdiff_t>((at + n) * V));
    }
    if (last_rows)
      std::copy_n(rows.begin() + static_cast<std::ptrdiff_t>((at + n - 1) * V), V, out->logits.begin() + static_cast<std::ptrdiff_t>(i * V));
    at += n;
  }
}

}  // namespace dhs
