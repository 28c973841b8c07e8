#include "tensor/cuda/pinned_pool.h"

#include <bit>
#include <map>
#include <mutex>
#include <vector>

#include "tensor/cuda/runtime.h"
#include "tensor/error.h"

namespace tessera::cuda {

namespace {

struct Pool {
  std::mutex mutex;
  std::map<int64_t, std::vector<void*>> free_blocks;  // by capacity
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

}  // namespace

PinnedBlock acquire_pinned(int64_t bytes) {
  const int64_t capacity = size_class(bytes);
  Pool& p = pool();
  {
    const std::lock_guard lock(p.mutex);
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
  p.free_blocks[block.capacity].push_back(block.data);
  p.stats.in_use_bytes -= block.capacity;
  p.stats.cached_bytes += block.capacity;
}

PinnedPoolStats pinned_pool_stats() {
  Pool& p = pool();
  const std::lock_guard lock(p.mutex);
  return p.stats;
}

void empty_pinned_cache() {
  std::map<int64_t, std::vector<void*>> cached;
  {
    Pool& p = pool();
    const std::lock_guard lock(p.mutex);
    cached.swap(p.free_blocks);
    p.stats.cached_bytes = 0;
  }
  for (const auto& [capacity, blocks] : cached) {
    for (void* data : blocks) pinned_host_free(data);
  }
}

}  // namespace tessera::cuda
