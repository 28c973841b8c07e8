#include "tensor/cuda/sim/shared_memory_racecheck.h"

#include <sys/mman.h>

#include <algorithm>
#include <bit>
#include <new>
#include <span>

namespace tessera::cuda::sim {

void WarpOrder::sync(unsigned mask, unsigned lanes) {
  const uint32_t number = ++syncs_;
  if ((mask & lanes) == lanes) {
    last_full_sync_ = number;
    return;
  }
  if (known_ == nullptr) known_ = std::make_unique<std::array<std::array<uint32_t, 32>, 32>>();
  auto& known = *known_;
  // Each lane of the mask now knows what any of them knew, and each other's past.
  std::array<uint32_t, 32> joined{};
  for (unsigned rest = mask; rest != 0; rest &= rest - 1) {
    const auto& row = known[std::countr_zero(rest)];
    for (int32_t lane = 0; lane < 32; ++lane) joined[lane] = std::max(joined[lane], row[lane]);
  }
  for (unsigned rest = mask; rest != 0; rest &= rest - 1) {
    auto& row = known[std::countr_zero(rest)];
    row = joined;
    for (unsigned other = mask; other != 0; other &= other - 1) row[std::countr_zero(other)] = number;
  }
}

void SharedMemoryRacecheck::ZeroedPages::operator()(Shadow* entries) const { munmap(entries, bytes); }

void SharedMemoryRacecheck::reset(int64_t bytes) {
  if (shadow_entries_ < bytes) {
    const size_t mapped = static_cast<size_t>(bytes) * sizeof(Shadow);
    void* pages = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (pages == MAP_FAILED) throw std::bad_alloc();
    shadow_ = std::unique_ptr<Shadow[], ZeroedPages>(static_cast<Shadow*>(pages), ZeroedPages{mapped});
    shadow_entries_ = bytes;
  }
  if (epoch_ > UINT32_MAX - 2 || block_ > UINT32_MAX - 2) {  // start the stamps over
    std::fill_n(shadow_.get(), shadow_entries_, Shadow{});
    epoch_ = block_ = 1;
  }
  ++epoch_;
  ++block_;
  touched_.clear();
}

void SharedMemoryRacecheck::next_epoch() {
  if (epoch_ == UINT32_MAX - 1) {  // keep what was written and touched, drop the races
    for (Shadow& entry : std::span(shadow_.get(), shadow_entries_)) {
      entry = Shadow{.block = entry.block, .written = entry.written};
    }
    epoch_ = 1;
  }
  ++epoch_;
}

void SharedMemoryRacecheck::poison_touched(unsigned char* window) const {
  for (const int64_t offset : touched_) window[offset] = 0xff;
}

SharedAccessResult SharedMemoryRacecheck::access(int64_t offset, int64_t bytes, AccessKind kind,
                                                 const Accessor& who) {
  // An earlier access by a thread of the same warp is ordered when __syncwarp calls came between.
  const auto ordered = [&](int32_t thread, uint32_t syncs) {
    return thread / 32 == who.warp && who.order->orders(thread % 32, syncs, who.lane);
  };
  const auto readers_ordered = [&](const Shadow& entry) {
    if (entry.reader_warp != who.warp) return false;
    for (unsigned rest = entry.reader_lanes & ~(1u << who.lane); rest != 0; rest &= rest - 1) {
      if (!who.order->orders(std::countr_zero(rest), entry.reader_syncs, who.lane)) return false;
    }
    return true;
  };
  const bool writes = kind != AccessKind::read;
  const uintptr_t packed_site = pack(who.site);
  SharedAccessResult result;
  for (int64_t byte = offset; byte < offset + bytes; ++byte) {
    Shadow& entry = shadow_[byte];
    if (entry.block != block_) {
      if (track_touched_) touched_.push_back(byte);
      entry.block = block_;
    }
    if (entry.epoch != epoch_) {
      entry.epoch = epoch_;
      entry.writer = entry.reader = kNone;
      entry.many_readers = false;
    }
    if (kind != AccessKind::write && entry.written != block_ && result.first_unwritten < 0) {
      result.first_unwritten = byte;
    }
    if (!result.hazard && entry.writer != kNone && entry.writer != who.thread &&
        !ordered(entry.writer, entry.writer_syncs) && !(kind == AccessKind::atomic && entry.writer_atomic)) {
      result.hazard =
          Hazard{writes ? "write-after-write" : "read-after-write", byte, entry.writer, unpack(entry.writer_site)};
    }
    if (writes) {
      const bool other_reader = entry.many_readers || (entry.reader != kNone && entry.reader != who.thread);
      if (!result.hazard && other_reader && !readers_ordered(entry)) {
        result.hazard = Hazard{"write-after-read", byte, entry.reader != who.thread ? entry.reader : int32_t{kNone},
                               unpack(entry.reader_site)};
      }
      entry.writer = static_cast<int16_t>(who.thread);
      entry.writer_syncs = who.order->syncs();
      entry.writer_atomic = kind == AccessKind::atomic;
      entry.writer_site = packed_site;
      entry.written = block_;
    } else if (entry.reader == kNone) {
      entry.reader = static_cast<int16_t>(who.thread);
      entry.reader_warp = static_cast<int16_t>(who.warp);
      entry.reader_lanes = 1u << who.lane;
      entry.reader_syncs = who.order->syncs();
      entry.reader_site = packed_site;
    } else {
      entry.many_readers = entry.many_readers || entry.reader != who.thread;
      if (entry.reader_warp != who.warp) entry.reader_warp = kManyWarps;
      entry.reader_lanes |= 1u << who.lane;
      entry.reader_syncs = std::max(entry.reader_syncs, who.order->syncs());
    }
  }
  return result;
}

}  // namespace tessera::cuda::sim
