// The packed weight layouts of the device's bandwidth GEMV (quant_gemv v2): formats and the
// fixed geometry both sides agree on. What they hold and how they are made: model/packed_weight.h.
#pragma once
#include <array>
#include <cstdint>
#include <string_view>

namespace dhs {

enum class PackedFormat : uint8_t { Q8_0, Q4_K, FP8 };

constexpr std::string_view packed_format_name(PackedFormat f) {
  switch (f) {
    case PackedFormat::Q8_0: return "q8_0";
    case PackedFormat::Q4_K: return "q4_k";
    case PackedFormat::FP8: return "fp8";
  }
  return "unknown";
}

inline constexpr int64_t kPackChunk = 256;
inline constexpr int kPackMetaBytes = 16;
// Q4_K: nibble (0..7, bits 4k..4k+3 of the word) that holds element i of the word's 8.
inline constexpr std::array<int, 8> kNibbleOf = {0, 4, 1, 5, 2, 6, 3, 7};

constexpr int64_t packed_code_bytes(PackedFormat f) { return f == PackedFormat::Q4_K ? 128 : 256; }
constexpr bool packed_has_meta(PackedFormat f) { return f != PackedFormat::FP8; }

}  // namespace dhs
