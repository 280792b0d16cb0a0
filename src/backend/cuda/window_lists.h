// Sink + recent page lists straight from the device page table: the lists of a step whose every
// request reads a fixed window (the draft steps of speculative decoding, --sparse-policy
// sinkwindow), with no scoring and no select kernel. The same lists as the select kernel's
// SinkWindow rule (page_select.h): per (request, KV head) the first n_sink pages and the last
// n_recent, in index order, every page when they overlap, every page for requests with the
// all-pages rule or shorter than dense_below. A seeded draft (RowRule::n_seeds > 0) also reads
// the first n_seeds of its request's draft seeds (draft_seeds.h: heaviest first) that lie
// outside the window, the list in ascending page order. One small kernel, fixed grid, no host sync.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/page_select.h"

namespace dhs::cuda {

struct WindowListsParams {
  const int32_t* table = nullptr;     // [max_requests, n_layers * n_heads_kv, max_pages] (device_page_table.h)
  const int32_t* req_slot = nullptr;  // [n_requests]
  const int32_t* seq_len = nullptr;   // [n_requests] tokens in KV, this step's included
  const RowRule* row_rules = nullptr; // [n_requests] each request's rule, or null: n_sink / n_recent for all
  int n_sink = 1;
  int n_recent = 1;
  int dense_below = 0;
  const int32_t* seeds = nullptr;  // [max_slots, n_layers, n_heads_kv, seed_cap] (draft_seeds.h), or null
  int seed_cap = 0;
  int32_t* indptr = nullptr;    // [n_requests * n_heads_kv + 1]
  int32_t* slots = nullptr;     // [nnz]
  int32_t* page_pos = nullptr;  // [nnz]
  unsigned long long* stats = nullptr;  // [n_heads_kv, 2] += (pages listed, pages in the list), or null
  int n_requests = 0;
  int n_layers = 0;
  int n_heads_kv = 0;
  int64_t max_pages = 0;
  int layer = 0;
  int page_size = 16;
};

void launch_window_lists(const WindowListsParams& p, cudaStream_t stream);

}  // namespace dhs::cuda
