// ReadFile / WriteFile over open, pread, write and fsync; publishing by rename.
#include "checkpoint/file_io.h"

#include <fcntl.h>
#include <stdio.h>  // renameat2
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "tensor/error.h"

namespace tessera::checkpoint {

namespace {

// "a FIFO": what a path that is not a regular file leads to, for messages.
std::string kind_of_file(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "a special file";
}

// rename(2) that fails with EEXIST instead of replacing: RENAME_NOREPLACE,
// else (EINVAL: a file system without it) link(2), which never replaces,
// then unlink(2). A directory cannot be linked; for one, plain rename(2) is
// the fallback, which replaces at most an empty directory (ENOTEMPTY else).
int rename_no_replace(const std::string& from, const std::string& to) {
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) return 0;
  if (errno != EINVAL && errno != ENOSYS) return -1;
  if (::link(from.c_str(), to.c_str()) == 0) return ::unlink(from.c_str());
  if (errno != EPERM) return -1;
  return ::rename(from.c_str(), to.c_str());
}

bool is_empty_regular_file(const std::string& path) {
  struct stat info {};
  return ::lstat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode) && info.st_size == 0;
}

}  // namespace

ReadFile::ReadFile(const std::string& path) : path_(path) {
  // O_NONBLOCK: a FIFO opens at once instead of waiting for a writer; the
  // type is then checked on what was opened, so nothing can swap it between.
  fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  TESSERA_CHECK(fd_ >= 0, "{}: cannot open for reading: {}", path, std::strerror(errno));
  struct stat info {};
  if (::fstat(fd_, &info) != 0) {
    const int error = errno;
    ::close(fd_);
    fail("{}: cannot examine: {}", path, std::strerror(error));
  }
  if (!S_ISREG(info.st_mode)) {
    ::close(fd_);
    fail("{}: {}, not a regular file; tessera reads only regular files", path, kind_of_file(info.st_mode));
  }
  const int flags = ::fcntl(fd_, F_GETFL);
  if (flags >= 0) ::fcntl(fd_, F_SETFL, flags & ~O_NONBLOCK);  // reads of a regular file block as usual
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
  write_all(fd_, data, bytes, path_);
  written_ += bytes;
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

void write_all(int fd, const void* data, int64_t bytes, const std::string& path) {
  const auto* cursor = static_cast<const char*>(data);
  for (int64_t left = bytes; left > 0;) {
    const ssize_t put = ::write(fd, cursor, static_cast<size_t>(left));
    if (put < 0 && errno == EINTR) continue;
    TESSERA_CHECK(put > 0, "{}: write failed after {} of {} bytes: {}", path, bytes - left, bytes,
                  put < 0 ? std::strerror(errno) : "nothing written");
    cursor += put;
    left -= put;
  }
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

void publish(const std::string& temporary, const std::string& path, Publish mode) {
  if (mode == Publish::replace) {
    TESSERA_CHECK(::rename(temporary.c_str(), path.c_str()) == 0, "{}: cannot rename {} to it: {}", path, temporary,
                  std::strerror(errno));
    return;
  }
  if (is_empty_regular_file(path)) ::unlink(path.c_str());  // a placeholder, not a file written
  if (rename_no_replace(temporary, path) == 0) return;
  const int error = errno;
  TESSERA_CHECK(error != EEXIST && error != ENOTEMPTY,
                "{} was written by someone else while this launch wrote its own to {} (a second launch with the same "
                "output?): it was not replaced, and this launch's is left at {}",
                path, temporary, temporary);
  fail("{}: cannot rename {} to it: {}; this launch's is left at {}", path, temporary, std::strerror(error), temporary);
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
