// Landing's CPU statement (kv/tier_land.h): which entries land, in what order, with which bytes.
// The expected values come from the definition written out here by hand on small lists, not from
// the function: list order, the i-th landing into the i-th stack slot, resident keys untouched,
// a short stack leaving the rest late, a page named twice landing twice, bad input refused; and the
// adoption where a page lands (LandAdopt): the table entry swapped from the host key to the slot
// only where it still holds the key, the key rows copied for that landing alone.
#include <gtest/gtest.h>

#include <vector>

#include "core/error.h"
#include "kv/page_lists.h"
#include "kv/page_pool.h"
#include "kv/tier_land.h"

namespace {

using dhs::LandEntry;
using dhs::PageLists;
using dhs::PagePool;
using dhs::PageRef;
using dhs::Tier;

constexpr int64_t kDev = 10;

// Two rows: row 0 = {dev 2, host 3, host 7}, row 1 = {host 3, dev 4, host 0}; page_pos 10.. in order.
PageLists two_rows() {
  PageLists L;
  L.n_requests = 2;
  L.n_heads_kv = 1;
  L.seq_len = {1, 1};
  L.indptr = {0, 3, 6};
  L.slots = {2, kDev + 3, kDev + 7, kDev + 3, 4, kDev + 0};
  L.page_pos = {10, 11, 12, 13, 14, 15};
  return L;
}

void fill(PagePool& p, float base) {
  for (int64_t s = 0; s < p.n_pages(); ++s) {
    const PageRef r{p.tier(), static_cast<int32_t>(s)};
    for (int i = 0; i < p.page_size() * p.head_dim(); ++i) {
      p.k_page(r)[i] = base + static_cast<float>(s) + 0.001f * static_cast<float>(i);
      p.v_page(r)[i] = -base - static_cast<float>(s) - 0.001f * static_cast<float>(i);
    }
  }
}

TEST(TierLand, LandsInListOrderIntoTheStackInOrder) {
  PagePool dev(Tier::Device, kDev, 2, 4), host(Tier::Host, 8, 2, 4);
  fill(dev, 1000.0f);
  fill(host, 0.0f);
  PageLists L = two_rows();
  std::vector<LandEntry> log;
  const std::vector<int32_t> stack = {9, 5, 8, 6, 7};
  EXPECT_EQ(dhs::land_late_pages(L, kDev, stack, &dev, &host, &log), 4);
  EXPECT_EQ(L.slots, (std::vector<int32_t>{2, 9, 5, 8, 4, 6}));
  EXPECT_EQ(log, (std::vector<LandEntry>{{0, 11, 9, 3}, {0, 12, 5, 7}, {1, 13, 8, 3}, {1, 15, 6, 0}}));
  // Bytes: slot 9 and 8 hold host page 3 (named twice), 5 holds 7, 6 holds 0; 7 (spare) and the
  // resident pages keep theirs.
  for (const auto& [d, h] : std::vector<std::pair<int32_t, int32_t>>{{9, 3}, {8, 3}, {5, 7}, {6, 0}})
    for (int i = 0; i < 8; ++i) {
      EXPECT_EQ(dev.k_page({Tier::Device, d})[i], host.k_page({Tier::Host, h})[i]);
      EXPECT_EQ(dev.v_page({Tier::Device, d})[i], host.v_page({Tier::Host, h})[i]);
    }
  EXPECT_EQ(dev.k_page({Tier::Device, 7})[0], 1007.0f);
  EXPECT_EQ(dev.k_page({Tier::Device, 2})[0], 1002.0f);
}

TEST(TierLand, AShortStackLeavesTheRestLate) {
  PageLists L = two_rows();
  std::vector<LandEntry> log;
  const std::vector<int32_t> stack = {6, 5};
  EXPECT_EQ(dhs::land_late_pages(L, kDev, stack, nullptr, nullptr, &log), 2);
  EXPECT_EQ(L.slots, (std::vector<int32_t>{2, 6, 5, kDev + 3, 4, kDev + 0}));
  EXPECT_EQ(log.size(), 2u);
  PageLists M = two_rows();
  EXPECT_EQ(dhs::land_late_pages(M, kDev, {}, nullptr, nullptr, nullptr), 0);
  EXPECT_EQ(M.slots, two_rows().slots);
}

// Layer 1 of a table of 2 request slots x 2 KV heads x 2 layers x 8 pages: request 0 sits in
// table slot 1, request 1 in slot 0. Lists (KV heads 0 and 1 of each request):
//   row 0 (req 0, head 0): host 5 @ page 3, host 5 @ page 3 again, dev 1 @ page 4
//   row 1 (req 0, head 1): host 6 @ page 2 (its entry already names slot 9: not adopted)
//   row 2 (req 1, head 0): host 7 @ page 0
//   row 3 (req 1, head 1): nothing
TEST(TierLand, AdoptsWhereItLandsTheFirstLandingOfAPageOnly) {
  constexpr int kLists = 4, kPages = 8;
  PageLists L;
  L.n_requests = 2;
  L.n_heads_kv = 2;
  L.seq_len = {1, 1};
  L.indptr = {0, 3, 4, 5, 5};
  L.slots = {kDev + 5, kDev + 5, 1, kDev + 6, kDev + 7};
  L.page_pos = {3, 3, 4, 2, 0};
  const auto at = [](int slot, int layer, int head, int page) { return static_cast<size_t>((slot * kLists + layer * 2 + head) * kPages + page); };
  std::vector<int32_t> table(2 * kLists * kPages, -1);
  table[at(1, 1, 0, 3)] = kDev + 5;
  table[at(1, 1, 0, 4)] = 1;
  table[at(1, 1, 1, 2)] = 9;  // (moved since the lists were built)
  table[at(0, 1, 0, 0)] = kDev + 7;
  const std::vector<int32_t> before = table;
  // Rows of 3 bytes under each key (device slots 0-9, host keys 10-17): byte b of key k = 10 k + b.
  std::vector<uint8_t> rows(18 * 3);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<uint8_t>(10 * (i / 3) + i % 3);
  const std::vector<uint8_t> rows_before = rows;
  const std::vector<int32_t> req_slot = {1, 0};
  dhs::LandAdopt adopt;
  adopt.table = table;
  adopt.req_slot = req_slot;
  adopt.n_lists = kLists;
  adopt.max_pages = kPages;
  adopt.n_heads_kv = 2;
  adopt.layer = 1;
  adopt.rows = {{rows.data(), 3}};
  std::vector<LandEntry> log;
  const std::vector<int32_t> stack = {8, 6, 2, 3};
  EXPECT_EQ(dhs::land_late_pages(L, kDev, stack, nullptr, nullptr, &log, &adopt), 4);
  EXPECT_EQ(L.slots, (std::vector<int32_t>{8, 6, 1, 2, 3}));
  EXPECT_EQ(log, (std::vector<LandEntry>{{0, 3, 8, 5, true}, {0, 3, 6, 5, false}, {1, 2, 2, 6, false}, {2, 0, 3, 7, true}}));
  std::vector<int32_t> want = before;
  want[at(1, 1, 0, 3)] = 8;
  want[at(0, 1, 0, 0)] = 3;
  EXPECT_EQ(table, want);
  // Rows: key 8 took host 5's (key 15), key 3 host 7's (key 17); 6 and 2 (not adopted) kept theirs.
  std::vector<uint8_t> want_rows = rows_before;
  for (int b = 0; b < 3; ++b) {
    want_rows[8 * 3 + b] = static_cast<uint8_t>(150 + b);
    want_rows[3 * 3 + b] = static_cast<uint8_t>(170 + b);
  }
  EXPECT_EQ(rows, want_rows);
  // A request slot or page past the table is refused.
  PageLists M = L;
  M.slots = {kDev + 5, kDev + 5, 1, kDev + 6, kDev + 7};
  M.page_pos[4] = kPages;
  EXPECT_THROW(dhs::land_late_pages(M, kDev, stack, nullptr, nullptr, nullptr, &adopt), dhs::Error);
  adopt.layer = 2;  // (layer 2's lists are past the table's 4)
  EXPECT_THROW(dhs::land_late_pages(L, kDev, stack, nullptr, nullptr, nullptr, &adopt), dhs::Error);
}

TEST(TierLand, BadInputIsRefused) {
  PageLists L = two_rows();
  const std::vector<int32_t> outside = {kDev};
  EXPECT_THROW(dhs::land_late_pages(L, kDev, outside, nullptr, nullptr, nullptr), dhs::Error);
  PageLists bad = two_rows();
  bad.indptr.back() = 7;
  const std::vector<int32_t> stack = {5};
  EXPECT_THROW(dhs::land_late_pages(bad, kDev, stack, nullptr, nullptr, nullptr), dhs::Error);
  PagePool dev(Tier::Device, kDev, 2, 4), host(Tier::Host, 2, 2, 4);  // host page 3 is outside it
  PageLists L2 = two_rows();
  EXPECT_THROW(dhs::land_late_pages(L2, kDev, stack, &dev, &host, nullptr), dhs::Error);
}

}  // namespace
