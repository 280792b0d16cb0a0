// gpu_page_data (engine/step_runner.h): which page data the CUDA backend keeps for an engine's
// sparse options. Each kind costs HBM and a kernel per layer and step, so a generate run keeps only
// its estimator's, and eval (keep_all_estimators) keeps every kind.
#include <gtest/gtest.h>

#include "core/error.h"
#include "engine/step_runner.h"

namespace {

dhs::EngineOptions opts(const std::string& policy, const std::string& estimator, bool all = false) {
  dhs::EngineOptions o;
  o.policy = dhs::PolicySpec::parse(policy == std::string("topk") ? "topk:4" : policy);
  o.policy.estimator = estimator;
  o.keep_all_estimators = all;
  return o;
}

TEST(GpuPageData, DenseKeepsNothing) {
  for (const bool all : {false, true}) {
    const auto d = dhs::gpu_page_data(opts("dense", "sketch4", all));
    EXPECT_EQ(d.summaries, "none");
    EXPECT_FALSE(d.key_sketch);
  }
}

TEST(GpuPageData, SparseKeepsWhatTheEstimatorReads) {
  struct Case { const char* estimator; const char* summaries; bool sketch; };
  for (const Case& c : {Case{"sketch4", "none", true}, Case{"minmax", "minmax", false},
                        Case{"meanspread", "meanspread", false}, Case{"gaussian", "meanspread", false}}) {
    for (const char* policy : {"coverage", "topk", "solohead"}) {
      const auto d = dhs::gpu_page_data(opts(policy, c.estimator));
      EXPECT_EQ(d.summaries, c.summaries) << policy << " " << c.estimator;
      EXPECT_EQ(d.key_sketch, c.sketch) << policy << " " << c.estimator;
    }
  }
}

TEST(GpuPageData, EvalKeepsEveryKind) {
  for (const char* est : {"sketch4", "minmax", "gaussian"}) {
    const auto d = dhs::gpu_page_data(opts("coverage", est, true));
    EXPECT_EQ(d.summaries, "both");
    EXPECT_TRUE(d.key_sketch);
  }
}

TEST(GpuPageData, UnknownEstimatorIsAClearError) {
  try {
    (void)dhs::gpu_page_data(opts("coverage", "psketch4:32"));
    FAIL() << "no error";
  } catch (const dhs::Error& e) {
    EXPECT_NE(std::string(e.what()).find("psketch4:32"), std::string::npos) << e.what();
  }
}

}  // namespace
