// GPT-2's reversible byte <-> character map for byte-level BPE: every byte gets a
// printable character (bytes that are printable Latin-1 keep their code point, the
// others take U+0100.. in byte order), so vocabularies are plain strings, e.g. the
// space byte 0x20 is "Ġ" (U+0120).
#pragma once
#include <string>
#include <string_view>

namespace dhs {

// UTF-8 of the character that stands for byte `b`.
const std::string& byte_to_unicode(unsigned char b);

// Byte that character `cp` stands for, or -1 if `cp` is not in the map.
int unicode_to_byte(char32_t cp);

// Maps every character of a vocabulary entry back to its byte. Characters outside
// the map (added tokens written as plain text) are copied as their UTF-8.
std::string byte_level_decode(std::string_view token_text);

// Inverse of byte_level_decode: the vocabulary spelling of raw bytes.
std::string byte_level_encode(std::string_view bytes);

}  // namespace dhs
