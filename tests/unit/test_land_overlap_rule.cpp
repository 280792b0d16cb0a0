// LandOverlapRule (kv/land_overlap_rule.h): the per-step choice of the landing beside the resident
// attention, and its spellings. The threshold is bytes a layer of the last decode step's claims.
#include <gtest/gtest.h>

#include "kv/land_overlap_rule.h"

using namespace dhs;

TEST(LandOverlapRule, AutoTakesTheStepsAfterOnesThatLandedTheThresholdALayer) {
  LandOverlapRule r = *LandOverlapRule::parse("auto");
  ASSERT_EQ(r.min_bytes_per_layer, int64_t{2} << 20);
  const int64_t page = 8192, layers = 32;  // the 8B shape's K + V head-page of 16 tokens
  // 2 MiB a layer: 256 pages a layer, 8,192 over 32 layers
  EXPECT_FALSE(r.take(8191, page, layers));
  EXPECT_TRUE(r.take(8192, page, layers));
  // session 38's two measurements: ~13.6 MB a layer on the harness, ~0.2 MB under serving
  EXPECT_TRUE(r.take(static_cast<int64_t>(0.436e9) / page, page, layers));
  EXPECT_FALSE(r.take(45 * 30, 4096, 30));
  // no history, or nothing late: serial
  EXPECT_FALSE(r.take(0, page, layers));
  EXPECT_FALSE(r.take(-1, page, layers));
  EXPECT_FALSE(r.take(100000, 0, layers));
  EXPECT_FALSE(r.take(100000, page, 0));
  r.min_bytes_per_layer = 0;  // (a zero threshold still wants a late page)
  EXPECT_FALSE(r.take(0, page, layers));
  EXPECT_TRUE(r.take(1, page, layers));
}

TEST(LandOverlapRule, OnAndOffIgnoreTheClaims) {
  const LandOverlapRule on = *LandOverlapRule::parse("on"), off = *LandOverlapRule::parse("off");
  EXPECT_TRUE(on.enabled());
  EXPECT_FALSE(off.enabled());
  for (const int64_t claims : {int64_t{0}, int64_t{1}, int64_t{1} << 30}) {
    EXPECT_TRUE(on.take(claims, 8192, 32));
    EXPECT_FALSE(off.take(claims, 8192, 32));
  }
}

TEST(LandOverlapRule, Spellings) {
  EXPECT_EQ(LandOverlapRule::parse("1")->mode, LandOverlapRule::Mode::On);
  EXPECT_EQ(LandOverlapRule::parse("0")->mode, LandOverlapRule::Mode::Off);
  EXPECT_EQ(LandOverlapRule::parse("auto")->name(), "auto");
  EXPECT_EQ(LandOverlapRule::parse("on")->name(), "on");
  EXPECT_EQ(LandOverlapRule::parse("off")->name(), "off");
  EXPECT_TRUE(LandOverlapRule::parse("auto")->enabled());
  for (const char* bad : {"", "Auto", "2", "yes", "on "}) EXPECT_FALSE(LandOverlapRule::parse(bad).has_value()) << bad;
  EXPECT_EQ(LandOverlapRule{}.mode, LandOverlapRule::Mode::Off);  // the library's default; the engine's is auto
}
