#include "kv/lru_mirror.h"

#include "core/error.h"

namespace dhs {

LruMirror::LruMirror(int64_t n_slots) : use_(static_cast<size_t>(n_slots), 0), owner_(static_cast<size_t>(n_slots), -1) {}

void LruMirror::apply(const BucketedLru::Patch& p) {
  DHS_CHECK(p.slot.size() == p.use.size() && p.slot.size() == p.owner.size(), "LRU mirror: a patch of {} / {} / {} entries",
            p.slot.size(), p.use.size(), p.owner.size());
  for (size_t i = 0; i < p.slot.size(); ++i) {
    const size_t s = static_cast<size_t>(p.slot[i]);
    DHS_CHECK(s < use_.size(), "LRU mirror: a patch of slot {} of {}", p.slot[i], use_.size());
    use_[s] = p.use[i];
    owner_[s] = p.owner[i];
  }
  tick_ = p.tick;
}

std::vector<int64_t> LruMirror::counts(int32_t n_owners) const {
  std::vector<int64_t> c(static_cast<size_t>(n_owners) + 1, 0);
  for (size_t s = 0; s < use_.size(); ++s)
    if (use_[s] == tick_ && owner_[s] >= 0 && owner_[s] < n_owners) ++c[static_cast<size_t>(owner_[s]) + 1];
  return c;
}

}  // namespace dhs
