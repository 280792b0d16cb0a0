#include "backend/cuda/lru_mirror.h"

#include <algorithm>

#include "backend/cuda/cuda_check.h"

namespace dhs::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void lru_mirror_apply_kernel(int32_t* __restrict__ use, int32_t* __restrict__ owner,
                                        const int32_t* __restrict__ patch, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t s = patch[i];
    use[s] = patch[n + i];
    owner[s] = patch[2 * n + i];
  }
}

// Each lane's slot counts for its owner o (-1: none); the lanes of one owner add once, by the
// lowest of them.
template <bool kSmem>
__device__ void add_warp(int32_t o, int64_t* global_counts, unsigned long long* smem_counts) {
  const unsigned lanes = __match_any_sync(0xffffffffu, o);
  const int lane = threadIdx.x & 31;
  if (o < 0 || (__ffs(lanes) - 1) != lane) return;
  const int n = __popc(lanes);
  if constexpr (kSmem) {
    atomicAdd(&smem_counts[o], static_cast<unsigned long long>(n));
  } else {
    atomicAdd(reinterpret_cast<unsigned long long*>(&global_counts[o + 1]), static_cast<unsigned long long>(n));
  }
}

template <bool kSmem>
__global__ void lru_mirror_count_kernel(const int32_t* __restrict__ use, const int32_t* __restrict__ owner,
                                        int32_t n_slots, const int32_t* __restrict__ tick_p, int32_t n_owners,
                                        int64_t* __restrict__ counts) {
  extern __shared__ unsigned long long sh_counts[];
  if constexpr (kSmem) {
    for (int32_t o = threadIdx.x; o < n_owners; o += blockDim.x) sh_counts[o] = 0;
    __syncthreads();
  }
  const int32_t tick = *tick_p;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  // (every lane of a warp runs the same number of rounds: __match_any_sync takes the whole warp)
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x - (threadIdx.x & 31);
  for (int64_t w0 = first; w0 < n_slots; w0 += stride) {
    const int64_t s = w0 + (threadIdx.x & 31);
    int32_t o = -1;
    if (s < n_slots && use[s] == tick) {
      o = owner[s];
      if (o >= n_owners) o = -1;
    }
    add_warp<kSmem>(o, counts, sh_counts);
  }
  if constexpr (kSmem) {
    __syncthreads();
    for (int32_t o = threadIdx.x; o < n_owners; o += blockDim.x)
      if (sh_counts[o] != 0)
        atomicAdd(reinterpret_cast<unsigned long long*>(&counts[o + 1]), sh_counts[o]);
  }
}

int blocks_for(int64_t n) {
  int dev = 0, sms = 0;
  DHS_CUDA_CHECK(cudaGetDevice(&dev));
  DHS_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>((n + kThreads - 1) / kThreads, int64_t{sms} * 4)));
}

}  // namespace

void launch_lru_mirror_apply(int32_t* use, int32_t* owner, const int32_t* patch, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  lru_mirror_apply_kernel<<<blocks_for(n), kThreads, 0, stream>>>(use, owner, patch, n);
  DHS_CUDA_CHECK(cudaGetLastError());
}

void launch_lru_mirror_count(const int32_t* use, const int32_t* owner, int32_t n_slots, const int32_t* tick,
                             int32_t n_owners, int64_t* counts, cudaStream_t stream) {
  DHS_CUDA_CHECK(cudaMemsetAsync(counts, 0, static_cast<size_t>(n_owners + 1) * sizeof(int64_t), stream));
  if (n_slots <= 0 || n_owners <= 0) return;
  const int blocks = blocks_for(n_slots);
  if (n_owners <= kMirrorSmemOwners) {
    lru_mirror_count_kernel<true><<<blocks, kThreads, static_cast<size_t>(n_owners) * 8, stream>>>(use, owner, n_slots, tick,
                                                                                                    n_owners, counts);
  } else {
    lru_mirror_count_kernel<false><<<blocks, kThreads, 0, stream>>>(use, owner, n_slots, tick, n_owners, counts);
  }
  DHS_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dhs::cuda
