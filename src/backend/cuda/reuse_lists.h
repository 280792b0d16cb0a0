// A layer's reused page selection on the device (--reselect-every R; the schedule and the
// CPU definition are sparse/reselect_schedule.h): at a step where the layer does not run
// its policy, the lists attention reads are the layer's last selection grown by the pages
// written since. One small kernel, fixed grid, no host sync (capturable in the step's graph).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace dhs::cuda {

struct ReuseListsParams {
  // This layer's dense lists now: every page of each (request, KV head), page i at index i.
  const int32_t* dense_indptr = nullptr;  // [n_requests * n_heads_kv + 1]
  const int32_t* dense_slots = nullptr;   // [nnz_dense]
  const int32_t* seq_len = nullptr;       // [n_requests] tokens now
  // The layer's stored selection (ascending page_pos per list) and the tokens it saw.
  const int32_t* sel_indptr = nullptr;    // [n_requests * n_heads_kv + 1]
  const int32_t* sel_slots = nullptr;     // [nnz_sel]
  const int32_t* sel_page_pos = nullptr;  // [nnz_sel]
  const int32_t* sel_seq_len = nullptr;   // [n_requests] tokens at the selection
  // Output: per list, the stored pages before the first page written since the selection
  // (the one holding token sel_seq_len), then every page from that one to the last.
  int32_t* indptr = nullptr;    // [n_requests * n_heads_kv + 1]
  int32_t* slots = nullptr;     // [nnz]
  int32_t* page_pos = nullptr;  // [nnz]
  unsigned long long* stats = nullptr;  // [n_heads_kv, 2] += (pages listed, pages in the list), or null
  int n_requests = 0;
  int n_heads_kv = 0;
  int page_size = 16;
};

void launch_reuse_lists(const ReuseListsParams& p, cudaStream_t stream);

}  // namespace dhs::cuda
