// Base64 -> little-endian float32 array: how the reference data scripts store logits.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace dhs::test {

inline std::vector<float> decode_b64_f32(const std::string& s) {
  static const std::string tbl = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::vector<uint8_t> bytes;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : s) {
    if (c == '=') break;
    const auto p = tbl.find(c);
    if (p == std::string::npos) continue;
    acc = (acc << 6) | static_cast<uint32_t>(p);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      bytes.push_back(static_cast<uint8_t>((acc >> bits) & 0xff));
    }
  }
  std::vector<float> out(bytes.size() / 4);
  std::memcpy(out.data(), bytes.data(), out.size() * 4);
  return out;
}

}  // namespace dhs::test
