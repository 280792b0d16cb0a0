// The HBM tier's storage and the page lists that attention reads from it:
// a f16 head-page pool (K and V apart) and a device copy of one layer's CSR
// page lists. Selection kernels will write lists in place; upload() is for
// tests, benchmarks and the CPU-planned path.
//
//   k, v:     [n_pages, page_size, head_dim] f16
//   indptr:   [n_requests * n_heads_kv + 1]   row = req * n_heads_kv + kv_head
//   slots:    [nnz]  page slot in the pool
//   page_pos: [nnz]  logical page index in the sequence (tokens page_pos*page_size ..)
//   seq_len:  [n_requests]
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kv/page_lists.h"
#include "kv/page_pool.h"

namespace dhs::cuda {

// The pages a kernel reads: K and V of a pool in the device's address space — HBM
// (DevicePagePool::view) or the host tier's pinned pages mapped into it (HostPagePool::view in
// page_recall.h: every byte read crosses PCIe).
struct PagePoolView {
  const __half* k = nullptr;  // [n_pages, page_size, head_dim]
  const __half* v = nullptr;  // [n_pages, page_size, head_dim]
  int64_t n_pages = 0;
  int page_size = 0;
  int head_dim = 0;
};

class DevicePagePool {
 public:
  DevicePagePool(int64_t n_pages, int page_size, int head_dim);
  ~DevicePagePool();
  DevicePagePool(const DevicePagePool&) = delete;
  DevicePagePool& operator=(const DevicePagePool&) = delete;

  int64_t n_pages() const { return n_pages_; }
  int page_size() const { return page_size_; }
  int head_dim() const { return head_dim_; }
  size_t page_elems() const { return static_cast<size_t>(page_size_) * static_cast<size_t>(head_dim_); }

  __half* k_d() { return k_d_; }
  __half* v_d() { return v_d_; }
  const __half* k_d() const { return k_d_; }
  const __half* v_d() const { return v_d_; }
  PagePoolView view() const { return {k_d_, v_d_, n_pages_, page_size_, head_dim_}; }

  // Copies every page of a host pool of the same shape, rounding fp32 to f16
  // (nearest even). Synchronous.
  void upload(const PagePool& host);
  // Fills K and V with uniform values in [lo, hi) from a counter hash (benchmarks:
  // no 17 GB host staging). Asynchronous on `stream`.
  void fill_random(uint64_t seed, float lo, float hi, cudaStream_t stream);

 private:
  int64_t n_pages_;
  int page_size_, head_dim_;
  __half* k_d_ = nullptr;
  __half* v_d_ = nullptr;
};

// Device copy of a PageLists; capacity fixed at construction so replays of a
// captured step never allocate.
class DevicePageLists {
 public:
  DevicePageLists(int max_requests, int n_heads_kv, int64_t max_nnz);
  ~DevicePageLists();
  DevicePageLists(const DevicePageLists&) = delete;
  DevicePageLists& operator=(const DevicePageLists&) = delete;

  // Synchronous copy; throws dhs::Error if the lists exceed the capacity.
  void upload(const PageLists& lists);

  int n_requests() const { return n_requests_; }
  int n_heads_kv() const { return n_heads_kv_; }
  int max_requests() const { return max_requests_; }
  const int32_t* indptr_d() const { return indptr_d_; }
  const int32_t* slots_d() const { return slots_d_; }
  const int32_t* page_pos_d() const { return page_pos_d_; }
  const int32_t* seq_len_d() const { return seq_len_d_; }

 private:
  int max_requests_, n_heads_kv_;
  int64_t max_nnz_;
  int n_requests_ = 0;
  int32_t* indptr_d_ = nullptr;
  int32_t* slots_d_ = nullptr;
  int32_t* page_pos_d_ = nullptr;
  int32_t* seq_len_d_ = nullptr;
};

// Fills n f16 values with uniform values in [lo, hi) (same hash as DevicePagePool::fill_random).
void fill_random_f16(__half* x_d, size_t n, uint64_t seed, float lo, float hi, cudaStream_t stream);

}  // namespace dhs::cuda
