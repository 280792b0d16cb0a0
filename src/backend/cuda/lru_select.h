// The bucketed LRU's victim selection on the device (issue 23, What item 2: eviction "decided on
// the GPU inside the step, with no host round trip per page"). kv/bucketed_lru.h is the
// definition and the oracle: for each want w (an owner and a count n_w), the first min(n_w, |C_w|)
// slots of C_w — the owner's resident, unpinned slots — ordered by (bin, slot), where bin is
// BucketedLru::order_bin_at(last_use, now) (plain or cyclic). No global sort, as the CPU form:
//  1. a histogram of each want's candidates over the bins (shared memory per block where the
//     wants' bins fit, else global atomics);
//  2. per want, the cut: the bin where its count is reached, how many it takes from that bin, and
//     each bin's first output position (one block per want, a block scan over the bins);
//  3. the candidates at or before their want's cut compacted in slot order (CUB's DeviceSelect
//     over the slot indices);
//  4. per want, one block walks that list in slot order, a tile at a time: the tile's items of
//     the want sorted by bin inside the block (stable: slot order kept within a bin), each placed
//     at its bin's position plus its rank; the cut bin's past the count are dropped.
// Every launch is asynchronous and capturable (sizes on the host are the slot count and the
// wants' count; the counts and positions stay on the device). A candidate used after `now` (the
// CPU form's error) is reported in error_slot (the lowest such slot; kNoError: none) and the result
// is then undefined. Written by hand:
// CUB has the block sort, scans and the compaction, not a bucketed selection.
//
//   last_use [n_slots] int32: last use − use_base (the host LRU's stored form, BucketedLru::
//            use_offsets / use_base, so a mirror is a copy), owner [n_slots] int32 (-1: free),
//   pinned [n_slots] uint8 or null
//   want_of_owner [n_owners] int32: the want of each owner id, or -1
//   want_n [n_wants] int64
//   out: slots [n_slots] int32 (want w's victims at out_first[w], out_count[w] of them, in order),
//        out_first [n_wants], out_count [n_wants] int64, error_slot [1] int32 (kNoError: none)
#pragma once
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <utility>
#include <vector>

#include "kv/bucketed_lru.h"

namespace dhs::cuda {

constexpr int32_t kNoError = INT32_MAX;

struct LruSelectParams {
  const int32_t* last_use = nullptr;  // offsets from use_base
  int64_t use_base = 0;
  const int32_t* owner = nullptr;
  const uint8_t* pinned = nullptr;
  int32_t n_slots = 0;
  int64_t now = 0;
  LruParams lru;
  const int32_t* want_of_owner = nullptr;
  int32_t n_owners = 0;
  const int64_t* want_n = nullptr;
  int n_wants = 0;
  int32_t* out_slots = nullptr;
  int64_t* out_first = nullptr;
  int64_t* out_count = nullptr;
  int32_t* error_slot = nullptr;
};

// The selection's scratch, sized once for (n_slots, n_wants, bins) so that a captured step
// never allocates: per-want histograms and bin positions, the cut, the compacted
// list, CUB's temporary storage.
class LruSelectScratch {
 public:
  // Bins per want (LruParams n_buckets * bucket_steps) up to kMaxBins.
  static constexpr int kMaxBins = 4096;  // (the placing kernel keeps a count per bin in shared memory)
  LruSelectScratch(int32_t max_slots, int max_wants, int n_bins);
  ~LruSelectScratch();
  LruSelectScratch(const LruSelectScratch&) = delete;
  LruSelectScratch& operator=(const LruSelectScratch&) = delete;

  int32_t max_slots() const { return max_slots_; }
  int max_wants() const { return max_wants_; }
  int n_bins() const { return n_bins_; }

 private:
  friend void launch_lru_select(const LruSelectParams&, LruSelectScratch&, cudaStream_t);
  int32_t max_slots_;
  int max_wants_, n_bins_;
  int32_t* hist_ = nullptr;     // [max_wants, n_bins]: candidates per bin, then each bin's first output position
  int32_t* cut_ = nullptr;      // [max_wants, 2]: the cut bin (-1: take nothing), what the cut bin gives
  int32_t* list_ = nullptr;     // [max_slots]: the flagged slots, in slot order
  int32_t* list_n_ = nullptr;   // [1]
  void* temp_ = nullptr;        // CUB DeviceSelect's
  size_t temp_bytes_ = 0;
};

// The kernels (no checks; the scratch sized for p's slots, wants and bins).
void launch_lru_select(const LruSelectParams& p, LruSelectScratch& scratch, cudaStream_t stream);

// The op: checks the sizes, launches, waits, and returns each want's victims as
// BucketedLru::select_many would (a candidate used after now: an error). For tests and benches.
std::vector<std::vector<int32_t>> lru_select(const LruSelectParams& p, LruSelectScratch& scratch, cudaStream_t stream);

}  // namespace dhs::cuda
