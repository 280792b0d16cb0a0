// Verification-seeded drafts on the device against the CPU statement (sparse/draft_seeds.h):
// - record_seeds (draft_seeds.h): from selected lists and their masses (ties on purpose), each
//   scored list's seeds equal heaviest_pages() of the same masses and pages, heaviest first and
//   -1 padded; lists the select kernel did not cut by mass (sink-window, all-pages, below
//   dense_below, empty) and a per-row verify's earlier rows write nothing;
// - window_lists (window_lists.h) with seeds: every list equals SinkWindowPolicy(n_sink, n_recent,
//   n_seeds) over DraftSeeds holding the same seeds (pages past the list dropped, seeds inside the
//   window not listed twice, ascending), slots from the page table.
// Everything is integer or exact float compares: lists and seeds must be equal exactly.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/draft_seeds.h"
#include "backend/cuda/window_lists.h"
#include "device_vectors.h"
#include "gtest_shim.h"
#include "kv/page_pool.h"
#include "kv/page_table.h"
#include "sparse/draft_seeds.h"
#include "sparse/policy.h"

namespace {

namespace dc = dhs::cuda;
using dhs::test::to_device;
using dhs::test::to_host;

TEST(DraftSeeds, RecordEqualsTheCpuDefinition) {
  if (dc::device_count() == 0) GTEST_SKIP() << "no GPU";
  std::mt19937 rng(5);
  for (const int cap : {1, 5, 64, 256}) {
    SCOPED_TRACE(::testing::Message() << "cap " << cap);
    const int hkv = 3, n_layers = 2, layer = 1, max_slots = 9;
    // Requests: lengths in pages; their rules. Requests 6 and 7 are rows of one per-row verify
    // (same store row, consecutive lengths): only 7 writes.
    const std::vector<int> pages{0, 1, 7, 300, 2500, 40, 90, 90};
    const std::vector<int> slot{8, 3, 0, 5, 1, 2, 6, 6};
    const int n_req = static_cast<int>(pages.size());
    std::vector<dc::RowRule> rules(static_cast<size_t>(n_req));
    rules[5].rule = dc::SelectRule::SinkWindow;  // not scored
    rules[1].all_pages = 1;                      // (1 page anyway)
    std::vector<int32_t> seq_len, q_indptr{0}, dense_indptr{0}, sel_indptr{0}, sel_pos;
    std::vector<float> mass;
    for (int r = 0; r < n_req; ++r) {
      seq_len.push_back(pages[r] * 16 - (pages[r] > 0 ? 5 : 0) + (r == 7 ? 1 : 0));
      q_indptr.push_back(q_indptr.back() + 1);
      for (int h = 0; h < hkv; ++h) {
        const int n = pages[r];
        const int n_levels = 1 + static_cast<int>(rng() % 6);  // few levels: many ties
        for (int i = 0; i < n; ++i) mass.push_back(static_cast<float>(rng() % n_levels) / 7.0f + (h == 2 ? 0.0f : 1e-3f * (rng() % 2)));
        dense_indptr.push_back(static_cast<int32_t>(mass.size()));
        for (int i = 0; i < n; ++i)
          if (rng() % 3 != 0 || (h == 1 && r == 4)) sel_pos.push_back(i);
        sel_indptr.push_back(static_cast<int32_t>(sel_pos.size()));
      }
    }
    seq_len[3] = 10;  // below dense_below: not scored
    const int dense_below = 20;
    std::vector<int32_t> store(static_cast<size_t>(max_slots * n_layers * hkv * cap), 777);
    int32_t* d_sel_indptr = to_device(sel_indptr);
    int32_t* d_sel_pos = to_device(sel_pos);
    int32_t* d_dense_indptr = to_device(dense_indptr);
    float* d_mass = to_device(mass);
    int32_t* d_seq = to_device(seq_len);
    int32_t* d_q = to_device(q_indptr);
    int32_t* d_slot = to_device(slot);
    dc::RowRule* d_rules = to_device(rules);
    int32_t* d_store = to_device(store);
    dc::RecordSeedsParams p{.sel_indptr = d_sel_indptr, .sel_page_pos = d_sel_pos, .dense_indptr = d_dense_indptr,
                            .mass = d_mass, .seq_len = d_seq, .q_indptr = d_q, .req_slot = d_slot, .row_rules = d_rules,
                            .dense_below = dense_below, .seeds = d_store, .seed_cap = cap, .n_requests = n_req,
                            .n_layers = n_layers, .n_heads_kv = hkv, .layer = layer};
    dc::launch_record_seeds(p, nullptr);
    DHS_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<int32_t> got = to_host(d_store, store.size());
    for (int r = 0; r < n_req; ++r)
      for (int h = 0; h < hkv; ++h) {
        SCOPED_TRACE(::testing::Message() << "req " << r << " head " << h);
        const int row = r * hkv + h;
        const size_t at = static_cast<size_t>(((slot[r] * n_layers + layer) * hkv + h) * cap);
        const bool writes = pages[r] > 0 && r != 1 && r != 3 && r != 5 && r != 6;
        std::vector<int32_t> want(static_cast<size_t>(cap), 777);
        if (writes) {
          std::vector<double> m;
          for (int i = dense_indptr[row]; i < dense_indptr[row + 1]; ++i) m.push_back(mass[static_cast<size_t>(i)]);
          const std::vector<int32_t> chosen(sel_pos.begin() + sel_indptr[row], sel_pos.begin() + sel_indptr[row + 1]);
          const std::vector<int32_t> top = dhs::heaviest_pages(m, chosen, cap);
          std::fill(want.begin(), want.end(), -1);
          std::copy(top.begin(), top.end(), want.begin());
        }
        if (r == 6) continue;  // (its store row is request 7's)
        const std::vector<int32_t> g(got.begin() + static_cast<std::ptrdiff_t>(at), got.begin() + static_cast<std::ptrdiff_t>(at) + cap);
        ASSERT_EQ(g, want);
      }
    // Untouched: layer 0 of every row, and the rows no request used.
    for (int s = 0; s < max_slots; ++s)
      for (int h = 0; h < hkv; ++h)
        for (int i = 0; i < cap; ++i) {
          ASSERT_EQ(got[static_cast<size_t>(((s * n_layers + 0) * hkv + h) * cap + i)], 777);
          if (s == 4 || s == 7) ASSERT_EQ(got[static_cast<size_t>(((s * n_layers + 1) * hkv + h) * cap + i)], 777);
        }
    for (void* d : {static_cast<void*>(d_sel_indptr), static_cast<void*>(d_sel_pos), static_cast<void*>(d_dense_indptr),
                    static_cast<void*>(d_mass), static_cast<void*>(d_seq), static_cast<void*>(d_q), static_cast<void*>(d_slot),
                    static_cast<void*>(d_rules), static_cast<void*>(d_store)})
      cudaFree(d);
  }
}

TEST(DraftSeeds, SeededWindowListsEqualTheCpuPolicy) {
  if (dc::device_count() == 0) GTEST_SKIP() << "no GPU";
  std::mt19937 rng(9);
  constexpr int kPage = 16;
  for (int trial = 0; trial < 12; ++trial) {
    const int n_layers = 2, hkv = trial % 2 ? 8 : 3, n_req = trial == 0 ? 1 : 11, layer = trial % 2;
    const int cap = trial % 3 == 0 ? 256 : 1 + static_cast<int>(rng() % 40);
    SCOPED_TRACE(::testing::Message() << "trial " << trial << " cap " << cap);
    dhs::PagePool pool(dhs::Tier::Device, 200000, kPage, 8, /*with_storage=*/false);
    std::vector<std::unique_ptr<dhs::PageTable>> tables;
    std::vector<const dhs::PageTable*> ptrs;
    std::vector<int32_t> seq_len, q_indptr{0}, req_slot;
    std::vector<dhs::DraftSeeds> seeds(static_cast<size_t>(n_req));
    std::vector<dhs::DraftSeeds*> seed_ptrs;
    const int max_slots = n_req + 2;
    std::vector<int32_t> store(static_cast<size_t>(max_slots * n_layers * hkv * cap), -1);
    std::vector<dc::RowRule> rules(static_cast<size_t>(n_req));
    std::vector<int> n_seeds(static_cast<size_t>(n_req));
    std::vector<int32_t> slots_free(static_cast<size_t>(max_slots));
    for (int i = 0; i < max_slots; ++i) slots_free[static_cast<size_t>(i)] = i;
    std::shuffle(slots_free.begin(), slots_free.end(), rng);
    int64_t max_pages = 1;
    for (int r = 0; r < n_req; ++r) {
      tables.push_back(std::make_unique<dhs::PageTable>(n_layers, hkv, kPage));
      const int64_t n = r == 1 ? 0 : static_cast<int64_t>(rng() % 900);
      EXPECT_TRUE(tables.back()->reserve(pool, n + 1));
      tables.back()->commit(n);
      ptrs.push_back(tables.back().get());
      seq_len.push_back(static_cast<int32_t>(n));
      q_indptr.push_back(q_indptr.back() + 1);
      req_slot.push_back(slots_free[static_cast<size_t>(r)]);
      max_pages = std::max<int64_t>(max_pages, tables.back()->n_pages_per_list());
      dc::RowRule& rr = rules[static_cast<size_t>(r)];
      rr.rule = dc::SelectRule::SinkWindow;
      rr.n_sink = static_cast<int>(rng() % 3);
      rr.n_recent = static_cast<int>(rng() % 5);
      rr.all_pages = r == 2 ? 1 : 0;
      rr.n_seeds = static_cast<int>(rng() % 3 == 0 ? 0 : rng() % (cap + 3));  // (may ask more than the cap)
      n_seeds[static_cast<size_t>(r)] = std::min(rr.n_seeds, cap);
      // Seeds recorded when the list was a few pages longer (some lie past it now).
      const int64_t n_pages = (n + kPage - 1) / kPage;
      seeds[static_cast<size_t>(r)].set_capacity(cap);
      seeds[static_cast<size_t>(r)].begin_step(0);
      for (int h = 0; h < hkv; ++h) {
        std::vector<double> mass(static_cast<size_t>(n_pages + 3));
        for (double& x : mass) x = static_cast<double>(rng() % 50);
        std::vector<int32_t> chosen;
        for (int32_t i = 0; i < static_cast<int32_t>(mass.size()); ++i)
          if (rng() % 2) chosen.push_back(i);
        seeds[static_cast<size_t>(r)].record(layer, h, hkv, mass, chosen);
        const std::vector<int32_t> top = dhs::heaviest_pages(mass, chosen, cap);
        std::copy(top.begin(), top.end(),
                  store.begin() + ((req_slot.back() * n_layers + layer) * hkv + h) * cap);
      }
      seed_ptrs.push_back(&seeds[static_cast<size_t>(r)]);
    }
    // The device page table: [max_slots, n_layers * hkv, max_pages] slots.
    std::vector<int32_t> table(static_cast<size_t>(max_slots * n_layers * hkv * max_pages), -7);
    for (int r = 0; r < n_req; ++r)
      for (int l = 0; l < n_layers; ++l)
        for (int h = 0; h < hkv; ++h)
          for (int64_t i = 0; i < ptrs[r]->n_pages_per_list(); ++i)
            table[static_cast<size_t>(((req_slot[r] * n_layers + l) * hkv + h) * max_pages + i)] = ptrs[r]->page(l, h, i).slot;
    int32_t* d_table = to_device(table);
    int32_t* d_slot = to_device(req_slot);
    int32_t* d_seq = to_device(seq_len);
    dc::RowRule* d_rules = to_device(rules);
    int32_t* d_store = to_device(store);
    const int64_t max_nnz = int64_t{n_req} * hkv * max_pages;
    int32_t* d_indptr = to_device(std::vector<int32_t>(static_cast<size_t>(n_req * hkv + 1), -1));
    int32_t* d_slots = to_device(std::vector<int32_t>(static_cast<size_t>(max_nnz), -1));
    int32_t* d_pos = to_device(std::vector<int32_t>(static_cast<size_t>(max_nnz), -1));
    dc::WindowListsParams p{.table = d_table, .req_slot = d_slot, .seq_len = d_seq, .row_rules = d_rules,
                            .seeds = d_store, .seed_cap = cap, .indptr = d_indptr, .slots = d_slots,
                            .page_pos = d_pos, .n_requests = n_req, .n_layers = n_layers, .n_heads_kv = hkv,
                            .max_pages = max_pages, .layer = layer, .page_size = kPage};
    dc::launch_window_lists(p, nullptr);
    DHS_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<int32_t> indptr = to_host(d_indptr, static_cast<size_t>(n_req * hkv + 1));
    const std::vector<int32_t> slots = to_host(d_slots, static_cast<size_t>(indptr.back()));
    const std::vector<int32_t> pos = to_host(d_pos, static_cast<size_t>(indptr.back()));
    // The CPU: each request's own SinkWindowPolicy over the same seeds.
    dhs::SelectionInput in;
    in.tables = &ptrs;
    in.layer = layer;
    in.seq_len = &seq_len;
    in.q_indptr = q_indptr.data();
    in.seeds = seed_ptrs.data();
    std::vector<std::unique_ptr<dhs::SelectionPolicy>> own;
    std::vector<const dhs::SelectionPolicy*> pol;
    for (int r = 0; r < n_req; ++r) {
      const dc::RowRule& rr = rules[static_cast<size_t>(r)];
      if (rr.all_pages) own.push_back(std::make_unique<dhs::DensePolicy>());
      else own.push_back(std::make_unique<dhs::SinkWindowPolicy>(rr.n_sink, rr.n_recent, n_seeds[static_cast<size_t>(r)]));
      pol.push_back(own.back().get());
    }
    const dhs::PageLists want = dhs::select_each(in, pol);
    ASSERT_EQ(indptr, want.indptr);
    ASSERT_EQ(pos, want.page_pos);
    ASSERT_EQ(slots, want.slots);
    for (void* d : {static_cast<void*>(d_table), static_cast<void*>(d_slot), static_cast<void*>(d_seq),
                    static_cast<void*>(d_rules), static_cast<void*>(d_store), static_cast<void*>(d_indptr),
                    static_cast<void*>(d_slots), static_cast<void*>(d_pos)})
      cudaFree(d);
    for (auto& t : tables) t->release(pool);
  }
}

}  // namespace
