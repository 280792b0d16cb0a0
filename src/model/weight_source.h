// A loaded model file set (GGUF file or HF directory) seen uniformly: its
// config, its tokenizer files and its tensors under canonical (GGUF-style) names:
//   token_embd.weight, output_norm.weight, output.weight (absent when tied),
//   blk.{i}.attn_norm.weight, blk.{i}.attn_{q,k,v,output}.weight, blk.{i}.attn_{q,k,v}.bias,
//   blk.{i}.attn_{q,k}_norm.weight, blk.{i}.ffn_norm.weight, blk.{i}.ffn_{gate,up,down}.weight
// Matrices are row-major [out_features, in_features] (= GGUF ne {in, out}).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/model_config.h"

namespace dhs {

struct RawTensor {
  std::string name;           // canonical name
  DType dtype = DType::F32;
  std::vector<int64_t> shape; // row-major, outermost first
  const uint8_t* data = nullptr;
  size_t n_bytes = 0;
  int64_t n_elems() const {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
};

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual const ModelConfig& config() const = 0;
  // nullptr when absent.
  virtual const RawTensor* find(const std::string& canonical_name) const = 0;
  virtual std::vector<std::string> tensor_names() const = 0;
  virtual std::string format() const = 0;  // "gguf" or "safetensors"
};

}  // namespace dhs
