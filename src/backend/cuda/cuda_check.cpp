#include "backend/cuda/cuda_check.h"

#include "core/error.h"

namespace dhs::cuda {

void check(cudaError_t e, const char* what, const char* file, int line) {
  if (e != cudaSuccess) throw Error(fmt::format("CUDA error {} ({}) in {} at {}:{}", cudaGetErrorName(e),
                                                cudaGetErrorString(e), what, file, line));
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

}  // namespace dhs::cuda
