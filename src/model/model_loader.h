// Opens a model path as a WeightSource: a .gguf file or a Hugging Face directory.
#pragma once
#include <memory>
#include <string>

#include "model/weight_source.h"

namespace dhs {

// Throws dhs::Error naming the path when it is missing or not a model.
std::unique_ptr<WeightSource> open_weights(const std::string& path);

}  // namespace dhs
