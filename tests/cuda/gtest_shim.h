// GoogleTest where it is installed; with -DDHS_NO_GTEST (the lent GPU machine has no
// GTest) a minimal stand-in with the same macros, so one test file builds both ways.
// The stand-in's main() runs every TEST (or those --gtest_filter=POS[-NEG] selects: ':'-
// separated patterns with * and ?, as GoogleTest reads them), prints "SKIP: <why>" for
// skipped ones, and exits 1 if any check failed, else 0. It supports TEST, EXPECT_/ASSERT_
// TRUE, FALSE, EQ, NE, LT, LE, GT, GE, NEAR, GTEST_SKIP and `<< message` after each of them.
#pragma once

#if !defined(DHS_NO_GTEST) && __has_include(<gtest/gtest.h>)
#include <gtest/gtest.h>
#else
#include <cmath>
#include <cstdio>
#include <exception>
#include <functional>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dhs_shim {

struct TestCase {
  const char* name;
  void (*fn)();
};
inline std::vector<TestCase>& registry() {
  static std::vector<TestCase> r;
  return r;
}
struct Registrar {
  Registrar(const char* name, void (*fn)()) { registry().push_back({name, fn}); }
};
inline int& failures() {
  static int n = 0;
  return n;
}
inline bool& skipped() {
  static bool s = false;
  return s;
}

struct Message {
  std::ostringstream os;
  template <typename T>
  Message& operator<<(const T& v) {
    os << v;
    return *this;
  }
};

enum class Kind { Nonfatal, Fatal, Skip };
struct Helper {
  const char* file;
  int line;
  std::string what;
  Kind kind;
  void operator=(const Message& m) const {
    if (kind == Kind::Skip) {
      skipped() = true;
      std::printf("SKIP: %s\n", m.os.str().c_str());
      return;
    }
    ++failures();
    std::printf("%s:%d: FAILED %s %s\n", file, line, what.c_str(), m.os.str().c_str());
  }
};

template <typename T>
std::string show(const T& v) {
  if constexpr (requires(std::ostream& o) { o << v; }) {
    std::ostringstream os;
    os << v;
    return os.str();
  } else {
    return "?";
  }
}
struct Result {
  bool ok;
  std::string text;
};
template <typename A, typename B, typename F>
Result cmp(const A& a, const B& b, F f, const char* expr) {
  if (f(a, b)) return {true, {}};
  return {false, std::string(expr) + " (" + show(a) + " vs " + show(b) + ")"};
}

// GoogleTest's filter: glob `pattern` (* any run, ? one character) against `name`.
inline bool glob(std::string_view pattern, std::string_view name) {
  if (pattern.empty()) return name.empty();
  if (pattern[0] == '*') return glob(pattern.substr(1), name) || (!name.empty() && glob(pattern, name.substr(1)));
  return !name.empty() && (pattern[0] == '?' || pattern[0] == name[0]) && glob(pattern.substr(1), name.substr(1));
}
inline bool any_glob(std::string_view patterns, std::string_view name) {  // ':'-separated
  while (true) {
    const size_t colon = patterns.find(':');
    if (glob(patterns.substr(0, colon), name)) return true;
    if (colon == std::string_view::npos) return false;
    patterns.remove_prefix(colon + 1);
  }
}
// --gtest_filter=POS[-NEG]: runs the tests POS matches (empty POS: all) and NEG does not.
inline bool selected(std::string_view filter, std::string_view name) {
  const size_t dash = filter.find('-');
  const std::string_view pos = filter.substr(0, dash);
  if (!pos.empty() && !any_glob(pos, name)) return false;
  return dash == std::string_view::npos || !any_glob(filter.substr(dash + 1), name);
}

}  // namespace dhs_shim

#define DHS_SHIM_FAIL_(kind, text) ::dhs_shim::Helper{__FILE__, __LINE__, (text), (kind)} = ::dhs_shim::Message()
#define DHS_SHIM_CHECK_(cond, text, kind, ret) \
  if (cond)                                    \
    ;                                          \
  else                                         \
    ret DHS_SHIM_FAIL_(kind, text)
#define DHS_SHIM_CMP_(a, b, op, kind, ret)                                                                  \
  if (::dhs_shim::Result dhs_r = ::dhs_shim::cmp(                                                           \
          (a), (b), [](const auto& x, const auto& y) { return x op y; }, #a " " #op " " #b);               \
      dhs_r.ok)                                                                                             \
    ;                                                                                                       \
  else                                                                                                      \
    ret DHS_SHIM_FAIL_(kind, dhs_r.text)

#define EXPECT_TRUE(c) DHS_SHIM_CHECK_(static_cast<bool>(c), #c, ::dhs_shim::Kind::Nonfatal, )
#define EXPECT_FALSE(c) DHS_SHIM_CHECK_(!static_cast<bool>(c), "!(" #c ")", ::dhs_shim::Kind::Nonfatal, )
#define ASSERT_TRUE(c) DHS_SHIM_CHECK_(static_cast<bool>(c), #c, ::dhs_shim::Kind::Fatal, return)
#define ASSERT_FALSE(c) DHS_SHIM_CHECK_(!static_cast<bool>(c), "!(" #c ")", ::dhs_shim::Kind::Fatal, return)
#define EXPECT_EQ(a, b) DHS_SHIM_CMP_(a, b, ==, ::dhs_shim::Kind::Nonfatal, )
#define EXPECT_NE(a, b) DHS_SHIM_CMP_(a, b, !=, ::dhs_shim::Kind::Nonfatal, )
#define EXPECT_LT(a, b) DHS_SHIM_CMP_(a, b, <, ::dhs_shim::Kind::Nonfatal, )
#define EXPECT_LE(a, b) DHS_SHIM_CMP_(a, b, <=, ::dhs_shim::Kind::Nonfatal, )
#define EXPECT_GT(a, b) DHS_SHIM_CMP_(a, b, >, ::dhs_shim::Kind::Nonfatal, )
#define EXPECT_GE(a, b) DHS_SHIM_CMP_(a, b, >=, ::dhs_shim::Kind::Nonfatal, )
#define ASSERT_EQ(a, b) DHS_SHIM_CMP_(a, b, ==, ::dhs_shim::Kind::Fatal, return)
#define ASSERT_NE(a, b) DHS_SHIM_CMP_(a, b, !=, ::dhs_shim::Kind::Fatal, return)
#define ASSERT_LT(a, b) DHS_SHIM_CMP_(a, b, <, ::dhs_shim::Kind::Fatal, return)
#define ASSERT_LE(a, b) DHS_SHIM_CMP_(a, b, <=, ::dhs_shim::Kind::Fatal, return)
#define ASSERT_GT(a, b) DHS_SHIM_CMP_(a, b, >, ::dhs_shim::Kind::Fatal, return)
#define ASSERT_GE(a, b) DHS_SHIM_CMP_(a, b, >=, ::dhs_shim::Kind::Fatal, return)
#define EXPECT_NEAR(a, b, tol) \
  DHS_SHIM_CHECK_(std::fabs(static_cast<double>(a) - static_cast<double>(b)) <= (tol), #a " ~ " #b, ::dhs_shim::Kind::Nonfatal, )
#define GTEST_SKIP() return DHS_SHIM_FAIL_(::dhs_shim::Kind::Skip, "")

#define TEST(suite, name)                                                                          \
  static void dhs_shim_##suite##_##name();                                                         \
  static ::dhs_shim::Registrar dhs_shim_reg_##suite##_##name(#suite "." #name, &dhs_shim_##suite##_##name); \
  static void dhs_shim_##suite##_##name()

int main(int argc, char** argv) {
  std::string_view filter = "*";
  for (int i = 1; i < argc; ++i)
    if (std::string_view a = argv[i]; a.substr(0, 15) == "--gtest_filter=") filter = a.substr(15);
  int n_fail_tests = 0, n_run = 0;
  for (const auto& t : ::dhs_shim::registry()) {
    if (!::dhs_shim::selected(filter, t.name)) continue;
    ++n_run;
    const int before = ::dhs_shim::failures();
    ::dhs_shim::skipped() = false;
    std::printf("[ RUN      ] %s\n", t.name);
    std::fflush(stdout);
    try {
      t.fn();
    } catch (const std::exception& e) {
      ++::dhs_shim::failures();
      std::printf("exception: %s\n", e.what());
    }
    const bool failed = ::dhs_shim::failures() != before;
    n_fail_tests += failed;
    std::printf("[ %s ] %s\n", failed ? " FAILED " : (::dhs_shim::skipped() ? " SKIPPED" : "      OK"), t.name);
    std::fflush(stdout);
  }
  std::printf("%d test(s), %d failed\n", n_run, n_fail_tests);
  return n_fail_tests ? 1 : 0;
}
#endif
