#include "tensor/cuda/pinned_pool.h"

#include <bit>
#include <map>
#include <mutex>
#include <vector>

#include "tensor/cuda/runtime.h"
#include "tensor/error.h"

namespace tessera::cuda {

namespace {

// A block or an owner waiting for its copies' event.
struct InFlight {
  Event copied;
  PinnedBlock block;
  std::shared_ptr<const void> owner;
};

struct Pool {
  std::mutex mutex;
  std::map<int64_t, std::vector<void*>> free_blocks;  // by capacity
  std::vector<InFlight> in_flight;
  PinnedPoolStats stats;
};

Pool& pool() {
  static Pool* instance = new Pool();  // never destroyed: transfers may run during static destruction
  return *instance;
}

int64_t size_class(int64_t bytes) {
  TESSERA_CHECK(bytes >= 0 && bytes <= (int64_t{1} << 62), "pinned host memory: cannot hold {} bytes", bytes);
  return static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(std::max(bytes, kMinPinnedBytes))));
}

void return_block(Pool& p, PinnedBlock block) {
  p.free_blocks[block.capacity].push_back(block.data);
  p.stats.in_use_bytes -= block.capacity;
  p.stats.cached_bytes += block.capacity;
}

// Returns the blocks whose copies have completed (the caller holds the
// lock) and hands back the owners those copies kept alive, to be dropped
// once the lock is released.
std::vector<std::shared_ptr<const void>> collect_completed(Pool& p) {
  std::vector<std::shared_ptr<const void>> released;
  std::erase_if(p.in_flight, [&](InFlight& entry) {
    if (!entry.copied.query()) return false;
    if (entry.block.data != nullptr) return_block(p, entry.block);
    if (entry.owner) released.push_back(std::move(entry.owner));
    return true;
  });
  return released;
}

}  // namespace

PinnedBlock acquire_pinned(int64_t bytes) {
  const int64_t capacity = size_class(bytes);
  Pool& p = pool();
  std::vector<std::shared_ptr<const void>> released;
  {
    const std::lock_guard lock(p.mutex);
    released = collect_completed(p);
    auto found = p.free_blocks.find(capacity);
    if (found != p.free_blocks.end() && !found->second.empty()) {
      void* data = found->second.back();
      found->second.pop_back();
      ++p.stats.reuses;
      p.stats.cached_bytes -= capacity;
      p.stats.in_use_bytes += capacity;
      return {data, capacity};
    }
  }
  void* data = pinned_host_malloc(capacity);  // outside the lock: it can take milliseconds
  TESSERA_CHECK(data != nullptr, "pinned host memory: no {} bytes of page-locked memory", capacity);
  const std::lock_guard lock(p.mutex);
  ++p.stats.allocations;
  p.stats.in_use_bytes += capacity;
  return {data, capacity};
}

void release_pinned(PinnedBlock block) {
  if (block.data == nullptr) return;
  Pool& p = pool();
  const std::lock_guard lock(p.mutex);
  return_block(p, block);
}

void release_pinned_after(PinnedBlock block, Event copied) {
  if (block.data == nullptr) return;
  Pool& p = pool();
  std::vector<std::shared_ptr<const void>> released;
  const std::lock_guard lock(p.mutex);
  released = collect_completed(p);
  p.in_flight.push_back({std::move(copied), block, nullptr});
}

void hold_until(Event copied, std::shared_ptr<const void> owner) {
  Pool& p = pool();
  std::vector<std::shared_ptr<const void>> released;
  const std::lock_guard lock(p.mutex);
  released = collect_completed(p);
  p.in_flight.push_back({std::move(copied), PinnedBlock{}, std::move(owner)});
}

PinnedPoolStats pinned_pool_stats() {
  Pool& p = pool();
  std::vector<std::shared_ptr<const void>> released;
  const std::lock_guard lock(p.mutex);
  released = collect_completed(p);
  return p.stats;
}

void empty_pinned_cache() {
  std::map<int64_t, std::vector<void*>> cached;
  std::vector<std::shared_ptr<const void>> released;
  {
    Pool& p = pool();
    const std::lock_guard lock(p.mutex);
    released = collect_completed(p);  // blocks whose copies are done are cached ones
    cached.swap(p.free_blocks);
    p.stats.cached_bytes = 0;
  }
  for (const auto& [capacity, blocks] : cached) {
    for (void* data : blocks) pinned_host_free(data);
  }
}

}  // namespace tessera::cuda
