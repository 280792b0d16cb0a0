#include "cli/prompt_input.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "cli/escapes.h"
#include "core/error.h"

namespace dhs::cli {

namespace {

std::string drop_one_newline(std::string s) {
  if (!s.empty() && s.back() == '\n') s.pop_back();
  if (!s.empty() && s.back() == '\r') s.pop_back();
  return s;
}

}  // namespace

std::string read_prompt_file(const std::string& path) {
  DHS_CHECK(!path.empty(), "prompt file: empty path");
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  DHS_CHECK(std::filesystem::exists(st), "prompt file '{}' does not exist", path);
  // Pipes stay allowed: `-f <(command)` hands over /dev/fd/N, a FIFO.
  DHS_CHECK(!std::filesystem::is_directory(st), "prompt file '{}' is a directory", path);
  std::ifstream f(path, std::ios::binary);
  DHS_CHECK(f.is_open(), "cannot open prompt file '{}': {}", path, std::strerror(errno));
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  DHS_CHECK(!f.bad(), "cannot read prompt file '{}': {}", path, std::strerror(errno));
  return drop_one_newline(std::move(text));
}

std::string read_prompt_stream(std::istream& in) {
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  DHS_CHECK(!in.bad(), "cannot read the prompt from stdin");
  return drop_one_newline(std::move(text));
}

std::string prompt_from_arg(const std::string& arg, bool escapes, std::istream& in) {
  if (arg == "-") return read_prompt_stream(in);
  if (arg.rfind("@@", 0) == 0) {
    const std::string text = arg.substr(1);
    return escapes ? process_escapes(text) : text;
  }
  if (arg.rfind('@', 0) == 0) return read_prompt_file(arg.substr(1));
  return escapes ? process_escapes(arg) : arg;
}

}  // namespace dhs::cli
