#include "backend/cuda/gather_rows.h"

namespace dhs::cuda {

namespace {
__global__ void gather_rows_kernel(const __grid_constant__ GatherRowsParams p) {
  const int64_t r = blockIdx.x;
  const float* s = p.src + static_cast<int64_t>(p.rows[r]) * p.n;
  float* d = p.dst + r * p.n;
  for (int64_t i = threadIdx.x; i < p.n; i += blockDim.x) d[i] = s[i];
}
}  // namespace

void launch_gather_rows(const GatherRowsParams& p, cudaStream_t stream) {
  if (p.n_out == 0) return;
  gather_rows_kernel<<<static_cast<unsigned>(p.n_out), 256, 0, stream>>>(p);
}

}  // namespace dhs::cuda
