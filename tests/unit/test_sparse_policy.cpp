// Selection policies against brute-force statements of their definitions on random
// inputs (coverage: reaches gamma, minimal, fewest pages, forced pages in, ties by
// index; top-k: exactly min(k, n) pages, best-ranked; sink+window; SoloHead shared),
// and end to end through cpu::attention: gamma = 1 equals dense exactly, gamma = 0.99
// on a peaked pattern stays within the bound 2 * (true excluded mass) * max|v|.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <cstdio>
#include <set>
#include <string>

#include "core/error.h"
#include "kv/page_lists.h"
#include "sparse/policy.h"
#include "test_sparse_fixture.h"

namespace dhs {
namespace {

using test::SparseWorld;

std::vector<int32_t> row_pages(const PageLists& pl, int r, int h) {
  return {pl.page_pos.begin() + pl.row_begin(r, h), pl.page_pos.begin() + pl.row_end(r, h)};
}

// Lists well formed: ascending unique page positions, slots those of the table.
void expect_well_formed(const PageLists& pl, const std::vector<const PageTable*>& tables, int layer) {
  ASSERT_EQ(pl.indptr.size(), static_cast<size_t>(pl.n_requests * pl.n_heads_kv + 1));
  for (int r = 0; r < pl.n_requests; ++r)
    for (int h = 0; h < pl.n_heads_kv; ++h) {
      const int64_t n_pages = (pl.seq_len[r] + tables[r]->page_size() - 1) / tables[r]->page_size();
      for (int32_t k = pl.row_begin(r, h); k < pl.row_end(r, h); ++k) {
        ASSERT_GE(pl.page_pos[k], 0);
        ASSERT_LT(pl.page_pos[k], n_pages);
        if (k > pl.row_begin(r, h)) {
          ASSERT_LT(pl.page_pos[k - 1], pl.page_pos[k]);
        }
        ASSERT_EQ(pl.slots[k], tables[r]->page(layer, h, pl.page_pos[k]).slot);
      }
    }
}

bool is_forced(int64_t i, int64_t n, int n_sink, int n_recent) { return i < n_sink || i >= n - n_recent; }

// The coverage definition, stated on the set: forced pages in; reaches gamma; removing any
// non-forced page drops below gamma; and no set of one page fewer (containing the forced
// ones) reaches gamma; among equal-mass candidates, lower page indices are taken.
void expect_coverage_definition(const std::vector<double>& mass, const std::vector<int32_t>& got, int n_sink,
                                int n_recent, double gamma) {
  const int64_t n = static_cast<int64_t>(mass.size());
  const std::set<int32_t> s(got.begin(), got.end());
  ASSERT_EQ(s.size(), got.size());
  if (gamma >= 1.0) {
    ASSERT_EQ(static_cast<int64_t>(got.size()), n);
    return;
  }
  for (int64_t i = 0; i < n; ++i)
    if (is_forced(i, n, n_sink, n_recent)) {
      ASSERT_TRUE(s.count(static_cast<int32_t>(i))) << "forced page " << i;
    }
  double covered = 0.0;
  for (int32_t i : got) covered += mass[i];
  std::vector<double> free_out, free_in;
  for (int64_t i = 0; i < n; ++i) {
    if (is_forced(i, n, n_sink, n_recent)) continue;
    (s.count(static_cast<int32_t>(i)) ? free_in : free_out).push_back(mass[i]);
  }
  if (free_out.empty() && covered < gamma) return;  // every page taken, gamma unreachable
  ASSERT_GE(covered, gamma - 1e-12);
  for (double m : free_in) ASSERT_LT(covered - m, gamma + 1e-12) << "a page could be dropped";
  // Fewest pages: forced + the best (|free_in| - 1) free pages fall short.
  std::vector<double> all_free = free_in;
  all_free.insert(all_free.end(), free_out.begin(), free_out.end());
  std::sort(all_free.rbegin(), all_free.rend());
  if (!free_in.empty()) {
    double best = covered;
    for (double m : free_in) best -= m;
    for (size_t j = 0; j + 1 < free_in.size(); ++j) best += all_free[j];
    ASSERT_LT(best, gamma + 1e-12);
  }
  // Chosen free pages are the heaviest: none outside outweighs one inside.
  if (!free_in.empty() && !free_out.empty()) {
    ASSERT_LE(*std::max_element(free_out.begin(), free_out.end()), *std::min_element(free_in.begin(), free_in.end()));
  }
}

struct Batch {
  std::vector<const PageTable*> tables;
  std::vector<int32_t> seq_len, q_indptr{0};
  std::vector<float> q;
};

// Random requests (lengths with partial last pages, one single-page one), 1 or 3 rows each.
Batch random_batch(SparseWorld& w, std::mt19937& rng, int n_heads_q, const std::vector<int64_t>& lens,
                   int rows_per_req) {
  Batch b;
  for (int64_t len : lens) {
    PageTable& t = w.add_request();
    w.append_random(t, len, rng);
    b.seq_len.push_back(static_cast<int32_t>(len));
    b.q_indptr.push_back(b.q_indptr.back() + (len > 0 ? rows_per_req : 0));
  }
  b.tables = w.table_ptrs();
  b.q = test::random_vec(static_cast<size_t>(b.q_indptr.back()) * n_heads_q * w.head_dim, rng, 1.5f);
  return b;
}

SelectionInput input_of(const Batch& b, const SparseWorld& w, int layer, int n_heads_q) {
  SelectionInput in;
  in.tables = &b.tables;
  in.layer = layer;
  in.seq_len = &b.seq_len;
  in.q = b.q.data();
  in.q_indptr = b.q_indptr.data();
  in.n_heads_q = n_heads_q;
  in.scale = 1.0f / std::sqrt(static_cast<float>(w.head_dim));
  in.summaries = &w.store;
  return in;
}

MassQuery query_of(const SelectionInput& in, int r) {
  return MassQuery{in.q, in.q_indptr[r], in.q_indptr[r + 1], in.n_heads_q, in.scale, (*in.seq_len)[r]};
}

TEST(SparsePolicy, CoverageMatchesDefinition) {
  const int Hkv = 3, Hq = 6, D = 20, ps = 16;
  for (int rows : {1, 3}) {
    std::mt19937 rng(10 + rows);
    SparseWorld w(2, Hkv, ps, D, 2 * Hkv * 40);
    const Batch b = random_batch(w, rng, Hq, {300, 97, 7, 161}, rows);
    const SelectionInput in = input_of(b, w, 1, Hq);
    for (double gamma : {0.3, 0.8, 0.95, 0.99, 1.0})
      for (int n_sink : {0, 1, 2})
        for (GroupCombine c : {GroupCombine::Sum, GroupCombine::Max})
          for (const char* est_name : {"minmax", "meanspread"}) {
            const auto est = make_estimator(est_name);
            CoverageGammaPolicy pol(est, ScoredParams{gamma, 0, n_sink, 2, c});
            const PageLists pl = pol.select(in);
            expect_well_formed(pl, b.tables, 1);
            for (int r = 0; r < 4; ++r)
              for (int h = 0; h < Hkv; ++h) {
                std::vector<double> mass;
                estimate_page_mass(*est, w.store, *b.tables[r], 1, h, query_of(in, r), c, &mass);
                SCOPED_TRACE(::testing::Message() << "gamma " << gamma << " sink " << n_sink << " req " << r
                                                  << " head " << h << " " << est_name);
                expect_coverage_definition(mass, row_pages(pl, r, h), n_sink, 2, gamma);
              }
            // Deterministic: the same inputs give the same lists.
            EXPECT_EQ(pol.select(in).slots, pl.slots);
          }
  }
}

TEST(SparsePolicy, CoverageTiesGoToLowerPageIndex) {
  const std::vector<double> flat(10, 0.1);
  EXPECT_EQ(coverage_set(flat, 1, 1, 0.5), (std::vector<int32_t>{0, 1, 2, 3, 9}));
  EXPECT_EQ(coverage_set(flat, 0, 0, 0.25), (std::vector<int32_t>{0, 1, 2}));
  const std::vector<double> m{0.1, 0.3, 0.2, 0.2, 0.2};
  EXPECT_EQ(coverage_set(m, 0, 0, 0.65), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(top_k_set(m, 0, 0, 2), (std::vector<int32_t>{1, 2}));
  EXPECT_TRUE(coverage_set({}, 1, 1, 0.99).empty());
  EXPECT_EQ(coverage_set({1.0}, 0, 0, 0.99), (std::vector<int32_t>{0}));
  EXPECT_EQ(coverage_set(m, 0, 0, 0.0), (std::vector<int32_t>{}));
}

TEST(SparsePolicy, TopKMatchesDefinition) {
  const int Hkv = 2, Hq = 8, D = 16, ps = 16;
  std::mt19937 rng(20);
  SparseWorld w(1, Hkv, ps, D, Hkv * 50);
  const Batch b = random_batch(w, rng, Hq, {400, 33, 16, 250}, 1);
  const SelectionInput in = input_of(b, w, 0, Hq);
  for (int k : {1, 2, 3, 5, 8, 100})
    for (int n_sink : {0, 1}) {
      const auto est = make_estimator("minmax");
      TopKPolicy pol(est, ScoredParams{0.0, k, n_sink, 1, GroupCombine::Sum});
      const PageLists pl = pol.select(in);
      expect_well_formed(pl, b.tables, 0);
      for (int r = 0; r < 4; ++r)
        for (int h = 0; h < Hkv; ++h) {
          SCOPED_TRACE(::testing::Message() << "k " << k << " sink " << n_sink << " req " << r << " head " << h);
          std::vector<double> mass;
          estimate_page_mass(*est, w.store, *b.tables[r], 0, h, query_of(in, r), GroupCombine::Sum, &mass);
          const int64_t n = static_cast<int64_t>(mass.size());
          const std::vector<int32_t> got = row_pages(pl, r, h);
          ASSERT_EQ(static_cast<int64_t>(got.size()), std::min<int64_t>(k, n));
          const std::set<int32_t> s(got.begin(), got.end());
          const int n_forced = std::min<int64_t>(n, n_sink + 1);
          if (k >= n_forced)
            for (int64_t i = 0; i < n; ++i)
              if (is_forced(i, n, n_sink, 1)) {
                ASSERT_TRUE(s.count(static_cast<int32_t>(i)));
              }
          // Best-ranked: no free page outside beats (or ties with lower index) one inside.
          for (int64_t a = 0; a < n; ++a)
            for (int64_t o = 0; o < n; ++o) {
              if (!s.count(a) || s.count(o) || is_forced(a, n, n_sink, 1) || is_forced(o, n, n_sink, 1)) continue;
              ASSERT_TRUE(mass[a] > mass[o] || (mass[a] == mass[o] && a < o)) << "in " << a << " out " << o;
            }
        }
    }
}

TEST(SparsePolicy, TopKForcedPagesOverBudget) {
  const std::vector<double> m{0.0, 0.5, 0.2, 0.1, 0.2};
  EXPECT_EQ(top_k_set(m, 2, 2, 3), (std::vector<int32_t>{0, 1, 4}));  // sinks, then newest
  EXPECT_EQ(top_k_set(m, 1, 1, 3), (std::vector<int32_t>{0, 1, 4}));
  EXPECT_EQ(top_k_set(m, 0, 0, 0), (std::vector<int32_t>{}));
}

TEST(SparsePolicy, SinkWindowAndDense) {
  const int Hkv = 2, Hq = 4, D = 8, ps = 16;
  std::mt19937 rng(30);
  SparseWorld w(2, Hkv, ps, D, 2 * Hkv * 30);
  const Batch b = random_batch(w, rng, Hq, {200, 20, 1, 0}, 1);
  const SelectionInput in = input_of(b, w, 1, Hq);
  const PageLists pl = SinkWindowPolicy(2, 3).select(in);
  expect_well_formed(pl, b.tables, 1);
  EXPECT_EQ(row_pages(pl, 0, 1), (std::vector<int32_t>{0, 1, 10, 11, 12}));
  EXPECT_EQ(row_pages(pl, 1, 0), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(row_pages(pl, 2, 0), (std::vector<int32_t>{0}));
  EXPECT_TRUE(row_pages(pl, 3, 1).empty());
  const PageLists dense = DensePolicy().select(in);
  const PageLists ref = dense_page_lists(b.tables, 1, b.seq_len);
  EXPECT_EQ(dense.indptr, ref.indptr);
  EXPECT_EQ(dense.slots, ref.slots);
  EXPECT_EQ(dense.page_pos, ref.page_pos);
  // Empty and one-page requests through the scoring policies, too.
  const auto est = make_estimator("minmax");
  for (const PageLists& p : {CoverageGammaPolicy(est, ScoredParams{0.5, 0, 0, 0}).select(in),
                             TopKPolicy(est, ScoredParams{0, 1, 0, 0}).select(in),
                             SoloHeadPolicy(est, ScoredParams{0.5, 0, 0, 0}).select(in)}) {
    expect_well_formed(p, b.tables, 1);
    EXPECT_EQ(row_pages(p, 2, 1), (std::vector<int32_t>{0}));
    EXPECT_TRUE(row_pages(p, 3, 0).empty());
  }
}

TEST(SparsePolicy, SoloHeadSharesOneScoredSet) {
  const int Hkv = 4, Hq = 8, D = 16, ps = 16;
  std::mt19937 rng(40);
  SparseWorld w(1, Hkv, ps, D, Hkv * 40);
  const Batch b = random_batch(w, rng, Hq, {333, 50}, 1);
  const SelectionInput in = input_of(b, w, 0, Hq);
  const auto est = make_estimator("meanspread");
  for (int budget : {0, 4})
    for (GroupCombine c : {GroupCombine::Sum, GroupCombine::Max}) {
      const PageLists pl = SoloHeadPolicy(est, ScoredParams{0.9, budget, 1, 1, c}).select(in);
      expect_well_formed(pl, b.tables, 0);
      for (int r = 0; r < 2; ++r) {
        std::vector<double> mass;
        estimate_page_mass_heads(*est, w.store, *b.tables[r], 0, {0, 1, 2, 3}, query_of(in, r), c, &mass);
        const std::vector<int32_t> want =
            budget > 0 ? top_k_set(mass, 1, 1, budget) : coverage_set(mass, 1, 1, 0.9);
        if (budget == 0) expect_coverage_definition(mass, want, 1, 1, 0.9);
        for (int h = 0; h < Hkv; ++h) EXPECT_EQ(row_pages(pl, r, h), want) << "req " << r << " head " << h;
      }
    }
}

TEST(SparsePolicy, DenseBelowThresholdAndFactory) {
  const int Hkv = 2, Hq = 4, D = 8, ps = 16;
  std::mt19937 rng(50);
  SparseWorld w(1, Hkv, ps, D, Hkv * 40);
  const Batch b = random_batch(w, rng, Hq, {300, 100}, 1);
  const SelectionInput in = input_of(b, w, 0, Hq);
  PolicySpec cfg;
  cfg.rule = SelectRule::TopK;
  cfg.estimator = "minmax";
  cfg.budget = 3;
  cfg.dense_below = 200;
  const auto pol = make_policy(cfg);
  const PageLists pl = pol->select(in);
  EXPECT_EQ(row_pages(pl, 0, 0).size(), 3u);
  EXPECT_EQ(row_pages(pl, 1, 1).size(), 7u);  // 100 tokens < 200: all 7 pages
  for (const RuleInfo& r : rule_table()) {
    cfg.rule = r.rule;
    EXPECT_NO_THROW(make_policy(cfg)->select(in)) << r.name;
  }
  cfg.rule = static_cast<SelectRule>(99);
  EXPECT_THROW(make_policy(cfg), Error);
  cfg.rule = SelectRule::TopK;
  cfg.budget = 0;
  EXPECT_THROW(make_policy(cfg), Error);
  cfg.rule = SelectRule::Coverage;
  cfg.gamma = 1.5;
  EXPECT_THROW(make_policy(cfg), Error);
  cfg.gamma = 0.9;
  cfg.rule = SelectRule::TopFrac;
  cfg.frac = 0.0;
  EXPECT_THROW(make_policy(cfg), Error);
}

// TopFrac: each list keeps ceil(frac x its pages) pages -- top_k_set with that k -- so a longer
// request reads more pages; lists no longer than their k stay whole.
TEST(SparsePolicy, TopFracKeepsAFractionOfEachList) {
  const int Hkv = 2, Hq = 4, D = 8, ps = 16;
  std::mt19937 rng(51);
  SparseWorld w(1, Hkv, ps, D, Hkv * 60);
  const Batch b = random_batch(w, rng, Hq, {640, 100, 16}, 1);  // 40, 7 and 1 pages
  const SelectionInput in = input_of(b, w, 0, Hq);
  PolicySpec frac;
  frac.rule = SelectRule::TopFrac;
  frac.estimator = "minmax";
  frac.frac = 0.3;
  const PageLists pl = make_policy(frac)->select(in);
  PolicySpec topk = frac;
  topk.rule = SelectRule::TopK;
  for (int req = 0; req < 3; ++req) {
    const int n = (std::vector<int>{40, 7, 1})[static_cast<size_t>(req)];
    EXPECT_EQ(top_frac_k(0.3, n), (std::vector<int>{12, 3, 1})[static_cast<size_t>(req)]);
    // The same pages as top-k with that request's k.
    topk.budget = top_frac_k(0.3, n);
    const PageLists want = make_policy(topk)->select(in);
    for (int h = 0; h < Hkv; ++h) {
      EXPECT_EQ(row_pages(pl, req, h).size(), static_cast<size_t>(std::min(n, top_frac_k(0.3, n)))) << req;
      EXPECT_EQ(row_pages(pl, req, h), row_pages(want, req, h)) << req << " " << h;
    }
  }
}

// Runs cpu::attention of one decode row per request over `pl`.  q: [n_req, Hq, D]
std::vector<float> attend(const SparseWorld& w, const Batch& b, const PageLists& pl, int Hq) {
  std::vector<float> out(b.q.size());
  cpu::AttentionParams ap;
  ap.q = b.q.data();
  ap.out = out.data();
  ap.q_indptr = b.q_indptr.data();
  ap.lists = &pl;
  ap.pool = &w.pool;
  ap.n_heads_q = Hq;
  ap.n_heads_kv = w.n_heads_kv;
  ap.head_dim = w.head_dim;
  ap.scale = 1.0f / std::sqrt(static_cast<float>(w.head_dim));
  cpu::attention(ap);
  return out;
}

TEST(SparsePolicyEndToEnd, GammaOneIsDenseExactly) {
  const int Hkv = 2, Hq = 8, D = 32, ps = 16;
  std::mt19937 rng(60);
  SparseWorld w(1, Hkv, ps, D, Hkv * 60);
  const Batch b = random_batch(w, rng, Hq, {501, 77, 16}, 1);
  const SelectionInput in = input_of(b, w, 0, Hq);
  const PageLists cov = CoverageGammaPolicy(make_estimator("minmax"), ScoredParams{1.0, 0, 1, 1}).select(in);
  const PageLists dense = dense_page_lists(b.tables, 0, b.seq_len);
  EXPECT_EQ(cov.slots, dense.slots);
  EXPECT_EQ(attend(w, b, cov, Hq), attend(w, b, dense, Hq));  // bitwise
}

// Peaked pattern: per KV head a direction u_h; its q heads are u_h + small noise, background
// keys are small noise, and three "needle" tokens per head have k = 2 u_h (logit ~ 16 vs ~ 0).
// Bound checked: with e the true softmax mass outside the chosen pages (computed exactly here),
// |o_sparse - o_dense| <= 2 e max|v| per component, plus fp32 slack; and e itself must be tiny.
TEST(SparsePolicyEndToEnd, Gamma099OnPeakedAttention) {
  const int Hkv = 2, Hq = 8, D = 64, ps = 16, group = Hq / Hkv;
  const int64_t len = 64 * ps - 5;
  std::mt19937 rng(70);
  SparseWorld w(1, Hkv, ps, D, Hkv * 64);
  std::vector<std::vector<float>> u(Hkv);
  for (auto& x : u) x = test::random_vec(D, rng);
  std::set<std::pair<int, int32_t>> needles;
  std::uniform_int_distribution<int32_t> pos_d(ps, static_cast<int32_t>(len) - 2 * ps);
  for (int h = 0; h < Hkv; ++h)
    while (needles.size() < static_cast<size_t>(3 * (h + 1))) needles.insert({h, pos_d(rng)});
  std::normal_distribution<float> nd(0.0f, 1.0f);
  PageTable& t = w.add_request();
  w.append(t, len, rng, [&](int, int h, int32_t pos, int d, bool is_v) {
    if (is_v) return nd(rng);
    return needles.count({h, pos}) ? 2.0f * u[h][d] : 0.3f * nd(rng);
  });
  Batch b;
  b.tables = w.table_ptrs();
  b.seq_len = {static_cast<int32_t>(len)};
  b.q_indptr = {0, 1};
  b.q.resize(static_cast<size_t>(Hq * D));
  for (int hq = 0; hq < Hq; ++hq)
    for (int d = 0; d < D; ++d) b.q[hq * D + d] = u[hq / group][d] + 0.1f * nd(rng);
  const SelectionInput in = input_of(b, w, 0, Hq);
  const std::vector<float> ref = attend(w, b, dense_page_lists(b.tables, 0, b.seq_len), Hq);

  for (const char* est_name : {"minmax", "meanspread"}) {
    const PageLists pl = CoverageGammaPolicy(make_estimator(est_name), ScoredParams{0.99, 0, 1, 1}).select(in);
    const std::vector<float> got = attend(w, b, pl, Hq);
    // Quest's bound separates needle pages (score >= 16 logits) from noise (~3.4): few pages.
    // Mean+spread (kappa 1) dilutes a lone needle by 1/16 in the mean, so its pages score only
    // a few logits above noise pages and gamma = 0.99 takes (nearly) all pages: correct output,
    // no saving. Recorded in docs/sparse.md.
    if (std::string(est_name) == "minmax") {
      EXPECT_LE(pl.nnz(), 2 * 8) << "pages read";
    }
    std::printf("[ info ] %s gamma 0.99: %lld of %d pages read\n", est_name, static_cast<long long>(pl.nnz()), Hkv * 64);
    for (int hq = 0; hq < Hq; ++hq) {
      const int hk = hq / group;
      const std::vector<int32_t> chosen = row_pages(pl, 0, hk);
      const std::set<int32_t> in_set(chosen.begin(), chosen.end());
      // Exact softmax over all tokens in double: mass outside the chosen pages, max |v|.
      std::vector<double> s(static_cast<size_t>(len));
      double m = -INFINITY, vmax = 0.0;
      for (int64_t p = 0; p < len; ++p) {
        int row;
        const PageRef pg = t.page_of_token(0, hk, p, &row);
        double dot = 0.0;
        for (int d = 0; d < D; ++d) {
          dot += static_cast<double>(b.q[hq * D + d]) * w.pool.k_page(pg)[row * D + d];
          vmax = std::max(vmax, static_cast<double>(std::abs(w.pool.v_page(pg)[row * D + d])));
        }
        s[p] = dot / std::sqrt(static_cast<double>(D));
        m = std::max(m, s[p]);
      }
      double z = 0.0, outside = 0.0;
      for (int64_t p = 0; p < len; ++p) {
        z += std::exp(s[p] - m);
        if (!in_set.count(static_cast<int32_t>(p / ps))) outside += std::exp(s[p] - m);
      }
      const double e = outside / z;
      EXPECT_LT(e, 1e-3) << est_name << " q head " << hq;
      for (int d = 0; d < D; ++d)
        EXPECT_LE(std::abs(got[hq * D + d] - ref[hq * D + d]), 2.0 * e * vmax + 1e-5)
            << est_name << " q head " << hq << " dim " << d;
    }
  }
}

// The whole-step thresholds: dense when every request is below dense_below, or when the step holds
// fewer than min_step_tokens in all; the boundaries themselves select.
TEST(SparsePolicy, StepRunsPolicyThresholds) {
  EXPECT_TRUE(step_runs_policy({100, 5000}, 0, 0));
  EXPECT_FALSE(step_runs_policy({100, 4999}, 5000, 0));  // every request below
  EXPECT_TRUE(step_runs_policy({100, 5000}, 5000, 0));   // one request at the threshold selects
  EXPECT_FALSE(step_runs_policy({3000, 2999}, 0, 6000)); // 5,999 tokens in the step
  EXPECT_TRUE(step_runs_policy({3000, 3000}, 0, 6000));
  EXPECT_FALSE(step_runs_policy({8000, 8000}, 9000, 6000));  // either rule makes the step dense
  EXPECT_FALSE(step_runs_policy({8000}, 0, 9000));
  EXPECT_TRUE(step_runs_policy({}, 0, 0));  // (an empty batch: nothing to force)
}

// Verification-seeded drafts (sparse/draft_seeds.h): a scoring policy records, per (layer, KV
// head), the heaviest pages of the masses it selected from; a seeded sink-window draft reads its
// window and those pages. Checked against the masses computed here, independently of the policy.
TEST(DraftSeeds, HeaviestPagesByMassThenIndex) {
  const std::vector<double> m{0.1, 0.3, 0.2, 0.3, 0.05, 0.05};
  const std::vector<int32_t> all{0, 1, 2, 3, 4, 5};
  EXPECT_EQ(heaviest_pages(m, all, 3), (std::vector<int32_t>{1, 3, 2}));
  EXPECT_EQ(heaviest_pages(m, all, 6), (std::vector<int32_t>{1, 3, 2, 0, 4, 5}));
  EXPECT_EQ(heaviest_pages(m, all, 10).size(), 6u);
  EXPECT_EQ(heaviest_pages(m, {5, 4, 0, 2}, 3), (std::vector<int32_t>{2, 0, 4}));  // of the given pages only
  EXPECT_TRUE(heaviest_pages(m, {}, 4).empty());
  EXPECT_TRUE(heaviest_pages(m, all, 0).empty());
}

TEST(DraftSeeds, ScoringRecordsAndSeededDraftReadsWindowAndSeeds) {
  const int Hkv = 2, Hq = 4, D = 16, ps = 16, M = 5;
  std::mt19937 rng(40);
  SparseWorld w(3, Hkv, ps, D, 3 * Hkv * 60);
  const Batch b = random_batch(w, rng, Hq, {500, 90, 20, 0}, 1);
  std::vector<DraftSeeds> seeds(4);
  std::vector<DraftSeeds*> seed_ptr;
  for (DraftSeeds& s : seeds) {
    s.set_capacity(M);
    s.begin_step(100);
    seed_ptr.push_back(&s);
  }
  const auto est = make_estimator("meanspread");
  std::vector<PageLists> chosen(3);
  for (int layer : {2, 0}) {  // (layers recorded out of order)
    SelectionInput in = input_of(b, w, layer, Hq);
    in.seeds = seed_ptr.data();
    chosen[static_cast<size_t>(layer)] = CoverageGammaPolicy(est, ScoredParams{0.9, 0, 1, 1}).select(in);
  }
  for (int r = 0; r < 3; ++r) {
    const int64_t n = (b.seq_len[r] + ps - 1) / ps;
    ASSERT_FALSE(seeds[static_cast<size_t>(r)].empty());
    EXPECT_EQ(seeds[static_cast<size_t>(r)].first_pos(), 100);
    for (int layer : {0, 2})
      for (int h = 0; h < Hkv; ++h) {
        SCOPED_TRACE(::testing::Message() << "req " << r << " layer " << layer << " head " << h);
        const SelectionInput in = input_of(b, w, layer, Hq);
        std::vector<double> mass;
        estimate_page_mass(*est, w.store, *b.tables[r], layer, h, query_of(in, r), GroupCombine::Sum, &mass);
        // The recorded seeds: the M heaviest of the pages the policy chose (fewer when it chose
        // fewer), ascending here.
        std::vector<std::pair<double, int32_t>> ranked;
        const std::vector<int32_t> set = row_pages(chosen[static_cast<size_t>(layer)], r, h);
        if (r == 0) {
          ASSERT_LT(set.size(), mass.size()) << "the coverage set holds every page: the check is void";
        }
        for (int32_t i : set) ranked.push_back({-mass[static_cast<size_t>(i)], i});
        std::sort(ranked.begin(), ranked.end());
        std::vector<int32_t> want;
        for (size_t i = 0; i < std::min<size_t>(M, ranked.size()); ++i) want.push_back(ranked[i].second);
        std::sort(want.begin(), want.end());
        EXPECT_EQ(seeds[static_cast<size_t>(r)].pages(layer, h, Hkv, M, n), want);
        // The 2 heaviest only; and none past a shorter list.
        std::vector<int32_t> top2;
        for (size_t i = 0; i < std::min<size_t>(2, ranked.size()); ++i) top2.push_back(ranked[i].second);
        std::sort(top2.begin(), top2.end());
        EXPECT_EQ(seeds[static_cast<size_t>(r)].pages(layer, h, Hkv, 2, n), top2);
        for (int32_t p : seeds[static_cast<size_t>(r)].pages(layer, h, Hkv, M, 3)) EXPECT_LT(p, 3);

        // A seeded draft (sink 1 + window 2 + M seeds): the union, ascending, each page once.
        SelectionInput din = input_of(b, w, layer, Hq);
        din.seeds = seed_ptr.data();
        const PageLists pl = SinkWindowPolicy(1, 2, M).select(din);
        expect_well_formed(pl, b.tables, layer);
        std::set<int32_t> u(want.begin(), want.end());
        u.insert(0);
        for (int64_t i = std::max<int64_t>(0, n - 2); i < n; ++i) u.insert(static_cast<int32_t>(i));
        EXPECT_EQ(row_pages(pl, r, h), std::vector<int32_t>(u.begin(), u.end()));
      }
  }
  // No seeds recorded at layer 1: the window alone; a request with no pages: nothing.
  SelectionInput din = input_of(b, w, 1, Hq);
  din.seeds = seed_ptr.data();
  const PageLists pl = SinkWindowPolicy(1, 2, M).select(din);
  EXPECT_EQ(row_pages(pl, 0, 0), (std::vector<int32_t>{0, 30, 31}));
  EXPECT_TRUE(row_pages(pl, 3, 0).empty());
  // Rollback: past the recording step's start keeps the seeds, to it or before forgets them.
  seeds[0].truncate(101);
  EXPECT_FALSE(seeds[0].empty());
  seeds[0].truncate(100);
  EXPECT_TRUE(seeds[0].empty());
  const PageLists after = SinkWindowPolicy(1, 2, M).select(input_of(b, w, 2, Hq));  // (no seeds given at all)
  EXPECT_EQ(row_pages(after, 0, 1), (std::vector<int32_t>{0, 30, 31}));
}

}  // namespace
}  // namespace dhs
