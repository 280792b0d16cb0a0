// The CUDA backend's half of the recall-ahead schedule (docs/hierarchy.md "Recall ahead"): after
// a decode step of a LlamaCuda with the host tier, what the step recorded — the HBM slots it read
// (each once) and its late reads (pages read in place from pinned DRAM) — handed to
// TieredKv::after_decode_step. One place for the CUDA runner and the hierarchy bench.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "kv/tiered_kv.h"

namespace dhs {

class LlamaCuda;
class RunnerTiers;

// seq_tables[i]: the table of the step's sequence i (LlamaCuda::LateRead::seq). `now`: the clock
// of the step's last layer. Returns what the calls did (hits, late reads, recalls).
TierStats recall_after_decode(TieredKv& kv, const LlamaCuda& m, const std::vector<PageTable*>& seq_tables, int64_t now);

// The same in two halves (TieredKv::after_step_reads / after_step_recalls): the step's hits and
// landings, now; its late reads, kept for the recalls.
TierStats reads_after_decode(TieredKv& kv, const LlamaCuda& m, const std::vector<PageTable*>& seq_tables, int64_t now);
std::vector<TieredKv::LateRead> late_reads_of(const LlamaCuda& m);

// The overlap (docs/hierarchy.md): a decode step's recalls kept after it and run while the next
// decode step runs (LlamaCuda::forward's while_running, their copies queued behind that step), or
// now — before anything else touches the tiers.
class DeferredRecalls {
 public:
  explicit DeferredRecalls(RunnerTiers& tiers) : tiers_(tiers) {}

  // After a decode step of m: its reads handed to the tiers now (reads_after_decode), its late
  // reads kept. `now`: the clock of the step's last layer.
  TierStats after_decode(const LlamaCuda& m, const std::vector<PageTable*>& seq_tables, int64_t now);
  bool pending() const { return kept_.has_value(); }
  // The kept recalls now, on the clock they were taken at (no-op when none).
  void flush() { run(false); }
  // For forward's while_running: the kept recalls in flight, on the clock of the running step
  // (whose before_step has touched pages already); empty when none are kept. An error is kept
  // for rethrow_in_flight (the step's wait must come first).
  std::function<void()> in_flight();
  // Throws the in-flight run's error, if it had one.
  void rethrow_in_flight();

 private:
  void run(bool in_flight);

  struct Kept {
    std::vector<TieredKv::LateRead> late;
    int64_t now = 0;
  };
  RunnerTiers& tiers_;
  std::optional<Kept> kept_;
  std::string in_flight_error_;
};

}  // namespace dhs
