// Reading a printed sharding plan back in tests (tests/fsdp/test_plan.cpp,
// tests/train/test_plan.cpp).
#pragma once

#include <sstream>
#include <string>

namespace tessera::fsdp::testing {

// The table row of `parameter` in a plan's text, its columns one space apart.
inline std::string table_row(const std::string& text, const std::string& parameter) {
  const size_t at = text.find("\n  " + parameter + " ");
  if (at == std::string::npos) return "(no row)";
  std::istringstream columns(text.substr(at + 1, text.find('\n', at + 1) - at - 1));
  std::string row, column;
  while (columns >> column) row += (row.empty() ? "" : " ") + column;
  return row;
}

}  // namespace tessera::fsdp::testing
