// Hopper (sm_90a) variant of the causal prefill attention: warpgroup MMAs (wgmma) instead of
// mma.sync, head_dim 128 only. launch_prefill_attention (prefill_attention.h) picks it when the
// device and build allow and set_prefill_wgmma has not turned it off; same contract and results
// (within the stated tolerance: both accumulate in fp32 in the same key order per tile).
#pragma once
#include <cuda_runtime.h>

#include "backend/cuda/prefill_attention.h"

namespace dhs::cuda {

// Whether this device runs the sm_90a kernel (compute capability 9.x and an sm_90a image).
bool prefill_sm90_available();
// Keys per K/V tile, 64 or 128, process-wide, for the benchmark's sweep and the tests (both are
// tested). The default is the faster (docs/kernels/prefill_attention_NOTES.md, v2).
inline constexpr int kPrefillSm90BlockN = 128;
void set_prefill_sm90_block_n(int block_n);
// Launches on `grid` (as launch_prefill_attention computes it); no checks.
void launch_prefill_attention_sm90(const PrefillAttentionParams& p, dim3 grid, cudaStream_t stream);

}  // namespace dhs::cuda
