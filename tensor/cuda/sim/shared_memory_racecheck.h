// Racecheck for shared memory, as compute-sanitizer's racecheck: two threads
// of a block touch the same byte between two barriers, at least one of them
// writing and not both atomically, is a hazard. Accesses that a __syncwarp
// orders (both threads in one warp, the sync between them) are not. One
// shadow entry per byte of the window, stamped with the barrier epoch, so a
// barrier clears every entry at once.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace tessera::cuda::sim {

enum class AccessKind : uint8_t { read, write, atomic };

// The thread making an access: its linear index in the block, its warp, and
// how many __syncwarp its warp has completed.
struct Accessor {
  int32_t thread;
  int32_t warp;
  uint32_t warp_syncs;
};

struct Hazard {
  const char* kind;      // "read-after-write", "write-after-read", "write-after-write"
  int64_t offset;        // first byte in the window
  int32_t other_thread;  // the earlier access's thread
};

class SharedMemoryRacecheck {
 public:
  // A window of `bytes` bytes, empty, for a new block.
  void reset(int64_t bytes);
  // A barrier: everything before it is ordered with everything after.
  void next_epoch() { ++epoch_; }
  // Records an access of [offset, offset + bytes) and returns its first hazard.
  std::optional<Hazard> access(int64_t offset, int64_t bytes, AccessKind kind, const Accessor& who);
  // The distinct bytes the block has touched since reset(): the simulator's
  // measure of a kernel's static shared memory, whose declared size g++ does
  // not keep.
  int64_t touched_bytes() const { return touched_bytes_; }

 private:
  static constexpr int32_t kNone = -1;
  static constexpr int32_t kManyWarps = -2;
  struct Shadow {
    uint64_t epoch = 0;  // entries from an older epoch are empty
    uint64_t block = 0;  // the block that last touched the byte
    int32_t writer = kNone;
    int32_t writer_warp = kNone;
    uint32_t writer_syncs = 0;
    bool writer_atomic = false;
    bool many_readers = false;  // at least two distinct readers
    int32_t reader = kNone;     // the first reader
    int32_t reader_warp = kNone;  // the readers' warp, or kManyWarps
    uint32_t reader_syncs = 0;    // the latest __syncwarp count among the readers
  };

  std::vector<Shadow> shadow_;
  uint64_t epoch_ = 1;
  uint64_t block_ = 1;
  int64_t touched_bytes_ = 0;
};

}  // namespace tessera::cuda::sim
