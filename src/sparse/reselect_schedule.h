// Reusing a layer's page selection for a few decode steps (--reselect-every R).
//
// Scoring every page of every (request, layer, KV head) at every step costs more than
// issue 4's budget allows (docs/sparse.md: the 4-bit sketch's bytes alone are 12.9% of
// dense attention's). With R > 1 a layer runs its policy only at some steps; at the others
// it reads its last selection, grown by the pages appended since (so the newest pages,
// the current token's included, are always read). Staggered: at the k-th decode step
// after a full one, layer l selects when (l + k) % R == 0, so each step selects about
// 1/R of the layers (every step costs the same) and a selection is at most R - 1 steps
// old. A step that does not continue the previous one (another batch, a truncated or
// prefilled sequence, a policy change) selects at every layer. Both backends use this
// schedule; what a reused list holds is defined by reuse_selection() below (CPU) and
// launch_reuse_lists (CUDA), tested against each other.
#pragma once
#include <cstdint>
#include <vector>

#include "kv/page_lists.h"
#include "kv/page_table.h"

namespace dhs {

class ReselectSchedule {
 public:
  explicit ReselectSchedule(int every = 1);
  int every() const { return every_; }

  // Start of a decode step over `ids` (one per request, e.g. its page table) holding
  // n_before[r] tokens before the step's token. Returns the step's phase: kFull when every
  // layer selects (R = 1, the first step, or the batch is not the last step's continuation),
  // else k % R for the k-th step since the last full one.
  static constexpr int kFull = -1;
  int begin_step(const std::vector<const void*>& ids, const std::vector<int64_t>& n_before);
  // Whether layer `layer` runs its policy at a step of phase `phase`.
  bool selects(int layer, int phase) const { return phase == kFull || (layer + phase) % every_ == 0; }
  // The next step selects at every layer (after a prefill, a truncation, a policy change).
  void invalidate() { ids_.clear(); }

 private:
  int every_;
  int64_t k_ = 0;                  // decode steps since the last full one
  std::vector<const void*> ids_;   // the last step's batch; empty: none to continue
  std::vector<int64_t> n_after_;   // its sequences' token counts after that step
};

// The lists of a reused selection: for each (request, KV head), the pages of `stored` (one
// layer's lists as its policy chose them; stored.seq_len the tokens then) before the first
// page written since (the one holding token stored.seq_len), then every page from that one
// to the last (seq_len now). Ascending, no duplicates. Slots come from the tables, so
// `stored` stays valid while no page of it was freed (the schedule's continuation check).
PageLists reuse_selection(const PageLists& stored, const std::vector<const PageTable*>& tables, int layer,
                          const std::vector<int32_t>& seq_len);

}  // namespace dhs
