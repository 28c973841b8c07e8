// One launch at a time per checkpoint root: an exclusive advisory lock
// (flock: file_lock.h) on ROOT/.lock, held by the rank that manages the root for as long
// as its CheckpointManager lives. A second launch into the same root (a job
// resubmitted while the first still runs) is refused with the holder's
// host and pid instead of two runs interleaving their saves and prunes.
// flock is released by the kernel when the process dies, so a crash never
// leaves a stale lock.
#pragma once

#include <optional>
#include <string>

#include "train/file_lock.h"

namespace tessera::train {

inline constexpr const char* kRootLockFile = ".lock";

class RootLock {
 public:
  // Throws tessera::Error naming the holder when another process (or another
  // manager in this one) holds the root.
  explicit RootLock(const std::string& root);

 private:
  std::optional<FileLock> lock_;
};

}  // namespace tessera::train
