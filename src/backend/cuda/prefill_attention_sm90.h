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
// The kernel's shape, process-wide, for the benchmark's sweep and the tests (every shape is
// tested): keys per K/V tile, 64 or 128; warp-specialized: a third warpgroup gathers the K/V tiles
// into an mbarrier ring and the two consumer warpgroups run each at its own pace, else all
// threads gather and meet once per tile; ping-pong (warp-specialized only): the two consumers
// instead take turns at the tensor cores, one's softmax under the other's MMAs; stages: K/V tiles in the
// ring, 2 or 3 (3: warp-specialized only). The default is the fastest measured
// (docs/kernels/prefill_attention_NOTES.md).
struct PrefillSm90Shape {
  int block_n = 128;
  bool warp_specialized = true;
  bool ping_pong = true;
  int stages = 3;
};
inline constexpr PrefillSm90Shape kPrefillSm90Default{};
void set_prefill_sm90_shape(const PrefillSm90Shape& shape);
// Launches on `grid` (as launch_prefill_attention computes it); no checks.
void launch_prefill_attention_sm90(const PrefillAttentionParams& p, dim3 grid, cudaStream_t stream);

}  // namespace dhs::cuda
