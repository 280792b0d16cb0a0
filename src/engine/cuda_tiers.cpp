#include "engine/cuda_tiers.h"

#include <algorithm>
#include <cstdlib>
#include <exception>

#include "core/error.h"
#include "engine/runner_tiers.h"
#include "model/arch/llama_cuda.h"

namespace dhs {

std::vector<TieredKv::LateRead> late_reads_of(const LlamaCuda& m) {
  std::vector<TieredKv::LateRead> late;
  late.reserve(m.late_reads().size());
  for (const LlamaCuda::LateRead& r : m.late_reads()) late.push_back({r.seq, PageId{r.layer, r.head, r.page}});
  return late;
}

void mirror_lru(TieredKv& kv, LlamaCuda& m) { kv.mirror_lru(m.lru_mirror_storage()); }

bool lru_mirror_env(bool on) {
  const char* v = std::getenv("DHS_LRU_MIRROR");
  if (v == nullptr) return on;
  const std::string s(v);
  DHS_CHECK(s == "on" || s == "off" || s == "1" || s == "0", "DHS_LRU_MIRROR must be on or off (or 1, 0), got '{}'", s);
  return s == "on" || s == "1";
}

void patch_lru(TieredKv& kv, LlamaCuda& m, int64_t now) {
  if (!kv.lru_mirrored()) return;
  const TieredKv::LruPatchSize z = kv.begin_lru_patch(now);
  int32_t* h = m.stage_lru_patch(z.n, z.tick, z.n_owners);
  kv.fill_lru_patch(h, h + z.n, h + 2 * z.n);
}

TierStats reads_after_decode(TieredKv& kv, LlamaCuda& m, const std::vector<PageTable*>& seq_tables, int64_t now) {
  std::vector<TieredKv::Landed> landed;
  landed.reserve(m.landings().size());
  for (const LlamaCuda::Landing& l : m.landings()) landed.push_back({l.seq, PageId{l.layer, l.head, l.page}, l.dev_slot, l.host_slot, l.adopted});
  if (!kv.lru_mirrored()) return kv.after_step_reads(m.read_stamps(), m.read_stamp(), seq_tables, now, landed);
  // (the next copy into the buffer the LRU does not hold, however after_step_reads ends: it may
  // throw before or after taking the copy)
  struct Dst {
    const TieredKv& kv;
    LlamaCuda& m;
    ~Dst() { m.set_lru_mirror_dst(kv.lru().use_offsets().data()); }
  } dst{kv, m};
  std::span<int32_t> spare;
  return kv.after_step_reads(m.lru_mirror_copy(), m.lru_mirror_counts(), seq_tables, now, landed, &spare);
}

TierStats recall_after_decode(TieredKv& kv, LlamaCuda& m, const std::vector<PageTable*>& seq_tables, int64_t now) {
  TierStats st = reads_after_decode(kv, m, seq_tables, now);
  st += kv.after_step_recalls(late_reads_of(m), now);
  return st;
}

TierStats DeferredRecalls::after_decode(LlamaCuda& m, const std::vector<PageTable*>& seq_tables, int64_t now) {
  DHS_CHECK(!kept_, "a decode step's recalls kept while the last step's are still pending");
  const TierStats st = reads_after_decode(tiers_.kv(), m, seq_tables, now);
  kept_ = Kept{late_reads_of(m), now};
  return st;
}

std::function<void()> DeferredRecalls::in_flight() {
  in_flight_error_.clear();  // (a step whose forward threw after the callback ran left one)
  if (!kept_) return {};
  return [this] {
    try {
      run(true);
    } catch (const std::exception& e) {
      in_flight_error_ = e.what();  // (thrown after the step's wait: rethrow_in_flight)
    }
  };
}

void DeferredRecalls::rethrow_in_flight() {
  if (in_flight_error_.empty()) return;
  const std::string e = std::move(in_flight_error_);
  in_flight_error_.clear();
  throw Error("the KV hierarchy's recalls during the step: " + e);
}

void DeferredRecalls::run(bool in_flight) {
  if (!kept_) return;
  const Kept k = std::move(*kept_);
  kept_.reset();
  tiers_.kv().after_step_recalls(k.late, in_flight ? std::max(k.now, tiers_.clock()) : k.now, in_flight);
}

}  // namespace dhs
