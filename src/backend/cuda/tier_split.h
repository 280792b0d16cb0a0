// The KV hierarchy's recall-ahead schedule on the device (issue 23; the CPU statement is
// kv/tier_split.h and LlamaCpu's RecallSchedule::Ahead): nothing moves inside a step, so one
// layer's lists name pages in either tier by key — a device slot s as s, a host slot h as
// n_device + h, the key of the page's sketch and summaries — and
//  1. split_lists_by_tier splits them into the resident part (HBM slots) and the late part (host
//     slots), each row keeping its order (three small kernels: count per row, scan, scatter;
//     no host sync, capturable);
//  2. decode attention runs twice: over the resident part from the HBM pool and over the late
//     part from the host tier's mapped pinned pages (HostPagePool::device_view: every late byte
//     crosses PCIe once), both with their LSE;
//  3. merge_late_attention merges the two per (row, q head) by log-sum-exp (merge_normalized,
//     core/merge_state.h, the CPU's own operation).
// The host learns the step's reads afterwards (the lists, copied back) and recalls them for the
// next step (TieredKv::recall_ahead, the I/O engine of page_recall.h / host_gather.h).
//
//   in:   indptr [n_rows + 1], slots [nnz] (keys), page_pos [nnz]
//   dev:  indptr [n_rows + 1], slots [<= nnz] HBM slots,  page_pos
//   late: indptr [n_rows + 1], slots [<= nnz] host slots, page_pos
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace dhs::cuda {

// Output buffers of one layer's split, sized once (max_rows, max_nnz) so that replays of a
// captured step never allocate.
class TierSplitLists {
 public:
  TierSplitLists(int max_rows, int64_t max_nnz);
  ~TierSplitLists();
  TierSplitLists(const TierSplitLists&) = delete;
  TierSplitLists& operator=(const TierSplitLists&) = delete;

  int max_rows() const { return max_rows_; }
  int64_t max_nnz() const { return max_nnz_; }
  // Device part and late part, each indptr [n_rows + 1], slots, page_pos.
  int32_t* dev_indptr() { return dev_indptr_; }
  int32_t* dev_slots() { return dev_slots_; }
  int32_t* dev_page_pos() { return dev_page_pos_; }
  int32_t* late_indptr() { return late_indptr_; }
  int32_t* late_slots() { return late_slots_; }
  int32_t* late_page_pos() { return late_page_pos_; }
  int32_t* late_count() { return late_count_; }  // [max_rows] scratch: late entries per row

 private:
  int max_rows_;
  int64_t max_nnz_;
  int32_t *dev_indptr_ = nullptr, *dev_slots_ = nullptr, *dev_page_pos_ = nullptr;
  int32_t *late_indptr_ = nullptr, *late_slots_ = nullptr, *late_page_pos_ = nullptr;
  int32_t* late_count_ = nullptr;
};

struct TierSplitParams {
  const int32_t* indptr = nullptr;    // [n_rows + 1]
  const int32_t* slots = nullptr;     // [nnz] keys: < n_device a device slot, else n_device + host slot
  const int32_t* page_pos = nullptr;  // [nnz]
  int n_rows = 0;
  int32_t n_device = 0;
  int32_t *dev_indptr = nullptr, *dev_slots = nullptr, *dev_page_pos = nullptr;
  int32_t *late_indptr = nullptr, *late_slots = nullptr, *late_page_pos = nullptr;
  int32_t* late_count = nullptr;  // [n_rows]
  // The late reads' log (TierSplitLog), or null.
  int32_t* late_log = nullptr;    // [late_log_cap, 3] (row, layer, page_pos)
  int32_t* late_log_n = nullptr;  // [1] entries appended (may pass the cap: those past it are dropped)
  int late_log_cap = 0;
  int layer = 0;
  // The resident reads' record, or null: last_use[slot] = *stamp for every device entry, and each
  // slot the first time this stamp marks it appended to read_slots (up to read_cap; read_n counts).
  int32_t* last_use = nullptr;      // [n_device]
  const int32_t* stamp = nullptr;   // [1]
  int32_t* read_slots = nullptr;    // [read_cap]
  int32_t* read_n = nullptr;        // [1]
  int read_cap = 0;
  // The late part's entries as keys (n_device + host slot) instead of host slots: a part to be
  // landed (tier_land.h takes keys) and split again after.
  bool late_keys = false;
};

// Where a step's late reads are logged, for the host to recall them after the step
// (TieredKv::recall_ahead): each late entry of each layer appends (row, layer, page_pos), in no
// particular order; the count is set to 0 before the step's first layer.
struct TierSplitLog {
  int32_t* entries = nullptr;  // [cap, 3]
  int32_t* count = nullptr;    // [1]
  int cap = 0;
  int layer = 0;
  // And which device slots the step read (its hits, for the LRU): last_use[slot] = *stamp, the
  // step's number; null: not recorded.
  int32_t* last_use = nullptr;     // [n_device]
  const int32_t* stamp = nullptr;  // [1]
  // The slots read, each once per stamp (the step's hits for the host, without scanning
  // last_use), and their count; null: not listed.
  int32_t* read_slots = nullptr;   // [read_cap]
  int32_t* read_n = nullptr;       // [1]
  int read_cap = 0;
};
// The three kernels (no checks).
void launch_tier_split(const TierSplitParams& p, cudaStream_t stream);

// The op: checks n_rows against the buffers, then launches. The lists' nnz (indptr[n_rows], on
// the device) must be <= out.max_nnz() (the caller sizes the buffers as the lists it splits).
// late_keys: TierSplitParams::late_keys.
void split_lists_by_tier(const int32_t* indptr, const int32_t* slots, const int32_t* page_pos, int n_rows,
                         int64_t n_device, TierSplitLists& out, cudaStream_t stream, const TierSplitLog& log = {},
                         bool late_keys = false);

struct MergeLateParams {
  __half* out = nullptr;             // [n, head_dim] the resident part's output; merged in place
  float* lse = nullptr;              // [n] its LSE; merged in place
  const __half* late_out = nullptr;  // [n, head_dim] the late part's
  const float* late_lse = nullptr;   // [n]
  int n = 0;                         // rows x q heads
  int head_dim = 0;                  // <= 256, a multiple of 32 (64, 128)
};
void launch_merge_late(const MergeLateParams& p, cudaStream_t stream);
// The op: checks the shape, then launches.
void merge_late_attention(const MergeLateParams& p, cudaStream_t stream);

}  // namespace dhs::cuda
