// cli/escapes.h: the C-style escapes of -p, --system and --stop (llama.cpp's set and more).
#include <gtest/gtest.h>

#include "cli/escapes.h"

using dhs::cli::process_escapes;

TEST(Escapes, CommonOnes) {
  EXPECT_EQ(process_escapes(R"(\n\n)"), "\n\n");
  EXPECT_EQ(process_escapes(R"(a\tb\rc)"), "a\tb\rc");
  EXPECT_EQ(process_escapes(R"(say \"hi\" and \'bye\')"), "say \"hi\" and 'bye'");
  EXPECT_EQ(process_escapes(R"(back\\slash)"), "back\\slash");
  EXPECT_EQ(process_escapes(R"(\a\b\f\v\?)"), "\a\b\f\v?");
}

TEST(Escapes, BackslashBeforeEscapeLetterIsLiteral) {
  // "\\n" is a backslash and an n, not a newline.
  EXPECT_EQ(process_escapes(R"(\\n)"), "\\n");
  EXPECT_EQ(process_escapes(R"(\\\n)"), "\\\n");
}

TEST(Escapes, Hex) {
  EXPECT_EQ(process_escapes(R"(\x41\x62)"), "Ab");
  EXPECT_EQ(process_escapes(R"(\x7)"), "\x07");
  EXPECT_EQ(process_escapes(R"(\x41BC)"), "ABC");  // two digits at most, as llama.cpp
  EXPECT_EQ(process_escapes(R"(\xZZ)"), "\\xZZ");  // no digit: kept as written
  EXPECT_EQ(process_escapes(R"(\x)"), "\\x");
  EXPECT_EQ(process_escapes(R"(\x00)"), std::string(1, '\0'));
}

TEST(Escapes, Unicode) {
  EXPECT_EQ(process_escapes(R"(\u00e9)"), "\xC3\xA9");           // é
  EXPECT_EQ(process_escapes(R"(\u20AC)"), "\xE2\x82\xAC");       // €
  EXPECT_EQ(process_escapes(R"(\u0041)"), "A");
  EXPECT_EQ(process_escapes(R"(\U0001F600)"), "\xF0\x9F\x98\x80");  // 😀
  EXPECT_EQ(process_escapes(R"(\uD83D\uDE00)"), "\xF0\x9F\x98\x80");  // the same as a surrogate pair
}

TEST(Escapes, MalformedIsKeptAsWritten) {
  EXPECT_EQ(process_escapes(R"(\u12)"), "\\u12");             // too few digits
  EXPECT_EQ(process_escapes(R"(\uD83D)"), "\\uD83D");         // lone high surrogate
  EXPECT_EQ(process_escapes(R"(\uDE00x)"), "\\uDE00x");       // lone low surrogate
  EXPECT_EQ(process_escapes(R"(\U00110000)"), "\\U00110000"); // past U+10FFFF
  EXPECT_EQ(process_escapes(R"(C:\path\q)"), "C:\\path\\q");  // unknown escapes (\p, \q)
  EXPECT_EQ(process_escapes("ends with \\"), "ends with \\");
}

TEST(Escapes, PlainTextUnchanged) {
  EXPECT_EQ(process_escapes(""), "");
  EXPECT_EQ(process_escapes("no escapes, ünïcödé"), "no escapes, ünïcödé");
  EXPECT_EQ(process_escapes("real\nnewline"), "real\nnewline");
}
