// Stand-in for builds without nvcc: --device cuda ends with a clear message.
#include "core/error.h"
#include "engine/step_runner.h"

namespace dhs {

std::unique_ptr<StepRunner> make_cuda_runner(const WeightSource&, const EngineOptions&, int64_t) {
  throw Error("--device cuda: this build has no CUDA backend (nvcc was not found when it was configured)");
}

}  // namespace dhs
