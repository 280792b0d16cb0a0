// What the engine needs from a backend: a page allocator for its KV pool and
// one forward step of one request. The CPU runner wraps LlamaCpu over a host
// pool; the CUDA runner wraps LlamaCuda over the HBM pool (graph-captured decode).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dhisparse/engine.h"
#include "kv/page_pool.h"
#include "kv/page_table.h"
#include "model/weight_source.h"
#include "sparse/policy.h"

namespace dhs {

class StepRunner {
 public:
  virtual ~StepRunner() = default;
  virtual const ModelConfig& config() const = 0;
  virtual PagePool& pages() = 0;  // allocator / accounting of the KV pool
  // Runs n new tokens of one request whose table has room for them, commits them,
  // and writes the last token's logits ([vocab]).
  virtual void step(PageTable& table, const int32_t* ids, int64_t n, std::vector<float>* logits) = 0;
  virtual int64_t max_step_tokens() const = 0;  // prefill chunk
  // Drops tokens past n_tokens (and whatever the backend derived from them).
  virtual void truncate(PageTable& table, int64_t n_tokens) { table.truncate(pages(), n_tokens); }
  // Pages read by sparse decode steps since the last call, then reset.
  virtual PageCounts take_page_counts() = 0;
  // The policy of the following decode steps (prefill stays dense). Scoring policies
  // need page summaries, kept when the runner was built with a sparse policy.
  virtual void set_policy(const PolicyConfig& pc) = 0;
  // Fits and installs the projected sketch's key basis from the first n_tokens keys of `table`
  // (Engine::calibrate_key_basis); returns the mean variance fraction kept.
  // query_aware: from the queries recorded since capture_queries(true) too (fit_qk_basis).
  virtual double fit_key_basis(const PageTable& table, int64_t n_tokens, int rank, bool query_aware) = 0;
  // Records every layer's RoPE'd query rows of the following steps (on) or drops them (off).
  virtual void capture_queries(bool on) = 0;
};

// EngineOptions' sparse fields as the sparse/ factory reads them.
PolicyConfig policy_config(const EngineOptions& o);

// The page data the CUDA backend keeps for scoring (CudaModelOptions::summaries / key_sketch):
// none when loaded dense; when sparse, what `estimator` reads (sketch4: the key sketch; minmax:
// MinMax summaries; meanspread and gaussian: mean / variance summaries), or everything when
// keep_all_estimators (eval compares estimators on one prefill). Each kind costs HBM and a kernel
// per layer and step.
struct GpuPageData {
  std::string summaries = "none";  // none | minmax | meanspread | both
  bool key_sketch = false;
};
GpuPageData gpu_page_data(const EngineOptions& o);

std::unique_ptr<StepRunner> make_cpu_runner(const WeightSource& src, const EngineOptions& o, int64_t max_ctx);
// Throws dhs::Error when this build has no CUDA backend or no GPU is present.
std::unique_ptr<StepRunner> make_cuda_runner(const WeightSource& src, const EngineOptions& o, int64_t max_ctx);

}  // namespace dhs
