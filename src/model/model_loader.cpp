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
  // stat() before any open: opening a FIFO blocks until a writer comes, and a device
  // (/dev/zero) reads forever; neither is a model.
  const fs::file_status st = fs::status(path, ec);
  DHS_CHECK(fs::exists(st), "model path '{}' does not exist", path);
  if (fs::is_directory(st)) return HfDirSource::open(path);
  DHS_CHECK(fs::is_regular_file(st), "model path '{}' is neither a regular file nor a directory", path);
  char magic[4] = {0, 0, 0, 0};
  std::ifstream f(path, std::ios::binary);
  DHS_CHECK(f.good(), "cannot read model file '{}'", path);
  f.read(magic, 4);
  DHS_CHECK(f.gcount() == 4 && std::string(magic, 4) == "GGUF",
            "'{}' is not a GGUF file (bad magic) nor a Hugging Face model directory", path);
  return std::make_unique<GgufSource>(path);
}

}  // namespace dhs
