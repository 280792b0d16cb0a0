// The device's side of the LRU mirror (issue 23, What item 2; kv/bucketed_lru.h mirror_on, and
// kv/lru_mirror.h, the CPU statement these kernels are tested against): HBM keeps a copy of the
// host LRU's last uses (32-bit offsets from its base) and owners, one per HBM page slot; before a
// decode step the host's patch is applied, the step's tier split writes the patch's tick as the
// last use of each slot it reads (tier_split.h's last_use / stamp), and after it the reads are
// counted per owner here; the host then takes the last uses back in one copy (take_mirror) instead
// of scanning read stamps.
//
//   use, owner [n_slots] int32 (owner -1: free)
//   patch [3, n]: the slots, then their last uses, then their owners (BucketedLru::Patch)
//   counts [n_owners + 1] int64: counts[o + 1] = slots with use == *tick and owner o (o in
//   [0, n_owners)); counts[0] stays 0
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace dhs::cuda {

// use[patch[i]] = patch[n + i], owner[patch[i]] = patch[2n + i] for i < n (the slots distinct).
void launch_lru_mirror_apply(int32_t* use, int32_t* owner, const int32_t* patch, int64_t n, cudaStream_t stream);

// counts (zeroed here) of the slots the step marked with *tick, per owner. Warp-aggregated: a
// warp adds once per distinct owner among its lanes (a step's reads are runs of one request's
// pages), into shared memory per block up to kMirrorSmemOwners owners, else into global memory.
constexpr int32_t kMirrorSmemOwners = 4096;
void launch_lru_mirror_count(const int32_t* use, const int32_t* owner, int32_t n_slots, const int32_t* tick,
                             int32_t n_owners, int64_t* counts, cudaStream_t stream);

}  // namespace dhs::cuda
