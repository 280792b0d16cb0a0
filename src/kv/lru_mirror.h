// The mirror's side of a mirrored LRU (BucketedLru::mirror_on), in CPU form: what the GPU keeps
// and does with its copy of the LRU's last uses and owners (docs/hierarchy.md "The step's reads
// written into a mirror of the LRU"). It is the statement the CUDA kernels are tested against
// (backend/cuda/lru_mirror.h) and the device of the CPU tests (test_tiered_kv's twin of the
// stamps' scan).
//
// Per decode step: apply the host's patch (each listed slot's last use and owner), then the step
// writes the patch's tick as the last use of each slot it reads (the tier split's resident reads:
// read), then count: per owner o, the slots with the tick and owner o (counts[o + 1]; counts[0]
// collects nothing). use() is what the copy back to the host takes (BucketedLru::take_mirror).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "kv/bucketed_lru.h"

namespace dhs {

class LruMirror {
 public:
  explicit LruMirror(int64_t n_slots);

  void apply(const BucketedLru::Patch& p);
  // The step read slot s.
  void read(int32_t s) { use_[static_cast<size_t>(s)] = tick_; }
  // [n_owners + 1] the step's reads per owner (counts[o + 1]), of owners below n_owners.
  std::vector<int64_t> counts(int32_t n_owners) const;
  std::span<const int32_t> use() const { return use_; }
  int32_t tick() const { return tick_; }

 private:
  std::vector<int32_t> use_, owner_;
  int32_t tick_ = 0;
};

}  // namespace dhs
