// dhisparse public API: how RoPE pairs the dimensions of a head, a property of a model's weight
// layout (ModelConfig::rope_style) that the backends' RoPE kernels take; its own header so that
// backend/ needs nothing from model/.
#pragma once

namespace dhs {

// Interleaved: (x[2i], x[2i+1]) — GGUF llama files (convert_hf_to_gguf permutes Q/K
//              rows so that this pairing reproduces the HF model).
// Half:        (x[i], x[i + d/2]) — HF checkpoints, and GGUF qwen2/qwen3 ("NeoX").
enum class RopeStyle { Interleaved, Half };

}  // namespace dhs
