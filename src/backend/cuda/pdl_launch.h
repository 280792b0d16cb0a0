// Programmatic dependent launch of the decode step's chain of kernels (sm_90; DESIGN.md §1.2:
// the step runs as one CUDA graph). A kernel launched with launch_pdl may be scheduled while the
// stream's previous kernel is still running, once every block of that one has called
// griddep_launch_dependents (ptx.cuh) or exited; in a captured graph the edge is recorded as a
// programmatic one. So the kernel's blocks are resident and past their prologue when the
// previous kernel drains (the GEMV kernel streams its first weights then), instead of being
// launched after it.
//
// The contract for a kernel launched this way: it calls griddep_wait() before it reads anything
// an earlier kernel of the stream wrote and before it writes anything an earlier kernel reads
// (only immutable data — weights, parameters — before the wait), and it calls
// griddep_launch_dependents() only after its own wait, so that a dependent's prologue never runs
// ahead of more than one kernel. Every kernel of the chain waits, so completion is transitive:
// when kernel k has completed, so have all kernels before it.
#pragma once
#include <cuda_runtime.h>

#include <utility>

#include "backend/cuda/cuda_check.h"

namespace dhs::cuda {

// Whether launch_pdl launches programmatically on this thread: yes, unless a ScopedPdlChain(false)
// is alive on it.
bool pdl_chain();

// The benchmarks' A/B (dhisparse bench --no-pdl): while alive, launch_pdl on this thread launches
// programmatically or not as `on` says; the destructor restores what was in force before (scopes
// nest). Thread-local, so nothing else in the process sees it; the library itself never sets it.
// A captured CUDA graph keeps what was in force at its capture: a graph captured inside the scope
// replays with the scope's choice after it ends, and one captured before keeps the earlier choice.
class ScopedPdlChain {
 public:
  explicit ScopedPdlChain(bool on);
  ~ScopedPdlChain();
  ScopedPdlChain(const ScopedPdlChain&) = delete;
  ScopedPdlChain& operator=(const ScopedPdlChain&) = delete;

 private:
  bool previous_;
};

// A programmatic dependent launch whatever pdl_chain() says (a kernel that always follows its
// own primary: the attention merge after the split-KV grid, compact after select), or a plain
// one when `programmatic` is false.
template <typename... KArgs, typename... Args>
void launch_programmatic(bool programmatic, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                         cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = programmatic ? 1 : 0;
  DHS_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

// A kernel of the step's chain: programmatic while pdl_chain() says so.
template <typename... KArgs, typename... Args>
void launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Args&&... args) {
  launch_programmatic(pdl_chain(), kernel, grid, block, smem, stream, std::forward<Args>(args)...);
}

}  // namespace dhs::cuda
