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
  void step_done() {
    staging_used_ = 0;
    patches_used_ = 0;
  }

  // The KV hierarchy (issue 23): entries are keys — a device slot s as s, a host slot h as
  // n_device + h (kv/tier_split.h) — so that lists built from the table name pages in either
  // tier. 0 (the default): no host tier, entries are device slots.
  void set_tier_keys(int64_t n_device) { n_device_ = n_device; }
  // A page of t moved between tiers (TieredKv's relocation): its entry rewritten where a request
  // slot mirrors t and has copied that page; staged, applied by flush_patches.
  void patch(const PageTable& t, int layer, int head, int64_t idx);
  // The staged rewrites, applied on `stream` (one copy and three small kernels, a page patched
  // twice taking its later record; nothing when none).
  void flush_patches(cudaStream_t stream);
  int64_t pending_patches() const { return n_patches_; }
  // Forgets request slot `req` (its table was released or truncated to zero).
  void reset(int req) {
    synced_[static_cast<size_t>(req)] = 0;
    table_id_[static_cast<size_t>(req)] = 0;
    patch_reqs_id_ = kNoTable;
  }

  const int32_t* table_d() const { return table_d_; }
  // The entries, for a kernel that rewrites them in the step (landing: tier_land.h).
  int32_t* entries_d() { return table_d_; }
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
  // patch's cache: the slots that mirror table patch_reqs_id_ (kNoTable: none cached).
  static constexpr uint64_t kNoTable = ~uint64_t{0};
  uint64_t patch_reqs_id_ = kNoTable;
  std::vector<int> patch_reqs_;
  int64_t n_device_ = 0;           // set_tier_keys
  // Staged rewrites (offset into table_d_, key) and the pinned buffer they are copied from; the
  // buffer is reused once the stream that read it synchronized (step_done).
  struct Patch {
    int64_t offset;
    int32_t key;
    int32_t pad;
  };
  std::vector<Patch> patches_;
  int64_t n_patches_ = 0;
  int32_t* winner_d_ = nullptr;     // [the table's entries] -1, or a flush's claim (flush_patches)
  Patch* patch_h_ = nullptr;        // pinned
  Patch* patch_d_ = nullptr;
  int64_t patch_cap_ = 0, patches_used_ = 0;
  int32_t key_of(const PageTable& t, int layer, int head, int64_t idx) const;
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
