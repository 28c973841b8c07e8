// Page-locked host buffers for transfers, cached. cudaHostAlloc is slow and
// cudaFreeHost synchronises the whole device, so a transfer takes a buffer
// from the pool and gives it back once its copy has run on the stream; the
// next transfer of the same size class reuses it. Sizes round up to a power
// of two (at least kMinPinnedBytes), as PyTorch's caching host allocator
// does: at most 2x the bytes asked for, and few classes to search.
#pragma once

#include <cstdint>

namespace tessera::cuda {

constexpr int64_t kMinPinnedBytes = 4096;

struct PinnedBlock {
  void* data = nullptr;
  int64_t capacity = 0;  // bytes, a power of two
};

// A block of at least `bytes` page-locked bytes: a cached one, or a new one.
PinnedBlock acquire_pinned(int64_t bytes);
// Gives `block` back for reuse (call once the copies that use it have run).
void release_pinned(PinnedBlock block);

struct PinnedPoolStats {
  int64_t allocations = 0;    // cudaHostAlloc calls
  int64_t reuses = 0;         // acquires served from the cache
  int64_t cached_bytes = 0;   // bytes held in free blocks now
  int64_t in_use_bytes = 0;   // bytes acquired and not yet released
};
PinnedPoolStats pinned_pool_stats();
// Frees every cached block (cudaFreeHost); blocks in use stay.
void empty_pinned_cache();

}  // namespace tessera::cuda
