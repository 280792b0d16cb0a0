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

// The KV hierarchy (EngineOptions::cpu_kv_gb): page moves between the device and host tiers since
// the engine loaded, and the host tier's pages in use. All 0 without a host tier.
struct TierCounts {
  uint64_t hits = 0;       // pages a step read that were resident
  uint64_t late = 0;       // pages a step read in place from the host tier (--kv-recall ahead)
  uint64_t recalled = 0;   // host -> device copies
  uint64_t offloaded = 0;  // device -> host copies
  uint64_t dropped = 0;    // evictions of pages whose host copy was still valid (no copy)
  int64_t host_used = 0;
  // CUDA: steps with decode rows over the host tier, and of them those whose landing ran beside
  // the resident attention (--kv-land-overlap).
  uint64_t tier_steps = 0;
  uint64_t overlapped_steps = 0;
};

}  // namespace dhs
