// C-style escapes in command-line text (`--stop "\n\n"`, `-p "a\tb"`), processed the
// way llama.cpp's `string_process_escapes` does, so that README examples and habits
// carried over from llama-cli mean the same here. The CLI applies it to -p, --system
// and --stop unless --no-escape is given.
#pragma once
#include <string>
#include <string_view>

namespace dhs::cli {

// Replaces \n \t \r \a \b \f \v \\ \" \' \? with their characters, \xH or \xHH with
// that byte, \uXXXX and \UXXXXXXXX with the code point in UTF-8 (a \uD8xx\uDCxx pair
// as one code point). Anything else — an unknown escape, \x or \u without enough hex
// digits, a lone surrogate, a code point past U+10FFFF, a trailing backslash — is kept
// as written, so text that merely contains backslashes (a Windows path) survives.
std::string process_escapes(std::string_view in);

}  // namespace dhs::cli
