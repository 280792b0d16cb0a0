// Flag-value checks for the CLI, run by CLI11 while it parses (before any model loads):
// the bounds are the engine's own (engine/sampler.cpp `validate`, sparse/policy.cpp
// `make_policy`), stated in plain numbers. CLI11 prefixes each message with the option's
// name, so a message says what was typed, what kind of value is wanted and its range.
// CLI11's own Range/NonNegativeNumber say "not in range" for "abc" and print 1.79769e+308
// as the upper bound of a non-negative double; these do not.
#pragma once
#include <CLI/CLI.hpp>

#include <cstdint>
#include <optional>
#include <string>

namespace dhs::cli {

// An integer in [lo, hi]. hi == INT64_MAX: no upper bound ("an integer >= lo").
CLI::Validator int_in(int64_t lo, int64_t hi);
// --speculative-k: "auto" (rewritten to kSpeculativeAuto) or an integer in [0, hi].
CLI::Validator speculative_k_value(int64_t hi);

// A finite number between lo and hi; each end open (excluded) or closed.
enum class End { Open, Closed };
CLI::Validator real_in(double lo, End lo_end, double hi, End hi_end);

// A --seed: an unsigned 64-bit integer, or -1 for a random seed (as llama.cpp).
CLI::Validator seed_value();
// The seed a --seed value means (-1: drawn from std::random_device). Call after seed_value() passed.
uint64_t resolve_seed(const std::string& text);

// The whole of s as an integer, or nothing (leading '+' allowed, no spaces, no overflow).
std::optional<int64_t> parse_int(const std::string& s);

}  // namespace dhs::cli
