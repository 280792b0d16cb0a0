// Where `generate`'s prompt comes from: -p TEXT, -p @FILE, -p @@TEXT, -p - (stdin) or
// -f FILE, as llama-cli users expect (llama.cpp has -f and -p; @file is curl's and
// response-file habit). Text typed on the command line gets C-style escapes (escapes.h);
// text read from a file or stdin is taken as it is, since it can hold real newlines.
#pragma once
#include <istream>
#include <string>

namespace dhs::cli {

// The text of a -p argument: "@FILE" reads FILE, "@@TEXT" is the literal "@TEXT", "-" reads
// `in` (stdin), anything else is the text itself, escape-processed when `escapes`.
// Throws dhs::Error naming the file when it cannot be read.
std::string prompt_from_arg(const std::string& arg, bool escapes, std::istream& in);

// The whole of a prompt file, minus one trailing newline (as llama.cpp's -f, so that a file
// saved by an editor does not end the prompt with "\n"). Throws dhs::Error naming the path.
std::string read_prompt_file(const std::string& path);

// All of `in`, minus one trailing newline (`echo hi | dhisparse generate -p -`).
std::string read_prompt_stream(std::istream& in);

}  // namespace dhs::cli
