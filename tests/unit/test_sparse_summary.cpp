// Page summaries against a brute-force min/max/mean/variance over each page's
// tokens (after random appends, partial last pages, truncation and page reuse),
// the Quest min/max bound against every token's q·k, and the normalised page
// masses against an independent statement of their definition.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "core/error.h"
#include "sparse/mass_estimator.h"
#include "test_sparse_fixture.h"

namespace dhs {
namespace {

using test::SparseWorld;

// Every page of every list of `t` that holds tokens, against its rows in the pool.
void expect_summaries_exact(const SparseWorld& w, const PageTable& t) {
  const int ps = w.page_size, D = w.head_dim;
  const int64_t n_pages = (t.n_tokens() + ps - 1) / ps;
  for (int l = 0; l < w.n_layers; ++l)
    for (int h = 0; h < w.n_heads_kv; ++h)
      for (int64_t i = 0; i < n_pages; ++i) {
        const PageRef pg = t.page(l, h, i);
        const int n_rows = static_cast<int>(std::min<int64_t>(ps, t.n_tokens() - i * ps));
        ASSERT_EQ(w.store.n_rows(pg.slot), n_rows) << "layer " << l << " head " << h << " page " << i;
        const float* kp = w.pool.k_page(pg);
        for (int d = 0; d < D; ++d) {
          float mn = INFINITY, mx = -INFINITY;
          double sum = 0.0;
          for (int r = 0; r < n_rows; ++r) {
            mn = std::min(mn, kp[r * D + d]);
            mx = std::max(mx, kp[r * D + d]);
            sum += kp[r * D + d];
          }
          const double mean = sum / n_rows;
          double m2 = 0.0;
          for (int r = 0; r < n_rows; ++r) m2 += (kp[r * D + d] - mean) * (kp[r * D + d] - mean);
          ASSERT_EQ(w.store.min(pg.slot)[d], mn);  // min/max are exact, not approximate
          ASSERT_EQ(w.store.max(pg.slot)[d], mx);
          // Welford in fp32 over <= page_size rows of magnitude <= ~6.
          ASSERT_NEAR(w.store.mean(pg.slot)[d], mean, 1e-5);
          ASSERT_NEAR(w.store.m2(pg.slot)[d], m2, 1e-4 * (1.0 + m2));
        }
      }
}

TEST(PageSummary, MatchesBruteForceAfterRandomAppends) {
  std::mt19937 rng(1);
  SparseWorld w(2, 3, 16, 24, 2 * 3 * 20);
  PageTable& a = w.add_request();
  PageTable& b = w.add_request();
  w.append_random(a, 97, rng);  // last page 1/16 full
  w.append_random(b, 35, rng);  // last page 3/16 full
  expect_summaries_exact(w, a);
  expect_summaries_exact(w, b);
  w.append_random(b, 13, rng);  // exactly full pages
  expect_summaries_exact(w, b);
}

TEST(PageSummary, TruncateThenReappend) {
  std::mt19937 rng(2);
  SparseWorld w(2, 2, 16, 8, 2 * 2 * 8);
  PageTable& t = w.add_request();
  w.append_random(t, 60, rng);
  t.truncate(w.pool, 37);  // rejected speculation: rows 37..59 are gone
  truncate_summaries(t, w.pool, w.store, 37);
  expect_summaries_exact(w, t);
  w.append_random(t, 20, rng);
  expect_summaries_exact(w, t);
  t.truncate(w.pool, 48);  // to a page boundary
  truncate_summaries(t, w.pool, w.store, 48);
  w.append_random(t, 3, rng);
  expect_summaries_exact(w, t);
}

TEST(PageSummary, ReusedPagesStartClean) {
  std::mt19937 rng(3);
  SparseWorld w(1, 2, 16, 8, 8);
  PageTable& a = w.add_request();
  w.append_random(a, 64, rng);
  a.release(w.pool);
  PageTable& b = w.add_request();  // takes the same slots back from the free stack
  w.append_random(b, 21, rng);
  expect_summaries_exact(w, b);
}

TEST(PageSummary, AppendingOutOfOrderIsCaught) {
  SparseWorld w(1, 1, 4, 4, 4);
  PageTable& t = w.add_request();
  ASSERT_TRUE(t.reserve(w.pool, 4));
  const std::vector<float> k(4, 1.0f);
  const int32_t pos = 2;  // row 2 of a page whose rows 0..1 were never summarised
  EXPECT_THROW(append_summaries(t, w.store, 0, k.data(), &pos, 1), Error);
}

TEST(MassEstimator, MinMaxIsAnUpperBoundOfEveryToken) {
  std::mt19937 rng(4);
  SparseWorld w(1, 2, 16, 40, 2 * 12);
  PageTable& t = w.add_request();
  w.append_random(t, 181, rng);
  const MinMaxEstimator est;
  for (int trial = 0; trial < 50; ++trial) {
    const std::vector<float> q = test::random_vec(40, rng, 2.0f);
    for (int h = 0; h < 2; ++h)
      for (int64_t i = 0; i * 16 < t.n_tokens(); ++i) {
        const PageRef pg = t.page(0, h, i);
        const float bound = est.score(w.store, pg.slot, q.data(), 0.125f);
        for (int r = 0; r < w.store.n_rows(pg.slot); ++r) {
          const float* k = w.pool.k_page(pg) + r * 40;
          double dot = 0.0, mag = 0.0;
          for (int d = 0; d < 40; ++d) {
            dot += static_cast<double>(q[d]) * k[d];
            mag += std::abs(static_cast<double>(q[d]) * k[d]);
          }
          // Slack: fp32 rounding of the bound's own sum, relative to sum |q_d k_d|.
          ASSERT_GE(bound, dot - 1e-5 * mag) << "page " << i << " row " << r;
        }
      }
  }
}

// Gaussian: q.mean + scale/2 sum q^2 var from the keys themselves (double); MinMax with
// alpha: 1 is the bound, 0 the box centre q.(min + max)/2, both from the keys' extremes.
TEST(MassEstimator, GaussianAndShrunkMinMaxMatchTheirDefinitions) {
  std::mt19937 rng(9);
  SparseWorld w(1, 1, 16, 24, 12);
  PageTable& t = w.add_request();
  w.append_random(t, 53, rng);  // a last page 5/16 full
  const GaussianEstimator gauss;
  const MinMaxEstimator full, centre(0.0f), half(0.5f);
  EXPECT_EQ(full.name(), "minmax");
  EXPECT_EQ(make_estimator("minmax:0.5")->name(), "minmax:0.5");
  EXPECT_THROW(make_estimator("minmax:2"), Error);
  const float scale = 0.2f;
  for (int trial = 0; trial < 20; ++trial) {
    const std::vector<float> q = test::random_vec(24, rng, 2.0f);
    for (int64_t i = 0; i * 16 < t.n_tokens(); ++i) {
      const PageRef pg = t.page(0, 0, i);
      const int n = w.store.n_rows(pg.slot);
      double dot_mean = 0, var_term = 0, lo_hi = 0, centre_dot = 0, mag = 0;
      for (int d = 0; d < 24; ++d) {
        double m = 0, v = 0, mn = 1e30, mx = -1e30;
        for (int r = 0; r < n; ++r) m += w.pool.k_page(pg)[r * 24 + d];
        m /= n;
        for (int r = 0; r < n; ++r) {
          const double x = w.pool.k_page(pg)[r * 24 + d];
          v += (x - m) * (x - m);
          mn = std::min(mn, x);
          mx = std::max(mx, x);
        }
        v /= n;
        dot_mean += q[d] * m;
        var_term += static_cast<double>(q[d]) * q[d] * v;
        lo_hi += std::max(q[d] * mn, q[d] * mx);
        centre_dot += q[d] * 0.5 * (mn + mx);
        mag += std::abs(q[d]) * (std::abs(m) + std::abs(mx) + std::abs(mn) + v);
      }
      const double tol = 1e-5 * mag + 1e-6;
      EXPECT_NEAR(gauss.score(w.store, pg.slot, q.data(), scale), dot_mean + 0.5 * scale * var_term, tol);
      EXPECT_NEAR(full.score(w.store, pg.slot, q.data(), scale), lo_hi, tol);
      EXPECT_NEAR(centre.score(w.store, pg.slot, q.data(), scale), centre_dot, tol);
      EXPECT_NEAR(half.score(w.store, pg.slot, q.data(), scale), 0.5 * (lo_hi + centre_dot), tol);
    }
  }
}

// q quantized to int8 as the sketch estimators quantize it (step max|q| / 127): the values
// code * step and the step.
struct Int8Q {
  std::vector<double> v;
  float step = 0.0f;
};
Int8Q int8_q(const std::vector<float>& q) {
  float qmax = 0;
  for (float x : q) qmax = std::max(qmax, std::fabs(x));
  Int8Q r{std::vector<double>(q.size()), qmax / 127.0f};
  for (size_t d = 0; d < q.size(); ++d)
    r.v[d] = std::clamp(std::nearbyint(q[d] / r.step), -127.0f, 127.0f) * static_cast<double>(r.step);
  return r;
}

// The 4-bit key sketch: every code within [-7, 7], each key reconstructed within half a step
// (absmax / 14) per dimension; the sketch estimator equals log-mean-exp of the scores of the
// int8-quantized q (step max|q| / 127) on the reconstructed keys (1e-3: float vs double), lies
// within the quantization bound (scale (s_q / 2) max_t sum_d |k^_td|, plus 1e-3) of the float-q
// value, and its page ranking follows the exact one on a page holding one aligned key.
TEST(MassEstimator, KeySketchReconstructsKeysAndScoresTheirSum) {
  std::mt19937 rng(21);
  SparseWorld w(1, 1, 16, 32, 8);
  PageTable& t = w.add_request();
  w.append_random(t, 40, rng);
  const KeySketchEstimator est;
  EXPECT_EQ(make_estimator("sketch4")->name(), "sketch4");
  const float scale = 0.25f;
  const std::vector<float> q = test::random_vec(32, rng, 1.5f);
  const Int8Q qi = int8_q(q);
  const std::vector<double>& q8 = qi.v;
  const float qstep = qi.step;
  for (int64_t i = 0; i * 16 < t.n_tokens(); ++i) {
    const PageRef pg = t.page(0, 0, i);
    const int n = w.store.n_rows(pg.slot);
    const int8_t* codes = w.store.key_codes(pg.slot);
    const float* step = w.store.key_code_scales(pg.slot);
    double z = 0, m = -1e30, zf = 0, mf = -1e30, bound = 0;
    std::vector<double> x, xf;
    for (int r = 0; r < n; ++r) {
      const float* k = w.pool.k_page(pg) + r * 32;
      float amax = 0;
      for (int d = 0; d < 32; ++d) amax = std::max(amax, std::fabs(k[d]));
      double dot = 0, dotf = 0, l1 = 0;
      for (int d = 0; d < 32; ++d) {
        ASSERT_LE(std::abs(codes[r * 32 + d]), 7);
        EXPECT_NEAR(codes[r * 32 + d] * step[r], k[d], amax / 14.0f * 1.001f + 1e-6f) << "row " << r << " dim " << d;
        dot += q8[d] * codes[r * 32 + d] * static_cast<double>(step[r]);
        dotf += q[d] * codes[r * 32 + d] * static_cast<double>(step[r]);
        l1 += std::abs(codes[r * 32 + d]) * static_cast<double>(step[r]);
      }
      x.push_back(dot * scale);
      xf.push_back(dotf * scale);
      m = std::max(m, dot * scale);
      mf = std::max(mf, dotf * scale);
      bound = std::max(bound, scale * qstep / 2.0 * l1);
    }
    for (double v : x) z += std::exp(v - m);
    for (double v : xf) zf += std::exp(v - mf);
    const double got = est.score(w.store, pg.slot, q.data(), scale);
    EXPECT_NEAR(got, (m + std::log(z / n)) / scale, 1e-3);
    EXPECT_NEAR(got, (mf + std::log(zf / n)) / scale, bound / scale + 1e-3);
  }
  // One key aligned with q in page 1 of 3: the sketch ranks that page first.
  SparseWorld w2(1, 1, 16, 32, 8);
  PageTable& t2 = w2.add_request();
  w2.append_random(t2, 48, rng);
  float* k = w2.pool.k_page(t2.page(0, 0, 1)) + 5 * 32;
  for (int d = 0; d < 32; ++d) k[d] = 0.8f * q[d];
  w2.store.rebuild(w2.pool, t2.page(0, 0, 1).slot, 16);
  float best = -1e30f;
  int best_page = -1;
  for (int i = 0; i < 3; ++i) {
    const float sc = est.score(w2.store, t2.page(0, 0, i).slot, q.data(), scale);
    if (sc > best) {
      best = sc;
      best_page = i;
    }
  }
  EXPECT_EQ(best_page, 1);
}

// sketch2: each dimension the odd multiple of step = absmax / 3 nearest it (within step), and the
// score the log-mean-exp on those keys with q in int8, stated here from the raw keys.
TEST(MassEstimator, TwoBitSketchReconstructsKeysAndScoresTheirSum) {
  std::mt19937 rng(22);
  SparseWorld w(1, 1, 16, 32, 8);
  PageTable& t = w.add_request();
  w.append_random(t, 24, rng);
  w.store.enable_two_bit_codes(w.pool);  // rows 0-23 re-encoded from the pool, rows 24-39 appended after
  w.append_random(t, 16, rng);
  const KeySketch2Estimator est;
  EXPECT_TRUE(est.needs_two_bit_codes());
  EXPECT_EQ(make_estimator("sketch2")->name(), "sketch2");
  const float scale = 0.25f;
  const std::vector<float> q = test::random_vec(32, rng, 1.5f);
  const std::vector<double> q8 = int8_q(q).v;
  for (int64_t i = 0; i * 16 < t.n_tokens(); ++i) {
    const PageRef pg = t.page(0, 0, i);
    const int n = w.store.n_rows(pg.slot);
    const int8_t* codes = w.store.key_codes2(pg.slot);
    double m = -1e30;
    std::vector<double> x;
    for (int r = 0; r < n; ++r) {
      const float* k = w.pool.k_page(pg) + r * 32;
      float amax = 0;
      for (int d = 0; d < 32; ++d) amax = std::max(amax, std::fabs(k[d]));
      const double step = amax / 3.0;
      EXPECT_NEAR(w.store.key_code2_scales(pg.slot)[r], step, 1e-6 * step);
      double dot = 0;
      for (int d = 0; d < 32; ++d) {
        const int c = codes[r * 32 + d];
        ASSERT_TRUE(c == -3 || c == -1 || c == 1 || c == 3) << c;
        EXPECT_LE(std::fabs(c * step - k[d]), step * 1.0001) << "row " << r << " dim " << d;  // the nearest odd level
        dot += q8[d] * c * step;
      }
      x.push_back(dot * scale);
      m = std::max(m, dot * scale);
    }
    double z = 0;
    for (double v : x) z += std::exp(v - m);
    EXPECT_NEAR(est.score(w.store, pg.slot, q.data(), scale), (m + std::log(z / n)) / scale, 1e-3);
  }
}

// The definition, independently: per q head and row, scores from the summaries (in
// double), mass = n_visible * exp(s*scale - max), normalised; combined; renormalised.
std::vector<double> brute_mass(const SparseWorld& w, const PageTable& t, int layer, const std::vector<int>& heads,
                               const std::vector<float>& q, int n_rows, int n_heads_q, int64_t seq_len, float scale,
                               GroupCombine combine, bool minmax, float kappa) {
  const int ps = w.page_size, D = w.head_dim, group = n_heads_q / w.n_heads_kv;
  const int64_t n_pages = (seq_len + ps - 1) / ps;
  std::vector<double> out(static_cast<size_t>(n_pages), 0.0);
  for (int hk : heads)
    for (int g = 0; g < group; ++g)
      for (int row = 0; row < n_rows; ++row) {
        const float* qr = q.data() + (row * n_heads_q + hk * group + g) * D;
        const int64_t qpos = seq_len - n_rows + row;
        std::vector<double> s(static_cast<size_t>(n_pages)), n(static_cast<size_t>(n_pages));
        double m = -INFINITY;
        for (int64_t i = 0; i < n_pages; ++i) {
          n[i] = static_cast<double>(std::clamp<int64_t>(qpos + 1 - i * ps, 0, ps));
          const int32_t slot = t.page(layer, hk, i).slot;
          double sc = 0.0, var = 0.0;
          for (int d = 0; d < D; ++d) {
            if (minmax) {
              sc += std::max(static_cast<double>(qr[d]) * w.store.min(slot)[d],
                             static_cast<double>(qr[d]) * w.store.max(slot)[d]);
            } else {
              sc += static_cast<double>(qr[d]) * w.store.mean(slot)[d];
              var += static_cast<double>(qr[d]) * qr[d] * w.store.m2(slot)[d] / w.store.n_rows(slot);
            }
          }
          s[i] = (sc + (minmax ? 0.0 : kappa * std::sqrt(var))) * scale;
          if (n[i] > 0) m = std::max(m, s[i]);
        }
        double z = 0.0;
        for (int64_t i = 0; i < n_pages; ++i) z += n[i] > 0 ? n[i] * std::exp(s[i] - m) : 0.0;
        for (int64_t i = 0; i < n_pages; ++i) {
          const double p = n[i] > 0 ? n[i] * std::exp(s[i] - m) / z : 0.0;
          out[i] = combine == GroupCombine::Sum ? out[i] + p : std::max(out[i], p);
        }
      }
  double tot = 0.0;
  for (double v : out) tot += v;
  for (double& v : out) v /= tot;
  return out;
}

// Query rows 0 .. n_rows - 1 of one request (q: [n_rows, hq, head_dim]) at seq_len tokens.
MassQuery rows_query(const std::vector<float>& q, int n_rows, int hq, float scale, int64_t seq_len) {
  MassQuery mq;
  mq.q = q.data();
  mq.row_begin = 0;
  mq.row_end = n_rows;
  mq.n_heads_q = hq;
  mq.scale = scale;
  mq.seq_len = seq_len;
  return mq;
}

TEST(MassEstimator, NormalisedMassMatchesDefinition) {
  std::mt19937 rng(5);
  const int Hkv = 2, Hq = 6, D = 16, ps = 16;
  SparseWorld w(2, Hkv, ps, D, 2 * Hkv * 10);
  PageTable& t = w.add_request();
  w.append_random(t, 151, rng);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  for (int n_rows : {1, 3}) {  // decode, and verification of 2 draft tokens (causal)
    const std::vector<float> q = test::random_vec(static_cast<size_t>(n_rows * Hq * D), rng, 1.5f);
    const MassQuery mq = rows_query(q, n_rows, Hq, scale, 151);
    for (GroupCombine c : {GroupCombine::Sum, GroupCombine::Max})
      for (int est_i = 0; est_i < 2; ++est_i) {
        const bool minmax = est_i == 0;
        const MinMaxEstimator mm;
        const MeanSpreadEstimator ms(0.7f);
        const MassEstimator& est = minmax ? static_cast<const MassEstimator&>(mm) : ms;
        for (int h = 0; h < Hkv; ++h) {
          std::vector<double> got;
          estimate_page_mass(est, w.store, t, 1, h, mq, c, &got);
          const std::vector<double> want = brute_mass(w, t, 1, {h}, q, n_rows, Hq, 151, scale, c, minmax, 0.7f);
          ASSERT_EQ(got.size(), want.size());
          double sum = 0.0;
          for (size_t i = 0; i < got.size(); ++i) {
            ASSERT_NEAR(got[i], want[i], 1e-4 * want[i] + 1e-9) << "page " << i;
            sum += got[i];
          }
          EXPECT_NEAR(sum, 1.0, 1e-12);
        }
        std::vector<double> got;
        estimate_page_mass_heads(est, w.store, t, 1, {0, 1}, mq, c, &got);
        const std::vector<double> want = brute_mass(w, t, 1, {0, 1}, q, n_rows, Hq, 151, scale, c, minmax, 0.7f);
        for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-4 * want[i] + 1e-9);
      }
  }
}

// sketch4:KEEP (the channel-subset study): per KV group the KEEP / 4 blocks of 4 dimensions with
// the largest summed |q| over the group's heads and rows (ties to the lower block) enter the
// dot products; stated here as the plain sketch estimator on queries whose other dimensions are
// zero, with the blocks ranked by a sort of its own.
TEST(MassEstimator, ChannelSubsetSketchScoresTheGroupsLargestBlocks) {
  std::mt19937 rng(31);
  const int Hkv = 2, Hq = 6, D = 32, ps = 16, group = Hq / Hkv;
  SparseWorld w(1, Hkv, ps, D, Hkv * 8);
  PageTable& t = w.add_request();
  w.append_random(t, 77, rng);
  EXPECT_EQ(make_estimator("sketch4:16")->name(), "sketch4:16");
  EXPECT_EQ(make_estimator("sketch4:16")->kept_dims(D), 16);
  EXPECT_EQ(make_estimator("sketch4:64")->kept_dims(D), D);  // more than there are: all
  EXPECT_THROW(make_estimator("sketch4:6"), Error);          // not whole blocks
  EXPECT_THROW(make_estimator("sketch4:0"), Error);
  EXPECT_THROW(make_estimator("sketch4:8x"), Error);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  for (int n_rows : {1, 2}) {
    std::vector<float> q = test::random_vec(static_cast<size_t>(n_rows * Hq * D), rng, 1.5f);
    for (size_t i = 0; i < q.size(); ++i)
      if (i % D >= 8 && i % D < 12) q[i] *= 6.0f;  // block 2 heavy in every head: surely kept
    const MassQuery mq = rows_query(q, n_rows, Hq, scale, 77);
    for (int keep : {8, 16}) {
      const KeySketchEstimator subset(keep), full;
      for (int h = 0; h < Hkv; ++h) {
        std::vector<std::pair<double, int>> blocks;  // (-weight, block): ascending = heaviest first
        for (int b = 0; b < D / 4; ++b) {
          double wsum = 0;
          for (int r = 0; r < n_rows; ++r)
            for (int g = 0; g < group; ++g)
              for (int e = 0; e < 4; ++e) wsum += std::fabs(q[(static_cast<size_t>(r) * Hq + h * group + g) * D + b * 4 + e]);
          blocks.emplace_back(-wsum, b);
        }
        std::sort(blocks.begin(), blocks.end());
        std::vector<float> masked(q.size(), 0.0f);
        for (int k = 0; k < keep / 4; ++k)
          for (int r = 0; r < n_rows; ++r)
            for (int g = 0; g < group; ++g)
              for (int e = 0; e < 4; ++e) {
                const size_t at = (static_cast<size_t>(r) * Hq + h * group + g) * D + blocks[static_cast<size_t>(k)].second * 4 + e;
                masked[at] = q[at];
              }
        ASSERT_EQ(blocks[0].second, 2);
        MassQuery mm = mq;
        mm.q = masked.data();
        std::vector<double> got, want;
        estimate_page_mass(subset, w.store, t, 0, h, mq, GroupCombine::Sum, &got);
        estimate_page_mass(full, w.store, t, 0, h, mm, GroupCombine::Sum, &want);
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-9 + 1e-6 * want[i]) << "keep " << keep << " page " << i;
      }
    }
  }
}

TEST(MassEstimator, EmptyAndOnePage) {
  std::mt19937 rng(6);
  SparseWorld w(1, 1, 16, 8, 4);
  PageTable& t = w.add_request();
  const std::vector<float> q = test::random_vec(8, rng);
  MassQuery mq{q.data(), 0, 1, 1, 0.35f, 0};
  std::vector<double> m{1.0, 2.0};
  estimate_page_mass(MinMaxEstimator{}, w.store, t, 0, 0, mq, GroupCombine::Sum, &m);
  EXPECT_TRUE(m.empty());
  w.append_random(t, 5, rng);
  mq.seq_len = 5;
  estimate_page_mass(MinMaxEstimator{}, w.store, t, 0, 0, mq, GroupCombine::Sum, &m);
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0], 1.0);
  EXPECT_THROW(make_estimator("nope"), Error);
  EXPECT_EQ(make_estimator("meanspread")->name(), "meanspread");
}

}  // namespace
}  // namespace dhs
