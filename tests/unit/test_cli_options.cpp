// The CLI's flag checks (cli/option_checks.h), prompt sources (cli/prompt_input.h) and the
// thread cap of the global pool: what a user sees for a bad value, without running the binary.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "cli/option_checks.h"
#include "cli/prompt_input.h"
#include "core/error.h"
#include "core/thread_pool.h"

using namespace dhs::cli;

namespace {
std::string check(const CLI::Validator& v, std::string s) { return v(s); }
}  // namespace

TEST(OptionChecks, IntegerMessagesSayWhatIsWrong) {
  const auto v = int_in(0, 16777216);
  EXPECT_EQ(check(v, "12"), "");
  EXPECT_EQ(check(v, "+12"), "");
  EXPECT_EQ(check(v, "0"), "");
  EXPECT_EQ(check(v, "16777216"), "");
  EXPECT_NE(check(v, "abc").find("'abc' is not an integer"), std::string::npos);
  EXPECT_NE(check(v, "1.5").find("not an integer"), std::string::npos);
  EXPECT_NE(check(v, "").find("not an integer"), std::string::npos);
  const std::string neg = check(v, "-3");
  EXPECT_NE(neg.find("-3 is out of range"), std::string::npos);
  EXPECT_NE(neg.find("[0, 16777216]"), std::string::npos);
  EXPECT_EQ(neg.find("e+"), std::string::npos);  // never 1.79769e+308
  EXPECT_NE(check(v, "99999999999999999999999").find("out of range"), std::string::npos);
  EXPECT_NE(check(int_in(0, std::numeric_limits<int64_t>::max()), "-1").find(">= 0"), std::string::npos);
}

TEST(OptionChecks, RealRangesWithOpenEnds) {
  const auto top_p = real_in(0.0, End::Open, 1.0, End::Closed);
  EXPECT_EQ(check(top_p, "1"), "");
  EXPECT_EQ(check(top_p, "0.95"), "");
  EXPECT_EQ(check(top_p, "1e-3"), "");
  const std::string zero = check(top_p, "0");
  EXPECT_NE(zero.find("0 is out of range"), std::string::npos);
  EXPECT_NE(zero.find("(0, 1]"), std::string::npos);
  EXPECT_NE(check(top_p, "1.01").find("out of range"), std::string::npos);
  EXPECT_NE(check(top_p, "nan").find("not a number"), std::string::npos);
  EXPECT_NE(check(top_p, "inf").find("not a number"), std::string::npos);
  EXPECT_NE(check(top_p, "x").find("'x' is not a number"), std::string::npos);
  EXPECT_NE(check(real_in(0.0, End::Closed, 100.0, End::Closed), "-1").find("[0, 100]"), std::string::npos);
}

TEST(OptionChecks, SeedMinusOneIsRandom) {
  const auto v = seed_value();
  EXPECT_EQ(check(v, "-1"), "");
  EXPECT_EQ(check(v, "0"), "");
  EXPECT_EQ(check(v, "18446744073709551615"), "");
  EXPECT_NE(check(v, "-2").find("-1 for a random seed"), std::string::npos);
  EXPECT_NE(check(v, "18446744073709551616").find("not a seed"), std::string::npos);
  EXPECT_EQ(resolve_seed("42"), 42u);
  EXPECT_EQ(resolve_seed("18446744073709551615"), std::numeric_limits<uint64_t>::max());
  // Two random seeds agree with probability 2^-64.
  EXPECT_NE(resolve_seed("-1"), resolve_seed("-1"));
}

TEST(PromptInput, ArgumentForms) {
  std::istringstream none;
  EXPECT_EQ(prompt_from_arg(R"(a\nb)", true, none), "a\nb");
  EXPECT_EQ(prompt_from_arg(R"(a\nb)", false, none), R"(a\nb)");
  EXPECT_EQ(prompt_from_arg("@@handle", true, none), "@handle");
  std::istringstream in("from stdin\n");
  EXPECT_EQ(prompt_from_arg("-", true, in), "from stdin");
}

TEST(PromptInput, FilesAreTakenAsTheyAre) {
  const auto path = std::filesystem::temp_directory_path() / "dhs_test_prompt.txt";
  {
    std::ofstream f(path, std::ios::binary);
    f << "line\\n one\nline two\n";
  }
  std::istringstream none;
  // No escape processing in a file; one trailing newline dropped.
  EXPECT_EQ(prompt_from_arg("@" + path.string(), true, none), "line\\n one\nline two");
  EXPECT_EQ(read_prompt_file(path.string()), "line\\n one\nline two");
  std::filesystem::remove(path);
  EXPECT_THROW(read_prompt_file(path.string()), dhs::Error);
  EXPECT_THROW(read_prompt_file(std::filesystem::temp_directory_path().string()), dhs::Error);
  EXPECT_THROW(prompt_from_arg("@", true, none), dhs::Error);
}

TEST(ThreadCap, GlobalPoolNeverExceedsHardwareThreads) {
  const int hw = dhs::ThreadPool::hardware_threads();
  EXPECT_EQ(dhs::ThreadPool::set_global_threads(100000), hw);
  EXPECT_EQ(dhs::ThreadPool::global().n_threads(), hw);
  EXPECT_EQ(dhs::ThreadPool::set_global_threads(1), 1);
  EXPECT_EQ(dhs::ThreadPool::global().n_threads(), 1);
  EXPECT_EQ(dhs::ThreadPool::set_global_threads(0), hw);
}

