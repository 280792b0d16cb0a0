// What the engine needs from a backend: a page allocator for its KV pool and
// one forward step of one request. The CPU runner wraps LlamaCpu over a host
// pool; the CUDA runner wraps LlamaCuda over the HBM pool (graph-captured decode).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "dhisparse/engine.h"
#include "kv/page_pool.h"
#include "kv/page_table.h"
#include "model/weight_source.h"

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
  // Fraction of KV pages read by sparse decode steps since the last call (1 when dense).
  virtual double take_pages_read_frac() { return 1.0; }
};

std::unique_ptr<StepRunner> make_cpu_runner(const WeightSource& src, const EngineOptions& o, int64_t max_ctx);
// Throws dhs::Error when this build has no CUDA backend or no GPU is present.
std::unique_ptr<StepRunner> make_cuda_runner(const WeightSource& src, const EngineOptions& o, int64_t max_ctx);

}  // namespace dhs
