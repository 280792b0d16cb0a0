// host_gather.h: double-buffered gather on the CPU, bulk copies on the copy engine.
#include "backend/cuda/host_gather.h"

#include <cstring>

#include "backend/cuda/cuda_check.h"
#include "core/error.h"

namespace dhs::cuda {

HostGatherRecall::HostGatherRecall(int page_size, int head_dim, int chunk_pages, int n_threads)
    : page_size_(page_size), head_dim_(head_dim), chunk_pages_(chunk_pages),
      half_page_bytes_(static_cast<size_t>(page_size) * static_cast<size_t>(head_dim) * sizeof(__half)),
      pool_(n_threads) {
  DHS_CHECK(chunk_pages > 0, "host gather: chunk of {} pages", chunk_pages);
  for (int b = 0; b < 2; ++b) {
    DHS_CUDA_CHECK(cudaMallocHost(&staging_[b], 2 * static_cast<size_t>(chunk_pages) * half_page_bytes_));
    DHS_CUDA_CHECK(cudaEventCreateWithFlags(&done_[b], cudaEventDisableTiming));
  }
}

HostGatherRecall::~HostGatherRecall() {
  for (int b = 0; b < 2; ++b) {
    if (done_[b]) {
      cudaEventSynchronize(done_[b]);
      cudaEventDestroy(done_[b]);
    }
    if (staging_[b]) cudaFreeHost(staging_[b]);
  }
}

void HostGatherRecall::recall(const HostPagePool& host, std::span<const int32_t> src, DevicePagePool& dev,
                              int64_t dst_first, cudaStream_t stream) {
  DHS_CHECK(host.page_size() == page_size_ && host.head_dim() == head_dim_ && dev.page_size() == page_size_ &&
                dev.head_dim() == head_dim_,
            "host gather: page shapes differ");
  const int64_t n = static_cast<int64_t>(src.size());
  DHS_CHECK(dst_first >= 0 && dst_first + n <= dev.n_pages(), "host gather: device slots [{}, {}) outside the pool of {}",
            dst_first, dst_first + n, dev.n_pages());
  for (const int32_t s : src) DHS_CHECK(s >= 0 && s < host.n_pages(), "host gather: host slot {} outside [0, {})", s, host.n_pages());
  const char* hk = reinterpret_cast<const char*>(host.k_h());
  const char* hv = reinterpret_cast<const char*>(host.v_h());
  const size_t hp = half_page_bytes_;
  int b = 0;
  for (int64_t c0 = 0; c0 < n; c0 += chunk_pages_, b ^= 1) {
    const int64_t m = std::min<int64_t>(chunk_pages_, n - c0);
    if (pending_[b]) DHS_CUDA_CHECK(cudaEventSynchronize(done_[b]));  // its last copies read it
    char* sk = staging_[b];
    char* sv = staging_[b] + static_cast<size_t>(m) * hp;
    pool_.parallel_for(m, [&](int64_t lo, int64_t hi, int) {
      for (int64_t i = lo; i < hi; ++i) {
        const size_t from = static_cast<size_t>(src[static_cast<size_t>(c0 + i)]) * hp;
        std::memcpy(sk + static_cast<size_t>(i) * hp, hk + from, hp);
        std::memcpy(sv + static_cast<size_t>(i) * hp, hv + from, hp);
      }
    }, 16);
    const size_t to = static_cast<size_t>(dst_first + c0) * hp;
    DHS_CUDA_CHECK(cudaMemcpyAsync(reinterpret_cast<char*>(dev.k_d()) + to, sk, static_cast<size_t>(m) * hp,
                                   cudaMemcpyHostToDevice, stream));
    DHS_CUDA_CHECK(cudaMemcpyAsync(reinterpret_cast<char*>(dev.v_d()) + to, sv, static_cast<size_t>(m) * hp,
                                   cudaMemcpyHostToDevice, stream));
    DHS_CUDA_CHECK(cudaEventRecord(done_[b], stream));
    pending_[b] = true;
  }
}

}  // namespace dhs::cuda
