// flock on ROOT/.lock, with the holder written inside for the error message.
#include "train/root_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

#include <fmt/format.h>

#include "tensor/error.h"

namespace tessera::train {

namespace {

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "an unknown host";
  return name;
}

std::string read_holder(int fd) {
  char text[512] = {};
  const ssize_t got = ::pread(fd, text, sizeof(text) - 1, 0);
  return got > 0 ? std::string(text, static_cast<size_t>(got)) : std::string("an unknown process");
}

}  // namespace

RootLock::RootLock(const std::string& root) {
  const std::string path = (std::filesystem::path(root) / kRootLockFile).string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  TESSERA_CHECK(fd_ >= 0, "{}: cannot open the root's lock file: {}", path, std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    const std::string holder = read_holder(fd_);
    ::close(fd_);
    fd_ = -1;
    TESSERA_CHECK(error != EWOULDBLOCK, "{}: another launch is using this checkpoint root ({}); wait for it to end, "
                  "or save to another root", root, holder);
    fail("{}: cannot lock: {}", path, std::strerror(error));
  }
  const std::string holder = fmt::format("pid {} on {}", ::getpid(), host_name());
  // The holder's name is for messages only; failing to write it is harmless.
  if (::ftruncate(fd_, 0) == 0) {
    [[maybe_unused]] const ssize_t written = ::pwrite(fd_, holder.data(), holder.size(), 0);
  }
}

RootLock::~RootLock() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the lock
}

}  // namespace tessera::train
