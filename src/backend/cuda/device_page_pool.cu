// HBM page pool (f16 head-pages) and device page lists; see device_page_pool.h.
#include "backend/cuda/device_page_pool.h"

#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "core/fp16.h"

namespace dhs::cuda {

namespace {

// dhs::Error with a clear message, without pulling fmt into a .cu file (nvcc 13 rejects it).
void require(bool cond, const std::string& what) {
  if (!cond) check(cudaErrorInvalidValue, what.c_str(), __FILE__, __LINE__);
}

__device__ __forceinline__ uint64_t mix64(uint64_t x) {  // splitmix64 finaliser
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

__global__ void fill_random_f16_kernel(__half* x, size_t n, uint64_t seed, float lo, float hi) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const uint64_t h = mix64(seed * 0x9e3779b97f4a7c15ull + i);
    const float u = static_cast<float>(h >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    x[i] = __float2half_rn(lo + (hi - lo) * u);
  }
}

template <typename T>
T* device_alloc(size_t n) {
  T* p = nullptr;
  DHS_CUDA_CHECK(cudaMalloc(&p, (n == 0 ? 1 : n) * sizeof(T)));
  return p;
}

}  // namespace

void fill_random_f16(__half* x_d, size_t n, uint64_t seed, float lo, float hi, cudaStream_t stream) {
  if (n == 0) return;
  fill_random_f16_kernel<<<1024, 256, 0, stream>>>(x_d, n, seed, lo, hi);
  DHS_CUDA_CHECK(cudaGetLastError());
}

DevicePagePool::DevicePagePool(int64_t n_pages, int page_size, int head_dim)
    : n_pages_(n_pages), page_size_(page_size), head_dim_(head_dim) {
  require(n_pages > 0 && n_pages < (int64_t{1} << 31), "DevicePagePool: bad page count");
  require(page_size > 0 && head_dim > 0 && head_dim % 8 == 0, "DevicePagePool: bad page shape");
  // NOTE: size_t: a 128k x 32 pool holds 2^33 elements.
  const size_t n = static_cast<size_t>(n_pages) * page_elems();
  k_d_ = device_alloc<__half>(n);
  v_d_ = device_alloc<__half>(n);
}

DevicePagePool::~DevicePagePool() {
  cudaFree(k_d_);
  cudaFree(v_d_);
}

void DevicePagePool::upload(const PagePool& host) {
  require(host.n_pages() == n_pages_ && host.page_size() == page_size_ && host.head_dim() == head_dim_,
          "DevicePagePool::upload: host pool shape differs");
  require(host.has_storage(), "DevicePagePool::upload: host pool has no storage");
  const size_t n = static_cast<size_t>(n_pages_) * page_elems();
  // Host pool storage is one contiguous array per K / V (slot-major), so slot 0's page is its start.
  const float* k = host.k_page(PageRef{host.tier(), 0});
  const float* v = host.v_page(PageRef{host.tier(), 0});
  std::vector<uint16_t> buf(n);
  for (size_t i = 0; i < n; ++i) buf[i] = f32_to_fp16(k[i]);
  DHS_CUDA_CHECK(cudaMemcpy(k_d_, buf.data(), n * 2, cudaMemcpyHostToDevice));
  for (size_t i = 0; i < n; ++i) buf[i] = f32_to_fp16(v[i]);
  DHS_CUDA_CHECK(cudaMemcpy(v_d_, buf.data(), n * 2, cudaMemcpyHostToDevice));
}

void DevicePagePool::fill_random(uint64_t seed, float lo, float hi, cudaStream_t stream) {
  const size_t n = static_cast<size_t>(n_pages_) * page_elems();
  fill_random_f16(k_d_, n, seed * 2 + 0, lo, hi, stream);
  fill_random_f16(v_d_, n, seed * 2 + 1, lo, hi, stream);
}

DevicePageLists::DevicePageLists(int max_requests, int n_heads_kv, int64_t max_nnz)
    : max_requests_(max_requests), n_heads_kv_(n_heads_kv), max_nnz_(max_nnz) {
  require(max_requests > 0 && n_heads_kv > 0 && max_nnz >= 0 && max_nnz < (int64_t{1} << 31),
          "DevicePageLists: bad capacity");
  indptr_d_ = device_alloc<int32_t>(static_cast<size_t>(max_requests) * n_heads_kv + 1);
  slots_d_ = device_alloc<int32_t>(static_cast<size_t>(max_nnz));
  page_pos_d_ = device_alloc<int32_t>(static_cast<size_t>(max_nnz));
  seq_len_d_ = device_alloc<int32_t>(static_cast<size_t>(max_requests));
}

DevicePageLists::~DevicePageLists() {
  cudaFree(indptr_d_);
  cudaFree(slots_d_);
  cudaFree(page_pos_d_);
  cudaFree(seq_len_d_);
}

void DevicePageLists::upload(const PageLists& lists) {
  require(lists.n_heads_kv == n_heads_kv_, "DevicePageLists::upload: n_heads_kv differs");
  require(lists.n_requests >= 1 && lists.n_requests <= max_requests_, "DevicePageLists::upload: too many requests");
  require(lists.nnz() <= max_nnz_, "DevicePageLists::upload: more pages than the capacity");
  const size_t n_rows = static_cast<size_t>(lists.n_requests) * n_heads_kv_;
  require(lists.indptr.size() == n_rows + 1 && lists.indptr.front() == 0 && lists.indptr.back() == lists.nnz() &&
              lists.page_pos.size() == lists.slots.size() &&
              lists.seq_len.size() == static_cast<size_t>(lists.n_requests),
          "DevicePageLists::upload: inconsistent CSR arrays");
  n_requests_ = lists.n_requests;
  DHS_CUDA_CHECK(cudaMemcpy(indptr_d_, lists.indptr.data(), (n_rows + 1) * 4, cudaMemcpyHostToDevice));
  if (lists.nnz() > 0) {
    DHS_CUDA_CHECK(cudaMemcpy(slots_d_, lists.slots.data(), lists.slots.size() * 4, cudaMemcpyHostToDevice));
    DHS_CUDA_CHECK(cudaMemcpy(page_pos_d_, lists.page_pos.data(), lists.page_pos.size() * 4, cudaMemcpyHostToDevice));
  }
  DHS_CUDA_CHECK(cudaMemcpy(seq_len_d_, lists.seq_len.data(), lists.seq_len.size() * 4, cudaMemcpyHostToDevice));
}

}  // namespace dhs::cuda
