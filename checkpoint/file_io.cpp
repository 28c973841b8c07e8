// ReadFile / WriteFile over open, pread, write and fsync.
#include "checkpoint/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "tensor/error.h"

namespace tessera::checkpoint {

ReadFile::ReadFile(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TESSERA_CHECK(fd_ >= 0, "{}: cannot open for reading: {}", path, std::strerror(errno));
  struct stat info {};
  if (::fstat(fd_, &info) != 0 || !S_ISREG(info.st_mode)) {
    ::close(fd_);
    fail("{}: not a regular file", path);
  }
  size_ = static_cast<int64_t>(info.st_size);
}

ReadFile::~ReadFile() {
  if (fd_ >= 0) ::close(fd_);
}

void ReadFile::read_at(int64_t offset, void* out, int64_t bytes) const {
  TESSERA_CHECK(offset >= 0 && bytes >= 0 && offset + bytes <= size_,
                "{}: reading bytes [{}, {}) of a {}-byte file (truncated?)", path_, offset, offset + bytes, size_);
  auto* cursor = static_cast<char*>(out);
  while (bytes > 0) {
    const ssize_t got = ::pread(fd_, cursor, static_cast<size_t>(bytes), offset);
    if (got < 0 && errno == EINTR) continue;
    TESSERA_CHECK(got > 0, "{}: read failed at byte {}: {}", path_, offset, got < 0 ? std::strerror(errno) : "end of file");
    cursor += got;
    offset += got;
    bytes -= got;
  }
}

WriteFile::WriteFile(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  TESSERA_CHECK(fd_ >= 0, "{}: cannot create: {}", path, std::strerror(errno));
}

WriteFile::~WriteFile() {
  if (fd_ >= 0) ::close(fd_);
}

void WriteFile::write(const void* data, int64_t bytes) {
  TESSERA_CHECK(fd_ >= 0, "{}: write after close", path_);
  const auto* cursor = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t put = ::write(fd_, cursor, static_cast<size_t>(bytes));
    if (put < 0 && errno == EINTR) continue;
    TESSERA_CHECK(put > 0, "{}: write failed after {} bytes: {}", path_, written_, std::strerror(errno));
    cursor += put;
    bytes -= put;
    written_ += put;
  }
}

void WriteFile::close(bool sync) {
  if (fd_ < 0) return;
  const int fd = fd_;
  fd_ = -1;
  if (sync && ::fsync(fd) != 0) {
    const int error = errno;
    ::close(fd);
    fail("{}: fsync failed: {}", path_, std::strerror(error));
  }
  TESSERA_CHECK(::close(fd) == 0, "{}: close failed: {}", path_, std::strerror(errno));
}

std::string read_file_text(const std::string& path) {
  const ReadFile file(path);
  std::string text(static_cast<size_t>(file.size()), '\0');
  file.read_at(0, text.data(), file.size());
  return text;
}

void sync_directory(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  TESSERA_CHECK(fd >= 0, "{}: cannot open the directory: {}", path, std::strerror(errno));
  const int result = ::fsync(fd);
  const int error = errno;
  ::close(fd);
  TESSERA_CHECK(result == 0, "{}: fsync of the directory failed: {}", path, std::strerror(error));
}

void check_can_create(const std::string& path) {
  namespace fs = std::filesystem;
  TESSERA_CHECK(!path.empty(), "an empty path");
  std::error_code error;
  TESSERA_CHECK(!fs::is_directory(path, error), "{}: is a directory, not a file name", path);
  const fs::path directory = fs::absolute(path).parent_path();
  TESSERA_CHECK(fs::is_directory(directory, error), "{}: the directory {} does not exist", path, directory.string());
  const std::string probe = fmt::format("{}.probe-{}", path, ::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  TESSERA_CHECK(fd >= 0, "{}: cannot create files in {}: {}", path, directory.string(), std::strerror(errno));
  const bool written = ::write(fd, "x", 1) == 1;
  const int write_error = errno;
  ::close(fd);
  ::unlink(probe.c_str());
  TESSERA_CHECK(written, "{}: cannot write in {}: {}", path, directory.string(), std::strerror(write_error));
}

}  // namespace tessera::checkpoint
