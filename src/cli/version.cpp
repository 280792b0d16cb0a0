#include "cli/version.h"

#include "git_commit.h"  // generated at every build by git_commit.cmake: DHS_GIT_COMMIT

namespace dhs::cli {

std::string version_text() {
  std::string v = std::string("dhisparse ") + DHS_VERSION;
  if (const std::string commit = DHS_GIT_COMMIT; !commit.empty()) v += " (git " + commit + ")";
  return v;
}

}  // namespace dhs::cli
