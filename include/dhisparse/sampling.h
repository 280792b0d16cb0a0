// dhisparse public API: how a request's next token is drawn.
#pragma once
#include <cstdint>

namespace dhs {

// Repetition penalty, then greedy (temperature 0) or temperature -> top-k -> top-p -> min-p ->
// a draw from a seeded RNG (the request's own stream), so runs repeat.
struct SamplingParams {
  float temperature = 0.0f;        // 0: greedy
  int top_k = 0;                   // 0: off
  float top_p = 1.0f;              // 1: off
  float min_p = 0.0f;              // 0: off
  float repetition_penalty = 1.0f; // 1: off; >1 discourages tokens already in the context
  int repetition_window = 64;      // last N tokens the penalty looks at (0: whole context)
  uint64_t seed = 0;
};

// Throws dhs::Error with a clear message for out-of-range parameters.
void validate(const SamplingParams& p);

}  // namespace dhs
