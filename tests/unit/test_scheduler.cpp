// ContinuousScheduler (engine/continuous_scheduler.h) over a scripted StepRunner and a test
// clock: admission, the token budget, preemption and resume, cancellation, the waiting queue's
// bound, stop strings and eos, timing metrics, the loop thread. No model runs here: the fake
// runner's next token depends only on the request's position, so a request's tokens are known
// whatever it shares a step with, and any difference is the scheduler's doing. (Real models
// through the scheduler: tests/e2e/test_engine.cpp.)
#include <gtest/gtest.h>

#include <limits>

#include <algorithm>

#include <atomic>
#include <map>
#include <set>
#include <thread>

#include "core/error.h"
#include "engine/continuous_scheduler.h"
#include "kv/tiered_kv.h"
#include "test_clock.h"
#include "test_paths.h"
#include "tokenizer/tokenizer.h"

namespace dhs {
namespace {

using test::TestClock;

// Next token = script[history.size() % script.size()]: a function of the position only.
class ScriptRunner final : public StepRunner {
 public:
  // host_pages > 0: a KV hierarchy (kv/tiered_kv.h) with a host tier of that many pages behind the
  // pool, which is then its device tier.
  ScriptRunner(int64_t n_pages, std::vector<int32_t> script, TestClock* clock, int max_batch = 64,
               int64_t host_pages = 0)
      : script_(std::move(script)), clock_(clock), max_batch_(max_batch) {
    cfg_.n_layers = 2;
    cfg_.n_heads_kv = 2;
    cfg_.n_heads_q = 2;
    cfg_.head_dim = 4;
    cfg_.hidden = 8;
    cfg_.vocab_size = 49152;
    cfg_.max_context = 4096;
    pool_ = std::make_unique<PagePool>(host_pages > 0 ? Tier::Device : Tier::Host, n_pages, 4, 4,
                                       /*with_storage=*/host_pages > 0);
    if (host_pages > 0) {
      host_ = std::make_unique<PagePool>(Tier::Host, host_pages, 4, 4);
      tiers_ = std::make_unique<TieredKv>(*pool_, *host_);
    }
  }
  // The hierarchy's side of StepRunner (the CPU runner's, without a model).
  void release(PageTable& t) override {
    if (tiers_ && tiers_->has(t)) tiers_->release(t);
    else t.release(*pool_);
  }
  std::string check_pages() const override { return tiers_ ? tiers_->check_invariants() : ""; }
  int64_t host_tier_pages() const override { return host_ ? host_->n_pages() : 0; }
  bool make_room(int64_t n) override {
    return tiers_ && offload_to_make_room ? tiers_->make_room(n, now_) : pool_->n_free() >= n;
  }
  int64_t reclaimable_pages() const override { return tiers_ && offload_to_make_room ? tiers_->reclaimable() : 0; }
  bool offload_to_make_room = true;  // false: the hierarchy only swaps preempted requests
  bool swap_out(PageTable& t) override { return tiers_ && tiers_->has(t) && tiers_->swap_out(t, now_); }
  int64_t swap_in_pages(const PageTable& t) const override {
    return tiers_ && tiers_->has(t) && tiers_->swapped(t) ? tiers_->swap_in_pages(t) : 0;
  }
  bool swap_in(PageTable& t) override { return !tiers_ || !tiers_->has(t) || tiers_->swap_in(t, now_); }
  const PagePool* host() const { return host_.get(); }
  const ModelConfig& config() const override { return cfg_; }
  PagePool& pages() override { return *pool_; }
  int max_batch() const override { return max_batch_; }
  int64_t max_step_tokens() const override { return 4096; }
  void set_sampled_vocab(int64_t) override {}
  void begin_request(int slot, const SamplingParams&) override { begun.push_back(slot); }
  void step(const std::vector<StepRequest>& batch, StepOutput* out, bool) override {
    std::set<int> slots;
    int64_t tokens = 0;
    out->sampled.assign(batch.size(), -1);
    int prefilling = 0;  // rows of requests in their prompt: a chunk before its last, or of several tokens
    for (const StepRequest& r : batch) prefilling += !r.sample || r.n_new > 1;
    if (prefill_alone_ && prefilling > 0) {
      EXPECT_EQ(batch.size(), 1u) << "a prompt chunk beside other rows";
    }
    max_prefilling_seen = std::max(max_prefilling_seen, prefilling);
    mixed_steps += prefilling > 0 && batch.size() > 1;
    for (size_t i = 0; i < batch.size(); ++i) {
      const StepRequest& r = batch[i];
      EXPECT_TRUE(slots.insert(r.slot).second) << "slot " << r.slot << " twice in a step";
      if (tiers_) {
        if (!tiers_->has(*r.table)) tiers_->add(*r.table, now_);
        tiers_->adopt_new_pages(*r.table, now_);
        EXPECT_FALSE(tiers_->swapped(*r.table)) << "a swapped request in a step";
      }
      rows_fed += r.n_new;
      EXPECT_LE(r.table->n_tokens() + r.n_new, r.table->capacity_tokens()) << "rows past the reserved pages";
      // The rows fed are the request's history at the table's position.
      for (int64_t k = 0; k < r.n_new; ++k) EXPECT_EQ(r.tokens[k], (*r.history)[static_cast<size_t>(r.table->n_tokens() + k)]);
      r.table->commit(r.n_new);
      tokens += r.n_new;
      if (r.sample) policies_seen.push_back(r.policy ? r.policy->str() : std::string("-"));
      if (r.sample) {
        EXPECT_EQ(r.table->n_tokens(), static_cast<int64_t>(r.history->size())) << "sampled before the last row";
        out->sampled[i] = script_[r.history->size() % script_.size()];
      }
    }
    ++now_;
    step_sizes.push_back(static_cast<int>(batch.size()));
    step_tokens.push_back(tokens);
    if (clock_) clock_->t = clock_->t + 1.0;  // a step takes a second
  }
  PageCounts take_page_counts() override { return {}; }
  bool prefill_alone() const override { return prefill_alone_; }
  bool prefill_alone_ = false;
  void set_policy(const PolicySpec& spec) override { policy_ = spec; }
  const PolicySpec& policy() const override { return policy_; }
  double fit_key_basis(const PageTable&, int64_t, int, bool) override { return 0.0; }
  void capture_queries(bool) override {}

  std::vector<int> step_sizes;
  std::vector<std::string> policies_seen;  // per sampled row: its own policy's spelling, "-" for the runner's
  std::vector<int64_t> step_tokens;
  std::vector<int> begun;
  int64_t rows_fed = 0;  // tokens fed over all steps (a recompute feeds a request's again)
  int max_prefilling_seen = 0;
  int mixed_steps = 0;  // steps with prompt rows beside other rows

 private:
  std::unique_ptr<PagePool> host_;
  std::unique_ptr<TieredKv> tiers_;
  int64_t now_ = 0;
  PolicySpec policy_;
  ModelConfig cfg_;
  std::unique_ptr<PagePool> pool_;
  std::vector<int32_t> script_;
  TestClock* clock_;
  int max_batch_;
};

class SchedulerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tok_ = Tokenizer::from_hf_files(test::data_dir() + "/tokenizer/smollm2/tokenizer.json", "");
    script_ = tok_->encode(" one two three four five six seven eight nine ten eleven twelve", false);
    ASSERT_GE(script_.size(), 12u);
  }
  std::unique_ptr<ScriptRunner> runner(int64_t n_pages, int max_batch = 64) {
    return std::make_unique<ScriptRunner>(n_pages, script_, &clock_, max_batch);
  }
  std::unique_ptr<ContinuousScheduler> sched(ScriptRunner& r, SchedulerOptions o = {}) {
    if (o.max_num_batched_tokens > r.max_step_tokens()) o.max_num_batched_tokens = r.max_step_tokens();
    clock_ptr_ = std::shared_ptr<Clock>(&clock_, [](Clock*) {});
    return std::make_unique<ContinuousScheduler>(r, *tok_, 4096, o, clock_ptr_);
  }
  // What the script gives a prompt of n tokens, max_tokens long, alone and uninterrupted.
  std::vector<int32_t> expected(size_t n_prompt, int64_t max_tokens) const {
    std::vector<int32_t> out;
    for (int64_t i = 0; i < max_tokens; ++i) out.push_back(script_[(n_prompt + static_cast<size_t>(i)) % script_.size()]);
    return out;
  }
  static RequestParams req(size_t n_prompt, int64_t max_tokens, int32_t first = 7) {
    RequestParams p;
    for (size_t i = 0; i < n_prompt; ++i) p.prompt.push_back(first + static_cast<int32_t>(i));
    p.options.max_tokens = max_tokens;
    p.options.ignore_eos = true;
    return p;
  }
  struct Collected {
    std::vector<int32_t> tokens;
    std::string text, finish_reason;
    int n_events = 0, n_finished = 0;
  };
  RequestSink collect(Collected* c) {
    return [c](const RequestEvent& e) {
      c->tokens.insert(c->tokens.end(), e.tokens.begin(), e.tokens.end());
      c->text += e.text;
      ++c->n_events;
      if (e.finished) {
        ++c->n_finished;
        c->finish_reason = e.finish_reason;
      }
    };
  }
  static void run_to_idle(ContinuousScheduler& s, int max_steps = 10000) {
    for (int i = 0; i < max_steps && !s.idle(); ++i) s.step();
    ASSERT_TRUE(s.idle()) << "not idle after " << max_steps << " steps";
  }
  static void expect_pool_clean(ScriptRunner& r, const ContinuousScheduler& s) {
    EXPECT_EQ(r.pages().check_invariants(), "");
    EXPECT_EQ(r.pages().n_used(), 0);
    const SchedulerStats st = s.stats();
    EXPECT_EQ(st.kv.n_used, 0);
    EXPECT_EQ(st.kv.n_free, st.kv.n_total);
    EXPECT_EQ(st.kv_check, "");
  }

  TestClock clock_;
  std::shared_ptr<Clock> clock_ptr_;
  std::unique_ptr<Tokenizer> tok_;
  std::vector<int32_t> script_;
};

TEST_F(SchedulerTest, ManyRequestsEachGetTheirOwnTokens) {
  auto r = runner(10000);
  auto s = sched(*r);
  std::vector<Collected> got(20);
  for (size_t i = 0; i < got.size(); ++i) {
    const SubmitResult sub = s->submit(req(3 + i, static_cast<int64_t>(5 + i % 7)), collect(&got[i]));
    ASSERT_EQ(sub.status, SubmitStatus::Accepted) << sub.error;
  }
  run_to_idle(*s);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].tokens, expected(3 + i, static_cast<int64_t>(5 + i % 7))) << "request " << i;
    EXPECT_EQ(got[i].finish_reason, "length");
    EXPECT_EQ(got[i].n_finished, 1);
    EXPECT_EQ(got[i].text, tok_->decode(got[i].tokens, true));
  }
  EXPECT_EQ(*std::max_element(r->step_sizes.begin(), r->step_sizes.end()), 20) << "all should run together";
  const SchedulerStats st = s->stats();
  EXPECT_EQ(st.n_finished_length, 20u);
  EXPECT_EQ(st.n_running, 0);
  EXPECT_EQ(st.n_waiting, 0);
  expect_pool_clean(*r, *s);
}

TEST_F(SchedulerTest, MaxNumSeqsAndTheTokenBudgetHold) {
  auto r = runner(10000);
  SchedulerOptions o;
  o.max_num_seqs = 3;
  o.max_num_batched_tokens = 10;
  auto s = sched(*r, o);
  std::vector<Collected> got(7);
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(s->submit(req(25, 6), collect(&got[i])).status, SubmitStatus::Accepted);
  run_to_idle(*s);
  for (const int n : r->step_sizes) EXPECT_LE(n, 3);
  for (const int64_t n : r->step_tokens) EXPECT_LE(n, 10);
  for (const Collected& c : got) EXPECT_EQ(c.tokens, expected(25, 6));
  // Prompts of 25 tokens under a budget of 10 are prefilled in chunks, beside other requests' decode rows.
  EXPECT_GT(std::count(r->step_sizes.begin(), r->step_sizes.end(), 3), 0);
  expect_pool_clean(*r, *s);
}

// A runner whose prompt chunks run alone (the CUDA runner with a host tier): every step with a
// prompt chunk carries that chunk only, prefill and decode steps alternate (no request waits for
// the others' prompts to finish decoding), and every request still gets its own tokens. Without
// it the same load mixes prompt chunks with decode rows.
TEST_F(SchedulerTest, PromptChunksRunAloneWhenTheRunnerSaysSo) {
  for (const bool alone : {true, false}) {
    auto r = runner(10000);
    r->prefill_alone_ = alone;
    SchedulerOptions o;
    o.max_num_batched_tokens = 16;
    o.max_num_seqs = 8;
    auto s = sched(*r, o);
    std::vector<Collected> got(5);
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_EQ(s->submit(req(20 + 7 * i, 6), collect(&got[i])).status, SubmitStatus::Accepted);
    s->step();  // request 0's first chunk (16 of its 20 tokens)
    s->step();  // (alone: no decode row yet, so the prefill phase again) its last 4, its first token
    ASSERT_EQ(got[0].tokens.size(), 1u);
    run_to_idle(*s);
    for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i].tokens, expected(20 + 7 * i, 6)) << "request " << i;
    if (alone) {
      EXPECT_EQ(r->mixed_steps, 0);
      EXPECT_EQ(r->max_prefilling_seen, 1);
    } else {
      EXPECT_GT(r->mixed_steps, 0) << "the load should mix prompt chunks and decode rows without the flag";
    }
    expect_pool_clean(*r, *s);
  }
}

TEST_F(SchedulerTest, DecodeRowsGoFirstAndPrefillWaitsForTheBudget) {
  auto r = runner(10000);
  SchedulerOptions o;
  o.max_num_batched_tokens = 8;
  o.max_num_seqs = 4;
  auto s = sched(*r, o);
  Collected a, b;
  ASSERT_EQ(s->submit(req(4, 20), collect(&a)).status, SubmitStatus::Accepted);
  s->step();  // a's prefill, first token
  ASSERT_EQ(a.tokens.size(), 1u);
  ASSERT_EQ(s->submit(req(30, 2), collect(&b)).status, SubmitStatus::Accepted);
  for (int i = 0; i < 4; ++i) s->step();  // b's 30 tokens take four steps of 7 beside a's row, then 2
  // a decoded a token in each of those steps: its decode row was never pushed out by b's prefill.
  EXPECT_EQ(a.tokens.size(), 5u);
  EXPECT_TRUE(b.tokens.empty());
  s->step();
  EXPECT_EQ(b.tokens.size(), 1u);
  run_to_idle(*s);
  EXPECT_EQ(a.tokens, expected(4, 20));
  EXPECT_EQ(b.tokens, expected(30, 2));
  expect_pool_clean(*r, *s);
}

TEST_F(SchedulerTest, PreemptionResumesWithTheSameTokens) {
  // Pages of 4 tokens, 2 layers x 2 heads = 4 pages per block. 8 requests of 6 + 30 tokens want
  // 9 blocks each (288 pages); the pool holds 100.
  auto r = runner(100);
  auto s = sched(*r);
  std::vector<Collected> got(8);
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(s->submit(req(6, 30, static_cast<int32_t>(100 * i)), collect(&got[i])).status, SubmitStatus::Accepted);
  run_to_idle(*s);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].tokens, expected(6, 30)) << "request " << i;
    EXPECT_EQ(got[i].text, tok_->decode(got[i].tokens, true)) << "text lost or doubled across a preemption";
    EXPECT_EQ(got[i].finish_reason, "length");
  }
  const SchedulerStats st = s->stats();
  EXPECT_GT(st.n_preemptions, 0u);
  EXPECT_EQ(st.prompt_tokens, 8u * 6u) << "a recompute is not new prompt tokens";
  EXPECT_EQ(st.generation_tokens, 8u * 30u);
  expect_pool_clean(*r, *s);
}

// With a KV hierarchy (a host tier of 1,000 pages behind the 100-page pool), the same 8 requests
// (288 pages in all) run without a preemption: the running requests' cold pages go to the host tier
// to make room, and every token is fed once.
TEST_F(SchedulerTest, AHostTierMakesRoomWithoutPreemption) {
  ScriptRunner r(100, script_, &clock_, 64, /*host_pages=*/1000);
  auto s = sched(r);
  std::vector<Collected> got(8);
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(s->submit(req(6, 30, static_cast<int32_t>(100 * i)), collect(&got[i])).status, SubmitStatus::Accepted);
  run_to_idle(*s);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i].tokens, expected(6, 30)) << "request " << i;
  EXPECT_EQ(s->stats().n_preemptions, 0u);
  EXPECT_EQ(r.rows_fed, 8 * (6 + 30 - 1));
  EXPECT_EQ(r.host()->n_used(), 0);
  expect_pool_clean(r, *s);
}

// The preemption scenario above with a hierarchy that only swaps (no offload to make room): the
// preempted request goes to the host tier whole and resumes where it was — no token is fed twice,
// the output is the uninterrupted one.
TEST_F(SchedulerTest, PreemptionSwapsToTheHostTierAndResumesWithoutRecompute) {
  ScriptRunner r(100, script_, &clock_, 64, /*host_pages=*/1000);
  r.offload_to_make_room = false;
  auto s = sched(r);
  std::vector<Collected> got(8);
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(s->submit(req(6, 30, static_cast<int32_t>(100 * i)), collect(&got[i])).status, SubmitStatus::Accepted);
  run_to_idle(*s);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].tokens, expected(6, 30)) << "request " << i;
    EXPECT_EQ(got[i].text, tok_->decode(got[i].tokens, true)) << "text lost or doubled across a swap";
  }
  const SchedulerStats st = s->stats();
  EXPECT_GT(st.n_swapped, 0u);
  EXPECT_EQ(st.n_swapped, st.n_preemptions);
  EXPECT_EQ(r.rows_fed, 8 * (6 + 30 - 1)) << "a swapped request was recomputed";
  EXPECT_EQ(st.prompt_tokens, 8u * 6u);
  EXPECT_EQ(r.host()->n_used(), 0);
  expect_pool_clean(r, *s);
}

// A request's own sparse policy (GenerateOptions::sparse_policy) reaches the runner with its
// rows, checked at submit against the runner's (PolicySpec::as_request_policy).
TEST_F(SchedulerTest, RequestPoliciesAreCheckedAndReachTheRunner) {
  auto r = runner(256);
  auto s = sched(*r, SchedulerOptions{});
  auto with = [](const char* policy) {
    RequestParams p = req(3, 1);
    p.options.sparse_policy = policy;
    return p;
  };
  // A dense runner keeps no page data: no request may select.
  const SubmitResult on_dense = s->submit(with("coverage:0.9"), {});
  EXPECT_EQ(on_dense.status, SubmitStatus::Invalid);
  EXPECT_NE(on_dense.error.find("dense"), std::string::npos) << on_dense.error;
  r->set_policy(PolicySpec::parse("coverage:0.99@sketch4"));
  for (const char* bad : {"coverage:0.9@minmax", "coverage:0.9/2", "solohead:0.9", "nonsense", "coverage:1.5"}) {
    const SubmitResult res = s->submit(with(bad), {});
    EXPECT_EQ(res.status, SubmitStatus::Invalid) << bad;
    EXPECT_FALSE(res.error.empty()) << bad;
  }
  EXPECT_EQ(s->stats().n_submitted, 0u) << "a refused request was queued";
  // Accepted: another rule, dense, the runner's own spelled out, and none.
  for (const char* ok : {"sinkwindow:4", "dense", "coverage:0.99", "topk:3", ""})
    EXPECT_EQ(s->submit(with(ok), {}).status, SubmitStatus::Accepted) << ok;
  run_to_idle(*s);
  std::vector<std::string> seen = r->policies_seen;
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, (std::vector<std::string>{"-", "-", "dense", "sinkwindow:4", "topk:3@sketch4"}))
      << "the runner's own policy and no policy both reach it as null";
  expect_pool_clean(*r, *s);
}

TEST_F(SchedulerTest, RefusesWhatCanNeverRunAndBoundsTheQueue) {
  auto r = runner(16);  // 4 blocks of 4 tokens
  SchedulerOptions o;
  o.max_waiting = 2;
  o.max_model_len = 100;
  auto s = sched(*r, o);
  EXPECT_EQ(s->submit(req(0, 1), {}).status, SubmitStatus::Invalid);
  EXPECT_EQ(s->submit(req(100, 1), {}).status, SubmitStatus::Invalid) << "prompt of max_model_len";
  EXPECT_EQ(s->submit(req(16, 1), {}).status, SubmitStatus::Invalid) << "16 + 1 tokens need 5 blocks of 4";
  RequestParams bad_id = req(3, 1);
  bad_id.prompt[1] = 49152;
  EXPECT_EQ(s->submit(bad_id, {}).status, SubmitStatus::Invalid);
  bad_id.prompt[1] = -1;
  EXPECT_EQ(s->submit(bad_id, {}).status, SubmitStatus::Invalid);
  RequestParams bad_t = req(3, 1);
  bad_t.options.sampling.temperature = -1.0f;
  const SubmitResult bt = s->submit(bad_t, {});
  EXPECT_EQ(bt.status, SubmitStatus::Invalid);
  EXPECT_FALSE(bt.error.empty());
  EXPECT_EQ(s->submit(req(3, -1), {}).status, SubmitStatus::Invalid);
  Collected a, b;
  EXPECT_EQ(s->submit(req(3, 2), collect(&a)).status, SubmitStatus::Accepted);
  EXPECT_EQ(s->submit(req(3, 2), collect(&b)).status, SubmitStatus::Accepted);
  EXPECT_EQ(s->submit(req(3, 2), {}).status, SubmitStatus::QueueFull);
  EXPECT_EQ(s->stats().n_rejected_full, 1u);
  run_to_idle(*s);
  EXPECT_EQ(a.tokens, expected(3, 2));
  EXPECT_EQ(b.tokens, expected(3, 2));
  expect_pool_clean(*r, *s);
}

TEST_F(SchedulerTest, CancelReturnsPagesInTheSameStep) {
  auto r = runner(1000);
  auto s = sched(*r);
  Collected a, b, w;
  const uint64_t ia = s->submit(req(10, 100), collect(&a)).id;
  const uint64_t ib = s->submit(req(10, 100), collect(&b)).id;
  s->step();
  s->step();
  const int64_t used_two = r->pages().n_used();
  ASSERT_GT(used_two, 0);
  s->cancel(ia);
  s->step();
  EXPECT_EQ(a.finish_reason, "abort");
  EXPECT_EQ(a.n_finished, 1);
  EXPECT_LT(r->pages().n_used(), used_two) << "the cancelled request's pages are still held";
  // A waiting request cancelled before it ever ran.
  SchedulerOptions o1;
  o1.max_num_seqs = 1;
  auto r1 = runner(1000);
  auto s1 = sched(*r1, o1);
  s1->submit(req(5, 50), {});
  const uint64_t iw = s1->submit(req(5, 50), collect(&w)).id;
  s1->step();
  s1->cancel(iw);
  s1->cancel(424242);  // unknown ids are ignored
  s1->step();
  EXPECT_EQ(w.finish_reason, "abort");
  EXPECT_TRUE(w.tokens.empty());
  s->cancel(ib);
  run_to_idle(*s);
  s1->stop(false);
  expect_pool_clean(*r, *s);
  expect_pool_clean(*r1, *s1);
  EXPECT_EQ(b.finish_reason, "abort");
}

TEST_F(SchedulerTest, StopStringsAndEos) {
  auto r = runner(1000);
  auto s = sched(*r);
  // The script's text from position 3 on: find a stop string two tokens in.
  const std::vector<int32_t> first = expected(3, 6);
  const std::string t2 = tok_->decode({first.begin(), first.begin() + 3}, true);
  const std::string stop = t2.substr(t2.size() - 3);  // the end of the third token's text
  RequestParams p = req(3, 6);
  p.options.stop = {stop};
  Collected c;
  s->submit(p, collect(&c));
  // eos: a script whose position 5 is the tokenizer's first stop id.
  run_to_idle(*s);
  EXPECT_EQ(c.finish_reason, "stop");
  EXPECT_EQ(c.text, t2.substr(0, t2.size() - 3)) << "text up to the stop string, without it";
  EXPECT_EQ(c.tokens.size(), 3u);

  std::vector<int32_t> with_eos = script_;
  with_eos[5] = tok_->stop_ids().at(0);
  ScriptRunner re(1000, with_eos, &clock_);
  auto se = sched(re);
  Collected e1, e2;
  RequestParams q = req(3, 10);
  q.options.ignore_eos = false;
  se->submit(q, collect(&e1));
  q.options.ignore_eos = true;
  se->submit(q, collect(&e2));
  run_to_idle(*se);
  EXPECT_EQ(e1.finish_reason, "stop");
  EXPECT_EQ(e1.tokens.size(), 2u) << "positions 3 and 4, then eos at 5 (not included)";
  EXPECT_EQ(e2.finish_reason, "length");
  EXPECT_EQ(e2.tokens.size(), 10u);
  expect_pool_clean(re, *se);
}

TEST_F(SchedulerTest, MaxModelLenEndsWithLengthAndZeroMaxTokensRunsThePromptOnly) {
  auto r = runner(1000);
  SchedulerOptions o;
  o.max_model_len = 20;
  auto s = sched(*r, o);
  Collected a, z;
  s->submit(req(15, 100), collect(&a));
  s->submit(req(4, 0), collect(&z));
  run_to_idle(*s);
  EXPECT_EQ(a.finish_reason, "length");
  EXPECT_EQ(a.tokens.size(), 5u) << "15 + 5 = max_model_len";
  EXPECT_EQ(z.finish_reason, "length");
  EXPECT_TRUE(z.tokens.empty());
  EXPECT_EQ(z.n_finished, 1);
  expect_pool_clean(*r, *s);
}

TEST_F(SchedulerTest, TimingMetricsFollowTheClock) {
  auto r = runner(1000);
  auto s = sched(*r);
  clock_.t = 100.0;
  Collected a;
  s->submit(req(5, 4), collect(&a));
  clock_.t = 102.0;  // waited 2 s before the first step
  run_to_idle(*s);   // 4 steps of 1 s: first token at 103, last at 106
  const SchedulerStats st = s->stats();
  ASSERT_EQ(st.ttft.count, 1u);
  EXPECT_DOUBLE_EQ(st.ttft.sum, 3.0);
  ASSERT_EQ(st.tpot.count, 1u);
  EXPECT_DOUBLE_EQ(st.tpot.sum, 1.0);
  ASSERT_EQ(st.e2e.count, 1u);
  EXPECT_DOUBLE_EQ(st.e2e.sum, 6.0);
  // Cumulative buckets: ttft 3 s is in "le 5" and above, not in "le 2.5".
  for (size_t i = 0; i < st.ttft.bounds.size(); ++i) EXPECT_EQ(st.ttft.counts[i], st.ttft.bounds[i] >= 3.0 ? 1u : 0u);
  EXPECT_EQ(st.n_steps, 4u);
}

TEST_F(SchedulerTest, TheLoopThreadServesSubmittersAndDrains) {
  auto r = runner(4000);
  auto s = sched(*r);
  s->start();
  std::vector<Collected> got(32);
  std::atomic<int> finished{0};
  std::vector<std::thread> clients;
  std::mutex mu;
  for (size_t i = 0; i < got.size(); ++i)
    clients.emplace_back([&, i] {
      const RequestSink sink = [&, i](const RequestEvent& e) {
        std::lock_guard lk(mu);
        got[i].tokens.insert(got[i].tokens.end(), e.tokens.begin(), e.tokens.end());
        if (e.finished) {
          got[i].finish_reason = e.finish_reason;
          ++finished;
        }
      };
      EXPECT_EQ(s->submit(req(2 + i % 5, 8), sink).status, SubmitStatus::Accepted);
    });
  for (auto& t : clients) t.join();
  s->stop(/*drain=*/true);
  EXPECT_EQ(finished.load(), 32);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i].tokens, expected(2 + i % 5, 8)) << i;
  EXPECT_EQ(s->submit(req(3, 1), {}).status, SubmitStatus::ShuttingDown);
  expect_pool_clean(*r, *s);
}

TEST_F(SchedulerTest, StopWithoutDrainAbortsEverything) {
  auto r = runner(4000);
  SchedulerOptions o;
  o.max_num_seqs = 2;
  auto s = sched(*r, o);
  std::vector<Collected> got(5);
  for (auto& c : got) s->submit(req(4, 1000), collect(&c));
  s->step();
  s->step();
  s->stop(/*drain=*/false);
  for (const Collected& c : got) {
    EXPECT_EQ(c.finish_reason, "abort");
    EXPECT_EQ(c.n_finished, 1);
  }
  EXPECT_EQ(s->stats().n_finished_abort, 5u);
  expect_pool_clean(*r, *s);
}

TEST_F(SchedulerTest, OptionsAreChecked) {
  auto r = runner(100, /*max_batch=*/4);
  SchedulerOptions o;
  o.max_num_seqs = 0;
  EXPECT_THROW(sched(*r, o), Error);
  o = {};
  o.max_model_len = 5000;  // past the engine's 4096
  EXPECT_THROW(sched(*r, o), Error);
  o = {};
  o.max_num_batched_tokens = 2;
  o.max_num_seqs = 3;
  EXPECT_THROW(sched(*r, o), Error) << "a step must hold every running request's decode row";
  o = {};
  o.max_num_seqs = 64;  // capped by the runner's 4
  auto s = sched(*r, o);
  std::vector<Collected> got(6);
  for (auto& c : got) s->submit(req(2, 3), collect(&c));
  run_to_idle(*s);
  for (const int n : r->step_sizes) EXPECT_LE(n, 4);
  for (const int slot : r->begun) EXPECT_LT(slot, 4);
}

}  // namespace
}  // namespace dhs
