// Generated text to stdout with every write checked, so that `> /dev/full` fails
// instead of exiting 0 with nothing written, and a reader that went away (`| head`)
// stops generation at once instead of after max_tokens.
//
// SIGPIPE keeps its default action: when the reader of a pipe exits, the next write ends
// the process quietly with status 141, as it does cat or seq. Where SIGPIPE is ignored
// (inherited from a parent that ignores it), the write fails with EPIPE instead; the CLI
// then stops, prints nothing more and exits with the same 141.
#pragma once
#include <string>
#include <string_view>

namespace dhs::cli {

inline constexpr int kExitReaderGone = 128 + 13;  // what a shell reports for a death by SIGPIPE

class StdoutWriter {
 public:
  // Writes and flushes s; false (now and on every later call) once a write failed.
  bool write(std::string_view s);
  // A newline unless the text written so far ends with one (or nothing was written), then a
  // flush: the stats line that follows on stderr then starts a line of its own even when
  // stdout and stderr share a pipe.
  bool end_line();
  bool failed() const { return errno_ != 0; }
  bool reader_gone() const;     // the failure was EPIPE
  std::string error() const;    // "writing output: No space left on device"

 private:
  int errno_ = 0;
  bool wrote_ = false;
  char last_ = '\n';
};

// Flushes stdout and reports a write error of anything printed with printf/std::cout
// (`info`, `eval`): "" when all went out, else the message. Sets *reader_gone on EPIPE.
std::string flush_stdout(bool* reader_gone);

}  // namespace dhs::cli
