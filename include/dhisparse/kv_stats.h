// dhisparse public API: KV page accounting.
#pragma once
#include <cstdint>
#include <vector>

namespace dhs {

// Pages of the KV pool (free + used == total when the engine is idle).
struct PoolStats {
  int64_t n_total = 0;
  int64_t n_free = 0;
  int64_t n_used = 0;
};

// KV pages read by sparse decode vs all pages, summed over decode steps.
struct PageCounts {
  uint64_t read = 0, total = 0;
  std::vector<uint64_t> layer_head_read, layer_head_total;  // [n_layers * n_heads_kv], or empty
  double read_frac() const { return total > 0 ? static_cast<double>(read) / static_cast<double>(total) : 1.0; }
};

}  // namespace dhs
