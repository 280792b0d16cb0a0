// Speculative decoding in ContinuousScheduler (GenerateOptions::speculative_k; the cycle of
// draft rows, one verify row, acceptance and rollback) over a scripted StepRunner that verifies.
//
// What is tested: greedy output equals decoding without speculation (k 1..7, drafts always right,
// sometimes wrong, always wrong, max_tokens around k, several prompt lengths), the spec counters;
// the rows the runner is given (a verify feeds the request's history from the cycle's start: the
// cycle's first token and its drafts, k_cycle + 1 <= k + 1 rows, not sampled, on the request's
// own policy; drafts one token on the draft's sinkwindow policy; the table never past what the
// request may still feed); eos and stop strings reached by an accepted draft; speculative and
// plain requests in one scheduler; the step's token budget (a cycle fits a step; a verify that does
// not fit beside older requests' rows is not held back for their whole life); preemption in the
// middle of a cycle; what submit refuses; sampled requests on peaked logits; the max_model_len bound.
//
// Why a fake is enough: the scheduler only ever sees tokens and logits. The fake's verifier
// ("target") token is a function of the position only, as in test_scheduler's ScriptRunner, so a
// request's tokens are known whatever it shares a step with; its draft token is the target except
// at positions the test chooses. Its verify rows put a clear maximum on the target token of each
// row's position, which is what a real verifier gives when its rows equal decoding them one at a
// time (test_speculative checks that of the CPU runner). Any difference from the plain run is then
// the scheduler's acceptance, emission, truncation or bookkeeping.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <atomic>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "engine/continuous_scheduler.h"
#include "test_clock.h"
#include "test_paths.h"
#include "tokenizer/tokenizer.h"

namespace dhs {
namespace {

using test::TestClock;

// Target token at position p: script[p % size]; the draft's: the target, or target + 1 where
// draft_wrong(p). Rows on a sinkwindow policy are the draft's; verify rows get every row's logits.
class SpecRunner final : public StepRunner {
 public:
  SpecRunner(int64_t n_pages, std::vector<int32_t> script, bool verifies = true, int64_t vocab = 49152)
      : script_(std::move(script)), verifies_(verifies) {
    cfg_.n_layers = 2;
    cfg_.n_heads_kv = 2;
    cfg_.n_heads_q = 2;
    cfg_.head_dim = 4;
    cfg_.hidden = 8;
    cfg_.vocab_size = vocab;  // 49152: the test tokenizer's (SmolLM2)
    cfg_.max_context = 4096;
    pool_ = std::make_unique<PagePool>(Tier::Host, n_pages, 4, 4, /*with_storage=*/false);
  }

  int32_t target(int64_t pos) const { return script_[static_cast<size_t>(pos) % script_.size()]; }
  int32_t draft(int64_t pos) const { return draft_wrong(pos) ? target(pos) + 1 : target(pos); }

  // Set by tests.
  std::function<bool(int64_t)> draft_wrong = [](int64_t) { return false; };
  int64_t max_table = std::numeric_limits<int64_t>::max();  // tokens a table may ever hold
  int64_t max_verify = 17;                                  // rows a verify may have
  // Step time (speculative_k auto): each step advances `clock` by w + m rows + p kv, kv the
  // context tokens its rows attend over (a draft row: 16 at most; a verify: once for all its
  // rows when reads_once).
  TestClock* clock = nullptr;
  double w = 0, m = 0, p = 0;
  double p_prompt = -1;  // per token pair of a prompt chunk's rows (< 0: p), as a compute-bound prefill
  double jitter = 0;     // each step's time times 1 + jitter u, u uniform in [-1, 1] (a fixed sequence)
  uint64_t jitter_state = 12345;
  bool reads_once = false;
  bool verify_reads_kv_once() const override { return reads_once; }

  // What the runner saw.
  int64_t n_draft_rows = 0, n_verifies = 0, n_full_verifies = 0, n_truncates = 0;
  int64_t abandoned_cycles = 0;  // drafts that never reached a verify (the request was preempted)
  int64_t mixed_steps = 0;       // steps with a verify beside other rows
  int64_t most_step_tokens = 0;  // the largest step's tokens
  std::set<std::string> draft_policies, verify_policies;  // spelling, "-" for none
  std::set<int32_t> verified_drafts;                      // draft tokens that verify rows carried
  int max_rows = 1 << 20;                                 // max_verify_rows() when it verifies
  bool ids_mode = false;        // answer verifies that ask for ids only with ids, as the CUDA runner
  int64_t n_id_verifies = 0;    // steps answered so

  const ModelConfig& config() const override { return cfg_; }
  PagePool& pages() override { return *pool_; }
  int max_batch() const override { return 64; }
  int64_t max_step_tokens() const override { return 4096; }
  void set_sampled_vocab(int64_t) override {}
  void begin_request(int, const SamplingParams&) override {}
  int max_verify_rows() const override { return verifies_ ? max_rows : 0; }
  int max_seeds = 1 << 16;  // max_draft_seeds()
  int max_draft_seeds() const override { return max_seeds; }
  void truncate(PageTable& table, int64_t n_tokens) override {
    ++n_truncates;
    EXPECT_LE(n_tokens, table.n_tokens()) << "truncate past the end";
    table.truncate(pages(), n_tokens);
  }
  PageCounts take_page_counts() override { return {}; }
  void set_policy(const PolicySpec& spec) override { policy_ = spec; }
  const PolicySpec& policy() const override { return policy_; }
  double fit_key_basis(const PageTable&, int64_t, int, bool) override { return 0.0; }
  void capture_queries(bool) override {}

  void step(const std::vector<StepRequest>& batch, StepOutput* out, bool want_logits) override {
    const size_t V = static_cast<size_t>(cfg_.vocab_size);
    int64_t verify_rows = 0;
    for (const StepRequest& r : batch) verify_rows += r.verify ? r.n_new : 0;
    out->sampled.assign(batch.size(), -1);
    out->verify_row.assign(batch.size(), -1);
    out->logits.assign(want_logits ? batch.size() * V : 0, 0.0f);
    out->verify_logits.assign(static_cast<size_t>(verify_rows) * V, 0.0f);
    out->verify_ids.clear();
    if (verify_rows > 0 && batch.size() > 1) ++mixed_steps;
    if (clock != nullptr) {
      double rows = 0, kv = 0, prompt_pairs = 0;
      for (const StepRequest& r : batch) {
        const double n = static_cast<double>(r.n_new), before = static_cast<double>(r.table->n_tokens());
        rows += n;
        if (is_draft(r)) kv += std::min(before + 1, 16.0);
        else if (r.verify && reads_once) kv += before + n;
        else if (n > 1 && p_prompt >= 0) prompt_pairs += n * before + n * (n + 1) / 2;
        else kv += n * before + n * (n + 1) / 2;
      }
      jitter_state = jitter_state * 6364136223846793005ull + 1442695040888963407ull;
      const double u = static_cast<double>(jitter_state >> 11) / static_cast<double>(1ull << 53) * 2.0 - 1.0;
      clock->t = clock->t + (w + m * rows + p * kv + std::max(0.0, p_prompt) * prompt_pairs) * (1.0 + jitter * u);
    }
    int64_t tokens = 0;
    for (const StepRequest& r : batch) tokens += r.n_new;
    most_step_tokens = std::max(most_step_tokens, tokens);
    std::set<int> slots;
    int64_t next_verify_row = 0;
    for (size_t i = 0; i < batch.size(); ++i) {
      const StepRequest& r = batch[i];
      EXPECT_TRUE(slots.insert(r.slot).second) << "slot " << r.slot << " twice in a step";
      check_tokens(r);
      int32_t next = -1;  // the token after this row's last, where it has one
      if (r.verify) {
        on_verify(r, out->verify_logits.data() + static_cast<size_t>(next_verify_row) * V);
        out->verify_row[i] = next_verify_row;
        next_verify_row += r.n_new;
      } else if (is_draft(r)) {
        next = on_draft(r);
      } else {
        on_plain(r);
        next = target(r.table->n_tokens() + r.n_new);
      }
      r.table->commit(r.n_new);
      if (r.sample) {
        EXPECT_EQ(r.table->n_tokens(), static_cast<int64_t>(r.history->size())) << "sampled before the last row";
        out->sampled[i] = next;
      }
      if (want_logits && next >= 0) out->logits[i * V + static_cast<size_t>(next)] = kPeak;
    }
    // Ids for the verify rows instead of their logits, where every verify asked for that (the
    // rows' argmax: their peak), and the logits poisoned so that reading them fails the test.
    bool ids_only = ids_mode && verify_rows > 0 && !want_logits;
    for (const StepRequest& r : batch) ids_only = ids_only && (!r.verify || r.verify_ids);
    if (ids_only) {
      ++n_id_verifies;
      for (int64_t j = 0; j < verify_rows; ++j) {
        const float* row = out->verify_logits.data() + static_cast<size_t>(j) * V;
        out->verify_ids.push_back(static_cast<int32_t>(std::max_element(row, row + V) - row));
      }
      std::fill(out->verify_logits.begin(), out->verify_logits.end(), 0.0f);
    }
  }

 private:
  static constexpr float kPeak = 30.0f;
  struct Cycle {
    int64_t base = -1;            // the table's tokens when its first draft ran
    std::vector<int32_t> inputs;  // what its draft rows fed
    int32_t last_draft = -1;      // what the last one gave
  };

  static bool is_draft(const StepRequest& r) { return r.policy && r.policy->rule == SelectRule::SinkWindow; }

  void check_tokens(const StepRequest& r) const {
    const int64_t at = r.table->n_tokens();
    EXPECT_LE(at + r.n_new, r.table->capacity_tokens()) << "rows past the reserved pages";
    EXPECT_LE(at + r.n_new, max_table) << "the table takes a token the request may not feed";
    for (int64_t k = 0; k < r.n_new; ++k) EXPECT_EQ(r.tokens[k], (*r.history)[static_cast<size_t>(at + k)]) << k;
  }

  int32_t on_draft(const StepRequest& r) {
    ++n_draft_rows;
    draft_policies.insert(r.policy->str());
    EXPECT_EQ(r.n_new, 1) << "a draft row is one decode token";
    Cycle& c = cycles_[r.history];
    const int64_t at = r.table->n_tokens();
    if (c.inputs.empty()) c.base = at;
    EXPECT_EQ(at, c.base + static_cast<int64_t>(c.inputs.size())) << "a draft row not after the previous one";
    c.inputs.push_back(r.tokens[0]);
    c.last_draft = draft(at + 1);
    return c.last_draft;
  }

  void on_verify(const StepRequest& r, float* rows) {
    ++n_verifies;
    verify_policies.insert(r.policy ? r.policy->str() : std::string("-"));
    EXPECT_FALSE(r.sample) << "a verify row is not sampled by the runner";
    EXPECT_GE(r.n_new, 1) << "an empty verify";
    EXPECT_LE(r.n_new, max_verify) << "more verify rows than speculative_k + 1";
    Cycle& c = cycles_[r.history];
    const int64_t at = r.table->n_tokens();
    EXPECT_EQ(at, c.base) << "the verify does not start where the cycle's drafts did";
    // All the cycle's drafts + 1 rows, or fewer when the step's budget left less (the drafts past
    // it are dropped unverified): the rows are a prefix of what the drafts fed, then the last draft.
    EXPECT_LE(r.n_new, static_cast<int64_t>(c.inputs.size()) + 1) << "verify rows > the cycle's drafts + 1";
    if (r.n_new == static_cast<int64_t>(c.inputs.size()) + 1) ++n_full_verifies;
    for (size_t j = 0; j < c.inputs.size() && static_cast<int64_t>(j) < r.n_new; ++j)
      EXPECT_EQ(r.tokens[j], c.inputs[j]) << "verify row " << j << " is not what the drafts fed";
    if (r.n_new == static_cast<int64_t>(c.inputs.size()) + 1) {
      EXPECT_EQ(r.tokens[r.n_new - 1], c.last_draft) << "the verify's last row is not the last draft";
    }
    for (int64_t j = 1; j < r.n_new; ++j) verified_drafts.insert(r.tokens[j]);
    // Row j predicts position at + j + 1: what decoding after history[..at + j] gives.
    const size_t V = static_cast<size_t>(cfg_.vocab_size);
    for (int64_t j = 0; j < r.n_new; ++j) rows[static_cast<size_t>(j) * V + static_cast<size_t>(target(at + j + 1))] = kPeak;
    c = Cycle{};
  }

  void on_plain(const StepRequest& r) {
    Cycle& c = cycles_[r.history];
    if (!c.inputs.empty()) ++abandoned_cycles;
    c = Cycle{};
  }

  PolicySpec policy_;
  ModelConfig cfg_;
  std::unique_ptr<PagePool> pool_;
  std::vector<int32_t> script_;
  bool verifies_;
  std::map<const std::vector<int32_t>*, Cycle> cycles_;
};

struct Outcome {
  std::vector<int32_t> tokens;
  std::string text, finish_reason;
  int n_finished = 0;
  int64_t verifies = 0, drafted = 0, accepted = 0;  // the last event's counters
};

using Wrong = std::function<bool(int64_t)>;
const Wrong kNeverWrong = [](int64_t) { return false; };
const Wrong kEveryThird = [](int64_t p) { return p % 3 == 0; };
const Wrong kAlwaysWrong = [](int64_t) { return true; };

class SpeculativeScheduler : public ::testing::Test {
 protected:
  void SetUp() override {
    tok_ = Tokenizer::from_hf_files(test::data_dir() + "/tokenizer/smollm2/tokenizer.json", "");
    script_ = tok_->encode(" one two three four five six seven eight nine ten eleven twelve", false);
    ASSERT_GE(script_.size(), 12u);
    clock_ptr_ = std::shared_ptr<Clock>(&clock_, [](Clock*) {});
  }
  std::unique_ptr<SpecRunner> runner(int64_t n_pages = 10000, const Wrong& wrong = kNeverWrong,
                                     std::vector<int32_t> script = {}) {
    auto r = std::make_unique<SpecRunner>(n_pages, script.empty() ? script_ : std::move(script));
    r->draft_wrong = wrong;
    return r;
  }
  std::unique_ptr<ContinuousScheduler> sched(SpecRunner& r, const SchedulerOptions& o = {}) {
    return std::make_unique<ContinuousScheduler>(r, *tok_, 4096, o, clock_ptr_);
  }
  static RequestParams req(size_t n_prompt, int64_t max_tokens, int k, int32_t first = 7) {
    RequestParams p;
    for (size_t i = 0; i < n_prompt; ++i) p.prompt.push_back(first + static_cast<int32_t>(i));
    p.options.max_tokens = max_tokens;
    p.options.ignore_eos = true;
    p.options.speculative_k = k;
    p.options.draft_policy = "sinkwindow:4";
    return p;
  }
  static RequestSink collect(Outcome* c) {
    return [c](const RequestEvent& e) {
      c->tokens.insert(c->tokens.end(), e.tokens.begin(), e.tokens.end());
      c->text += e.text;
      c->verifies = e.spec_verifies;
      c->drafted = e.spec_drafted;
      c->accepted = e.spec_accepted;
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
  static void expect_pool_clean(SpecRunner& r, const ContinuousScheduler& s) {
    EXPECT_EQ(r.pages().check_invariants(), "");
    EXPECT_EQ(r.pages().stats().n_used, 0);
    EXPECT_EQ(s.stats().kv.n_used, 0);
    EXPECT_EQ(s.stats().kv_check, "");
  }
  // One request alone in a fresh scheduler over `r`, run to its end; the pool checked after.
  Outcome run_alone(SpecRunner& r, const RequestParams& p, const SchedulerOptions& o = {}) {
    auto s = sched(r, o);
    Outcome c;
    const SubmitResult sub = s->submit(p, collect(&c));
    EXPECT_EQ(sub.status, SubmitStatus::Accepted) << sub.error;
    run_to_idle(*s);
    EXPECT_EQ(c.n_finished, 1);
    expect_pool_clean(r, *s);
    return c;
  }
  // The same request without speculation, alone, on a fresh runner with the same script.
  Outcome plain(RequestParams p, const SchedulerOptions& o = {}, std::vector<int32_t> script = {}) {
    p.options.speculative_k = 0;
    auto r = runner(10000, kNeverWrong, std::move(script));
    Outcome c = run_alone(*r, p, o);
    EXPECT_EQ(r->n_verifies + r->n_draft_rows, 0) << "speculative_k 0 speculated";
    return c;
  }
  static void expect_same_output(const Outcome& got, const Outcome& want) {
    EXPECT_EQ(got.tokens, want.tokens);
    EXPECT_EQ(got.text, want.text);
    EXPECT_EQ(got.finish_reason, want.finish_reason);
  }

  TestClock clock_;
  std::shared_ptr<Clock> clock_ptr_;
  std::unique_ptr<Tokenizer> tok_;
  std::vector<int32_t> script_;
};

// Verifies and drafts of a greedy request alone with max_tokens m and k, when the drafts are
// always right (each verify emits its drafts and one more) or always wrong (one token a verify).
// The first token comes from the prefill; a cycle drafts at most m - generated - 1.
struct Counts {
  int64_t verifies = 0, drafted = 0;
};
Counts expected_counts(int k, int64_t m, bool always_wrong) {
  Counts c;
  for (int64_t g = 1; g < m;) {
    const int64_t kc = std::min<int64_t>(k, m - g - 1);
    if (kc == 0) {
      ++g;
      continue;
    }
    ++c.verifies;
    c.drafted += kc;
    g += always_wrong ? 1 : kc + 1;
  }
  return c;
}

void expect_counters(const Outcome& c, int k, int64_t m, const Wrong& wrong) {
  EXPECT_LE(c.accepted, c.drafted);
  EXPECT_LE(c.accepted + c.verifies, static_cast<int64_t>(c.tokens.size()))
      << "a verify emits its accepted drafts and one token; more means drafts past max_tokens";
  if (&wrong == &kEveryThird) {
    if (m >= 3) {
      EXPECT_GT(c.verifies, 0) << "no speculation ran";
    }
    return;
  }
  const Counts want = expected_counts(k, m, &wrong == &kAlwaysWrong);
  EXPECT_EQ(c.verifies, want.verifies);
  EXPECT_EQ(c.drafted, want.drafted);
  EXPECT_EQ(c.accepted, &wrong == &kAlwaysWrong ? 0 : c.drafted);
}

// 1. Greedy output is the output without speculation, whatever the drafts are.
TEST_F(SpeculativeScheduler, OutputEqualsDecodingWithoutIt) {
  const std::vector<std::pair<const char*, const Wrong*>> wrongs = {
      {"never", &kNeverWrong}, {"every 3rd", &kEveryThird}, {"always", &kAlwaysWrong}};
  for (const int k : {1, 2, 4, 7}) {
    std::set<int64_t> lengths = {1, 2, k, k + 1, 2 * k + 3, 20};
    for (const int64_t m : lengths)
      for (const size_t n_prompt : {3u, 6u}) {
        const Outcome want = plain(req(n_prompt, m, 0));
        ASSERT_EQ(want.tokens.size(), static_cast<size_t>(m));
        for (const auto& [name, wrong] : wrongs) {
          SCOPED_TRACE(testing::Message() << "k " << k << ", max_tokens " << m << ", prompt " << n_prompt
                                          << ", drafts wrong " << name);
          auto r = runner(10000, *wrong);
          r->max_table = static_cast<int64_t>(n_prompt) + m - 1;
          r->max_verify = k + 1;
          const Outcome got = run_alone(*r, req(n_prompt, m, k));
          expect_same_output(got, want);
          expect_counters(got, k, m, *wrong);
        }
      }
  }
}

// 1b. A runner that answers greedy verifies with their rows' ids (the CUDA runner: no logits
// over PCIe): the same output, and the ids path taken (its logits are zeros, so reading them
// would keep no draft and emit token 0).
TEST_F(SpeculativeScheduler, VerifyIdsInsteadOfLogitsGiveTheSameOutput) {
  for (const int k : {1, 3, 6})
    for (const Wrong* wrong : {&kNeverWrong, &kEveryThird, &kAlwaysWrong}) {
      SCOPED_TRACE(testing::Message() << "k " << k);
      const Outcome want = plain(req(4, 30, 0));
      auto r = runner(10000, *wrong);
      r->ids_mode = true;
      r->max_table = 4 + 30 - 1;
      r->max_verify = k + 1;
      const Outcome got = run_alone(*r, req(4, 30, k));
      expect_same_output(got, want);
      EXPECT_GT(r->n_id_verifies, 0) << "the ids path was not taken";
      EXPECT_EQ(r->n_id_verifies, got.verifies);
    }
}

// 2. The rows the runner is given (checked row by row in SpecRunner::step), and that drafts and
// verifies the scheduler counts are the rows the runner saw.
TEST_F(SpeculativeScheduler, RunnerGetsDraftRowsOnTheDraftPolicyAndVerifyRowsFromTheCycleStart) {
  for (const int k : {1, 3, 6}) {
    SCOPED_TRACE(testing::Message() << "k " << k);
    auto r = runner(10000, kEveryThird);
    r->max_verify = k + 1;
    r->max_table = 5 + 40 - 1;
    const Outcome got = run_alone(*r, req(5, 40, k));
    EXPECT_EQ(got.tokens, plain(req(5, 40, 0)).tokens);
    EXPECT_GT(got.verifies, 0);
    EXPECT_EQ(r->n_verifies, got.verifies);
    EXPECT_EQ(r->n_full_verifies, got.verifies) << "a verify cut short with the whole budget free";
    EXPECT_EQ(r->n_draft_rows, got.drafted) << "drafts counted that the runner did not see on the draft policy";
    EXPECT_EQ(r->n_truncates, 2 * got.verifies) << "a truncate before each verify and one after it";
    EXPECT_EQ(r->abandoned_cycles, 0);
    EXPECT_EQ(r->draft_policies, std::set<std::string>{"sinkwindow:4"});
    EXPECT_EQ(r->verify_policies, std::set<std::string>{"-"}) << "a verify must read the request's own pages";
    EXPECT_LT(got.accepted, got.drafted) << "every third draft is wrong";
  }
}

// 3. An eos or a stop string reached by an accepted draft ends the request there; the drafts
// after it in the same cycle (also accepted) are not emitted.
TEST_F(SpeculativeScheduler, EosInAnAcceptedDraftEndsTheRequest) {
  std::vector<int32_t> with_eos = script_;
  const int32_t eos = tok_->stop_ids().at(0);
  with_eos[5] = eos;  // prompt of 3: position 3 from the prefill, then drafts at 4, 5, 6, ...
  RequestParams p = req(3, 30, 0);
  p.options.ignore_eos = false;
  const Outcome want = plain(p, {}, with_eos);
  ASSERT_EQ(want.finish_reason, "stop");
  ASSERT_EQ(want.tokens.size(), 2u);
  for (const int k : {2, 3, 4, 7}) {
    SCOPED_TRACE(testing::Message() << "k " << k);
    auto r = runner(10000, kNeverWrong, with_eos);
    p.options.speculative_k = k;
    const Outcome got = run_alone(*r, p);
    expect_same_output(got, want);
    EXPECT_EQ(r->verified_drafts.count(eos), 1u) << "the eos was not a draft the verify accepted";
    EXPECT_EQ(got.accepted, got.drafted) << "the eos and the drafts after it were all right";
  }
}

TEST_F(SpeculativeScheduler, StopStringInAnAcceptedDraftEndsTheRequest) {
  // The stop string ends the third generated token's text (position 5 with a prompt of 3).
  const std::vector<int32_t> first(script_.begin() + 3, script_.begin() + 6);
  const std::string t3 = tok_->decode(first, true);
  RequestParams p = req(3, 30, 0);
  p.options.stop = {t3.substr(t3.size() - 3)};
  const Outcome want = plain(p);
  ASSERT_EQ(want.finish_reason, "stop");
  ASSERT_EQ(want.tokens.size(), 3u);
  ASSERT_EQ(want.text, t3.substr(0, t3.size() - 3));
  for (const int k : {2, 3, 4, 7}) {
    SCOPED_TRACE(testing::Message() << "k " << k);
    auto r = runner(10000);
    p.options.speculative_k = k;
    const Outcome got = run_alone(*r, p);
    expect_same_output(got, want);
    EXPECT_EQ(got.verifies, 1) << "the first cycle's drafts hold the stop";
    EXPECT_EQ(got.accepted, got.drafted);
  }
}

// 4. Speculative requests of different k and plain ones share steps; each gets its own output.
TEST_F(SpeculativeScheduler, MixedRequestsEachGetTheirOwnOutput) {
  SchedulerOptions o;
  o.speculative_k = 5;  // for the request that says -1
  auto r = runner(10000, kEveryThird);
  auto s = sched(*r, o);
  const std::vector<int> ks = {0, 1, 3, -1, 7, 0, 2, 4};
  std::vector<Outcome> got(ks.size());
  for (size_t i = 0; i < ks.size(); ++i) {
    const SubmitResult sub = s->submit(req(3 + i, 10 + 3 * static_cast<int64_t>(i), ks[i], 40 * static_cast<int32_t>(i)),
                                       collect(&got[i]));
    ASSERT_EQ(sub.status, SubmitStatus::Accepted) << sub.error;
  }
  run_to_idle(*s);
  for (size_t i = 0; i < ks.size(); ++i) {
    SCOPED_TRACE(testing::Message() << "request " << i << ", k " << ks[i]);
    expect_same_output(got[i], plain(req(3 + i, 10 + 3 * static_cast<int64_t>(i), 0, 40 * static_cast<int32_t>(i))));
    EXPECT_EQ(got[i].verifies > 0, ks[i] != 0);
  }
  EXPECT_GT(r->mixed_steps, 0) << "no verify shared a step";
  EXPECT_EQ(s->stats().spec_verifies, static_cast<uint64_t>(r->n_verifies));
  expect_pool_clean(*r, *s);
}

// A step's token budget bounds a cycle (a verify of k + 1 rows must fit a step), and a verify
// that does not fit what older requests' rows left waits for a step where it does.
TEST_F(SpeculativeScheduler, TheStepBudgetBoundsTheCycle) {
  SchedulerOptions o;
  o.max_num_batched_tokens = 4;
  o.max_num_seqs = 2;
  auto r = runner(10000, kEveryThird);
  r->max_verify = 4;
  auto s = sched(*r, o);
  Outcome a, b;
  ASSERT_EQ(s->submit(req(3, 30, 7), collect(&a)).status, SubmitStatus::Accepted);
  ASSERT_EQ(s->submit(req(5, 12, 7, 300), collect(&b)).status, SubmitStatus::Accepted);
  run_to_idle(*s);
  expect_same_output(a, plain(req(3, 30, 0)));
  expect_same_output(b, plain(req(5, 12, 0, 300)));
  EXPECT_GT(a.verifies, 0);
  EXPECT_GT(b.verifies, 0);
  EXPECT_LE(r->most_step_tokens, 4);
  expect_pool_clean(*r, *s);
}

// A verify that does not fit what older requests' rows left of the budget "waits a step"
// (schedule_running's comment), and should not wait longer while the older request runs: with a
// budget of 4 and k 3, A's verify takes the whole step and its drafts leave 3, never the 4 rows
// B's verify needs. Without speculation both decode a token a step and B (10 tokens) ends long
// before A (200 tokens).
TEST_F(SpeculativeScheduler, AVerifyThatDoesNotFitIsNotStarvedByAnOlderRequest) {
  SchedulerOptions o;
  o.max_num_batched_tokens = 4;
  o.max_num_seqs = 2;
  auto r = runner();
  auto s = sched(*r, o);
  Outcome a, b;
  ASSERT_EQ(s->submit(req(3, 200, 3), collect(&a)).status, SubmitStatus::Accepted);
  ASSERT_EQ(s->submit(req(3, 10, 3, 300), collect(&b)).status, SubmitStatus::Accepted);
  int a_done = -1, b_done = -1;
  for (int step = 0; step < 1000 && !s->idle(); ++step) {
    s->step();
    if (a.n_finished > 0 && a_done < 0) a_done = step;
    if (b.n_finished > 0 && b_done < 0) b_done = step;
  }
  expect_same_output(a, plain(req(3, 200, 0)));
  expect_same_output(b, plain(req(3, 10, 0, 300)));
  ASSERT_GE(a_done, 0);
  ASSERT_GE(b_done, 0);
  EXPECT_LT(b_done, a_done) << "B's verify waited for A to finish (B ended at step " << b_done << ", A at " << a_done << ")";
  expect_pool_clean(*r, *s);
}

// 5. A pool too small for every request at once: preemption, also in the middle of a cycle
// (the drafts go, the request resumes by recompute and starts a new cycle).
TEST_F(SpeculativeScheduler, PreemptionInACycleKeepsTheOutput) {
  // Pages of 4 tokens, 4 lists: 8 requests of 6 + 30 tokens want 9 blocks (36 pages) each; 100 pages.
  auto r = runner(100, kEveryThird);
  auto s = sched(*r);
  const std::vector<int> ks = {3, 7, 0, 2, 5, 1, 4, 6};
  std::vector<Outcome> got(ks.size());
  for (size_t i = 0; i < ks.size(); ++i)
    ASSERT_EQ(s->submit(req(6, 30, ks[i], 100 * static_cast<int32_t>(i)), collect(&got[i])).status, SubmitStatus::Accepted);
  run_to_idle(*s);
  const Outcome want = plain(req(6, 30, 0));
  for (size_t i = 0; i < ks.size(); ++i) {
    SCOPED_TRACE(testing::Message() << "request " << i << ", k " << ks[i]);
    expect_same_output(got[i], want);
  }
  EXPECT_GT(s->stats().n_preemptions, 0u);
  EXPECT_GT(r->abandoned_cycles, 0) << "no request was preempted in the middle of a cycle";
  EXPECT_EQ(s->stats().generation_tokens, 8u * 30u);
  expect_pool_clean(*r, *s);
}

// 6. What submit refuses, with a message that names the problem; nothing refused is queued.
TEST_F(SpeculativeScheduler, SubmitRefusesWhatCannotSpeculate) {
  auto r = runner();
  auto s = sched(*r);
  auto refused = [&](RequestParams p, const std::string& says) {
    const SubmitResult res = s->submit(std::move(p), {});
    EXPECT_EQ(res.status, SubmitStatus::Invalid) << says;
    EXPECT_NE(res.error.find(says), std::string::npos) << res.error;
  };
  refused(req(3, 5, 17), "speculative_k must be in [0, 16]");
  refused(req(3, 5, -3), "speculative_k must be in [0, 16] or auto");  // (-2 is kSpeculativeAuto)
  RequestParams p = req(3, 5, 4);
  p.options.draft_policy = "coverage:0.9";
  refused(p, "sinkwindow");
  p.options.draft_policy = "nonsense";
  refused(p, "draft policy");
  r->max_seeds = 8;  // (the CUDA backend keeps 256 seeds per list)
  p.options.draft_policy = "sinkwindow:4+16";
  refused(p, "16 seed pages per list, this backend keeps at most 8");
  p.options.draft_policy = "sinkwindow:4+8";
  EXPECT_EQ(s->submit(p, {}).status, SubmitStatus::Accepted) << "seeds within the bound run";
  s->stop(false);
  s = sched(*r);
  r->set_policy(PolicySpec::parse("coverage:0.99/2@sketch4"));
  refused(req(3, 5, 4), "selects at every step");
  EXPECT_EQ(s->stats().n_submitted, 0u) << "a refused request was queued";
  r->set_policy(PolicySpec{});

  SpecRunner no_verify(1000, script_, /*verifies=*/false);
  auto s2 = sched(no_verify);
  const SubmitResult res = s2->submit(req(3, 5, 4), {});
  EXPECT_EQ(res.status, SubmitStatus::Invalid);
  EXPECT_NE(res.error.find("does not run speculative verification"), std::string::npos) << res.error;
  EXPECT_EQ(s2->submit(req(3, 5, 0), {}).status, SubmitStatus::Accepted) << "without speculation it runs";
  SchedulerOptions o;
  o.speculative_k = 4;
  EXPECT_THROW(sched(no_verify, o), Error) << "the scheduler's own speculative_k is checked too";
  s2->stop(false);

  // A runner that verifies at most 4 rows (the CUDA attention kernel's query vectors per KV head
  // over the GQA group): 3 drafts run, 4 are refused naming the bound.
  SpecRunner four(1000, script_, /*verifies=*/true);
  four.max_rows = 4;
  auto s3 = sched(four);
  const SubmitResult r4 = s3->submit(req(3, 5, 4), {});
  EXPECT_EQ(r4.status, SubmitStatus::Invalid);
  EXPECT_NE(r4.error.find("more drafts than this backend verifies in one step (3"), std::string::npos) << r4.error;
  EXPECT_EQ(s3->submit(req(3, 5, 3), {}).status, SubmitStatus::Accepted);
  s3->stop(false);
}

// Sampled requests speculate too since 5bd45ed (speculative sampling). On the fake's peaked
// logits (30 against 0, temperature 0.7: any other token has a probability under 1e-15) draft
// and verifier are all but deterministic, so the output is the script's, wrong drafts replaced.
// (A vocabulary of 512 and a script of ids under it: the sampler sorts the whole vocabulary.)
TEST_F(SpeculativeScheduler, SampledRequestsOnPeakedLogitsGiveTheScript) {
  const std::vector<int32_t> small = {261, 270, 279, 288, 297, 306, 315, 324, 342, 351, 360, 369};
  const std::vector<int32_t> want = plain(req(4, 25, 0), {}, small).tokens;
  for (const Wrong* wrong : {&kNeverWrong, &kEveryThird, &kAlwaysWrong}) {
    SpecRunner r(10000, small, /*verifies=*/true, /*vocab=*/512);
    r.draft_wrong = *wrong;
    r.max_verify = 5;
    RequestParams p = req(4, 25, 4);
    p.options.sampling.temperature = 0.7f;
    p.options.sampling.seed = 11;
    const Outcome got = run_alone(r, p);
    EXPECT_EQ(got.tokens, want);
    EXPECT_GT(got.verifies, 0);
    EXPECT_EQ(r.n_draft_rows, got.drafted);
    if (wrong == &kNeverWrong) {
      EXPECT_EQ(got.accepted, got.drafted);
    } else if (wrong == &kAlwaysWrong) {
      EXPECT_EQ(got.accepted, 0);
    }
  }
}

// 7. Prompts near max_model_len: cycles shrink so that the table never takes the last position,
// and the request ends with "length" where it would without speculation.
TEST_F(SpeculativeScheduler, MaxModelLenBoundsTheCycle) {
  SchedulerOptions o;
  o.max_model_len = 20;
  for (const int k : {1, 4, 7})
    for (const size_t n_prompt : {12u, 15u, 17u, 18u, 19u}) {
      SCOPED_TRACE(testing::Message() << "k " << k << ", prompt " << n_prompt);
      const Outcome want = plain(req(n_prompt, 100, 0), o);
      ASSERT_EQ(want.finish_reason, "length");
      ASSERT_EQ(want.tokens.size(), 20 - n_prompt);
      auto r = runner(10000, kEveryThird);
      r->max_table = o.max_model_len - 1;
      r->max_verify = k + 1;
      const Outcome got = run_alone(*r, req(n_prompt, 100, k), o);
      expect_same_output(got, want);
      EXPECT_EQ(got.verifies > 0, n_prompt <= 17) << "prompts up to 17 leave room for a cycle, longer ones none";
    }
}

// speculative_k auto (engine/spec_controller.h) over a runner whose steps take w + m rows + p kv
// of the test clock: the same tokens as decoding plainly always; where the KV read dominates and
// verify reads it once, speculation on and the request's time well under plain decoding's; where
// the weights dominate, never on; where drafts are always wrong, off after the first cycle.
struct Timed {
  Outcome out;
  double seconds = 0;
};

class AutoSpeculation : public SpeculativeScheduler {
 protected:
  Timed run(double w, double m, double p, int k, const Wrong& wrong, size_t n_prompt, int64_t max_tokens,
            SpecRunner** seen = nullptr) {
    runner_ = runner(20000, wrong);
    runner_->clock = &clock_;
    runner_->w = w;
    runner_->m = m;
    runner_->p = p;
    runner_->reads_once = true;
    RequestParams rp = req(n_prompt, max_tokens, k);
    Timed t;
    const double t0 = clock_.t.load();
    t.out = run_alone(*runner_, rp);
    t.seconds = clock_.t.load() - t0;
    if (seen) *seen = runner_.get();
    return t;
  }
  std::unique_ptr<SpecRunner> runner_;
};

TEST_F(AutoSpeculation, OnWhereTheKvReadDominates) {
  // 2,000 tokens of context at 2e-6 s a token: 4 ms of KV against 1 ms of weights a step.
  const Timed plain = run(1e-3, 1e-5, 2e-6, 0, kNeverWrong, 2000, 150);
  const Timed aut = run(1e-3, 1e-5, 2e-6, kSpeculativeAuto, kNeverWrong, 2000, 150);
  expect_same_output(aut.out, plain.out);
  EXPECT_GT(aut.out.verifies, 0);
  EXPECT_EQ(aut.out.accepted, aut.out.drafted) << "the drafts were all right";
  // Decoding time (the prefill, one 2,000-token chunk, is the same step in both): drafts kept,
  // the estimate near 0.9-1 and k up to 8, a cycle costs ~8 draft steps of ~1 ms and one ~5 ms
  // verify for ~6-9 tokens that take ~5 ms each plainly; with the first 16 steps plain (then a
  // probe, whose draft and verify steps make the fit ready: prompt chunks are not in it), decoding
  // takes well under 0.7 of plain decoding's time.
  const double prefill = 1e-3 + 1e-5 * 2000 + 2e-6 * (2000.0 * 2001 / 2);
  std::printf("decoding: auto %.4f s (%lld verifies, %lld of %lld drafts kept), plain %.4f s\n", aut.seconds - prefill,
              static_cast<long long>(aut.out.verifies), static_cast<long long>(aut.out.accepted),
              static_cast<long long>(aut.out.drafted), plain.seconds - prefill);
  EXPECT_LT(aut.seconds - prefill, 0.7 * (plain.seconds - prefill))
      << "auto " << aut.seconds - prefill << " s, plain " << plain.seconds - prefill << " s of decoding";
  // A runner that verifies at most 4 rows: auto's cycles stay within them (SpecRunner expects
  // every verify to have at most max_verify rows), with the same output.
  runner_ = runner(20000, kNeverWrong);
  runner_->clock = &clock_;
  runner_->w = 1e-3;
  runner_->m = 1e-5;
  runner_->p = 2e-6;
  runner_->reads_once = true;
  runner_->max_rows = 4;
  runner_->max_verify = 4;
  const Outcome capped = run_alone(*runner_, req(2000, 150, kSpeculativeAuto));
  expect_same_output(capped, plain.out);
  EXPECT_GT(capped.verifies, 0);
}

TEST_F(AutoSpeculation, OffWhereTheWeightsDominate) {
  const Timed plain = run(1e-2, 1e-5, 1e-9, 0, kNeverWrong, 50, 100);
  SpecRunner* r = nullptr;
  const Timed aut = run(1e-2, 1e-5, 1e-9, kSpeculativeAuto, kNeverWrong, 50, 100, &r);
  expect_same_output(aut.out, plain.out);
  // One probe (the fit has seen no draft step yet, so it is not asked), then the fit, having seen
  // its drafts cost what a step costs, says no cycle pays even at kProbeAlpha: no other.
  EXPECT_EQ(aut.out.verifies, 1);
  EXPECT_EQ(r->n_draft_rows, SpecProbe::kProbeDrafts);
  std::printf("weights: auto %.4f s (%lld verifies, %lld drafts), plain %.4f s\n", aut.seconds,
              static_cast<long long>(aut.out.verifies), static_cast<long long>(aut.out.drafted), plain.seconds);
  EXPECT_LE(aut.seconds, 1.03 * plain.seconds);
}

TEST_F(AutoSpeculation, BacksOffWhenDraftsAreWrong) {
  const Timed plain = run(1e-3, 1e-5, 2e-6, 0, kAlwaysWrong, 2000, 150);
  const Timed aut = run(1e-3, 1e-5, 2e-6, kSpeculativeAuto, kAlwaysWrong, 2000, 150);
  expect_same_output(aut.out, plain.out);
  // The prior (0.6) starts cycles; none of their drafts kept, each lowers the estimate until no k
  // pays (below ~0.24 at these costs: k = 1 gains 1.24 x 5.01 / (1.04 + 5.03) < 1.03). Speculation
  // ends: a few cycles of 1-2 drafts, not one per token (150 tokens); and the request's decoding
  // time stays within the 3% of plain decoding's.
  SpecRunner* r = nullptr;
  const Timed again = run(1e-3, 1e-5, 2e-6, kSpeculativeAuto, kAlwaysWrong, 2000, 150, &r);
  EXPECT_LE(r->n_draft_rows, 20);
  EXPECT_EQ(again.out.verifies, aut.out.verifies) << "the same choices on the same steps";
  const double prefill = 1e-3 + 1e-5 * 2000 + 2e-6 * (2000.0 * 2001 / 2);
  std::printf("decoding: auto %.4f s (%lld verifies, %lld drafts), plain %.4f s\n", aut.seconds - prefill,
              static_cast<long long>(aut.out.verifies), static_cast<long long>(aut.out.drafted), plain.seconds - prefill);
  EXPECT_LE(aut.seconds - prefill, 1.03 * (plain.seconds - prefill))
      << "auto " << aut.seconds - prefill << " s, plain " << plain.seconds - prefill << " s of decoding";
}

// Where the weights are most of a plain step but drafts still pay (the 8B shape at 128k x 1 on an
// H100: a plain step 11.7 ms, about half of it the weights), and the prefill's chunks cost far less
// per token pair than a decode row's KV read (compute-bound against bandwidth-bound), the fit of
// plain steps cannot tell the weights from the KV, and auto without probes never drafted (on the
// H100, and here). Probes run a cycle now and then: their draft steps, which read 16 tokens, tell
// the two apart, the drafts are kept, and speculation pays. With drafts never kept, probes cost
// at most kProbeDrafts draft steps per doubling of the output: within 3% of plain decoding.
TEST_F(AutoSpeculation, ProbesWhereThePlainStepsCannotTellWeightsFromKv) {
  const auto timed = [&](int k, const Wrong& wrong, SpecRunner** seen) {
    runner_ = runner(20000, wrong);
    runner_->clock = &clock_;
    runner_->w = 5e-3;
    runner_->m = 1e-5;
    runner_->p = 2e-6;  // 6 ms of KV at 3,000 tokens: a plain step 11 ms, a draft 5 ms
    runner_->p_prompt = 1e-9;
    runner_->jitter = 0.03;  // a GPU step's spread
    runner_->reads_once = true;
    Timed t;
    const double t0 = clock_.t.load();
    SchedulerOptions o;
    o.max_num_batched_tokens = 256;  // the prompt in 12 chunks, as a long prompt's many on the GPU
    t.out = run_alone(*runner_, req(3000, 300, k), o);
    t.seconds = clock_.t.load() - t0;
    *seen = runner_.get();
    return t;
  };
  SpecRunner* r = nullptr;
  const Timed plain = timed(0, kNeverWrong, &r);
  const Timed aut = timed(kSpeculativeAuto, kNeverWrong, &r);
  expect_same_output(aut.out, plain.out);
  std::printf("kept drafts: auto %.4f s (%lld verifies, %lld of %lld drafts kept), plain %.4f s\n", aut.seconds,
              static_cast<long long>(aut.out.verifies), static_cast<long long>(aut.out.accepted),
              static_cast<long long>(aut.out.drafted), plain.seconds);
  EXPECT_GT(aut.out.verifies, 5);
  EXPECT_LT(aut.seconds, 0.85 * plain.seconds) << "kept drafts of half a step's cost pay";

  const Timed wrong_plain = timed(0, kAlwaysWrong, &r);
  const Timed wrong = timed(kSpeculativeAuto, kAlwaysWrong, &r);
  expect_same_output(wrong.out, wrong_plain.out);
  std::printf("wrong drafts: auto %.4f s (%lld verifies, %lld drafts), plain %.4f s\n", wrong.seconds,
              static_cast<long long>(wrong.out.verifies), static_cast<long long>(wrong.out.drafted), wrong_plain.seconds);
  EXPECT_GT(wrong.out.verifies, 0) << "probed";
  EXPECT_LE(r->n_draft_rows, 24) << "the probes back off";
  EXPECT_LE(wrong.seconds, 1.03 * wrong_plain.seconds);
}

// Two requests decoding together, then one alone: plain steps of 2 rows and of 1 make the fit ready
// (rows varied), but a row's KV tokens move with the rows (300 a row), so the fit cannot tell a
// row's fixed part from its KV read, and here it takes much of the KV for a per-row cost: a draft
// would cost nearly what a plain step does, and the ready fit says no cycle pays at kProbeAlpha.
// Probes do not ask a fit that has seen no draft step (steps_since_draft_): the first comes at its
// gap, its drafts are kept and priced, and speculation pays. (Asking that fit, the first cycle waited
// until the context's growth had taught it the KV's price: after 31 tokens, not 17; at 128k the
// growth of a request's output teaches it next to nothing.)
TEST_F(AutoSpeculation, ProbesUntilTheFitHasSeenADraftThoughPlainStepsMadeItReady) {
  const auto timed = [&](int k, int64_t* first_verify_at) {
    runner_ = runner(20000, kNeverWrong);
    runner_->clock = &clock_;
    runner_->w = 5e-3;
    runner_->m = 1e-5;
    runner_->p = 1e-5;  // 3 ms of KV at 300 tokens: a plain step of one row 8 ms, a draft 5.2 ms
    runner_->p_prompt = 1e-9;
    runner_->jitter = 0.03;
    runner_->reads_once = true;
    auto s = sched(*runner_);
    std::array<Outcome, 2> got;
    int64_t generated = 0;
    *first_verify_at = -1;
    const RequestSink a = collect(&got[0]);
    const RequestSink first = [&](const RequestEvent& e) {
      if (e.spec_verifies > 0 && *first_verify_at < 0) *first_verify_at = generated;
      generated += static_cast<int64_t>(e.tokens.size());
      a(e);
    };
    const double t0 = clock_.t.load();
    EXPECT_EQ(s->submit(req(300, 200, k), first).status, SubmitStatus::Accepted);
    EXPECT_EQ(s->submit(req(300, 8, k, 400), collect(&got[1])).status, SubmitStatus::Accepted);
    run_to_idle(*s);
    expect_pool_clean(*runner_, *s);
    return std::pair{got, clock_.t.load() - t0};
  };
  int64_t at = -1;
  const auto [plain, plain_s] = timed(0, &at);
  const auto [aut, aut_s] = timed(kSpeculativeAuto, &at);
  for (int i = 0; i < 2; ++i) expect_same_output(aut[i], plain[i]);
  std::printf("two requests: auto %.4f s (%lld verifies, the first after %lld tokens), plain %.4f s\n", aut_s,
              static_cast<long long>(aut[0].verifies), static_cast<long long>(at), plain_s);
  // (The gap counts plain decode tokens; the prefill's token and B's 8 steps come before.)
  EXPECT_GE(at, SpecProbe::kFirstProbeGap);
  EXPECT_LE(at, SpecProbe::kFirstProbeGap + 2) << "the first probe waited for the fit";
  EXPECT_GT(aut[0].verifies, 5);
  EXPECT_LT(aut_s, 0.8 * plain_s);
}

TEST(SpecProbe, DueAfterItsGapWhereDraftsReadLessAndTheFitAllows) {
  SpecCostInputs in;
  in.context = 4096;
  in.draft_context = 256;
  in.verify_reads_once = true;
  const StepCostModel unready;
  SpecProbe p;
  for (int i = 0; i < SpecProbe::kFirstProbeGap - 1; ++i) p.plain_token();
  EXPECT_EQ(p.drafts(unready, in, 8, false), 0) << "before its gap";
  p.plain_token();
  SpecCostInputs near = in;
  near.context = 512;
  EXPECT_EQ(p.drafts(unready, near, 8, false), 0) << "a context twice the draft's or less: never";
  EXPECT_EQ(p.drafts(unready, in, 0, false), 0) << "no verify rows";
  SpecCostInputs per_row = in;
  per_row.verify_reads_once = false;
  EXPECT_EQ(p.drafts(unready, per_row, 8, false), 0) << "a verify reading the KV per row never pays";
  EXPECT_EQ(p.drafts(unready, in, 1, false), 1) << "within k_max";
  EXPECT_EQ(p.gap(), 2 * SpecProbe::kFirstProbeGap);
  EXPECT_EQ(p.drafts(unready, in, 8, false), 0) << "the count restarted";
  // A ready fit that has seen drafts and where even kProbeAlpha does not pay (the weights are the
  // step): no probe; where it has seen none, or where it pays: a probe of kProbeDrafts.
  StepCostModel weights, kv;
  for (int i = 0; i < 32; ++i) {
    const double rows = 1 + i % 4, tokens = 100.0 + 1000.0 * (i % 5);
    weights.observe(rows, tokens, 1e-2 + 1e-5 * rows + 1e-10 * tokens);
    kv.observe(rows, tokens, 1e-3 + 1e-5 * rows + 2e-6 * tokens);
  }
  ASSERT_TRUE(weights.ready() && kv.ready());
  for (int i = 0; i < 2 * SpecProbe::kFirstProbeGap; ++i) p.plain_token();
  EXPECT_EQ(p.drafts(weights, in, 8, true), 0);
  EXPECT_EQ(p.drafts(kv, in, 8, true), SpecProbe::kProbeDrafts);
  EXPECT_EQ(p.gap(), 4 * SpecProbe::kFirstProbeGap);
  for (int i = 0; i < 4 * SpecProbe::kFirstProbeGap; ++i) p.plain_token();
  EXPECT_EQ(p.drafts(weights, in, 8, false), SpecProbe::kProbeDrafts) << "a fit without drafts is not asked";
  SpecProbe far;
  for (int n = 0; n < 20; ++n) {
    for (int i = 0; i < SpecProbe::kMaxProbeGap; ++i) far.plain_token();
    far.drafts(unready, in, 8, false);
  }
  EXPECT_EQ(far.gap(), SpecProbe::kMaxProbeGap);
}

}  // namespace
}  // namespace dhs
