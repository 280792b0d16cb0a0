// Block-wide integer sum, for kernels whose blocks each need a total over the block (the
// list offsets of compact_lists_kernel and reuse_lists_kernel: the entries of every earlier list).
#pragma once

namespace dhs::cuda {

// Every thread passes its partial and gets the block's total. s_red: THREADS / 32 ints of
// shared memory, not reused by the caller before a later __syncthreads().
template <int THREADS>
__device__ __forceinline__ int block_sum(int v, int* s_red) {
  static_assert(THREADS % 32 == 0 && THREADS <= 1024, "whole warps");
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) s_red[threadIdx.x >> 5] = v;
  __syncthreads();
  int s = 0;
#pragma unroll
  for (int w = 0; w < THREADS / 32; ++w) s += s_red[w];
  return s;
}

}  // namespace dhs::cuda
