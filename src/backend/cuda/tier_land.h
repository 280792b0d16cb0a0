// Landing on the device (issue 23; the CPU statement and oracle is kv/tier_land.h): before a
// layer's split and attention, each late entry of its lists (key >= n_device) claims the next
// free device slot of a stack the host set aside before the step (one atomic counter per step,
// shared by the layers), its page's K and V are copied there from the host tier's mapped pages,
// its key is rewritten to the slot (the split then finds it resident), and the landing is logged
// for the host to adopt after the step. Claims past the stack leave their entries late (read in
// place as before); the counter still counts them, so the host sees how many more it needed.
// With a page table (`table`), the landing adopts the page where it lands (kv/tier_land.h
// LandAdopt): the page's entry swapped from its host key to the slot (compare-and-swap: of a page
// landed twice one landing takes it) and, for that landing, the rows kept by key (`follow`: key
// sketch, summaries) copied to the slot's; the log says which landing took the entry.
// Every late byte of a landed page crosses PCIe once (the recall-ahead schedule's in-place read
// and later recall cross twice). No host sync, no allocation: capturable.
//
//   slots:      [nnz] keys in; slots_out: the same with the landed entries' rewritten (in place if equal)
//   land_slots: [land_cap] free device slots
//   land_n:     [1] claims this step (set to 0 before its first layer)
//   log:        [land_cap, 6] (row, layer, page_pos, device slot, host slot, adopted) at the claim's index
//   table:      [slots, n_lists, max_pages] keys (DevicePageTable), or null; req_slot [rows / n_heads_kv]
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace dhs::cuda {

struct LandLateParams {
  const int32_t* indptr = nullptr;    // [n_rows + 1]
  const int32_t* slots = nullptr;     // [nnz] keys
  int32_t* slots_out = nullptr;       // [nnz] the keys after landing (every entry written; may be slots)
  const int32_t* page_pos = nullptr;  // [nnz]
  int n_rows = 0;
  int32_t n_device = 0;   // device pool pages (keys at or past it name host slots)
  int64_t n_host = 0;     // host tier pages (a key past n_device + n_host is skipped, counted in n_bad)
  const int32_t* land_slots = nullptr;  // [land_cap]
  int32_t* land_n = nullptr;            // [1]
  int land_cap = 0;
  const int32_t* land_avail = nullptr;  // [1] or null: claims below min(land_cap, *land_avail) land (a
                                        // captured step's stack length, written before each replay)
  int32_t* log = nullptr;  // [land_cap, 6]
  int layer = 0;
  const __half* host_k = nullptr;  // [n_host, page_size, head_dim] mapped pinned DRAM
  const __half* host_v = nullptr;
  __half* dev_k = nullptr;  // [n_device, page_size, head_dim] HBM
  __half* dev_v = nullptr;
  int page_words = 0;       // 16-byte words per K (or V) page: page_size * head_dim / 8
  int32_t* n_bad = nullptr;  // [1] += entries skipped for a slot out of range, or null
  // Adoption where the page lands (null table: none; adopted is then 1 in every log entry).
  int32_t* table = nullptr;            // [table slots, n_lists, max_pages]
  const int32_t* req_slot = nullptr;   // [n_rows / n_heads_kv] each request's table slot
  int n_lists = 0;
  int64_t max_pages = 0;
  int n_heads_kv = 1;
  static constexpr int kMaxFollow = 4;
  struct Follow {
    void* base = nullptr;  // [n_device + n_host, row_bytes], row_bytes a multiple of 16
    int64_t row_bytes = 0;
  };
  Follow follow[kMaxFollow];
  int n_follow = 0;
};

// One block per row (no checks).
void launch_land_late(const LandLateParams& p, cudaStream_t stream);
// The op: checks the shapes and pointers, then launches.
void land_late_pages(const LandLateParams& p, cudaStream_t stream);

}  // namespace dhs::cuda
