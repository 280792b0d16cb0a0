// Budget traces (src/eval/budget_trace.h): what `dhisparse eval --trace-out` writes is read back,
// mapped onto another model's layers x KV heads by relative depth and head mod n, and bad files
// are refused with a message.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "eval/budget_trace.h"

namespace dhs {
namespace {

std::string write(const std::string& name, const std::string& text) {
  const std::string p = testing::TempDir() + name;
  std::ofstream(p) << text;
  return p;
}

// 3 layers x 2 heads; "coverage-0.99" at two lengths.
const char* kTrace = R"({"model": "m", "n_layers": 3, "n_heads_kv": 2, "policies": {
  "coverage-0.99": {"1024": {"read": [1, 2, 3, 4, 5, 6], "total": [10, 10, 10, 10, 10, 0]},
                    "4096": {"read": [10, 20, 30, 40, 50, 60], "total": [100, 100, 100, 100, 100, 100]}},
  "topk-32": {"1024": {"read": [1, 1, 1, 1, 1, 1], "total": [4, 4, 4, 4, 4, 4]}}}})";

TEST(BudgetTrace, ReadsTheLongestLengthByDefaultAndMapsByDepth) {
  const std::string p = write("trace_ok.json", kTrace);
  const BudgetTrace t = load_budget_trace(p, "coverage-0.99");
  EXPECT_EQ(t.length, 4096);
  ASSERT_EQ(t.frac.size(), 6u);
  EXPECT_DOUBLE_EQ(t.frac[0], 0.1);
  EXPECT_DOUBLE_EQ(t.frac[5], 0.6);
  EXPECT_NEAR(t.mean(), 0.35, 1e-12);
  // 6 layers x 4 heads: layer l -> l * 3 / 6, head h -> h % 2.
  const std::vector<float> m = t.mapped(6, 4);
  ASSERT_EQ(m.size(), 24u);
  EXPECT_FLOAT_EQ(m[0 * 4 + 0], 0.1f);  // (0, 0) <- (0, 0)
  EXPECT_FLOAT_EQ(m[1 * 4 + 3], 0.2f);  // (1, 3) <- (0, 1)
  EXPECT_FLOAT_EQ(m[2 * 4 + 2], 0.3f);  // (2, 2) <- (1, 0)
  EXPECT_FLOAT_EQ(m[5 * 4 + 1], 0.6f);  // (5, 1) <- (2, 1)
  // An explicit length; a list with no pages counted reads as 1 (dense).
  const BudgetTrace s = load_budget_trace(p, "coverage-0.99", 1024);
  EXPECT_DOUBLE_EQ(s.frac[1], 0.2);
  EXPECT_DOUBLE_EQ(s.frac[5], 1.0);
  const auto labels = budget_trace_labels(p);
  EXPECT_EQ(labels.size(), 2u);
}

TEST(BudgetTrace, RefusesMissingAndMalformedInput) {
  const std::string p = write("trace_ok2.json", kTrace);
  EXPECT_THROW(load_budget_trace(p, "coverage-0.5"), Error);
  EXPECT_THROW(load_budget_trace(p, "coverage-0.99", 999), Error);
  EXPECT_THROW(load_budget_trace(testing::TempDir() + "no_such_trace.json", "x"), Error);
  EXPECT_THROW(load_budget_trace(write("trace_bad.json", "{not json"), "x"), Error);
  EXPECT_THROW(load_budget_trace(write("trace_short.json",
                                       R"({"n_layers": 3, "n_heads_kv": 2, "policies": {"a": {"8": {"read": [1], "total": [1]}}}})"),
                                 "a"),
               Error);
  EXPECT_THROW(load_budget_trace(write("trace_shape.json", R"({"n_layers": 0, "n_heads_kv": 2, "policies": {}})"), "a"),
               Error);
}

}  // namespace
}  // namespace dhs
