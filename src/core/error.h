// Errors: one exception type for everything a user can get wrong (bad files,
// bad flags, bad requests). Front ends catch it and print / return its message.
#pragma once
#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace dhs {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

}  // namespace dhs

// Throws dhs::Error with a fmt-formatted message when `cond` is false.
#define DHS_CHECK(cond, ...)                                  \
  do {                                                        \
    if (!(cond)) throw ::dhs::Error(::fmt::format(__VA_ARGS__)); \
  } while (0)

// Internal invariant (a bug in dhisparse, not user input).
#define DHS_ASSERT(cond)                                                        \
  do {                                                                          \
    if (!(cond))                                                                \
      throw ::dhs::Error(::fmt::format("internal error: {} ({}:{})", #cond, \
                                       __FILE__, __LINE__));                   \
  } while (0)
