// Speculative sampling on the default model's own distributions: at one position of a long prompt,
// the draft's distribution q (sink + 2 recent pages) and the verifier's p (every page), both through
// the Sampler's transform at temperature 1, top-p 0.95. 100,000 acceptance cycles of one draft:
// the first emitted token must pass Pearson's chi-square at the 1% level against p (bins of
// expected count >= 5, the rest pooled), and never be a token outside p's support. The draft must
// differ from the verifier (total variation > 0.05), or the check would be void.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "dhisparse/engine.h"
#include "engine/sampler.h"
#include "engine/spec_accept.h"
#include "engine/step_runner.h"
#include "kv/page_table.h"
#include "model/model_loader.h"
#include "test_paths.h"

namespace dhs {
namespace {

// The chi-square distribution's 99th percentile (Wilson-Hilferty; within 1% for df >= 5).
double critical_1pct(int df) {
  const double z = 2.3263, a = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

TEST(SpecSampling, DefaultModelFirstTokenIsDistributedAsTheVerifiers) {
  if (!std::filesystem::exists(test::default_model_path())) GTEST_SKIP() << "default model missing";
  EngineOptions eo;
  eo.model_path = test::default_model_path();
  const auto engine = Engine::load(eo);
  // Free text whose next word is open (a list's next item would be one token with p ~ 1).
  const std::string text =
      "The harbour town woke slowly. Fishermen argued about the weather, a baker burned the first "
      "loaves, and children ran along the wall where the old cannons still pointed at the sea. ";
  std::string prompt;
  for (int i = 0; i < 12; ++i) prompt += text;
  const std::vector<int32_t> ids = engine->tokenize(prompt + "That morning, the mayor");
  const int64_t n_vocab = engine->vocab_size();

  EngineOptions ro;
  ro.kv_blocks = 64;
  const auto src = open_weights(test::default_model_path());
  auto runner = make_cpu_runner(*src, ro, 1024);
  const ModelConfig& c = runner->config();
  PageTable t(static_cast<int>(c.n_layers), static_cast<int>(c.n_heads_kv), ro.page_size);
  const int64_t n = static_cast<int64_t>(ids.size()) - 1;
  ASSERT_TRUE(t.reserve(runner->pages(), n + 1));
  StepOutput out;
  runner->step({StepRequest{&t, 0, ids.data(), n}}, &out, false);
  // The last token decoded on the draft's pages, then (after the rollback) on every page.
  const PolicySpec draft = PolicySpec::parse("sinkwindow:2");
  StepRequest row{&t, 0, ids.data() + n, 1};
  row.policy = &draft;
  runner->step({row}, &out, true);
  std::vector<float> q_logits = out.logits;
  runner->truncate(t, n);
  ASSERT_TRUE(t.reserve(runner->pages(), 1));
  row.policy = nullptr;
  runner->step({row}, &out, true);
  std::vector<float> p_logits = out.logits;
  t.release(runner->pages());

  SamplingParams sp;
  sp.temperature = 1.0f;
  sp.top_p = 0.95f;
  sp.seed = 1;
  Sampler rng(sp);
  TokenDist q, p;
  rng.distribution(q_logits.data(), n_vocab, {}, &q);
  rng.distribution(p_logits.data(), n_vocab, {}, &p);
  double tv = 0.0;
  std::map<int32_t, bool> support;
  for (int32_t id : p.ids) support[id] = true;
  for (int32_t id : q.ids) support[id] = true;
  for (const auto& [id, _] : support) tv += 0.5 * std::fabs(p.prob(id) - q.prob(id));
  ASSERT_GT(tv, 0.05) << "the draft's distribution equals the verifier's here: the check is void";

  constexpr int kTrials = 100000;
  std::map<int32_t, int64_t> seen;
  for (int i = 0; i < kTrials; ++i) {
    const std::vector<int32_t> d = {rng.draw(q)};
    const SpecVerdict v = accept_sampled(d, {q}, {p, p}, rng);
    ++seen[v.accepted > 0 ? d[0] : v.next];
  }
  for (const auto& [id, count] : seen) EXPECT_GT(p.prob(id), 0.0) << "token " << id << " is outside p's support";
  double x2 = 0.0, pooled_e = 0.0, pooled_o = 0.0;
  int bins = 0;
  for (int32_t id : p.ids) {
    const double e = p.prob(id) * kTrials;
    const double o = static_cast<double>(seen.count(id) ? seen[id] : 0);
    if (e < 5.0) {
      pooled_e += e;
      pooled_o += o;
      continue;
    }
    x2 += (o - e) * (o - e) / e;
    ++bins;
  }
  if (pooled_e > 0.0) {
    x2 += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e;
    ++bins;
  }
  ASSERT_GE(bins, 6) << "too few bins for the check to mean much";
  EXPECT_LT(x2, critical_1pct(bins - 1)) << bins << " bins, total variation p-q " << tv;
  RecordProperty("bins", bins);
  RecordProperty("tv", std::to_string(tv));
}

}  // namespace
}  // namespace dhs
