#include "backend/cuda/cuda_check.h"

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
// Per thread: a launch reads the value of the thread that issues it (and a stream capture records
// on that thread too), so a benchmark's scope never reaches another thread's launches.
thread_local bool t_pdl_chain = true;
}  // namespace

bool pdl_chain() { return t_pdl_chain; }

ScopedPdlChain::ScopedPdlChain(bool on) : previous_(t_pdl_chain) { t_pdl_chain = on; }
ScopedPdlChain::~ScopedPdlChain() { t_pdl_chain = previous_; }

}  // namespace dhs::cuda
