// Speculative verification on the CUDA backend (LlamaCuda::Seq::verify), on random weights of a
// small Llama shape (no model file), and the default model through the engine:
//  * VerifyRowsEqualDecodingOneByOne: one decode-like step of verify requests of 8, 5 and 1 rows
//    and a plain decode row gives every verify row the logits that decoding its tokens one at a
//    time gives (dense), captured and uncaptured, within BatchedDecodeEqualsSolo's tolerance (2% of
//    the largest |logit|: the verify runs other GEMM shapes and the q_len > 1 attention variant,
//    while a wrong position, mask or page moves logits by units); each request's sampled id is
//    its last row's argmax; a rollback to part of the rows continues as if the rest never came;
//  * SparseVerifySelections: under coverage on the 4-bit key sketch, for each verify_selection
//    (one set from the last row's queries, one from every row's, each row its own): at gamma 1
//    every page is kept and the rows equal the dense verify; at gamma 0.5 fewer pages are read
//    than dense, every logit stays finite; the last-row set reads what that row reads decoding
//    alone on the same KV; per-row reads what decoding one at a time reads, with its logits;
//  * DraftWindowListsEqualTheSelectKernels: draft rows' sink + recent lists from the page table
//    equal the select kernel's SinkWindow lists, also on a dense engine;
//  * MixedStepVerifyRowsReadTheirPolicy: a verify beside a prompt chunk reads its policy's pages;
//  * SeededDraftReadsTheRecordingStepsPages / SeededDraftBesideScoringRequestsReadsItsSeeds: a
//    verification-seeded draft reads the pages its recording step chose, in a step of drafts only
//    and in one where other requests score (the select kernel's sink-window rule with seeds);
//  * EngineSpeculativeGreedyEqualsPlain: the default model through the engine on the device,
//    greedy output with --speculative-k 3 / 6 (sink + recent drafts) equal to decoding without
//    it under dense verification and under coverage 0.99 with per-row selections, drafts both
//    kept and rejected; coverage 0.99 with one shared set run and counted.
// The KV pool's accounting is checked after each test.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "dhisparse/engine.h"
#include "gtest_shim.h"
#include "model/arch/llama_cuda.h"
#include "model/gguf_source.h"
#include "test_paths.h"
#include "tiny_llama.h"

namespace {

using namespace dhs;
using test::argmax;
using test::expect_pool_empty;
using test::have_gpu;
using test::random_ids;
using test::tiny_config;

constexpr int kMaxRows = 8;  // 32 query vectors per KV head at GQA group 4

struct Fixture {
  ModelConfig cfg = tiny_config();
  std::unique_ptr<LlamaCuda> m;
  std::vector<PageTable> ts;
  std::vector<std::vector<int32_t>> feed;  // per request: the tokens after its prompt
  std::vector<int64_t> n0;                 // tokens after the prompt

  explicit Fixture(bool sketch, const std::string& verify_selection = "last-row") {
    CudaModelOptions o;
    // "per-row-union": per-row selections read as their union (CudaModelOptions::per_row_union).
    o.verify_selection = verify_selection == "per-row-union" ? "per-row" : verify_selection;
    o.per_row_union = verify_selection == "per-row-union";
    o.max_batch = 8;
    o.max_step_tokens = 512;
    o.max_context = 512;
    o.max_verify_rows = kMaxRows;
    o.key_sketch = sketch;
    m = std::make_unique<LlamaCuda>(cfg, 7, o);
    std::mt19937 rng(11);
    // Prompts that leave pages part full; each request gets kMaxRows tokens to decode.
    for (const int len : {13, 40, 75, 130}) {
      ts.emplace_back(static_cast<int>(cfg.n_layers), static_cast<int>(cfg.n_heads_kv), 16);
      const std::vector<int32_t> p = random_ids(len, static_cast<int>(cfg.vocab_size), rng);
      feed.push_back(random_ids(kMaxRows, static_cast<int>(cfg.vocab_size), rng));
      EXPECT_TRUE(ts.back().reserve(m->allocator(), len));
      m->forward({LlamaCuda::Seq{&ts.back(), static_cast<int>(ts.size()) - 1, p.data(), len}}, nullptr);
      n0.push_back(ts.back().n_tokens());
    }
  }
  ~Fixture() {
    for (auto& t : ts) t.release(m->allocator());
    expect_pool_empty(m->allocator(), "verify fixture");
  }
  // One step of the four requests, each feeding its token `fed` under its own rule (own[r]; null:
  // the engine's): the pages the step read over every (layer, KV head). Not rolled back.
  uint64_t pages_read_step(int fed, const std::vector<const PolicySpec*>& own) {
    std::vector<LlamaCuda::Seq> batch;
    for (int r = 0; r < 4; ++r) {
      PageTable& t = ts[static_cast<size_t>(r)];
      EXPECT_TRUE(t.reserve(m->allocator(), 1));
      LlamaCuda::Seq s{&t, r, &feed[static_cast<size_t>(r)][static_cast<size_t>(fed)], 1};
      s.policy = own[static_cast<size_t>(r)];
      batch.push_back(s);
    }
    m->reset_sparsity_stats();
    std::vector<float> l;
    m->forward(batch, &l);
    uint64_t read = 0;
    for (uint64_t x : m->sparsity_stats().read) read += x;
    return read;
  }
  // Request r alone, decoding its first n fed tokens one step each: each step's logits. Rolled back.
  std::vector<std::vector<float>> one_by_one(int r, int n) {
    PageTable& t = ts[static_cast<size_t>(r)];
    std::vector<std::vector<float>> out;
    std::vector<float> l;
    for (int s = 0; s < n; ++s) {
      EXPECT_TRUE(t.reserve(m->allocator(), 1));
      m->forward({LlamaCuda::Seq{&t, r, &feed[static_cast<size_t>(r)][static_cast<size_t>(s)], 1}}, &l);
      out.push_back(l);
    }
    t.truncate(m->allocator(), n0[static_cast<size_t>(r)]);
    return out;
  }
};

float max_abs(const std::vector<float>& v) {
  float s = 0.0f;
  for (float x : v) s = std::max(s, std::fabs(x));
  return s;
}

TEST(CudaVerify, VerifyRowsEqualDecodingOneByOne) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  Fixture f(false);
  const int64_t V = f.cfg.vocab_size;
  // Requests 0-2 verify 8, 5 and 1 rows; request 3 decodes one plain row.
  const std::vector<int> rows = {8, 5, 1, 1};
  const std::vector<bool> verify = {true, true, true, false};
  std::vector<std::vector<std::vector<float>>> ref;
  for (int r = 0; r < 4; ++r) ref.push_back(f.one_by_one(r, rows[static_cast<size_t>(r)]));
  for (const bool graph : {true, false}) {
    SCOPED_TRACE(graph ? "captured" : "uncaptured");
    std::vector<LlamaCuda::Seq> batch;
    for (int r = 0; r < 4; ++r) {
      PageTable& t = f.ts[static_cast<size_t>(r)];
      ASSERT_TRUE(t.reserve(f.m->allocator(), rows[static_cast<size_t>(r)]));
      LlamaCuda::Seq s{&t, r, f.feed[static_cast<size_t>(r)].data(), rows[static_cast<size_t>(r)]};
      s.verify = verify[static_cast<size_t>(r)];
      batch.push_back(s);
    }
    std::vector<float> l;
    f.m->forward(batch, &l, graph);
    ASSERT_EQ(l.size(), static_cast<size_t>(8 + 5 + 1 + 1) * static_cast<size_t>(V));
    float md = 0.0f, scale = 0.0f;
    for (int r = 0; r < 4; ++r) {
      const int64_t first = f.m->out_row(static_cast<size_t>(r));
      const int n = rows[static_cast<size_t>(r)];
      for (int j = 0; j < n; ++j) {
        const float* got = l.data() + (first + j) * V;
        const std::vector<float>& want = ref[static_cast<size_t>(r)][static_cast<size_t>(j)];
        for (int64_t i = 0; i < V; ++i) md = std::max(md, std::fabs(got[i] - want[static_cast<size_t>(i)]));
        scale = std::max(scale, max_abs(want));
      }
      EXPECT_EQ(f.m->sampled_ids()[static_cast<size_t>(r)], argmax(l.data() + (first + n - 1) * V, V))
          << "request " << r << ": the sampled id is not its last row's argmax";
    }
    std::printf("verify rows vs one by one (%s): max |dlogit| %.4f (tolerance %.4f = 2%% of max |logit| %.2f)\n",
                graph ? "graph" : "eager", md, 0.02f * scale, scale);
    EXPECT_LE(md, 0.02f * scale) << "verify rows differ from decoding one at a time";
    for (int r = 0; r < 4; ++r) f.ts[static_cast<size_t>(r)].truncate(f.m->allocator(), f.n0[static_cast<size_t>(r)]);
  }
  // Rollback: verify request 0's 8 rows, keep 3 (two drafts and the next token's row), decode its
  // 4th fed token: the logits of decoding the first 4 one by one.
  {
    PageTable& t = f.ts[0];
    ASSERT_TRUE(t.reserve(f.m->allocator(), 8));
    LlamaCuda::Seq s{&t, 0, f.feed[0].data(), 8};
    s.verify = true;
    f.m->forward({s}, nullptr);
    t.truncate(f.m->allocator(), f.n0[0] + 3);
    ASSERT_TRUE(t.reserve(f.m->allocator(), 1));
    std::vector<float> l;
    f.m->forward({LlamaCuda::Seq{&t, 0, &f.feed[0][3], 1}}, &l);
    float md = 0.0f;
    for (int64_t i = 0; i < V; ++i) md = std::max(md, std::fabs(l[static_cast<size_t>(i)] - ref[0][3][static_cast<size_t>(i)]));
    std::printf("decode after a rollback of 5 of 8 verify rows: max |dlogit| %.4f\n", md);
    EXPECT_LE(md, 0.02f * max_abs(ref[0][3])) << "decoding after the rollback differs from never having seen the rows";
    t.truncate(f.m->allocator(), f.n0[0]);
  }
}

TEST(CudaVerify, SparseVerifySelections) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  for (const std::string mode : {"last-row", "all-rows", "per-row", "per-row-union"}) {
    SCOPED_TRACE(mode);
    Fixture f(true, mode);
    std::vector<int64_t> out_rows(4);  // of the last verify
    auto verify_all = [&](std::vector<float>* l) {
      std::vector<LlamaCuda::Seq> batch;
      for (int r = 0; r < 4; ++r) {
        PageTable& t = f.ts[static_cast<size_t>(r)];
        EXPECT_TRUE(t.reserve(f.m->allocator(), 6));
        LlamaCuda::Seq s{&t, r, f.feed[static_cast<size_t>(r)].data(), 6};
        s.verify = true;
        batch.push_back(s);
      }
      f.m->reset_sparsity_stats();
      f.m->forward(batch, l);
      for (int r = 0; r < 4; ++r) out_rows[static_cast<size_t>(r)] = f.m->out_row(static_cast<size_t>(r));
      return f.m->sparsity_stats().read_frac();
    };
    auto roll_back = [&](int keep) {
      for (int r = 0; r < 4; ++r) f.ts[static_cast<size_t>(r)].truncate(f.m->allocator(), f.n0[static_cast<size_t>(r)] + keep);
    };
    std::vector<float> dense, all, half;
    verify_all(&dense);
    roll_back(0);
    f.m->set_sparsity(PolicySpec::parse("coverage:1.0@sketch4"));
    const double frac_all = verify_all(&all);
    roll_back(0);
    f.m->set_sparsity(PolicySpec::parse("coverage:0.5@sketch4"));
    // The merged form: each layer's merge checked against the CPU statement and its attention
    // against the rows read one at a time on the same lists; the step goes on with the latter's
    // output, so the rest of it is the per-row form's (the merged read's own logits follow below).
    if (mode == "per-row-union") f.m->check_row_union(true, true);
    const double frac_half = verify_all(&half);
    const LlamaCuda::RowUnionCheck united = f.m->row_union_check();
    f.m->check_row_union(false);
    // The last row decoded alone on the KV the verify wrote: its own selection.
    roll_back(5);
    std::vector<LlamaCuda::Seq> last;
    for (int r = 0; r < 4; ++r) {
      PageTable& t = f.ts[static_cast<size_t>(r)];
      EXPECT_TRUE(t.reserve(f.m->allocator(), 1));
      last.push_back(LlamaCuda::Seq{&t, r, &f.feed[static_cast<size_t>(r)][5], 1});
    }
    f.m->reset_sparsity_stats();
    std::vector<float> l;
    f.m->forward(last, &l);
    const double frac_last = f.m->sparsity_stats().read_frac();
    roll_back(0);
    // Every row decoded one at a time under the same policy.
    f.m->reset_sparsity_stats();
    std::vector<std::vector<std::vector<float>>> one(4);
    for (int r = 0; r < 4; ++r) one[static_cast<size_t>(r)] = f.one_by_one(r, 6);
    const double frac_one = f.m->sparsity_stats().read_frac();
    f.m->set_sparsity(PolicySpec{});
    const int64_t V = f.cfg.vocab_size;
    float md_one = 0.0f, scale = 0.0f;
    for (int r = 0; r < 4; ++r)
      for (int j = 0; j < 6; ++j) {
        const float* got = half.data() + (out_rows[static_cast<size_t>(r)] + j) * V;
        const std::vector<float>& want = one[static_cast<size_t>(r)][static_cast<size_t>(j)];
        for (int64_t i = 0; i < V; ++i) md_one = std::max(md_one, std::fabs(got[i] - want[static_cast<size_t>(i)]));
        scale = std::max(scale, max_abs(want));
      }
    ASSERT_EQ(all.size(), dense.size());
    float md = 0.0f;
    for (size_t i = 0; i < dense.size(); ++i) md = std::max(md, std::fabs(all[i] - dense[i]));
    std::printf("sparse verify (%s), 4 x 6 rows: gamma 1 reads %.3f of the pages (max |dlogit| vs dense %.4f); gamma 0.5 "
                "reads %.4f (the last row alone %.4f, every row one at a time %.4f), max |dlogit| vs one at a time %.4f\n",
                mode.c_str(), frac_all, md, frac_half, frac_last, frac_one, md_one);
    EXPECT_EQ(frac_all, 1.0) << "coverage 1 must keep every page";
    EXPECT_LE(md, 0.02f * max_abs(dense)) << "every page kept, yet the rows differ from the dense verify";
    EXPECT_LT(frac_half, 1.0) << "coverage 0.5 kept every page";
    EXPECT_GT(frac_half, 0.0);
    for (float x : half) ASSERT_TRUE(std::isfinite(x));
    // Last row: the set that row selects decoding alone, up to a page at the cut (its key and
    // query come from other GEMM shapes there: f16 roundings of near-equal masses). Per row: the
    // sets of decoding one at a time, so the pages read and, within 5% of the largest |logit|,
    // the logits (a page flipped at the cut moves a row by ~0.1 on these near-uniform random
    // weights; a row reading past its position or another row's set, by units).
    if (mode == "last-row") {
      EXPECT_NEAR(frac_half, frac_last, 0.01) << "the shared set is not the last row's";
    }
    if (mode == "per-row" || mode == "per-row-union") {
      EXPECT_NEAR(frac_half, frac_one, 0.01) << "the rows' sets are not their decode steps'";
    }
    if (mode == "per-row" || mode == "per-row-union") {
      EXPECT_LE(md_one, 0.05f * scale) << "per-row verify rows differ from decoding one at a time";
    }
    if (mode == "per-row-union") {
      // Every layer of the verify merged (4 layers, one step), each merge equal to
      // union_row_lists; the merged read's attention within 4 f16 ulps at [1, 2) of reading the
      // rows one at a time: both are convex combinations of the same V rows (|v| < 2 here) with P
      // rounded to f16 against different running maxima and partials merged in another order,
      // each output rounded to f16 once (a row reading a page outside its list moves by ~0.1).
      EXPECT_EQ(united.layers, f.cfg.n_layers) << "the verify's layers did not all go through the merge";
      EXPECT_EQ(united.merges_equal, united.layers) << "a merge differs from union_row_lists";
      EXPECT_LE(united.max_att_diff, 4.0f / 1024.0f) << "the merged read's attention differs from the rows' own";
      // The merged read's own logits: its roundings (<= 1e-3 per layer on the H100) move pages at
      // the gamma 0.5 cut of later layers, and these near-uniform random weights put many pages
      // there (0.74 against one at a time in session 28). Printed, not asserted; the default
      // model's greedy tokens through the engine are the exactness test (EngineSpeculative...).
      roll_back(0);
      f.m->set_sparsity(PolicySpec::parse("coverage:0.5@sketch4"));
      std::vector<float> merged;
      verify_all(&merged);
      f.m->set_sparsity(PolicySpec{});
      float md_merged = 0.0f;
      for (int r = 0; r < 4; ++r)
        for (int j = 0; j < 6; ++j) {
          const float* got = merged.data() + (out_rows[static_cast<size_t>(r)] + j) * V;
          const std::vector<float>& want = one[static_cast<size_t>(r)][static_cast<size_t>(j)];
          for (int64_t i = 0; i < V; ++i) md_merged = std::max(md_merged, std::fabs(got[i] - want[static_cast<size_t>(i)]));
        }
      std::printf("sparse verify (per-row-union): merged read's attention within %.4f of the rows' own in %lld layers; "
                  "its logits against one at a time %.4f (with the rows' own attention kept: %.4f)\n",
                  united.max_att_diff, static_cast<long long>(united.layers), md_merged, md_one);
    }
  }
}

// Draft steps read sink + recent pages from window_lists.h's kernel: the same lists as the select
// kernel's SinkWindow rule (logits bit for bit, pages read equal) with the rule as the engine's
// policy and as each request's own under a coverage engine; on a dense engine (no page data, no
// select workspace) the requests' own windows are read too, exactly the pages counted here.
TEST(CudaVerify, DraftWindowListsEqualTheSelectKernels) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  const PolicySpec window = PolicySpec::parse("sinkwindow:3");  // 1 sink + 2 recent pages
  auto step = [](Fixture& f, const PolicySpec* own, std::vector<float>* l) {
    std::vector<LlamaCuda::Seq> batch;
    for (int r = 0; r < 4; ++r) {
      PageTable& t = f.ts[static_cast<size_t>(r)];
      EXPECT_TRUE(t.reserve(f.m->allocator(), 1));
      LlamaCuda::Seq s{&t, r, f.feed[static_cast<size_t>(r)].data(), 1};
      s.policy = own;
      batch.push_back(s);
    }
    f.m->reset_sparsity_stats();
    f.m->forward(batch, l);
    const CudaSparsityStats st = f.m->sparsity_stats();
    for (int r = 0; r < 4; ++r) f.ts[static_cast<size_t>(r)].truncate(f.m->allocator(), f.n0[static_cast<size_t>(r)]);
    uint64_t read = 0;
    for (uint64_t x : st.read) read += x;
    return read;
  };
  {
    Fixture f(true);
    for (const bool engine_rule : {true, false}) {
      SCOPED_TRACE(engine_rule ? "the engine's policy" : "each request's own under coverage");
      f.m->set_sparsity(engine_rule ? window : PolicySpec::parse("coverage:0.9@sketch4"));
      const PolicySpec* own = engine_rule ? nullptr : &window;
      std::vector<float> fast, slow;
      f.m->set_window_lists(true);
      const uint64_t read_fast = step(f, own, &fast);
      f.m->set_window_lists(false);
      const uint64_t read_slow = step(f, own, &slow);
      f.m->set_window_lists(true);
      EXPECT_EQ(read_fast, read_slow);
      EXPECT_TRUE(fast == slow) << "window lists and the select kernel's SinkWindow lists gave other logits";
    }
    f.m->set_sparsity(PolicySpec{});
  }
  {
    Fixture f(false);  // dense engine: no page data
    std::vector<float> l;
    const uint64_t read = step(f, &window, &l);
    uint64_t want = 0;
    for (int r = 0; r < 4; ++r) {
      const int64_t n = (f.n0[static_cast<size_t>(r)] + 1 + 15) / 16;
      want += static_cast<uint64_t>(std::min<int64_t>(n, 3));
    }
    want *= static_cast<uint64_t>(f.cfg.n_layers * f.cfg.n_heads_kv);
    EXPECT_EQ(read, want) << "a dense engine's draft rows did not read their windows";
    for (float x : l) ASSERT_TRUE(std::isfinite(x));
  }
}

// A verify beside a prompt chunk (CudaModelOptions::mixed_decode_attention): the chunk first in
// the caller's order, then request 3's verify of 4 rows under sink + window (3 of its 9 pages a
// list). Its rows read what the verify alone reads — logits within this file's tolerance (2% of
// the largest |logit|) of the verify-only step's — not every page (the dense verify's logits,
// which the test first checks are more than 4x that tolerance away), and come back at out_row.
TEST(CudaVerify, MixedStepVerifyRowsReadTheirPolicy) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  Fixture f(true);
  const int64_t V = f.cfg.vocab_size;
  const PolicySpec window = PolicySpec::parse("sinkwindow:3");
  constexpr int kRows = 4;
  PageTable& t = f.ts[3];
  auto verify_alone = [&](const PolicySpec& p) {
    f.m->set_sparsity(p);
    EXPECT_TRUE(t.reserve(f.m->allocator(), kRows));
    LlamaCuda::Seq s{&t, 3, f.feed[3].data(), kRows};
    s.verify = true;
    std::vector<float> l;
    f.m->forward({s}, &l);
    t.truncate(f.m->allocator(), f.n0[3]);
    return l;
  };
  const std::vector<float> want = verify_alone(window), dense = verify_alone(PolicySpec{});
  ASSERT_EQ(want.size(), static_cast<size_t>(kRows * V));
  const float tol = 0.02f * max_abs(want);
  float sep = 0.0f;
  for (size_t i = 0; i < want.size(); ++i) sep = std::max(sep, std::fabs(want[i] - dense[i]));
  ASSERT_GT(sep, 4 * tol) << "sink + window is too close to dense here for the test to tell them apart";
  f.m->set_sparsity(window);
  std::mt19937 rng(5);
  const std::vector<int32_t> chunk = random_ids(40, static_cast<int>(V), rng);
  PageTable c(static_cast<int>(f.cfg.n_layers), static_cast<int>(f.cfg.n_heads_kv), 16);
  ASSERT_TRUE(c.reserve(f.m->allocator(), 40));
  ASSERT_TRUE(t.reserve(f.m->allocator(), kRows));
  LlamaCuda::Seq v{&t, 3, f.feed[3].data(), kRows};
  v.verify = true;
  std::vector<float> l;
  f.m->forward({LlamaCuda::Seq{&c, 4, chunk.data(), 40}, v}, &l);
  ASSERT_EQ(l.size(), static_cast<size_t>((1 + kRows) * V));
  ASSERT_EQ(f.m->out_row(1), 1);
  float d_want = 0.0f, d_dense = 0.0f;
  for (int64_t i = 0; i < kRows * V; ++i) {
    d_want = std::max(d_want, std::fabs(l[static_cast<size_t>(V + i)] - want[static_cast<size_t>(i)]));
    d_dense = std::max(d_dense, std::fabs(l[static_cast<size_t>(V + i)] - dense[static_cast<size_t>(i)]));
  }
  std::printf("verify beside a chunk: vs the verify alone %.4f, vs dense %.4f (tolerance %.4f, policy vs dense %.4f)\n",
              d_want, d_dense, tol, sep);
  EXPECT_LE(d_want, tol) << "the verify rows beside a chunk did not read their policy's pages";
  t.truncate(f.m->allocator(), f.n0[3]);
  c.release(f.m->allocator());
  f.m->set_sparsity(PolicySpec{});
}

// Seeded drafts through the model: after a coverage step (which records seeds), a seeded draft
// step (sinkwindow:2+256: sink + last page, the recording step's forced pages, and every seed)
// in the same pages reads exactly the pages that step read; rolled back past the recording step,
// its window alone.
TEST(CudaVerify, SeededDraftReadsTheRecordingStepsPages) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  Fixture f(true);
  f.m->set_sparsity(PolicySpec::parse("coverage:0.9@sketch4"));
  f.m->keep_draft_seeds(256);
  const PolicySpec seeded = PolicySpec::parse("sinkwindow:2+256");
  auto step = [&](int fed, const PolicySpec* own) { return f.pages_read_step(fed, {own, own, own, own}); };
  uint64_t window = 0;  // sink + last page per list (prompts 13, 40, 75, 130 + 1 or 2 tokens: 1, 3, 5, 9 pages)
  for (const int64_t n : {1, 3, 5, 9}) window += static_cast<uint64_t>(std::min<int64_t>(n, 2));
  window *= static_cast<uint64_t>(f.cfg.n_layers * f.cfg.n_heads_kv);
  const uint64_t recorded = step(0, nullptr);
  EXPECT_GT(recorded, window) << "the coverage step read only its forced pages: the check is void";
  EXPECT_EQ(step(1, &seeded), recorded) << "the seeded draft did not read the recording step's pages";
  for (int r = 0; r < 4; ++r) f.ts[static_cast<size_t>(r)].truncate(f.m->allocator(), f.n0[static_cast<size_t>(r)]);
  EXPECT_EQ(step(0, &seeded), window) << "stale seeds (rolled back past their step) were read";
  for (int r = 0; r < 4; ++r) f.ts[static_cast<size_t>(r)].truncate(f.m->allocator(), f.n0[static_cast<size_t>(r)]);
  f.m->set_sparsity(PolicySpec{});
}

// A seeded draft in a step where other requests score (its row through the select kernel's
// sink-window rule, beside their coverage selections) reads the pages it reads in a step of
// drafts only (window_lists.h). Pages read per step, with W a row's window alone, S its seeded
// list and C its coverage selection: {C, C, S, S} = {W, W, S, S} + {C, C, W, W} - {W, W, W, W},
// all four steps from the same state (the one after the recording step). The seeded rows are
// the two longest prompts (5 and 9 pages: room for seeds outside a 2-page window in every list).
TEST(CudaVerify, SeededDraftBesideScoringRequestsReadsItsSeeds) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  Fixture f(true);
  f.m->set_sparsity(PolicySpec::parse("coverage:0.9@sketch4"));
  f.m->keep_draft_seeds(256);
  const PolicySpec s = PolicySpec::parse("sinkwindow:2+256"), w = PolicySpec::parse("sinkwindow:2");
  // One step of the four requests feeding token `fed` (row r's own rule; null: the engine's
  // coverage, so the step scores and every row goes through the select kernel); rolled back to
  // before it unless `keep`.
  auto step = [&](int fed, const std::vector<const PolicySpec*>& own, bool keep) {
    const uint64_t read = f.pages_read_step(fed, own);
    if (!keep)
      for (int r = 0; r < 4; ++r) f.ts[static_cast<size_t>(r)].truncate(f.m->allocator(), f.n0[static_cast<size_t>(r)] + 1);
    return read;
  };
  step(0, {nullptr, nullptr, nullptr, nullptr}, true);  // records every request's seeds
  const uint64_t windows = step(1, {&w, &w, &w, &w}, false);
  const uint64_t seeded_23 = step(1, {&w, &w, &s, &s}, false);  // drafts only: window_lists.h
  const uint64_t scored_01 = step(1, {nullptr, nullptr, &w, &w}, false);
  const uint64_t mixed = step(1, {nullptr, nullptr, &s, &s}, false);
  EXPECT_GT(seeded_23, windows) << "requests 2 and 3 have no seeds beyond their windows: the check is void";
  EXPECT_EQ(mixed, seeded_23 + scored_01 - windows) << "a seeded draft beside scoring requests did not read its seeds";
  for (int r = 0; r < 4; ++r) f.ts[static_cast<size_t>(r)].truncate(f.m->allocator(), f.n0[static_cast<size_t>(r)]);
  f.m->set_sparsity(PolicySpec{});
}

// Drafts on FP8 copies of the projections (CudaModelOptions::draft_fp8), on the default model
// with f16 projections: steps whose rows are drafts give bit for bit the logits of the same steps
// on a model whose projections are FP8 (--quantization fp8: the same quantization from the same
// f32 values, the same kernels); steps that are not drafts give bit for bit those of the f16
// model without the copies; and the two differ (the copies are what drafts read). One request fed
// one token a step from an empty table, so every step is a decode step on every model and the
// draft run's KV is FP8-computed like the FP8 model's.
TEST(CudaVerify, DraftStepsOnFp8CopiesEqualAnFp8Model) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  if (!std::filesystem::exists(test::default_model_path())) GTEST_SKIP() << "default model missing";
  GgufSource src(test::default_model_path());
  auto opts = [](bool fp8, bool draft_fp8) {
    CudaModelOptions o;
    o.max_batch = 2;
    o.max_step_tokens = 64;
    o.max_context = 256;
    o.quantized_weights = false;  // f16 projections
    o.fp8_weights = fp8;
    o.draft_fp8 = draft_fp8;
    return o;
  };
  LlamaCuda with_copy(src, opts(false, true)), fp8(src, opts(true, false)), plain(src, opts(false, false));
  EXPECT_EQ(fp8.draft_weight_bytes(), 0u);
  EXPECT_GT(with_copy.draft_weight_bytes(), 0u);
  EXPECT_EQ(with_copy.step_weight_bytes(false), plain.weight_bytes());
  EXPECT_EQ(with_copy.step_weight_bytes(true), fp8.weight_bytes());  // (the same FP8 matrices beside the same head)
  EXPECT_THROW(LlamaCuda(src, opts(true, true)), std::exception) << "FP8 drafts over FP8 projections were accepted";
  CudaModelOptions blocks = opts(false, true);
  blocks.quantized_weights = true;  // the file's Q4_1 blocks read fewer bytes than FP8
  EXPECT_THROW(LlamaCuda(src, blocks), std::exception) << "FP8 drafts over block-quantized projections were accepted";
  const std::vector<int32_t> ids = {1, 504, 3458, 282, 1987, 30, 2, 17, 9, 4231, 88, 615, 7, 12000, 45};
  const ModelConfig& cfg = src.config();
  auto run = [&](LlamaCuda& m, bool draft) {
    PageTable t(static_cast<int>(cfg.n_layers), static_cast<int>(cfg.n_heads_kv), 16);
    std::vector<std::vector<float>> out;
    for (const int32_t id : ids) {
      EXPECT_TRUE(t.reserve(m.allocator(), 1));
      LlamaCuda::Seq s{&t, 0, &id, 1};
      s.draft = draft;
      std::vector<float> l;
      m.forward({s}, &l);
      out.push_back(l);
    }
    t.release(m.allocator());
    expect_pool_empty(m.allocator(), "fp8 drafts");
    return out;
  };
  const auto drafts = run(with_copy, true), not_drafts = run(with_copy, false);
  const auto want_fp8 = run(fp8, false), want_f16 = run(plain, false);
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_TRUE(drafts[i] == want_fp8[i]) << "step " << i << ": a draft step's logits differ from the FP8 model's";
    EXPECT_TRUE(not_drafts[i] == want_f16[i]) << "step " << i << ": a plain step's logits differ from the f16 model's";
  }
  EXPECT_FALSE(drafts == want_f16) << "draft steps gave the f16 model's logits: the FP8 copies were not read";
}

TEST(CudaVerify, EngineSpeculativeGreedyEqualsPlain) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  if (!std::filesystem::exists(test::default_model_path())) GTEST_SKIP() << "default model missing";
  std::string items;
  for (int i = 1; i <= 60; ++i) items += "Item " + std::to_string(i) + ": the number " + std::to_string(i * 7) + ". ";
  int64_t drafted = 0, accepted = 0;
  int same_shared = 0, differ_shared = 0;
  struct Config {
    const char* policy;
    const char* selection;
    bool exact;              // greedy output must equal decoding without speculation
    bool draft_fp8 = false;  // f16 projections, drafts on their FP8 copies (--draft-quantization fp8)
  };
  int64_t fp8_drafted = 0, fp8_accepted = 0;
  for (const Config& c : {Config{"dense", "last-row", true}, Config{"coverage:0.99", "last-row", false},
                          Config{"coverage:0.99", "per-row", true}, Config{"coverage:0.99", "per-row-union", true},
                          Config{"dense", "last-row", true, true}, Config{"coverage:0.99", "per-row", true, true}}) {
    SCOPED_TRACE(std::string(c.policy) + " " + c.selection + (c.draft_fp8 ? " fp8 drafts" : ""));
    EngineOptions o;
    o.model_path = test::default_model_path();
    o.device = "cuda";
    o.policy = PolicySpec::parse(c.policy);
    o.verify_selection = c.selection;
    if (c.draft_fp8) {
      o.gpu_weights = "f16";
      o.draft_quantization = "fp8";
    }
    auto e = Engine::load(o);
    const std::vector<std::vector<int32_t>> prompts = {
        e->tokenize(items + "Item 61:"),
        e->tokenize_chat({{"user", "What is the capital of France?"}}, true),
        e->tokenize_chat({{"user", "Write a haiku about the sea."}}, true),
    };
    for (size_t i = 0; i < prompts.size(); ++i) {
      GenerateOptions go;
      go.max_tokens = 32;
      const GenerateResult plain = e->generate(prompts[i], go);
      for (const int k : {3, 6}) {
        go.speculative_k = k;
        go.draft_policy = "sinkwindow:2";
        const GenerateResult spec = e->generate(prompts[i], go);
        // Dense, and coverage with per-row selections (read per row or as their union): the
        // verify rows read what their decode steps read, so the tokens are the same (up to f16
        // roundings at near-ties: none on these prompts so far). Coverage with one shared set may
        // differ: counted, not required.
        if (c.exact)
          EXPECT_EQ(spec.tokens, plain.tokens) << "prompt " << i << ", k " << k;
        else
          ++(spec.tokens == plain.tokens ? same_shared : differ_shared);
        EXPECT_GT(spec.spec_verifies, 0);
        drafted += spec.spec_drafted;
        accepted += spec.spec_accepted;
        if (c.draft_fp8) {
          fp8_drafted += spec.spec_drafted;
          fp8_accepted += spec.spec_accepted;
        }
      }
    }
    EXPECT_EQ(e->kv_stats().n_used, 0);
    EXPECT_EQ(e->kv_check(), "");
  }
  std::printf("engine on the device: %lld of %lld drafts accepted; coverage 0.99 with one shared (last-row) verify "
              "selection: %d of %d runs equal to plain decoding\n",
              static_cast<long long>(accepted), static_cast<long long>(drafted), same_shared, same_shared + differ_shared);
  std::printf("engine on the device, drafts on FP8 copies: %lld of %lld drafts accepted\n", static_cast<long long>(fp8_accepted),
              static_cast<long long>(fp8_drafted));
  EXPECT_GT(fp8_accepted, 0) << "no FP8 draft accepted";
  EXPECT_GT(accepted, 0) << "no draft accepted: the accepting path was not run";
  EXPECT_LT(accepted, drafted) << "every draft accepted: the rollback path was not run";
}

}  // namespace
