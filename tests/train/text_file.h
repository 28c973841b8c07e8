// Small file helpers the trainer's tests share: whole files in and out, as
// bytes, and a substring check for the messages they read back.
#pragma once

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>

namespace tessera::testing {

inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream file(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()};
}

inline void write_file(const std::filesystem::path& path, std::string_view text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

inline bool contains(std::string_view text, std::string_view piece) { return text.find(piece) != std::string_view::npos; }

}  // namespace tessera::testing
