// An exclusive advisory lock (flock) on a file or a directory, taken without
// waiting and held until the FileLock is destroyed: how a launch claims what
// it writes (a checkpoint root's .lock, an output: output_claim.h). The
// kernel drops the lock when the process dies, so a crash never leaves a
// stale one; flock locks an open file description, so two opens in one
// process exclude each other as two processes do.
#pragma once

#include <optional>
#include <string>
#include <utility>

namespace tessera::train {

class FileLock {
 public:
  enum class Kind {
    file,       // a regular file, created empty when absent (a link to one is followed)
    directory,  // a directory, created when absent (never through a link)
  };

  // The lock on `path`, or nullopt when someone else holds it. Once locked,
  // `path` must still name the locked file: a holder that renamed or removed
  // it in between leaves a file nobody else will open, so the new one at
  // `path` is locked instead. Throws tessera::Error naming the path when it
  // cannot be created or opened, or is not of `kind`.
  static std::optional<FileLock> try_lock(const std::string& path, Kind kind = Kind::file);

  FileLock(FileLock&& other) noexcept;
  FileLock& operator=(FileLock&& other) noexcept;
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  ~FileLock();  // closing releases the lock

  // The open file, for reading and writing it under the lock.
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  // Whether `path` still names the locked file (nothing renamed or removed it).
  bool still_at_path() const;

 private:
  FileLock(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}

  std::string path_;
  int fd_ = -1;
};

}  // namespace tessera::train
