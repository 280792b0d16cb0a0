// The KV hierarchy end to end on the CPU backend (issue 23): the default model's greedy tokens
// with a host tier and a device budget so small that every layer of every step recalls pages
// (kv/tiered_kv.h; the device tier holds one layer's worth of a request's pages) equal the
// tokens with everything resident, dense and coverage γ 0.99; every page is accounted for
// afterwards in both tiers. Under coverage the selection scores offloaded pages from their
// summaries, which move with them: the pages read equal the all-resident run's.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "../test_paths.h"
#include "dhisparse/engine.h"
#include "dhisparse/policy.h"
#include "dhisparse/scheduler.h"

namespace dhs {
namespace {

std::unique_ptr<Engine> load(const std::string& policy, double cpu_kv_gb, int64_t budget, int64_t kv_blocks = 0,
                             bool auto_budget = false, const std::string& recall = "layer") {
  EngineOptions o;
  o.model_path = test::default_model_path();
  o.policy = PolicySpec::parse(policy);
  o.cpu_kv_gb = cpu_kv_gb;
  o.kv_device_budget = budget;
  o.kv_budget_auto = auto_budget;
  o.kv_blocks = kv_blocks;
  o.kv_recall = recall;
  o.max_context = 2048;
  return Engine::load(o);
}

// A prompt of ~1,000 tokens: ~62 pages per (layer, KV head) list, 3 KV heads, 30 layers.
std::vector<int32_t> long_prompt(const Engine& e) {
  std::string text = "Notes from the archive, read them carefully.\n";
  for (int i = 0; i < 40; ++i)
    text += "Entry " + std::to_string(i) + ": the keeper of shelf " + std::to_string(i * 7 % 13) +
            " moved the blue ledger to room " + std::to_string(100 + i) + ".\n";
  text += "The special code word is PELICAN. Entry 41: nothing moved.\nQuestion: what is the special code word?\nAnswer:";
  return e.tokenize(text);
}

// recall "ahead" (the GPU's schedule): nothing moves inside a step; pages not resident are read
// in place from the host tier (late) and merged by log-sum-exp, and the pages a step read come
// back after it as far as the budget goes. The merge sums in another order than one pass over
// all pages, so tokens equal the all-resident run up to rounding: on this prompt, exactly.
void expect_same_tokens_with_tiers(const std::string& policy, bool every_layer_recalls, const std::string& recall = "layer") {
  if (!std::filesystem::exists(test::default_model_path())) GTEST_SKIP() << "default model missing: run scripts/fetch_model.sh";
  GenerateOptions g;
  g.max_tokens = 24;
  g.ignore_eos = true;
  g.sampling.temperature = 0.0f;
  std::vector<int32_t> want;
  double want_frac = 0;
  {
    auto e = load(policy, 0.0, 0);
    const GenerateResult r = e->generate(long_prompt(*e), g);
    want = r.tokens;
    want_frac = r.pages_read_frac;
  }
  // Budget: one layer's pages of the request (KV heads x pages per list at the end) in the device
  // tier, of the 30 layers' it holds: each layer's attention recalls what the layers before it
  // evicted.
  int64_t budget = 0;
  {
    auto probe = load("dense", 0.0, 0);
    const int64_t n = static_cast<int64_t>(long_prompt(*probe).size()) + g.max_tokens;
    budget = probe->config().n_heads_kv * ((n + 15) / 16);
  }
  auto e = load(policy, 1.0, budget, 0, false, recall);
  const std::vector<int32_t> prompt = long_prompt(*e);
  ASSERT_GT(prompt.size(), 600u);
  const GenerateResult r = e->generate(prompt, g);
  EXPECT_EQ(r.tokens, want) << policy << ": greedy tokens differ with the host tier";
  // The same pages selected at every step: the estimates read offloaded pages' summaries too.
  EXPECT_EQ(r.pages_read_frac, want_frac);
  const TierCounts t = e->tier_counts();
  std::printf("%s: %zu tokens; page hits %llu, recalled %llu, offloaded %llu, dropped (clean copy) %llu\n", policy.c_str(),
              r.tokens.size(), static_cast<unsigned long long>(t.hits), static_cast<unsigned long long>(t.recalled),
              static_cast<unsigned long long>(t.offloaded), static_cast<unsigned long long>(t.dropped));
  std::printf("  read in place (late): %llu\n", static_cast<unsigned long long>(t.late));
  const uint64_t layers = static_cast<uint64_t>(e->config().n_layers);
  if (recall == "land") {
    // Late pages land in reserved device slots and are read there; each is adopted (counted as
    // recalled) after its step: landings every step, and under coverage selections move.
    EXPECT_GE(t.late, layers * static_cast<uint64_t>(g.max_tokens)) << "no step read pages from the host tier";
    EXPECT_GE(t.recalled, static_cast<uint64_t>(g.max_tokens)) << "no page landed";
  } else if (recall == "ahead") {
    // Every layer of every step reads pages from the host tier; under coverage the selection
    // moves and pages come back between steps (dense reads every page: what is resident stays).
    EXPECT_GE(t.late, layers * static_cast<uint64_t>(g.max_tokens)) << "no step read pages in place";
    if (!every_layer_recalls) {
      EXPECT_GT(t.recalled, 0u);
    }
  } else {
    if (every_layer_recalls) {
      EXPECT_GE(t.recalled, layers * static_cast<uint64_t>(g.max_tokens)) << "pages did not move every step";
    } else {
      EXPECT_GT(t.recalled, 0u);
    }
    EXPECT_EQ(t.late, 0u);
  }
  EXPECT_GT(t.offloaded, 0u);
  EXPECT_EQ(e->kv_stats().n_used, 0);
  EXPECT_EQ(e->tier_counts().host_used, 0);
  EXPECT_EQ(e->kv_check(), "");
}

TEST(KvTiers, DenseGreedyTokensEqualAllResident) { expect_same_tokens_with_tiers("dense", true); }

TEST(KvTiers, CoverageGreedyTokensEqualAllResident) { expect_same_tokens_with_tiers("coverage:0.99", false); }

TEST(KvTiers, RecallAheadDenseGreedyTokensEqualAllResident) { expect_same_tokens_with_tiers("dense", true, "ahead"); }

// Landing (kv/tier_land.h, --kv-recall land): the step copies its late pages into device slots set
// aside before it and reads them there; adopted after it, with their host copies kept.
TEST(KvTiers, LandingDenseGreedyTokensEqualAllResident) { expect_same_tokens_with_tiers("dense", true, "land"); }
TEST(KvTiers, LandingCoverageGreedyTokensEqualAllResident) { expect_same_tokens_with_tiers("coverage:0.99", false, "land"); }

TEST(KvTiers, RecallAheadCoverageGreedyTokensEqualAllResident) {
  expect_same_tokens_with_tiers("coverage:0.99", false, "ahead");
}

// Four requests in one continuous batch (different lengths, prefill chunks beside decode rows),
// each with a device budget of a few layers' pages (or, auto, budgets from the cache manager over
// a device pool that holds ~70% of their pages), sharing the device tier: each one's greedy tokens
// equal its tokens decoded alone with everything resident.
void expect_batch_equal_alone(bool auto_budget, const std::string& recall = "layer") {
  if (!std::filesystem::exists(test::default_model_path())) GTEST_SKIP() << "default model missing: run scripts/fetch_model.sh";
  GenerateOptions g;
  g.max_tokens = 16;
  g.ignore_eos = true;
  g.sampling.temperature = 0.0f;
  auto plain = load("coverage:0.99", 0.0, 0);
  std::vector<std::vector<int32_t>> prompts, want;
  for (int i = 0; i < 4; ++i) {
    std::string text = "Log " + std::to_string(i) + ".\n";
    for (int j = 0; j < 8 + 9 * i; ++j)
      text += "Line " + std::to_string(j) + ": crate " + std::to_string(j * 31 % 17 + i) + " went to dock " +
              std::to_string(j % 5) + ".\n";
    text += "Which dock did crate 3 go to?";
    prompts.push_back(plain->tokenize(text));
    want.push_back(plain->generate(prompts.back(), g).tokens);
  }
  int64_t blocks = 0;  // the four requests' blocks of 16 tokens, all resident
  for (const auto& pr : prompts) blocks += (static_cast<int64_t>(pr.size()) + g.max_tokens + 15) / 16;
  auto e = auto_budget ? load("coverage:0.99", 1.0, 0, blocks * 7 / 10, /*auto_budget=*/true, recall)
                       : load("coverage:0.99", 1.0, 3 * 3 * 16, 0, false, recall);  // 3 layers' worth at ~16 pages per list
  // (all four run at once, whatever IO-aware admission would say of the pages they push out: the
  // test is of the pages moving, and admission's decisions follow measured step times)
  SchedulerOptions so;
  so.kv_admit_throughput = false;
  so.kv_io_admit_max = 1e6;
  e->configure_scheduler(so);
  std::vector<std::vector<int32_t>> got(prompts.size());
  int done = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    RequestParams p;
    p.prompt = prompts[i];
    p.options = g;
    const SubmitResult sub = e->scheduler().submit(p, [&, i](const RequestEvent& ev) {
      got[i].insert(got[i].end(), ev.tokens.begin(), ev.tokens.end());
      if (ev.finished) {
        EXPECT_EQ(ev.finish_reason, "length") << ev.error;
        ++done;
      }
    });
    ASSERT_EQ(sub.status, SubmitStatus::Accepted) << sub.error;
  }
  for (int n = 0; done < static_cast<int>(prompts.size()) && n < 10000; ++n) e->scheduler().step();
  ASSERT_EQ(done, static_cast<int>(prompts.size()));
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(got[i], want[i]) << "request " << i << " (" << prompts[i].size() << " prompt tokens)";
  const TierCounts t = e->tier_counts();
  std::printf("batch of 4%s, recall %s: recalled %llu, offloaded %llu, dropped %llu, hits %llu, late %llu\n",
              auto_budget ? " (auto budgets)" : "", recall.c_str(), static_cast<unsigned long long>(t.recalled),
              static_cast<unsigned long long>(t.offloaded), static_cast<unsigned long long>(t.dropped),
              static_cast<unsigned long long>(t.hits), static_cast<unsigned long long>(t.late));
  if (recall == "ahead") {
    EXPECT_GT(t.late, 0u);
  }
  EXPECT_GT(t.recalled, 0u);
  EXPECT_GT(t.offloaded, 0u);
  EXPECT_EQ(e->kv_stats().n_used, 0);
  EXPECT_EQ(t.host_used, 0);
  EXPECT_EQ(e->kv_check(), "");
}

TEST(KvTiers, BatchedRequestsEqualAloneAllResident) { expect_batch_equal_alone(false); }

TEST(KvTiers, AutoBudgetsUnderPressureEqualAloneAllResident) { expect_batch_equal_alone(true); }

TEST(KvTiers, RecallAheadAutoBudgetsUnderPressureEqualAloneAllResident) { expect_batch_equal_alone(true, "ahead"); }

// A request whose KV is larger than the whole device pool (24 blocks of 16 tokens for a
// ~1,000-token prompt: 65 blocks): its prompt streams through the pool chunk by chunk, earlier
// chunks' pages going to the host tier to make room, and its greedy tokens equal the run with a
// pool that holds it all. Without the host tier the same pool refuses it.
TEST(KvTiers, ARequestLargerThanThePoolRuns) {
  if (!std::filesystem::exists(test::default_model_path())) GTEST_SKIP() << "default model missing: run scripts/fetch_model.sh";
  GenerateOptions g;
  g.max_tokens = 16;
  g.ignore_eos = true;
  g.sampling.temperature = 0.0f;
  for (const std::string policy : {"dense", "coverage:0.99"}) {
    std::vector<int32_t> want;
    {
      auto e = load(policy, 0.0, 0);
      want = e->generate(long_prompt(*e), g).tokens;
    }
    auto small = load(policy, 0.0, 0, /*kv_blocks=*/24);
    EXPECT_THROW(small->generate(long_prompt(*small), g), std::exception) << "the pool alone was large enough";
    for (const std::string recall : {"layer", "ahead"}) {
      auto e = load(policy, 1.0, 0, /*kv_blocks=*/24, false, recall);
      const GenerateResult r = e->generate(long_prompt(*e), g);
      EXPECT_EQ(r.tokens, want) << policy << ", recall " << recall;
      const TierCounts t = e->tier_counts();
      std::printf("%s, recall %s, pool of 24 blocks: offloaded %llu, recalled %llu, late %llu\n", policy.c_str(),
                  recall.c_str(), static_cast<unsigned long long>(t.offloaded), static_cast<unsigned long long>(t.recalled),
                  static_cast<unsigned long long>(t.late));
      EXPECT_GT(t.offloaded, 0u);
      EXPECT_EQ(e->kv_stats().n_used, 0);
      EXPECT_EQ(t.host_used, 0);
      EXPECT_EQ(e->kv_check(), "");
    }
  }
}

// Speculative decoding over the hierarchy (issue 24 with issue 23): drafts and the k + 1-row
// verifies read their pages wherever they live (the layer schedule recalls them, the ahead
// schedule reads them in place), rejected tokens roll back through TieredKv::truncate, and the
// greedy tokens equal decoding without speculation and without the host tier; with the budget of
// one layer's pages, pages move or are read in place every step. Window and seeded drafts.
TEST(KvTiers, SpeculationOverTheHostTierEqualsPlainAllResident) {
  if (!std::filesystem::exists(test::default_model_path())) GTEST_SKIP() << "default model missing: run scripts/fetch_model.sh";
  GenerateOptions g;
  g.max_tokens = 24;
  g.ignore_eos = true;
  g.sampling.temperature = 0.0f;
  int64_t budget = 0;
  {
    auto probe = load("dense", 0.0, 0);
    const int64_t n = static_cast<int64_t>(long_prompt(*probe).size()) + g.max_tokens;
    budget = probe->config().n_heads_kv * ((n + 15) / 16);
  }
  int64_t drafted = 0, accepted = 0;
  for (const std::string policy : {"dense", "coverage:0.99"}) {
    std::vector<int32_t> want;
    {
      auto e = load(policy, 0.0, 0);
      want = e->generate(long_prompt(*e), g).tokens;
    }
    for (const std::string recall : {"layer", "ahead"}) {
      auto e = load(policy, 1.0, budget, 0, false, recall);
      for (const char* draft : {"sinkwindow:2", "sinkwindow:2+3"}) {
        GenerateOptions go = g;
        go.speculative_k = 3;
        go.draft_policy = draft;
        const GenerateResult r = e->generate(long_prompt(*e), go);
        EXPECT_EQ(r.tokens, want) << policy << ", recall " << recall << ", draft " << draft;
        EXPECT_GT(r.spec_verifies, 0);
        drafted += r.spec_drafted;
        accepted += r.spec_accepted;
      }
      const TierCounts t = e->tier_counts();
      std::printf("speculation, %s, recall %s: recalled %llu, late %llu, offloaded %llu\n", policy.c_str(), recall.c_str(),
                  static_cast<unsigned long long>(t.recalled), static_cast<unsigned long long>(t.late),
                  static_cast<unsigned long long>(t.offloaded));
      EXPECT_GT(recall == "ahead" ? t.late : t.recalled, 0u) << "no page was read from the host tier";
      EXPECT_EQ(e->kv_stats().n_used, 0);
      EXPECT_EQ(t.host_used, 0);
      EXPECT_EQ(e->kv_check(), "");
    }
  }
  EXPECT_GT(accepted, 0) << "no draft accepted: the accepting path was not run";
  EXPECT_LT(accepted, drafted) << "every draft accepted: the rollback path was not run";
}

// IO-aware admission: a request that can only be admitted by offloading a running request's
// pages waits while the hierarchy's I/O load (pages moved per step over what the link moves in the
// step's time) is above SchedulerOptions::kv_io_admit_max. Request A decodes on a small pool
// under a budget that makes its layers recall every step; B arrives once A is decoding. With a
// link of 1 MB/s (--kv-io-gbps 0.001: any recall fills it) B waits until A finishes; with a link
// of 10^6 GB/s it is admitted beside A. B's greedy tokens equal its tokens alone either way.
// Request A, then B, through the engine's scheduler: A submitted, `steps_alone` steps run (A's
// prefill and first decode steps), `before_b` called, B submitted, then steps until both finished
// (at most max_steps in all). Steps are counted from 0; what each request saw is returned.
struct ABRun {
  std::vector<int32_t> got_b;
  int a_done_at = -1, b_first_at = -1;
  bool b_done = false;
};
ABRun run_a_then_b(Engine& e, const GenerateOptions& g, const std::vector<int32_t>& prompt_a,
                   const std::vector<int32_t>& prompt_b, int steps_alone, int max_steps, const std::function<void()>& before_b = {}) {
  ABRun r;
  int step = 0;
  const auto submit = [&](const std::vector<int32_t>& prompt, bool is_b) {
    RequestParams p;
    p.prompt = prompt;
    p.options = g;
    const SubmitResult sub = e.scheduler().submit(p, [&r, &step, is_b](const RequestEvent& ev) {
      if (is_b) {
        if (r.b_first_at < 0 && !ev.tokens.empty()) r.b_first_at = step;
        r.got_b.insert(r.got_b.end(), ev.tokens.begin(), ev.tokens.end());
        r.b_done = r.b_done || ev.finished;
      } else if (ev.finished) {
        r.a_done_at = step;
      }
    });
    EXPECT_EQ(sub.status, SubmitStatus::Accepted) << sub.error;
    return sub.status == SubmitStatus::Accepted;
  };
  if (!submit(prompt_a, false)) return r;
  for (; step < steps_alone; ++step) e.scheduler().step();
  EXPECT_LT(r.a_done_at, 0) << "A finished before B came";
  if (before_b) before_b();
  if (!submit(prompt_b, true)) return r;
  for (; (r.a_done_at < 0 || !r.b_done) && step < max_steps; ++step) e.scheduler().step();
  EXPECT_TRUE(r.b_done && r.a_done_at >= 0) << "A and B did not finish in " << max_steps << " steps";
  return r;
}

TEST(KvTiers, AdmissionWaitsWhileTheLinkIsBusy) {
  if (!std::filesystem::exists(test::default_model_path())) GTEST_SKIP() << "default model missing: run scripts/fetch_model.sh";
  GenerateOptions g;
  g.max_tokens = 12;
  g.ignore_eos = true;
  g.sampling.temperature = 0.0f;
  std::vector<int32_t> prompt_b, want_b;
  {
    auto plain = load("dense", 0.0, 0);
    std::string text = "Dock log.\n";  // ~150 tokens: 10 blocks, more than the pool has free beside A
    for (int i = 0; i < 10; ++i) text += "The crane lifted crate " + std::to_string(i * 3) + " onto dock " + std::to_string(i % 4) + ".\n";
    prompt_b = plain->tokenize(text + "Which dock did crate 12 go to?");
    ASSERT_GT(prompt_b.size(), 120u);
    want_b = plain->generate(prompt_b, g).tokens;
  }
  for (const double gbps : {0.001, 1e6}) {
    EngineOptions o;
    o.model_path = test::default_model_path();
    o.cpu_kv_gb = 1.0;
    o.kv_device_budget = 1700;  // of A's ~5,900 pages: its layers recall at every step
    o.kv_blocks = 24;           // 2,160 pages, ~370 free beside A: B's ~900 need A's pages offloaded
    o.kv_io_gbps = gbps;
    o.max_context = 2048;
    auto e = Engine::load(o);
    SchedulerOptions so;
    so.kv_admit_throughput = false;  // (the link's rule on its own; the throughput rule: the next test)
    e->configure_scheduler(so);
    // (A's prefill and first decode steps: the load builds up over them; then B)
    const ABRun run = run_a_then_b(*e, g, long_prompt(*e), prompt_b, 8, 2000);
    const auto& [got_b, a_done_at, b_first_at, b_done] = run;
    ASSERT_TRUE(b_done && a_done_at >= 0);
    EXPECT_EQ(got_b, want_b) << "link " << gbps << " GB/s";
    const SchedulerStats st = e->scheduler().stats();
    std::printf("link %g GB/s: A finished at step %d, B's first token at step %d; admission waits %llu, I/O load %.3g\n",
                gbps, a_done_at, b_first_at, static_cast<unsigned long long>(st.n_admission_io_waits), st.kv_io_load);
    if (gbps < 1.0) {
      EXPECT_GT(st.n_admission_io_waits, 0u);
      EXPECT_GT(b_first_at, a_done_at) << "B was admitted while the link was full";
    } else {
      EXPECT_EQ(st.n_admission_io_waits, 0u);
      EXPECT_LT(b_first_at, a_done_at) << "B waited with a link to spare";
    }
    EXPECT_EQ(e->kv_check(), "");
    EXPECT_EQ(e->tier_counts().host_used, 0);
  }
}

// IO-aware admission weighs the working sets a new request would push out of the pool, not only
// the link's load before it runs: A fits the pool alone (nothing moves, the load is 0), B needs
// A's pages offloaded. Dense decoding reads every page a step, so offloading any of A's would
// put pages on the link every step (on this slow link, several step times): B waits for A. A
// sink + window policy reads 4 pages a list, so A's other pages are cold and B runs beside it.
// Fails if admission looks at the present load alone (B would run beside A in both).
// Under each rule on its own: the load rule (--kv-io-admit load), and the throughput rule with
// the load rule's bound out of reach (--kv-io-admit-max 1e6): B's pushed-out working set, at
// least the link's 0.4 ms a page every step, outweighs anything a 135M model's step shares.
TEST(KvTiers, AdmissionWeighsTheWorkingSetsANewRequestPushesOut) {
  if (!std::filesystem::exists(test::default_model_path())) GTEST_SKIP() << "default model missing: run scripts/fetch_model.sh";
  GenerateOptions g;
  g.max_tokens = 12;
  g.ignore_eos = true;
  g.sampling.temperature = 0.0f;
  const auto log = [](const char* what, int salt) {
    std::string text = std::string(what) + " log.\n";  // ~200 tokens: 13 pages a list, 1,170 in all
    for (int i = 0; i < 14; ++i)
      text += "The crane lifted crate " + std::to_string(i * 3 + salt) + " onto dock " + std::to_string((i + salt) % 4) + ".\n";
    return text + "Which dock did crate 12 go to?";
  };
  for (const std::string rule : {"load", "throughput"})
  for (const std::string policy : {"dense", "sinkwindow:4"}) {
    std::vector<int32_t> prompt_a, prompt_b, want_b;
    {
      auto plain = load(policy, 0.0, 0);
      prompt_a = plain->tokenize(log("Dock", 0));
      prompt_b = plain->tokenize(log("Pier", 1));
      ASSERT_GT(prompt_a.size(), 180u);
      ASSERT_GT(prompt_b.size(), 180u);
      want_b = plain->generate(prompt_b, g).tokens;
    }
    EngineOptions o;
    o.model_path = test::default_model_path();
    o.policy = PolicySpec::parse(policy);
    o.cpu_kv_gb = 1.0;
    o.kv_blocks = 24;        // 2,160 pages: A's ~1,200 fit, A's and B's together do not
    o.kv_io_gbps = 0.01;     // 10 MB/s: a page a step costs ~0.4 ms, A's working set pushed out ~100 ms a step
    o.max_context = 2048;
    auto e = Engine::load(o);
    SchedulerOptions so;
    so.kv_admit_throughput = rule == "throughput";
    if (rule == "throughput") so.kv_io_admit_max = 1e6;
    e->configure_scheduler(so);
    const ABRun run = run_a_then_b(*e, g, prompt_a, prompt_b, 5, 500, [&] {
      const TierCounts c = e->tier_counts();
      EXPECT_EQ(c.recalled + c.offloaded + c.late, 0u) << policy << ": A alone should move nothing";
      EXPECT_EQ(e->scheduler().stats().kv_io_load, 0.0) << policy;
    });
    const auto& [got_b, a_done_at, b_first_at, b_done] = run;
    ASSERT_TRUE(b_done && a_done_at >= 0) << policy;
    EXPECT_EQ(got_b, want_b) << policy;
    const SchedulerStats st = e->scheduler().stats();
    std::printf("%s rule, %s: A finished at step %d, B's first token at step %d; admission waits %llu (throughput rule %llu)\n",
                rule.c_str(), policy.c_str(), a_done_at, b_first_at, static_cast<unsigned long long>(st.n_admission_io_waits),
                static_cast<unsigned long long>(st.n_admission_throughput_waits));
    EXPECT_EQ(st.n_admission_throughput_waits, rule == "throughput" ? st.n_admission_io_waits : 0u) << rule << ", " << policy;
    if (policy == "dense") {
      EXPECT_GT(st.n_admission_io_waits, 0u);
      EXPECT_GT(b_first_at, a_done_at) << "B pushed A's working set out of the pool";
    } else {
      EXPECT_EQ(st.n_admission_io_waits, 0u);
      EXPECT_LT(b_first_at, a_done_at) << "B waited though A's offloaded pages are cold";
      EXPECT_GT(e->tier_counts().offloaded, 0u) << "B should have needed A's cold pages offloaded";
    }
    EXPECT_EQ(e->kv_check(), "");
  }
}

// IO-aware admission prices a request's whole prompt, not its first chunk: with a KV hierarchy a
// prefill chunk takes at most half the pool (192 tokens here), so a long prompt's first chunk can
// fit beside a running request whose working set the rest of the prompt then pushes out, chunk by
// chunk. A (~110 tokens) decodes densely and fits; B (~380 tokens, two chunks) fits its first chunk
// in the free room but not its whole prompt beside A. On a slow link B waits for A, and its greedy
// tokens equal B alone. Fails when only the first chunk's room is checked (B is admitted at once:
// under the serving load all 16 requests were, session 32).
TEST(KvTiers, AdmissionPricesTheWholePromptNotItsFirstChunk) {
  if (!std::filesystem::exists(test::default_model_path())) GTEST_SKIP() << "default model missing: run scripts/fetch_model.sh";
  GenerateOptions g;
  g.max_tokens = 12;
  g.ignore_eos = true;
  g.sampling.temperature = 0.0f;
  const auto log = [](const char* what, int lines, int salt) {
    std::string text = std::string(what) + " log.\n";
    for (int i = 0; i < lines; ++i)
      text += "The crane lifted crate " + std::to_string(i * 3 + salt) + " onto dock " + std::to_string((i + salt) % 4) + ".\n";
    return text + "Which dock did crate 12 go to?";
  };
  std::vector<int32_t> prompt_a, prompt_b, want_b;
  {
    auto plain = load("dense", 0.0, 0);
    prompt_a = plain->tokenize(log("Dock", 7, 0));
    prompt_b = plain->tokenize(log("Pier", 27, 1));
    ASSERT_GT(prompt_a.size(), 90u);
    ASSERT_LT(prompt_a.size(), 130u);  // A: ~8 pages a list, ~720 of the pool's 2,160
    ASSERT_GT(prompt_b.size(), 340u);  // B: ~24 pages a list, ~2,160 — its first 192 tokens ~1,080
    ASSERT_LT(prompt_b.size(), 420u);
    want_b = plain->generate(prompt_b, g).tokens;
  }
  EngineOptions o;
  o.model_path = test::default_model_path();
  o.cpu_kv_gb = 1.0;
  o.kv_blocks = 24;     // 2,160 pages
  o.kv_io_gbps = 0.01;  // 10 MB/s: a page a step costs ~0.4 ms
  o.max_context = 2048;
  auto e = Engine::load(o);
  const ABRun run = run_a_then_b(*e, g, prompt_a, prompt_b, 4, 500, [&] {
    const TierCounts c = e->tier_counts();
    EXPECT_EQ(c.recalled + c.offloaded + c.late, 0u) << "A alone should move nothing";
    EXPECT_GE(e->kv_stats().n_free, 1080 + 90) << "B's first chunk (and a token of headroom) must fit beside A";
  });
  const auto& [got_b, a_done_at, b_first_at, b_done] = run;
  ASSERT_TRUE(b_done && a_done_at >= 0);
  EXPECT_EQ(got_b, want_b);
  const SchedulerStats st = e->scheduler().stats();
  std::printf("A finished at step %d, B's first token at step %d; admission waits %llu\n", a_done_at, b_first_at,
              static_cast<unsigned long long>(st.n_admission_io_waits));
  EXPECT_GT(st.n_admission_io_waits, 0u);
  EXPECT_GT(b_first_at, a_done_at) << "B's prompt pushed A's working set out of the pool";
  EXPECT_EQ(e->kv_check(), "");
  EXPECT_EQ(e->tier_counts().host_used, 0);
}

TEST(KvTiers, RefusesABudgetWithoutAHostTier) {
  if (!std::filesystem::exists(test::default_model_path())) GTEST_SKIP() << "default model missing";
  EXPECT_THROW(load("dense", 0.0, 100), std::exception);
  EXPECT_THROW(load("dense", 0.0, 0, 0, false, "ahead"), std::exception);
  EXPECT_THROW(load("dense", 1.0, 0, 0, false, "soon"), std::exception);
  EXPECT_THROW(load("dense", 0.0, 0, 0, false, "land"), std::exception);
}

}  // namespace
}  // namespace dhs
