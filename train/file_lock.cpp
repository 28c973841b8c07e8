// flock without waiting, on the file that the path names once it is held.
#include "train/file_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "tensor/error.h"

namespace tessera::train {

namespace {

// How often the file at the path may be replaced under us before we give up:
// each time, another launch renamed or removed the one we had just locked.
constexpr int kMaxReplaced = 100;

// Opens (creating) what the lock is taken on. O_NONBLOCK: a FIFO put at the
// path opens at once and is refused by its type instead of blocking.
int open_lockable(const std::string& path, FileLock::Kind kind) {
  if (kind == FileLock::Kind::directory) {
    TESSERA_CHECK(::mkdir(path.c_str(), 0755) == 0 || errno == EEXIST, "{}: cannot create the directory: {}", path,
                  std::strerror(errno));
    const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    TESSERA_CHECK(fd >= 0, "{}: cannot open the directory: {}", path,
                  errno == ENOTDIR || errno == ELOOP ? "it is not a directory (a file, or a symbolic link)"
                                                     : std::strerror(errno));
    return fd;
  }
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_NONBLOCK | O_CLOEXEC, 0644);
  TESSERA_CHECK(fd >= 0, "{}: cannot open for writing: {}", path, std::strerror(errno));
  struct stat info {};
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    ::close(fd);
    fail("{}: not a regular file", path);
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

}  // namespace

std::optional<FileLock> FileLock::try_lock(const std::string& path, Kind kind) {
  for (int attempt = 0; attempt < kMaxReplaced; ++attempt) {
    const int fd = open_lockable(path, kind);
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int error = errno;
      ::close(fd);
      if (error == EWOULDBLOCK) return std::nullopt;
      fail("{}: cannot lock: {}", path, std::strerror(error));
    }
    FileLock lock(path, fd);
    if (lock.still_at_path()) return lock;
  }
  fail("{}: replaced {} times while being locked; is something renaming it in a loop?", path, kMaxReplaced);
}

FileLock::FileLock(FileLock&& other) noexcept : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)) {}

FileLock& FileLock::operator=(FileLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

FileLock::~FileLock() {
  if (fd_ >= 0) ::close(fd_);
}

bool FileLock::still_at_path() const {
  struct stat held {}, named {};
  return fd_ >= 0 && ::fstat(fd_, &held) == 0 && ::stat(path_.c_str(), &named) == 0 && held.st_dev == named.st_dev &&
         held.st_ino == named.st_ino;
}

}  // namespace tessera::train
