// Page summaries in HBM; see device_page_summary.h.
#include "backend/cuda/device_page_summary.h"

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/pdl_launch.h"
#include "backend/cuda/ptx.cuh"

namespace dhs::cuda {

DevicePageSummaries::DevicePageSummaries(int64_t n_pages, int head_dim, SummaryKind kind)
    : n_pages_(n_pages), head_dim_(head_dim), kind_(kind) {
  if (n_pages <= 0 || head_dim <= 0 || head_dim > 256 || head_dim % 32 != 0)
    check(cudaErrorInvalidValue, "DevicePageSummaries: bad shape", __FILE__, __LINE__);
  DHS_CUDA_CHECK(cudaMalloc(&data_d_, bytes()));
  // No page is summarized before its first append; zeros keep unwritten slots finite.
  DHS_CUDA_CHECK(cudaMemset(data_d_, 0, bytes()));
}

DevicePageSummaries::~DevicePageSummaries() { cudaFree(data_d_); }

namespace {

// One block per (token, KV head), one thread per dimension.
__global__ void summarize_pages_kernel(const __grid_constant__ SummarizePagesParams p) {
  ptx::griddep_wait();  // the pool rows are the previous kernels' output (pdl_launch.h)
  ptx::griddep_launch_dependents();
  const int64_t t = blockIdx.x;
  const int h = static_cast<int>(blockIdx.y);
  const int d = static_cast<int>(threadIdx.x);
  const int32_t slot = p.dst_slot[t * p.n_heads_kv + h];
  if (slot < 0 || slot >= p.n_pages) return;
  const int row = p.pos[t] % p.page_size;
  // Only the step's last writer of this page summarizes it (no two blocks write one summary).
  const bool last = row == p.page_size - 1 || t + 1 == p.n_tok || p.dst_slot[(t + 1) * p.n_heads_kv + h] != slot;
  if (!last || d >= p.head_dim) return;
  const __half* k = p.k_pool + static_cast<int64_t>(slot) * p.page_size * p.head_dim + d;
  __half* out = p.summaries + static_cast<int64_t>(slot) * 2 * p.head_dim + d;
  const int n = row + 1;
  if (p.kind == SummaryKind::MinMax) {
    float mn = INFINITY, mx = -INFINITY;
    for (int r = 0; r < n; ++r) {
      const float x = __half2float(k[r * p.head_dim]);
      mn = fminf(mn, x);
      mx = fmaxf(mx, x);
    }
    // The pool holds f16, so these round exactly; the directed modes say what must hold.
    out[0] = __float2half_rd(mn);
    out[p.head_dim] = __float2half_ru(mx);
  } else {
    float s = 0.0f;
    for (int r = 0; r < n; ++r) s += __half2float(k[r * p.head_dim]);
    const float mean = s / static_cast<float>(n);
    float m2 = 0.0f;  // two passes: no cancellation, and the rows are in L1 anyway
    for (int r = 0; r < n; ++r) {
      const float e = __half2float(k[r * p.head_dim]) - mean;
      m2 += e * e;
    }
    out[0] = __float2half_rn(mean);
    out[p.head_dim] = __float2half_rn(m2 / static_cast<float>(n));
  }
}

}  // namespace

void launch_summarize_pages(const SummarizePagesParams& p, cudaStream_t stream) {
  if (p.n_tok <= 0) return;
  const dim3 grid(static_cast<unsigned>(p.n_tok), static_cast<unsigned>(p.n_heads_kv));
  const int threads = (p.head_dim + 31) / 32 * 32;
  launch_pdl(summarize_pages_kernel, grid, dim3(threads), 0, stream, p);
  DHS_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dhs::cuda
