// PolicySpec (dhisparse/policy.h): the one grammar of sparse policies. Every rule parses from
// its canonical spelling and back; bad text fails with a message naming it; defaults supply the
// fields the text leaves out; keys differ exactly when policies do.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "dhisparse/policy.h"

namespace dhs {
namespace {

TEST(PolicySpec, ParsesEveryRuleAndSpellsItBack) {
  struct Case {
    const char* text;
    SelectRule rule;
    double gamma;
    int budget;
    double frac;
    int reselect;
    const char* estimator;
  };
  for (const Case& c : {Case{"dense", SelectRule::Dense, 0.99, 0, 0.25, 1, "sketch4"},
                        Case{"coverage:0.95", SelectRule::Coverage, 0.95, 0, 0.25, 1, "sketch4"},
                        Case{"coverage:0.99/2@minmax", SelectRule::Coverage, 0.99, 0, 0.25, 2, "minmax"},
                        Case{"topk:64@gaussian", SelectRule::TopK, 0.99, 64, 0.25, 1, "gaussian"},
                        Case{"sinkwindow:32", SelectRule::SinkWindow, 0.99, 32, 0.25, 1, "sketch4"},
                        Case{"solohead:0.98", SelectRule::SoloHead, 0.98, 0, 0.25, 1, "sketch4"},
                        Case{"solohead:64/4", SelectRule::SoloHead, 0.99, 64, 0.25, 4, "sketch4"},
                        Case{"topfrac:0.3@meanspread", SelectRule::TopFrac, 0.99, 0, 0.3, 1, "meanspread"}}) {
    SCOPED_TRACE(c.text);
    const PolicySpec p = PolicySpec::parse(c.text);
    EXPECT_EQ(p.rule, c.rule);
    EXPECT_DOUBLE_EQ(p.gamma, c.gamma);
    EXPECT_EQ(p.budget, c.budget);
    EXPECT_DOUBLE_EQ(p.frac, c.frac);
    EXPECT_EQ(p.reselect_every, c.reselect);
    EXPECT_EQ(p.estimator, c.estimator);
    EXPECT_EQ(PolicySpec::parse(p.str()), p) << p.str();
  }
  EXPECT_EQ(PolicySpec::parse("coverage:0.99/2@minmax").str(), "coverage:0.99/2@minmax");
  EXPECT_EQ(PolicySpec::parse("dense").str(), "dense");
  EXPECT_EQ(PolicySpec::parse("sinkwindow:8").str(), "sinkwindow:8");  // no estimator: it scores nothing
  // A seeded draft: window pages + the verifier's heaviest pages.
  const PolicySpec seeded = PolicySpec::parse("sinkwindow:16+8");
  EXPECT_EQ(seeded.budget, 16);
  EXPECT_EQ(seeded.seed_pages, 8);
  EXPECT_EQ(seeded.str(), "sinkwindow:16+8");
  EXPECT_EQ(PolicySpec::parse(seeded.str()), seeded);
  EXPECT_EQ(PolicySpec::parse("sinkwindow:+4").seed_pages, 4);
  EXPECT_EQ(PolicySpec::parse(PolicySpec::parse("sinkwindow:+4").str()), PolicySpec::parse("sinkwindow:+4"));
  EXPECT_EQ(seeded.label("sketch4"), "sinkwindow-16+8");
  EXPECT_NE(seeded.key(), PolicySpec::parse("sinkwindow:16").key());
}

TEST(PolicySpec, DefaultsSupplyWhatTheTextLeavesOut) {
  PolicySpec d;
  d.gamma = 0.9;
  d.budget = 16;
  d.n_sink = 2;
  d.n_recent = 3;
  d.combine = GroupCombine::Max;
  d.estimator = "minmax";
  d.dense_below = 1000;
  const PolicySpec cov = PolicySpec::parse("coverage", d);
  EXPECT_EQ(cov.rule, SelectRule::Coverage);
  EXPECT_DOUBLE_EQ(cov.gamma, 0.9);
  EXPECT_EQ(cov.n_sink, 2);
  EXPECT_EQ(cov.n_recent, 3);
  EXPECT_EQ(cov.combine, GroupCombine::Max);
  EXPECT_EQ(cov.estimator, "minmax");
  EXPECT_EQ(cov.dense_below, 1000);
  EXPECT_EQ(PolicySpec::parse("topk", d).budget, 16);
  EXPECT_DOUBLE_EQ(PolicySpec::parse("coverage:0.5", d).gamma, 0.5);
  // solohead's value is a mass up to 1 and a page count above it.
  EXPECT_EQ(PolicySpec::parse("solohead:1", d).budget, 0);
  EXPECT_EQ(PolicySpec::parse("solohead:2", d).budget, 2);
}

TEST(PolicySpec, BadTextFailsNamingIt) {
  auto fails = [](const std::string& text, const std::string& fragment) {
    try {
      (void)PolicySpec::parse(text);
      ADD_FAILURE() << "'" << text << "' parsed";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << text << ": " << e.what();
    }
  };
  fails("nope", "unknown policy 'nope'");
  fails("nope", "topfrac:F");  // the list of rules comes with it
  fails("coverage:", "give a value");
  fails("coverage:1.5", "'1.5' is not a mass in");
  fails("coverage:0", "is not a mass");
  fails("coverage:abc", "'abc' is not a mass");
  fails("coverage:0.9x", "is not a mass");
  fails("topk:0", "is not a page count");
  fails("topk:2.5", "whole number");
  fails("topk", "needs --budget");
  fails("topfrac:0", "is not a fraction");
  fails("coverage:0.9/0", "is not a step count");
  fails("coverage:0.9/65", "is not a step count");
  fails("dense:3", "takes no value");
  fails("dense/2", "selects nothing to reuse");
  fails("coverage:0.9@", "give an estimator");
  fails("coverage:0.9@bogus", "bogus");
  fails("topk:8+2", "only sinkwindow takes seed pages");
  fails("sinkwindow:8+0", "is not a seed page count");
  fails("sinkwindow:8+x", "is not a seed page count");
}

TEST(PolicySpec, KeysDifferExactlyWhenPoliciesDo) {
  const PolicySpec a = PolicySpec::parse("coverage:0.99@sketch4");
  PolicySpec b = a;
  EXPECT_EQ(a.key(), b.key());
  for (int field = 0; field < 7; ++field) {
    b = a;
    switch (field) {
      case 0: b.gamma = 0.98; break;
      case 1: b.estimator = "minmax"; break;
      case 2: b.combine = GroupCombine::Max; break;
      case 3: b.n_sink = 2; break;
      case 4: b.n_recent = 4; break;
      case 5: b.reselect_every = 2; break;
      case 6: b.min_step_tokens = 5; break;
    }
    EXPECT_NE(a.key(), b.key()) << field;
  }
  EXPECT_EQ(PolicySpec::parse("coverage:0.95/2@minmax").label("sketch4"), "coverage-0.95-minmax-r2");
  EXPECT_EQ(PolicySpec::parse("topk:64").label("sketch4"), "topk-64");
  EXPECT_EQ(PolicySpec::parse("dense").label("sketch4"), "dense");
}

}  // namespace
}  // namespace dhs
