#include "tensor/cuda/sim/shared_memory_racecheck.h"

#include <algorithm>

namespace tessera::cuda::sim {

void SharedMemoryRacecheck::reset(int64_t bytes) {
  if (static_cast<int64_t>(shadow_.size()) < bytes) shadow_.resize(bytes);
  ++epoch_;
  ++block_;
  touched_bytes_ = 0;
}

std::optional<Hazard> SharedMemoryRacecheck::access(int64_t offset, int64_t bytes, AccessKind kind,
                                                     const Accessor& who) {
  // An earlier access by a thread of the same warp is ordered when a __syncwarp came between.
  const auto ordered = [&](int32_t warp, uint32_t syncs) { return warp == who.warp && who.warp_syncs > syncs; };
  for (int64_t byte = offset; byte < offset + bytes; ++byte) {
    Shadow& entry = shadow_[byte];
    if (entry.block != block_) ++touched_bytes_;
    if (entry.epoch != epoch_) entry = Shadow{epoch_, block_};
    const bool writes = kind != AccessKind::read;
    if (entry.writer != kNone && entry.writer != who.thread && !ordered(entry.writer_warp, entry.writer_syncs) &&
        !(kind == AccessKind::atomic && entry.writer_atomic)) {
      return Hazard{writes ? "write-after-write" : "read-after-write", byte, entry.writer};
    }
    if (writes) {
      const bool other_reader = entry.many_readers || (entry.reader != kNone && entry.reader != who.thread);
      if (other_reader && !ordered(entry.reader_warp, entry.reader_syncs)) {
        return Hazard{"write-after-read", byte, entry.reader != who.thread ? entry.reader : kNone};
      }
      entry.writer = who.thread;
      entry.writer_warp = who.warp;
      entry.writer_syncs = who.warp_syncs;
      entry.writer_atomic = kind == AccessKind::atomic;
    } else if (entry.reader == kNone) {
      entry.reader = who.thread;
      entry.reader_warp = who.warp;
      entry.reader_syncs = who.warp_syncs;
    } else {
      entry.many_readers = entry.many_readers || entry.reader != who.thread;
      if (entry.reader_warp != who.warp) entry.reader_warp = kManyWarps;
      entry.reader_syncs = std::max(entry.reader_syncs, who.warp_syncs);
    }
  }
  return std::nullopt;
}

}  // namespace tessera::cuda::sim
