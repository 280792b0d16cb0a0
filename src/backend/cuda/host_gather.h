// The recall's host-side form (issue 23): CPU threads gather the moves' scattered host-tier pages
// into a pinned staging buffer, a chunk at a time, and each chunk crosses PCIe as two bulk copies
// (K, V) into a run of consecutive device slots. The copy engines move the bytes and the SMs stay
// with attention: the gather kernel (page_recall.h) reaches the PCIe rate alone but slows an
// attention kernel beside it by 29-48% (docs/kernels/page_recall_NOTES.md), where a bulk copy
// costs it ~5%. Two staging buffers: chunk c + 1 is gathered while chunk c crosses.
// Destinations must be consecutive (dst_first + i): the cache manager allocates a recall's slots
// as a run. The CPU statement of what it copies is kv/tier_copy.h.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <span>

#include "backend/cuda/device_page_pool.h"
#include "backend/cuda/page_recall.h"
#include "core/thread_pool.h"

namespace dhs::cuda {

class HostGatherRecall {
 public:
  // chunk_pages: pages per staging buffer (each holds their K and V); n_threads: gather threads
  // (0: one per hardware thread).
  HostGatherRecall(int page_size, int head_dim, int chunk_pages, int n_threads);
  ~HostGatherRecall();
  HostGatherRecall(const HostGatherRecall&) = delete;
  HostGatherRecall& operator=(const HostGatherRecall&) = delete;

  // Host pages src[i] -> device slots dst_first + i (K and V). Gathers on the calling thread and
  // the pool; the copies are enqueued on `stream` (returns when the last one is enqueued; a
  // staging buffer is reused only after its previous copies completed). Throws dhs::Error for
  // slots outside the pools or mismatched page shapes.
  void recall(const HostPagePool& host, std::span<const int32_t> src, DevicePagePool& dev, int64_t dst_first,
              cudaStream_t stream);
  int n_threads() const { return pool_.n_threads(); }

 private:
  int page_size_, head_dim_, chunk_pages_;
  size_t half_page_bytes_;
  ThreadPool pool_;
  char* staging_[2] = {nullptr, nullptr};  // [chunk_pages, K | V halves] pinned: K pages, then V pages
  cudaEvent_t done_[2] = {nullptr, nullptr};
  bool pending_[2] = {false, false};
};

}  // namespace dhs::cuda
