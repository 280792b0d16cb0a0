#include "engine/cuda_tiers.h"

#include "model/arch/llama_cuda.h"

namespace dhs {

std::vector<TieredKv::LateRead> late_reads_of(const LlamaCuda& m) {
  std::vector<TieredKv::LateRead> late;
  late.reserve(m.late_reads().size());
  for (const LlamaCuda::LateRead& r : m.late_reads()) late.push_back({r.seq, PageId{r.layer, r.head, r.page}});
  return late;
}

TierStats reads_after_decode(TieredKv& kv, const LlamaCuda& m, const std::vector<PageTable*>& seq_tables, int64_t now) {
  std::vector<TieredKv::Landed> landed;
  landed.reserve(m.landings().size());
  for (const LlamaCuda::Landing& l : m.landings()) landed.push_back({l.seq, PageId{l.layer, l.head, l.page}, l.dev_slot, l.host_slot});
  return kv.after_step_reads(m.read_stamps(), m.read_stamp(), seq_tables, now, landed);
}

TierStats recall_after_decode(TieredKv& kv, const LlamaCuda& m, const std::vector<PageTable*>& seq_tables, int64_t now) {
  TierStats st = reads_after_decode(kv, m, seq_tables, now);
  st += kv.after_step_recalls(late_reads_of(m), now);
  return st;
}

}  // namespace dhs
