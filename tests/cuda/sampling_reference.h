// The CPU sampler's rule (engine/sampler.cpp) restated step by step, for the GPU sampler's
// tests: the penalty, and the kept set with its renormalised probabilities. test_cuda_sampling's
// CpuMirrorAgreesWithSampler checks it against dhs::Sampler.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <unordered_set>
#include <utility>
#include <vector>

#include "backend/cuda/sampling.h"

namespace dhs::test {

// The repetition penalty as dhs::Sampler applies it (each distinct id once).
inline std::vector<float> penalised(const float* logits, int vocab, const std::vector<int32_t>& hist, float pen) {
  std::vector<float> l(logits, logits + vocab);
  if (pen == 1.0f) return l;
  std::unordered_set<int32_t> seen(hist.begin(), hist.end());
  for (int32_t id : seen)
    if (id >= 0 && id < vocab) l[id] = l[id] > 0 ? l[id] / pen : l[id] * pen;
  return l;
}

// The kept set of sampler.cpp, in its order, with probabilities renormalised over it.
struct KeptSet {
  std::vector<int32_t> ids;
  std::vector<double> prob;
};
inline KeptSet cpu_filter(const std::vector<float>& pen_logits, const dhs::cuda::SamplingRow& r) {
  const int vocab = static_cast<int>(pen_logits.size());
  std::vector<std::pair<float, int32_t>> cand(static_cast<size_t>(vocab));
  for (int i = 0; i < vocab; ++i) cand[i] = {pen_logits[i] / r.temperature, i};
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  size_t n = cand.size();
  if (r.top_k > 0 && r.top_k < vocab) {
    std::partial_sort(cand.begin(), cand.begin() + r.top_k, cand.end(), by_logit);
    n = static_cast<size_t>(r.top_k);
  } else {
    std::sort(cand.begin(), cand.end(), by_logit);
  }
  const float m = cand[0].first;
  std::vector<double> prob(n);
  double sum = 0.0;
  for (size_t i = 0; i < n; ++i) sum += prob[i] = std::exp(static_cast<double>(cand[i].first - m));
  for (auto& x : prob) x /= sum;
  if (r.top_p < 1.0f) {
    double c = 0.0;
    size_t keep = 0;
    while (keep < n) {
      c += prob[keep++];
      if (c >= r.top_p) break;
    }
    n = keep;
  }
  if (r.min_p > 0.0f) {
    const double thr = r.min_p * prob[0];
    size_t keep = 1;
    while (keep < n && prob[keep] >= thr) ++keep;
    n = keep;
  }
  KeptSet s;
  double total = 0.0;
  for (size_t i = 0; i < n; ++i) total += prob[i];
  for (size_t i = 0; i < n; ++i) {
    s.ids.push_back(cand[i].second);
    s.prob.push_back(prob[i] / total);
  }
  return s;
}

}  // namespace dhs::test
