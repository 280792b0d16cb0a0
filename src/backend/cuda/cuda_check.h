// CUDA error checks and device presence, for host code of the CUDA backend.
#pragma once
#include <cuda_runtime.h>

#include <string>

namespace dhs::cuda {

// Throws dhs::Error naming the call and the CUDA error.
void check(cudaError_t e, const char* what, const char* file, int line);

// Number of usable GPUs (0 when no driver or device); never throws.
int device_count();

}  // namespace dhs::cuda

#define DHS_CUDA_CHECK(call) ::dhs::cuda::check((call), #call, __FILE__, __LINE__)
