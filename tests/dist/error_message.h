// The message of the error a call throws, or "(no error)": for tests that
// compare whole messages.
#pragma once

#include <exception>
#include <functional>
#include <string>

namespace tessera::test {

inline std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& error) {
    return error.what();
  }
  return "(no error)";
}

}  // namespace tessera::test
