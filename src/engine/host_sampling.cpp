#include "engine/host_sampling.h"

#include "core/error.h"

namespace dhs {

void HostSampling::set_sampled_vocab(int64_t n) {
  DHS_CHECK(n >= 1 && n <= vocab_, "sampled vocabulary {} outside [1, {}]", n, vocab_);
  n_sampled_ = n;
}

void HostSampling::begin(int slot, const SamplingParams& p) {
  DHS_CHECK(slot >= 0 && static_cast<size_t>(slot) < by_slot_.size(), "request slot {} outside [0, {})", slot,
            by_slot_.size());
  by_slot_[static_cast<size_t>(slot)].emplace(p);
}

void HostSampling::sample(const std::vector<StepRequest>& batch, StepOutput* out, bool keep_logits) {
  static const std::vector<int32_t> kNoHistory;
  out->sampled.assign(batch.size(), -1);
  for (size_t i = 0; i < batch.size(); ++i) {
    const StepRequest& r = batch[i];
    if (!r.sample) continue;
    DHS_CHECK(r.slot >= 0 && static_cast<size_t>(r.slot) < by_slot_.size() && by_slot_[static_cast<size_t>(r.slot)],
              "sampling slot {} before begin_request", r.slot);
    DHS_ASSERT(out->logits.size() >= (i + 1) * static_cast<size_t>(vocab_));
    out->sampled[i] = by_slot_[static_cast<size_t>(r.slot)]->sample(out->logits.data() + i * static_cast<size_t>(vocab_),
                                                                    n_sampled_, r.history ? *r.history : kNoHistory);
  }
  if (!keep_logits) out->logits.clear();
}

}  // namespace dhs
