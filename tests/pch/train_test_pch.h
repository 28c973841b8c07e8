// The train suite's precompiled header: the suites' own (test_pch.h) and
// CLI11, which the trainer's flag headers bring into most of its test files.

#include "tests/pch/test_pch.h"

#include <CLI/CLI.hpp>
