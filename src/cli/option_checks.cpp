#include "cli/option_checks.h"

#include "dhisparse/scheduler.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>

namespace dhs::cli {

namespace {

std::string int_range_text(int64_t lo, int64_t hi) {
  if (hi == std::numeric_limits<int64_t>::max()) return fmt::format(">= {}", lo);
  return fmt::format("in [{}, {}]", lo, hi);
}

// "{:g}": 0.01 and 100 as a user would type them, not 0.010000 or 100.000000.
std::string real_range_text(double lo, End lo_end, double hi, End hi_end) {
  return fmt::format("{}{:g}, {:g}{}", lo_end == End::Open ? '(' : '[', lo, hi, hi_end == End::Open ? ')' : ']');
}

std::optional<uint64_t> parse_uint64(const std::string& s) {
  const char* b = s.data();
  const char* e = s.data() + s.size();
  if (b != e && *b == '+') ++b;
  uint64_t v = 0;
  const auto r = std::from_chars(b, e, v);
  if (b == e || r.ec != std::errc() || r.ptr != e) return std::nullopt;
  return v;
}

}  // namespace

std::optional<int64_t> parse_int(const std::string& s) {
  const char* b = s.data();
  const char* e = s.data() + s.size();
  if (b != e && *b == '+') ++b;
  int64_t v = 0;
  const auto r = std::from_chars(b, e, v);
  if (b == e || r.ec != std::errc() || r.ptr != e) return std::nullopt;
  return v;
}

CLI::Validator speculative_k_value(int64_t hi) {
  const CLI::Validator ints = int_in(0, hi);
  return CLI::Validator(
      [ints](std::string& s) -> std::string {
        if (s == "auto") {
          s = std::to_string(kSpeculativeAuto);
          return "";
        }
        std::string t = s;
        const std::string why = ints(t);
        return why.empty() ? "" : why + " or auto";
      },
      "auto|INT");
}

CLI::Validator int_in(int64_t lo, int64_t hi) {
  const std::string range = int_range_text(lo, hi);
  return CLI::Validator(
      [lo, hi, range](std::string& s) -> std::string {
        const auto v = parse_int(s);
        if (!v) {
          // A number too large for int64 is still a number: say "out of range", not "not an integer".
          const bool digits = !s.empty() && s.find_first_not_of("+-0123456789") == std::string::npos;
          if (!digits) return fmt::format("'{}' is not an integer (expected an integer {})", s, range);
          return fmt::format("{} is out of range (expected an integer {})", s, range);
        }
        if (*v < lo || *v > hi) return fmt::format("{} is out of range (expected an integer {})", s, range);
        return "";
      },
      hi == std::numeric_limits<int64_t>::max() ? fmt::format(">={}", lo) : fmt::format("[{}, {}]", lo, hi));
}

CLI::Validator real_in(double lo, End lo_end, double hi, End hi_end) {
  const std::string range = real_range_text(lo, lo_end, hi, hi_end);
  return CLI::Validator(
      [=](std::string& s) -> std::string {
        char* end = nullptr;
        const double v = s.empty() ? 0.0 : std::strtod(s.c_str(), &end);
        if (s.empty() || end != s.c_str() + s.size() || !std::isfinite(v))
          return fmt::format("'{}' is not a number (expected a number in {})", s, range);
        const bool above = lo_end == End::Open ? v > lo : v >= lo;
        const bool below = hi_end == End::Open ? v < hi : v <= hi;
        if (!above || !below) return fmt::format("{} is out of range (expected a number in {})", s, range);
        return "";
      },
      range);
}

CLI::Validator seed_value() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        if (s == "-1" || parse_uint64(s)) return "";
        return fmt::format("'{}' is not a seed (expected an integer in [0, {}], or -1 for a random seed)", s,
                           std::numeric_limits<uint64_t>::max());
      },
      "-1 (random) or [0, 2^64-1]");
}

uint64_t resolve_seed(const std::string& text) {
  if (text == "-1") {
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }
  return parse_uint64(text).value_or(0);
}

}  // namespace dhs::cli
