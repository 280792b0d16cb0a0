// Partial attention result over a subset of keys, as (o, m, d): the output
// accumulated with weights exp(s - m), the running max m and the running
// denominator d. Split-KV chunks, sparse/dense parts and resident/recalled
// parts all combine through this one merge() (DESIGN.md §1.2).
// Header-only and free of CUDA headers so host and device code share it.
#pragma once
#include <cmath>

#if defined(__CUDACC__)
#define DHS_HD __host__ __device__ __forceinline__
#else
#define DHS_HD inline
#endif

namespace dhs {

struct MergeState {
  float m = -INFINITY;  // running max of scores
  float d = 0.0f;       // sum of exp(s - m)

  // Log-sum-exp of the scores seen; -inf when none.
  DHS_HD float lse() const { return d > 0.0f ? m + logf(d) : -INFINITY; }
};

// Merges state b (with unnormalised output ob) into a (output oa), both of length n.
// After merging all parts, the attention output is oa / a.d.
DHS_HD void merge(MergeState& a, float* oa, const MergeState& b, const float* ob, int n) {
  if (b.d == 0.0f) return;
  if (a.d == 0.0f) {
    a = b;
    for (int i = 0; i < n; ++i) oa[i] = ob[i];
    return;
  }
  const float m = a.m > b.m ? a.m : b.m;
  const float sa = expf(a.m - m), sb = expf(b.m - m);
  for (int i = 0; i < n; ++i) oa[i] = oa[i] * sa + ob[i] * sb;
  a.d = a.d * sa + b.d * sb;
  a.m = m;
}

// Two attention results over disjoint sets of keys, each normalised and with its log-sum-exp
// (-inf: it saw no key), merged in place into (oa, lse_a): the result over both sets. The KV
// hierarchy's in-place reads (attention over the resident pages and over the late ones apart).
DHS_HD void merge_normalized(float* oa, float& lse_a, const float* ob, float lse_b, int n) {
  MergeState a{lse_a, lse_a > -INFINITY ? 1.0f : 0.0f};
  const MergeState b{lse_b, lse_b > -INFINITY ? 1.0f : 0.0f};
  merge(a, oa, b, ob, n);
  if (a.d > 0.0f)
    for (int i = 0; i < n; ++i) oa[i] /= a.d;
  lse_a = a.lse();
}

}  // namespace dhs
