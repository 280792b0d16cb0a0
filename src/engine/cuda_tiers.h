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
TierStats recall_after_decode(TieredKv& kv, LlamaCuda& m, const std::vector<PageTable*>& seq_tables, int64_t now);

// The same in two halves (TieredKv::after_step_reads / after_step_recalls): the step's hits and
// landings, now; its late reads, kept for the recalls.
TierStats reads_after_decode(TieredKv& kv, LlamaCuda& m, const std::vector<PageTable*>& seq_tables, int64_t now);
std::vector<TieredKv::LateRead> late_reads_of(const LlamaCuda& m);

// The LRU mirrored in HBM (TieredKv::mirror_lru, LlamaCuda::lru_mirror_storage; docs/hierarchy.md):
// the step's reads come back as the LRU's own last uses, no stamps scanned. mirror_lru: from here;
// patch_lru: before each step with decode rows (now: its last layer's clock), a no-op unmirrored.
// reads_after_decode takes the mirror's copy when it is on.
void mirror_lru(TieredKv& kv, LlamaCuda& m);
void patch_lru(TieredKv& kv, LlamaCuda& m, int64_t now);
// DHS_LRU_MIRROR (on | off, or 1 | 0), when set, overrides `on` (the benches' A/B switch); an
// unknown value is an error.
bool lru_mirror_env(bool on);

// The overlap (docs/hierarchy.md): a decode step's recalls kept after it and run while the next
// decode step runs (LlamaCuda::forward's while_running, their copies queued behind that step), or
// now — before anything else touches the tiers.
class DeferredRecalls {
 public:
  explicit DeferredRecalls(RunnerTiers& tiers) : tiers_(tiers) {}

  // After a decode step of m: its reads handed to the tiers now (reads_after_decode), its late
  // reads kept. `now`: the clock of the step's last layer.
  TierStats after_decode(LlamaCuda& m, const std::vector<PageTable*>& seq_tables, int64_t now);
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
