// Named model shapes: the configuration of a published model without its weights, for
// random-weight speed measurements (`dhisparse bench`, `--load-format dummy --dummy-shape NAME`,
// as vLLM's dummy loader gives a model its shape and random values).
#pragma once
#include <string>
#include <vector>

#include "model/model_config.h"

namespace dhs {

// The shape called `name` (model_shape_names()); throws dhs::Error naming the known ones.
ModelConfig model_shape(const std::string& name);
std::vector<std::string> model_shape_names();

}  // namespace dhs
