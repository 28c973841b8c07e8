// FileLock on ROOT/.lock, with the holder written inside for the error message.
#include "train/root_lock.h"

#include <fcntl.h>
#include <unistd.h>

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

std::string read_holder(const std::string& path) {
  char text[512] = {};
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  const ssize_t got = fd >= 0 ? ::pread(fd, text, sizeof(text) - 1, 0) : -1;
  if (fd >= 0) ::close(fd);
  return got > 0 ? std::string(text, static_cast<size_t>(got)) : std::string("an unknown process");
}

}  // namespace

RootLock::RootLock(const std::string& root) {
  const std::string path = (std::filesystem::path(root) / kRootLockFile).string();
  lock_ = FileLock::try_lock(path);
  TESSERA_CHECK(lock_, "{}: another launch is using this checkpoint root ({}); wait for it to end, or save to another "
                "root", root, read_holder(path));
  const std::string holder = fmt::format("pid {} on {}", ::getpid(), host_name());
  // The holder's name is for messages only; failing to write it is harmless.
  if (::ftruncate(lock_->fd(), 0) == 0) {
    [[maybe_unused]] const ssize_t written = ::pwrite(lock_->fd(), holder.data(), holder.size(), 0);
  }
}

}  // namespace tessera::train
