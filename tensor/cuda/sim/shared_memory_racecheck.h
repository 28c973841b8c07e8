// Racecheck and initcheck for shared memory, as compute-sanitizer's: two
// threads of a block touch the same byte between two barriers, at least one
// of them writing and not both atomically, is a hazard, unless a
// __syncwarp(mask) whose mask held both lanes (directly or through a chain of
// such syncs) came between them in one warp. And a read of a byte no thread
// of the block has written is a read of uninitialised memory. One shadow
// entry per byte of the window, stamped with the barrier epoch, so a barrier
// clears every race entry at once, and with the block, so a new block
// starts with nothing written.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "tensor/cuda/sim/code_site.h"

namespace tessera::cuda::sim {

enum class AccessKind : uint8_t { read, write, atomic };

// What one warp's completed __syncwarp calls order. Sync number n (from 1)
// orders every access its lanes made before it with every access they make
// after; later syncs carry that to the lanes they hold, so ordering is
// transitive. A sync whose mask holds every lane of the warp orders all.
class WarpOrder {
 public:
  uint32_t syncs() const { return syncs_; }
  // A __syncwarp(mask) completed; `lanes` are the warp's lanes.
  void sync(unsigned mask, unsigned lanes);
  // Whether an access by `earlier_lane`, made when syncs() was
  // `earlier_syncs`, is ordered before an access `later_lane` makes now.
  bool orders(int32_t earlier_lane, uint32_t earlier_syncs, int32_t later_lane) const {
    if (last_full_sync_ > earlier_syncs) return true;
    return known_ != nullptr && (*known_)[later_lane][earlier_lane] > earlier_syncs;
  }

 private:
  uint32_t syncs_ = 0;
  uint32_t last_full_sync_ = 0;
  // known[b][a]: the latest sync after which lane b is ordered after lane a's
  // earlier accesses; made on the first partial-mask sync.
  std::unique_ptr<std::array<std::array<uint32_t, 32>, 32>> known_;
};

// The thread making an access: its linear index in the block, its warp and
// lane, and its warp's __syncwarp ordering.
struct Accessor {
  int32_t thread;
  int32_t warp;
  int32_t lane;
  const WarpOrder* order;
  CodeSite site;
};

struct Hazard {
  const char* kind;      // "read-after-write", "write-after-read", "write-after-write"
  int64_t offset;        // first byte in the window
  int32_t other_thread;  // the earlier access's thread (-1: several)
  CodeSite other_site;   // and where it was made
};

struct SharedAccessResult {
  std::optional<Hazard> hazard;  // the first
  int64_t first_unwritten = -1;  // a read's first byte no thread of the block wrote, or -1
};

class SharedMemoryRacecheck {
 public:
  // `track_touched`: keep the offsets a block touched (static shared
  // memory's footprint and poisoning need them; the dynamic window is
  // refilled whole).
  explicit SharedMemoryRacecheck(bool track_touched) : track_touched_(track_touched) {}
  // A window of `bytes` bytes, with nothing touched or written, for a new block.
  void reset(int64_t bytes);
  // A barrier: everything before it is ordered with everything after.
  void next_epoch();
  // Records an access of [offset, offset + bytes); reports its first hazard
  // and, for a read or an atomic, its first unwritten byte.
  SharedAccessResult access(int64_t offset, int64_t bytes, AccessKind kind, const Accessor& who);
  // The distinct bytes the block has touched since reset(): the simulator's
  // measure of a kernel's static shared memory, whose declared size g++ does
  // not keep.
  int64_t touched_bytes() const { return static_cast<int64_t>(touched_.size()); }  // with track_touched
  // Fills the bytes the block touched with all-ones (NaN in every float
  // type): static __shared__ storage outlives the block in the simulator, and
  // the next block must not see its values.
  void poison_touched(unsigned char* window) const;

 private:
  static constexpr int16_t kNone = -1;
  static constexpr int16_t kManyWarps = -2;
  // 48 bytes a byte of shared memory; counters are 32-bit (reset() clears
  // the shadow before they could wrap).
  struct Shadow {
    uint32_t epoch = 0;    // race fields from an older epoch are empty
    uint32_t block = 0;    // the block that last touched the byte
    uint32_t written = 0;  // the block that last wrote it
    uint32_t writer_syncs = 0;
    uint32_t reader_syncs = 0;  // the latest __syncwarp count among the readers
    uint32_t reader_lanes = 0;  // the readers' lanes, when in one warp
    int16_t writer = kNone;
    int16_t reader = kNone;       // the first reader
    int16_t reader_warp = kNone;  // the readers' warp, or kManyWarps
    bool writer_atomic = false;
    bool many_readers = false;  // at least two distinct readers
    uintptr_t writer_site = 0;  // pack(CodeSite)
    uintptr_t reader_site = 0;
  };
  static_assert(sizeof(Shadow) == 48);
  // An all-zero entry is an empty one: its stamps (0) never match the live
  // ones, which start at 2. So the shadow is pages the kernel hands out
  // zeroed, resident only where a block touched them: the static window is
  // the kernels' module's whole TLS segment (400 KB, 19 MB of shadow), and a
  // block touches one kernel's variables.
  struct ZeroedPages {
    void operator()(Shadow* entries) const;
    size_t bytes;  // what was mapped
  };

  std::unique_ptr<Shadow[], ZeroedPages> shadow_;
  int64_t shadow_entries_ = 0;
  std::vector<int64_t> touched_;  // offsets, in the order first touched
  bool track_touched_;
  uint32_t epoch_ = 1;
  uint32_t block_ = 1;
};

}  // namespace tessera::cuda::sim
