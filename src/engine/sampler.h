// Token sampling: repetition penalty, then greedy (temperature 0) or
// temperature -> top-k -> top-p -> min-p -> draw, with a seeded RNG so runs repeat.
#pragma once
#include <cstdint>
#include <random>
#include <vector>

#include "dhisparse/sampling.h"

namespace dhs {

// The distribution a sampled (temperature > 0) token is drawn from, after the penalty,
// temperature, top-k, top-p and min-p: the surviving ids, most likely first, with weights that
// sum to `total` (the draw scales its uniform number, not the weights, so that it stays the same
// arithmetic as before this type existed).
struct TokenDist {
  std::vector<int32_t> ids;
  std::vector<double> w;
  double total = 0.0;
  double prob(int32_t id) const;  // 0 for an id that did not survive
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  // logits: [vocab] (modified in place by the penalty); history: tokens so far.
  int32_t sample(float* logits, int64_t vocab, const std::vector<int32_t>& history);
  // What sample() draws from when temperature > 0 (logits modified in place, as there).
  void distribution(float* logits, int64_t vocab, const std::vector<int32_t>& history, TokenDist* out);
  // A draw from `d` with this sampler's RNG; a uniform number in [0, 1) from it.
  int32_t draw(const TokenDist& d);
  double uniform();
  const SamplingParams& params() const { return p_; }

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> cand_;  // scratch: (logit, id)
};


}  // namespace dhs
