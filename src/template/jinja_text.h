// UTF-8 string helpers for the chat-template interpreter: Python's str methods
// (strip, split, title, ...) work on code points, so these do too. Case mapping
// covers ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic (see jinja_text.cpp).
// Results are checked against the running render's size limits (jinja_limits.h).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dhs::jinja {

// Decodes the code point starting at s[i] and advances i. Invalid bytes decode
// as themselves (one byte each) so that nothing is ever lost.
char32_t utf8_next(std::string_view s, size_t& i);
void utf8_append(std::string& out, char32_t cp);

// Start of the code point that ends at byte offset e (0 < e <= s.size(), e a code
// point boundary as utf8_next walks the string): walks strings backwards.
size_t utf8_prev(std::string_view s, size_t e);
// Byte offset of code point `idx`; negative counts from the end (Python's s[idx]);
// clamped to [0, s.size()]. Linear time, no allocation.
size_t utf8_byte_at(std::string_view s, int64_t idx);
// Byte offsets of every code point start, plus s.size() at the end (8 bytes per code
// point: callers check the length first).
std::vector<size_t> utf8_offsets(std::string_view s);
size_t utf8_length(std::string_view s);

// Substring search in linear time (std::string::find is O(n*m) in the worst case).
size_t find_sub(std::string_view hay, std::string_view needle, size_t from);
size_t rfind_sub(std::string_view hay, std::string_view needle);

// Python's str.isspace() for one code point.
bool is_py_space(char32_t cp);

// str.strip/lstrip/rstrip; chars == nullptr strips whitespace.
std::string py_strip(std::string_view s, const std::string* chars, bool left, bool right);
// str.split(sep=None | sep, maxsplit) and str.rsplit.
std::vector<std::string> py_split(std::string_view s, const std::string* sep, int64_t maxsplit);
std::vector<std::string> py_rsplit(std::string_view s, const std::string* sep, int64_t maxsplit);
std::vector<std::string> py_splitlines(std::string_view s, bool keepends);
// str.replace(old, new, count); count < 0 replaces all.
std::string py_replace(std::string_view s, std::string_view old_s, std::string_view new_s, int64_t count);
// str.count(sub)
int64_t py_count(std::string_view s, std::string_view sub);

std::string py_upper(std::string_view s);
std::string py_lower(std::string_view s);
std::string py_capitalize(std::string_view s);  // str.capitalize()
std::string py_title(std::string_view s);       // str.title()
std::string py_center(std::string_view s, int64_t width, std::string_view fill);  // str.center()
std::string jinja_title(std::string_view s);    // jinja2's |title filter (splits on -, space, ({[<)
bool py_is_alpha(char32_t cp);
bool py_is_cased_upper(char32_t cp);
bool py_is_cased_lower(char32_t cp);

// repr() of a str: quotes and escapes the way CPython does.
std::string py_str_repr(std::string_view s);
// markupsafe.escape
std::string html_escape(std::string_view s);
// json.dumps of a str (ensure_ascii selects \uXXXX for non-ASCII).
void json_quote(std::string& out, std::string_view s, bool ensure_ascii);

}  // namespace dhs::jinja
