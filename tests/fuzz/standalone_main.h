// Replays fuzz inputs without libFuzzer (built with -DDHS_FUZZ_STANDALONE, g++ works too):
// each argument is a file passed once to LLVMFuzzerTestOneInput. Included last by each target.
#pragma once
#if defined(DHS_FUZZ_STANDALONE)
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <vector>

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::ifstream in(argv[i], std::ios::binary);
    const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
    std::printf("ok %s (%zu bytes)\n", argv[i], bytes.size());
  }
  return 0;
}
#endif
