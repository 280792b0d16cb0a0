// Token sampling: repetition penalty, then greedy (temperature 0) or
// temperature -> top-k -> top-p -> min-p -> draw, with a seeded RNG so runs repeat.
#pragma once
#include <cstdint>
#include <random>
#include <vector>

#include "dhisparse/sampling.h"

namespace dhs {

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  // logits: [vocab] (modified in place by the penalty); history: tokens so far.
  int32_t sample(float* logits, int64_t vocab, const std::vector<int32_t>& history);
  const SamplingParams& params() const { return p_; }

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> cand_;  // scratch: (logit, id)
};


}  // namespace dhs
