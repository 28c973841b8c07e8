// A fresh directory under the system's temp dir for one test, removed after it.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

#include <fmt/format.h>

namespace tessera::checkpoint::testing {

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    static int counter = 0;
    path = std::filesystem::temp_directory_path() / fmt::format("tessera-ckpt-{}-{}", ::getpid(), counter++);
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

}  // namespace tessera::checkpoint::testing
