#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <unordered_set>

#include "core/error.h"

namespace dhs {

void validate(const SamplingParams& p) {
  DHS_CHECK(std::isfinite(p.temperature) && p.temperature >= 0.0f, "temperature must be >= 0, got {}", p.temperature);
  DHS_CHECK(p.top_k >= 0, "top_k must be >= 0, got {}", p.top_k);
  DHS_CHECK(p.top_p > 0.0f && p.top_p <= 1.0f, "top_p must be in (0, 1], got {}", p.top_p);
  DHS_CHECK(p.min_p >= 0.0f && p.min_p <= 1.0f, "min_p must be in [0, 1], got {}", p.min_p);
  DHS_CHECK(std::isfinite(p.repetition_penalty) && p.repetition_penalty > 0.0f,
            "repetition_penalty must be > 0, got {}", p.repetition_penalty);
  DHS_CHECK(p.repetition_window >= 0, "repetition window must be >= 0");
}

Sampler::Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) { validate(p); }

namespace {

void apply_penalty(const SamplingParams& p, float* logits, int64_t vocab, const std::vector<int32_t>& history) {
  if (p.repetition_penalty == 1.0f || history.empty()) return;
  // CTRL-style penalty (as in HF/vLLM): divide positive logits, multiply negative ones.
  const size_t from = p.repetition_window > 0 && history.size() > static_cast<size_t>(p.repetition_window)
                          ? history.size() - static_cast<size_t>(p.repetition_window)
                          : 0;
  std::unordered_set<int32_t> seen(history.begin() + static_cast<std::ptrdiff_t>(from), history.end());
  for (int32_t id : seen) {
    if (id < 0 || id >= vocab) continue;
    float& l = logits[id];
    l = l > 0 ? l / p.repetition_penalty : l * p.repetition_penalty;
  }
}

}  // namespace

double TokenDist::prob(int32_t id) const {
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] == id) return w[i] / total;
  return 0.0;
}

int32_t Sampler::sample(float* logits, int64_t vocab, const std::vector<int32_t>& history) {
  if (p_.temperature == 0.0f) {
    apply_penalty(p_, logits, vocab, history);
    // Greedy; ties go to the lowest id so results do not depend on scan order.
    return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
  }
  TokenDist d;
  distribution(logits, vocab, history, &d);
  return draw(d);
}

void Sampler::distribution(float* logits, int64_t vocab, const std::vector<int32_t>& history, TokenDist* out) {
  DHS_CHECK(p_.temperature > 0.0f, "a sampling distribution needs temperature > 0");
  apply_penalty(p_, logits, vocab, history);
  cand_.resize(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i) cand_[static_cast<size_t>(i)] = {logits[i] / p_.temperature, static_cast<int32_t>(i)};
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  size_t n = cand_.size();
  if (p_.top_k > 0 && static_cast<size_t>(p_.top_k) < n) {
    std::partial_sort(cand_.begin(), cand_.begin() + p_.top_k, cand_.end(), by_logit);
    n = static_cast<size_t>(p_.top_k);
  } else {
    std::sort(cand_.begin(), cand_.end(), by_logit);
  }
  // Softmax over the survivors (sorted descending).
  const float m = cand_[0].first;
  std::vector<double>& prob = out->w;
  prob.assign(n, 0.0);
  double sum = 0.0;
  for (size_t i = 0; i < n; ++i) sum += prob[i] = std::exp(static_cast<double>(cand_[i].first - m));
  for (auto& x : prob) x /= sum;
  if (p_.top_p < 1.0f) {
    // Smallest prefix whose mass reaches top_p (at least one token).
    double c = 0.0;
    size_t keep = 0;
    while (keep < n) {
      c += prob[keep++];
      if (c >= p_.top_p) break;
    }
    n = keep;
  }
  if (p_.min_p > 0.0f) {
    const double thr = p_.min_p * prob[0];
    size_t keep = 1;
    while (keep < n && prob[keep] >= thr) ++keep;
    n = keep;
  }
  prob.resize(n);
  out->ids.resize(n);
  out->total = 0.0;
  for (size_t i = 0; i < n; ++i) {
    out->ids[i] = cand_[i].second;
    out->total += prob[i];
  }
}

int32_t Sampler::draw(const TokenDist& d) {
  DHS_ASSERT(!d.ids.empty());
  std::uniform_real_distribution<double> u(0.0, d.total);
  double r = u(rng_), c = 0.0;
  for (size_t i = 0; i < d.ids.size(); ++i) {
    c += d.w[i];
    if (r < c) return d.ids[i];
  }
  return d.ids.back();
}

double Sampler::uniform() { return std::uniform_real_distribution<double>(0.0, 1.0)(rng_); }

}  // namespace dhs
