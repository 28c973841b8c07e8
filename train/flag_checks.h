// The checks every flag of `train` and `generate` goes through before a run
// starts: each number within a stated range (finite, and never so large that
// a loop over it could not end), each path non-empty (an empty path must not
// quietly mean "off"), and one exit status for every usage error.
#pragma once

#include <cstdint>
#include <ostream>

#include <CLI/CLI.hpp>

#include "tensor/error.h"

namespace tessera::train {

// The exit status of every usage error (a bad or unknown flag, a value out of
// range, a missing required flag, flags naming clashing files, or asking for
// more than this machine has), as the README lists it.
inline constexpr int kUsageExitCode = 2;

// What a program's checks before its start throw: the command line cannot
// run as given. main() exits with kUsageExitCode on it.
class UsageError : public tessera::Error {
 public:
  using tessera::Error::Error;
};

// An integer flag in [min, max]: "must be in [1, 65536], got 0".
CLI::Validator integer_in(int64_t min, int64_t max);
// Any 64-bit unsigned integer (a seed), written whole: CLI11 alone wraps -1
// and saturates 2^64 without a word.
CLI::Validator any_uint64();
// A finite number in [min, max] (or (min, max] when `min_exclusive`).
CLI::Validator number_in(double min, double max, bool min_exclusive = false);
// A path that is not the empty string.
CLI::Validator non_empty_path();

// CLI11's handling of a parse error (help and version print and give 0),
// with every other error's status made kUsageExitCode.
int exit_after_parse_error(const CLI::App& app, const CLI::ParseError& error, std::ostream& out, std::ostream& err);

}  // namespace tessera::train
