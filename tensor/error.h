// tessera::Error: the one exception type the public API throws. Messages name
// the op and what was expected versus what came ("matmul: inner dims differ:
// [4, 8] x [7, 3]"), so a user can fix the call without a debugger.
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <stdexcept>
#include <string>

namespace tessera {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// Throws tessera::Error with a fmt-formatted message.
template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace tessera

// Checks a precondition of a public function; the message is only formatted
// when the check fails.
#define TESSERA_CHECK(condition, ...)        \
  do {                                       \
    if (!(condition)) {                      \
      ::tessera::fail(__VA_ARGS__);          \
    }                                        \
  } while (false)
