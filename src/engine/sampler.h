// Token sampling: repetition penalty, then greedy (temperature 0) or
// temperature -> top-k -> top-p -> min-p -> draw, with a seeded RNG so runs repeat.
#pragma once
#include <cstdint>
#include <random>
#include <vector>

namespace dhs {

struct SamplingParams {
  float temperature = 0.0f;        // 0: greedy
  int top_k = 0;                   // 0: off
  float top_p = 1.0f;              // 1: off
  float min_p = 0.0f;              // 0: off
  float repetition_penalty = 1.0f; // 1: off; >1 discourages tokens already in the context
  int repetition_window = 64;      // last N tokens the penalty looks at (0: whole context)
  uint64_t seed = 0;
};

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

// Throws dhs::Error with a clear message for out-of-range parameters.
void validate(const SamplingParams& p);

}  // namespace dhs
