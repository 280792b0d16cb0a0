// dhisparse public API: one message of a chat, as a chat template renders it.
#pragma once
#include <string>

namespace dhs {

struct ChatMessage {
  std::string role;     // "system", "user", "assistant", "tool"
  std::string content;
};

}  // namespace dhs
