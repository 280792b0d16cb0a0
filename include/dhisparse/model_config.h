// dhisparse public API: a model's architecture hyper-parameters, shared by every loader (GGUF,
// HF directory) and every backend. Loaders fill it; the model code reads it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dhisparse/rope_style.h"

namespace dhs {

enum class Arch { Llama, Qwen2, Qwen3 };

struct RopeScaling {
  enum class Kind { None, Linear, Llama3 };
  Kind kind = Kind::None;
  float factor = 1.0f;
  float low_freq_factor = 1.0f;   // Llama-3.1
  float high_freq_factor = 4.0f;  // Llama-3.1
  int64_t original_max_position = 8192;
};

struct ModelConfig {
  Arch arch = Arch::Llama;
  std::string name;          // human-readable (general.name or directory name)
  int64_t n_layers = 0;
  int64_t hidden = 0;        // d_model
  int64_t n_heads_q = 0;
  int64_t n_heads_kv = 0;
  int64_t head_dim = 0;
  int64_t ffn_hidden = 0;    // SwiGLU intermediate size
  int64_t vocab_size = 0;
  int64_t max_context = 0;   // trained context length
  float rms_eps = 1e-5f;
  float rope_theta = 10000.0f;
  RopeStyle rope_style = RopeStyle::Half;
  RopeScaling rope_scaling;
  // Per-frequency divisors (GGUF `rope_freqs.weight`, how llama.cpp's converter
  // stores Llama-3.1 scaling); empty when absent. [head_dim / 2]
  std::vector<float> rope_freq_factors;
  bool tied_embeddings = false;  // output projection reuses token_embd
  bool qkv_bias = false;         // Qwen2
  bool qk_norm = false;          // Qwen3: RMSNorm on q and k per head
};

const char* arch_name(Arch a);

}  // namespace dhs
