// RoPE's inverse frequencies of a model: its theta, its scaling (linear, Llama-3.1) and its
// per-frequency factors. Both backends upload or use the same table.
#pragma once
#include "model/model_config.h"

namespace dhs {

// inv_freq: [head_dim / 2]
void rope_inv_freq(const ModelConfig& cfg, float* inv_freq);

}  // namespace dhs
