// Host vectors to and from device buffers, for the CUDA tests (the buffers are the caller's
// to cudaFree). Errors abort through DHS_CUDA_CHECK.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "core/fp16.h"

namespace dhs::test {

template <typename T>
T* to_device(const std::vector<T>& h) {
  T* d = nullptr;
  DHS_CUDA_CHECK(cudaMalloc(&d, std::max<size_t>(h.size(), 1) * sizeof(T)));
  if (!h.empty()) DHS_CUDA_CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}
template <typename T>
std::vector<T> to_host(const T* d, size_t n) {
  std::vector<T> h(n);
  if (n) DHS_CUDA_CHECK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

// n outputs of a kernel that writes fp32 (f32) or f16, as floats.
inline std::vector<float> to_host_floats(const void* d, size_t n, bool f32) {
  if (f32) return to_host(static_cast<const float*>(d), n);
  const auto h = to_host(static_cast<const uint16_t*>(d), n);
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = dhs::fp16_to_f32(h[i]);
  return out;
}

}  // namespace dhs::test
