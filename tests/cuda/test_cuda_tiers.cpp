// The KV hierarchy on the CUDA backend (issue 23; docs/hierarchy.md "Recall ahead"): the default
// model's greedy tokens with a host tier of pinned DRAM and a device budget of one layer's pages
// (so every decode step reads most pages in place from the host tier, zero-copy, and merges them
// by LSE with the resident ones) equal the tokens with everything in HBM, dense and coverage
// γ 0.99 on the 4-bit key sketch (the offloaded pages' sketch rows move with them: the selection
// scores them wherever they are); the late reads are counted, pages come back after steps, and
// both tiers' accounting is clean afterwards; the same under speculative decoding. Then four requests batched under the cache
// manager's budgets over a small pool (prompt chunks and decode rows share steps: prefill reads
// both tiers too), each equal to its tokens alone; and a prompt longer than the HBM pool.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "dhisparse/engine.h"
#include "dhisparse/policy.h"
#include "dhisparse/scheduler.h"
#include "gtest_shim.h"
#include "test_paths.h"
#include "tiny_llama.h"

namespace {

using namespace dhs;
using test::have_gpu;

std::unique_ptr<Engine> load(const std::string& policy, double cpu_kv_gb, int64_t budget, int64_t kv_blocks = 0,
                             bool auto_budget = false, int64_t max_context = 2048, const std::string& recall = "ahead") {
  EngineOptions o;
  o.model_path = test::default_model_path();
  o.device = "cuda";
  o.policy = PolicySpec::parse(policy);
  o.cpu_kv_gb = cpu_kv_gb;
  o.kv_device_budget = budget;
  o.kv_budget_auto = auto_budget;
  o.kv_recall = cpu_kv_gb > 0 ? recall : "layer";
  o.kv_blocks = kv_blocks;
  o.max_context = max_context;
  if (kv_blocks > 0) o.max_batch = 4;
  return Engine::load(o);
}

std::vector<int32_t> long_prompt(const Engine& e) {
  std::string text = "Notes from the archive, read them carefully.\n";
  for (int i = 0; i < 40; ++i)
    text += "Entry " + std::to_string(i) + ": the keeper of shelf " + std::to_string(i * 7 % 13) +
            " moved the blue ledger to room " + std::to_string(100 + i) + ".\n";
  text += "The special code word is PELICAN. Entry 41: nothing moved.\nQuestion: what is the special code word?\nAnswer:";
  return e.tokenize(text);
}

void expect_same_tokens(const std::string& policy, const std::string& recall = "ahead", TierCounts* counts = nullptr) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  if (!std::filesystem::exists(test::default_model_path())) GTEST_SKIP() << "default model missing";
  GenerateOptions g;
  g.max_tokens = 24;
  g.ignore_eos = true;
  g.sampling.temperature = 0.0f;
  std::vector<int32_t> want;
  {
    auto e = load(policy, 0.0, 0);
    want = e->generate(long_prompt(*e), g).tokens;
  }
  auto e = load(policy, 1.0, 0);
  const int64_t n = static_cast<int64_t>(long_prompt(*e).size()) + g.max_tokens;
  const int64_t one_layer = e->config().n_heads_kv * ((n + 15) / 16);
  e.reset();
  e = load(policy, 1.0, one_layer, 0, false, 2048, recall);
  const GenerateResult r = e->generate(long_prompt(*e), g);
  EXPECT_TRUE(r.tokens == want) << policy << ", --kv-recall " << recall << ": greedy tokens differ with the host tier";
  const TierCounts t = e->tier_counts();
  std::printf("cuda %s (%s): %zu tokens; hits %llu, late (read in place) %llu, recalled %llu, offloaded %llu, dropped %llu\n",
              policy.c_str(), recall.c_str(), r.tokens.size(), static_cast<unsigned long long>(t.hits), static_cast<unsigned long long>(t.late),
              static_cast<unsigned long long>(t.recalled), static_cast<unsigned long long>(t.offloaded),
              static_cast<unsigned long long>(t.dropped));
  EXPECT_GT(t.late, 30u * static_cast<uint64_t>(g.max_tokens)) << "steps did not read pages in place";
  EXPECT_GT(t.hits, 0u) << "the steps' resident reads were not recorded";
  if (policy != "dense" || recall == "land") {
    EXPECT_GT(t.recalled, 0u) << "no page came back between steps (or landed in one)";
  }
  EXPECT_GT(t.offloaded, 0u);
  EXPECT_EQ(e->kv_stats().n_used, 0);
  EXPECT_EQ(t.host_used, 0);
  EXPECT_EQ(e->kv_check(), "");
  if (counts) *counts = t;
}

TEST(CudaTiers, DenseGreedyTokensEqualAllResident) { expect_same_tokens("dense"); }
TEST(CudaTiers, CoverageGreedyTokensEqualAllResident) { expect_same_tokens("coverage:0.99"); }
// Landing (--kv-recall land): late pages copied into reserved HBM slots in the step and read from
// there, adopted after it; the same tokens, every page back and both tiers' accounting clean.
TEST(CudaTiers, LandingDenseGreedyTokensEqualAllResident) { expect_same_tokens("dense", "land"); }
TEST(CudaTiers, LandingCoverageGreedyTokensEqualAllResident) { expect_same_tokens("coverage:0.99", "land"); }

void expect_batch_equals_alone(const std::string& recall) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  if (!std::filesystem::exists(test::default_model_path())) GTEST_SKIP() << "default model missing";
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
  int64_t blocks = 0;
  for (const auto& pr : prompts) blocks += (static_cast<int64_t>(pr.size()) + g.max_tokens + 15) / 16;
  auto e = load("coverage:0.99", 1.0, 0, blocks * 7 / 10, /*auto_budget=*/true, 2048, recall);
  std::vector<std::vector<int32_t>> got(prompts.size());
  int done = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    RequestParams p;
    p.prompt = prompts[i];
    p.options = g;
    const SubmitResult sub = e->scheduler().submit(p, [&, i](const RequestEvent& ev) {
      got[i].insert(got[i].end(), ev.tokens.begin(), ev.tokens.end());
      if (ev.finished) {
        EXPECT_TRUE(ev.finish_reason == "length") << ev.error;
        ++done;
      }
    });
    ASSERT_TRUE(sub.status == SubmitStatus::Accepted) << sub.error;
  }
  for (int n = 0; done < static_cast<int>(prompts.size()) && n < 10000; ++n) e->scheduler().step();
  ASSERT_EQ(done, static_cast<int>(prompts.size()));
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_TRUE(got[i] == want[i]) << recall << ": request " << i;
  const TierCounts t = e->tier_counts();
  std::printf("cuda batch of 4 (auto budgets, %s): late %llu, recalled %llu, offloaded %llu, hits %llu\n", recall.c_str(),
              static_cast<unsigned long long>(t.late), static_cast<unsigned long long>(t.recalled),
              static_cast<unsigned long long>(t.offloaded), static_cast<unsigned long long>(t.hits));
  EXPECT_EQ(e->kv_stats().n_used, 0);
  EXPECT_EQ(t.host_used, 0);
  EXPECT_EQ(e->kv_check(), "");
}

// Prompt chunks and decode rows share steps here: a decode row beside a chunk reads its coverage
// pages over both tiers as a decode step does (CudaModelOptions::mixed_decode_attention), its late
// pages read in place and recalled after the step, or landed in the step.
TEST(CudaTiers, BatchedUnderAutoBudgetsEqualAlone) { expect_batch_equals_alone("ahead"); }
TEST(CudaTiers, LandingBatchedUnderAutoBudgetsEqualAlone) { expect_batch_equals_alone("land"); }

// The landing (or, on the plain recall-ahead schedule, the in-place reads) on a second stream beside
// the resident part's attention (CudaModelOptions::overlap_landing, DHS_LAND_OVERLAP=1 in the
// runner): three parts merged by LSE instead of two, the same records; the same greedy tokens as
// all-resident, alone and batched under auto budgets, and both tiers' accounting clean.
struct OverlapLanding {
  OverlapLanding() { setenv("DHS_LAND_OVERLAP", "1", 1); }
  ~OverlapLanding() { unsetenv("DHS_LAND_OVERLAP"); }
};
TEST(CudaTiers, OverlappedLandingGreedyTokensEqualAllResident) {
  OverlapLanding on;
  expect_same_tokens("dense", "land");
  expect_same_tokens("coverage:0.99", "land");
  expect_same_tokens("coverage:0.99", "ahead");
}
TEST(CudaTiers, OverlappedLandingBatchedUnderAutoBudgetsEqualAlone) {
  OverlapLanding on;
  expect_batch_equals_alone("land");
}

// The LRU mirrored in HBM (--kv-lru-mirror on; DHS_LRU_MIRROR=1 in the runner): each decode step
// writes its reads as the LRU's last uses in HBM, counts them per request there, and the host
// takes the copy instead of scanning read stamps. The same greedy tokens as all-resident, and the
// same hits, late reads, recalls and evictions as with the stamps' scan alone (landing and the
// recall-ahead schedule); batched under auto budgets (mixed steps among them), the same tokens.
struct LruMirrorOn {
  LruMirrorOn() { setenv("DHS_LRU_MIRROR", "1", 1); }
  ~LruMirrorOn() { unsetenv("DHS_LRU_MIRROR"); }
};
// rel: the relative difference allowed per count (0: equal).
void expect_counts_equal(const TierCounts& a, const TierCounts& b, const std::string& what, double rel = 0.0) {
  const auto near = [rel](uint64_t x, uint64_t y) {
    const double d = x > y ? double(x - y) : double(y - x);
    return d <= rel * double(std::max(x, y));
  };
  EXPECT_PRED2(near, a.hits, b.hits) << what << ": hits";
  EXPECT_PRED2(near, a.late, b.late) << what << ": late";
  EXPECT_PRED2(near, a.recalled, b.recalled) << what << ": recalled";
  EXPECT_PRED2(near, a.offloaded, b.offloaded) << what << ": offloaded";
  EXPECT_PRED2(near, a.dropped, b.dropped) << what << ": dropped";
}
TEST(CudaTiers, MirroredLruEqualsTheStampsScan) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  if (!std::filesystem::exists(test::default_model_path())) GTEST_SKIP() << "default model missing";
  for (const std::string recall : {"land", "ahead"}) {
    TierCounts scan, mirror;
    expect_same_tokens("coverage:0.99", recall, &scan);
    {
      LruMirrorOn on;
      expect_same_tokens("coverage:0.99", recall, &mirror);
    }
    // On the recall-ahead schedule the two are equal count for count (H100, 5c62133: hits 5,999,
    // late 45,889, recalled 2,950 both ways, every run). With landing, whether a page lands before
    // the step that reads it is a race with the copy engine, so the scan's own counts differ from
    // run to run: hits 5,691-5,727 over three runs of the same binary (0.6%), late and recalled
    // 0.1%. 2% allows that spread and still fails the bug it guards against (adoptions in flight
    // not counted for their new owner: hits 40% short).
    expect_counts_equal(scan, mirror, "alone, " + recall, recall == "land" ? 0.02 : 0.0);
  }
  // (batched, admission follows the measured link load — timing — so only the tokens and the
  // accounting are compared, not the counts of two runs)
  LruMirrorOn on;
  expect_batch_equals_alone("land");
}

// A prompt whose KV is larger than the HBM pool (~3,000 tokens: two prefill chunks of up to 2,048;
// a pool of 160 blocks of 16 tokens holds the first chunk and not the prompt): the second chunk's
// attention reads the first chunk's offloaded pages in place from the host tier
// (LlamaCuda::attention_prefill over both tiers), and the greedy tokens equal the run with a pool
// that holds it all. Without the host tier the same pool refuses it.
TEST(CudaTiers, APromptLongerThanThePoolPrefills) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  if (!std::filesystem::exists(test::default_model_path())) GTEST_SKIP() << "default model missing";
  GenerateOptions g;
  g.max_tokens = 16;
  g.ignore_eos = true;
  g.sampling.temperature = 0.0f;
  const auto prompt_of = [](const Engine& e) {
    std::string text = "Notes from the archive, read them carefully.\n";
    for (int i = 0; i < 150; ++i)
      text += "Entry " + std::to_string(i) + ": the keeper of shelf " + std::to_string(i * 7 % 13) +
              " moved the blue ledger to room " + std::to_string(100 + i) + ".\n";
    text += "The special code word is PELICAN. Entry 151: nothing moved.\nQuestion: what is the special code word?\nAnswer:";
    return e.tokenize(text);
  };
  constexpr int64_t kCtx = 4096, kBlocks = 160;
  for (const std::string policy : {"dense", "coverage:0.99"}) {
    std::vector<int32_t> want;
    {
      auto e = load(policy, 0.0, 0, 0, false, kCtx);
      const std::vector<int32_t> prompt = prompt_of(*e);
      ASSERT_GT(static_cast<int64_t>(prompt.size()), 16 * kBlocks) << "the prompt should not fit the small pool";
      ASSERT_LT(static_cast<int64_t>(prompt.size()) + g.max_tokens, kCtx);
      want = e->generate(prompt, g).tokens;
    }
    {
      auto small = load(policy, 0.0, 0, kBlocks, false, kCtx);
      EXPECT_THROW(small->generate(prompt_of(*small), g), std::exception) << "the pool alone was large enough";
    }
    auto e = load(policy, 1.0, 0, kBlocks, false, kCtx);
    const GenerateResult r = e->generate(prompt_of(*e), g);
    EXPECT_TRUE(r.tokens == want) << policy << ": greedy tokens differ with the prompt's pages in two tiers";
    const TierCounts t = e->tier_counts();
    std::printf("cuda %s, prompt over a pool of %lld blocks: offloaded %llu, recalled %llu, late %llu\n", policy.c_str(),
                static_cast<long long>(kBlocks), static_cast<unsigned long long>(t.offloaded),
                static_cast<unsigned long long>(t.recalled), static_cast<unsigned long long>(t.late));
    EXPECT_GT(t.offloaded, 0u) << "nothing left HBM: the prompt fit after all";
    EXPECT_EQ(e->kv_stats().n_used, 0);
    EXPECT_EQ(t.host_used, 0);
    EXPECT_EQ(e->kv_check(), "");
  }
}

// Speculative decoding over the host tier on the GPU: draft steps (window and seeded) and the
// k + 1-row verifies split their lists by tier like any decode step, their late reads are logged
// by sequence (per-row selections: one attention request per verify row), rejected tokens roll
// back through TieredKv::truncate; the greedy tokens equal plain decoding all-resident. Dense with
// one shared verify set and coverage 0.99 with per-row sets: both exact (test_cuda_verify).
TEST(CudaTiers, SpeculationOverTheHostTierEqualsPlainAllResident) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  if (!std::filesystem::exists(test::default_model_path())) GTEST_SKIP() << "default model missing";
  GenerateOptions g;
  g.max_tokens = 24;
  g.ignore_eos = true;
  g.sampling.temperature = 0.0f;
  int64_t drafted = 0, accepted = 0;
  for (const auto& [policy, selection] : {std::pair<std::string, std::string>{"dense", "last-row"}, {"coverage:0.99", "per-row"}}) {
    const auto engine = [&](double cpu_kv_gb, int64_t budget) {
      EngineOptions o;
      o.model_path = test::default_model_path();
      o.device = "cuda";
      o.policy = PolicySpec::parse(policy);
      o.verify_selection = selection;
      o.cpu_kv_gb = cpu_kv_gb;
      o.kv_device_budget = budget;
      o.kv_recall = cpu_kv_gb > 0 ? "ahead" : "layer";
      o.max_context = 2048;
      return Engine::load(o);
    };
    std::vector<int32_t> want;
    int64_t one_layer = 0;
    {
      auto e = engine(0.0, 0);
      const std::vector<int32_t> prompt = long_prompt(*e);
      want = e->generate(prompt, g).tokens;
      one_layer = e->config().n_heads_kv * ((static_cast<int64_t>(prompt.size()) + g.max_tokens + 15) / 16);
    }
    auto e = engine(1.0, one_layer);
    for (const char* draft : {"sinkwindow:2", "sinkwindow:2+3"}) {
      GenerateOptions go = g;
      go.speculative_k = 3;
      go.draft_policy = draft;
      const GenerateResult r = e->generate(long_prompt(*e), go);
      EXPECT_TRUE(r.tokens == want) << policy << " " << selection << ", draft " << draft;
      EXPECT_GT(r.spec_verifies, 0);
      drafted += r.spec_drafted;
      accepted += r.spec_accepted;
    }
    const TierCounts t = e->tier_counts();
    std::printf("cuda speculation, %s (%s): late %llu, recalled %llu, offloaded %llu\n", policy.c_str(), selection.c_str(),
                static_cast<unsigned long long>(t.late), static_cast<unsigned long long>(t.recalled),
                static_cast<unsigned long long>(t.offloaded));
    EXPECT_GT(t.late, 0u) << "no step read pages in place";
    EXPECT_EQ(e->kv_stats().n_used, 0);
    EXPECT_EQ(t.host_used, 0);
    EXPECT_EQ(e->kv_check(), "");
  }
  EXPECT_GT(accepted, 0) << "no draft accepted: the accepting path was not run";
  EXPECT_LT(accepted, drafted) << "every draft accepted: the rollback path was not run";
}

TEST(CudaTiers, RefusesTheLayerSchedule) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  if (!std::filesystem::exists(test::default_model_path())) GTEST_SKIP() << "default model missing";
  EngineOptions o;
  o.model_path = test::default_model_path();
  o.device = "cuda";
  o.cpu_kv_gb = 1.0;
  o.kv_recall = "layer";
  bool refused = false;
  try {
    Engine::load(o);
  } catch (const std::exception& ex) {
    refused = std::string(ex.what()).find("--kv-recall ahead") != std::string::npos;
  }
  EXPECT_TRUE(refused) << "the layer schedule on the GPU was not refused with its reason";
}

}  // namespace
