// libFuzzer harness for the GGUF reader and dequantization: any input must either
// parse or throw dhs::Error, never crash or read out of bounds. Not built by default.
//
// Run (clang with libFuzzer, from the repository root):
//   clang++ -std=c++20 -O1 -g -march=x86-64-v3 -fsanitize=fuzzer,address,undefined -Isrc \
//     tests/fuzz/fuzz_gguf.cpp src/model/gguf_file.cpp src/model/dequant.cpp \
//     src/core/mapped_file.cpp -lfmt -o /tmp/fuzz_gguf
//   mkdir -p /tmp/gguf_corpus && cp tests/data/gguf/quant_blocks.gguf /tmp/gguf_corpus/
//   /tmp/fuzz_gguf /tmp/gguf_corpus -max_len=65536 -max_total_time=300
// Replay crashes without libFuzzer (g++ works too): add -DDHS_FUZZ_STANDALONE, drop
// -fsanitize=fuzzer, and pass the files as arguments.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "model/dequant.h"
#include "model/gguf_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // An exact-size copy, so ASan flags any read past the end of the input.
  const std::vector<uint8_t> buf(data, data + size);
  try {
    const auto f = dhs::gguf::GgufFile::parse(buf.data(), buf.size(), "fuzz");
    for (const auto& [key, value] : f.metadata()) {
      (void)key;
      (void)value.is_array();
    }
    // Dequantize what parsed, bounded so one input cannot take seconds.
    int64_t budget = int64_t{1} << 20;
    std::vector<float> row;
    for (const auto& t : f.tensors()) {
      if (!dhs::dequant_supported(t.type)) continue;
      const int64_t n_cols = t.ne[0];
      const int64_t n_rows = t.n_elems() / n_cols;
      const size_t row_bytes = dhs::dtype_row_bytes(t.type, n_cols);
      if (n_cols > budget) continue;
      row.resize(static_cast<size_t>(n_cols));
      for (int64_t r = 0; r < n_rows && budget >= n_cols; ++r, budget -= n_cols) {
        dhs::dequantize_row(t.type, t.data + static_cast<size_t>(r) * row_bytes, row.data(), n_cols);
      }
    }
  } catch (const dhs::Error&) {
    // Rejected cleanly: the expected outcome for most inputs.
  }
  return 0;
}

#include "standalone_main.h"
