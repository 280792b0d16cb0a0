// A GGUF file seen as a WeightSource: ModelConfig from `{arch}.*` metadata,
// tensors under their GGUF names (already the canonical names).
#pragma once
#include <map>
#include <memory>
#include <string>

#include "model/gguf_file.h"
#include "model/weight_source.h"

namespace dhs {

class GgufSource : public WeightSource {
 public:
  // Throws dhs::Error for malformed files and unsupported architectures.
  explicit GgufSource(const std::string& path);

  const ModelConfig& config() const override { return cfg_; }
  const RawTensor* find(const std::string& name) const override;
  std::vector<std::string> tensor_names() const override;
  std::string format() const override { return "gguf"; }
  const gguf::GgufFile& file() const { return file_; }

 private:
  gguf::GgufFile file_;
  ModelConfig cfg_;
  std::map<std::string, RawTensor> tensors_;
};

}  // namespace dhs
