// CPU backend ops against naive statements of their definitions, on awkward
// sizes (97 rows, 70 columns, 1..50 tokens, last pages partly full).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backend/cpu/attention.h"
#include "model/rope.h"
#include "backend/cpu/ops.h"
#include "core/error.h"
#include "core/fp16.h"
#include "core/merge_state.h"
#include "kv/tier_split.h"

namespace dhs {
namespace {

std::vector<float> randn(size_t n, std::mt19937& rng, float s = 1.0f) {
  std::normal_distribution<float> d(0.0f, s);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// fp32 sums of 70-1536 products of unit normals: rounding error ~ sqrt(n) * 2^-24 * |terms|;
// 1e-4 absolute on values of magnitude ~10 is ~100x that.
TEST(CpuOps, MatmulMatchesNaive) {
  std::mt19937 rng(7);
  for (auto wt : {CpuWeightType::F32, CpuWeightType::F16}) {
    for (int64_t cols : {70, 64, 577}) {
      for (int64_t n_tok : {1, 2, 5, 50}) {
        const int64_t rows = 97;
        auto w = randn(static_cast<size_t>(rows * cols), rng);
        auto x = randn(static_cast<size_t>(n_tok * cols), rng);
        auto bias = randn(static_cast<size_t>(rows), rng);
        CpuMatrix m(w.data(), rows, cols, wt);
        std::vector<float> y(static_cast<size_t>(n_tok * rows));
        cpu::matmul(m, x.data(), y.data(), n_tok, bias.data());
        for (int64_t t = 0; t < n_tok; ++t)
          for (int64_t r = 0; r < rows; ++r) {
            double s = bias[static_cast<size_t>(r)];
            for (int64_t c = 0; c < cols; ++c) {
              float wv = w[static_cast<size_t>(r * cols + c)];
              if (wt == CpuWeightType::F16) wv = fp16_to_f32(f32_to_fp16(wv));  // what is stored
              s += static_cast<double>(wv) * x[static_cast<size_t>(t * cols + c)];
            }
            ASSERT_NEAR(y[static_cast<size_t>(t * rows + r)], s, 1e-4 * std::sqrt(static_cast<double>(cols)))
                << "cols " << cols << " n_tok " << n_tok << " t " << t << " r " << r;
          }
      }
    }
  }
}

TEST(CpuOps, RmsNorm) {
  std::mt19937 rng(3);
  auto x = randn(3 * 97, rng, 5.0f);
  auto w = randn(97, rng);
  std::vector<float> y(x.size());
  cpu::rms_norm(x.data(), w.data(), y.data(), 3, 97, 1e-5f);
  for (int r = 0; r < 3; ++r) {
    double ss = 0;
    for (int i = 0; i < 97; ++i) ss += x[r * 97 + i] * x[r * 97 + i];
    const double inv = 1.0 / std::sqrt(ss / 97 + 1e-5);
    for (int i = 0; i < 97; ++i) ASSERT_NEAR(y[r * 97 + i], x[r * 97 + i] * inv * w[i], 1e-5);
  }
}

// Interleaved RoPE on a permuted vector equals half-split RoPE on the original:
// exactly the relation between GGUF llama Q/K rows and HF checkpoints.
TEST(CpuOps, RopeInterleavedEqualsHalfAfterPermutation) {
  ModelConfig cfg;
  cfg.head_dim = 64;
  cfg.rope_theta = 10000.0f;
  std::vector<float> inv(32);
  rope_inv_freq(cfg, inv.data());
  EXPECT_FLOAT_EQ(inv[0], 1.0f);
  EXPECT_NEAR(inv[1], std::pow(10000.0, -2.0 / 64), 1e-7);  // stored as fp32
  std::mt19937 rng(5);
  auto half = randn(64, rng);
  std::vector<float> inter(64);
  for (int i = 0; i < 32; ++i) {
    inter[2 * i] = half[i];
    inter[2 * i + 1] = half[i + 32];
  }
  const int32_t pos = 1234;
  cpu::rope(half.data(), &pos, 1, 1, 64, inv.data(), RopeStyle::Half);
  cpu::rope(inter.data(), &pos, 1, 1, 64, inv.data(), RopeStyle::Interleaved);
  for (int i = 0; i < 32; ++i) {
    EXPECT_NEAR(inter[2 * i], half[i], 1e-5);
    EXPECT_NEAR(inter[2 * i + 1], half[i + 32], 1e-5);
  }
}

TEST(CpuOps, Llama3RopeScalingBands) {
  ModelConfig cfg;
  cfg.head_dim = 128;
  cfg.rope_theta = 500000.0f;
  cfg.rope_scaling.kind = RopeScaling::Kind::Llama3;
  cfg.rope_scaling.factor = 8.0f;
  cfg.rope_scaling.low_freq_factor = 1.0f;
  cfg.rope_scaling.high_freq_factor = 4.0f;
  cfg.rope_scaling.original_max_position = 8192;
  std::vector<float> inv(64);
  rope_inv_freq(cfg, inv.data());
  for (int i = 0; i < 64; ++i) {
    const double f = std::pow(500000.0, -2.0 * i / 128), wl = 2 * M_PI / f;
    if (wl < 8192 / 4.0) EXPECT_NEAR(inv[i], f, 1e-9 + 1e-6 * f) << i;          // high frequency: kept
    else if (wl > 8192 / 1.0) EXPECT_NEAR(inv[i], f / 8, 1e-6 * f) << i;      // low: divided by factor
    else EXPECT_TRUE(inv[i] < f && inv[i] > f / 8) << i;                      // blended
  }
}

TEST(MergeState, MergingPartsEqualsWhole) {
  std::mt19937 rng(11);
  auto s = randn(37, rng, 3.0f);
  auto v = randn(37 * 5, rng);
  auto part = [&](int b, int e, MergeState* st, std::vector<float>* o) {
    o->assign(5, 0.0f);
    st->m = -INFINITY;
    for (int i = b; i < e; ++i) st->m = std::max(st->m, s[i]);
    for (int i = b; i < e; ++i) {
      const float w = std::exp(s[i] - st->m);
      st->d += w;
      for (int j = 0; j < 5; ++j) (*o)[j] += w * v[i * 5 + j];
    }
  };
  MergeState whole, a, b, empty;
  std::vector<float> ow, oa, ob, oe(5, 0.0f);
  part(0, 37, &whole, &ow);
  part(0, 10, &a, &oa);
  part(10, 37, &b, &ob);
  merge(a, oa.data(), empty, oe.data(), 5);  // merging nothing changes nothing
  merge(a, oa.data(), b, ob.data(), 5);
  EXPECT_NEAR(a.lse(), whole.lse(), 1e-5);
  for (int j = 0; j < 5; ++j) EXPECT_NEAR(oa[j] / a.d, ow[j] / whole.d, 1e-5);
  EXPECT_EQ(empty.lse(), -INFINITY);
}

// Paged attention over random page lists (different length per head, empty
// lists, partly-full last pages, q_len 1 and 5) against dense softmax
// attention over exactly the keys the list names.
TEST(CpuAttention, MatchesNaiveOnRandomPageLists) {
  std::mt19937 rng(42);
  const int ps = 16, d = 64, hq = 6, hkv = 2, n_req = 5;
  PagePool pool(Tier::Host, 400, ps, d);
  std::vector<PageTable> tables;
  std::vector<int32_t> seq_len = {97, 3, 16, 35, 1};
  std::vector<int32_t> q_len = {1, 3, 5, 1, 1};
  for (int r = 0; r < n_req; ++r) {
    tables.emplace_back(1, hkv, ps);
    ASSERT_TRUE(tables.back().reserve(pool, seq_len[r]));
    tables.back().commit(seq_len[r]);
  }
  for (auto& t : tables)
    for (PageRef p : t.all_pages()) {
      auto k = randn(ps * d, rng), v = randn(ps * d, rng);
      std::copy(k.begin(), k.end(), pool.k_page(p));
      std::copy(v.begin(), v.end(), pool.v_page(p));
    }
  // Random subset lists: each (req, head) keeps each page with prob 0.6; head 1 of req 0 is empty.
  PageLists pl;
  pl.n_requests = n_req;
  pl.n_heads_kv = hkv;
  pl.seq_len = seq_len;
  pl.indptr = {0};
  for (int r = 0; r < n_req; ++r)
    for (int h = 0; h < hkv; ++h) {
      const int n_pages = (seq_len[r] + ps - 1) / ps;
      for (int i = 0; i < n_pages; ++i) {
        if (r == 0 && h == 1) continue;
        if (rng() % 10 < 6 || n_pages == 1) {
          pl.slots.push_back(tables[r].page(0, h, i).slot);
          pl.page_pos.push_back(i);
        }
      }
      pl.indptr.push_back(static_cast<int32_t>(pl.slots.size()));
    }
  std::vector<int32_t> q_indptr = {0};
  for (int r = 0; r < n_req; ++r) q_indptr.push_back(q_indptr.back() + q_len[r]);
  const int n_rows = q_indptr.back();
  auto q = randn(static_cast<size_t>(n_rows * hq * d), rng);
  std::vector<float> out(q.size()), lse(static_cast<size_t>(n_rows * hq));
  cpu::AttentionParams p;
  p.q = q.data();
  p.out = out.data();
  p.lse = lse.data();
  p.q_indptr = q_indptr.data();
  p.lists = &pl;
  p.pool = &pool;
  p.n_heads_q = hq;
  p.n_heads_kv = hkv;
  p.head_dim = d;
  p.scale = 0.125f;
  cpu::attention(p);

  for (int r = 0; r < n_req; ++r)
    for (int j = 0; j < q_len[r]; ++j) {
      const int row = q_indptr[r] + j;
      const int qpos = seq_len[r] - q_len[r] + j;
      for (int h = 0; h < hq; ++h) {
        const int hk = h / (hq / hkv);
        std::vector<double> sc;
        std::vector<const float*> vs;
        for (int k = pl.row_begin(r, hk); k < pl.row_end(r, hk); ++k) {
          const PageRef pg{Tier::Host, pl.slots[k]};
          for (int t = 0; t < ps; ++t) {
            const int pos = pl.page_pos[k] * ps + t;
            if (pos > qpos) break;
            double s = 0;
            for (int i = 0; i < d; ++i) s += q[(row * hq + h) * d + i] * pool.k_page(pg)[t * d + i];
            sc.push_back(s * 0.125);
            vs.push_back(pool.v_page(pg) + t * d);
          }
        }
        const float* o = out.data() + (row * hq + h) * d;
        if (sc.empty()) {
          for (int i = 0; i < d; ++i) ASSERT_EQ(o[i], 0.0f);
          ASSERT_EQ(lse[row * hq + h], -INFINITY);
          continue;
        }
        const double m = *std::max_element(sc.begin(), sc.end());
        double den = 0;
        for (double s : sc) den += std::exp(s - m);
        for (int i = 0; i < d; ++i) {
          double acc = 0;
          for (size_t t = 0; t < sc.size(); ++t) acc += std::exp(sc[t] - m) * vs[t][i];
          // Outputs are convex combinations of unit normals: 1e-5 is ~100x fp32 rounding.
          ASSERT_NEAR(o[i], acc / den, 1e-5) << "req " << r << " row " << j << " head " << h;
        }
        ASSERT_NEAR(lse[row * hq + h], m + std::log(den), 1e-4);
      }
    }
  for (auto& t : tables) t.release(pool);
  EXPECT_EQ(pool.check_invariants(), "");
  EXPECT_EQ(pool.n_used(), 0);
}

// The recall-ahead schedule's read (kv/tier_split.h): lists naming pages in either tier split
// into the device part and the late part, rows and order kept; attention over each from its own
// pool, merged by log-sum-exp (merge_normalized), equals attention over the whole list in one
// pool — rows all resident, all late, mixed, empty, q_len 1 and 4, partly full last pages.
TEST(TierSplit, SplitsByTierKeepingRowsAndOrder) {
  PageLists in;
  in.n_requests = 2;
  in.n_heads_kv = 2;
  in.seq_len = {40, 9};
  in.indptr = {0, 3, 3, 5, 6};
  const int64_t n_dev = 10;  // keys >= 10 name host slots
  in.slots = {4, 10 + 7, 2, 10 + 0, 10 + 3, 9};
  in.page_pos = {0, 1, 2, 0, 1, 0};
  PageLists dev, late;
  split_lists_by_tier(in, n_dev, &dev, &late);
  EXPECT_EQ(dev.indptr, (std::vector<int32_t>{0, 2, 2, 2, 3}));
  EXPECT_EQ(dev.slots, (std::vector<int32_t>{4, 2, 9}));
  EXPECT_EQ(dev.page_pos, (std::vector<int32_t>{0, 2, 0}));
  EXPECT_EQ(late.indptr, (std::vector<int32_t>{0, 1, 1, 3, 3}));
  EXPECT_EQ(late.slots, (std::vector<int32_t>{7, 0, 3}));
  EXPECT_EQ(late.page_pos, (std::vector<int32_t>{1, 0, 1}));
  EXPECT_EQ(late.seq_len, in.seq_len);
  EXPECT_EQ(tier_key({Tier::Host, 0}, n_dev), 10);
  EXPECT_EQ(tier_of_key(tier_key({Tier::Host, 0}, n_dev), n_dev), (PageRef{Tier::Host, 0}));
  EXPECT_EQ(tier_of_key(tier_key({Tier::Device, 9}, n_dev), n_dev), (PageRef{Tier::Device, 9}));
  in.indptr.back() = 5;  // malformed
  EXPECT_THROW(split_lists_by_tier(in, n_dev, &dev, &late), Error);
}

TEST(TierSplit, AttentionOverBothTiersMergedEqualsWhole) {
  std::mt19937 rng(7);
  const int ps = 16, d = 64, hq = 8, hkv = 2, n_req = 4;
  PagePool whole(Tier::Device, 200, ps, d), dev(Tier::Device, 200, ps, d), host(Tier::Host, 200, ps, d);
  const std::vector<int32_t> seq_len = {97, 40, 33, 5}, q_len = {1, 4, 1, 1};
  // Each (request, head): pages kept with probability 0.7, each in the host tier with
  // probability 0.5 — except (0, 0) all resident, (1, 1) all late, (2, 1) empty.
  PageLists in, ref;
  in.n_requests = ref.n_requests = n_req;
  in.n_heads_kv = ref.n_heads_kv = hkv;
  in.seq_len = ref.seq_len = seq_len;
  in.indptr = ref.indptr = {0};
  int32_t next = 0;
  for (int r = 0; r < n_req; ++r)
    for (int h = 0; h < hkv; ++h) {
      const int n_pages = (seq_len[r] + ps - 1) / ps;
      for (int i = 0; i < n_pages; ++i) {
        if (r == 2 && h == 1) break;
        if (rng() % 10 >= 7 && i + 1 < n_pages) continue;  // (the last page always: every row sees a key)
        const int32_t slot = next++;
        const PageRef w{Tier::Device, slot};
        const auto k = randn(ps * d, rng), v = randn(ps * d, rng);
        std::copy(k.begin(), k.end(), whole.k_page(w));
        std::copy(v.begin(), v.end(), whole.v_page(w));
        const bool late = (r == 1 && h == 1) || (!(r == 0 && h == 0) && rng() % 2 == 0);
        const PageRef p{late ? Tier::Host : Tier::Device, slot};
        PagePool& to = late ? host : dev;
        std::copy(k.begin(), k.end(), to.k_page(p));
        std::copy(v.begin(), v.end(), to.v_page(p));
        in.slots.push_back(tier_key(p, 200));
        ref.slots.push_back(slot);
        in.page_pos.push_back(i);
        ref.page_pos.push_back(i);
      }
      in.indptr.push_back(static_cast<int32_t>(in.slots.size()));
      ref.indptr.push_back(static_cast<int32_t>(ref.slots.size()));
    }
  PageLists dl, ll;
  split_lists_by_tier(in, 200, &dl, &ll);
  ASSERT_GT(dl.nnz(), 0);
  ASSERT_GT(ll.nnz(), 0);
  std::vector<int32_t> q_indptr = {0};
  for (int r = 0; r < n_req; ++r) q_indptr.push_back(q_indptr.back() + q_len[r]);
  const int n_rows = q_indptr.back();
  const auto q = randn(static_cast<size_t>(n_rows * hq * d), rng);
  const auto run = [&](const PageLists& lists, const PagePool& pool, std::vector<float>* out, std::vector<float>* lse) {
    out->assign(q.size(), 0.0f);
    lse->assign(static_cast<size_t>(n_rows * hq), 0.0f);
    cpu::AttentionParams p;
    p.q = q.data();
    p.out = out->data();
    p.lse = lse->data();
    p.q_indptr = q_indptr.data();
    p.lists = &lists;
    p.pool = &pool;
    p.n_heads_q = hq;
    p.n_heads_kv = hkv;
    p.head_dim = d;
    p.scale = 0.125f;
    cpu::attention(p);
  };
  std::vector<float> ow, lw, od, ld, ol, lla;
  run(ref, whole, &ow, &lw);
  run(dl, dev, &od, &ld);
  run(ll, host, &ol, &lla);
  for (int i = 0; i < n_rows * hq; ++i) {
    merge_normalized(od.data() + i * d, ld[static_cast<size_t>(i)], ol.data() + i * d, lla[static_cast<size_t>(i)], d);
    // Convex combinations of unit normals, two fp32 passes and one merge against one pass: 1e-5
    // is ~100x the rounding.
    for (int j = 0; j < d; ++j) ASSERT_NEAR(od[static_cast<size_t>(i * d + j)], ow[static_cast<size_t>(i * d + j)], 1e-5) << "row-head " << i;
    if (lw[static_cast<size_t>(i)] == -INFINITY) EXPECT_EQ(ld[static_cast<size_t>(i)], -INFINITY);
    else EXPECT_NEAR(ld[static_cast<size_t>(i)], lw[static_cast<size_t>(i)], 1e-4) << "row-head " << i;
  }
}

}  // namespace
}  // namespace dhs
