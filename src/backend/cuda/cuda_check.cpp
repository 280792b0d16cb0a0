#include "backend/cuda/cuda_check.h"

#include <atomic>

#include "backend/cuda/pdl_launch.h"

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

namespace {
std::atomic<bool> g_pdl_chain{true};
}  // namespace

void set_pdl_chain(bool on) { g_pdl_chain.store(on); }
bool pdl_chain() { return g_pdl_chain.load(); }

}  // namespace dhs::cuda
