// Hopper (sm_90a) variant of the causal prefill attention: warpgroup MMAs (wgmma) instead of
// mma.sync, head_dim 128 only. launch_prefill_attention (prefill_attention.h) picks it when the
// device and build allow and its PrefillKernel asks for it (the default); same contract and results
// (within the stated tolerance: both accumulate in fp32 in the same key order per tile).
#pragma once
#include <cuda_runtime.h>

#include "backend/cuda/prefill_attention.h"

namespace dhs::cuda {

// Whether this device runs the sm_90a kernel (compute capability 9.x and an sm_90a image).
bool prefill_sm90_available();
// Launches `shape` (PrefillSm90Shape, prefill_attention.h; checked by check_prefill_sm90_shape) on
// `grid` (as launch_prefill_attention computes it); no checks.
void launch_prefill_attention_sm90(const PrefillAttentionParams& p, const PrefillSm90Shape& shape, dim3 grid,
                                   cudaStream_t stream);

}  // namespace dhs::cuda
