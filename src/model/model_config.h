// ModelConfig (public: dhisparse/model_config.h) and the tensors a config's model holds.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dhisparse/model_config.h"

namespace dhs {

// A tensor every model of a config holds, under its canonical name (model/weight_source.h),
// with its row-major shape.
struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
};
// The tensors loading reads (model/arch/llama_cpu.cpp and llama_cuda.cpp load this list), in
// loading order: what `dhisparse info` checks so that it fails on the files loading fails on.
std::vector<TensorSpec> required_tensors(const ModelConfig& c);

}  // namespace dhs
