// Speculative verification on the CPU runner (StepRequest::verify, issue 24). A verify step of
// k + 1 rows must give each row the logits that decoding the same tokens one at a time gives:
// the same bits, since the CPU forward computes a row the same way in any batch
// (test_batch_invariance) and a verify row reads the pages its own decode step would (its
// selection made over page data up to its own position). Also after a draft on other pages whose
// KV the verify writes again, and after a rollback of rejected rows: the run continues as one that
// never saw them, with the same pages in use. Tiny random Qwen2 checkpoint, pages of 16 tokens,
// prompts placed so that the verify rows cross a page boundary.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "../test_paths.h"
#include "dhisparse/policy.h"
#include "engine/step_runner.h"
#include "kv/page_table.h"
#include "model/model_loader.h"

namespace dhs {
namespace {

float max_diff(const float* a, const float* b, int64_t n) {
  float d = 0.0f;
  for (int64_t i = 0; i < n; ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

std::vector<int32_t> random_ids(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> id(0, 299);
  std::vector<int32_t> v(n);
  for (int32_t& t : v) t = id(rng);
  return v;
}

class Speculative : public ::testing::Test {
 protected:
  void SetUp() override { src_ = open_weights(test::data_dir() + "/tiny_models/qwen2_bias"); }
  std::unique_ptr<StepRunner> runner(const std::string& policy) {
    EngineOptions o;
    o.weight_type = "f32";
    o.policy = PolicySpec::parse(policy);
    o.kv_blocks = 32;
    return make_cpu_runner(*src_, o, 512);
  }
  PageTable table(const StepRunner& r) const {
    return PageTable(static_cast<int>(r.config().n_layers), static_cast<int>(r.config().n_heads_kv), 16);
  }
  static void prefill(StepRunner& r, PageTable& t, const std::vector<int32_t>& ids) {
    StepOutput out;
    ASSERT_TRUE(t.reserve(r.pages(), static_cast<int64_t>(ids.size())));
    r.step({StepRequest{&t, 0, ids.data(), static_cast<int64_t>(ids.size())}}, &out, false);
  }
  // One decode step per token (policy: the request's own, or null); each step's logits.
  static std::vector<std::vector<float>> decode(StepRunner& r, PageTable& t, const std::vector<int32_t>& ids,
                                                const PolicySpec* policy = nullptr) {
    std::vector<std::vector<float>> logits;
    StepOutput out;
    for (const int32_t& id : ids) {
      EXPECT_TRUE(t.reserve(r.pages(), 1));
      StepRequest q{&t, 0, &id, 1};
      q.policy = policy;
      r.step({q}, &out, true);
      logits.push_back(out.logits);
    }
    return logits;
  }
  // One verify step over `ids`; its rows' logits [n, vocab].
  static std::vector<float> verify(StepRunner& r, PageTable& t, const std::vector<int32_t>& ids) {
    EXPECT_TRUE(t.reserve(r.pages(), static_cast<int64_t>(ids.size())));
    StepRequest q{&t, 0, ids.data(), static_cast<int64_t>(ids.size())};
    q.verify = true;
    StepOutput out;
    r.step({q}, &out, false);
    EXPECT_EQ(out.verify_row.at(0), 0);
    EXPECT_EQ(out.verify_logits.size(), ids.size() * static_cast<size_t>(r.config().vocab_size));
    EXPECT_TRUE(out.logits.empty()) << "no last-row logits were asked for";
    return out.verify_logits;
  }
  std::unique_ptr<WeightSource> src_;
};

// Every policy kind: dense, scoring rules on each estimator's page data, and a rule without scores.
TEST_F(Speculative, VerifyRowsEqualDecodingOneByOneAfterADraft) {
  const std::vector<int32_t> prompt = random_ids(170, 1);  // rows at 170..177 cross the page at 176
  const std::vector<int32_t> next = random_ids(8, 2);
  const std::vector<int32_t> drafted(next.begin(), next.begin() + 4);
  std::vector<std::vector<float>> dense_logits;
  for (const std::string policy : {"dense", "coverage:0.8@sketch4", "coverage:0.7@minmax", "topk:3@sketch4",
                                   "coverage:0.8@meanspread", "sinkwindow:3"}) {
    SCOPED_TRACE(policy);
    auto one = runner(policy);
    const int64_t V = one->config().vocab_size;
    PageTable ta = table(*one);
    prefill(*one, ta, prompt);
    const auto steps = decode(*one, ta, next);
    ta.release(one->pages());

    // The draft decodes 4 of the tokens on 2 pages (sink + recent), then the verify writes them
    // again from the prompt's end.
    auto spec = runner(policy);
    PageTable tb = table(*spec);
    prefill(*spec, tb, prompt);
    const PolicySpec draft = PolicySpec::parse("sinkwindow:2");
    const auto draft_logits = decode(*spec, tb, drafted, &draft);
    spec->truncate(tb, static_cast<int64_t>(prompt.size()));
    const std::vector<float> rows = verify(*spec, tb, next);
    EXPECT_EQ(tb.n_tokens(), static_cast<int64_t>(prompt.size() + next.size()));
    for (size_t j = 0; j < next.size(); ++j)
      EXPECT_EQ(max_diff(rows.data() + j * static_cast<size_t>(V), steps[j].data(), V), 0.0f) << "row " << j;
    float draft_moved = 0.0f;
    for (size_t j = 0; j < drafted.size(); ++j)
      draft_moved = std::max(draft_moved, max_diff(draft_logits[j].data(), steps[j].data(), V));
    EXPECT_GT(draft_moved, 1e-2f) << "the draft read every page: its KV equals the verify's and the check is void";
    tb.release(spec->pages());
    EXPECT_EQ(spec->pages().check_invariants(), "");
    EXPECT_EQ(spec->pages().stats().n_used, 0);

    if (dense_logits.empty()) {
      dense_logits = steps;
    } else {
      float moved = 0.0f;
      for (size_t j = 0; j < steps.size(); ++j) moved = std::max(moved, max_diff(steps[j].data(), dense_logits[j].data(), V));
      EXPECT_GT(moved, 1e-2f) << "the policy reads every page here: the check is void";
    }
  }
}

// Verify 6 rows, keep 3 (two drafts accepted plus the first row's token): the next decode steps
// equal a run that decoded only the kept tokens, and the pool holds the same number of pages —
// also when the rejected rows had opened a page of their own.
TEST_F(Speculative, RollbackLeavesNoTrace) {
  for (const size_t n_prompt : {size_t{170}, size_t{173}}) {  // 173 + 3 = 176: the rejected rows' page is freed
    SCOPED_TRACE(n_prompt);
    const std::vector<int32_t> prompt = random_ids(n_prompt, 3);
    const std::vector<int32_t> rows = random_ids(6, 4);
    const std::vector<int32_t> kept(rows.begin(), rows.begin() + 3);
    const std::vector<int32_t> after = random_ids(4, 5);
    for (const std::string policy : {"coverage:0.8@sketch4", "coverage:0.7@minmax", "dense"}) {
      SCOPED_TRACE(policy);
      auto never = runner(policy);
      PageTable ta = table(*never);
      prefill(*never, ta, prompt);
      decode(*never, ta, kept);
      const int64_t used_never = never->pages().stats().n_used;
      const auto want = decode(*never, ta, after);

      auto spec = runner(policy);
      PageTable tb = table(*spec);
      prefill(*spec, tb, prompt);
      verify(*spec, tb, rows);
      spec->truncate(tb, static_cast<int64_t>(n_prompt + kept.size()));
      EXPECT_EQ(spec->pages().stats().n_used, used_never);
      const auto got = decode(*spec, tb, after);
      for (size_t j = 0; j < after.size(); ++j)
        EXPECT_EQ(max_diff(got[j].data(), want[j].data(), spec->config().vocab_size), 0.0f) << "step " << j;
      EXPECT_EQ(spec->pages().stats().n_used, never->pages().stats().n_used);
      ta.release(never->pages());
      tb.release(spec->pages());
      EXPECT_EQ(spec->pages().check_invariants(), "");
      EXPECT_EQ(spec->pages().stats().n_used, 0);
    }
  }
}

// Verification-seeded drafts (sinkwindow:K+M, sparse/draft_seeds.h) through the runner. The
// seeds are the heaviest pages the verifier's last scoring step selected; with M at least that
// set and a window inside it (its sink and last page are forced pages of the verifier's sets too),
// a draft step in the same page reads exactly the pages that step read: the page counts are
// equal, and larger than the window's alone. Without seeds (none kept, or a rollback past the
// step that recorded them) the draft reads its window alone, with the window's logits.
TEST_F(Speculative, SeededDraftReadsTheVerifiersPages) {
  const std::vector<int32_t> prompt = random_ids(170, 6);  // decode rows at 170..175: page 10 throughout
  const std::vector<int32_t> rows = random_ids(3, 7);
  const int32_t next = 11;
  const PolicySpec seeded = PolicySpec::parse("sinkwindow:2+64");  // sink + last page, + up to 64 seeds (11 pages here)
  const PolicySpec window = PolicySpec::parse("sinkwindow:2");
  for (const bool keep : {true, false})
    for (const bool by_verify : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "keep " << keep << " by_verify " << by_verify);
      auto r = runner("coverage:0.6@sketch4");
      const int64_t n_lists = r->config().n_layers * r->config().n_heads_kv;
      if (keep) r->keep_draft_seeds(64);
      PageTable t = table(*r);
      prefill(*r, t, prompt);
      (void)r->take_page_counts();
      if (by_verify) {
        verify(*r, t, rows);  // its last row records the seeds
      } else {
        decode(*r, t, std::vector<int32_t>(rows.begin(), rows.end() - 1));
        (void)r->take_page_counts();
        decode(*r, t, {rows.back()});  // the step that records them
      }
      const uint64_t recorded_read = r->take_page_counts().read;
      decode(*r, t, {next}, &seeded);
      const uint64_t draft_read = r->take_page_counts().read;
      if (!keep) {
        EXPECT_EQ(draft_read, static_cast<uint64_t>(2 * n_lists)) << "no seeds kept: the window alone";
      } else {
        EXPECT_GT(draft_read, static_cast<uint64_t>(2 * n_lists)) << "the seeded draft read its window alone";
        if (!by_verify) {
          EXPECT_EQ(draft_read, recorded_read) << "the draft did not read the recording step's set";
        }
        // Rolled back to before the step that recorded them: the window alone again, with the
        // window's logits.
        r->truncate(t, static_cast<int64_t>(prompt.size()));
        const std::vector<float> again = decode(*r, t, {rows[0]}, &seeded)[0];
        EXPECT_EQ(r->take_page_counts().read, static_cast<uint64_t>(2 * n_lists));
        auto w = runner("coverage:0.6@sketch4");
        PageTable tw = table(*w);
        prefill(*w, tw, prompt);
        EXPECT_EQ(max_diff(again.data(), decode(*w, tw, {rows[0]}, &window)[0].data(), w->config().vocab_size), 0.0f);
        tw.release(w->pages());
      }
      t.release(r->pages());
      EXPECT_EQ(r->pages().check_invariants(), "");
    }
}

// A step with a speculative verify and another request's prompt chunk: the plain decode row beside
// them reads its policy's pages as in a decode step alone (LlamaCpu::plan_verify_step; until
// session 37 a chunk in the step made the plain rows read every page), the verify's rows equal the
// same verifies alone, and the chunk's last row equals its prefill alone. Three such steps, against
// each request run by itself; A's steps alone must differ from A read densely by more than 1e-2,
// so a plain row that read every page fails.
TEST_F(Speculative, APlainRowBesideAVerifyAndAPromptChunkReadsItsPolicy) {
  const std::string policy = "coverage:0.8@sketch4";
  const std::vector<int32_t> pa = random_ids(170, 3), pc = random_ids(150, 4), pb = random_ids(120, 5);
  const std::vector<int32_t> a_next = random_ids(3, 6), c_next = random_ids(9, 7);
  const auto alone_a = [&](const std::string& pol) {
    auto r = runner(pol);
    PageTable t = table(*r);
    prefill(*r, t, pa);
    const auto steps = decode(*r, t, a_next);
    t.release(r->pages());
    return steps;
  };
  const auto want_a = alone_a(policy), dense_a = alone_a("dense");
  const int64_t V = runner(policy)->config().vocab_size;
  std::vector<std::vector<float>> want_c, want_b;
  {
    auto r = runner(policy);
    PageTable tc = table(*r), tb = table(*r);
    prefill(*r, tc, pc);
    for (int k = 0; k < 3; ++k) want_c.push_back(verify(*r, tc, std::vector<int32_t>(c_next.begin() + 3 * k, c_next.begin() + 3 * k + 3)));
    StepOutput out;
    for (int k = 0; k < 3; ++k) {
      EXPECT_TRUE(tb.reserve(r->pages(), 40));
      r->step({StepRequest{&tb, 0, pb.data() + 40 * k, 40}}, &out, true);
      want_b.push_back(out.logits);
    }
    tc.release(r->pages());
    tb.release(r->pages());
  }
  auto r = runner(policy);
  PageTable ta = table(*r), tb = table(*r), tc = table(*r);
  prefill(*r, ta, pa);
  prefill(*r, tc, pc);
  float moved = 0.0f;
  for (int k = 0; k < 3; ++k) {
    EXPECT_TRUE(tb.reserve(r->pages(), 40));
    EXPECT_TRUE(ta.reserve(r->pages(), 1));
    EXPECT_TRUE(tc.reserve(r->pages(), 3));
    StepRequest qc{&tc, 2, c_next.data() + 3 * k, 3};
    qc.verify = true;
    StepOutput out;
    r->step({StepRequest{&tb, 0, pb.data() + 40 * k, 40}, StepRequest{&ta, 1, &a_next[static_cast<size_t>(k)], 1}, qc}, &out, true);
    ASSERT_EQ(out.logits.size(), 3 * static_cast<size_t>(V));
    EXPECT_EQ(max_diff(out.logits.data() + V, want_a[static_cast<size_t>(k)].data(), V), 0.0f) << "A at step " << k;
    EXPECT_EQ(max_diff(out.logits.data(), want_b[static_cast<size_t>(k)].data(), V), 0.0f) << "B's chunk " << k;
    ASSERT_EQ(out.verify_row.at(2), 0);
    EXPECT_EQ(max_diff(out.verify_logits.data(), want_c[static_cast<size_t>(k)].data(), 3 * V), 0.0f) << "C's verify " << k;
    moved = std::max(moved, max_diff(want_a[static_cast<size_t>(k)].data(), dense_a[static_cast<size_t>(k)].data(), V));
  }
  EXPECT_GT(moved, 1e-2f) << policy << " reads every page of A here: the check is void";
  for (PageTable* t : {&ta, &tb, &tc}) t->release(r->pages());
  EXPECT_EQ(r->pages().stats().n_used, 0);
}

}  // namespace
}  // namespace dhs
