// `dhisparse bench --hierarchy`: decode throughput of the Llama-3.1-8B shape (random weights and
// KV) with the KV hierarchy on the GPU (issue 23): an HBM KV pool capped at --hbm-kv-gib, a host
// tier of pinned DRAM (--host-kv-gib), the recall-ahead schedule of the engine (the runner's own
// code: LlamaCuda's split attention, TieredKv, recall_after_decode), and the churn of a real
// model's selections replayed (random weights select the same pages every step). CUDA builds only.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace dhs {

struct HierarchyBenchOptions {
  int64_t ctx = 131072;
  std::vector<int64_t> batch;  // empty: the largest batch this configuration holds
  // One decode policy (the bench's spelling, e2e_bench.h): dense, trace:LABEL[@sketch4], ...
  std::string policy = "dense";
  std::string trace;
  int64_t trace_len = 0;
  double hbm_kv_gib = 32.0;  // the HBM KV pool's cap (0: what the GPU's memory leaves)
  double host_kv_gib = 0.0;  // the host tier (0: none; every page in HBM)
  // The churn replayed per step: this fraction of the pages the last step read is evicted before
  // the next (so it reads them in place, then recalls them): late reads per step / pages read, at
  // the buffer used, from the real-model measurement (hierarchy_hit_rate.jsonl).
  double churn = 0.055;
  double buffer = 0.5;  // each request's HBM budget: the pages a step reads x (1 + buffer)
  // Landing (backend/cuda/tier_land.h): slots reserved before each step for its late pages, which
  // the step copies into HBM before their attention (a miss crosses PCIe once), adopted after.
  bool land = false;
  // The after-step's recalls planned and issued while the next step runs (the CUDA runner's
  // default, EngineOptions::kv_overlap_recalls); false: before it is launched.
  bool overlap_recalls = true;
  int steps = 12;       // timed steps with churn (after warm-up and the resident steps)
  std::string out = "bench/results/hierarchy.jsonl";
  std::string commit = "unknown";
};

// Prints a table, appends one JSON line per batch to opts.out. Returns 0, or 77 without a GPU.
int run_hierarchy_bench(const HierarchyBenchOptions& opts);

}  // namespace dhs
