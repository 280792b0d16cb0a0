#include "engine/spec_accept.h"

#include <algorithm>

#include "core/error.h"

namespace dhs {

namespace {

// max(0, p - q) over p's support (where the residual can be positive), unnormalised.
TokenDist residual(const TokenDist& p, const TokenDist& q) {
  TokenDist r;
  for (size_t i = 0; i < p.ids.size(); ++i) {
    const double w = std::max(0.0, p.w[i] / p.total - q.prob(p.ids[i]));
    if (w <= 0.0) continue;
    r.ids.push_back(p.ids[i]);
    r.w.push_back(w);
    r.total += w;
  }
  return r;
}

}  // namespace

SpecVerdict accept_sampled(const std::vector<int32_t>& drafts, const std::vector<TokenDist>& q,
                           const std::vector<TokenDist>& p, Sampler& rng) {
  DHS_ASSERT(q.size() == drafts.size() && p.size() == drafts.size() + 1);
  SpecVerdict v;
  for (size_t j = 0; j < drafts.size(); ++j) {
    const double pj = p[j].prob(drafts[j]), qj = q[j].prob(drafts[j]);
    DHS_ASSERT(qj > 0.0);  // it was drawn from q
    if (pj >= qj || rng.uniform() < pj / qj) {
      ++v.accepted;
      continue;
    }
    // Rejected: p(d) < q(d), so the residual holds mass.
    const TokenDist r = residual(p[j], q[j]);
    v.next = r.ids.empty() ? rng.draw(p[j]) : rng.draw(r);
    return v;
  }
  v.next = rng.draw(p.back());
  return v;
}

}  // namespace dhs
