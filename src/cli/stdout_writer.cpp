#include "cli/stdout_writer.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

namespace dhs::cli {

bool StdoutWriter::write(std::string_view s) {
  if (errno_ != 0) return false;
  if (s.empty()) return true;
  errno = 0;
  // stdout is fully buffered on a pipe or file: the error of a full disk shows only at the flush.
  if (std::fwrite(s.data(), 1, s.size(), stdout) != s.size() || std::fflush(stdout) != 0) {
    errno_ = errno != 0 ? errno : EIO;
    return false;
  }
  wrote_ = true;
  last_ = s.back();
  return true;
}

bool StdoutWriter::end_line() {
  if (wrote_ && last_ != '\n') return write("\n");
  if (errno_ != 0) return false;
  if (std::fflush(stdout) != 0) errno_ = errno != 0 ? errno : EIO;
  return errno_ == 0;
}

bool StdoutWriter::reader_gone() const { return errno_ == EPIPE; }

std::string StdoutWriter::error() const {
  return errno_ == 0 ? "" : std::string("writing output: ") + std::strerror(errno_);
}

std::string flush_stdout(bool* reader_gone) {
  errno = 0;
  const bool ok = std::fflush(stdout) == 0 && !std::ferror(stdout);
  if (ok) return "";
  const int e = errno != 0 ? errno : EIO;
  if (reader_gone) *reader_gone = e == EPIPE;
  return std::string("writing output: ") + std::strerror(e);
}

}  // namespace dhs::cli
