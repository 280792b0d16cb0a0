#include "bench/device_rates.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/cuda_check.h"

namespace dhs {

double measure_copy_gbps() {
  const size_t n = size_t{4} << 30;
  void *a, *b;
  DHS_CUDA_CHECK(cudaMalloc(&a, n));
  DHS_CUDA_CHECK(cudaMalloc(&b, n));
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  float best = 1e9f;
  for (int i = 0; i < 10; ++i) {
    cudaEventRecord(e0);
    cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms;
    cudaEventElapsedTime(&ms, e0, e1);
    best = std::min(best, ms);
  }
  cudaFree(a);
  cudaFree(b);
  return 2.0 * static_cast<double>(n) / (best * 1e-3) / 1e9;
}

double measure_h2d_gbps() {
  const size_t n = size_t{256} << 20;
  void *h = nullptr, *d = nullptr;
  DHS_CUDA_CHECK(cudaMallocHost(&h, n));
  DHS_CUDA_CHECK(cudaMalloc(&d, n));
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  float best = 1e9f;
  for (int i = 0; i < 5; ++i) {
    cudaEventRecord(e0);
    cudaMemcpyAsync(d, h, n, cudaMemcpyHostToDevice);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms;
    cudaEventElapsedTime(&ms, e0, e1);
    best = std::min(best, ms);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(d);
  cudaFreeHost(h);
  return static_cast<double>(n) / (best * 1e-3) / 1e9;
}

}  // namespace dhs
