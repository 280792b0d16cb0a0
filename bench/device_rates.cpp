#include "bench/device_rates.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/cuda_check.h"

namespace dhs {

namespace {

// The fastest of `reps` copies of n bytes, in ms (CUDA events on the default stream).
float best_copy_ms(void* dst, const void* src, size_t n, cudaMemcpyKind kind, int reps) {
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  float best = 1e9f;
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(e0);
    cudaMemcpyAsync(dst, src, n, kind);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms;
    cudaEventElapsedTime(&ms, e0, e1);
    best = std::min(best, ms);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return best;
}

}  // namespace

double measure_copy_gbps() {
  const size_t n = size_t{4} << 30;
  void *a, *b;
  DHS_CUDA_CHECK(cudaMalloc(&a, n));
  DHS_CUDA_CHECK(cudaMalloc(&b, n));
  const float best = best_copy_ms(b, a, n, cudaMemcpyDeviceToDevice, 10);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * static_cast<double>(n) / (best * 1e-3) / 1e9;
}

double measure_h2d_gbps() {
  const size_t n = size_t{256} << 20;
  void *h = nullptr, *d = nullptr;
  DHS_CUDA_CHECK(cudaMallocHost(&h, n));
  DHS_CUDA_CHECK(cudaMalloc(&d, n));
  const float best = best_copy_ms(d, h, n, cudaMemcpyHostToDevice, 5);
  cudaFree(d);
  cudaFreeHost(h);
  return static_cast<double>(n) / (best * 1e-3) / 1e9;
}

}  // namespace dhs
