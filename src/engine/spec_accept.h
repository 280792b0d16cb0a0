// Speculative sampling's acceptance rule for sampled requests (Leviathan et al., "Fast Inference
// from Transformers via Speculative Decoding", 2023; Chen et al. 2023): draft token d_j, drawn from
// the draft's distribution q_j, is kept with probability min(1, p_j(d_j) / q_j(d_j)), p_j the
// verifier's distribution at that row; the first one rejected is replaced by a draw from the
// residual max(0, p_j - q_j), renormalised; when all are kept, one more token is drawn from the
// last row's p. The tokens so produced are distributed exactly as drawing each one from p in turn
// (non-speculative sampling), whatever q is. Both distributions come from the same Sampler
// transform (penalty, temperature, top-k, top-p, min-p), so every sampling parameter applies to
// draft and verifier alike. (Greedy requests take the simpler rule in the scheduler: keep the
// drafts equal to each row's argmax.)
#pragma once
#include <cstdint>
#include <vector>

#include "engine/sampler.h"

namespace dhs {

struct SpecVerdict {
  int accepted = 0;   // drafts kept, in order
  int32_t next = -1;  // the token after them: the residual's draw, or p_k's when all were kept
};

// drafts: [k]; q: [k] the draft's distributions they were drawn from; p: [k + 1] the verifier's.
// Draws (acceptance tests, the residual or the bonus token) use `rng`'s generator.
SpecVerdict accept_sampled(const std::vector<int32_t>& drafts, const std::vector<TokenDist>& q,
                           const std::vector<TokenDist>& p, Sampler& rng);

}  // namespace dhs
