// The CUDA backend's half of the recall-ahead schedule (docs/hierarchy.md "Recall ahead"): after
// a decode step of a LlamaCuda with the host tier, what the step recorded — the HBM slots it read
// (each once) and its late reads (pages read in place from pinned DRAM) — handed to
// TieredKv::after_decode_step. One call for the CUDA runner and the hierarchy bench.
#pragma once
#include <cstdint>
#include <vector>

#include "kv/tiered_kv.h"

namespace dhs {

class LlamaCuda;

// seq_tables[i]: the table of the step's sequence i (LlamaCuda::LateRead::seq). `now`: the clock
// of the step's last layer. Returns what the calls did (hits, late reads, recalls).
TierStats recall_after_decode(TieredKv& kv, const LlamaCuda& m, const std::vector<PageTable*>& seq_tables, int64_t now);

// The same in two halves (TieredKv::after_step_reads / after_step_recalls), for a runner that
// runs the second while the next step runs: the step's hits and landings, now; its late reads,
// kept for the recalls.
TierStats reads_after_decode(TieredKv& kv, const LlamaCuda& m, const std::vector<PageTable*>& seq_tables, int64_t now);
std::vector<TieredKv::LateRead> late_reads_of(const LlamaCuda& m);

}  // namespace dhs
