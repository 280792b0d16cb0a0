// Sampling on the host for runners that copy a step's logits back: one Sampler per
// request slot, padded vocabulary ids masked. (The CPU runner; the CUDA runner until its
// device sampler takes per-request parameters.)
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "engine/sampler.h"
#include "engine/step_runner.h"

namespace dhs {

class HostSampling {
 public:
  HostSampling(int64_t vocab, int max_batch) : vocab_(vocab), n_sampled_(vocab), by_slot_(static_cast<size_t>(max_batch)) {}
  // Ids [0, n) may be sampled (StepRunner::set_sampled_vocab).
  void set_sampled_vocab(int64_t n);
  // Slot `slot` starts a request: its parameters, its RNG from p.seed. Throws for bad parameters.
  void begin(int slot, const SamplingParams& p);
  // For every request that asked, out->sampled gets its next token, from its row of
  // out->logits ([n_requests, vocab], penalised in place); the logits are then dropped
  // unless keep_logits.
  void sample(const std::vector<StepRequest>& batch, StepOutput* out, bool keep_logits);

 private:
  int64_t vocab_, n_sampled_;
  std::vector<std::optional<Sampler>> by_slot_;
};

}  // namespace dhs
