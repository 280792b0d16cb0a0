// Shared set-up for the sparse tests: a pool, a summary store beside it, and
// requests whose K/V (random, or shaped by the test) are appended in chunks of
// random sizes, the way decode, verification and prefill append them.
#pragma once
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <vector>

#include "backend/cpu/attention.h"
#include "kv/page_pool.h"
#include "kv/page_table.h"
#include "sparse/page_summary.h"

namespace dhs::test {

struct SparseWorld {
  int n_layers, n_heads_kv, page_size, head_dim;
  PagePool pool;
  PageSummaryStore store;
  std::vector<std::unique_ptr<PageTable>> tables;

  SparseWorld(int n_layers_, int n_heads_kv_, int page_size_, int head_dim_, int64_t n_pages)
      : n_layers(n_layers_), n_heads_kv(n_heads_kv_), page_size(page_size_), head_dim(head_dim_),
        pool(Tier::Host, n_pages, page_size_, head_dim_), store(pool) {}

  PageTable& add_request() {
    tables.push_back(std::make_unique<PageTable>(n_layers, n_heads_kv, page_size));
    return *tables.back();
  }

  // Appends n tokens to `t` in every layer, K/V from gen(layer, head, pos, dim, is_v), in
  // chunks of random sizes; both the pool and the summaries are written.
  template <class Gen>
  void append(PageTable& t, int64_t n, std::mt19937& rng, Gen gen) {
    std::uniform_int_distribution<int64_t> chunk(1, 2 * page_size + 3);
    while (n > 0) {
      const int64_t c = std::min(n, chunk(rng));
      ASSERT_TRUE(t.reserve(pool, c));
      std::vector<int32_t> pos(static_cast<size_t>(c));
      for (int64_t i = 0; i < c; ++i) pos[static_cast<size_t>(i)] = static_cast<int32_t>(t.n_tokens() + i);
      const size_t row = static_cast<size_t>(n_heads_kv * head_dim);
      std::vector<float> k(static_cast<size_t>(c) * row), v(static_cast<size_t>(c) * row);
      for (int l = 0; l < n_layers; ++l) {
        for (int64_t i = 0; i < c; ++i)
          for (int h = 0; h < n_heads_kv; ++h)
            for (int d = 0; d < head_dim; ++d) {
              const size_t at = static_cast<size_t>(i) * row + static_cast<size_t>(h * head_dim + d);
              k[at] = gen(l, h, pos[static_cast<size_t>(i)], d, false);
              v[at] = gen(l, h, pos[static_cast<size_t>(i)], d, true);
            }
        cpu::append_kv(t, pool, l, k.data(), v.data(), pos.data(), c);
        append_summaries(t, store, l, k.data(), pos.data(), c);
      }
      t.commit(c);
      n -= c;
    }
  }

  void append_random(PageTable& t, int64_t n, std::mt19937& rng) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_real_distribution<float> off(-2.0f, 2.0f);
    append(t, n, rng, [&](int, int, int32_t, int, bool) { return nd(rng) + 0.5f * off(rng); });
  }

  std::vector<const PageTable*> table_ptrs() const {
    std::vector<const PageTable*> v;
    for (const auto& t : tables) v.push_back(t.get());
    return v;
  }
};

inline std::vector<float> random_vec(size_t n, std::mt19937& rng, float sd = 1.0f) {
  std::normal_distribution<float> nd(0.0f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

}  // namespace dhs::test
