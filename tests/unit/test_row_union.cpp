// A verify's rows, each with its own page list, read as one list (kv/page_lists.h
// union_row_lists): the union in page order with a row mask per entry. Checked against hand-made
// cases, and through cpu::attention: every row's output over the union with masks is the same
// bits as that row attending its own list alone (each row visits its pages in the same order).
#include <gtest/gtest.h>

#include <random>

#include "backend/cpu/attention.h"
#include "core/error.h"
#include "kv/page_lists.h"

namespace dhs {
namespace {

// Lists of `n` requests of one KV head from explicit (page position, slot) rows.
PageLists lists_of(const std::vector<std::vector<std::pair<int32_t, int32_t>>>& rows, const std::vector<int32_t>& seq_len) {
  PageLists pl;
  pl.n_requests = static_cast<int>(rows.size());
  pl.n_heads_kv = 1;
  pl.seq_len = seq_len;
  pl.indptr = {0};
  for (const auto& r : rows) {
    for (auto [pos, slot] : r) {
      pl.page_pos.push_back(pos);
      pl.slots.push_back(slot);
    }
    pl.indptr.push_back(static_cast<int32_t>(pl.slots.size()));
  }
  return pl;
}

TEST(RowUnion, MergesRowsInPageOrderWithTheirBits) {
  // Request 0: three rows (positions 40, 41, 42); request 1: one row; request 2: two rows, one empty.
  const PageLists in = lists_of({{{0, 10}, {2, 12}}, {{0, 10}, {1, 11}, {2, 12}}, {{2, 12}, {0, 10}},  // any order
                                 {{5, 7}},
                                 {}, {{3, 30}}},
                                {41, 42, 43, 90, 60, 61});
  const PageLists u = union_row_lists(in, {0, 3, 4, 6});
  ASSERT_EQ(u.n_requests, 3);
  EXPECT_EQ(u.indptr, (std::vector<int32_t>{0, 3, 4, 5}));
  EXPECT_EQ(u.page_pos, (std::vector<int32_t>{0, 1, 2, 5, 3}));
  EXPECT_EQ(u.slots, (std::vector<int32_t>{10, 11, 12, 7, 30}));
  EXPECT_EQ(u.row_mask, (std::vector<uint32_t>{0b111, 0b010, 0b111, 0b1, 0b10}));
  EXPECT_EQ(u.seq_len, (std::vector<int32_t>{43, 90, 61}));  // each request's last row's
}

TEST(RowUnion, RefusesWhatIsNotRowsOfOneRequest) {
  const PageLists in = lists_of({{{0, 10}}, {{0, 11}}}, {5, 6});
  // One page position at two slots.
  EXPECT_THROW(union_row_lists(in, {0, 2}), Error);
  // Row ranges that do not cover the input, an empty range, more than 32 rows.
  EXPECT_THROW(union_row_lists(in, {0, 1}), Error);
  EXPECT_THROW(union_row_lists(in, {0, 0, 2}), Error);
  const PageLists twice = lists_of({{{0, 10}, {0, 10}}}, {5});
  EXPECT_THROW(union_row_lists(twice, {0, 1}), Error);
  std::vector<std::vector<std::pair<int32_t, int32_t>>> many(33, {{0, 1}});
  const PageLists wide = lists_of(many, std::vector<int32_t>(33, 5));
  std::vector<int32_t> all = {0, 33};
  EXPECT_THROW(union_row_lists(wide, all), Error);
  EXPECT_NO_THROW(union_row_lists(wide, {0, 32, 33}));
}

// Random verifies (1-6 rows, several requests, 2 KV heads, partly full last pages): attention of
// the union with masks equals, bit for bit, attention of each row alone over its own list; with a
// mask bit flipped it does not.
TEST(RowUnion, AttentionOverTheUnionEqualsEachRowAlone) {
  std::mt19937 rng(7);
  const int ps = 16, d = 64, hq = 8, hkv = 2;
  PagePool pool(Tier::Host, 600, ps, d);
  const std::vector<int32_t> rows_of = {4, 1, 6, 2, 3};  // each request's verify rows
  const std::vector<int32_t> ctx = {150, 40, 77, 16, 300};  // tokens before the rows
  std::vector<PageTable> tables;
  for (size_t r = 0; r < rows_of.size(); ++r) {
    tables.emplace_back(1, hkv, ps);
    ASSERT_TRUE(tables.back().reserve(pool, ctx[r] + rows_of[r]));
    tables.back().commit(ctx[r] + rows_of[r]);
  }
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& t : tables)
    for (PageRef p : t.all_pages())
      for (int i = 0; i < ps * d; ++i) {
        pool.k_page(p)[i] = nd(rng);
        pool.v_page(p)[i] = nd(rng);
      }
  // Split form: each row its own request (q_len 1), a random subset of the pages it may see,
  // always its own last page (a coverage set holds the recent window), sometimes empty on head 1.
  PageLists split;
  split.n_heads_kv = hkv;
  split.indptr = {0};
  std::vector<int32_t> row_indptr = {0};
  for (size_t r = 0; r < rows_of.size(); ++r) {
    for (int j = 0; j < rows_of[r]; ++j) {
      const int32_t len = ctx[r] + j + 1;
      split.seq_len.push_back(len);
      for (int h = 0; h < hkv; ++h) {
        const int n_pages = (len + ps - 1) / ps;
        const bool empty = h == 1 && rng() % 7 == 0;
        for (int i = 0; i < n_pages && !empty; ++i)
          if (i == n_pages - 1 || rng() % 10 < 5) {
            split.page_pos.push_back(i);
            split.slots.push_back(tables[r].page(0, h, i).slot);
          }
        split.indptr.push_back(static_cast<int32_t>(split.slots.size()));
      }
    }
    split.n_requests += rows_of[r];
    row_indptr.push_back(split.n_requests);
  }
  const PageLists u = union_row_lists(split, row_indptr);
  ASSERT_LT(u.nnz(), split.nnz());  // the rows share pages: fewer reads

  const int n_rows = split.n_requests;
  std::vector<float> q(static_cast<size_t>(n_rows * hq * d));
  for (float& x : q) x = nd(rng);
  auto run = [&](const PageLists& pl, const std::vector<int32_t>& q_indptr, std::vector<float>& out, std::vector<float>& lse) {
    out.assign(q.size(), 0.0f);
    lse.assign(static_cast<size_t>(n_rows * hq), 0.0f);
    cpu::AttentionParams p;
    p.q = q.data();
    p.out = out.data();
    p.lse = lse.data();
    p.q_indptr = q_indptr.data();
    p.lists = &pl;
    p.pool = &pool;
    p.n_heads_q = hq;
    p.n_heads_kv = hkv;
    p.head_dim = d;
    p.scale = 0.125f;
    cpu::attention(p);
  };
  std::vector<int32_t> split_q(static_cast<size_t>(n_rows) + 1);
  for (int i = 0; i <= n_rows; ++i) split_q[static_cast<size_t>(i)] = i;
  std::vector<int32_t> union_q = {0};
  for (int32_t n : rows_of) union_q.push_back(union_q.back() + n);
  std::vector<float> o_split, l_split, o_union, l_union;
  run(split, split_q, o_split, l_split);
  run(u, union_q, o_union, l_union);
  EXPECT_EQ(o_union, o_split);
  EXPECT_EQ(l_union, l_split);

  // A row given a page its own list does not hold reads differently.
  PageLists wrong = u;
  size_t flip = 0;
  while (wrong.row_mask[flip] == (1u << rows_of[0]) - 1) ++flip;  // an entry of request 0 not every row reads
  ASSERT_LT(static_cast<int64_t>(flip), wrong.indptr[1]);
  wrong.row_mask[flip] = (1u << rows_of[0]) - 1;
  run(wrong, union_q, o_union, l_union);
  EXPECT_NE(l_union, l_split);
  for (auto& t : tables) t.release(pool);
  EXPECT_EQ(pool.check_invariants(), "");
  EXPECT_EQ(pool.n_used(), 0);
}

}  // namespace
}  // namespace dhs
