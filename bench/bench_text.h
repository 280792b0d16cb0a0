// Small helpers the GPU comparison tools share (gpu_vs_cpu_greedy, spec_exactness_gpu): the top-2
// gap of a logit row and a JSON string escape for their rows.
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace dhs::bench {

// Largest minus second-largest of the first n logits (n >= 2).
inline float top2_gap(const std::vector<float>& l, int64_t n) {
  std::vector<float> v(l.begin(), l.begin() + n);
  std::partial_sort(v.begin(), v.begin() + 2, v.end(), std::greater<float>());
  return v[0] - v[1];
}

// The text as a JSON string body: quotes and backslashes escaped, newlines as \n, other control
// characters as spaces.
inline std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\', o += c;
    else if (c == '\n') o += "\\n";
    else if (static_cast<unsigned char>(c) < 0x20) o += ' ';
    else o += c;
  }
  return o;
}

}  // namespace dhs::bench
