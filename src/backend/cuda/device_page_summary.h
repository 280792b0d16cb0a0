// Per-page key summaries in HBM (DESIGN.md §1.1), the device twin of
// sparse/page_summary.h: two f16 vectors per head-page slot, the statistics one
// mass estimator needs. In the step: RoPE + K/V append -> summarize_pages ->
// score + select (page_select.h) -> attention.
//
//   summaries: [n_pages, 2, head_dim] f16
//     MinMax:     (min, max) per dimension, min rounded down and max rounded up, so
//                 sum_d max(q_d min_d, q_d max_d) stays an upper bound of q.k (Quest)
//     MeanSpread: (mean, population variance) per dimension
//
// Two vectors of f16 are 512 B per 4 KiB K page (128 dims): scoring reads 1/16 of
// what dense attention reads. The summary of a page is recomputed from the page's
// rows in the pool by the last token written to it in a step, so a truncated page
// (rejected speculation) is repaired by its next append, with no separate hook.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace dhs::cuda {

enum class SummaryKind { MinMax, MeanSpread };

class DevicePageSummaries {
 public:
  DevicePageSummaries(int64_t n_pages, int head_dim, SummaryKind kind);
  ~DevicePageSummaries();
  DevicePageSummaries(const DevicePageSummaries&) = delete;
  DevicePageSummaries& operator=(const DevicePageSummaries&) = delete;

  int64_t n_pages() const { return n_pages_; }
  int head_dim() const { return head_dim_; }
  SummaryKind kind() const { return kind_; }
  size_t bytes() const { return static_cast<size_t>(n_pages_) * 2 * head_dim_ * 2; }
  __half* data_d() { return data_d_; }
  const __half* data_d() const { return data_d_; }

 private:
  int64_t n_pages_;
  int head_dim_;
  SummaryKind kind_;
  __half* data_d_ = nullptr;
};

// Same token/slot arguments as RopeAppendParams (ops.h), launched after the append.
struct SummarizePagesParams {
  const __half* k_pool = nullptr;  // [n_pages, page_size, head_dim]
  __half* summaries = nullptr;     // [n_pages, 2, head_dim]
  const int32_t* pos = nullptr;           // [n_tok]
  const int32_t* dst_slot = nullptr;      // [n_tok * n_heads_kv]; outside [0, n_pages): skipped
  SummaryKind kind = SummaryKind::MinMax;
  int64_t n_pages = 0;
  int page_size = 0;
  int64_t n_tok = 0;
  int n_heads_kv = 0;
  int head_dim = 0;  // <= 256
};

// For every (token, KV head) that is the last of the step to write its page (the
// next token of the step writes another slot, or the page is full), recomputes the
// page's summary over rows 0 .. pos % page_size. Tokens of one request are
// contiguous and in position order in a step (as everywhere in the engine).
void launch_summarize_pages(const SummarizePagesParams& p, cudaStream_t stream);

}  // namespace dhs::cuda
