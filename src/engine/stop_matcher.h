// Stop strings over streamed text: holds back any tail that could still become
// a stop string, cuts the text where one appears.
#pragma once
#include <string>
#include <vector>

namespace dhs {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);
  // Feeds new text; returns the text that can be released now.
  std::string push(const std::string& text);
  // End of generation: releases what is held (unless a stop string was hit).
  std::string finish(const std::string& text = "");
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace dhs
