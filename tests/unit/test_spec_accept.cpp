// Speculative sampling's acceptance rule (engine/spec_accept.h): the tokens it emits must be
// distributed as the verifier's p, whatever the draft's q. 100,000 cycles of k = 3 drafts over a
// vocabulary of 8, with distributions from the Sampler's own transform (temperature, top-k, top-p,
// so some tokens have p = 0 where q > 0 and the other way round); Pearson's chi-square of the
// first and second emitted tokens against p_0 and p_1 must stay under the 1% critical value, and a
// token outside p's support must never come out. Seeds are fixed (the test is deterministic); a
// correct rule passes at 99% of seeds, and the two wrong rules below fail by orders of magnitude.
#include <gtest/gtest.h>

#include <array>
#include <vector>

#include "engine/sampler.h"
#include "engine/spec_accept.h"

namespace dhs {
namespace {

constexpr int kVocab = 8;
constexpr int kTrials = 100000;

TokenDist dist_of(std::array<float, kVocab> logits, float temperature, int top_k, float top_p) {
  SamplingParams sp;
  sp.temperature = temperature;
  sp.top_k = top_k;
  sp.top_p = top_p;
  Sampler s(sp);
  TokenDist d;
  s.distribution(logits.data(), kVocab, {}, &d);
  return d;
}

// Pearson's chi-square of observed counts against distribution p; df = the support's size - 1.
double chi_square(const std::array<int64_t, kVocab>& seen, const TokenDist& p, int64_t n, int* df) {
  double x2 = 0.0;
  *df = -1;
  for (int t = 0; t < kVocab; ++t) {
    const double e = p.prob(t) * static_cast<double>(n);
    if (e == 0.0) continue;
    x2 += (static_cast<double>(seen[t]) - e) * (static_cast<double>(seen[t]) - e) / e;
    ++*df;
  }
  return x2;
}

// The chi-square distribution's 99th percentile for df = 1..7.
double critical_1pct(int df) {
  static const double v[] = {0.0, 6.635, 9.210, 11.345, 13.277, 15.086, 16.812, 18.475};
  return v[df];
}

struct Emitted {
  std::array<int64_t, kVocab> first{}, second{};
  int64_t n_second = 0, accepted = 0;
};

template <class Rule>
Emitted run_cycles(const std::vector<TokenDist>& q, const std::vector<TokenDist>& p, Rule rule) {
  SamplingParams sp;
  sp.temperature = 1.0f;
  sp.seed = 1;
  Sampler rng(sp);
  Emitted e;
  for (int i = 0; i < kTrials; ++i) {
    std::vector<int32_t> drafts;
    for (const TokenDist& qj : q) drafts.push_back(rng.draw(qj));
    const SpecVerdict v = rule(drafts, q, p, rng);
    std::vector<int32_t> out(drafts.begin(), drafts.begin() + v.accepted);
    out.push_back(v.next);
    ++e.first[static_cast<size_t>(out[0])];
    if (out.size() >= 2) {
      ++e.second[static_cast<size_t>(out[1])];
      ++e.n_second;
    }
    e.accepted += v.accepted;
  }
  return e;
}

class SpecAccept : public ::testing::Test {
 protected:
  // The verifier is sharper and cut by top-k 5; the draft is flatter, cut by top-p, and prefers
  // other tokens: they disagree where it matters.
  std::vector<TokenDist> p = {dist_of({2.0f, 1.5f, 0.2f, -1.0f, 0.8f, 3.0f, -2.0f, 0.0f}, 0.7f, 5, 1.0f),
                              dist_of({0.1f, 2.5f, 2.4f, 0.3f, -0.5f, 1.0f, 0.0f, -3.0f}, 0.7f, 5, 1.0f),
                              dist_of({1.0f, 0.0f, 0.5f, 2.0f, 0.0f, 0.0f, 1.5f, 0.2f}, 0.7f, 5, 1.0f),
                              dist_of({0.0f, 0.0f, 0.0f, 0.0f, 3.0f, 0.0f, 0.0f, 1.0f}, 0.7f, 5, 1.0f)};
  std::vector<TokenDist> q = {dist_of({0.5f, 2.0f, 1.0f, 1.0f, 0.0f, 1.0f, 1.5f, 0.5f}, 1.3f, 0, 0.9f),
                              dist_of({1.0f, 0.5f, 2.5f, 1.0f, 1.0f, 0.0f, 1.0f, 0.5f}, 1.3f, 0, 0.9f),
                              dist_of({0.5f, 1.0f, 1.0f, 1.0f, 0.5f, 1.0f, 1.0f, 1.0f}, 1.3f, 0, 0.9f)};
};

TEST_F(SpecAccept, EmittedTokensAreDistributedAsTheVerifiers) {
  ASSERT_LT(p[0].ids.size(), static_cast<size_t>(kVocab)) << "p has no zero: the support check is void";
  const Emitted e = run_cycles(q, p, accept_sampled);
  for (int t = 0; t < kVocab; ++t) {
    if (p[0].prob(t) == 0.0) {
      EXPECT_EQ(e.first[t], 0) << "token " << t << " is outside p_0's support";
    }
    if (p[1].prob(t) == 0.0) {
      EXPECT_EQ(e.second[t], 0) << "token " << t << " is outside p_1's support";
    }
  }
  int df = 0;
  const double x1 = chi_square(e.first, p[0], kTrials, &df);
  EXPECT_LT(x1, critical_1pct(df)) << "first token, df " << df;
  const double x2 = chi_square(e.second, p[1], e.n_second, &df);
  EXPECT_LT(x2, critical_1pct(df)) << "second token, df " << df << ", " << e.n_second << " cycles";
  // The drafts disagree with the verifier often enough that the residual path is exercised, and
  // agree often enough that acceptance is.
  const double per_cycle = static_cast<double>(e.accepted) / kTrials;
  EXPECT_GT(per_cycle, 0.2);
  EXPECT_LT(per_cycle, 2.5);
  RecordProperty("accepted_per_cycle", std::to_string(per_cycle));
}

TEST_F(SpecAccept, DraftEqualToVerifierKeepsEveryDraft) {
  const std::vector<TokenDist> same(p.begin(), p.begin() + 3);
  const Emitted e = run_cycles(same, p, accept_sampled);
  EXPECT_EQ(e.accepted, static_cast<int64_t>(kTrials) * 3);
}

// The check has teeth: the two classic mistakes give a chi-square far over the bound.
TEST_F(SpecAccept, WrongRulesFailTheCheck) {
  // Rejection redrawn from p instead of the residual max(0, p - q): too many of the tokens q favours.
  auto from_p = [](const std::vector<int32_t>& d, const std::vector<TokenDist>& qq, const std::vector<TokenDist>& pp,
                   Sampler& rng) {
    SpecVerdict v;
    for (size_t j = 0; j < d.size(); ++j) {
      const double pj = pp[j].prob(d[j]), qj = qq[j].prob(d[j]);
      if (pj >= qj || rng.uniform() < pj / qj) {
        ++v.accepted;
        continue;
      }
      v.next = rng.draw(pp[j]);
      return v;
    }
    v.next = rng.draw(pp.back());
    return v;
  };
  // Every draft kept: the draft's distribution, not the verifier's.
  auto keep_all = [](const std::vector<int32_t>& d, const std::vector<TokenDist>&, const std::vector<TokenDist>& pp,
                     Sampler& rng) { return SpecVerdict{static_cast<int>(d.size()), rng.draw(pp.back())}; };
  int df = 0;
  const Emitted a = run_cycles(q, p, from_p);
  EXPECT_GT(chi_square(a.first, p[0], kTrials, &df), 10 * critical_1pct(df));
  const Emitted b = run_cycles(q, p, keep_all);
  // (q puts mass where p has none: the chi-square skips those bins, the support check sees them.)
  int64_t outside = 0;
  for (int t = 0; t < kVocab; ++t)
    if (p[0].prob(t) == 0.0) outside += b.first[t];
  EXPECT_GT(outside, 0);
}

}  // namespace
}  // namespace dhs
