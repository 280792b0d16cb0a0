// Where tests find their data and the default model (set by ctest, see tests/CMakeLists.txt).
#pragma once
#include <cstdlib>
#include <string>

namespace dhs::test {
inline std::string data_dir() {
  const char* p = std::getenv("DHS_TEST_DATA");
  return p ? p : "tests/data";
}
inline std::string models_dir() {
  const char* p = std::getenv("DHS_MODELS_DIR");
  return p ? p : "models";
}
inline std::string default_model_path() { return models_dir() + "/SmolLM2-135M-Instruct.Q4_1.gguf"; }
}  // namespace dhs::test
