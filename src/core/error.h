// Errors: dhs::Error (public: dhisparse/error.h) and the checks that throw it.
#pragma once
#include <string>

#include <fmt/format.h>

#include "dhisparse/error.h"

// Throws dhs::Error with a fmt-formatted message when `cond` is false.
#define DHS_CHECK(cond, ...)                                  \
  do {                                                        \
    if (!(cond)) throw ::dhs::Error(::fmt::format(__VA_ARGS__)); \
  } while (0)

// Internal invariant (a bug in dhisparse, not user input).
#define DHS_ASSERT(cond)                                                        \
  do {                                                                          \
    if (!(cond))                                                                \
      throw ::dhs::Error(::fmt::format("internal error: {} ({}:{})", #cond, \
                                       __FILE__, __LINE__));                   \
  } while (0)
