// The page tables of the requests in flight, mirrored in HBM so that page lists
// can be built on the device inside a captured step (DESIGN.md §1.2: no host
// plan, no per-step upload of lists). The host PageTable stays the owner; after
// it grows, sync() copies only the new pages (one 2-D copy per request) through a pinned
// staging buffer that fills over a step and is handed back by step_done() once the step's
// stream has synchronized: a step of many requests waits for none of its copies.
//
//   table_d: [max_requests, n_layers * n_heads_kv, max_pages] int32 page slots
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "kv/page_table.h"

namespace dhs::cuda {

class DevicePageTable {
 public:
  DevicePageTable(int max_requests, int n_layers, int n_heads_kv, int64_t max_pages);
  ~DevicePageTable();
  DevicePageTable(const DevicePageTable&) = delete;
  DevicePageTable& operator=(const DevicePageTable&) = delete;

  // Copies pages [synced, t.n_pages_per_list()) of request slot `req` (asynchronous on
  // `stream`, from the staging buffer's next free part; when it is full, waits for the
  // stream and starts over).
  void sync(int req, const PageTable& t, cudaStream_t stream);
  // The caller synchronized `stream` after its last sync(): the staging buffer is free again.
  void step_done() { staging_used_ = 0; }
  // Forgets request slot `req` (its table was released or truncated to zero).
  void reset(int req) { synced_[static_cast<size_t>(req)] = 0; table_id_[static_cast<size_t>(req)] = 0; }

  const int32_t* table_d() const { return table_d_; }
  int max_requests() const { return max_requests_; }
  int n_lists() const { return n_lists_; }
  int64_t max_pages() const { return max_pages_; }

 private:
  int max_requests_, n_layers_, n_heads_kv_, n_lists_;
  int64_t max_pages_;
  int32_t* table_d_ = nullptr;
  int32_t* staging_h_ = nullptr;  // pinned [staging_cap_]
  int64_t staging_cap_ = 0;       // n_lists * max(max_pages, 2 * max_requests): a step's new pages
  int64_t staging_used_ = 0;      // ints of staging_h_ holding copies in flight
  std::vector<int64_t> synced_;   // pages copied per request
  std::vector<uint64_t> table_id_; // PageTable::id() each slot mirrors
};

struct DenseListsParams {
  const int32_t* table = nullptr;    // [max_requests, n_layers * n_heads_kv, max_pages]
  const int32_t* req_slot = nullptr; // [n_requests] table slot of each batch entry
  const int32_t* seq_len = nullptr;  // [n_requests] tokens in KV (this step's included)
  int32_t* indptr = nullptr;         // [n_requests * n_heads_kv + 1]
  int32_t* slots = nullptr;          // [nnz]
  int32_t* page_pos = nullptr;       // [nnz]
  int n_requests = 0;
  int n_layers = 0;
  int n_heads_kv = 0;
  int64_t max_pages = 0;
  int layer = 0;
  int page_size = 16;
};

// The dense policy on the device: every page of `layer` for each (request, KV head).
// Blocks of 1,024 pages of a CSR row; each derives its row's offset from the lengths (no host plan).
void launch_dense_lists(const DenseListsParams& p, cudaStream_t stream);

}  // namespace dhs::cuda
