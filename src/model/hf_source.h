// A Hugging Face model directory (config.json + model.safetensors or sharded
// model-*.safetensors with model.safetensors.index.json) seen as a WeightSource:
// config.json becomes a ModelConfig, HF tensor names become canonical names, and
// every tensor the config implies is checked present with its expected shape.
#pragma once
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/safetensors_file.h"
#include "model/weight_source.h"

namespace dhs {

// config.json text -> ModelConfig for the supported architectures
// (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM).
// `name` becomes config.name; `where` names the file in errors.
// Throws dhs::Error for unsupported architectures or features and for invalid values.
ModelConfig parse_hf_config(std::string_view config_json, std::string name,
                            std::string_view where = "config.json");

// HF tensor name -> canonical name ("model.layers.3.mlp.up_proj.weight" ->
// "blk.3.ffn_up.weight"); nullopt for names the engine does not use (rotary inv_freq, ...).
std::optional<std::string> hf_canonical_name(std::string_view hf_name);

class HfDirSource final : public WeightSource {
 public:
  // Throws dhs::Error for a missing/invalid config, missing/malformed shards, an
  // index that disagrees with its shards, and missing or mis-shaped tensors.
  static std::unique_ptr<HfDirSource> open(const std::string& dir);

  const ModelConfig& config() const override { return config_; }
  const RawTensor* find(const std::string& canonical_name) const override;
  std::vector<std::string> tensor_names() const override;  // sorted
  std::string format() const override { return "safetensors"; }

  const std::string& dir() const { return dir_; }
  // Paths for Tokenizer::from_hf_files; "" when the file is not in the directory.
  const std::string& tokenizer_json_path() const { return tokenizer_json_path_; }
  const std::string& tokenizer_config_path() const { return tokenizer_config_path_; }

 private:
  HfDirSource() = default;

  std::string dir_;
  ModelConfig config_;
  std::vector<safetensors::SafetensorsFile> shards_;  // keep the mappings alive
  std::map<std::string, RawTensor, std::less<>> tensors_;  // by canonical name
  std::string tokenizer_json_path_;
  std::string tokenizer_config_path_;
};

}  // namespace dhs
