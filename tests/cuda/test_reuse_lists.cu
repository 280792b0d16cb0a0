// The device's reused selection (backend/cuda/reuse_lists.h) against the CPU definition
// (sparse/reselect_schedule.h reuse_selection) on awkward shapes: 17 requests of 0 .. 300 tokens grown by 0 .. 40 (page boundaries crossed or not, partial
// pages at both ends), stored lists empty, one page, all pages or random subsets.
// Everything is integer: lists, slots and counts must be equal exactly.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/reuse_lists.h"
#include "device_vectors.h"
#include "gtest_shim.h"
#include "kv/page_lists.h"
#include "kv/page_pool.h"
#include "kv/page_table.h"
#include "sparse/reselect_schedule.h"

namespace {

namespace dc = dhs::cuda;
constexpr int kPage = 16;

using dhs::test::to_device;
using dhs::test::to_host;

TEST(ReuseLists, EqualTheCpuDefinition) {
  if (dc::device_count() == 0) GTEST_SKIP() << "no GPU";
  std::mt19937 rng(11);
  for (int trial = 0; trial < 20; ++trial) {
    const int n_layers = 3, hkv = trial % 2 ? 8 : 3, n_req = trial == 0 ? 1 : 17;
    const int layer = trial % n_layers;
    dhs::PagePool pool(dhs::Tier::Device, 40000, kPage, 8, /*with_storage=*/false);
    std::vector<std::unique_ptr<dhs::PageTable>> tables;
    std::vector<const dhs::PageTable*> ptrs;
    std::vector<int32_t> seq_then, seq_now;
    for (int r = 0; r < n_req; ++r) {
      tables.push_back(std::make_unique<dhs::PageTable>(n_layers, hkv, kPage));
      const int64_t n = r == 0 ? 0 : static_cast<int64_t>(rng() % 301);
      ASSERT_TRUE(tables.back()->reserve(pool, n + 41));
      tables.back()->commit(n);
      seq_then.push_back(static_cast<int32_t>(n));
      ptrs.push_back(tables.back().get());
    }
    // The stored selection: per list empty, one page, all pages or a random subset (ascending).
    dhs::PageLists stored;
    stored.n_requests = n_req;
    stored.n_heads_kv = hkv;
    stored.seq_len = seq_then;
    stored.indptr.push_back(0);
    for (int r = 0; r < n_req; ++r) {
      const int64_t n_pages = (seq_then[static_cast<size_t>(r)] + kPage - 1) / kPage;
      for (int h = 0; h < hkv; ++h) {
        const int mode = static_cast<int>(rng() % 4);
        const int64_t one = n_pages > 0 ? static_cast<int64_t>(rng() % n_pages) : -1;
        for (int64_t p = 0; p < n_pages; ++p)
          if ((mode == 0 && p == one) || mode == 1 || (mode >= 2 && rng() % 2)) {
            stored.slots.push_back(tables[static_cast<size_t>(r)]->page(layer, h, p).slot);
            stored.page_pos.push_back(static_cast<int32_t>(p));
          }
        stored.indptr.push_back(static_cast<int32_t>(stored.slots.size()));
      }
    }
    for (int r = 0; r < n_req; ++r) {
      const int64_t grow = static_cast<int64_t>(rng() % 41);
      tables[static_cast<size_t>(r)]->commit(grow);
      seq_now.push_back(static_cast<int32_t>(tables[static_cast<size_t>(r)]->n_tokens()));
    }
    const dhs::PageLists dense = dhs::dense_page_lists(ptrs, layer, seq_now);
    const dhs::PageLists want = dhs::reuse_selection(stored, ptrs, layer, seq_now);

    int32_t* dense_indptr_d = to_device(dense.indptr);
    int32_t* dense_slots_d = to_device(dense.slots);
    int32_t* seq_len_d = to_device(seq_now);
    int32_t* sel_indptr_d = to_device(stored.indptr);
    int32_t* sel_slots_d = to_device(stored.slots);
    int32_t* sel_pos_d = to_device(stored.page_pos);
    int32_t* sel_seq_d = to_device(seq_then);
    const size_t cap = dense.slots.size() + 1;
    int32_t* indptr_d = to_device(std::vector<int32_t>(dense.indptr.size(), -7));
    int32_t* slots_d = to_device(std::vector<int32_t>(cap, -7));
    int32_t* pos_d = to_device(std::vector<int32_t>(cap, -7));
    unsigned long long* stats_d = to_device(std::vector<unsigned long long>(2 * hkv, 0));
    dc::ReuseListsParams p;
    p.dense_indptr = dense_indptr_d;
    p.dense_slots = dense_slots_d;
    p.seq_len = seq_len_d;
    p.sel_indptr = sel_indptr_d;
    p.sel_slots = sel_slots_d;
    p.sel_page_pos = sel_pos_d;
    p.sel_seq_len = sel_seq_d;
    p.indptr = indptr_d;
    p.slots = slots_d;
    p.page_pos = pos_d;
    p.stats = stats_d;
    p.n_requests = n_req;
    p.n_heads_kv = hkv;
    p.page_size = kPage;
    dc::launch_reuse_lists(p, nullptr);
    DHS_CUDA_CHECK(cudaDeviceSynchronize());
    const auto indptr = to_host(indptr_d, dense.indptr.size());
    EXPECT_EQ(indptr, want.indptr) << "trial " << trial;
    const size_t nnz = static_cast<size_t>(want.nnz());
    EXPECT_EQ(to_host(slots_d, nnz), want.slots) << "trial " << trial;
    EXPECT_EQ(to_host(pos_d, nnz), want.page_pos) << "trial " << trial;
    EXPECT_EQ(to_host(slots_d, cap)[nnz], -7) << "trial " << trial << ": written past the lists";
    // Stats: per KV head, the pages listed and the pages in its lists now.
    const auto stats = to_host(stats_d, 2 * static_cast<size_t>(hkv));
    for (int h = 0; h < hkv; ++h) {
      unsigned long long listed = 0, total = 0;
      for (int r = 0; r < n_req; ++r) {
        listed += static_cast<unsigned long long>(want.row_end(r, h) - want.row_begin(r, h));
        total += static_cast<unsigned long long>(dense.row_end(r, h) - dense.row_begin(r, h));
      }
      EXPECT_EQ(stats[2 * static_cast<size_t>(h)], listed) << "trial " << trial << " head " << h;
      EXPECT_EQ(stats[2 * static_cast<size_t>(h) + 1], total) << "trial " << trial << " head " << h;
    }
    for (void* d : {static_cast<void*>(dense_indptr_d), static_cast<void*>(dense_slots_d), static_cast<void*>(seq_len_d),
                    static_cast<void*>(sel_indptr_d), static_cast<void*>(sel_slots_d), static_cast<void*>(sel_pos_d),
                    static_cast<void*>(sel_seq_d), static_cast<void*>(indptr_d), static_cast<void*>(slots_d),
                    static_cast<void*>(pos_d), static_cast<void*>(stats_d)})
      cudaFree(d);
    for (auto& t : tables) t->release(pool);
  }
}

}  // namespace
