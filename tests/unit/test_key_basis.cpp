// The low-rank key basis (sparse/key_basis.h) and the projected key sketch on it
// (ProjectedSketchEstimator, "psketch4:R"), each against a statement of its definition.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "core/error.h"
#include "core/fp16.h"
#include "sparse/key_basis.h"
#include "sparse/mass_estimator.h"
#include "test_sparse_fixture.h"

namespace dhs {
namespace {

using test::SparseWorld;

// Keys of (layer, head) drawn as mean + A z + noise, A: [d, kRank] fixed per (layer, head).
constexpr int kRank = 3;
struct LowRankKeys {
  int d;
  std::vector<float> a, mu;  // [L*H][d][kRank], [L*H][d]
  LowRankKeys(int n_lh, int d_, std::mt19937& rng) : d(d_) {
    a = test::random_vec(static_cast<size_t>(n_lh * d * kRank), rng, 1.0f);
    mu = test::random_vec(static_cast<size_t>(n_lh * d), rng, 3.0f);
    for (int i = 0; i < n_lh; ++i)  // spread the variances: 9, 4, 1
      for (int e = 0; e < d; ++e)
        for (int r = 0; r < kRank; ++r) a[(static_cast<size_t>(i) * d + e) * kRank + r] *= static_cast<float>(kRank - r);
  }
  void draw(int lh, std::mt19937& rng, float noise, float* k) const {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    float z[kRank];
    for (float& x : z) x = nd(rng);
    for (int e = 0; e < d; ++e) {
      float v = mu[static_cast<size_t>(lh * d + e)] + noise * nd(rng);
      for (int r = 0; r < kRank; ++r) v += a[(static_cast<size_t>(lh) * d + e) * kRank + r] * z[r];
      k[e] = v;
    }
  }
};

TEST(KeyBasis, FitFindsTheKeysSubspaceInOrder) {
  std::mt19937 rng(41);
  const int L = 2, H = 2, d = 16, n = 4000;
  const LowRankKeys gen(L * H, d, rng);
  for (int rank : {kRank, 2}) {
    std::mt19937 r2(7);
    const KeyBasis kb = fit_key_basis(L, H, d, rank, [&](int l, int h, std::vector<float>* rows) {
      rows->resize(static_cast<size_t>(n) * d);
      for (int t = 0; t < n; ++t) gen.draw(l * H + h, r2, 1e-3f, rows->data() + static_cast<size_t>(t) * d);
    });
    for (int l = 0; l < L; ++l)
      for (int h = 0; h < H; ++h) {
        const float* b = kb.basis(l, h);
        for (int i = 0; i < rank; ++i)  // orthonormal rows
          for (int j = 0; j < rank; ++j) {
            double dot = 0;
            for (int e = 0; e < d; ++e) dot += static_cast<double>(b[i * d + e]) * b[j * d + e];
            EXPECT_NEAR(dot, i == j ? 1.0 : 0.0, 1e-5);
          }
        for (int e = 0; e < d; ++e)  // the sample mean of 4,000 draws: within ~4 sd / sqrt(n) * |A row|
          EXPECT_NEAR(kb.mean(l, h)[e], gen.mu[static_cast<size_t>((l * H + h) * d + e)], 0.35f);
        if (rank == kRank) {
          // All the variance lies in the 3 directions: a fresh key's centred norm is kept.
          EXPECT_GT(kb.explained(l, h), 0.9999f);
          for (int trial = 0; trial < 20; ++trial) {
            std::vector<float> k(static_cast<size_t>(d)), c(static_cast<size_t>(d)), y(static_cast<size_t>(rank));
            gen.draw(l * H + h, r2, 0.0f, k.data());
            kb.project_key(l, h, k.data(), y.data());
            double n_k = 0, n_y = 0;
            for (int e = 0; e < d; ++e) n_k += std::pow(k[e] - kb.mean(l, h)[e], 2);
            for (float v : y) n_y += static_cast<double>(v) * v;
            EXPECT_NEAR(n_y, n_k, 1e-3 * n_k + 1e-4);
          }
        } else {
          // The two largest of variances ~9:4:1 per column of A: far from all, far above 1/3.
          EXPECT_LT(kb.explained(l, h), 0.99f);
          EXPECT_GT(kb.explained(l, h), 0.7f);
        }
      }
  }
  EXPECT_THROW(KeyBasis(1, 1, 8, 9), Error);
  EXPECT_THROW(fit_key_basis(1, 1, 8, 2, [](int, int, std::vector<float>* rows) { rows->assign(12, 0.0f); }), Error);
}

// The query-aware basis: exact at full rank, and at rank 2 it keeps the directions the queries
// look at, where key PCA keeps the keys' largest spread (which these queries ignore).
TEST(KeyBasis, QueryAwareBasisKeepsTheScoresSpread) {
  std::mt19937 rng(47);
  const int d = 8, n = 3000;
  std::normal_distribution<float> nd(0.0f, 1.0f);
  // Keys: sd 5 in dims 0-1, 1 in dims 2-3, 0.1 elsewhere, offset 2; queries: only dims 2-3 (and noise).
  auto key = [&](float* k) {
    for (int e = 0; e < d; ++e) k[e] = 2.0f + nd(rng) * (e < 2 ? 5.0f : e < 4 ? 1.0f : 0.1f);
  };
  auto query = [&](float* q) {
    for (int e = 0; e < d; ++e) q[e] = (e == 2 || e == 3) ? 3.0f * nd(rng) : 0.01f * nd(rng);
  };
  auto keys = [&](int, int, std::vector<float>* rows) {
    rows->resize(static_cast<size_t>(n) * d);
    for (int t = 0; t < n; ++t) key(rows->data() + static_cast<size_t>(t) * d);
  };
  auto queries = [&](int, int, std::vector<float>* rows) {
    rows->resize(static_cast<size_t>(n) * d);
    for (int t = 0; t < n; ++t) query(rows->data() + static_cast<size_t>(t) * d);
  };
  const KeyBasis full = fit_qk_basis(1, 1, d, d, keys, queries);
  const KeyBasis qk = fit_qk_basis(1, 1, d, 2, keys, queries);
  const KeyBasis pca = fit_key_basis(1, 1, d, 2, keys);
  EXPECT_TRUE(qk.query_aware());
  EXPECT_FALSE(pca.query_aware());
  EXPECT_GT(qk.explained(0, 0), 0.99f);
  auto score_err = [&](const KeyBasis& kb, double* rel) {
    double se = 0, ss = 0;
    std::vector<float> q(d), k(d), a(static_cast<size_t>(kb.rank())), c(static_cast<size_t>(kb.rank()));
    for (int trial = 0; trial < 500; ++trial) {
      query(q.data());
      key(k.data());
      kb.project_query(0, 0, q.data(), a.data());
      kb.project_key(0, 0, k.data(), c.data());
      double est = 0, want = 0;
      for (int r = 0; r < kb.rank(); ++r) est += static_cast<double>(a[r]) * c[r];
      for (int e = 0; e < d; ++e) want += static_cast<double>(q[e]) * (k[e] - kb.mean(0, 0)[e]);
      se += (est - want) * (est - want);
      ss += want * want;
    }
    *rel = se / ss;
  };
  double e_full, e_qk, e_pca;
  score_err(full, &e_full);
  score_err(qk, &e_qk);
  score_err(pca, &e_pca);
  EXPECT_LT(e_full, 1e-8) << "full rank: A^T C = I";
  EXPECT_LT(e_qk, 0.01) << "the queries' two directions kept";
  EXPECT_GT(e_pca, 0.9) << "key PCA keeps dims 0-1, which the queries ignore";
}

// The projected sketch, stated independently: per token y = B (k - mean) quantized to 4 bits
// (step absmax / 7), q^ = int8(B q) (step absmax / 127), page score = log-mean-exp of
// scale * q^.y^ over the page's rows, masses n_vis * exp(score), normalised per q head, summed.
// (Projections as fp32 fma chains over d ascending, the arithmetic key_basis.h specifies.)
TEST(ProjectedSketch, MassMatchesDefinitionAndSurvivesReencoding) {
  std::mt19937 rng(43);
  const int L = 2, H = 2, Hq = 6, d = 32, ps = 16, group = Hq / H, rank = 8;
  const int64_t n_tok = 150;  // a last page 6/16 full
  SparseWorld w(L, H, ps, d, L * H * 12);
  PageTable& t = w.add_request();
  const LowRankKeys gen(L * H, d, rng);
  // A token's key depends on (layer, head, position) only, whatever the append chunks.
  auto keygen = [&](int l, int h, int32_t pos, int e, bool is_v) {
    thread_local std::vector<float> k(64);
    if (is_v) return 0.25f;
    if (e == 0) {  // dims arrive in order per token
      std::mt19937 kr(static_cast<uint32_t>(l * 100003 + h * 1009 + pos));
      gen.draw(l * H + h, kr, 0.3f, k.data());
    }
    return k[static_cast<size_t>(e)];
  };
  w.append(t, n_tok, rng, keygen);
  auto kb = std::make_shared<KeyBasis>(fit_key_basis(w.pool, t, n_tok, rank));
  EXPECT_THROW(fit_key_basis(w.pool, t, n_tok + 1, rank), Error);
  const ProjectedSketchEstimator est(rank);
  EXPECT_EQ(make_estimator("psketch4:8")->projected_rank(), 8);
  EXPECT_THROW(make_estimator("psketch4:0"), Error);
  EXPECT_THROW(make_estimator("psketch4:x"), Error);
  EXPECT_EQ(make_estimator("psketch4:8:4")->projected_keep(), 4);
  EXPECT_EQ(make_estimator("psketch4:8:4")->name(), "psketch4:8:4");
  EXPECT_THROW(make_estimator("psketch4:8:6"), Error);   // not whole blocks
  EXPECT_THROW(make_estimator("psketch4:8:12"), Error);  // more than R

  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const std::vector<float> q = test::random_vec(static_cast<size_t>(2 * Hq * d), rng, 1.5f);
  MassQuery mq;
  mq.q = q.data();
  mq.row_begin = 0;
  mq.row_end = 2;
  mq.n_heads_q = Hq;
  mq.scale = scale;
  mq.seq_len = n_tok;
  std::vector<double> got;
  EXPECT_THROW(estimate_page_mass(est, w.store, t, 0, 0, mq, GroupCombine::Sum, &got), Error);  // no basis yet
  w.store.set_key_basis(kb, w.pool);  // re-encodes the 150 rows already there

  auto quant4 = [](std::vector<float> x, std::vector<int>* code) {
    float amax = 0;
    for (float v : x) amax = std::max(amax, std::fabs(v));
    const float step = amax / 7.0f;
    code->resize(x.size());
    for (size_t i = 0; i < x.size(); ++i) (*code)[i] = step > 0 ? static_cast<int>(std::clamp(std::lround(x[i] / step), -7L, 7L)) : 0;
    return step;
  };
  const int64_t n_pages = (n_tok + ps - 1) / ps;
  // keep 4: "psketch4:8:4", the one block of 4 coordinates of the largest summed |(B q)_i| sigma_i.
  for (int keep : {0, 4})
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < H; ++h) {
      const float* b = kb->basis(l, h);
      const float* mu = kb->mean(l, h);
      auto project_q = [&](int g, int row) {
        const float* qv = q.data() + (static_cast<size_t>(row) * Hq + h * group + g) * d;
        std::vector<float> qp(rank);
        for (int r = 0; r < rank; ++r)
          for (int e = 0; e < d; ++e) qp[r] = std::fma(b[r * d + e], qv[e], qp[r]);
        for (float& v : qp) v = fp16_to_f32(f32_to_fp16(v));  // the device keeps B q in f16
        return qp;
      };
      int best_block = -1;  // keep 4: the block kept
      if (keep == 4) {
        double best = -1;
        for (int blk = 0; blk < rank / 4; ++blk) {
          double wsum = 0;
          for (int g = 0; g < group; ++g)
            for (int row = 0; row < 2; ++row) {
              const std::vector<float> qp = project_q(g, row);
              for (int e = 0; e < 4; ++e) wsum += std::fabs(qp[blk * 4 + e]) * std::sqrt(static_cast<double>(kb->variance(l, h)[blk * 4 + e]));
            }
          if (wsum > best) best = wsum, best_block = blk;
        }
        ASSERT_EQ(best_block, 0) << "the leading directions hold most of the spread here";
      }
      std::vector<double> want(static_cast<size_t>(n_pages), 0.0);
      for (int g = 0; g < group; ++g)
        for (int row = 0; row < 2; ++row) {
          std::vector<float> qp = project_q(g, row);
          if (keep == 4)
            for (int r = 0; r < rank; ++r)
              if (r / 4 != best_block) qp[r] = 0.0f;
          float qa = 0;
          for (float v : qp) qa = std::max(qa, std::fabs(v));
          const float qstep = qa / 127.0f;
          std::vector<int> q8(rank);
          for (int r = 0; r < rank; ++r) q8[r] = static_cast<int>(std::clamp(std::nearbyint(qp[r] / qstep), -127.0f, 127.0f));
          const int64_t qpos = n_tok - 2 + row;
          std::vector<double> part(static_cast<size_t>(n_pages), 0.0);
          double z = 0;
          for (int64_t i = 0; i < n_pages; ++i) {
            const int64_t n_vis = std::clamp<int64_t>(qpos + 1 - i * ps, 0, ps);
            const int n_rows = static_cast<int>(std::min<int64_t>(ps, n_tok - i * ps));
            const float* kp = w.pool.k_page(t.page(l, h, i));
            double sum = 0;
            for (int r0 = 0; r0 < n_rows; ++r0) {
              std::vector<float> y(rank);
              for (int r = 0; r < rank; ++r)
                for (int e = 0; e < d; ++e) y[r] = std::fma(b[r * d + e], kp[r0 * d + e] - mu[e], y[r]);
              std::vector<int> c;
              const float step = quant4(y, &c);
              int32_t dot = 0;
              for (int r = 0; r < rank; ++r) dot += c[r] * q8[r];
              sum += std::exp(static_cast<double>(dot) * qstep * step * scale);
            }
            part[static_cast<size_t>(i)] = n_vis == 0 ? 0.0 : n_vis * sum / n_rows;
            z += part[static_cast<size_t>(i)];
          }
          for (int64_t i = 0; i < n_pages; ++i) want[static_cast<size_t>(i)] += part[static_cast<size_t>(i)] / z;
        }
      double tot = 0;
      for (double v : want) tot += v;
      estimate_page_mass(ProjectedSketchEstimator(rank, keep), w.store, t, l, h, mq, GroupCombine::Sum, &got);
      ASSERT_EQ(got.size(), want.size());
      // float accumulation in the estimator vs double here; a rounding flip of one code moves a
      // token's score by one code step times |q^| (rare at these magnitudes): 1e-4 relative.
      for (size_t i = 0; i < got.size(); ++i)
        EXPECT_NEAR(got[i], want[i] / tot, 1e-4 * want[i] / tot + 1e-9) << "keep " << keep << " layer " << l << " head " << h << " page " << i;
    }

  // Rows appended after the basis is set are encoded at append; truncation rebuilds the last
  // page from the pool with the page's own (layer, head): both equal the re-encoded store.
  SparseWorld w2(L, H, ps, d, L * H * 12);
  w2.store.set_key_basis(kb, w2.pool);
  PageTable& t2 = w2.add_request();
  w2.append(t2, n_tok, rng, keygen);
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < H; ++h)
      for (int64_t i = 0; i < n_pages; ++i) {
        const int32_t s1 = t.page(l, h, i).slot, s2 = t2.page(l, h, i).slot;
        const int n_rows = w.store.n_rows(s1);
        ASSERT_EQ(n_rows, w2.store.n_rows(s2));
        for (int j = 0; j < n_rows * rank; ++j) ASSERT_EQ(w.store.projected_codes(s1)[j], w2.store.projected_codes(s2)[j]);
        for (int j = 0; j < n_rows; ++j) ASSERT_EQ(w.store.projected_scales(s1)[j], w2.store.projected_scales(s2)[j]);
      }
  t2.truncate(w2.pool, 140);
  truncate_summaries(t2, w2.pool, w2.store, 140);
  const int32_t s1 = t.page(1, 1, 8).slot, s2 = t2.page(1, 1, 8).slot;
  ASSERT_EQ(w2.store.n_rows(s2), 12);
  for (int j = 0; j < 12 * rank; ++j) ASSERT_EQ(w.store.projected_codes(s1)[j], w2.store.projected_codes(s2)[j]);
}

}  // namespace
}  // namespace dhs
