#include "engine/cuda_tiers.h"

#include "model/arch/llama_cuda.h"

namespace dhs {

TierStats recall_after_decode(TieredKv& kv, const LlamaCuda& m, const std::vector<PageTable*>& seq_tables, int64_t now) {
  std::vector<TieredKv::LateRead> late;
  late.reserve(m.late_reads().size());
  for (const LlamaCuda::LateRead& r : m.late_reads()) late.push_back({r.seq, PageId{r.layer, r.head, r.page}});
  std::vector<TieredKv::Landed> landed;
  landed.reserve(m.landings().size());
  for (const LlamaCuda::Landing& l : m.landings()) landed.push_back({l.seq, PageId{l.layer, l.head, l.page}, l.dev_slot, l.host_slot});
  return kv.after_decode_step(m.read_stamps(), m.read_stamp(), late, seq_tables, now, landed);
}

}  // namespace dhs
