#include "engine/cuda_tiers.h"

#include <span>
#include <unordered_map>

#include "model/arch/llama_cuda.h"

namespace dhs {

TierStats recall_after_decode(TieredKv& kv, const LlamaCuda& m, const std::vector<PageTable*>& seq_tables, int64_t now) {
  TierStats st;
  const std::vector<int32_t>& slots = m.read_slots();
  st += kv.touch_slots(slots, now);
  // Each sequence's reads: its hits by slot, then its late reads in the order logged.
  std::unordered_map<const PageTable*, size_t> seq_of;
  for (size_t i = 0; i < seq_tables.size(); ++i) seq_of.emplace(seq_tables[i], i);
  std::vector<std::vector<PageId>> reads(seq_tables.size());
  const PageTable* last_t = nullptr;
  size_t last_i = 0;
  for (int32_t s : slots) {
    const PageTable* t = nullptr;
    PageId id;
    if (!kv.page_at(s, &t, &id)) continue;
    if (t != last_t) {  // (runs of one table are common: skip the lookup)
      const auto it = seq_of.find(t);
      if (it == seq_of.end()) continue;  // (a page of a request outside this step: touched only)
      last_t = t;
      last_i = it->second;
    }
    reads[last_i].push_back(id);
  }
  for (const LlamaCuda::LateRead& r : m.late_reads()) {
    const PageId id{r.layer, r.head, r.page};
    const size_t i = static_cast<size_t>(r.seq);
    st += kv.note_reads(*seq_tables[i], std::span<const PageId>(&id, 1), now);
    reads[i].push_back(id);
  }
  for (size_t i = 0; i < seq_tables.size(); ++i)
    if (!reads[i].empty()) st += kv.recall_ahead(*seq_tables[i], reads[i], now);
  return st;
}

}  // namespace dhs
