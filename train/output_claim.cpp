// An output's temporary locked for the run, written, and published without replacing.
#include "train/output_claim.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "tensor/error.h"

namespace tessera::train {

namespace fs = std::filesystem;

namespace {

// Something was written at `path` (an empty regular file is a placeholder, as mktemp makes).
bool holds_written_file(const std::string& path) {
  struct stat info {};
  if (::lstat(path.c_str(), &info) != 0) return false;
  return !S_ISREG(info.st_mode) || info.st_size > 0;
}

}  // namespace

std::string partial_path(const std::string& path) { return path + ".partial"; }

OutputClaim::OutputClaim(std::string flag, std::string path, std::string temporary, checkpoint::Publish mode,
                         FileLock::Kind kind)
    : flag_(std::move(flag)), path_(std::move(path)), temporary_(std::move(temporary)), mode_(mode), kind_(kind) {
  const bool directory = kind_ == FileLock::Kind::directory;
  // A link there would be written through, then published in the output's place.
  std::error_code error;
  const fs::file_type type = fs::symlink_status(temporary_, error).type();
  TESSERA_CHECK(type == fs::file_type::not_found ||
                    type == (directory ? fs::file_type::directory : fs::file_type::regular),
                "{} {}: {} exists and is not a {}; the output is written there first and renamed into place, so move "
                "it away",
                flag_, path_, temporary_, directory ? "directory" : "regular file (a directory or a link)");
  try {
    lock_ = FileLock::try_lock(temporary_, kind_);
  } catch (const tessera::Error& failure) {
    tessera::fail("{} {}: {}", flag_, path_, failure.what());
  }
  TESSERA_CHECK(lock_, "{} {}: another launch is writing this output (it holds {}); give each launch its own path, or "
                "wait for that one to end",
                flag_, path_, temporary_);
  if (mode_ == checkpoint::Publish::no_clobber && holds_written_file(path_)) {
    discard_if_unwritten();
    tessera::fail("{} {} already exists: written since this launch checked it (by another launch given the same "
                  "output?); pass --overwrite to replace it, or choose another path",
                  flag_, path_);
  }
}

OutputClaim::~OutputClaim() { discard_if_unwritten(); }

void OutputClaim::discard_if_unwritten() noexcept {
  if (!lock_ || !lock_->still_at_path()) return;  // published, or no longer ours
  if (kind_ == FileLock::Kind::directory) {
    ::rmdir(temporary_.c_str());  // removes only an empty directory
    return;
  }
  struct stat info {};
  if (::fstat(lock_->fd(), &info) == 0 && info.st_size == 0) ::unlink(temporary_.c_str());
}

void OutputClaim::write(std::string_view bytes) const {
  TESSERA_CHECK(kind_ == FileLock::Kind::file, "{} {}: OutputClaim::write writes a file, not a directory", flag_,
                path_);
  try {
    // Through the locked descriptor: the file claimed is the file written.
    const int fd = lock_->fd();
    TESSERA_CHECK(::ftruncate(fd, 0) == 0 && ::lseek(fd, 0, SEEK_SET) == 0, "{}: cannot empty: {}", temporary_,
                  std::strerror(errno));
    checkpoint::write_all(fd, bytes.data(), static_cast<int64_t>(bytes.size()), temporary_);
    TESSERA_CHECK(::fsync(fd) == 0, "{}: fsync failed: {}", temporary_, std::strerror(errno));
    checkpoint::publish(temporary_, path_, mode_);
  } catch (const tessera::Error& failure) {
    tessera::fail("{} {}: {}", flag_, path_, failure.what());
  }
}

void OutputClaim::publish() const {
  try {
    checkpoint::publish(temporary_, path_, mode_);
  } catch (const tessera::Error& failure) {
    tessera::fail("{} {}: {}", flag_, path_, failure.what());
  }
}

}  // namespace tessera::train
