// dhisparse public API: the one exception type for everything a user can get wrong (bad
// files, bad flags, bad requests). Front ends catch it and print / return its message.
#pragma once
#include <stdexcept>
#include <string>

namespace dhs {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

}  // namespace dhs
