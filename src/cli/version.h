// `dhisparse --version`: the project version (CMakeLists.txt) and the git commit built.
#pragma once
#include <string>

namespace dhs::cli {

// "dhisparse 0.1.0 (git 1a2b3c4d5e6f)", "-dirty" after the hash when the tree had local
// changes at build time, no parenthesis when the build saw no git checkout.
std::string version_text();

}  // namespace dhs::cli
