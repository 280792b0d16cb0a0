// Verification-seeded drafts on the device (the CPU statement: sparse/draft_seeds.h): after a
// scoring step's select kernel, each scored (request, KV head) list's seeds — the seed_cap
// heaviest of the pages it selected, by the masses the select kernel computed (mass desc, page
// index asc on ties), heaviest first, -1 padded — are written to the request's row of the seed
// store, which seeded draft steps read (window_lists.h). One small kernel per layer, fixed grid,
// no host sync (captured in the step's graph).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/page_select.h"

namespace dhs::cuda {

struct RecordSeedsParams {
  // The layer's selection, as the select launch wrote it.
  const int32_t* sel_indptr = nullptr;    // [n_requests * n_heads_kv + 1]
  const int32_t* sel_page_pos = nullptr;  // [nnz] ascending per list
  const int32_t* dense_indptr = nullptr;  // [n_requests * n_heads_kv + 1] (the masses' offsets)
  const float* mass = nullptr;            // [nnz_dense] the select kernel's normalised masses (mass_out)
  const int32_t* seq_len = nullptr;       // [n_requests] tokens in KV, this step's included
  const int32_t* q_indptr = nullptr;      // [n_requests + 1] the rows the launch scored
  const int32_t* req_slot = nullptr;      // [n_requests] each request's row of the store
  // Which lists were scored (the select kernel's rule: every other list read all its pages or a
  // window, and its masses were not written): the launch's rule, or each request's own.
  const RowRule* row_rules = nullptr;     // [n_requests] or null
  RowRule rule;                           // the launch's (row_rules null)
  const float* budget_frac = nullptr;     // TopK: [n_heads_kv] or null (as PageSelectParams)
  int dense_below = 0;
  int32_t* seeds = nullptr;  // [max_slots, n_layers, n_heads_kv, seed_cap] heaviest first, -1 padded
  int seed_cap = 0;          // <= kMaxSeedPages
  int n_requests = 0;
  int n_layers = 0;
  int n_heads_kv = 0;
  int layer = 0;
};

inline constexpr int kMaxSeedPages = 256;

// A list is written only by the last attention request of its store row (a per-row verify's
// rows are consecutive requests of one row, at consecutive lengths): the verify's last row.
void launch_record_seeds(const RecordSeedsParams& p, cudaStream_t stream);

}  // namespace dhs::cuda
