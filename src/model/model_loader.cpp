#include "model/model_loader.h"

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "model/gguf_source.h"
#include "model/hf_source.h"

namespace dhs {

std::unique_ptr<WeightSource> open_weights(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  DHS_CHECK(fs::exists(path, ec), "model path '{}' does not exist", path);
  if (fs::is_directory(path, ec)) return HfDirSource::open(path);
  char magic[4] = {0, 0, 0, 0};
  std::ifstream f(path, std::ios::binary);
  DHS_CHECK(f.good(), "cannot read model file '{}'", path);
  f.read(magic, 4);
  DHS_CHECK(f.gcount() == 4 && std::string(magic, 4) == "GGUF",
            "'{}' is not a GGUF file (bad magic) nor a Hugging Face model directory", path);
  return std::make_unique<GgufSource>(path);
}

}  // namespace dhs
