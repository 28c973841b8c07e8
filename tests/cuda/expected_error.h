// How the cuda suites check an error the simulator must raise: the message
// of the tessera::Error a launch throws, and a substring check that prints
// the whole message when the part is missing.
#pragma once

#include <doctest/doctest.h>

#include <string>

#include "tensor/error.h"

namespace tessera::testing {

template <typename Launch>
std::string error_of(Launch launch) {
  try {
    launch();
  } catch (const Error& error) {
    return error.what();
  }
  FAIL("the launch did not fail");
  return "";
}

inline bool contains(const std::string& text, const std::string& part) {
  const bool found = text.find(part) != std::string::npos;
  if (!found) MESSAGE(text);
  return found;
}

}  // namespace tessera::testing
